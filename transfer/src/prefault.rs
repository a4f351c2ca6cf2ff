//! Faults a shared mapping's pages in ahead of use, on a helper thread.
//!
//! Two users, two modes ([`Populate`]):
//!
//! - **A node's DRAM arena** (`--prefault`, [`Populate::All`]). The arena is a memfd mapping
//!   whose pages the kernel allocates and zeroes the first time something writes them. Until
//!   a node has written its whole arena once, a put into a part of it never written before
//!   pays that page fault on the shard's thread: on the development VM a fresh node's 2 MiB
//!   puts from allocator memory ran at 10.3 GB/s, 14.3 once prefaulted
//!   (`benches/python/mooncake_compare.py --only yutu --no-warm`, with and without
//!   `--yutu-arg=--prefault`; `docs/configuration.md`). A dedicated cache node gives its
//!   memory to the cache anyway; with `--prefault` it does so at start.
//! - **A client's arena view** ([`Populate::Resident`]). A second mapping of the same memfd
//!   starts with no page table entries, even over pages the node has written: the first
//!   write to each 4 KiB page then costs a fault (writes to a shared file mapping are not
//!   faulted around, reads 16 pages at a time). On the development VM a first pass over a
//!   fresh mapping of written pages ran at 1.3-1.6 GB/s, a second at 6-7.5 (a C loop over
//!   512 MiB). Populating the mapping once takes the faults off the copies. Only pages the
//!   node already has are populated (`mincore`): a page allocated by a client's fault would
//!   be charged to the client's memory cgroup, not the node's.
//!
//! The thread asks the kernel to populate (`MADV_POPULATE_WRITE`, Linux 5.14 and later) 64
//! MiB at a time, so the owner works meanwhile. Populating never changes a byte, so it is safe
//! beside the owner's own writes into the same pages. The thread stops early when the owner
//! drops it (before unmapping).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

/// Bytes populated per call: the stop flag is looked at in between.
const CHUNK: usize = 64 << 20;

/// The base page size this module assumes (x86-64 and aarch64 Linux defaults); `mincore`
/// answers one byte per page of it.
const PAGE: usize = 4096;

/// Which pages of the mapping to populate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Populate {
    /// Every page, allocating those the file does not have yet (the mapping's owner's memory).
    All,
    /// Only the pages the file already has (`mincore`): another process's memory, mapped
    /// here, whose holes are the owner's to fill.
    Resident,
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
    /// Starts populating `len` bytes at `base` in a thread named `name`; `what` names the
    /// mapping in the log line that says it is done.
    ///
    /// # Safety
    ///
    /// `[base, base + len)` must be a shared, writable mapping of this process, page aligned,
    /// that stays mapped until the returned value is dropped.
    pub unsafe fn start(
        name: String,
        what: &'static str,
        mode: Populate,
        base: *mut u8,
        len: usize,
    ) -> std::io::Result<Prefault> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let mapping = Mapping {
            base: base as usize,
            len,
        };
        let thread = std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || populate(&name, what, mode, mapping, &flag))?;
        Ok(Prefault {
            stop,
            thread: Some(thread),
        })
    }

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
fn populate(name: &str, what: &'static str, mode: Populate, m: Mapping, stop: &AtomicBool) {
    let started = Instant::now();
    let mut done = 0usize;
    let mut populated = 0usize;
    let mut resident = Vec::new();
    while done < m.len && !stop.load(Ordering::Relaxed) {
        let n = CHUNK.min(m.len - done);
        let at = m.base + done;
        let runs = match mode {
            Populate::All => vec![(0, n)],
            Populate::Resident => match resident_runs(at, n, &mut resident) {
                Ok(r) => r,
                Err(err) => {
                    tracing::debug!(thread = name, %err, what, "mincore refused: not prefaulted");
                    return;
                }
            },
        };
        for (from, len) in runs {
            // SAFETY: inside the mapping, which the owner keeps mapped until it has stopped
            // and joined this thread (`Prefault`'s contract). MADV_POPULATE_WRITE faults the
            // pages in writable without writing to them.
            let rc = unsafe {
                libc::madvise(
                    (at + from) as *mut libc::c_void,
                    len,
                    libc::MADV_POPULATE_WRITE,
                )
            };
            if rc != 0 {
                let err = std::io::Error::last_os_error();
                tracing::warn!(thread = name, %err, populated, what, "cannot prefault (MADV_POPULATE_WRITE needs Linux 5.14); its pages fault in on first use");
                return;
            }
            populated += len;
        }
        done += n;
    }
    tracing::info!(
        thread = name,
        mib = populated >> 20,
        ms = started.elapsed().as_millis() as u64,
        "{what} prefaulted"
    );
}

