//! Direct access: a same-host peer's registered range, mapped into this process and copied
//! into or out of by the caller's own thread.
//!
//! A batch through the workers costs two thread hand-offs and a check round trip before the
//! first byte moves, which is most of the time of a batch of small blocks. A storage node that
//! serves a client on the same host can do better: the client names its buffer by a
//! descriptor, the node has the client check it once (the usual shm check, attaching the memfd
//! if needed), and from then on each block is one `memcpy` done by the shard that owns it,
//! with no other thread involved.
//!
//! The owner's answer is remembered per descriptor when it is *stable* (the segment has no
//! range guard, so only unregistering could revoke it, and unregistering never revoked an
//! existing mapping anyway, see the crate docs). Guarded ranges (a node's arena under
//! leases) are checked on every call. The cache is keyed by the whole descriptor, token
//! included, so a forged token can never hit an entry that a genuine one created.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::lane::{check_on, connect, Checked, Conn};
use super::mapping::{MappingCache, PeerMapping};
use crate::address::NodeAddress;
use crate::descriptor::{NodeId, SegmentDescriptor, SegmentId};
use crate::error::{Refusal, Side, TransferError};
use crate::transport::TransportKind;

/// Stable verdicts kept at most; the cache is emptied when it would grow past this (a client
/// that keeps minting new descriptors costs round trips, not memory).
const MAX_VERIFIED: usize = 65_536;

/// A range of a peer's segment mapped into this process, vouched for by the peer.
///
/// Copies go straight between this process's memory and the peer's pages. The peer may
/// change the bytes at any moment (that is what sharing means), so a reader that races a
/// writer on the peer side gets unspecified bytes, never a fault: the mapping stays valid for
/// as long as this value (or a clone) lives, whatever the peer does.
#[derive(Clone)]
pub struct DirectRange {
    mapping: Arc<PeerMapping>,
    /// Where the range starts in the mapping, and its length.
    offset: u64,
    len: u64,
    node: NodeId,
    segment: SegmentId,
}

impl DirectRange {
    /// Bytes in the range.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The peer whose memory this is.
    pub fn node(&self) -> NodeId {
        self.node
    }

    /// The part `[at, at + len)` of this range.
    pub fn sub(&self, at: u64, len: u64) -> Result<DirectRange, TransferError> {
        self.bounds(at, len)?;
        Ok(DirectRange {
            offset: self.offset + at,
            len,
            ..self.clone()
        })
    }

    /// Copies `src` into the range, starting `at` bytes in.
    pub fn write_at(&self, at: u64, src: &[u8]) -> Result<(), TransferError> {
        let offset = self.bounds(at, src.len() as u64)?;
        // SAFETY: `src` is a Rust slice of this process, valid for the call and never part
        // of a peer mapping we hand out as a slice.
        let done = unsafe { self.mapping.write_from(offset, src.as_ptr(), src.len()) };
        self.finish(done, at, src.len())
    }

    /// Scatters `src` over `parts`, in order: each part filled from its start, the last one
    /// possibly in part (`src` must fit their total, else nothing moves). Runs of parts in one peer process's
    /// memory go in one cross-memory call each, so a block split into one span per layer
    /// costs one system call, not one per span.
    pub fn scatter(parts: &[DirectRange], src: &[u8]) -> Result<(), TransferError> {
        // Checked first, so that a block too large moves nothing.
        let total: u64 = parts.iter().map(|p| p.len).sum();
        if src.len() as u64 > total {
            return Err(not_their_size(src.len(), total));
        }
        let mut rest = src;
        Self::runs(parts, src.len(), |run, ranges, len| {
            let (now, later) = rest.split_at(len);
            rest = later;
            // SAFETY: `now` is a Rust slice of this process, valid for the call; the mapping
            // only reads it.
            let done = unsafe {
                run.mapping
                    .copy_vectored(ranges, now.as_ptr().cast_mut(), true)
            };
            run.finish(done, 0, len)
        })
    }

