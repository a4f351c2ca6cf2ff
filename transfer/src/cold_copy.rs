//! Copies into memory that nobody will read soon, with streaming (non-temporal) stores.
//!
//! A put writes a block into the node's arena, where it waits for some later get. An ordinary
//! copy first reads every destination cache line into the cache (read-for-ownership) and
//! writes it back when it is evicted: two trips to memory per line, and a cache full of lines
//! nobody will read. Streaming stores write whole lines without reading them first. On the
//! 2-core development VM, a one-thread copy of 2 MiB blocks into memory that is not in the
//! cache ran at about 10 GB/s with glibc's `memcpy` and 15–16 GB/s with streaming stores, and
//! a node's `batch_put_from` of 2 MiB blocks out of a client's mapped buffer went from 12 to
//! 19 GB/s (`cargo run --release -p yutu-bench -- kv`, row `put_from_2MiB_shm`). glibc
//! streams by itself only above three quarters of the shared cache, which on that VM (a
//! 260 MiB L3 as reported) is never.
//!
//! Copies *out* of the arena (a get into an engine's buffer) keep ordinary stores: the
//! engine is about to use those bytes, and streaming them measured no faster.
//!
//! Written here rather than taken from a crate because no maintained crate offers a
//! streaming `memcpy`; the loop is a few lines of `core::arch` intrinsics.

/// Below this many bytes a copy uses ordinary stores: the fence that ends a streamed copy
/// costs more than a small block saves, and a small block is more likely read back soon.
pub const STREAM_MIN: usize = 16 * 1024;

/// Copies `len` bytes from `src` to `dst`, streaming the stores when `len` is at least
/// [`STREAM_MIN`] and the CPU has them (x86-64; elsewhere an ordinary copy). Ends with a
/// store fence, so the bytes are visible to another thread before anything this thread
/// stores afterwards (the block's publication).
///
/// # Safety
///
/// `src` must be valid for reads and `dst` for writes of `len` bytes, and the two ranges must
/// not overlap. Another process may write `src` concurrently (a client's shared memory): the
/// copied bytes are then unspecified, as with `copy_nonoverlapping`.
pub unsafe fn copy_cold(src: *const u8, dst: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    if len >= STREAM_MIN {
        // SAFETY: as this function's contract.
        unsafe { x86::copy_streaming(src, dst, len) };
        return;
    }
    // SAFETY: as this function's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
}

