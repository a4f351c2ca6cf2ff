//! KV calls in binary frames ([`yutu_api::kv_frame`]): a connection per shard of the node,
//! used from the calling thread with blocking reads and writes.
//!
//! A small call over HTTP spends most of its time in the request and answer around it; a
//! frame is a 16-byte header and the same request struct in MessagePack, sent to the shard
//! that owns the call's keys. Same host (a Unix socket in the abstract namespace, whose peer
//! must be the node's process) is preferred, then the node's TCP port for the shard. A client
//! whose node offers no frames, or whose first connection fails, keeps using HTTP: nothing a
//! call does depends on how it travels.
//!
//! Connections are pooled per shard; one carries one call at a time. A pooled connection idle
//! for longer than [`REUSE_IDLE`] is dropped rather than reused (the node closes idle ones),
//! and a call that only reads and fails on a reused connection before any answer arrived is
//! sent once more on a fresh one. Every read and write has [`CALL_TIMEOUT`].

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;
use yutu_api::kv::KvOp;
use yutu_api::kv_frame::{
    self, FrameFailure, FrameOp, FramesInfo, Header, Hello, PresenceGrant, PresenceRequest,
    Welcome, HEADER_LEN,
};

use super::KvError;
use crate::error::{error_from_response, Resource};

/// How long a read or write of a frame may take. Generous: a get-into of a large batch is
/// answered when its bytes are copied.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(120);
/// A pooled connection idle for longer is not reused (the node closes them after 600 s).
const REUSE_IDLE: Duration = Duration::from_secs(300);
/// Idle connections kept per shard.
const IDLE_PER_SHARD: usize = 4;
/// The longest a call polls for its answer by default (see `KvOptions::frame_spin` and
/// [`Pace`]).
pub const DEFAULT_SPIN: Duration = Duration::from_micros(400);
/// What a call polls for at least when it polls at all (and when its op's answer time is not
/// known yet).
const MIN_SPIN: Duration = Duration::from_micros(50);
/// The first read of an answer: small answers (most) arrive whole in it.
const FIRST_READ: usize = 8 << 10;
/// Most shards a node's frames info may name (a node has one per core).
const MAX_SHARDS: usize = 4096;
/// Connecting to a TCP port (the node's HTTP port on the same host has just answered).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Which sockets a client may use for frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FramesMode {
    /// The node's Unix sockets when they are reachable, else its TCP ports.
    #[default]
    Auto,
    /// Only the TCP ports (the node on another host, or a test of that path).
    Tcp,
    /// No frames: every call over HTTP.
    Off,
}

/// How a client reaches the node's shards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FramesPath {
    Unix,
    Tcp(String),
}

enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        match self {
            Stream::Unix(s) => s.write_all(buf),
            Stream::Tcp(s) => s.write_all(buf),
        }
    }

    fn read_exact(&mut self, buf: &mut [u8]) -> std::io::Result<()> {
        match self {
            Stream::Unix(s) => s.read_exact(buf),
            Stream::Tcp(s) => s.read_exact(buf),
        }
    }

    fn fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        match self {
            Stream::Unix(s) => s.as_raw_fd(),
            Stream::Tcp(s) => s.as_raw_fd(),
        }
    }

    /// The first bytes of an answer about to arrive: polled for up to `spin` ([`Pace`] says
    /// how long), giving the CPU away between polls, then waited for. A thread that yields
    /// while it polls still lets the node's shard run when both share a core. Returns the
    /// bytes read (0 at the end of the stream).
    fn read_soon(&mut self, buf: &mut [u8], spin: Duration) -> std::io::Result<usize> {
        // Only so many threads of this process poll at once; the others sleep at once.
        let polling = (!spin.is_zero()).then(Poller::enter).flatten();
        if polling.is_some() {
            let until = Instant::now() + spin;
            loop {
                // SAFETY: `buf` is valid for writes of its length, and the descriptor is the
                // stream's own, open for the duration of the call.
                let n = unsafe {
                    libc::recv(
                        self.fd(),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                        libc::MSG_DONTWAIT,
                    )
                };
                if n >= 0 {
                    return Ok(n as usize);
                }
                let e = std::io::Error::last_os_error();
                if !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                ) {
                    return Err(e);
                }
                if Instant::now() >= until {
                    break;
                }
                std::thread::yield_now();
            }
        }
        self.read(buf)
    }

    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
        }
    }
}