    /// Scatters each `(parts, src)` item as [`DirectRange::scatter`] does, one result per
    /// item. When every part of every item lies in one peer mapping, all the copies go
    /// together: for a peer reached by cross-memory attach, one system call for the whole
    /// batch instead of one per block (plus two liveness checks each). If that fails, each
    /// item is copied again alone, so that the failure is its item's only.
    pub fn scatter_each(items: &[(&[DirectRange], &[u8])]) -> Vec<Result<(), TransferError>> {
        // `src` is only read: the pointer is cast for the shared piece type.
        let local: Vec<(&[DirectRange], *mut u8, usize)> = items
            .iter()
            .map(|(parts, src)| (*parts, src.as_ptr().cast_mut(), src.len()))
            .collect();
        // SAFETY: every local range is an item's `src`, a Rust slice of this process valid
        // for the call; a write only reads it.
        if unsafe { Self::copy_together(&local, true) } {
            return items.iter().map(|_| Ok(())).collect();
        }
        items
            .iter()
            .map(|(parts, src)| Self::scatter(parts, src))
            .collect()
    }

    /// Gathers each `(parts, dst)` item as [`DirectRange::gather`] does, one result per item,
    /// batched as [`DirectRange::scatter_each`] is: a put of many small blocks reads them all
    /// out of the client's memory in one system call.
    pub fn gather_each(
        items: &mut [(&[DirectRange], &mut [u8])],
    ) -> Vec<Result<(), TransferError>> {
        let sized = items
            .iter()
            .all(|(parts, dst)| parts.iter().map(|p| p.len).sum::<u64>() == dst.len() as u64);
        if sized {
            let local: Vec<(&[DirectRange], *mut u8, usize)> = items
                .iter_mut()
                .map(|(parts, dst)| (*parts, dst.as_mut_ptr(), dst.len()))
                .collect();
            // SAFETY: every local range is an item's `dst`, a distinct exclusively borrowed
            // slice of this process (so the ranges do not overlap), valid for the call.
            if unsafe { Self::copy_together(&local, false) } {
                return items.iter().map(|_| Ok(())).collect();
            }
        }
        items
            .iter_mut()
            .map(|(parts, dst)| Self::gather(parts, dst))
            .collect()
    }

    /// Copies every item `(parts, local address, length)` in one call of their common peer
    /// mapping (into the parts when `write`, out of them otherwise); `false` when the items
    /// do not share one mapping, are fewer than two, one is larger than its parts, or the
    /// copy failed (the caller then copies each alone, which names the failing one).
    ///
    /// # Safety
    ///
    /// As [`PeerMapping::copy_pieces`]: each local range valid for its length (reads when
    /// `write`, writes otherwise), not aliased when not `write`, and the local ranges not
    /// overlapping when not `write`.
    unsafe fn copy_together(items: &[(&[DirectRange], *mut u8, usize)], write: bool) -> bool {
        let Some(first) = items.iter().find_map(|(parts, _, _)| parts.first()) else {
            return false;
        };
        let one_mapping = items.iter().all(|(parts, _, _)| {
            parts
                .iter()
                .all(|p| Arc::ptr_eq(&p.mapping, &first.mapping))
        });
        if items.len() < 2 || !one_mapping {
            return false;
        }
        let mut pieces = Vec::new();
        for &(parts, local, len) in items {
            let mut at = 0usize;
            let planned = Self::runs(parts, len, |_, ranges, _| {
                for &(offset, len) in ranges {
                    pieces.push((offset, local.wrapping_add(at), len));
                    at += len;
                }
                Ok(())
            });
            if planned.is_err() {
                return false;
            }
        }
        // SAFETY: every piece lies inside its item's local range (the runs cover at most
        // `len` bytes of it), so the caller's contract covers it.
        matches!(
            unsafe { first.mapping.copy_pieces(&pieces, write) },
            Some(Ok(()))
        )
    }

    /// Gathers `parts`, in order, into `dst` (exactly their total length).
    pub fn gather(parts: &[DirectRange], dst: &mut [u8]) -> Result<(), TransferError> {
        let total: u64 = parts.iter().map(|p| p.len).sum();
        if total != dst.len() as u64 {
            return Err(not_their_size(dst.len(), total));
        }
        let mut rest = dst;
        Self::runs(parts, rest.len(), |run, ranges, len| {
            let (now, later) = std::mem::take(&mut rest).split_at_mut(len);
            rest = later;
            // SAFETY: `now` is exclusively borrowed memory of this process.
            let done = unsafe { run.mapping.copy_vectored(ranges, now.as_mut_ptr(), false) };
            run.finish(done, 0, len)
        })
    }

