//! One worker's RDMA connections: a queue pair per peer (with its own completion queue) and
//! the TCP handshake connection that checks descriptors and returns memory keys.
//!
//! A list of ops costs one check round trip, then its READs and WRITEs are posted in windows of
//! [`DEPTH`] work requests and the completion queue is polled until the window is done. A
//! failed completion puts an RC queue pair in the error state (everything after it is
//! flushed), so the connection is dropped and the failed and unfinished ops are reported as
//! retryable: the worker sends them down the next path.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_sys::{ibv_wc, ibv_wc_status};

use super::handshake::{self, Grant};
use super::verbs::{Qp, WorkItem};
use super::RdmaShared;
use crate::address::NodeAddress;
use crate::descriptor::{NodeId, SegmentDescriptor};
use crate::error::{Refusal, TransferError};
use crate::request::TransferOp;
use crate::transport::{Lane, SliceOp, TransportKind};

const KIND: TransportKind = TransportKind::Rdma;
/// Work requests in flight per queue pair.
pub(crate) const DEPTH: u32 = 64;

pub(crate) struct RdmaLane {
    shared: Arc<RdmaShared>,
    io_timeout: Duration,
    conns: HashMap<NodeId, Conn>,
}

struct Conn {
    incarnation: u64,
    control: TcpStream,
    qp: Qp,
}

impl RdmaLane {
    pub(crate) fn new(shared: Arc<RdmaShared>, io_timeout: Duration) -> RdmaLane {
        RdmaLane {
            shared,
            io_timeout,
            conns: HashMap::new(),
        }
    }

    fn connect(&self, peer: &NodeAddress) -> Result<Conn, TransferError> {
        let ep = peer.rdma.as_ref().ok_or_else(|| {
            TransferError::unavailable(KIND, peer.node, "the peer offers no rdma")
        })?;
        let io = |e| TransferError::io(KIND, peer.node, e);
        let mut control = TcpStream::connect_timeout(&ep.handshake, self.io_timeout).map_err(io)?;
        control.set_nodelay(true).map_err(io)?;
        control
            .set_read_timeout(Some(self.io_timeout))
            .map_err(io)?;
        control
            .set_write_timeout(Some(self.io_timeout))
            .map_err(io)?;
        let device = &self.shared.device;
        let cq = Arc::new(device.create_cq(DEPTH * 2)?);
        let qp = Qp::create(device, cq, DEPTH)?;
        control
            .write_all(&handshake::encode_hello(peer.node, &qp.info()))
            .map_err(io)?;
        let mut reply = [0u8; handshake::REPLY_LEN];
        control.read_exact(&mut reply).map_err(io)?;
        let (node, incarnation, remote) = match handshake::decode_reply(&reply) {
            Err(m) => return Err(TransferError::protocol(KIND, peer.node, m)),
            Ok(Err(reason)) => {
                return Err(TransferError::unavailable(
                    KIND,
                    peer.node,
                    format!("handshake refused: {reason}"),
                ))
            }
            Ok(Ok(accepted)) => accepted,
        };
        if node != peer.node || incarnation != peer.incarnation {
            return Err(TransferError::protocol(
                KIND,
                peer.node,
                "the handshake reached another node or incarnation",
            ));
        }
        qp.connect(&remote)?;
        Ok(Conn {
            incarnation,
            control,
            qp,
        })
    }

    /// Checks `descs` with the target and returns their grants.
    fn check(
        conn: &mut Conn,
        node: NodeId,
        descs: &[SegmentDescriptor],
    ) -> Result<Vec<Result<Grant, TransferError>>, TransferError> {
        let io = |e| TransferError::io(KIND, node, e);
        let mut out = Vec::with_capacity(descs.len());
        for chunk in descs.chunks(handshake::MAX_ENTRIES) {
            conn.control
                .write_all(&handshake::encode_check(chunk))
                .map_err(io)?;
            let mut buf = vec![0u8; handshake::HEADER_LEN + chunk.len() * handshake::GRANT_LEN];
            conn.control.read_exact(&mut buf).map_err(io)?;
            let grants = handshake::decode_grants(&buf, chunk.len())
                .map_err(|m| TransferError::protocol(KIND, node, m))?;
            for (desc, grant) in chunk.iter().zip(grants) {
                out.push(match grant.status {
                    Ok(()) if desc.end().is_some_and(|end| end <= grant.segment_len) => Ok(grant),
                    Ok(()) => Err(TransferError::protocol(
                        KIND,
                        node,
                        "descriptor outside its segment",
                    )),
                    // No memory registration for it on the target: another path can still serve it.
                    Err(Refusal::NotShareable) => Err(TransferError::unavailable(
                        KIND,
                        node,
                        format!("segment {} is not registered with the NIC", desc.segment),
                    )),
                    Err(reason) => Err(TransferError::Refused {
                        node,
                        segment: desc.segment,
                        reason,
                    }),
                });
            }
        }
        Ok(out)
    }

