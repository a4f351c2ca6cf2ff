//! Backing a range of an engine's own memory with transparent huge pages.
//!
//! A same-host node reaches an engine's registered memory (a numpy array, a torch tensor, a
//! host pool) with cross-memory attach, and the kernel pins and walks the engine's side of
//! every copy page by page. With 2 MiB pages there the node's 2 MiB copies ran 12-25% faster
//! on the 2-vCPU VM the benches run on (docs/benchmarks.md, "Huge pages on the engine's
//! side"); the node's own side (its memfd arena) matters far less.
//!
//! Most engines allocate those ranges with plain `malloc`/`mmap`, which on a distribution
//! default (`transparent_hugepage=madvise`) gets 4 KiB pages. So when an engine registers a
//! range, the client asks for huge pages on the 2 MiB-aligned part inside it:
//!
//! - `MADV_HUGEPAGE` on that part, so pages faulted in later (the engine's first write, or
//!   the node's first copy into it) come as huge pages;
//! - `MADV_COLLAPSE` (Linux 6.1+) on each run of 2 MiB chunks that is already wholly
//!   resident, so memory the engine has filled is rebuilt as huge pages at once. A chunk with
//!   any page missing is not collapsed here, since that would populate its missing pages on
//!   the caller's thread. (Once advised, the kernel's `khugepaged` may still collapse a
//!   partly resident chunk in the background, as it does for any THP-advised memory, within
//!   its `max_ptes_none` limit; `YUTU_HUGE_PAGES=0` opts out of both.)
//!
//! Neither changes what the memory holds or who may reach it: both are hints about backing,
//! and the kernel may refuse either (no huge page free, pinned pages, an old kernel), which
//! only leaves the range as it was. Bytes outside the aligned part are never advised, so no
//! neighbouring allocation of the engine is touched.

use std::io;

/// The huge page size this module asks for (x86-64 and aarch64 with 4 KiB base pages).
pub const HUGE_PAGE: usize = 2 << 20;

/// `MADV_COLLAPSE` from Linux's `asm-generic/mman-common.h` (the `libc` crate has it only for
/// glibc targets).
const MADV_COLLAPSE: libc::c_int = 25;

/// How much to ask of the kernel for a registered range.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HugeBacking {
    /// `MADV_HUGEPAGE`, then `MADV_COLLAPSE` of the wholly resident chunks.
    #[default]
    Collapse,
    /// `MADV_HUGEPAGE` only: pages faulted in from now on.
    Advise,
    /// Nothing.
    Off,
}

impl HugeBacking {
    /// The choice named by `YUTU_HUGE_PAGES` (`collapse`, the default; `advise`; `0` or `off`).
    pub fn from_env() -> HugeBacking {
        match std::env::var("YUTU_HUGE_PAGES").as_deref() {
            Ok("0") | Ok("off") => HugeBacking::Off,
            Ok("advise") => HugeBacking::Advise,
            _ => HugeBacking::Collapse,
        }
    }
}

/// What [`back_with_huge_pages`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HugeBackingReport {
    /// Bytes advised `MADV_HUGEPAGE` (the range's 2 MiB-aligned part; 0 when it has none).
    pub advised: usize,
    /// Bytes the kernel collapsed into huge pages.
    pub collapsed: usize,
    /// Why the kernel refused a step, if it did (the range is then left as it was).
    pub refused: Option<String>,
}

