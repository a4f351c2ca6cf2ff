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

use crate::descriptor::{Access, GrantId, NodeId, SegmentDescriptor, SegmentId};
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

/// Decides on every request whether a descriptor's grant is still live. A storage node
/// answers from its leases and pending puts: the descriptor's grant id must name a lease or
/// put that has not ended, for exactly that range and access, so that a descriptor used after
/// its lease expired, was released or its block deleted is refused ([`Refusal::Expired`])
/// instead of reaching memory that may now hold another object. The token has already been
/// verified when it is asked, so the fields are the ones the owner minted. Called on transfer
/// threads: it must be quick (O(1)) and must not block for long.
///
/// A guarded segment is never handed out whole (no shm memfd, no region-wide RDMA key): a
/// peer that maps or registers the whole region could reach every range, live or not.
pub trait RangeGuard: Send + Sync {
    fn allows(&self, desc: &SegmentDescriptor) -> bool;
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
    /// Same-host peers may reach the whole segment: its memfd (sealed against shrinking), or
    /// for process memory the owner's memory file.
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

    /// A read-write descriptor of `[offset, offset + len)` of this segment, valid for as long
    /// as it is registered: for memory the holder may use freely (a client's own buffers).
    /// A guarded segment refuses it on use; mint [`LocalSegment::grant`]s there.
    pub fn descriptor(&self, offset: u64, len: u64) -> Result<SegmentDescriptor, TransferError> {
        self.grant(offset, len, Access::ReadWrite, GrantId::NONE)
    }

