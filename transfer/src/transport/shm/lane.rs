//! One worker's shm control connections, and the copies themselves.
//!
//! Executing a list of ops costs one round trip on the peer's control socket, whatever the
//! number of ops: every distinct descriptor is checked by the target (token, bounds, still
//! registered) and the memfds of segments not mapped yet come back in the same answer. Then
//! each op is a `memcpy` between the local region and the peer's mapping.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use super::cross_memory::peer_cred;
use super::fdpass::recv_with_fds;
use super::mapping::{MappingCache, PeerMapping};
use super::wire::{self, CheckEntry, Verdict, HEADER_LEN, MAX_ENTRIES, VERDICT_ENTRY_LEN};
use crate::address::NodeAddress;
use crate::descriptor::{NodeId, SegmentDescriptor};
use crate::error::{Refusal, TransferError};
use crate::request::TransferOp;
use crate::transport::{Lane, SliceOp, TransportKind};

const KIND: TransportKind = TransportKind::Shm;

pub(crate) struct ShmLane {
    mappings: Arc<MappingCache>,
    io_timeout: Duration,
    conns: HashMap<NodeId, Conn>,
}

pub(crate) struct Conn {
    pub(crate) incarnation: u64,
    stream: UnixStream,
}

/// What the target said about one distinct descriptor: accepted (and whether the verdict is
/// stable, see `wire.rs`) or why not.
pub(crate) type Checked = Result<bool, TransferError>;

impl ShmLane {
    pub(crate) fn new(mappings: Arc<MappingCache>, io_timeout: Duration) -> ShmLane {
        ShmLane {
            mappings,
            io_timeout,
            conns: HashMap::new(),
        }
    }

    /// Checks `descs` with the target, mapping the segments not mapped yet. One outcome per
    /// descriptor; `Err` of the whole call means the connection broke.
    fn check(
        &mut self,
        peer: &NodeAddress,
        descs: &[SegmentDescriptor],
    ) -> Result<Vec<Checked>, TransferError> {
        if self
            .conns
            .get(&peer.node)
            .is_some_and(|c| c.incarnation != peer.incarnation)
        {
            self.conns.remove(&peer.node);
        }
        // As for tcp: a pooled connection the peer closed costs a reconnect, not a failure.
        for attempt in 0..2 {
            let reused = self.conns.contains_key(&peer.node);
            let conn = match self.conns.remove(&peer.node) {
                Some(conn) => conn,
                None => connect(peer, self.io_timeout)?,
            };
            match check_on(&conn, &self.mappings, peer, descs) {
                Ok(outcome) => {
                    self.conns.insert(peer.node, conn);
                    return Ok(outcome);
                }
                Err(err) if attempt == 0 && reused && err.is_retryable() => continue,
                Err(err) => return Err(err),
            }
        }
        Err(TransferError::protocol(KIND, peer.node, "unreachable"))
    }
}

impl Lane for ShmLane {
    fn execute(&mut self, peer: &NodeAddress, ops: &[SliceOp]) -> Vec<Result<(), TransferError>> {
        // Distinct descriptors, in first-seen order.
        let mut index: HashMap<SegmentDescriptor, usize> = HashMap::new();
        let mut descs = Vec::new();
        let slots: Vec<usize> = ops
            .iter()
            .map(|op| {
                *index.entry(op.remote).or_insert_with(|| {
                    descs.push(op.remote);
                    descs.len() - 1
                })
            })
            .collect();
        let checked = match self.check(peer, &descs) {
            Ok(checked) => checked,
            Err(err) => {
                self.conns.remove(&peer.node);
                return vec![Err(err); ops.len()];
            }
        };
        ops.iter()
            .zip(slots)
            .map(|(op, slot)| {
                checked[slot].clone()?;
                copy(&self.mappings, peer, op)
            })
            .collect()
    }

    fn forget(&mut self, node: NodeId) {
        self.conns.remove(&node);
    }
}

/// Opens a control connection to `peer`'s shm socket and checks that it is that peer.
pub(crate) fn connect(peer: &NodeAddress, io_timeout: Duration) -> Result<Conn, TransferError> {
    let path = peer.shm.as_ref().ok_or_else(|| {
        TransferError::unavailable(KIND, peer.node, "the peer offers no shm socket")
    })?;
    let io = |e| TransferError::io(KIND, peer.node, e);
    let mut stream = UnixStream::connect(path).map_err(io)?;
    stream.set_read_timeout(Some(io_timeout)).map_err(io)?;
    stream.set_write_timeout(Some(io_timeout)).map_err(io)?;
    let mut hello = [0u8; wire::HELLO_LEN];
    stream.read_exact(&mut hello).map_err(io)?;
    let (node, incarnation) =
        wire::decode_hello(&hello).map_err(|m| TransferError::protocol(KIND, peer.node, m))?;
    if node != peer.node || incarnation != peer.incarnation {
        return Err(TransferError::protocol(
            KIND,
            peer.node,
            format!(
                "the socket belongs to node {node} incarnation {incarnation:016x}, not {} {:016x}",
                peer.node, peer.incarnation
            ),
        ));
    }
    Ok(Conn {
        incarnation,
        stream,
    })
}

