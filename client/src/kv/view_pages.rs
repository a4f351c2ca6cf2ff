//! The page tables of an arena view: filled before a copy, a 2 MiB chunk at a time, so that
//! copies through the view do not fault.
//!
//! A fresh mapping of the node's arena memfd has no page table entries, even over pages the
//! node has written, and writes to a shared file mapping fault one 4 KiB page at a time
//! (reads 16 at a time). On the development VM a first write pass over a fresh mapping of
//! 512 MiB of written pages ran at 1.3-1.6 GB/s against 6-8 for a second; filling the
//! entries with `MADV_POPULATE_WRITE` ran at about 14 GB/s, and 60-75 GB/s over entries
//! already there (a C loop). So before a copy, each chunk of the range not yet filled is
//! filled, and a chunk filled whole is remembered in a bitmap and never filled again.
//!
//! Only pages the node already has are filled, and a put waits for the node otherwise
//! ([`Pages::prepare`] answers false): a page allocated by this process's write or fill would
//! be charged to this process's memory cgroup, not the node's. `mincore` tells which pages
//! the memfd has.

use std::sync::atomic::{AtomicU64, Ordering};

/// The granularity of the bitmap: a huge page's worth of entries.
const CHUNK: usize = 2 << 20;

/// The base page size this module assumes (x86-64 and aarch64 Linux defaults); `mincore`
/// answers one byte per page of it.
const PAGE: usize = 4096;

/// Which chunks of one view are filled.
pub(super) struct Pages {
    base: usize,
    len: usize,
    filled: Box<[AtomicU64]>,
}

impl Pages {
    /// The bitmap of a view of `len` bytes at `base` (page aligned), nothing filled.
    pub(super) fn new(base: *mut u8, len: usize) -> Pages {
        let chunks = len.div_ceil(CHUNK);
        Pages {
            base: base as usize,
            len,
            filled: (0..chunks.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
        }
    }

    /// Makes the `len` bytes at `at` (inside the view) ready to copy into or out of without
    /// page faults: false, with nothing filled, when any of their pages is not the node's
    /// yet. A fill the kernel refuses (before Linux 5.14) only leaves the pages to fault in.
    pub(super) fn prepare(&self, at: *const u8, len: usize) -> bool {
        if len == 0 {
            return true;
        }
        let (start, end) = (at as usize - self.base, at as usize - self.base + len);
        debug_assert!(end <= self.len);
        let chunks = start / CHUNK..end.div_ceil(CHUNK);
        if chunks.clone().all(|c| self.is_filled(c)) {
            return true;
        }
        if !resident(self.base + start, len) {
            return false;
        }
        for c in chunks {
            if self.is_filled(c) {
                continue;
            }
            let (from, to) = (c * CHUNK, ((c + 1) * CHUNK).min(self.len));
            if resident(self.base + from, to - from) {
                if fill(self.base + from, to - from) {
                    self.filled[c / 64].fetch_or(1 << (c % 64), Ordering::Relaxed);
                }
            } else {
                // Only the part of the range in this chunk, which is resident (checked).
                let (a, b) = (from.max(start), to.min(end));
                fill(self.base + (a & !(PAGE - 1)), b - (a & !(PAGE - 1)));
            }
        }
        true
    }

    fn is_filled(&self, chunk: usize) -> bool {
        self.filled[chunk / 64].load(Ordering::Relaxed) & (1 << (chunk % 64)) != 0
    }
}

/// Fills the page table entries of `[at, at + len)`; false when the kernel refused.
fn fill(at: usize, len: usize) -> bool {
    // SAFETY: a range of the caller's view, a shared writable mapping that outlives the call;
    // MADV_POPULATE_WRITE faults the pages in writable without changing a byte.
    let rc = unsafe { libc::madvise(at as *mut libc::c_void, len, libc::MADV_POPULATE_WRITE) };
    if rc != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "arena view pages not filled: they fault in on use");
    }
    rc == 0
}

/// Whether every page of `[at, at + len)`, inside a mapping of this process, is resident in
/// the file behind it (`mincore`); false when the kernel will not say.
fn resident(at: usize, len: usize) -> bool {
    let start = at & !(PAGE - 1);
    let span = at + len - start;
    let mut vec = vec![0u8; span.div_ceil(PAGE)];
    // SAFETY: one byte per page of the page-aligned range, as mincore writes; the range lies
    // in the caller's mapping.
    let rc = unsafe { libc::mincore(start as *mut libc::c_void, span, vec.as_mut_ptr()) };
    rc == 0 && vec.iter().all(|b| b & 1 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether this process's page tables map `at` (bit 63 of its `/proc/self/pagemap` entry).
    fn mapped(at: *const u8) -> bool {
        use std::os::unix::fs::FileExt;
        let file = std::fs::File::open("/proc/self/pagemap").unwrap();
        let mut entry = [0u8; 8];
        file.read_exact_at(&mut entry, (at as usize / PAGE * 8) as u64)
            .unwrap();
        u64::from_le_bytes(entry) >> 63 == 1
    }

    #[test]
    fn only_the_nodes_pages_are_filled() {
        // A memfd of three chunks: the owner writes the first chunk whole and one page of the
        // second; a second mapping (the view) is prepared over ranges of it.
        let len = 3 * CHUNK;
        // SAFETY: plain system calls on a fresh memfd and its mappings, unmapped at the end.
        unsafe {
            let fd = libc::memfd_create(c"view-pages-test".as_ptr(), 0);
            assert!(fd >= 0);
            assert_eq!(libc::ftruncate(fd, len as libc::off_t), 0);
            let map = || {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd,
                    0,
                ) as *mut u8
            };
            let owner = map();
            std::ptr::write_bytes(owner, 7, CHUNK);
            owner.add(CHUNK + PAGE).write(9);
            let view = map();
            let pages = Pages::new(view, len);
            assert!(!mapped(view), "a fresh mapping has no page table entries");
            // A range with a page the node never wrote: refused, nothing filled or allocated.
            assert!(!pages.prepare(view.add(CHUNK - PAGE), 3 * PAGE));
            assert!(!mapped(view.add(CHUNK - PAGE)));
            assert!(!resident(view as usize + CHUNK, PAGE));
            // The first chunk: filled whole and remembered.
            assert!(pages.prepare(view.add(100), 1000));
            assert!(mapped(view) && mapped(view.add(CHUNK - PAGE)));
            assert!(pages.is_filled(0) && !pages.is_filled(1));
            // The one page of the second: filled alone, the chunk not remembered.
            assert!(pages.prepare(view.add(CHUNK + PAGE + 5), 10));
            assert!(mapped(view.add(CHUNK + PAGE)));
            assert!(!mapped(view.add(CHUNK + 2 * PAGE)));
            assert!(!pages.is_filled(1));
            assert!(!resident(view as usize + CHUNK + 2 * PAGE, PAGE));
            assert_eq!(view.add(CHUNK + PAGE).read(), 9);
            libc::munmap(owner.cast(), len);
            libc::munmap(view.cast(), len);
            libc::close(fd);
        }
    }
}