/// Asks for huge pages on the 2 MiB-aligned part of `[ptr, ptr + len)`, as `how` says.
///
/// Safe to call on any range: `madvise` validates it (an unmapped range is refused with
/// `ENOMEM`), and the advice used here never changes the memory's contents or mapping.
pub fn back_with_huge_pages(ptr: *const u8, len: usize, how: HugeBacking) -> HugeBackingReport {
    let mut report = HugeBackingReport::default();
    let start = (ptr as usize).next_multiple_of(HUGE_PAGE);
    let Some(end) = (ptr as usize).checked_add(len) else {
        return report;
    };
    let end = end - end % HUGE_PAGE;
    if how == HugeBacking::Off || start >= end {
        return report;
    }
    if let Err(e) = advise(start, end - start, libc::MADV_HUGEPAGE) {
        report.refused = Some(format!("MADV_HUGEPAGE: {e}"));
        return report;
    }
    report.advised = end - start;
    if how != HugeBacking::Collapse {
        return report;
    }
    let resident = match resident_chunks(start, end - start) {
        Ok(r) => r,
        Err(e) => {
            report.refused = Some(format!("mincore: {e}"));
            return report;
        }
    };
    for (from, to) in runs(&resident) {
        let (at, n) = (start + from * HUGE_PAGE, (to - from) * HUGE_PAGE);
        match advise(at, n, MADV_COLLAPSE) {
            Ok(()) => report.collapsed += n,
            Err(e) => {
                // Refused for good (an old kernel, `EINVAL`) or for now (`EAGAIN`: no huge
                // page free, a page pinned): stop asking.
                report.refused = Some(format!("MADV_COLLAPSE: {e}"));
                break;
            }
        }
    }
    report
}