/// A thread of this process polling for an answer ([`Stream::read_soon`]), while it does.
///
/// Polling pays where a core would otherwise sit idle until the answer's wake-up. With more
/// callers than that waiting at once (Mooncake's stress test: 8 threads `get` and `put` on a
/// 2-core host), the pollers take the cores from each other's copies and from the node's
/// shards, which yield only lets run by chance: so at most half the cores' worth of threads
/// (at least one) poll, and the others sleep in `read` at once.
struct Poller;

static POLLERS: AtomicUsize = AtomicUsize::new(0);

impl Poller {
    fn enter() -> Option<Poller> {
        static MAX: OnceLock<usize> = OnceLock::new();
        let max = *MAX.get_or_init(|| {
            std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
        });
        POLLERS
            .fetch_update(Ordering::Acquire, Ordering::Relaxed, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| Poller)
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        POLLERS.fetch_sub(1, Ordering::Release);
    }
}

struct Conn {
    stream: Stream,
    idle_since: Instant,
    /// The call whose answer is still to be read: one sent with [`Frames::send_each`],
    /// whose caller did not wait for it. Read (and dropped) before the connection carries
    /// another call.
    owed: Option<(FrameOp, u32)>,
}

/// A node's frame sockets, and the connections open to them.
pub(super) struct Frames {
    info: FramesInfo,
    path: FramesPath,
    token: Option<String>,
    idle: Vec<Mutex<Vec<Conn>>>,
    next_id: AtomicU32,
    /// The longest an answer is polled for before the thread sleeps (`Stream::read_soon`).
    spin: Duration,
    /// How long each op's answers have been taking, to poll only as long as is worth it.
    pace: Pace,
    /// The node said it takes publish (rooms) when a connection was opened.
    publish: AtomicBool,
}

/// How long to poll for an answer, learnt from the answers so far.
///
/// A thread asleep in `read` is woken by the node's answer, and on a VM that wake-up costs
/// tens of microseconds or more (an interrupt to an idle virtual CPU): on the 2-vCPU VM, a
/// single-key put answered in about 80 us while its thread polled, 110-150 us when it slept
/// after 50 us, and a thread that never polled took 235 us. Polling for a long call is waste:
/// the thread takes the CPU (or its hyper-thread sibling) from the shard doing the work, and
/// batches of 2 MiB blocks moved 10-25% slower with 1 ms of polling. So each op keeps a
/// moving average of its answer times, and a call polls for twice that (at least
/// [`MIN_SPIN`], at most the client's limit) when answers come within the limit, and not at
/// all when they take longer.
struct Pace {
    /// Microseconds, per op byte ([`FrameOp::code`]); 0 until an answer came.
    typical: [AtomicU32; 256],
}

impl Pace {
    fn new() -> Pace {
        Pace {
            typical: std::array::from_fn(|_| AtomicU32::new(0)),
        }
    }

    /// How long a call of `op` polls, with `limit` the most.
    fn spin(&self, op: FrameOp, limit: Duration) -> Duration {
        let typical = self.typical[usize::from(op.code())].load(Ordering::Relaxed);
        if typical == 0 {
            return MIN_SPIN.min(limit);
        }
        let typical = Duration::from_micros(u64::from(typical));
        if typical > limit {
            return Duration::ZERO;
        }
        (typical * 2).clamp(MIN_SPIN.min(limit), limit)
    }

    /// Notes that a call of `op` was answered `took` after it was sent.
    fn record(&self, op: FrameOp, took: Duration) {
        let slot = &self.typical[usize::from(op.code())];
        let sample = i64::try_from(took.as_micros())
            .unwrap_or(i64::MAX)
            .min(i64::from(u32::MAX));
        let old = i64::from(slot.load(Ordering::Relaxed));
        // An average over about the last eight answers; concurrent callers may lose each
        // other's updates, which only makes it a little less smooth.
        let new = if old == 0 {
            sample
        } else {
            old + (sample - old) / 8
        };
        slot.store(
            u32::try_from(new.max(1)).unwrap_or(u32::MAX),
            Ordering::Relaxed,
        );
    }
}

