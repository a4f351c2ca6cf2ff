//! Arena views: the node's shard arenas mapped into this process, so that a large get-into
//! or put-from is a `memcpy` here instead of the node's copy through the kernel.
//!
//! The node hands a shard's arena only to a process that proved it can already read and
//! write all of the node's memory (it read a fresh nonce out of the node with
//! `process_vm_readv`; see the node's `http::kv::arena_view` for the argument, and
//! `Frames::arena_view`). Where the kernel refuses that read (another user, a non-dumpable
//! node, Yama), there is no view and every call goes as before.
//!
//! With a view, a large call on a shard becomes the raw form of the KV API, with the copy on
//! the client's side:
//! - get-into: `get` leases the blocks (read-only descriptors), this process copies each out
//!   of its mapping into the caller's memory, then `release`s the leases. A lease keeps a
//!   block's bytes where they are until it ends, even when the key is overwritten meanwhile,
//!   so a copy reads one version whole.
//! - put-from: `put-start` reserves each block's range (write descriptors), this process
//!   copies the bytes in, then `put-end` publishes them (atomically per block, as put-from
//!   does); a failure revokes the puts.
//!
//! Only with memory the node reaches through the kernel (process memory: numpy, torch,
//! `bytes`), whose copies move about half a `memcpy` per thread; memory the node maps (a
//! memfd) it copies with `memcpy` on every shard at once. One round trip more than the
//! node's own copy and a lease or reservation per block, so only for calls of [`VIEW_MIN`]
//! bytes or more whose median block is [`VIEW_MIN_BLOCK`] or more; a copy of [`SPLIT_MIN`]
//! or more is shared with copy helpers of this process, since one thread does not use the
//! memory system up. `YUTU_ARENA_VIEWS=0` turns views off. A copy reads and writes only
//! within descriptors the node handed out for this call, checked against the mapping's
//! bounds.
//!
//! Before a copy the view's page table entries over the blocks are filled (`view_pages`),
//! since a fresh mapping faults a page at a time. A put whose reserved range the node never
//! wrote (memory the node has not allocated yet) is revoked and made by the node, so that
//! the memory is allocated by, and charged to, the node.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use yutu_api::kv_frame::ArenaViewGrant;
use yutu_transfer::{NodeId, SegmentDescriptor, SegmentId};

use super::frames::Frames;
use super::view_pages::Pages;

/// Calls of fewer bytes than this go as before (one round trip, the node copies).
pub(super) const VIEW_MIN: u64 = 1 << 20;

/// Calls whose typical block is smaller than this go as before, whatever their total.
pub(super) const VIEW_MIN_BLOCK: u64 = 64 << 10;

/// Copies of at least this many bytes are shared with copy helpers. Not from 1 MiB, as the
/// node shares its copies: an engine's gets of 1 MiB values often come from several threads
/// at once (Mooncake's stress test: 8), which keep the cores busy already, and splitting
/// each of them cost that shape a fifth of its gets.
const SPLIT_MIN: usize = 8 << 20;

/// Most threads one copy uses, the caller's included.
const MAX_THREADS: usize = 4;

/// How long the leases and reservations of a view call last: they end at its release or
/// put-end, this only bounds what a client that dies mid-call holds.
pub(super) const VIEW_TTL_MS: u64 = 5_000;

/// Whether views are on for this process (`YUTU_ARENA_VIEWS=0` turns them off).
pub(super) fn enabled() -> bool {
    std::env::var_os("YUTU_ARENA_VIEWS").is_none_or(|v| v != "0")
}

/// The views of one node's shards, each asked for once, on first use.
pub(super) struct ArenaViews {
    shards: Vec<OnceLock<Option<View>>>,
    /// Bytes copied through views (gets and puts together).
    copied: AtomicU64,
}

impl ArenaViews {
    pub(super) fn new(shards: usize) -> ArenaViews {
        ArenaViews {
            shards: (0..shards).map(|_| OnceLock::new()).collect(),
            copied: AtomicU64::new(0),
        }
    }

    /// Shard `shard`'s view, asked for on first use; `None` when the node or the kernel
    /// refused it (then never asked again by this client).
    pub(super) fn view(&self, frames: &Frames, shard: usize) -> Option<&View> {
        self.shards
            .get(shard)?
            .get_or_init(|| match frames.arena_view(shard) {
                Ok(Some((grant, fd))) => match View::map(&grant, fd) {
                    Ok(v) => Some(v),
                    Err(e) => {
                        tracing::debug!(error = %e, shard, "arena view not mapped");
                        None
                    }
                },
                Ok(None) => None,
                Err(e) => {
                    tracing::debug!(error = %e, shard, "no arena view");
                    None
                }
            })
            .as_ref()
    }

    /// Bytes copied through views so far.
    pub(super) fn copied(&self) -> u64 {
        self.copied.load(Ordering::Relaxed)
    }