    /// Posts `items` in windows and waits for their completions. `Err` means the queue pair
    /// is unusable (the outcomes recorded so far stay).
    fn run(
        &self,
        conn: &Conn,
        node: NodeId,
        items: &[(usize, WorkItem)],
        results: &mut [Option<Result<(), TransferError>>],
    ) -> Result<(), TransferError> {
        // SAFETY: plain old data, overwritten by ibv_poll_cq before being read.
        let mut wcs: Vec<ibv_wc> = (0..16).map(|_| unsafe { std::mem::zeroed() }).collect();
        for window in items.chunks(DEPTH as usize) {
            let posted: Vec<WorkItem> = window.iter().map(|(_, it)| *it).collect();
            conn.qp.post(&posted)?;
            let mut left = window.len();
            let deadline = Instant::now() + self.io_timeout;
            let mut broken = false;
            while left > 0 {
                let n = conn.qp.cq.poll(&mut wcs)?;
                if n == 0 {
                    if Instant::now() > deadline {
                        return Err(TransferError::io(
                            KIND,
                            node,
                            std::io::ErrorKind::TimedOut.into(),
                        ));
                    }
                    std::thread::yield_now();
                    continue;
                }
                for wc in &wcs[..n] {
                    left = left.saturating_sub(1);
                    let Some(i) = usize::try_from(wc.wr_id)
                        .ok()
                        .filter(|i| *i < results.len())
                    else {
                        continue;
                    };
                    results[i] = Some(if wc.status == ibv_wc_status::IBV_WC_SUCCESS {
                        Ok(())
                    } else {
                        broken = true;
                        Err(TransferError::Rdma(super::RdmaError::Completion {
                            status: wc.status,
                        }))
                    });
                }
            }
            if broken {
                return Err(TransferError::protocol(
                    KIND,
                    node,
                    "queue pair in error state",
                ));
            }
        }
        Ok(())
    }
}

impl Lane for RdmaLane {
    fn execute(&mut self, peer: &NodeAddress, ops: &[SliceOp]) -> Vec<Result<(), TransferError>> {
        if self
            .conns
            .get(&peer.node)
            .is_some_and(|c| c.incarnation != peer.incarnation)
        {
            self.conns.remove(&peer.node);
        }
        let mut conn = match self.conns.remove(&peer.node) {
            Some(conn) => conn,
            None => match self.connect(peer) {
                Ok(conn) => conn,
                Err(err) => return vec![Err(err); ops.len()],
            },
        };
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
        let grants = match RdmaLane::check(&mut conn, peer.node, &descs) {
            Ok(grants) => grants,
            Err(err) => return vec![Err(err); ops.len()],
        };
        let mut results: Vec<Option<Result<(), TransferError>>> = vec![None; ops.len()];
        // Local registrations stay alive until every work request that names them completed.
        let mut keep = Vec::new();
        let mut items = Vec::new();
        for (i, (op, slot)) in ops.iter().zip(slots).enumerate() {
            let grant = match &grants[slot] {
                Ok(g) => *g,
                Err(err) => {
                    results[i] = Some(Err(err.clone()));
                    continue;
                }
            };
            let Some(mr) = self.shared.mr(op.local.id()) else {
                results[i] = Some(Err(TransferError::unavailable(
                    KIND,
                    peer.node,
                    "the local segment is not registered with the NIC",
                )));
                continue;
            };
            let (Ok(local), Ok(len)) = (op.local_addr(), u32::try_from(op.len)) else {
                results[i] = Some(Err(TransferError::unavailable(
                    KIND,
                    peer.node,
                    "slice too large for one work request",
                )));
                continue;
            };
            items.push((
                i,
                WorkItem {
                    id: i as u64,
                    read: op.op == TransferOp::Read,
                    local_addr: local as u64,
                    len,
                    lkey: mr.lkey(),
                    remote_addr: grant.addr + op.remote.offset + op.remote_offset,
                    rkey: grant.rkey,
                },
            ));
            keep.push(mr);
        }
        match self.run(&conn, peer.node, &items, &mut results) {
            Ok(()) => {
                self.conns.insert(peer.node, conn);
            }
            Err(err) => {
                // Dropping the queue pair stops the NIC before the buffers are given back.
                drop(conn);
                for r in results.iter_mut().filter(|r| r.is_none()) {
                    *r = Some(Err(err.clone()));
                }
            }
        }
        drop(keep);
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| Err(TransferError::protocol(KIND, peer.node, "no completion")))
            })
            .collect()
    }

    fn forget(&mut self, node: NodeId) {
        self.conns.remove(&node);
    }
}
