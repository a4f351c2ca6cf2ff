//! One worker's tcp connections and the pipelined request loop that runs on them.
//!
//! Each worker keeps one connection per peer, so a transfer sliced over several workers is
//! spread over several connections. On one connection requests are pipelined (up to
//! [`WINDOW`] in flight), which is what makes batches of small blocks cheap. One rule keeps the
//! pipeline deadlock-free: a write's payload is never sent while read responses (which carry
//! payloads towards us) are outstanding, otherwise both ends could block writing to each other
//! with full socket buffers.

use std::collections::{HashMap, VecDeque};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use super::wire::{RequestHeader, ResponseHeader, RESPONSE_LEN};
use crate::address::NodeAddress;
use crate::descriptor::NodeId;
use crate::error::{Refusal, TransferError};
use crate::request::TransferOp;
use crate::transport::{Lane, SliceOp, TransportKind};

/// Requests in flight on one connection.
const WINDOW: usize = 64;
const BUF: usize = 64 << 10;
const KIND: TransportKind = TransportKind::Tcp;

pub(crate) struct TcpLane {
    io_timeout: Duration,
    conns: HashMap<NodeId, Conn>,
}

struct Conn {
    incarnation: u64,
    addr: SocketAddr,
    reader: BufReader<TcpStream>,
    writer: BufWriter<TcpStream>,
    seq: u32,
}

/// Why a connection had to be abandoned.
enum Broken {
    Io(io::Error),
    Protocol(String),
}

impl From<io::Error> for Broken {
    fn from(e: io::Error) -> Self {
        Broken::Io(e)
    }
}

impl TcpLane {
    pub(crate) fn new(io_timeout: Duration) -> TcpLane {
        TcpLane {
            io_timeout,
            conns: HashMap::new(),
        }
    }

    fn connect(&self, peer: &NodeAddress, addr: SocketAddr) -> io::Result<Conn> {
        let stream = TcpStream::connect_timeout(&addr, self.io_timeout)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(self.io_timeout))?;
        stream.set_write_timeout(Some(self.io_timeout))?;
        let _ = socket2::SockRef::from(&stream).set_keepalive(true);
        Ok(Conn {
            incarnation: peer.incarnation,
            addr,
            reader: BufReader::with_capacity(BUF, stream.try_clone()?),
            writer: BufWriter::with_capacity(BUF, stream),
            seq: 0,
        })
    }
}

impl Lane for TcpLane {
    fn execute(&mut self, peer: &NodeAddress, ops: &[SliceOp]) -> Vec<Result<(), TransferError>> {
        let mut results: Vec<Option<Result<(), TransferError>>> = vec![None; ops.len()];
        let Some(addr) = peer.tcp else {
            let err = TransferError::unavailable(KIND, peer.node, "the peer has no tcp listener");
            return vec![Err(err); ops.len()];
        };
        let stale = self
            .conns
            .get(&peer.node)
            .is_some_and(|c| c.incarnation != peer.incarnation || c.addr != addr);
        if stale {
            self.conns.remove(&peer.node);
        }
        // A pooled connection may have been closed by the peer while idle; that costs one
        // reconnect, not a failed transfer. A fresh connection that breaks is a real failure.
        for attempt in 0..2 {
            let reused = self.conns.contains_key(&peer.node);
            let conn = match self.conns.remove(&peer.node) {
                Some(conn) => conn,
                None => match self.connect(peer, addr) {
                    Ok(conn) => conn,
                    Err(e) => {
                        let err = TransferError::io(KIND, peer.node, e);
                        fill(&mut results, &err);
                        break;
                    }
                },
            };
            let mut conn = conn;
            let before = results.iter().filter(|r| r.is_some()).count();
            match run(&mut conn, peer.node, ops, &mut results) {
                Ok(()) => {
                    self.conns.insert(peer.node, conn);
                    break;
                }
                Err(broken) => {
                    let progressed = results.iter().filter(|r| r.is_some()).count() > before;
                    if attempt == 0 && reused && !progressed {
                        continue;
                    }
                    let err = match broken {
                        Broken::Io(e) => TransferError::io(KIND, peer.node, e),
                        Broken::Protocol(m) => TransferError::protocol(KIND, peer.node, m),
                    };
                    fill(&mut results, &err);
                    break;
                }
            }
        }
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| Err(TransferError::protocol(KIND, peer.node, "no outcome")))
            })
            .collect()
    }

    fn forget(&mut self, node: NodeId) {
        self.conns.remove(&node);
    }
}

