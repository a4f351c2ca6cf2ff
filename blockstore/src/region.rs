//! Regions: the fixed-size slices of the device that are written sequentially and reclaimed
//! whole, and the header that starts each one.
//!
//! A region is the unit of ownership (each shard owns its own set), of allocation (records are
//! appended to the one active region) and of reclamation (the oldest region is emptied at
//! once, so the device only ever sees large sequential writes). Its first I/O block holds a
//! [`RegionHeader`]; records follow from the next block on.
//!
//! ```text
//! region header (little endian)
//! offset size field
//!   0     8   magic "YUTUREGN"
//!   8     2   format version (1)
//!  10     2   reserved, 0
//!  12     4   I/O alignment the store used (bytes)
//!  16     8   region size (bytes)
//!  24     4   region index on the device
//!  28     4   reserved, 0
//!  32     4   owner shard
//!  36     4   number of shards of that layout
//!  40     8   generation: increases every time any region of the shard is (re)initialised;
//!             orders regions oldest to newest
//!  48    16   nonce: random per incarnation; keys the record checksums
//!  64    32   blake3 over bytes 0..64
//! ```
//!
//! Every (re)initialisation writes a new generation and a fresh nonce. The nonce is what makes
//! the previous incarnation's records invisible: their checksums were keyed with the old one.

use crate::record::SumKey;

/// Bytes of the encoded region header (the rest of its block is zero).
pub const REGION_HEADER_LEN: usize = 96;

const MAGIC: [u8; 8] = *b"YUTUREGN";
const VERSION: u16 = 1;
// The on-disk format's key context keeps the crate's old name: changing it would make every
// existing record fail its checksum.
const KEY_CONTEXT: &str = "yutu-spdk region record checksum key v1";

/// The header at the start of every region in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionHeader {
    pub io_align: u32,
    pub region_size: u64,
    pub region: u32,
    pub shard: u32,
    pub nshards: u32,
    pub generation: u64,
    pub nonce: [u8; 16],
}

/// What the first bytes of a region turned out to hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderState {
    /// All zero: never written.
    Blank,
    /// A header whose checksum matched.
    Valid(RegionHeader),
    /// Something else: a damaged header.
    Garbage,
}

impl RegionHeader {
    /// Writes the header into the first [`REGION_HEADER_LEN`] bytes of `out`.
    pub fn encode(&self, out: &mut [u8]) {
        let h = &mut out[..REGION_HEADER_LEN];
        h.fill(0);
        h[0..8].copy_from_slice(&MAGIC);
        h[8..10].copy_from_slice(&VERSION.to_le_bytes());
        h[12..16].copy_from_slice(&self.io_align.to_le_bytes());
        h[16..24].copy_from_slice(&self.region_size.to_le_bytes());
        h[24..28].copy_from_slice(&self.region.to_le_bytes());
        h[32..36].copy_from_slice(&self.shard.to_le_bytes());
        h[36..40].copy_from_slice(&self.nshards.to_le_bytes());
        h[40..48].copy_from_slice(&self.generation.to_le_bytes());
        h[48..64].copy_from_slice(&self.nonce);
        let sum = blake3::hash(&h[..64]);
        h[64..96].copy_from_slice(sum.as_bytes());
    }