    /// A descriptor of `[offset, offset + len)` for `access`, belonging to `grant`: it works
    /// while the segment's [`RangeGuard`] says the grant is live.
    pub fn grant(
        &self,
        offset: u64,
        len: u64,
        access: Access,
        grant: GrantId,
    ) -> Result<SegmentDescriptor, TransferError> {
        let size = self.len();
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(RegionError::OutOfBounds { offset, len, size }.into());
        }
        Ok(self.entry.mint(offset, len, access, grant))
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
    fn mint(&self, offset: u64, len: u64, access: Access, grant: GrantId) -> SegmentDescriptor {
        SegmentDescriptor {
            node: self.node,
            segment: self.id,
            offset,
            len,
            access,
            grant,
            token: self
                .key
                .mint(self.node, self.id, (offset, len), access, grant),
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
        // A guarded segment's ranges are granted one by one; its memfd would give them all.
        // Process memory is shared through the owner's memory file, never a memfd.
        let shareable = allow_shm && (region.sealed() || region.process()) && guard.is_none();
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

    /// Checks that `desc` is a live grant of this node for `op` (`Read`: the peer reads from
    /// the range; `Write`: it writes into it; `ReadWrite`: it maps the range): registered
    /// segment, valid token, access that permits `op`, range inside the segment, grant live.
    pub(crate) fn check_descriptor(
        &self,
        desc: &SegmentDescriptor,
        op: Access,
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
        if !desc.access.permits(op) {
            return Err(Refusal::WrongAccess);
        }
        if desc.end().is_none_or(|end| end > entry.region.len() as u64) {
            return Err(Refusal::OutOfBounds);
        }
        if let Some(guard) = &entry.guard {
            if !guard.allows(desc) {
                return Err(Refusal::Expired);
            }
        }
        Ok(entry)
    }

    /// Checks a request for `len` bytes at `offset` within `desc`'s range and returns the bytes.
    pub(crate) fn check(
        &self,
        desc: &SegmentDescriptor,
        op: Access,
        offset: u64,
        len: u64,
    ) -> Result<Grant, Refusal> {
        let entry = self.check_descriptor(desc, op)?;
        if offset.checked_add(len).is_none_or(|end| end > desc.len) {
            return Err(Refusal::OutOfBounds);
        }
        if entry.region.device().is_some() {
            // The listener would copy with the CPU, which cannot touch GPU memory.
            return Err(Refusal::DeviceMemory);
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
    fn a_guard_refuses_grants_it_no_longer_allows() {
        struct Only(std::sync::atomic::AtomicBool);
        impl RangeGuard for Only {
            fn allows(&self, d: &SegmentDescriptor) -> bool {
                d.grant == GrantId(7) && self.0.load(Ordering::Relaxed)
            }
        }
        let guard = Arc::new(Only(std::sync::atomic::AtomicBool::new(true)));
        let table = SegmentTable::new(NodeId(5), 1);
        let region = MemoryRegion::allocate("g", 4096, HugePages::Never).unwrap();
        let seg = table.insert(region, true, Some(guard.clone())).unwrap();
        assert!(
            !seg.shm_shareable(),
            "a guarded segment is never mapped whole"
        );
        let granted = seg.grant(0, 64, Access::Read, GrantId(7)).unwrap();
        let other = seg.grant(0, 64, Access::Read, GrantId(8)).unwrap();
        let ungranted = seg.descriptor(0, 64).unwrap();
        assert!(table.check(&granted, Access::Read, 0, 64).is_ok());
        assert_eq!(
            table.check(&granted, Access::Write, 0, 64).err(),
            Some(Refusal::WrongAccess)
        );
        assert_eq!(
            table.check(&other, Access::Read, 0, 1).err(),
            Some(Refusal::Expired)
        );
        assert_eq!(
            table.check(&ungranted, Access::Read, 0, 1).err(),
            Some(Refusal::Expired)
        );
        let forged = SegmentDescriptor {
            access: Access::ReadWrite,
            ..granted
        };
        assert_eq!(
            table.check(&forged, Access::Write, 0, 1).err(),
            Some(Refusal::BadToken)
        );
        guard.0.store(false, Ordering::Relaxed);
        assert_eq!(
            table.check(&granted, Access::Read, 0, 64).err(),
            Some(Refusal::Expired)
        );
        for r in [Refusal::Expired, Refusal::WrongAccess] {
            assert_eq!(Refusal::from_code(r.code()), Some(r));
        }
    }

    #[test]
    fn check_refuses_each_violation_with_its_reason() {
        let table = SegmentTable::new(NodeId(5), 1);
        let region = MemoryRegion::allocate("t", 4096, HugePages::Never).unwrap();
        let seg = table.insert(region, true, None).unwrap();
        assert!(seg.shm_shareable());
        let d = seg.descriptor(1000, 100).unwrap();
        assert!(table.check(&d, Access::ReadWrite, 0, 100).is_ok());
        assert!(table.check(&d, Access::ReadWrite, 99, 1).is_ok());
        assert_eq!(
            table.check(&d, Access::ReadWrite, 99, 2).err(),
            Some(Refusal::OutOfBounds)
        );
        assert_eq!(
            table.check(&d, Access::ReadWrite, u64::MAX, 2).err(),
            Some(Refusal::OutOfBounds)
        );
        let wider = SegmentDescriptor { len: 200, ..d };
        assert_eq!(
            table.check(&wider, Access::ReadWrite, 0, 1).err(),
            Some(Refusal::BadToken)
        );
        let elsewhere = SegmentDescriptor {
            node: NodeId(6),
            ..d
        };
        assert_eq!(
            table.check(&elsewhere, Access::ReadWrite, 0, 1).err(),
            Some(Refusal::WrongNode)
        );
        let missing = SegmentDescriptor {
            segment: SegmentId(99),
            ..d
        };
        assert_eq!(
            table.check(&missing, Access::ReadWrite, 0, 1).err(),
            Some(Refusal::UnknownSegment)
        );
        assert!(seg.descriptor(4000, 97).is_err());
        let whole = seg.descriptor(0, 4096).unwrap();
        assert!(table.check(&whole, Access::ReadWrite, 0, 4096).is_ok());
        table.remove(seg.id());
        assert_eq!(
            table.check(&d, Access::ReadWrite, 0, 1).err(),
            Some(Refusal::UnknownSegment)
        );
    }
}
