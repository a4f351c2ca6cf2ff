//! Registered segments: the table every listener checks requests against, and the handle the
//! owner keeps to mint descriptors.
//!
//! The table is the one place that decides whether a peer may touch bytes. Every path goes
//! through [`SegmentTable::check`]: the tcp listener per request, the shm and rdma control
//! channels per batch before the initiator copies or posts work requests. The checks are, in
//! order: the descriptor names this node, the segment is registered, the token verifies, the
//! descriptor's range lies in the segment, and the requested part lies in the descriptor.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, RwLock};

use crate::descriptor::{NodeId, SegmentDescriptor, SegmentId};
use crate::error::{Refusal, TransferError};
use crate::region::{MemoryRegion, RegionError};
use crate::token::SegmentKey;

/// A segment registered with a [`crate::TransferEngine`]: the owner's handle, used to mint
/// descriptors for ranges of it and as the local side of transfers. Cheap to clone, `Send` and
/// `Sync`, so a storage node's shard can keep one next to its arena.
#[derive(Clone)]
pub struct LocalSegment {
    pub(crate) entry: Arc<SegmentEntry>,
}

/// Decides on every request whether a range of a segment may still be accessed. A storage
/// node answers from its leases and pending puts, so that a descriptor used after its lease
/// expired is refused ([`Refusal::Expired`]) instead of reaching memory that may have been
/// reused. Called on transfer threads: it must be quick and must not block for long.
pub trait RangeGuard: Send + Sync {
    fn allows(&self, offset: u64, len: u64) -> bool;
}

pub(crate) struct SegmentEntry {
    /// Consulted after the token check; `None`: every minted range stays valid.
    pub(crate) guard: Option<Arc<dyn RangeGuard>>,
    pub(crate) id: SegmentId,
    pub(crate) node: NodeId,
    /// Incarnation of the engine that registered it (a segment is only usable there).
    pub(crate) engine: u64,
    pub(crate) region: MemoryRegion,
    key: SegmentKey,
    /// The memfd may be handed to same-host peers (it is sealed against shrinking).
    pub(crate) shareable: bool,
}

impl LocalSegment {
    pub fn id(&self) -> SegmentId {
        self.entry.id
    }

    pub fn node(&self) -> NodeId {
        self.entry.node
    }

    /// Bytes in the segment.
    pub fn len(&self) -> u64 {
        self.entry.region.len() as u64
    }

    /// Always false (regions are never empty).
    pub fn is_empty(&self) -> bool {
        self.entry.region.is_empty()
    }

    pub fn region(&self) -> &MemoryRegion {
        &self.entry.region
    }

    /// True when same-host peers can reach this segment over shm.
    pub fn shm_shareable(&self) -> bool {
        self.entry.shareable
    }

    /// A descriptor granting `[offset, offset + len)` of this segment to whoever holds it.
    /// Grant only what the lease or the pending put covers: the token cannot be revoked short of
    /// unregistering the segment.
    pub fn descriptor(&self, offset: u64, len: u64) -> Result<SegmentDescriptor, TransferError> {
        let size = self.len();
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(RegionError::OutOfBounds { offset, len, size }.into());
        }
        Ok(self.entry.mint(offset, len))
    }
}

impl std::fmt::Debug for LocalSegment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalSegment")
            .field("node", &self.entry.node)
            .field("id", &self.entry.id)
            .field("len", &self.len())
            .field("shm_shareable", &self.entry.shareable)
            .finish()
    }
}

impl SegmentEntry {
    fn mint(&self, offset: u64, len: u64) -> SegmentDescriptor {
        SegmentDescriptor {
            node: self.node,
            segment: self.id,
            offset,
            len,
            token: self.key.mint(self.node, self.id, offset, len),
        }
    }
}

/// Bytes a peer was allowed to touch, with the segment kept alive while it does.
pub(crate) struct Grant {
    /// Held, not read: keeps the mapping alive while the listener copies.
    pub(crate) _entry: Arc<SegmentEntry>,
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
}

/// The segments of one engine, shared by its listeners and workers.
pub(crate) struct SegmentTable {
    node: NodeId,
    engine: u64,
    map: RwLock<HashMap<SegmentId, Arc<SegmentEntry>>>,
    next: AtomicU32,
}

impl SegmentTable {
    pub(crate) fn new(node: NodeId, engine: u64) -> SegmentTable {
        SegmentTable {
            node,
            engine,
            map: RwLock::new(HashMap::new()),
            next: AtomicU32::new(1),
        }
    }

    pub(crate) fn insert(
        &self,
        region: MemoryRegion,
        allow_shm: bool,
        guard: Option<Arc<dyn RangeGuard>>,
    ) -> Result<LocalSegment, TransferError> {
        let id = SegmentId(self.next.fetch_add(1, Ordering::Relaxed));
        let key = SegmentKey::random().map_err(|e| TransferError::setup("read /dev/urandom", e))?;
        let shareable = allow_shm && region.sealed();
        let entry = Arc::new(SegmentEntry {
            guard,
            id,
            node: self.node,
            engine: self.engine,
            region,
            key,
            shareable,
        });
        self.write().insert(id, Arc::clone(&entry));
        Ok(LocalSegment { entry })
    }

