//! The on-disk record: a fixed header, the bucket and key names, an opaque metadata blob and
//! the value, with blake3 checksums, so that a record read back is either exactly what was
//! written or rejected.
//!
//! The metadata blob is the caller's (the server keeps an object's size, ETag, content type
//! and user metadata there); it is small, covered by the checksum, and kept in the DRAM index
//! after recovery so that listing and HEAD need no I/O.
//!
//! ```text
//! offset size field
//!   0     4   magic "YtR1"
//!   4     2   format version (1), little endian like every integer here
//!   6     1   kind: 1 = put, 2 = tombstone (a durable delete)
//!   7     1   flags, 0
//!   8     2   bucket length
//!  10     2   key length
//!  12     4   metadata length (at most 64 KiB - 1)
//!  16     8   value length
//!  24     8   sequence number (per store, increasing; newest wins at recovery)
//!  32     8   header checksum: blake3 over bytes 0..32, first 8 bytes
//!  40    32   record checksum: blake3 over bytes 0..40, bucket, key, metadata and value
//!  72         bucket, key, metadata, value; the next record starts at the next multiple of 8
//! ```
//!
//! Both checksums are *keyed*: the key is derived from the random nonce of the region
//! incarnation the record was written into (see `region.rs`), and the record's offset in the
//! region is hashed too. Three things follow. Records left over from a previous incarnation of
//! a reused region never validate, so no "end of log" marker is needed. A client cannot plant a
//! valid-looking record inside a value, because it cannot know the nonce. And a block written
//! to the wrong place (a misdirected write) fails its checksum.
//!
//! The header checksum exists so that the lengths can be trusted before the payload is read:
//! recovery uses it to step over a record whose payload is damaged, and to recognise a record
//! header when it searches for the next record after a damaged one.

use crate::error::CorruptKind;

/// Bytes of the fixed record header.
pub const HEADER_LEN: usize = 72;
/// Records start at multiples of this within a region.
pub const RECORD_ALIGN: u64 = 8;
/// Longest bucket or key name the format can hold.
pub const MAX_NAME_LEN: usize = u16::MAX as usize;
/// Largest metadata blob a record may carry.
pub const MAX_META_LEN: usize = u16::MAX as usize;

const MAGIC: [u8; 4] = *b"YtR1";
const VERSION: u16 = 1;
const SUM_OFFSET: usize = 40;

/// What a record says about its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    /// The value of the key from this sequence number on.
    Put,
    /// The key was deleted at this sequence number; hides every older version.
    Tombstone,
}

impl RecordKind {
    fn code(self) -> u8 {
        match self {
            RecordKind::Put => 1,
            RecordKind::Tombstone => 2,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(RecordKind::Put),
            2 => Some(RecordKind::Tombstone),
            _ => None,
        }
    }
}

/// The key the checksums of one region incarnation are computed with.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SumKey(pub(crate) [u8; 32]);

impl std::fmt::Debug for SumKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SumKey(..)")
    }
}

/// A decoded header whose header checksum matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    pub kind: RecordKind,
    pub bucket_len: u16,
    pub key_len: u16,
    pub meta_len: u32,
    pub value_len: u64,
    pub seq: u64,
}

impl RecordHeader {
    /// Header, names, metadata and value: the bytes this record occupies before alignment.
    pub fn total_len(&self) -> u64 {
        self.value_offset() as u64 + self.value_len
    }

    /// Where the metadata starts, relative to the start of the record.
    pub fn meta_offset(&self) -> usize {
        HEADER_LEN + usize::from(self.bucket_len) + usize::from(self.key_len)
    }

    /// Where the value starts, relative to the start of the record.
    pub fn value_offset(&self) -> usize {
        self.meta_offset() + self.meta_len as usize
    }
}

/// Bytes a record with these lengths occupies, without alignment padding.
pub fn record_len(bucket_len: usize, key_len: usize, meta_len: usize, value_len: usize) -> u64 {
    (HEADER_LEN + bucket_len + key_len + meta_len) as u64 + value_len as u64
}

/// Rounds `n` up to the record alignment.
pub fn align_record(n: u64) -> u64 {
    n.div_ceil(RECORD_ALIGN) * RECORD_ALIGN
}

