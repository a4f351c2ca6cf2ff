//! Peers' segments mapped into this process, shared by all workers.
//!
//! A segment is either a memfd, mapped here, or memory the peer process already had (an
//! engine's numpy array or torch tensor: `MemoryRegion::process_memory`), reached through the
//! peer's memory file (`/proc/PID/mem`), which the peer's listener sends in place of a memfd.
//! Copies into and out of such a segment are `pwrite`/`pread` at the peer's addresses: one
//! copy by the kernel, straight between this process's memory and the peer's pages, no
//! staging buffer.
//!
//! Where the peer could make the copy itself, copies use cross-memory attach instead of the
//! file (`process_vm_writev`, about 1.6 times as fast per thread: the file goes through a
//! bounce page); see `cross_memory.rs` for when and why that is safe. The file stays the
//! capability and the fallback. Why the memory file, sent by the peer, and not
//! `process_vm_writev` on the peer's pid alone:
//! - **Consent and reach.** The peer opens the file itself and chooses to send it: the
//!   kernel checked at open that the opener may write that memory, so holding the fd grants
//!   this process nothing the peer could not already do to itself. `process_vm_writev` would
//!   instead use *this* process's rights on whatever process has the pid, which for a node
//!   running as root or as the engines' user is every such process.
//! - **No pid reuse.** The file is bound to the peer's address space, not to a pid number: if
//!   the peer exits, copies fail (`EIO`) instead of reaching a process that got its pid.
//! - **No stall on `userfaultfd`.** The kernel's remote access through the memory file does
//!   not wait for a userfault handler (it fails the copy), so a peer cannot park the copying
//!   thread that way. A peer that maps a FUSE file into its registered range can still make
//!   a copy wait for its FUSE daemon: a denial of service against the copying thread, no
//!   access to anyone's bytes (see the KV API docs, "Engine memory").
//! - It works across users: a node that runs as another user than the engine needs nothing
//!   but the file.
//!
//! The fd is accepted only when it is a `/proc/PID/mem` file (procfs magic and path), so a
//! peer cannot make this process write block bytes into some other file it opened.
//!
//! A segment is mapped once per peer incarnation and kept: mapping is the expensive step (a
//! round trip, an `mmap`, page-table faults on first touch), copying is the cheap one. The
//! cache holds the peer's pages alive, so it is emptied for a node when the node is removed
//! ([`crate::TransferEngine::remove_peer`]) or shows up with a new incarnation.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use super::cross_memory::CrossMemory;
use crate::descriptor::{NodeId, SegmentId};
use crate::region::{fstat, is_sealed, map_shared};

/// A peer's segment, mapped read-write or reached through the peer's memory file.
pub(crate) struct PeerMapping {
    backing: Backing,
    pub(crate) len: usize,
}

enum Backing {
    /// The peer's memfd, mapped here.
    Mapped(NonNull<u8>),
    /// The peer's memory file and the segment's address in the peer, and cross-memory
    /// access to it where allowed.
    Process {
        file: OwnedFd,
        base: u64,
        vm: Option<CrossMemory>,
    },
}

// SAFETY: a shared mapping with no Rust-owned contents; copies into and out of it are made by
// one worker at a time per range under the crate's contract, from any thread.
unsafe impl Send for PeerMapping {}
// SAFETY: as above.
unsafe impl Sync for PeerMapping {}

impl PeerMapping {
    /// Maps `len` bytes of a memfd received from a peer, after checking that the peer cannot
    /// shrink it under us (which would turn our accesses into `SIGBUS`).
    pub(crate) fn map(fd: OwnedFd, len: u64) -> Result<PeerMapping, String> {
        if !is_sealed(fd.as_fd()) {
            return Err("the peer's memfd is not sealed against shrinking".into());
        }
        let len = usize::try_from(len).map_err(|_| "segment larger than the address space")?;
        if len == 0 {
            return Err("empty segment".into());
        }
        let stat = fstat(&fd).map_err(|e| e.to_string())?;
        if u64::try_from(stat.st_size).unwrap_or(0) < len as u64 {
            return Err("the peer's memfd is shorter than its segment".into());
        }
        let ptr = map_shared(&fd, len).map_err(|e| e.to_string())?;
        // SAFETY: our own fresh mapping; MADV_HUGEPAGE is only a hint, the same one the owner's
        // region got, so that both views use the same page size where the kernel allows it.
        unsafe { libc::madvise(ptr.as_ptr().cast(), len, libc::MADV_HUGEPAGE) };
        // The fd can be closed: the mapping keeps the memfd's pages.
        Ok(PeerMapping {
            backing: Backing::Mapped(ptr),
            len,
        })
    }