    /// Decodes the start of a region.
    pub fn decode(buf: &[u8]) -> HeaderState {
        if buf.len() < REGION_HEADER_LEN {
            return HeaderState::Garbage;
        }
        let h = &buf[..REGION_HEADER_LEN];
        if h.iter().all(|&b| b == 0) {
            return HeaderState::Blank;
        }
        let valid = h[0..8] == MAGIC
            && h[8..10] == VERSION.to_le_bytes()
            && h[10..12] == [0, 0]
            && h[28..32] == [0; 4]
            && blake3::hash(&h[..64]).as_bytes()[..] == h[64..96];
        if !valid {
            return HeaderState::Garbage;
        }
        let u32_at = |at: usize| u32::from_le_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
        let u64_at = |at: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&h[at..at + 8]);
            u64::from_le_bytes(a)
        };
        let mut nonce = [0u8; 16];
        nonce.copy_from_slice(&h[48..64]);
        HeaderState::Valid(RegionHeader {
            io_align: u32_at(12),
            region_size: u64_at(16),
            region: u32_at(24),
            shard: u32_at(32),
            nshards: u32_at(36),
            generation: u64_at(40),
            nonce,
        })
    }

    /// The key every record checksum of this incarnation is computed with.
    pub fn sum_key(&self) -> SumKey {
        let mut material = [0u8; 28];
        material[..16].copy_from_slice(&self.nonce);
        material[16..20].copy_from_slice(&self.region.to_le_bytes());
        material[20..28].copy_from_slice(&self.generation.to_le_bytes());
        SumKey(blake3::derive_key(KEY_CONTEXT, &material))
    }
}

/// A fresh random nonce for a region incarnation.
///
/// From the kernel's CSPRNG; if `getrandom` is unavailable, from a hash of the time, the
/// process id and a counter, which is still unique but no longer unpredictable.
pub fn new_nonce() -> [u8; 16] {
    let mut out = [0u8; 16];
    // SAFETY: getrandom writes at most `out.len()` bytes into the live buffer `out`.
    let n = unsafe { libc::getrandom(out.as_mut_ptr().cast(), out.len(), 0) };
    if n == out.len() as isize {
        return out;
    }
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = blake3::Hasher::new();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    h.update(&now.to_le_bytes());
    h.update(&std::process::id().to_le_bytes());
    h.update(&COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    out.copy_from_slice(&h.finalize().as_bytes()[..16]);
    out
}

/// Where regions sit on the device, in bytes and blocks.
#[derive(Debug, Clone, Copy)]
pub struct Geometry {
    /// The device's block size (its LBA size).
    pub block_size: u64,
    /// The store's I/O unit: a multiple of the block size, at least 4 KiB so that writes never
    /// split a physical sector of an "emulated 512" device.
    pub io_align: u64,
    pub region_size: u64,
}

impl Geometry {
    /// First block of region `r`.
    pub fn region_lba(&self, r: u32) -> u64 {
        u64::from(r) * self.region_size / self.block_size
    }

    /// Block holding byte `offset` of region `r` (`offset` a multiple of the block size).
    pub fn lba(&self, r: u32, offset: u64) -> u64 {
        self.region_lba(r) + offset / self.block_size
    }

    /// Blocks per region.
    pub fn region_blocks(&self) -> u64 {
        self.region_size / self.block_size
    }

    /// Where the first record of a region goes: right after the header block.
    pub fn data_start(&self) -> u64 {
        self.io_align
    }

    /// The largest record (header, names and value) a region can hold.
    pub fn max_record(&self) -> u64 {
        self.region_size - self.data_start()
    }
}

pub(crate) fn align_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

pub(crate) fn align_down(v: u64, a: u64) -> u64 {
    v / a * a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> RegionHeader {
        RegionHeader {
            io_align: 4096,
            region_size: 1 << 20,
            region: 5,
            shard: 1,
            nshards: 2,
            generation: 9,
            nonce: new_nonce(),
        }
    }

    #[test]
    fn round_trip() {
        let h = header();
        let mut block = vec![0u8; 4096];
        h.encode(&mut block);
        assert_eq!(RegionHeader::decode(&block), HeaderState::Valid(h));
    }

    #[test]
    fn blank_and_damaged_headers_are_told_apart() {
        assert_eq!(RegionHeader::decode(&[0u8; 4096]), HeaderState::Blank);
        let mut block = vec![0u8; 4096];
        header().encode(&mut block);
        block[41] ^= 0x80;
        assert_eq!(RegionHeader::decode(&block), HeaderState::Garbage);
    }

    #[test]
    fn each_incarnation_has_its_own_key() {
        let a = header();
        let mut b = a;
        b.generation += 1;
        b.nonce = new_nonce();
        assert_ne!(a.sum_key(), b.sum_key());
        assert_ne!(new_nonce(), new_nonce());
    }
}