/// The check round trip(s) on one connection.
pub(crate) fn check_on(
    conn: &Conn,
    mappings: &MappingCache,
    peer: &NodeAddress,
    descs: &[SegmentDescriptor],
) -> Result<Vec<Checked>, TransferError> {
    let io = |e| TransferError::io(KIND, peer.node, e);
    let mut out = Vec::with_capacity(descs.len());
    for chunk in descs.chunks(MAX_ENTRIES) {
        // Every descriptor of a segment not mapped yet asks for its memfd, so that one refused
        // descriptor does not leave the others of its segment unmapped; extra fds are closed.
        let entries: Vec<CheckEntry> = chunk
            .iter()
            .map(|d| CheckEntry {
                desc: *d,
                attach: mappings
                    .get(&(peer.node, peer.incarnation, d.segment))
                    .is_none(),
            })
            .collect();
        (&conn.stream)
            .write_all(&wire::encode_check(&entries))
            .map_err(io)?;
        let mut buf = vec![0u8; HEADER_LEN + entries.len() * VERDICT_ENTRY_LEN];
        let mut fds: Vec<OwnedFd> = Vec::new();
        let mut filled = 0;
        while filled < buf.len() {
            let n = recv_with_fds(conn.stream.as_fd(), &mut buf[filled..], &mut fds).map_err(io)?;
            if n == 0 {
                return Err(io(io::ErrorKind::UnexpectedEof.into()));
            }
            filled += n;
        }
        let (verdicts, nfds) = wire::decode_verdicts(&buf, entries.len())
            .map_err(|m| TransferError::protocol(KIND, peer.node, m))?;
        if nfds != fds.len() {
            return Err(TransferError::protocol(
                KIND,
                peer.node,
                format!("{} descriptors announced, {} received", nfds, fds.len()),
            ));
        }
        let mut fds = fds.into_iter();
        let cred = peer_cred(&conn.stream);
        for (entry, verdict) in entries.iter().zip(verdicts) {
            out.push(apply(mappings, peer, entry, verdict, &mut fds, cred));
        }
    }
    Ok(out)
}

/// Turns one verdict into an outcome, mapping the memfd that came with it.
fn apply(
    mappings: &MappingCache,
    peer: &NodeAddress,
    entry: &CheckEntry,
    verdict: Verdict,
    fds: &mut impl Iterator<Item = OwnedFd>,
    cred: Option<libc::ucred>,
) -> Checked {
    let desc = &entry.desc;
    if let Err(Refusal::NotShareable) = verdict.status {
        // The segment exists and the token is good; only this path cannot reach it.
        return Err(TransferError::unavailable(
            KIND,
            peer.node,
            format!("segment {} is not shared over shm", desc.segment),
        ));
    }
    if let Err(reason) = verdict.status {
        return Err(TransferError::Refused {
            node: peer.node,
            segment: desc.segment,
            reason,
        });
    }
    if entry.attach {
        let fd = fds.next().ok_or_else(|| {
            TransferError::protocol(KIND, peer.node, "accepted attach without a memfd")
        })?;
        let key = (peer.node, peer.incarnation, desc.segment);
        if mappings.get(&key).is_none() {
            let mapping = match verdict.process {
                Some(base) => PeerMapping::process(fd, base, verdict.segment_len, cred),
                None => PeerMapping::map(fd, verdict.segment_len),
            }
            .map_err(|m| TransferError::unavailable(KIND, peer.node, m))?;
            mappings.insert(key, mapping);
        }
    }
    if desc.end().is_none_or(|end| end > verdict.segment_len) {
        // The target vouched for this range; a mismatch means it is not the peer we think.
        return Err(TransferError::protocol(
            KIND,
            peer.node,
            "descriptor outside its segment",
        ));
    }
    Ok(verdict.stable)
}

/// Copies one op between the local region and the peer's mapping.
fn copy(mappings: &MappingCache, peer: &NodeAddress, op: &SliceOp) -> Result<(), TransferError> {
    let mapping = mappings
        .get(&(peer.node, peer.incarnation, op.remote.segment))
        .ok_or_else(|| TransferError::unavailable(KIND, peer.node, "segment not mapped"))?;
    // Submit checked remote_offset + len <= desc.len; the verdict checked desc.end() <= segment.
    let offset = op.remote.offset + op.remote_offset;
    let local = op.local_ptr()?;
    // SAFETY: the local range was bounds-checked against the live region kept by `op.local`;
    // the peer's side is checked by `mapping` itself, and the target verified the token for
    // the remote range in this very batch. They belong to different mappings (or processes),
    // so Rust-level overlap is impossible (two mappings of the same memfd may alias
    // physically; such a transfer copies unspecified bytes, as documented).
    let done = unsafe {
        match op.op {
            TransferOp::Read => mapping.read_into(offset, local, op.len_usize()),
            TransferOp::Write => mapping.write_from(offset, local.cast_const(), op.len_usize()),
        }
    };
    match done {
        Some(Ok(())) => Ok(()),
        Some(Err(e)) => Err(TransferError::io(KIND, peer.node, e)),
        None => Err(TransferError::Refused {
            node: peer.node,
            segment: op.remote.segment,
            reason: Refusal::OutOfBounds,
        }),
    }
}