fn header_sum(key: &SumKey, offset: u32, fixed: &[u8]) -> [u8; 8] {
    let mut h = blake3::Hasher::new_keyed(&key.0);
    h.update(&offset.to_le_bytes());
    h.update(fixed);
    let mut out = [0u8; 8];
    out.copy_from_slice(&h.finalize().as_bytes()[..8]);
    out
}

fn record_sum(key: &SumKey, offset: u32, head: &[u8], parts: [&[u8]; 4]) -> [u8; 32] {
    let mut h = blake3::Hasher::new_keyed(&key.0);
    h.update(&offset.to_le_bytes());
    h.update(head);
    for p in parts {
        h.update(p);
    }
    *h.finalize().as_bytes()
}

/// The variable parts of a record, in their on-disk order.
#[derive(Debug, Clone, Copy)]
pub struct Parts<'a> {
    pub bucket: &'a [u8],
    pub key: &'a [u8],
    pub meta: &'a [u8],
    pub value: &'a [u8],
}

/// Builds the header of a record written at `offset` of a region whose checksum key is
/// `key`. The caller has checked the lengths against [`MAX_NAME_LEN`] and [`MAX_META_LEN`].
///
/// The value is hashed here in one `update`, before it is copied into the region buffer:
/// blake3 is fastest on one large input (measured: hashing 1 MiB values in 64 KiB pieces
/// interleaved with the copy was a third slower than hashing first and copying after).
pub fn encode_header(
    key: &SumKey,
    offset: u32,
    kind: RecordKind,
    parts: &Parts<'_>,
    seq: u64,
) -> [u8; HEADER_LEN] {
    let Parts {
        bucket,
        key: name,
        meta,
        value,
    } = *parts;
    debug_assert!(bucket.len() <= MAX_NAME_LEN && name.len() <= MAX_NAME_LEN);
    debug_assert!(meta.len() <= MAX_META_LEN);
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(&MAGIC);
    h[4..6].copy_from_slice(&VERSION.to_le_bytes());
    h[6] = kind.code();
    h[8..10].copy_from_slice(&(bucket.len() as u16).to_le_bytes());
    h[10..12].copy_from_slice(&(name.len() as u16).to_le_bytes());
    h[12..16].copy_from_slice(&(meta.len() as u32).to_le_bytes());
    h[16..24].copy_from_slice(&(value.len() as u64).to_le_bytes());
    h[24..32].copy_from_slice(&seq.to_le_bytes());
    let hs = header_sum(key, offset, &h[..32]);
    h[32..40].copy_from_slice(&hs);
    let sum = record_sum(key, offset, &h[..SUM_OFFSET], [bucket, name, meta, value]);
    h[SUM_OFFSET..].copy_from_slice(&sum);
    h
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Cheap pre-check used while searching for the next record: does a record header plausibly
/// start at the beginning of `buf`?
pub fn has_magic(buf: &[u8]) -> bool {
    buf.len() >= 4 && buf[..4] == MAGIC
}

/// Decodes the header at the start of `buf`, a record claimed to sit at `offset` of a region
/// with checksum key `key`. `None` unless magic, version, reserved fields and the header
/// checksum are all right.
pub fn parse_header(key: &SumKey, offset: u32, buf: &[u8]) -> Option<RecordHeader> {
    if buf.len() < HEADER_LEN || !has_magic(buf) {
        return None;
    }
    let meta_len = u32::from_le_bytes([buf[12], buf[13], buf[14], buf[15]]);
    if le16(buf, 4) != VERSION || buf[7] != 0 || meta_len as usize > MAX_META_LEN {
        return None;
    }
    if header_sum(key, offset, &buf[..32]) != buf[32..40] {
        return None;
    }
    Some(RecordHeader {
        kind: RecordKind::from_code(buf[6])?,
        bucket_len: le16(buf, 8),
        key_len: le16(buf, 10),
        meta_len,
        value_len: le64(buf, 16),
        seq: le64(buf, 24),
    })
}

/// A record whose checksum matched, borrowed from the buffer it was read into.
#[derive(Debug)]
pub struct RecordView<'a> {
    pub bucket: &'a [u8],
    pub key: &'a [u8],
    pub meta: &'a [u8],
}