    pub(super) fn count(&self, bytes: u64) {
        self.copied.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Views mapped now.
    pub(super) fn mapped(&self) -> usize {
        self.shards
            .iter()
            .filter(|s| matches!(s.get(), Some(Some(_))))
            .count()
    }
}

/// One shard's arena, mapped shared and read-write.
pub(super) struct View {
    /// Which parts of the mapping have their page table entries.
    pages: Pages,
    base: NonNull<u8>,
    len: usize,
    node: NodeId,
    segment: SegmentId,
}

// SAFETY: a shared mapping with no Rust-owned contents; this module copies into and out of it
// only within descriptors the node handed out for the call doing the copy.
unsafe impl Send for View {}
// SAFETY: as above.
unsafe impl Sync for View {}

impl View {
    /// Maps the arena memfd `fd` as `grant` describes it, after checking that the file is
    /// sealed against shrinking and at least that long: a shorter file, or one cut short
    /// later, would turn copies into `SIGBUS` (the node seals its arenas).
    fn map(grant: &ArenaViewGrant, fd: std::os::fd::OwnedFd) -> std::io::Result<View> {
        use std::os::fd::AsRawFd;
        // SAFETY: F_GET_SEALS takes no argument and touches no memory of ours.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(std::io::Error::other(
                "the arena file is not sealed against shrinking",
            ));
        }
        let len = usize::try_from(grant.len).map_err(std::io::Error::other)?;
        let size = std::fs::File::from(fd.try_clone()?).metadata()?.len();
        if len == 0 || size < grant.len {
            return Err(std::io::Error::other(format!(
                "the arena file has {size} bytes, the grant says {}",
                grant.len
            )));
        }
        // SAFETY: a fresh shared mapping of a file we hold; the kernel picks the address.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let base = NonNull::new(ptr.cast()).ok_or_else(|| std::io::Error::other("null mmap"))?;
        Ok(View {
            pages: Pages::new(base.as_ptr(), len),
            base,
            len,
            node: NodeId(grant.node),
            segment: SegmentId(grant.segment),
        })
    }

    /// The address of the first `len` bytes of `d` in the mapping, when `d` is a descriptor of
    /// this arena that covers them and lies inside it.
    pub(super) fn place(&self, d: &SegmentDescriptor, len: u64) -> Option<*mut u8> {
        let end = d.offset.checked_add(len)?;
        if d.node != self.node || d.segment != self.segment || len > d.len {
            return None;
        }
        if end > self.len as u64 {
            return None;
        }
        // SAFETY: `offset + len` is inside the mapping (checked above).
        Some(unsafe { self.base.as_ptr().add(d.offset as usize) })
    }

    /// The address of the `len` bytes at `offset` of the arena, when they lie inside the
    /// mapping (a located slot's place, checked as a descriptor's is).
    pub(super) fn at(&self, offset: u64, len: u64) -> Option<*mut u8> {
        let end = offset.checked_add(len)?;
        if end > self.len as u64 {
            return None;
        }
        // SAFETY: `offset + len` is inside the mapping (checked above).
        Some(unsafe { self.base.as_ptr().add(offset as usize) })
    }

    /// Readies the `len` bytes at `at`, a place this view gave, for a copy without page
    /// faults; false when any of their pages is memory the node has not allocated yet.
    pub(super) fn prepare(&self, at: *const u8, len: usize) -> bool {
        self.pages.prepare(at, len)
    }
}

impl Drop for View {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `View::map`, unmapped once; no copy runs past the call
        // that made it, and the view outlives every call (it lives in the client).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// One piece of a copy: from, to, bytes (`split_copy::copy_local`'s form).
pub(super) type Piece = (*const u8, *mut u8, usize);

/// Copies every piece with streaming stores when `cold` or the copy is shared with helpers
/// (`yutu_transfer::cold_copy`; pieces under its
/// `STREAM_MIN` with ordinary ones), shared with copy helpers of this process from
/// [`SPLIT_MIN`] on (`yutu_transfer::split_copy`, up to [`MAX_THREADS`] threads, the
/// caller's included): the caller and the helpers take pieces of about 256 KiB from a shared
/// counter, so a helper that wakes late takes less instead of being waited for.
///
/// Streaming, although the caller is about to use the bytes: an engine's next step is a
/// DMA to the GPU or a read much later, and writing whole lines without first reading them
/// nearly doubled a Python `batch_get_into` of 2 MiB blocks into numpy on the development VM
/// (two threads, 32 MiB batches: 15.6 to 23-27 GB/s, a loop over 128 MiB of blocks).
///
/// # Safety
///
/// Every piece's source valid for reads and destination for writes of its length for the
/// length of the call, from any thread; no destination overlapping another piece's source or
/// destination.
pub(super) unsafe fn copy(pieces: &[Piece], cold: bool) {
    static THREADS: OnceLock<()> = OnceLock::new();
    THREADS.get_or_init(|| {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        yutu_transfer::split_copy::set_threads(n.min(MAX_THREADS));
    });
    if pieces.iter().map(|p| p.2).sum::<usize>() < SPLIT_MIN {
        if !cold {
            // A get of a few MiB (Mooncake's `get` of a 1 MiB value) is read back soon, and
            // its destination, freed and reused, is often still cached, which streaming
            // stores must first evict: 1 MiB from a view ran at 8.2-8.7 GB/s with `memcpy`
            // against 4.0-4.2 streamed (a C loop on the development VM).
            for &(src, dst, len) in pieces {
                // SAFETY: as this function's contract.
                unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
            }
            return;
        }
        for &(src, dst, len) in pieces {
            // SAFETY: as this function's contract.
            unsafe { yutu_transfer::cold_copy::copy_cold(src, dst, len) };
        }
        return;
    }
    // SAFETY: as this function's contract; `copy_cold` copies any sub-range of a piece.
    unsafe { yutu_transfer::split_copy::copy_local(pieces, yutu_transfer::cold_copy::copy_cold) };
}
