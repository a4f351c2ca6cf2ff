//! What the caller decides and learns about reclamation: the [`ReclaimPolicy`] that picks the
//! fate of each live entry of a reclaimed region, and the [`Reclaimed`] report of what became
//! of them. The reclamation itself is `reclaim.rs`; the store holds a policy and hands the
//! reports to its callers.

use bytes::Bytes;

use crate::location::Location;

/// What to do with a live entry of a region being reclaimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReclaimAction {
    /// Forget it: it leaves the NVMe tier.
    Drop,
    /// Read it and return its bytes in [`Reclaimed::readmitted`] for the caller to re-insert
    /// into DRAM; it leaves the NVMe tier.
    Readmit,
    /// Copy it into the active region under a new sequence number; it stays in the tier, even
    /// when that leaves no room for the record that triggered the reclamation (which then
    /// waits for the next region). Only a reclamation with no active region to copy into (or
    /// one started by [`crate::RegionStore::reclaim_oldest`] into a region too full for it)
    /// drops it, and reports it as such.
    Rewrite,
}

/// A live entry of the region being reclaimed, as shown to the policy.
#[derive(Debug, Clone, Copy)]
pub struct ReclaimCandidate<'a> {
    pub bucket: &'a str,
    pub key: &'a str,
    /// The metadata stored with the entry.
    pub meta: &'a [u8],
    pub location: Location,
}

/// Decides the fate of each live entry of a reclaimed region.
///
/// Called on the shard's thread while the store is reclaiming; it must not call back into the
/// store's async methods. Closures `FnMut(&ReclaimCandidate) -> ReclaimAction` are policies.
pub trait ReclaimPolicy {
    fn decide(&mut self, candidate: &ReclaimCandidate<'_>) -> ReclaimAction;
}

impl<F: FnMut(&ReclaimCandidate<'_>) -> ReclaimAction> ReclaimPolicy for F {
    fn decide(&mut self, candidate: &ReclaimCandidate<'_>) -> ReclaimAction {
        self(candidate)
    }
}

/// The default policy: the NVMe tier is a cache, entries of the oldest region are evicted.
#[derive(Debug, Default, Clone, Copy)]
pub struct DropAll;

impl ReclaimPolicy for DropAll {
    fn decide(&mut self, _: &ReclaimCandidate<'_>) -> ReclaimAction {
        ReclaimAction::Drop
    }
}

/// A bucket and key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ObjectName {
    pub bucket: String,
    pub key: String,
}

/// An entry handed back by reclamation for re-admission into DRAM.
#[derive(Debug, Clone)]
pub struct Readmitted {
    pub bucket: String,
    pub key: String,
    pub meta: Bytes,
    pub value: Bytes,
}

/// What one reclamation did.
#[derive(Debug, Clone, Default)]
pub struct Reclaimed {
    pub region: u32,
    /// The generation that was reclaimed.
    pub generation: u64,
    /// Entries that left the tier without their bytes (policy `Drop`, or `Rewrite` without
    /// room). The server should treat them as evicted.
    pub dropped: Vec<ObjectName>,
    /// Entries that left the tier with their bytes.
    pub readmitted: Vec<Readmitted>,
    /// Entries that stay in the tier at a new location.
    pub rewritten: Vec<ObjectName>,
    /// Live entries whose record failed its checksum while being read; dropped (and also
    /// listed in `dropped`).
    pub corrupt: u64,
}