impl Frames {
    /// Frames to the node that answered `info`, when one connection to it opens and its hello
    /// is accepted; `None` otherwise (the client uses HTTP). `host` is the node's HTTP host,
    /// where its TCP ports are; `tls`: the client reaches it over HTTPS (no TCP frames then).
    pub(super) fn open(
        info: FramesInfo,
        host: &str,
        tls: bool,
        token: Option<String>,
        mode: FramesMode,
        spin: Duration,
    ) -> Option<Frames> {
        let shards = info.unix.len().max(info.tcp.len());
        // One socket per shard, on each path the node offers: anything else is not a node's
        // answer this client can place keys with.
        let per_shard = |n: usize| n == 0 || n == shards;
        if mode == FramesMode::Off
            || info.version != kv_frame::VERSION
            || !(1..=MAX_SHARDS).contains(&shards)
            || !per_shard(info.unix.len())
            || !per_shard(info.tcp.len())
        {
            return None;
        }
        let mut frames = Frames {
            info,
            path: FramesPath::Unix,
            token,
            idle: (0..shards).map(|_| Mutex::new(Vec::new())).collect(),
            next_id: AtomicU32::new(1),
            spin,
            pace: Pace::new(),
            publish: AtomicBool::new(false),
        };
        let mut paths = Vec::new();
        if mode == FramesMode::Auto && !frames.info.unix.is_empty() {
            paths.push(FramesPath::Unix);
        }
        // Never in the clear where the client's own calls are encrypted: a node behind a TLS
        // proxy offers TCP frames that would carry the token unencrypted.
        if !frames.info.tcp.is_empty() && !tls {
            paths.push(FramesPath::Tcp(host.to_string()));
        }
        for path in paths {
            frames.path = path;
            if let Ok(conn) = frames.connect(0) {
                frames.put_back(0, conn);
                return Some(frames);
            }
        }
        None
    }

    /// How this client reaches the node.
    pub(super) fn path(&self) -> &FramesPath {
        &self.path
    }

    /// Whether the node takes a read's `value_max` (older nodes refuse the field).
    pub(super) fn read_limit(&self) -> bool {
        self.info.read_limit
    }

    /// Whether the node takes publish (rooms), as its last welcome said.
    pub(super) fn publishes(&self) -> bool {
        self.publish.load(Ordering::Relaxed)
    }

    pub(super) fn shards(&self) -> usize {
        self.idle.len()
    }

    /// A per-bucket call of the JSON API, sent to `shard`.
    pub(super) fn call_kv<T: DeserializeOwned>(
        &self,
        shard: usize,
        bucket: &str,
        op: KvOp,
        request: &impl Serialize,
    ) -> Result<T, KvError> {
        let body = kv_frame::encode_call(bucket, request).map_err(invalid)?;
        self.call(shard, FrameOp::Kv(op), &body, op.is_read())
    }

    /// A call of `op` with `body`, sent to `shard`. `retry`: the call only reads, so it may be
    /// sent again when a reused connection turns out to be closed.
    pub(super) fn call<T: DeserializeOwned>(
        &self,
        shard: usize,
        op: FrameOp,
        body: &[u8],
        retry: bool,
    ) -> Result<T, KvError> {
        let shard = shard.min(self.idle.len() - 1);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let frame = kv_frame::frame(op, true, id, body).map_err(invalid)?;
        let (mut conn, reused) = match self.take(shard) {
            Some(c) => (c, true),
            None => (self.connect(shard)?, false),
        };
        let spin = self.pace.spin(op, self.spin);
        let sent = Instant::now();
        let answer = match exchange(&mut conn, &frame, op, id, spin) {
            Err(Exchange::Io(e)) if reused && retry => {
                drop(e);
                conn = self.connect(shard)?;
                exchange(&mut conn, &frame, op, id, spin)
            }
            other => other,
        };
        if answer.is_ok() {
            self.pace.record(op, sent.elapsed());
        }
        self.finish(shard, conn, answer)
    }

    /// Shard `shard`'s presence table of `bucket` ([`yutu_api::presence`]): the grant, and
    /// the table's memfd collected from the grant's one-time socket (whose peer must be the
    /// node's process). Unix sockets only.
    pub(super) fn presence(
        &self,
        shard: usize,
        bucket: &str,
    ) -> Result<(PresenceGrant, std::os::fd::OwnedFd), KvError> {
        if self.path != FramesPath::Unix {
            return Err(KvError::InvalidArgument(
                "presence tables come over Unix frame sockets only".into(),
            ));
        }
        let body = kv_frame::encode_call(bucket, &PresenceRequest {}).map_err(invalid)?;
        let grant: PresenceGrant = self.call(shard, FrameOp::Presence, &body, true)?;
        let fd = self.collect(&grant.socket, &grant.nonce)?;
        Ok((grant, fd))
    }

