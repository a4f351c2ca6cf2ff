//! What a store keeps in DRAM about each region it owns: its state in the region life cycle,
//! the incarnation (generation and checksum key) it holds, how full it is and which records
//! were written into it. Recovery builds these from the device, the store keeps them current,
//! and reclamation reads and resets them.

use std::rc::Rc;

use crate::location::Location;
use crate::record::SumKey;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RegionState {
    Free,
    Active,
    Sealed,
    Reclaiming,
}

/// A record written into a region, for the reclaimer to find live entries without scanning
/// the whole index.
pub(crate) struct Member {
    pub bucket: Rc<str>,
    pub key: Rc<str>,
    pub loc: Location,
}

pub(crate) struct RegionInfo {
    pub generation: u64,
    pub key: SumKey,
    pub state: RegionState,
    /// Bytes used (header included); for the active region the writer's fill is current.
    pub fill: u64,
    pub live_bytes: u64,
    pub members: Vec<Member>,
}
