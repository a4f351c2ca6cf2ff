//! Faults a shard's DRAM arena in ahead of use: all of it at start (`--prefault`), or a
//! 2 MiB chunk at a time as allocations first reach it ([`FirstUse`]).
//!
//! The arena is a memfd mapping whose pages the kernel allocates and zeroes the first time
//! something writes them. Until a node has written its whole arena once, a put into a part of
//! it never written before pays that page fault on the shard's thread: on the development VM
//! a fresh node's 2 MiB puts from allocator memory ran at 10.3 GB/s, 14.3 once prefaulted
//! (`benches/python/mooncake_compare.py --only yutu --no-warm`, with and without
//! `--yutu-arg=--prefault`; `docs/configuration.md`). A dedicated cache node gives its memory
//! to the cache anyway; with `--prefault` it does so at start.
//!
//! A helper thread per shard asks the kernel to populate the mapping
//! (`MADV_POPULATE_WRITE`, Linux 5.14 and later) 64 MiB at a time, so the shard serves
//! requests meanwhile. Populating never changes a byte, so it is safe beside the shard's own
//! writes into the same pages. The thread stops early when the arena goes (the node stops).
//!
//! Without `--prefault`, the first allocation to reach a 2 MiB chunk populates that chunk on
//! the shard's thread. That costs about what faulting the chunk in as a copy writes it would
//! (on the current development VM, where allocating and zeroing pages dominates, a populate
//! pass over a fresh memfd ran at 1.6-1.8 GB/s and a first write pass at 1.5-1.6), but it
//! makes the room the node's memory before anyone writes it. A client writing a put into its
//! view of the arena (`docs/kv-api.md`, arena views) writes only pages the node already has,
//! so that they are charged to the node's memory, not the client's: room the node reserves is
//! now always such memory, where before a put into a part of the arena never written was
//! sent back to the node to copy.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

/// Bytes populated per call: the stop flag is looked at in between.
const CHUNK: usize = 64 << 20;

/// Bytes [`FirstUse`] populates at once: a huge page's worth, the unit a client's arena view
/// fills its own page tables in.
pub const FIRST_USE_CHUNK: usize = 2 << 20;

/// Which [`FIRST_USE_CHUNK`]s of an arena have been populated since it was made: the first
/// allocation to reach a chunk populates all of it.
pub struct FirstUse {
    filled: Vec<u64>,
    /// Chunks not populated yet; 0 once all are, or when the kernel refused (nothing more is
    /// tried: pages then fault in as they are written).
    left: usize,
}

impl FirstUse {
    /// Nothing populated, for a mapping of `len` bytes.
    pub fn new(len: usize) -> FirstUse {
        let chunks = len.div_ceil(FIRST_USE_CHUNK);
        FirstUse {
            filled: vec![0; chunks.div_ceil(64)],
            left: chunks,
        }
    }

    /// Populates the chunks of `map` (the whole arena mapping) that `[offset, offset + len)`
    /// reaches and that were not populated before. Never changes a byte of `map`.
    pub fn reach(&mut self, map: &mut [u8], offset: u64, len: u64) {
        if self.left == 0 {
            return;
        }
        let start = offset as usize;
        let end = (start + (len as usize).max(1)).min(map.len());
        for c in start / FIRST_USE_CHUNK..end.div_ceil(FIRST_USE_CHUNK) {
            let (word, bit) = (c / 64, 1u64 << (c % 64));
            if self.filled[word] & bit != 0 {
                continue;
            }
            let from = c * FIRST_USE_CHUNK;
            let n = FIRST_USE_CHUNK.min(map.len() - from);
            // SAFETY: `[from, from + n)` lies inside `map`, the arena's live mapping, borrowed
            // for the call.
            if let Err(err) = unsafe { populate_write(map.as_mut_ptr().add(from) as usize, n) } {
                // Once per arena: nothing more is tried after this.
                tracing::warn!(%err, "the DRAM arena is not populated as allocations first reach it (MADV_POPULATE_WRITE needs Linux 5.14): its pages fault in as they are written, and same-host clients' large puts into memory never written go to the node");
                self.left = 0;
                return;
            }
            self.filled[word] |= bit;
            self.left -= 1;
        }
    }
}

/// A running (or finished) prefault of one mapping; dropping it stops and waits for it.
pub struct Prefault {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// The mapping's address, sent to the helper thread.
struct Mapping {
    base: usize,
    len: usize,
}

impl Prefault {
    /// Starts populating `len` bytes at `base` in a thread named `name`.
    ///
    /// # Safety
    ///
    /// `[base, base + len)` must be a mapping of this process that stays mapped until the
    /// returned value is dropped.
    pub unsafe fn start(name: String, base: *mut u8, len: usize) -> std::io::Result<Prefault> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let mapping = Mapping {
            base: base as usize,
            len,
        };
        let thread = std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || populate(&name, mapping, &flag))?;
        Ok(Prefault {
            stop,
            thread: Some(thread),
        })
    }
}

impl Prefault {
    /// Waits for the whole mapping to be populated (or refused).
    pub fn finish(mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Prefault {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The helper thread: the mapping chunk by chunk, until done, stopped or refused.
fn populate(name: &str, m: Mapping, stop: &AtomicBool) {
    let started = Instant::now();
    let mut done = 0usize;
    while done < m.len && !stop.load(Ordering::Relaxed) {
        let n = CHUNK.min(m.len - done);
        // SAFETY: inside the mapping, which the owner keeps mapped until it has stopped and
        // joined this thread (`Prefault`'s contract).
        if let Err(err) = unsafe { populate_write(m.base + done, n) } {
            tracing::warn!(thread = name, %err, populated = done, "cannot prefault the DRAM arena (MADV_POPULATE_WRITE needs Linux 5.14); its pages fault in on first use");
            return;
        }
        done += n;
    }
    tracing::info!(
        thread = name,
        mib = done >> 20,
        ms = started.elapsed().as_millis() as u64,
        "DRAM arena prefaulted"
    );
}

/// Faults the `len` bytes at `at` in writable (`MADV_POPULATE_WRITE`) without changing a byte
/// of them; the kernel's refusal (before Linux 5.14) as the error.
///
/// # Safety
///
/// `[at, at + len)` must lie inside a live mapping of this process.
unsafe fn populate_write(at: usize, len: usize) -> std::io::Result<()> {
    // SAFETY: as this function's contract; populating only faults pages in.
    let rc = unsafe { libc::madvise(at as *mut libc::c_void, len, libc::MADV_POPULATE_WRITE) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