/// [`copy_cold`] between slices of the same length (panics otherwise, like
/// `copy_from_slice`).
pub fn copy_cold_slice(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_cold_slice: lengths differ");
    // SAFETY: two live slices of `len` bytes; `&mut` excludes overlap with `src`.
    unsafe { copy_cold(src.as_ptr(), dst.as_mut_ptr(), dst.len()) }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Bytes moved per loop turn: two cache lines.
    const STEP: usize = 128;

    /// # Safety
    ///
    /// As [`super::copy_cold`].
    pub(super) unsafe fn copy_streaming(src: *const u8, dst: *mut u8, len: usize) {
        // Ordinary stores up to the first 32-byte boundary of the destination: streaming
        // stores need aligned addresses.
        let head = (dst as usize).wrapping_neg() & 31;
        let head = head.min(len);
        // SAFETY: `head <= len`, inside both ranges.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
        let body = (len - head) / STEP * STEP;
        // SAFETY: `[head, head + body)` lies inside both ranges and `dst + head` is 32-byte
        // aligned; AVX2 is used only where the CPU reports it.
        unsafe {
            let (s, d) = (src.add(head), dst.add(head));
            if std::is_x86_feature_detected!("avx2") {
                stream_avx2(s, d, body);
            } else {
                stream_sse2(s, d, body);
            }
        }
        let done = head + body;
        // SAFETY: the tail `[done, len)` lies inside both ranges.
        unsafe { std::ptr::copy_nonoverlapping(src.add(done), dst.add(done), len - done) };
        // SAFETY: SSE2 is part of x86-64. Streaming stores are weakly ordered: the fence makes
        // them visible before any later store of this thread, such as the one publishing the
        // block to readers on other threads.
        unsafe { _mm_sfence() };
    }

    /// # Safety
    ///
    /// `len` a multiple of [`STEP`], `dst` 32-byte aligned, both ranges valid for `len` bytes
    /// and the CPU supports AVX2.
    #[target_feature(enable = "avx2")]
    unsafe fn stream_avx2(src: *const u8, dst: *mut u8, len: usize) {
        let mut at = 0;
        while at < len {
            // SAFETY: `at + STEP <= len`; loads are unaligned, stores aligned (contract).
            unsafe {
                let s = src.add(at).cast::<__m256i>();
                let d = dst.add(at).cast::<__m256i>();
                let a = _mm256_loadu_si256(s);
                let b = _mm256_loadu_si256(s.add(1));
                let c = _mm256_loadu_si256(s.add(2));
                let e = _mm256_loadu_si256(s.add(3));
                _mm256_stream_si256(d, a);
                _mm256_stream_si256(d.add(1), b);
                _mm256_stream_si256(d.add(2), c);
                _mm256_stream_si256(d.add(3), e);
            }
            at += STEP;
        }
    }

    /// # Safety
    ///
    /// `len` a multiple of [`STEP`], `dst` 16-byte aligned, both ranges valid for `len` bytes.
    pub(super) unsafe fn stream_sse2(src: *const u8, dst: *mut u8, len: usize) {
        let mut at = 0;
        while at < len {
            // SAFETY: `at + STEP <= len`; SSE2 is part of x86-64; stores aligned (contract).
            unsafe {
                let s = src.add(at).cast::<__m128i>();
                let d = dst.add(at).cast::<__m128i>();
                for i in 0..STEP / 16 {
                    _mm_stream_si128(d.add(i), _mm_loadu_si128(s.add(i)));
                }
            }
            at += STEP;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every length around the thresholds, every destination misalignment within a line:
    /// the bytes arrive exactly, and nothing outside the destination range is touched.
    #[test]
    fn copies_exactly_at_every_length_and_alignment() {
        let src: Vec<u8> = (0..STREAM_MIN * 3).map(|i| (i * 7 + 3) as u8).collect();
        for len in [
            0,
            1,
            STREAM_MIN - 1,
            STREAM_MIN,
            STREAM_MIN + 1,
            STREAM_MIN + 127,
            STREAM_MIN * 2 + 77,
        ] {
            for misalign in [0usize, 1, 15, 16, 31, 33, 63] {
                for src_off in [0usize, 5] {
                    let mut dst = vec![0xAAu8; len + misalign + 64];
                    let s = &src[src_off..src_off + len];
                    copy_cold_slice(&mut dst[misalign..misalign + len], s);
                    assert_eq!(&dst[misalign..misalign + len], s, "len {len} +{misalign}");
                    assert!(
                        dst[..misalign].iter().all(|&b| b == 0xAA),
                        "before, len {len}"
                    );
                    assert!(
                        dst[misalign + len..].iter().all(|&b| b == 0xAA),
                        "after, len {len} +{misalign}"
                    );
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_sse2_loop_copies_what_the_avx2_loop_does() {
        let src: Vec<u8> = (0..4096).map(|i| (i * 13) as u8).collect();
        let mut a = vec![0u8; 4096 + 32];
        let off = (a.as_ptr() as usize).wrapping_neg() & 31;
        // SAFETY: `off + 4096` is inside `a`, aligned to 32 bytes; 4096 is a multiple of STEP.
        unsafe { x86::stream_sse2(src.as_ptr(), a.as_mut_ptr().add(off), 4096) };
        assert_eq!(&a[off..off + 4096], &src[..]);
    }
}
