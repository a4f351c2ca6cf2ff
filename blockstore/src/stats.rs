//! Counters a store exposes for metrics and for the server's admin API.

/// A snapshot of one store's state and counters (since open).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Bytes of record space in this shard's regions (region headers excluded).
    pub capacity_bytes: u64,
    /// Bytes occupied in regions that are not free: live records, dead versions, tombstones
    /// and padding, until their region is reclaimed.
    pub used_bytes: u64,
    /// Bytes of the records the index points to.
    pub live_bytes: u64,
    /// Keys in the index.
    pub records: u64,
    pub regions_total: u32,
    pub regions_free: u32,
    pub regions_sealed: u32,
    /// Regions emptied by reclamation.
    pub regions_reclaimed: u64,
    /// Entries a reclamation dropped, handed back for re-admission, or rewrote forward.
    pub entries_dropped: u64,
    pub entries_readmitted: u64,
    pub entries_rewritten: u64,
    /// Records skipped because their checksum failed: at recovery, while reclaiming, and on
    /// reads (which return an error instead of the bytes).
    pub corrupt_records: u64,
    /// Region headers that were neither blank nor valid at open; their regions were reused.
    pub corrupt_regions: u32,
    /// Records (puts and tombstones) found intact at open.
    pub recovered_records: u64,
    /// Records appended since open (puts and tombstones, rewrites included).
    pub appended_records: u64,
    /// Payload bytes appended since open.
    pub appended_bytes: u64,
    /// Write I/Os submitted and currently in flight.
    pub writes_submitted: u64,
    pub writes_in_flight: u64,
    /// Every record with a sequence number up to this one is on stable storage.
    pub durable_seq: u64,
    /// The sequence number the next record gets.
    pub next_seq: u64,
}