    /// The descriptor a node's one-time hand-over socket holds (a presence table, an arena),
    /// collected with the nonce of the answer that named it; the socket's peer must be the
    /// node's process.
    fn collect(&self, socket: &str, nonce: &[u8]) -> Result<std::os::fd::OwnedFd, KvError> {
        use std::os::fd::AsFd;
        let io = |e| KvError::from(crate::ClientError::Io(e));
        let s = connect_abstract(socket).map_err(io)?;
        let pid = peer_pid(&s).map_err(io)?;
        if pid != self.info.pid {
            return Err(KvError::InvalidResponse(format!(
                "the hand-over socket {socket} belongs to process {pid}, not the node ({})",
                self.info.pid
            )));
        }
        let wait = Duration::from_millis(kv_frame::PRESENCE_HANDOFF_TIMEOUT_MS);
        s.set_read_timeout(Some(wait)).map_err(io)?;
        s.set_write_timeout(Some(wait)).map_err(io)?;
        (&s).write_all(nonce).map_err(io)?;
        let mut byte = [0u8; 1];
        let mut fds = Vec::new();
        let n = yutu_transfer::fdpass::recv_with_fds(s.as_fd(), &mut byte, &mut fds).map_err(io)?;
        match (n, fds.len()) {
            (1, 1) => Ok(fds.remove(0)),
            _ => Err(KvError::InvalidResponse(format!(
                "the hand-over socket {socket} handed over {} descriptors",
                fds.len()
            ))),
        }
    }

