//! The tcp transfer listener: serves one-sided reads and writes of this node's registered
//! segments to peers, straight between the socket and the mapping (no staging copy), and
//! answers proof challenges (see `proof.rs`) for the engine it belongs to.

use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use super::wire::{Frame, ProveFrame, RequestHeader, ResponseHeader, MAX_FRAME, REQUEST_LEN};
use crate::descriptor::Access;
use crate::error::{Refusal, TransferError};
use crate::proof::Prover;
use crate::request::TransferOp;
use crate::segment::SegmentTable;
use crate::stats::ListenerCounters;
use crate::transport::serve::Server;

/// Buffer for request headers and small responses; payloads bypass it.
const BUF: usize = 64 << 10;

/// A running tcp listener; stops when dropped.
pub(crate) struct TcpTransferListener {
    pub(crate) addr: SocketAddr,
    _server: Server,
}

pub(crate) struct ListenOptions {
    /// A connection idle (or stalled mid-frame) this long is closed.
    pub(crate) idle_timeout: Duration,
    pub(crate) max_connections: usize,
    /// Answers proof challenges.
    pub(crate) prover: Prover,
}

impl TcpTransferListener {
    pub(crate) fn start(
        bind: SocketAddr,
        segments: Arc<SegmentTable>,
        opts: ListenOptions,
        counters: Arc<ListenerCounters>,
    ) -> Result<TcpTransferListener, TransferError> {
        let listener = TcpListener::bind(bind).map_err(|e| {
            TransferError::setup(format!("bind the tcp transfer listener to {bind}"), e)
        })?;
        let addr = listener
            .local_addr()
            .map_err(|e| TransferError::setup("read the tcp listener's address", e))?;
        let wake_addr = loopback_for(addr);
        let idle = opts.idle_timeout;
        let prover = opts.prover;
        let serve_counters = Arc::clone(&counters);
        let listening = listener
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| TransferError::setup("duplicate the listening socket", e))?;
        let server = Server::spawn(
            "yutu-tcp-listen",
            listening,
            move || listener.accept().map(|(s, _)| s),
            move |stream: TcpStream| {
                if let Err(err) = serve(stream, &segments, &prover, idle, &serve_counters) {
                    tracing::debug!(%err, "tcp transfer connection ended");
                }
            },
            move || {
                let _ = TcpStream::connect_timeout(&wake_addr, Duration::from_secs(1));
            },
            opts.max_connections,
            counters,
        )
        .map_err(|e| TransferError::setup("start the tcp listener thread", e))?;
        Ok(TcpTransferListener {
            addr,
            _server: server,
        })
    }
}

/// The address to connect to in order to reach a listener bound to `addr` from this host.
fn loopback_for(addr: SocketAddr) -> SocketAddr {
    let mut wake = addr;
    if addr.ip().is_unspecified() {
        wake.set_ip(match addr {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    wake
}

/// Serves one connection until the peer closes it, breaks it, or sends a frame that does not
/// parse.
fn serve(
    stream: TcpStream,
    segments: &SegmentTable,
    prover: &Prover,
    idle: Duration,
    counters: &ListenerCounters,
) -> io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(idle))?;
    stream.set_write_timeout(Some(idle))?;
    let _ = socket2::SockRef::from(&stream).set_keepalive(true);
    let mut reader = BufReader::with_capacity(BUF, stream.try_clone()?);
    let mut writer = BufWriter::with_capacity(BUF, stream);
    loop {
        // Flush batched responses only when the peer has nothing more queued for us: a pipelined
        // burst of small requests gets one write back instead of one per request.
        if reader.buffer().is_empty() {
            writer.flush()?;
        }
        let mut raw = [0u8; REQUEST_LEN];
        if !read_frame_or_eof(&mut reader, &mut raw)? {
            return Ok(());
        }
        let req =
            match Frame::decode(&raw).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))? {
                Frame::Request(req) => req,
                Frame::Prove(challenge) => {
                    prove(&mut writer, prover, &challenge)?;
                    continue;
                }
            };
        ListenerCounters::add(&counters.requests, 1);
        let checked = if req.len > MAX_FRAME {
            Err(Refusal::TooLarge)
        } else {
            let op = match req.op {
                TransferOp::Read => Access::Read,
                TransferOp::Write => Access::Write,
            };
            segments.check(&req.desc, op, req.offset, req.len)
        };
        match (checked, req.op) {
            (Ok(grant), TransferOp::Read) => {
                respond(&mut writer, &req, 0, req.len)?;
                // SAFETY: `check` verified the token and that `[ptr, ptr + len)` lies inside the
                // registered segment, whose mapping `grant.entry` keeps alive while we copy. The
                // owner guarantees (lease contract) that the range is not reused meanwhile;
                // concurrent writers can only make the bytes sent stale.
                let bytes = unsafe { std::slice::from_raw_parts(grant.ptr, grant.len) };
                writer.write_all(bytes)?;
                ListenerCounters::add(&counters.bytes_out, req.len);
            }
            (Ok(grant), TransferOp::Write) => {
                // SAFETY: as for reads; the peer was granted write access to exactly this range
                // by the token, and no Rust reference to these bytes exists elsewhere (the owner
                // only touches them through copies once the put ends).
                let bytes = unsafe { std::slice::from_raw_parts_mut(grant.ptr, grant.len) };
                reader.read_exact(bytes)?;
                ListenerCounters::add(&counters.bytes_in, req.len);
                respond(&mut writer, &req, 0, 0)?;
            }
            (Err(refusal), op) => {
                ListenerCounters::add(&counters.refused, 1);
                if op == TransferOp::Write {
                    if req.len > MAX_FRAME {
                        // Too much to drain: answer and close.
                        respond(&mut writer, &req, refusal.code(), 0)?;
                        writer.flush()?;
                        return Ok(());
                    }
                    drain(&mut reader, req.len)?;
                }
                respond(&mut writer, &req, refusal.code(), 0)?;
            }
        }
    }
}

fn respond(w: &mut impl Write, req: &RequestHeader, status: u8, len: u64) -> io::Result<()> {
    w.write_all(
        &ResponseHeader {
            status,
            seq: req.seq,
            len,
        }
        .encode(),
    )
}

/// Answers a proof challenge: the proof after a response header of seq 0, or a refusal alone.
fn prove(w: &mut impl Write, prover: &Prover, challenge: &ProveFrame) -> io::Result<()> {
    match prover.answer(challenge.challenger, &challenge.nonce) {
        Ok(proof) => {
            let header = ResponseHeader {
                status: 0,
                seq: 0,
                len: proof.len() as u64,
            };
            w.write_all(&header.encode())?;
            w.write_all(&proof)
        }
        Err(refusal) => {
            tracing::debug!(challenger = %challenge.challenger, "proof challenge refused");
            let header = ResponseHeader {
                status: refusal.code(),
                seq: 0,
                len: 0,
            };
            w.write_all(&header.encode())
        }
    }
}

/// Reads a whole frame header; `false` on a clean end of stream before its first byte.
fn read_frame_or_eof(r: &mut impl Read, buf: &mut [u8]) -> io::Result<bool> {
    let mut filled = 0;
    while filled < buf.len() {
        match r.read(&mut buf[filled..]) {
            Ok(0) if filled == 0 => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Consumes and discards `len` bytes (the payload of a refused write).
fn drain(r: &mut impl Read, len: u64) -> io::Result<()> {
    let copied = io::copy(&mut r.take(len), &mut io::sink())?;
    if copied < len {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}