    pub(crate) fn remove(&self, id: SegmentId) -> Option<Arc<SegmentEntry>> {
        self.write().remove(&id)
    }

    pub(crate) fn len(&self) -> usize {
        self.read().len()
    }

    /// Checks that `desc` is a live grant of this node: registered segment, valid token, range
    /// inside the segment.
    pub(crate) fn check_descriptor(
        &self,
        desc: &SegmentDescriptor,
    ) -> Result<Arc<SegmentEntry>, Refusal> {
        if desc.node != self.node {
            return Err(Refusal::WrongNode);
        }
        let entry = self
            .read()
            .get(&desc.segment)
            .cloned()
            .ok_or(Refusal::UnknownSegment)?;
        if !entry.key.verify(desc) {
            return Err(Refusal::BadToken);
        }
        if desc.end().is_none_or(|end| end > entry.region.len() as u64) {
            return Err(Refusal::OutOfBounds);
        }
        if let Some(guard) = &entry.guard {
            if !guard.allows(desc.offset, desc.len) {
                return Err(Refusal::Expired);
            }
        }
        Ok(entry)
    }

    /// Checks a request for `len` bytes at `offset` within `desc`'s range and returns the bytes.
    pub(crate) fn check(
        &self,
        desc: &SegmentDescriptor,
        offset: u64,
        len: u64,
    ) -> Result<Grant, Refusal> {
        let entry = self.check_descriptor(desc)?;
        if offset.checked_add(len).is_none_or(|end| end > desc.len) {
            return Err(Refusal::OutOfBounds);
        }
        let start = desc.offset + offset; // cannot overflow: <= desc.end() <= region len
        let ptr = entry
            .region
            .range_ptr(start, len)
            .map_err(|_| Refusal::OutOfBounds)?;
        let len = usize::try_from(len).map_err(|_| Refusal::TooLarge)?;
        Ok(Grant {
            _entry: entry,
            ptr,
            len,
        })
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<SegmentId, Arc<SegmentEntry>>> {
        // A panic while holding the lock leaves the map itself consistent (inserts and removes
        // are single calls), so a poisoned lock is still safe to use.
        self.map.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<SegmentId, Arc<SegmentEntry>>> {
        self.map.write().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::region::HugePages;

    #[test]
    fn a_guard_refuses_ranges_it_no_longer_allows() {
        struct Only(std::sync::atomic::AtomicBool);
        impl RangeGuard for Only {
            fn allows(&self, offset: u64, len: u64) -> bool {
                (offset, len) == (0, 64) && self.0.load(Ordering::Relaxed)
            }
        }
        let guard = Arc::new(Only(std::sync::atomic::AtomicBool::new(true)));
        let table = SegmentTable::new(NodeId(5), 1);
        let region = MemoryRegion::allocate("g", 4096, HugePages::Never).unwrap();
        let seg = table.insert(region, true, Some(guard.clone())).unwrap();
        let granted = seg.descriptor(0, 64).unwrap();
        let other = seg.descriptor(64, 64).unwrap();
        assert!(table.check(&granted, 0, 64).is_ok());
        assert_eq!(table.check(&other, 0, 1).err(), Some(Refusal::Expired));
        guard.0.store(false, Ordering::Relaxed);
        assert_eq!(table.check(&granted, 0, 64).err(), Some(Refusal::Expired));
        assert_eq!(
            Refusal::from_code(Refusal::Expired.code()),
            Some(Refusal::Expired)
        );
    }

    #[test]
    fn check_refuses_each_violation_with_its_reason() {
        let table = SegmentTable::new(NodeId(5), 1);
        let region = MemoryRegion::allocate("t", 4096, HugePages::Never).unwrap();
        let seg = table.insert(region, true, None).unwrap();
        assert!(seg.shm_shareable());
        let d = seg.descriptor(1000, 100).unwrap();
        assert!(table.check(&d, 0, 100).is_ok());
        assert!(table.check(&d, 99, 1).is_ok());
        assert_eq!(table.check(&d, 99, 2).err(), Some(Refusal::OutOfBounds));
        assert_eq!(
            table.check(&d, u64::MAX, 2).err(),
            Some(Refusal::OutOfBounds)
        );
        let wider = SegmentDescriptor { len: 200, ..d };
        assert_eq!(table.check(&wider, 0, 1).err(), Some(Refusal::BadToken));
        let elsewhere = SegmentDescriptor {
            node: NodeId(6),
            ..d
        };
        assert_eq!(
            table.check(&elsewhere, 0, 1).err(),
            Some(Refusal::WrongNode)
        );
        let missing = SegmentDescriptor {
            segment: SegmentId(99),
            ..d
        };
        assert_eq!(
            table.check(&missing, 0, 1).err(),
            Some(Refusal::UnknownSegment)
        );
        assert!(seg.descriptor(4000, 97).is_err());
        let whole = seg.descriptor(0, 4096).unwrap();
        assert!(table.check(&whole, 0, 4096).is_ok());
        table.remove(seg.id());
        assert_eq!(table.check(&d, 0, 1).err(), Some(Refusal::UnknownSegment));
    }
}