    /// The `len` bytes at `base` in the peer process whose memory file `file` is (see the
    /// module docs); refused unless `file` is a `/proc/PID/mem` file. `peer` is the
    /// credentials of the socket the file came over, for cross-memory access.
    pub(crate) fn process(
        file: OwnedFd,
        base: u64,
        len: u64,
        peer: Option<libc::ucred>,
    ) -> Result<PeerMapping, String> {
        let len = usize::try_from(len).map_err(|_| "segment larger than the address space")?;
        if len == 0 {
            return Err("empty segment".into());
        }
        if base
            .checked_add(len as u64)
            .is_none_or(|end| end > i64::MAX as u64)
        {
            return Err("the segment's address range is not a process address range".into());
        }
        let Some(pid) = memory_file_pid(&file) else {
            return Err("the peer sent a file that is not a process memory file".into());
        };
        Ok(PeerMapping {
            backing: Backing::Process {
                file,
                base,
                vm: CrossMemory::new(pid, peer),
            },
            len,
        })
    }

    /// True when the segment is another process's memory rather than a mapping.
    pub(crate) fn is_process(&self) -> bool {
        matches!(self.backing, Backing::Process { .. })
    }

    /// True when copies reach the peer's process memory by cross-memory attach.
    pub(crate) fn is_cross_memory(&self) -> bool {
        matches!(self.backing, Backing::Process { vm: Some(_), .. })
    }

    /// Copies `len` bytes from `src` into the segment at `offset`; `None` when the range is
    /// outside the segment.
    ///
    /// # Safety
    ///
    /// `src` must be valid for reads of `len` bytes for the whole call.
    pub(crate) unsafe fn write_from(
        &self,
        offset: u64,
        src: *const u8,
        len: usize,
    ) -> Option<io::Result<()>> {
        // SAFETY: as this function's contract; a write only reads `src`.
        unsafe { self.copy(offset, src.cast_mut(), len, true) }
    }

    /// Copies `len` bytes of the segment at `offset` into `dst`; `None` when the range is
    /// outside the segment.
    ///
    /// # Safety
    ///
    /// `dst` must be valid for writes of `len` bytes for the whole call and not aliased by a
    /// Rust reference.
    pub(crate) unsafe fn read_into(
        &self,
        offset: u64,
        dst: *mut u8,
        len: usize,
    ) -> Option<io::Result<()>> {
        // SAFETY: as this function's contract.
        unsafe { self.copy(offset, dst, len, false) }
    }

    /// Between the contiguous `local` bytes and the segment's ranges `ranges`
    /// (`(offset, length)`, in order): one cross-memory call for all of them where the
    /// segment is reached that way, else one copy per range. `None` when a range is outside
    /// the segment (nothing moved).
    ///
    /// # Safety
    ///
    /// `local` must be valid for the ranges' total length (reads when `write`, writes
    /// otherwise), and not aliased by a Rust reference when not `write`.
    pub(crate) unsafe fn copy_vectored(
        &self,
        ranges: &[(u64, usize)],
        local: *mut u8,
        write: bool,
    ) -> Option<io::Result<()>> {
        let mut at = 0usize;
        let pieces: Vec<(u64, *mut u8, usize)> = ranges
            .iter()
            .map(|&(offset, len)| {
                // SAFETY: `at + len` stays inside `local` (the ranges' total).
                let piece = (offset, unsafe { local.add(at) }, len);
                at += len;
                piece
            })
            .collect();
        // SAFETY: as this function's contract.
        unsafe { self.copy_pieces(&pieces, write) }
    }