    /// Calls `each(first part, ranges of its mapping, bytes)` for the runs of consecutive
    /// parts that share a mapping, covering `len` bytes from the first part on (the last part
    /// possibly in part); an error when `len` is more than the parts hold.
    fn runs(
        parts: &[DirectRange],
        len: usize,
        mut each: impl FnMut(&DirectRange, &[(u64, usize)], usize) -> Result<(), TransferError>,
    ) -> Result<(), TransferError> {
        let mut left = len;
        let mut i = 0;
        while left > 0 {
            let Some(first) = parts.get(i) else {
                return Err(TransferError::OutOfBounds {
                    index: 0,
                    side: Side::Remote,
                    offset: 0,
                    len: len as u64,
                    limit: (len - left) as u64,
                });
            };
            let mut ranges = Vec::new();
            let mut bytes = 0usize;
            while let Some(p) = parts.get(i) {
                if left == 0 || !Arc::ptr_eq(&p.mapping, &first.mapping) {
                    break;
                }
                let take = left.min(p.len as usize);
                ranges.push((p.offset, take));
                bytes += take;
                left -= take;
                i += 1;
            }
            each(first, &ranges, bytes)?;
        }
        Ok(())
    }

    /// Copies `dst.len()` bytes of the range, starting `at` bytes in, into `dst`.
    pub fn read_at(&self, at: u64, dst: &mut [u8]) -> Result<(), TransferError> {
        let offset = self.bounds(at, dst.len() as u64)?;
        // SAFETY: `dst` is exclusively borrowed memory of this process.
        let done = unsafe { self.mapping.read_into(offset, dst.as_mut_ptr(), dst.len()) };
        self.finish(done, at, dst.len())
    }

    /// True when the range is a peer process's own memory (reached through its memory file)
    /// rather than a shared mapping.
    pub fn is_process_memory(&self) -> bool {
        self.mapping.is_process()
    }

    /// True when the peer's process memory is reached by cross-memory attach
    /// (`process_vm_writev`) rather than through its memory file.
    pub fn is_cross_memory(&self) -> bool {
        self.mapping.is_cross_memory()
    }

    /// The mapping's offset of `at` when `[at, at + len)` lies inside the range.
    fn bounds(&self, at: u64, len: u64) -> Result<u64, TransferError> {
        if at.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(self.out_of_bounds(at, len as usize));
        }
        Ok(self.offset + at)
    }

    fn out_of_bounds(&self, at: u64, len: usize) -> TransferError {
        TransferError::OutOfBounds {
            index: 0,
            side: Side::Remote,
            offset: at,
            len: len as u64,
            limit: self.len,
        }
    }

    fn finish(
        &self,
        done: Option<std::io::Result<()>>,
        at: u64,
        len: usize,
    ) -> Result<(), TransferError> {
        match done {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => Err(TransferError::io(KIND, self.node, e)),
            None => Err(self.out_of_bounds(at, len)),
        }
    }
}

/// The error of a block of `len` bytes that does not match parts of `total` bytes.
fn not_their_size(len: usize, total: u64) -> TransferError {
    TransferError::OutOfBounds {
        index: 0,
        side: Side::Local,
        offset: 0,
        len: len as u64,
        limit: total,
    }
}

impl std::fmt::Debug for DirectRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectRange")
            .field("node", &self.node)
            .field("segment", &self.segment)
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

/// Stable verdicts: `(incarnation, descriptor)` → the mapping it lies in.
type Verified = HashMap<(u64, SegmentDescriptor), Arc<PeerMapping>>;

/// The engine's direct-access state: a pool of control connections and the stable verdicts.
pub(crate) struct Direct {
    mappings: Arc<MappingCache>,
    io_timeout: Duration,
    idle: Mutex<HashMap<NodeId, Vec<Conn>>>,
    verified: Mutex<Verified>,
}

impl Direct {
    pub(crate) fn new(mappings: Arc<MappingCache>, io_timeout: Duration) -> Direct {
        Direct {
            mappings,
            io_timeout,
            idle: Mutex::new(HashMap::new()),
            verified: Mutex::new(HashMap::new()),
        }
    }