fn advise(at: usize, len: usize, advice: libc::c_int) -> io::Result<()> {
    // SAFETY: `MADV_HUGEPAGE` and `MADV_COLLAPSE` change only how the kernel backs the range,
    // never its contents or whether it is mapped; the kernel checks the range itself.
    let rc = unsafe { libc::madvise(at as *mut libc::c_void, len, advice) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// For each 2 MiB chunk of the (2 MiB-aligned) range, whether every base page of it is
/// resident.
fn resident_chunks(at: usize, len: usize) -> io::Result<Vec<bool>> {
    let page = crate::sys::page_size();
    let per_chunk = HUGE_PAGE / page;
    // One chunk's worth of `mincore` at a time, so a huge range needs no huge vector.
    let mut pages = vec![0u8; per_chunk];
    let mut out = Vec::with_capacity(len / HUGE_PAGE);
    for chunk in (at..at + len).step_by(HUGE_PAGE) {
        // SAFETY: `pages` has one byte for each base page of the chunk; the kernel checks the
        // range (`ENOMEM` when part of it is not mapped).
        let rc = unsafe {
            libc::mincore(
                chunk as *mut libc::c_void,
                HUGE_PAGE,
                pages.as_mut_ptr().cast(),
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        out.push(pages.iter().all(|p| p & 1 == 1));
    }
    Ok(out)
}

/// The runs of `true` in `flags`, as half-open index ranges.
fn runs(flags: &[bool]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut open = None;
    for (i, &f) in flags.iter().chain(std::iter::once(&false)).enumerate() {
        match (f, open) {
            (true, None) => open = Some(i),
            (false, Some(s)) => {
                out.push((s, i));
                open = None;
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Anonymous memory with room for `chunks` aligned 2 MiB chunks and one more either side.
    struct Anon {
        base: *mut u8,
        len: usize,
    }

    impl Anon {
        fn new(chunks: usize) -> Anon {
            let len = (chunks + 2) * HUGE_PAGE;
            // SAFETY: a fresh private anonymous mapping, unmapped in `drop`.
            let base = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(base, libc::MAP_FAILED);
            Anon {
                base: base.cast(),
                len,
            }
        }

        /// The first 2 MiB-aligned address inside.
        fn aligned(&self) -> *mut u8 {
            (self.base as usize).next_multiple_of(HUGE_PAGE) as *mut u8
        }

        /// Resident bytes of `[at, at + len)`.
        fn resident(&self, at: *mut u8, len: usize) -> usize {
            let page = crate::sys::page_size();
            let mut v = vec![0u8; len / page];
            // SAFETY: a range of this mapping, one output byte per page.
            let rc = unsafe { libc::mincore(at.cast(), len, v.as_mut_ptr()) };
            assert_eq!(rc, 0);
            v.iter().filter(|b| **b & 1 == 1).count() * page
        }

        /// Bytes of this mapping backed by huge pages (`AnonHugePages` in `smaps`).
        fn huge_bytes(&self) -> usize {
            let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
            let mut inside = false;
            let mut total = 0;
            for line in smaps.lines() {
                if let Some((range, _)) = line.split_once(' ') {
                    if let Some((a, b)) = range.split_once('-') {
                        if let (Ok(a), Ok(b)) =
                            (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                        {
                            let base = self.base as usize;
                            inside = a >= base && b <= base + self.len;
                            continue;
                        }
                    }
                }
                if inside {
                    if let Some(kb) = line.strip_prefix("AnonHugePages:") {
                        let kb = kb.trim().trim_end_matches(" kB").trim();
                        total += kb.parse::<usize>().unwrap() * 1024;
                    }
                }
            }
            total
        }
    }

    impl Drop for Anon {
        fn drop(&mut self) {
            // SAFETY: the mapping made in `new`, unmapped once.
            unsafe { libc::munmap(self.base.cast(), self.len) };
        }
    }

    #[test]
    fn runs_of_flags() {
        assert_eq!(runs(&[]), vec![]);
        assert_eq!(runs(&[true, true, false, true]), vec![(0, 2), (3, 4)]);
        assert_eq!(runs(&[false, false]), vec![]);
    }

    #[test]
    fn only_the_aligned_part_is_advised_and_nothing_when_off() {
        let m = Anon::new(4);
        let at = m.aligned();
        // Starts 1 byte past an aligned address and ends 1 byte past one: 2 chunks inside.
        // SAFETY: inside the mapping.
        let ptr = unsafe { at.add(1) };
        let r = back_with_huge_pages(ptr, 3 * HUGE_PAGE, HugeBacking::Advise);
        assert_eq!(r.advised, 2 * HUGE_PAGE, "{r:?}");
        assert_eq!(r.collapsed, 0);
        let none = back_with_huge_pages(ptr, HUGE_PAGE, HugeBacking::Collapse);
        assert_eq!(
            none,
            HugeBackingReport::default(),
            "no aligned chunk inside"
        );
        let off = back_with_huge_pages(at, 4 * HUGE_PAGE, HugeBacking::Off);
        assert_eq!(off, HugeBackingReport::default());
        let unmapped = back_with_huge_pages(std::ptr::null(), 4 * HUGE_PAGE, HugeBacking::Collapse);
        assert_eq!(unmapped.advised, 0);
        assert!(unmapped.refused.is_some(), "{unmapped:?}");
    }

    /// A filled chunk is collapsed and keeps its bytes; a chunk with one page touched is not
    /// one to collapse.
    #[test]
    fn resident_chunks_collapse_and_keep_their_bytes_others_are_not_populated() {
        let m = Anon::new(3);
        let at = m.aligned();
        // SAFETY: the first chunk is inside the mapping.
        let full = unsafe { std::slice::from_raw_parts_mut(at, HUGE_PAGE) };
        for (i, b) in full.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        // The third chunk gets one page. It is never advised here: once advised,
        // `khugepaged` may fill it in the background (as it may any THP-advised memory).
        // SAFETY: the third chunk's first byte is inside the mapping.
        let sparse = unsafe { at.add(2 * HUGE_PAGE) };
        // SAFETY: as above.
        unsafe { sparse.write(7) };
        assert_eq!(
            resident_chunks(at as usize, 3 * HUGE_PAGE).unwrap(),
            [true, false, false]
        );
        let r = back_with_huge_pages(at, HUGE_PAGE, HugeBacking::Collapse);
        assert_eq!(r.advised, HUGE_PAGE, "{r:?}");
        assert!(full.iter().enumerate().all(|(i, b)| *b == (i % 251) as u8));
        assert_eq!(
            m.resident(sparse, HUGE_PAGE),
            crate::sys::page_size(),
            "the sparse chunk is not populated"
        );
        match r.refused {
            // A kernel without MADV_COLLAPSE (before 6.1), or one with THP off: nothing
            // collapsed, nothing changed.
            Some(why) => assert_eq!(r.collapsed, 0, "{why}"),
            None => {
                assert_eq!(r.collapsed, HUGE_PAGE);
                assert!(
                    m.huge_bytes() >= HUGE_PAGE,
                    "the filled chunk is a huge page"
                );
            }
        }
    }
}