    /// Shard `shard`'s arena ([`kv_frame::ArenaViewGrant`]) and its memfd: asks for a
    /// challenge, reads its nonce out of the node's memory (`process_vm_readv`, which the
    /// kernel allows only where this process may read all of the node's memory), and answers
    /// it on the same connection. `Ok(None)`: the kernel refused the read, so this process
    /// gets no view. Unix sockets only.
    pub(super) fn arena_view(
        &self,
        shard: usize,
    ) -> Result<Option<(kv_frame::ArenaViewGrant, std::os::fd::OwnedFd)>, KvError> {
        if self.path != FramesPath::Unix {
            return Ok(None);
        }
        let shard = shard.min(self.idle.len() - 1);
        let mut conn = self.connect(shard)?;
        let body = kv_frame::encode(&kv_frame::ArenaChallengeRequest {}).map_err(invalid)?;
        let challenge: kv_frame::ArenaChallenge =
            self.call_on(&mut conn, FrameOp::ArenaChallenge, &body)?;
        if challenge.len as usize != kv_frame::ARENA_NONCE_LEN {
            return Err(KvError::InvalidResponse(format!(
                "an arena challenge of {} bytes",
                challenge.len
            )));
        }
        let mut proof = vec![0u8; kv_frame::ARENA_NONCE_LEN];
        let local = libc::iovec {
            iov_base: proof.as_mut_ptr().cast(),
            iov_len: proof.len(),
        };
        let remote = libc::iovec {
            iov_base: challenge.address as usize as *mut libc::c_void,
            iov_len: proof.len(),
        };
        let pid = libc::pid_t::try_from(self.info.pid)
            .map_err(|_| KvError::InvalidResponse(format!("node pid {}", self.info.pid)))?;
        // SAFETY: one local iovec over `proof`, which lives for the call; the remote address
        // is the node's, checked by the kernel (a bad one fails the call, nothing here).
        let read = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) }
            == proof.len() as isize;
        if !read {
            let err = std::io::Error::last_os_error();
            tracing::debug!(%err, shard, "the node's memory is not readable here: no arena view");
            // Spend the challenge, so that the node counts the refusal.
            proof.fill(0);
        }
        let body = kv_frame::encode(&kv_frame::ArenaViewRequest { proof }).map_err(invalid)?;
        let granted: Result<kv_frame::ArenaViewGrant, KvError> =
            self.call_on(&mut conn, FrameOp::ArenaView, &body);
        self.put_back(shard, conn);
        match granted {
            Ok(grant) if read => {
                let fd = self.collect(&grant.socket, &grant.nonce)?;
                Ok(Some((grant, fd)))
            }
            Ok(_) => Err(KvError::InvalidResponse(
                "the node granted an arena view for a wrong answer".into(),
            )),
            Err(_) if !read => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// One call of `op` on the connection `conn` (not pooled: calls that must share one).
    fn call_on<T: DeserializeOwned>(
        &self,
        conn: &mut Conn,
        op: FrameOp,
        body: &[u8],
    ) -> Result<T, KvError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let frame = kv_frame::frame(op, true, id, body).map_err(invalid)?;
        match exchange(conn, &frame, op, id, Duration::ZERO) {
            Ok((true, raw)) => kv_frame::decode(&raw)
                .map_err(|e| KvError::InvalidResponse(format!("malformed frame answer: {e}"))),
            Ok((false, raw)) => Err(failure(&raw)),
            Err(Exchange::Io(e)) => Err(crate::ClientError::Io(e).into()),
            Err(Exchange::Bad(e)) => Err(e),
        }
    }

    /// Several calls of `op` to several shards (`(shard, body)`, distinct shards): every frame
    /// is sent before any answer is read, so the shards work at once and none forwards to
    /// another. The answers in order; the first failure if any failed.
    pub(super) fn call_each<T: DeserializeOwned>(
        &self,
        op: FrameOp,
        calls: &[(usize, Vec<u8>)],
        retry: bool,
    ) -> Result<Vec<T>, KvError> {
        self.call_each_kept(op, calls, retry)?.into_iter().collect()
    }

    /// As [`Frames::call_each`], each call's answer or failure kept, so that a caller can undo
    /// what the calls that succeeded did (release their leases); `Err` when a frame could not
    /// be sent at all.
    pub(super) fn call_each_kept<T: DeserializeOwned>(
        &self,
        op: FrameOp,
        calls: &[(usize, Vec<u8>)],
        retry: bool,
    ) -> Result<Vec<Result<T, KvError>>, KvError> {
        let spin = self.pace.spin(op, self.spin);
        let started = Instant::now();
        let mut sent = Vec::with_capacity(calls.len());
        for (shard, body) in calls {
            let shard = (*shard).min(self.idle.len() - 1);
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let frame = kv_frame::frame(op, true, id, body).map_err(invalid)?;
            let (conn, reused) = self.send(shard, &frame, retry)?;
            sent.push((shard, id, frame, conn, reused));
        }
        let mut answers = Vec::with_capacity(sent.len());
        for (shard, id, frame, mut conn, reused) in sent {
            let mut answer = receive(&mut conn, op, id, spin);
            if matches!(answer, Err(Exchange::Io(_))) && reused && retry {
                match self.connect(shard) {
                    Ok(fresh) => {
                        conn = fresh;
                        answer = exchange(&mut conn, &frame, op, id, spin);
                    }
                    Err(e) => {
                        answers.push(Err(e));
                        continue;
                    }
                }
            }
            if answer.is_ok() {
                // The batch's time until this answer: the later shards' answers have mostly
                // arrived while the first was read.
                self.pace.record(op, started.elapsed());
            }
            // Every answer is read, so no connection goes back with one still unread.
            answers.push(self.finish(shard, conn, answer));
        }
        Ok(answers)
    }

    /// A call's answer as its struct (or its error); the connection goes back to the pool
    /// when the answer was read whole.
    fn finish<T: DeserializeOwned>(
        &self,
        shard: usize,
        conn: Conn,
        answer: Result<(bool, Vec<u8>), Exchange>,
    ) -> Result<T, KvError> {
        match answer {
            Ok((ok, raw)) => {
                self.put_back(shard, conn);
                if ok {
                    kv_frame::decode(&raw).map_err(|e| {
                        KvError::InvalidResponse(format!("malformed frame answer: {e}"))
                    })
                } else {
                    Err(failure(&raw))
                }
            }
            Err(Exchange::Io(e)) => Err(crate::ClientError::Io(e).into()),
            Err(Exchange::Bad(e)) => Err(e),
        }
    }

    fn take(&self, shard: usize) -> Option<Conn> {
        loop {
            let mut c = {
                let mut idle = self.idle[shard].lock().unwrap_or_else(|p| p.into_inner());
                idle.pop()?
            };
            if c.idle_since.elapsed() >= REUSE_IDLE {
                continue;
            }
            // Read outside the pool's lock: the answer owed has almost always arrived while
            // the connection sat idle, but may still be on its way.
            if let Some((op, id)) = c.owed.take() {
                if let Err(e) = read_owed(&mut c, op, id) {
                    tracing::debug!(error = %e, ?op, "a call not waited for failed; its connection is dropped");
                    continue;
                }
            }
            return Some(c);
        }
    }

    /// Sends `op` to each shard of `calls` (`(shard, body)`) without waiting for the answers:
    /// each connection goes back to the pool owing its answer, read before its next call
    /// ([`Frames::take`]). For calls whose outcome the caller does not act on (a release of
    /// leases that would otherwise expire): the caller saves a round trip, and learns of no
    /// failure. `Err` when a frame could not be sent.
    pub(super) fn send_each(&self, op: FrameOp, calls: &[(usize, Vec<u8>)]) -> Result<(), KvError> {
        for (shard, body) in calls {
            let shard = (*shard).min(self.idle.len() - 1);
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let frame = kv_frame::frame(op, true, id, body).map_err(invalid)?;
            let (mut conn, _) = self.send(shard, &frame, true)?;
            conn.owed = Some((op, id));
            self.put_back(shard, conn);
        }
        Ok(())
    }

    /// Writes `frame` on a pooled connection to `shard` (or a new one), and on a new one
    /// when `retry` and the pooled one turns out closed by the node. The connection, and
    /// whether it was a pooled one.
    fn send(&self, shard: usize, frame: &[u8], retry: bool) -> Result<(Conn, bool), KvError> {
        let io = |e| KvError::from(crate::ClientError::Io(e));
        let (mut conn, reused) = match self.take(shard) {
            Some(c) => (c, true),
            None => (self.connect(shard)?, false),
        };
        if let Err(e) = conn.stream.write_all(frame) {
            if !(reused && retry) {
                return Err(io(e));
            }
            conn = self.connect(shard)?;
            conn.stream.write_all(frame).map_err(io)?;
        }
        Ok((conn, reused))
    }

    fn put_back(&self, shard: usize, mut conn: Conn) {
        let mut idle = self.idle[shard].lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < IDLE_PER_SHARD {
            conn.idle_since = Instant::now();
            idle.push(conn);
        }
    }

    /// A new connection to `shard`, greeted.
    fn connect(&self, shard: usize) -> Result<Conn, KvError> {
        let io = |e| KvError::from(crate::ClientError::Io(e));
        let stream = match &self.path {
            FramesPath::Unix => {
                let name = self.info.unix.get(shard).ok_or_else(|| {
                    KvError::InvalidResponse(format!("the node has no frame socket {shard}"))
                })?;
                let s = connect_abstract(name).map_err(io)?;
                let pid = peer_pid(&s).map_err(io)?;
                if pid != self.info.pid {
                    return Err(KvError::InvalidResponse(format!(
                        "the frame socket {name} belongs to process {pid}, not the node ({})",
                        self.info.pid
                    )));
                }
                s.set_read_timeout(Some(CALL_TIMEOUT)).map_err(io)?;
                s.set_write_timeout(Some(CALL_TIMEOUT)).map_err(io)?;
                Stream::Unix(s)
            }
            FramesPath::Tcp(host) => {
                let port = self.info.tcp.get(shard).ok_or_else(|| {
                    KvError::InvalidResponse(format!("the node has no frame port {shard}"))
                })?;
                let addr = std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), *port))
                    .map_err(io)?
                    .next()
                    .ok_or_else(|| KvError::InvalidArgument(format!("{host} has no address")))?;
                let s = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT).map_err(io)?;
                s.set_nodelay(true).map_err(io)?;
                s.set_read_timeout(Some(CALL_TIMEOUT)).map_err(io)?;
                s.set_write_timeout(Some(CALL_TIMEOUT)).map_err(io)?;
                Stream::Tcp(s)
            }
        };
        let mut conn = Conn {
            stream,
            idle_since: Instant::now(),
            owed: None,
        };
        let body = kv_frame::encode(&Hello {
            token: self.token.clone(),
        })
        .map_err(invalid)?;
        let frame = kv_frame::frame(FrameOp::Hello, true, 0, &body).map_err(invalid)?;
        match exchange(&mut conn, &frame, FrameOp::Hello, 0, Duration::ZERO) {
            Ok((true, raw)) => {
                let w: Welcome = kv_frame::decode(&raw).map_err(|e| {
                    KvError::InvalidResponse(format!("malformed frame welcome: {e}"))
                })?;
                if w.shard as usize != shard {
                    return Err(KvError::InvalidResponse(format!(
                        "frame socket {shard} is served by shard {}",
                        w.shard
                    )));
                }
                self.publish.store(w.publish, Ordering::Relaxed);
                Ok(conn)
            }
            Ok((false, raw)) => Err(failure(&raw)),
            Err(Exchange::Io(e)) => Err(io(e)),
            Err(Exchange::Bad(e)) => Err(e),
        }
    }
}

