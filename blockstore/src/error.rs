//! The crate's typed errors: one for the block layer, one for the region store.
//!
//! The split follows the layering. A [`BdevError`] says the device refused or failed an I/O;
//! a [`StoreError`] says what that means for a record (or reports a store-level condition such
//! as a checksum mismatch). Callers that serve clients match on [`StoreError`]: `NotFound` and
//! `Stale` are misses, `Corrupt` is a miss that must also be counted, and everything else is
//! an operational failure of the tier.

use std::path::PathBuf;

/// A failed or refused block-device operation.
#[derive(Debug, thiserror::Error)]
pub enum BdevError {
    /// The operating system reported an error.
    #[error("{op} on {device}: {source}")]
    Io {
        op: &'static str,
        device: String,
        #[source]
        source: std::io::Error,
    },
    /// An I/O that does not start or end on a block boundary.
    #[error("{what} of {value} is not a multiple of the block size {block_size}")]
    Misaligned {
        what: &'static str,
        value: u64,
        block_size: usize,
    },
    /// An I/O that would run past the end of the device.
    #[error("blocks {lba}..{end} are past the end of the device ({block_count} blocks)")]
    OutOfRange {
        lba: u64,
        end: u64,
        block_count: u64,
    },
    /// The kernel moved fewer bytes than asked (a write to a full file system, a read past
    /// the end of a file that shrank under us).
    #[error("short {op}: {done} of {expected} bytes")]
    Short {
        op: &'static str,
        done: usize,
        expected: usize,
    },
    /// The path sits on a file system that silently ignores O_DIRECT (tmpfs): I/O would go
    /// through the page cache and flushes would mean nothing, so the backend refuses it.
    #[error("{} does not support O_DIRECT (tmpfs?); use a file on a disk-backed file system or a block device", path.display())]
    NoDirectIo { path: PathBuf },
    /// Neither a regular file nor a block device, or one too small to hold a single block.
    #[error("{} is not usable as a block device: {reason}", path.display())]
    Unusable { path: PathBuf, reason: String },
}

/// Why a record read from the device was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CorruptKind {
    /// No record header (wrong magic, version or header checksum) where one should start.
    Header,
    /// The header is intact but does not describe the record the index expects (different
    /// sequence number, kind or lengths).
    Mismatch,
    /// The blake3 checksum over header and payload does not match.
    Checksum,
}

/// A failed region-store operation.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Bdev(#[from] BdevError),
    /// The configuration cannot describe a store on this device.
    #[error("invalid store configuration: {0}")]
    Config(String),
    /// A region header written by a different layout (another shard, shard count, region or
    /// block size). Opening would misattribute keys, so it is refused unless the caller asked
    /// to discard such regions.
    #[error(
        "region {region} belongs to shard {shard} of {nshards} with {region_size}-byte regions; \
         this store is shard {my_shard} of {my_nshards} with {my_region_size}-byte regions"
    )]
    ForeignRegion {
        region: u32,
        shard: u32,
        nshards: u32,
        region_size: u64,
        my_shard: u32,
        my_nshards: u32,
        my_region_size: u64,
    },
    /// The bucket name, key or metadata is longer than the record format can hold.
    #[error("{what} is {len} bytes; at most {max} are allowed")]
    TooLong {
        what: &'static str,
        len: usize,
        max: usize,
    },
    /// The record cannot fit in one region.
    #[error("a {len}-byte value cannot be stored: at most {max} bytes fit in one region")]
    TooLarge { len: u64, max: u64 },
    /// The record's region was reclaimed (and possibly rewritten) after the location was
    /// handed out; the location no longer names anything.
    #[error("region {region} was reclaimed: generation {expected} is gone (now {current})")]
    Stale {
        region: u32,
        expected: u64,
        current: u64,
    },
    /// The bytes on the device are not the record that was written there. Never served.
    #[error("corrupt record in region {region} at offset {offset}: {kind:?}")]
    Corrupt {
        region: u32,
        offset: u32,
        kind: CorruptKind,
    },
    /// An earlier write failed; records appended after the failure point may be missing, so
    /// the store refuses further writes. Reads of records already on disk still work.
    #[error("the store stopped accepting writes after an I/O failure: {0}")]
    Poisoned(String),
    /// No region could be freed for the record (every region is active, in flight, or holds
    /// entries the policy keeps).
    #[error("no space: no region can be reclaimed for a {need}-byte record")]
    NoSpace { need: u64 },
}

impl BdevError {
    pub(crate) fn io(op: &'static str, device: impl Into<String>, source: std::io::Error) -> Self {
        BdevError::Io {
            op,
            device: device.into(),
            source,
        }
    }
}