    /// Each piece `(offset in the segment, local address, length)` copied between this
    /// process and the segment: all of them in as few cross-memory calls as the kernel
    /// allows where the segment is reached that way, else one copy per piece. `None` when a
    /// piece is outside the segment (nothing moved).
    ///
    /// # Safety
    ///
    /// Each piece's local address must be valid for its length (reads when `write`, writes
    /// otherwise), not aliased by a Rust reference when not `write`, and the local ranges
    /// must not overlap when not `write`.
    pub(crate) unsafe fn copy_pieces(
        &self,
        pieces: &[(u64, *mut u8, usize)],
        write: bool,
    ) -> Option<io::Result<()>> {
        for &(offset, _, len) in pieces {
            (offset.checked_add(len as u64)? <= self.len as u64).then_some(())?;
        }
        // A large copy goes in parts on several threads (`split_copy`), each part as below.
        let part = |run: &[(u64, *mut u8, usize)]| {
            // SAFETY: a part of the pieces, under this function's contract.
            unsafe { self.copy_pieces_here(run, write) }
        };
        // SAFETY: `part` copies sub-ranges of the pieces only, which this function's contract
        // makes valid for the whole call, from any thread (the mapping is `Sync`).
        unsafe { crate::split_copy::run(pieces, &part) }
    }

    /// [`PeerMapping::copy_pieces`] on this thread alone; the pieces lie inside the segment.
    ///
    /// # Safety
    ///
    /// As [`PeerMapping::copy_pieces`].
    unsafe fn copy_pieces_here(
        &self,
        pieces: &[(u64, *mut u8, usize)],
        write: bool,
    ) -> Option<io::Result<()>> {
        if let Backing::Process {
            base, vm: Some(vm), ..
        } = &self.backing
        {
            let remote: Vec<super::cross_memory::Piece> = pieces
                .iter()
                .map(|&(offset, local, len)| (local, base + offset, len))
                .collect();
            // SAFETY: as this function's contract; the pieces are inside the segment.
            if let Some(done) = unsafe { vm.copy_pieces(&remote, write) } {
                return Some(done);
            }
        }
        for &(offset, local, len) in pieces {
            // SAFETY: as this function's contract.
            match unsafe { self.copy(offset, local, len, write) } {
                Some(Ok(())) => {}
                other => return other,
            }
        }
        Some(Ok(()))
    }

    /// `local` into the segment at `offset` (`write`) or the segment into `local`.
    ///
    /// # Safety
    ///
    /// `local` must be valid for `len` bytes (reads when `write`, writes otherwise).
    unsafe fn copy(
        &self,
        offset: u64,
        local: *mut u8,
        len: usize,
        write: bool,
    ) -> Option<io::Result<()>> {
        (offset.checked_add(len as u64)? <= self.len as u64).then_some(())?;
        Some(match &self.backing {
            Backing::Mapped(ptr) => {
                // SAFETY: the range lies in our live mapping (checked above); the caller
                // vouches for `local`. Peers may write the same pages concurrently, which
                // makes the bytes unspecified, never the copy unsound at the machine level.
                // Reading out of a peer is how a put fills the node's arena, where the block
                // waits for a later get: those stores stream past the cache (`cold_copy`).
                // Writing into a peer fills an engine's buffer it is about to use.
                unsafe {
                    let remote = ptr.as_ptr().add(offset as usize);
                    if write {
                        std::ptr::copy_nonoverlapping(local.cast_const(), remote, len)
                    } else {
                        crate::cold_copy::copy_cold(remote.cast_const(), local, len)
                    }
                };
                Ok(())
            }
            // SAFETY: as this function's contract.
            Backing::Process { file, base, vm } => unsafe {
                match vm
                    .as_ref()
                    .and_then(|vm| vm.copy(base + offset, local, len, write))
                {
                    Some(done) => done,
                    None => remote_io(file, base + offset, local, len, write),
                }
            },
        })
    }
}