enum Exchange {
    /// The connection failed: nothing can be said about the call.
    Io(std::io::Error),
    /// The node answered something that is not this call's answer.
    Bad(KvError),
}

/// Sends `frame` and reads its answer: whether it is a success, and its body. The first read
/// takes whatever has arrived, which is usually the whole answer.
fn exchange(
    conn: &mut Conn,
    frame: &[u8],
    op: FrameOp,
    id: u32,
    spin: Duration,
) -> Result<(bool, Vec<u8>), Exchange> {
    conn.stream.write_all(frame).map_err(Exchange::Io)?;
    receive(conn, op, id, spin)
}

/// Reads the answer to call `id` of `op`: whether it is a success, and its body.
fn receive(
    conn: &mut Conn,
    op: FrameOp,
    id: u32,
    spin: Duration,
) -> Result<(bool, Vec<u8>), Exchange> {
    let mut first = [0u8; FIRST_READ];
    let mut got = conn
        .stream
        .read_soon(&mut first, spin)
        .map_err(Exchange::Io)?;
    if got == 0 {
        return Err(Exchange::Io(std::io::ErrorKind::UnexpectedEof.into()));
    }
    while got < HEADER_LEN {
        match conn.stream.read(&mut first[got..]).map_err(Exchange::Io)? {
            0 => return Err(Exchange::Io(std::io::ErrorKind::UnexpectedEof.into())),
            n => got += n,
        }
    }
    let mut head = [0u8; HEADER_LEN];
    head.copy_from_slice(&first[..HEADER_LEN]);
    let h = Header::decode(&head)
        .map_err(|e| Exchange::Bad(KvError::InvalidResponse(format!("bad frame answer: {e}"))))?;
    let len = h.len as usize;
    if got - HEADER_LEN > len {
        return Err(Exchange::Bad(KvError::InvalidResponse(
            "more bytes than one frame answer".into(),
        )));
    }
    let mut body = Vec::with_capacity(len);
    body.extend_from_slice(&first[HEADER_LEN..got]);
    body.resize(len, 0);
    conn.stream
        .read_exact(&mut body[got - HEADER_LEN..])
        .map_err(Exchange::Io)?;
    answers(&h, op, id).map_err(Exchange::Bad)?;
    Ok((h.ok, body))
}