fn fill(results: &mut [Option<Result<(), TransferError>>], err: &TransferError) {
    for r in results.iter_mut().filter(|r| r.is_none()) {
        *r = Some(Err(err.clone()));
    }
}

/// Sends every op that has no outcome yet and collects the responses, pipelined.
fn run(
    conn: &mut Conn,
    node: NodeId,
    ops: &[SliceOp],
    results: &mut [Option<Result<(), TransferError>>],
) -> Result<(), Broken> {
    let mut inflight: VecDeque<(usize, u32)> = VecDeque::new();
    let mut reads_inflight = 0usize;
    for (i, op) in ops.iter().enumerate() {
        if results[i].is_some() {
            continue;
        }
        while inflight.len() >= WINDOW || (op.op == TransferOp::Write && reads_inflight > 0) {
            receive(conn, node, ops, results, &mut inflight, &mut reads_inflight)?;
        }
        let local = match op.local_ptr() {
            Ok(p) => p,
            Err(e) => {
                results[i] = Some(Err(e));
                continue;
            }
        };
        conn.seq = conn.seq.wrapping_add(1);
        let header = RequestHeader {
            op: op.op,
            seq: conn.seq,
            desc: op.remote,
            offset: op.remote_offset,
            len: op.len,
        };
        conn.writer.write_all(&header.encode())?;
        if op.op == TransferOp::Write {
            // SAFETY: `local_ptr` checked the range against the local region, which `op.local`
            // keeps mapped; the caller does not touch the local range until the batch completes.
            let bytes = unsafe { std::slice::from_raw_parts(local, op.len_usize()) };
            conn.writer.write_all(bytes)?;
        } else {
            reads_inflight += 1;
        }
        inflight.push_back((i, conn.seq));
    }
    while !inflight.is_empty() {
        receive(conn, node, ops, results, &mut inflight, &mut reads_inflight)?;
    }
    conn.writer.flush()?;
    Ok(())
}

/// Reads the response to the oldest request in flight (and its payload, for a read).
fn receive(
    conn: &mut Conn,
    node: NodeId,
    ops: &[SliceOp],
    results: &mut [Option<Result<(), TransferError>>],
    inflight: &mut VecDeque<(usize, u32)>,
    reads_inflight: &mut usize,
) -> Result<(), Broken> {
    conn.writer.flush()?;
    let Some((i, seq)) = inflight.pop_front() else {
        return Ok(());
    };
    let op = &ops[i];
    if op.op == TransferOp::Read {
        *reads_inflight -= 1;
    }
    let mut raw = [0u8; RESPONSE_LEN];
    conn.reader.read_exact(&mut raw)?;
    let resp = ResponseHeader::decode(&raw).map_err(|e| Broken::Protocol(e.to_string()))?;
    if resp.seq != seq {
        return Err(Broken::Protocol(format!(
            "response for request {} while waiting for {seq}",
            resp.seq
        )));
    }
    if resp.status != 0 {
        let reason = Refusal::from_code(resp.status).unwrap_or(Refusal::BadRequest);
        if resp.len != 0 {
            return Err(Broken::Protocol("a refusal with a payload".into()));
        }
        results[i] = Some(Err(if reason == Refusal::DeviceMemory {
            // GPU memory: the segment is fine, only this path cannot reach it.
            TransferError::unavailable(
                KIND,
                node,
                format!("segment {} is GPU memory", op.remote.segment),
            )
        } else {
            TransferError::Refused {
                node,
                segment: op.remote.segment,
                reason,
            }
        }));
        return Ok(());
    }
    let expected = if op.op == TransferOp::Read { op.len } else { 0 };
    if resp.len != expected {
        return Err(Broken::Protocol(format!(
            "response carries {} bytes, expected {expected}",
            resp.len
        )));
    }
    if op.op == TransferOp::Read {
        let local = op
            .local_ptr()
            .map_err(|e| Broken::Protocol(e.to_string()))?;
        // SAFETY: the range was checked against the local region (kept mapped by `op.local`)
        // and belongs to this in-flight request until the batch completes.
        let bytes = unsafe { std::slice::from_raw_parts_mut(local, op.len_usize()) };
        conn.reader.read_exact(bytes)?;
    }
    results[i] = Some(Ok(()));
    Ok(())
}
