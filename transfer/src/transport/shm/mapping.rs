//! Peers' segments mapped into this process, shared by all workers.
//!
//! A segment is mapped once per peer incarnation and kept: mapping is the expensive step (a
//! round trip, an `mmap`, page-table faults on first touch), copying is the cheap one. The
//! cache holds the peer's pages alive, so it is emptied for a node when the node is removed
//! ([`crate::TransferEngine::remove_peer`]) or shows up with a new incarnation.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use crate::descriptor::{NodeId, SegmentId};
use crate::region::{fstat, is_sealed, map_shared};

/// A peer's segment, mapped read-write.
pub(crate) struct PeerMapping {
    ptr: NonNull<u8>,
    pub(crate) len: usize,
}

// SAFETY: a shared mapping with no Rust-owned contents; copies into and out of it are made by
// one worker at a time per range under the crate's contract, from any thread.
unsafe impl Send for PeerMapping {}
// SAFETY: as above.
unsafe impl Sync for PeerMapping {}

impl PeerMapping {
    /// Maps `len` bytes of a memfd received from a peer, after checking that the peer cannot
    /// shrink it under us (which would turn our accesses into `SIGBUS`).
    pub(crate) fn map(fd: OwnedFd, len: u64) -> Result<PeerMapping, String> {
        if !is_sealed(fd.as_fd()) {
            return Err("the peer's memfd is not sealed against shrinking".into());
        }
        let len = usize::try_from(len).map_err(|_| "segment larger than the address space")?;
        if len == 0 {
            return Err("empty segment".into());
        }
        let stat = fstat(&fd).map_err(|e| e.to_string())?;
        if u64::try_from(stat.st_size).unwrap_or(0) < len as u64 {
            return Err("the peer's memfd is shorter than its segment".into());
        }
        let ptr = map_shared(&fd, len).map_err(|e| e.to_string())?;
        // SAFETY: our own fresh mapping; MADV_HUGEPAGE is only a hint, the same one the owner's
        // region got, so that both views use the same page size where the kernel allows it.
        unsafe { libc::madvise(ptr.as_ptr().cast(), len, libc::MADV_HUGEPAGE) };
        // The fd can be closed: the mapping keeps the memfd's pages.
        Ok(PeerMapping { ptr, len })
    }

    /// Pointer to `offset` if `[offset, offset + len)` is inside the mapping.
    pub(crate) fn range(&self, offset: u64, len: u64) -> Option<*mut u8> {
        let end = offset.checked_add(len)?;
        if end > self.len as u64 {
            return None;
        }
        // SAFETY: offset <= self.len, so the pointer stays within (or one past) the mapping.
        Some(unsafe { self.ptr.as_ptr().add(offset as usize) })
    }
}

impl Drop for PeerMapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once; copies hold an `Arc` to it while they run.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Key of a mapping: the node, the incarnation that handed out the memfd, the segment.
pub(crate) type MappingKey = (NodeId, u64, SegmentId);

#[derive(Default)]
pub(crate) struct MappingCache {
    map: Mutex<HashMap<MappingKey, Arc<PeerMapping>>>,
}

impl MappingCache {
    pub(crate) fn get(&self, key: &MappingKey) -> Option<Arc<PeerMapping>> {
        self.lock().get(key).cloned()
    }

    /// Inserts a mapping, dropping any of the same node from another incarnation.
    pub(crate) fn insert(&self, key: MappingKey, mapping: PeerMapping) -> Arc<PeerMapping> {
        let mut map = self.lock();
        map.retain(|k, _| k.0 != key.0 || k.1 == key.1);
        Arc::clone(map.entry(key).or_insert_with(|| Arc::new(mapping)))
    }

    pub(crate) fn forget(&self, node: NodeId) {
        self.lock().retain(|k, _| k.0 != node);
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<MappingKey, Arc<PeerMapping>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}