/// Whether `h` heads the answer to call `id` of `op` (an error answer names no op).
fn answers(h: &Header, op: FrameOp, id: u32) -> Result<(), KvError> {
    if h.id != id || (h.ok && h.op != op) {
        return Err(KvError::InvalidResponse(format!(
            "frame answer {} ({:?}) to call {id} ({op:?})",
            h.id, h.op
        )));
    }
    Ok(())
}

/// Reads the answer owed for call `id` of `op` ([`Conn::owed`]) and drops it: exactly its
/// bytes (header, then body), so that nothing of the next call's answer is taken with it.
/// A failure the node answered is logged; `Err` only when the connection cannot be trusted.
fn read_owed(conn: &mut Conn, op: FrameOp, id: u32) -> Result<(), KvError> {
    let io = |e| KvError::from(crate::ClientError::Io(e));
    let mut head = [0u8; HEADER_LEN];
    conn.stream.read_exact(&mut head).map_err(io)?;
    let h = Header::decode(&head)
        .map_err(|e| KvError::InvalidResponse(format!("bad frame answer: {e}")))?;
    let mut body = vec![0u8; h.len as usize];
    conn.stream.read_exact(&mut body).map_err(io)?;
    answers(&h, op, id)?;
    if !h.ok {
        tracing::debug!(error = %failure(&body), ?op, "a call not waited for failed");
    }
    Ok(())
}

fn invalid(e: kv_frame::FrameError) -> KvError {
    KvError::InvalidArgument(e.to_string())
}

/// An error frame as the error the same HTTP answer would give.
fn failure(raw: &[u8]) -> KvError {
    match kv_frame::decode::<FrameFailure>(raw) {
        Ok(f) => error_from_response(
            f.status,
            "",
            Some(&f.code),
            Some(&f.message),
            Resource::Bucket,
        )
        .into(),
        Err(e) => KvError::InvalidResponse(format!("malformed frame error: {e}")),
    }
}

fn connect_abstract(name: &str) -> std::io::Result<UnixStream> {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    UnixStream::connect_addr(&addr)
}

/// The process at the other end of a Unix socket (`SO_PEERCRED`).
fn peer_pid(s: &UnixStream) -> std::io::Result<u32> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes given, and the descriptor is
    // the stream's own, open for the duration of the call.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    u32::try_from(cred.pid).map_err(|_| std::io::Error::other("no peer process"))
}