/// Checks the record checksum of a record whose header `hdr` was parsed from the start of
/// `buf`; `buf` must hold at least `hdr.total_len()` bytes.
pub fn verify<'a>(
    key: &SumKey,
    offset: u32,
    hdr: &RecordHeader,
    buf: &'a [u8],
) -> Result<RecordView<'a>, CorruptKind> {
    let total = usize::try_from(hdr.total_len()).map_err(|_| CorruptKind::Mismatch)?;
    if buf.len() < total {
        return Err(CorruptKind::Mismatch);
    }
    let b_end = HEADER_LEN + usize::from(hdr.bucket_len);
    let k_end = b_end + usize::from(hdr.key_len);
    let m_end = k_end + hdr.meta_len as usize;
    let (bucket, name) = (&buf[HEADER_LEN..b_end], &buf[b_end..k_end]);
    let (meta, value) = (&buf[k_end..m_end], &buf[m_end..total]);
    let sum = record_sum(key, offset, &buf[..SUM_OFFSET], [bucket, name, meta, value]);
    if sum[..] != buf[SUM_OFFSET..HEADER_LEN] {
        return Err(CorruptKind::Checksum);
    }
    Ok(RecordView {
        bucket,
        key: name,
        meta,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: SumKey = SumKey([7; 32]);

    fn build(kind: RecordKind, value: &[u8], offset: u32) -> Vec<u8> {
        let parts = Parts {
            bucket: b"bkt",
            key: b"some/key",
            meta: b"etag=1",
            value,
        };
        let mut out = encode_header(&K, offset, kind, &parts, 42).to_vec();
        out.extend_from_slice(b"bkt");
        out.extend_from_slice(b"some/key");
        out.extend_from_slice(b"etag=1");
        out.extend_from_slice(value);
        out
    }

    #[test]
    fn round_trip() {
        let rec = build(RecordKind::Put, b"hello world", 4096);
        let hdr = parse_header(&K, 4096, &rec).expect("header parses");
        assert_eq!(hdr.kind, RecordKind::Put);
        assert_eq!(hdr.seq, 42);
        assert_eq!(hdr.total_len(), rec.len() as u64);
        let view = verify(&K, 4096, &hdr, &rec).expect("checksum matches");
        assert_eq!(view.bucket, b"bkt");
        assert_eq!(view.key, b"some/key");
        assert_eq!(view.meta, b"etag=1");
        assert_eq!(&rec[hdr.value_offset()..], b"hello world");
    }

    #[test]
    fn tombstone_has_no_value() {
        let rec = build(RecordKind::Tombstone, b"", 8);
        let hdr = parse_header(&K, 8, &rec).expect("header parses");
        assert_eq!(hdr.kind, RecordKind::Tombstone);
        assert_eq!(hdr.value_len, 0);
        assert!(verify(&K, 8, &hdr, &rec).is_ok());
    }

    #[test]
    fn any_flipped_byte_is_detected() {
        let rec = build(RecordKind::Put, &[0xAB; 300], 64);
        for i in 0..rec.len() {
            let mut bad = rec.clone();
            bad[i] ^= 0x01;
            let ok = parse_header(&K, 64, &bad)
                .and_then(|h| verify(&K, 64, &h, &bad).ok())
                .is_some();
            assert!(!ok, "flip at byte {i} went unnoticed");
        }
    }

    #[test]
    fn wrong_key_or_offset_does_not_validate() {
        let rec = build(RecordKind::Put, b"v", 128);
        assert!(parse_header(&SumKey([8; 32]), 128, &rec).is_none());
        assert!(parse_header(&K, 136, &rec).is_none());
    }

    #[test]
    fn short_buffer_is_rejected() {
        let rec = build(RecordKind::Put, b"value", 0);
        assert!(parse_header(&K, 0, &rec[..HEADER_LEN - 1]).is_none());
        let hdr = parse_header(&K, 0, &rec).expect("header parses");
        assert_eq!(
            verify(&K, 0, &hdr, &rec[..rec.len() - 1]).unwrap_err(),
            CorruptKind::Mismatch
        );
    }
}