/// `pwrite` (`write`) or `pread` of `len` bytes at address `at` of the process whose memory
/// file is `file`, to completion.
///
/// # Safety
///
/// `local` must be valid for `len` bytes (reads when `write`, writes otherwise).
unsafe fn remote_io(
    file: &OwnedFd,
    at: u64,
    local: *mut u8,
    len: usize,
    write: bool,
) -> io::Result<()> {
    let mut done = 0usize;
    while done < len {
        let pos = at + done as u64;
        // SAFETY: `local + done .. local + len` is valid per the contract; the offset is a
        // peer address below i64::MAX (checked when the mapping was made).
        let n = unsafe {
            let p = local.add(done);
            if write {
                libc::pwrite(file.as_raw_fd(), p.cast(), len - done, pos as libc::off_t)
            } else {
                libc::pread(file.as_raw_fd(), p.cast(), len - done, pos as libc::off_t)
            }
        };
        match n {
            n if n > 0 => done += n as usize,
            0 => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("the peer's memory at {pos:#x} is gone"),
                ))
            }
            _ => {
                let err = io::Error::last_os_error();
                if err.kind() != io::ErrorKind::Interrupted {
                    return Err(io::Error::new(
                        err.kind(),
                        format!("the peer's memory at {pos:#x}: {err}"),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Whether `file` is a process's memory file: on procfs, and named `/proc/PID/mem`.
#[cfg(test)]
fn is_memory_file(file: &OwnedFd) -> bool {
    memory_file_pid(file).is_some()
}

/// The pid of the process whose memory file `file` is (on procfs, named `/proc/PID/mem`).
fn memory_file_pid(file: &OwnedFd) -> Option<libc::pid_t> {
    const PROC_SUPER_MAGIC: libc::c_long = 0x9fa0;
    // SAFETY: `statfs` is plain old data that fstatfs fully initialises on success.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: an open descriptor and a valid out-pointer.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut fs) } != 0
        || fs.f_type as libc::c_long != PROC_SUPER_MAGIC
    {
        return None;
    }
    let path = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).ok()?;
    let pid = path
        .to_str()?
        .strip_prefix("/proc/")?
        .strip_suffix("/mem")?;
    if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok()
}

impl Drop for PeerMapping {
    fn drop(&mut self) {
        if let Backing::Mapped(ptr) = self.backing {
            // SAFETY: our own mapping, unmapped once; copies hold an `Arc` to it while they
            // run.
            unsafe { libc::munmap(ptr.as_ptr().cast(), self.len) };
        }
    }
}

/// Key of a mapping: the node, the incarnation that handed out the memfd, the segment.
pub(crate) type MappingKey = (NodeId, u64, SegmentId);

#[derive(Default)]
pub(crate) struct MappingCache {
    map: Mutex<HashMap<MappingKey, Arc<PeerMapping>>>,
}

impl MappingCache {
    pub(crate) fn get(&self, key: &MappingKey) -> Option<Arc<PeerMapping>> {
        self.lock().get(key).cloned()
    }

    /// Inserts a mapping, dropping any of the same node from another incarnation.
    pub(crate) fn insert(&self, key: MappingKey, mapping: PeerMapping) -> Arc<PeerMapping> {
        let mut map = self.lock();
        map.retain(|k, _| k.0 != key.0 || k.1 == key.1);
        Arc::clone(map.entry(key).or_insert_with(|| Arc::new(mapping)))
    }

    pub(crate) fn forget(&self, node: NodeId) {
        self.lock().retain(|k, _| k.0 != node);
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<MappingKey, Arc<PeerMapping>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a process memory file is accepted as one: another procfs file or a plain file a
    /// peer sends is refused, so block bytes never go into a file the peer chose.
    #[test]
    fn only_a_process_memory_file_is_accepted() {
        let open = |p: &str| -> OwnedFd {
            std::fs::OpenOptions::new()
                .read(true)
                .open(p)
                .unwrap()
                .into()
        };
        assert!(is_memory_file(&open("/proc/self/mem")));
        assert!(!is_memory_file(&open("/proc/self/status")));
        let tmp = tempfile::NamedTempFile::new().unwrap();
        assert!(!is_memory_file(&open(tmp.path().to_str().unwrap())));
        assert!(PeerMapping::process(open("/proc/self/status"), 4096, 4096, None).is_err());
        assert!(PeerMapping::process(open("/proc/self/mem"), u64::MAX - 10, 4096, None).is_err());
        assert!(PeerMapping::process(open("/proc/self/mem"), 4096, 0, None).is_err());
        let ok = PeerMapping::process(open("/proc/self/mem"), 4096, 4096, None).unwrap();
        assert!(ok.is_process());
        // SAFETY: the range is refused before any copy (outside the segment).
        assert!(unsafe { ok.read_into(4000, std::ptr::null_mut(), 100) }.is_none());
    }
}