/// The runs of resident pages in `[at, at + len)`, as (offset, bytes) from `at`.
fn resident_runs(at: usize, len: usize, vec: &mut Vec<u8>) -> std::io::Result<Vec<(usize, usize)>> {
    let pages = len.div_ceil(PAGE);
    vec.clear();
    vec.resize(pages, 0);
    // SAFETY: `vec` holds one byte per page of the range, as mincore writes; the range is
    // inside the caller's mapping.
    let rc = unsafe { libc::mincore(at as *mut libc::c_void, len, vec.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(runs(vec, len))
}

/// Whether every page of `[at, at + len)`, inside a mapping of this process, is resident in
/// the file behind it (`mincore`); false when the kernel will not say.
pub fn all_resident(at: *const u8, len: usize) -> bool {
    if len == 0 {
        return true;
    }
    let start = at as usize & !(PAGE - 1);
    let span = at as usize + len - start;
    let mut vec = vec![0u8; span.div_ceil(PAGE)];
    // SAFETY: as in `resident_runs`: one byte per page of the page-aligned range, which the
    // caller says lies in its mapping.
    let rc = unsafe { libc::mincore(start as *mut libc::c_void, span, vec.as_mut_ptr()) };
    rc == 0 && vec.iter().all(|b| b & 1 != 0)
}

/// The runs of pages whose `mincore` byte has its low bit set, as (offset, bytes), the last
/// cut at `len`.
fn runs(vec: &[u8], len: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, b) in vec.iter().enumerate() {
        match (b & 1 != 0, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                out.push((s * PAGE, (i - s) * PAGE));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push((s * PAGE, len - s * PAGE));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_cover_the_resident_pages_only() {
        assert_eq!(
            runs(&[0, 1, 1, 0, 1], 5 * PAGE),
            vec![(PAGE, 2 * PAGE), (4 * PAGE, PAGE)]
        );
        assert_eq!(runs(&[1, 1], 2 * PAGE - 100), vec![(0, 2 * PAGE - 100)]);
        assert_eq!(runs(&[0, 0], 2 * PAGE), vec![]);
    }

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
    fn resident_mode_leaves_holes_unallocated() {
        // A memfd of four pages, the second written: populating its mapping Resident must
        // populate that page only, allocating nothing.
        // SAFETY: plain system calls on a fresh memfd and its mapping, unmapped at the end.
        unsafe {
            let fd = libc::memfd_create(c"prefault-test".as_ptr(), 0);
            assert!(fd >= 0);
            assert_eq!(libc::ftruncate(fd, 4 * PAGE as libc::off_t), 0);
            let map = |()| {
                libc::mmap(
                    std::ptr::null_mut(),
                    4 * PAGE,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd,
                    0,
                ) as *mut u8
            };
            let owner = map(());
            owner.add(PAGE).write(7);
            let view = map(());
            assert!(
                !mapped(view.add(PAGE)),
                "a fresh mapping has no page table entries"
            );
            assert!(!all_resident(view, 4 * PAGE));
            assert!(all_resident(view.add(PAGE + 10), 100));
            Prefault::start("t".into(), "test view", Populate::Resident, view, 4 * PAGE)
                .unwrap()
                .finish();
            let mut vec = vec![0u8; 4];
            assert_eq!(libc::mincore(view.cast(), 4 * PAGE, vec.as_mut_ptr()), 0);
            assert_eq!(
                vec.iter().map(|b| b & 1).collect::<Vec<_>>(),
                vec![0, 1, 0, 0]
            );
            assert!(mapped(view.add(PAGE)), "the resident page is populated");
            assert!(!mapped(view) && !mapped(view.add(2 * PAGE)));
            assert_eq!(view.add(PAGE).read(), 7);
            libc::munmap(owner.cast(), 4 * PAGE);
            libc::munmap(view.cast(), 4 * PAGE);
            libc::close(fd);
        }
    }
}