    /// The range `desc` grants, from stable verdicts only: no I/O. `None` means ask
    /// [`Direct::map`].
    pub(crate) fn cached(
        &self,
        peer: &NodeAddress,
        desc: &SegmentDescriptor,
    ) -> Option<DirectRange> {
        let mapping = lock(&self.verified)
            .get(&(peer.incarnation, *desc))
            .cloned()?;
        Some(range(mapping, desc))
    }

    /// The ranges `descs` (all of `peer`) grant, checked by `peer` where no stable verdict is
    /// known. One round trip at most per call; the outer error means the connection broke.
    pub(crate) fn map(
        &self,
        peer: &NodeAddress,
        descs: &[SegmentDescriptor],
    ) -> Result<Vec<Result<DirectRange, TransferError>>, TransferError> {
        let mut out: Vec<Option<Result<DirectRange, TransferError>>> =
            descs.iter().map(|d| self.cached(peer, d).map(Ok)).collect();
        let ask: Vec<SegmentDescriptor> = descs
            .iter()
            .zip(&out)
            .filter(|(_, o)| o.is_none())
            .map(|(d, _)| *d)
            .collect();
        if !ask.is_empty() {
            let checked = self.check(peer, &ask)?;
            let mut answers = ask.iter().zip(checked);
            for slot in out.iter_mut().filter(|o| o.is_none()) {
                let Some((desc, verdict)) = answers.next() else {
                    break;
                };
                *slot = Some(self.resolve(peer, desc, verdict));
            }
        }
        Ok(out
            .into_iter()
            .map(|o| {
                o.unwrap_or_else(|| Err(TransferError::protocol(KIND, peer.node, "no verdict")))
            })
            .collect())
    }

    /// Drops the connections and verdicts of `node` (removed, or a new incarnation).
    pub(crate) fn forget(&self, node: NodeId) {
        lock(&self.idle).remove(&node);
        lock(&self.verified).retain(|(_, d), _| d.node != node);
    }

    /// Turns an accepting verdict into a range over the (now attached) mapping.
    fn resolve(
        &self,
        peer: &NodeAddress,
        desc: &SegmentDescriptor,
        verdict: Checked,
    ) -> Result<DirectRange, TransferError> {
        let stable = verdict?;
        let mapping = self
            .mappings
            .get(&(peer.node, peer.incarnation, desc.segment))
            .ok_or_else(|| TransferError::unavailable(KIND, peer.node, "segment not mapped"))?;
        if desc.end().is_none_or(|end| end > mapping.len as u64) {
            return Err(TransferError::Refused {
                node: peer.node,
                segment: desc.segment,
                reason: Refusal::OutOfBounds,
            });
        }
        if stable {
            let mut verified = lock(&self.verified);
            if verified.len() >= MAX_VERIFIED {
                verified.clear();
            }
            verified.insert((peer.incarnation, *desc), Arc::clone(&mapping));
        }
        Ok(range(mapping, desc))
    }

    /// One check round trip on a pooled connection (one reconnect if the pooled one broke).
    fn check(
        &self,
        peer: &NodeAddress,
        descs: &[SegmentDescriptor],
    ) -> Result<Vec<Checked>, TransferError> {
        for attempt in 0..2 {
            let pooled = lock(&self.idle)
                .get_mut(&peer.node)
                .and_then(Vec::pop)
                .filter(|c| c.incarnation == peer.incarnation);
            let reused = pooled.is_some();
            let conn = match pooled {
                Some(c) => c,
                None => connect(peer, self.io_timeout)?,
            };
            match check_on(&conn, &self.mappings, peer, descs) {
                Ok(checked) => {
                    lock(&self.idle).entry(peer.node).or_default().push(conn);
                    return Ok(checked);
                }
                Err(err) if attempt == 0 && reused && err.is_retryable() => continue,
                Err(err) => return Err(err),
            }
        }
        Err(TransferError::protocol(KIND, peer.node, "unreachable"))
    }
}

const KIND: TransportKind = TransportKind::Shm;

fn range(mapping: Arc<PeerMapping>, desc: &SegmentDescriptor) -> DirectRange {
    DirectRange {
        mapping,
        offset: desc.offset,
        len: desc.len,
        node: desc.node,
        segment: desc.segment,
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every critical section is a single map operation; the maps are valid after a panic.
    m.lock().unwrap_or_else(|p| p.into_inner())
}