/// The host of a base URL, without its port (IPv6 literals without brackets): where the
/// node's frame ports are.
pub(super) fn url_host(base: &str) -> String {
    let authority = crate::sigv4::host_of(base);
    if let Some(v6) = authority.strip_prefix('[') {
        return v6.split(']').next().unwrap_or(v6).to_string();
    }
    match authority.rsplit_once(':') {
        Some((host, _)) => host.to_string(),
        None => authority,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// At most half the cores' worth of threads (at least one) poll at once; a poller that
    /// ends makes room for the next.
    #[test]
    fn only_so_many_threads_poll_at_once() {
        let max = std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1));
        let held: Vec<Poller> = (0..max).map(|_| Poller::enter().unwrap()).collect();
        assert!(Poller::enter().is_none(), "{max} poll already");
        drop(held);
        let again = Poller::enter();
        assert!(again.is_some());
        drop(again);
        assert_eq!(POLLERS.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_call_polls_as_long_as_its_ops_answers_take_and_not_for_slow_ones() {
        let us = Duration::from_micros;
        let limit = us(400);
        let exists = FrameOp::Kv(KvOp::Exists);
        let get = FrameOp::Kv(KvOp::GetInto);
        let pace = Pace::new();
        // Nothing known yet: the least poll, never more than the limit.
        assert_eq!(pace.spin(exists, limit), MIN_SPIN);
        assert_eq!(pace.spin(exists, us(10)), us(10));
        assert_eq!(pace.spin(exists, Duration::ZERO), Duration::ZERO);
        // Quick answers: twice their time, at least the least poll.
        pace.record(exists, us(40));
        assert_eq!(pace.spin(exists, limit), us(80));
        pace.record(exists, us(10));
        assert!(
            pace.spin(exists, limit) > us(60),
            "one quick answer is an average's eighth"
        );
        for _ in 0..64 {
            pace.record(exists, us(10));
        }
        assert_eq!(pace.spin(exists, limit), MIN_SPIN);
        // Answers near the limit: polled up to it; past it: not polled at all.
        pace.record(get, us(300));
        assert_eq!(pace.spin(get, limit), limit);
        for _ in 0..64 {
            pace.record(get, us(3_000));
        }
        assert_eq!(pace.spin(get, limit), Duration::ZERO);
        // Each op keeps its own pace; zero turns polling off.
        assert_eq!(pace.spin(exists, limit), MIN_SPIN);
        assert_eq!(pace.spin(exists, Duration::ZERO), Duration::ZERO);
        // A call that took longer than anything representable does not wrap around.
        pace.record(exists, Duration::from_secs(1 << 40));
        assert_eq!(pace.spin(exists, limit), Duration::ZERO);
    }

    #[test]
    fn frames_info_that_names_no_socket_per_shard_is_not_used() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("yutu-frames-test-{}-{:x}", std::process::id(), random());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let listener = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
        listener.set_nonblocking(true).unwrap();
        let open = |unix: usize, tcp: usize| {
            let mut names = vec![name.clone()];
            names.extend((1..unix).map(|i| format!("{name}-{i}")));
            names.truncate(unix);
            let info = FramesInfo {
                version: kv_frame::VERSION,
                // Not this process: a connection that is made fails the peer check.
                pid: 1,
                unix: names,
                tcp: vec![1; tcp],
                read_limit: true,
            };
            Frames::open(
                info,
                "127.0.0.1",
                true,
                None,
                FramesMode::Auto,
                DEFAULT_SPIN,
            )
            .is_none()
        };
        let connected = || listener.accept().is_ok();
        // Refused before any connection: lists that disagree, too many shards.
        assert!(open(2, 3));
        assert!(!connected(), "a connection for a malformed answer");
        assert!(open(MAX_SHARDS + 1, 0));
        assert!(!connected(), "a connection for too many shards");
        // Well formed: shard 0's socket is tried, and its peer (this process) refused.
        assert!(open(2, 0));
        assert!(connected(), "the well-formed answer was not tried");
    }

    fn random() -> u64 {
        let mut raw = [0u8; 8];
        getrandom::fill(&mut raw).unwrap();
        u64::from_le_bytes(raw)
    }

    #[test]
    fn the_host_of_a_base_url_drops_its_port() {
        assert_eq!(url_host("http://127.0.0.1:9000"), "127.0.0.1");
        assert_eq!(url_host("http://[::1]:9000/"), "::1");
        assert_eq!(url_host("http://node-a"), "node-a");
        assert_eq!(url_host("https://node-a:443"), "node-a");
    }
}
