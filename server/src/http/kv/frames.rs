//! The KV calls in binary frames ([`yutu_api::kv_frame`]): every shard takes them on a Unix
//! socket of its own (abstract namespace) and, without TLS, a TCP port of its own.
//!
//! A frame call is served by the code that serves the JSON call of the same name: a [`Ctx`]
//! is made for it with the connection's identity, then [`admit`] (cluster, permission,
//! bucket, all checked at the moment of the call) and [`answer`]. The hello's token is
//! verified as an HTTP request's bearer token is (`authenticate`); after that each call
//! checks its claims against the clock, exactly as the node's cache of verified tokens does
//! for HTTP, so a token that expires stops working on an open connection too. What frames
//! change is only the encoding and the connection: no request line, headers or JSON, and a
//! connection that ends on the shard owning the call's keys.
//!
//! Every wait has a deadline: the hello within [`HELLO_TIMEOUT`] of the connection, a body
//! within [`BODY_TIMEOUT`] of its header, and an idle connection is closed after
//! [`IDLE_TIMEOUT`]. Connections count against `--max-connections` with the HTTP ones, and
//! a body is reserved in the node's body budget before it is read. A malformed header ends
//! the connection (after an error frame); a call that fails answers an error frame and the
//! connection goes on, as an HTTP error does.

use std::cell::{Cell, RefCell};
use std::net::IpAddr;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_lite::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use http::{HeaderMap, HeaderValue, Method, Uri};
use yutu_api::kv::{ReleaseRequest, KV_ROOT, MAX_REQUEST_BYTES, RELEASE_PATH};
use yutu_api::kv_frame::{
    self, FrameFailure, FrameOp, FramesInfo, Header, Hello, PresenceGrant, PresenceRequest,
    Welcome, HEADER_LEN,
};
use yutu_api::token::{Claims, BEARER};
use yutu_api::S3ErrorCode;

use super::api::{action, admit, answer, bad, Format, KvCall};
use crate::auth::authenticate::{authenticate, Payload, RequestAuth};
use crate::auth::tokens::CACHE_TTL;
use crate::auth::{Action, Identity};
use crate::config::Settings;
use crate::http::body::check_announced;
use crate::http::ctx::Ctx;
use crate::http::endpoint::Op;
use crate::http::error::S3Error;
use crate::http::service::Listening;
use crate::http::target::Target;
use crate::kv::{calls, inline};
use crate::net::budget::BodyClient;
use crate::node::Shard;
use crate::store::presence::PresenceRefusal;

/// The first frame (the hello) must arrive within this time of the connection.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// A body must arrive within this time of its header (slow-loris protection).
pub const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// A connection with no call for this long is closed; clients open another when they need it.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// Largest hello body (a token).
const MAX_HELLO: u32 = 64 << 10;

/// Where a node's shards take frames, and the TCP listeners bound for them (one per shard,
/// taken by its shard): the Unix names are derived from the process id and a random value,
/// so two nodes on a host never collide and a name cannot be guessed ahead of the node.
pub struct Plan {
    pub info: FramesInfo,
    pub tcp: Arc<Mutex<Vec<Option<std::net::TcpListener>>>>,
}

/// Chooses the node's frame sockets and binds its TCP ports (none with TLS: frames are not
/// encrypted).
pub fn plan(settings: &Settings) -> std::io::Result<Plan> {
    let mut nonce = [0u8; 8];
    getrandom::fill(&mut nonce).map_err(|e| std::io::Error::other(e.to_string()))?;
    let pid = std::process::id();
    let stem = format!("yutu-kv-{pid}-{:016x}", u64::from_le_bytes(nonce));
    let unix = (0..settings.shards)
        .map(|i| format!("{stem}-{i}"))
        .collect();
    let mut tcp = Vec::new();
    let mut ports = Vec::new();
    if settings.tls.is_none() {
        for _ in 0..settings.shards {
            let l = std::net::TcpListener::bind((settings.listen.ip(), 0))?;
            ports.push(l.local_addr()?.port());
            tcp.push(Some(l));
        }
    }
    Ok(Plan {
        info: FramesInfo {
            version: kv_frame::VERSION,
            pid,
            unix,
            tcp: ports,
            read_limit: true,
        },
        tcp: Arc::new(Mutex::new(tcp)),
    })
}

/// Takes frame connections on this shard's Unix socket and TCP port until the node stops.
pub async fn serve(shard: Rc<Shard>, listening: Listening, tcp: Option<std::net::TcpListener>) {
    let unix = match shard.settings.frames.unix.get(shard.id) {
        Some(name) => match glommio::net::UnixListener::bind(format!("\0{name}")) {
            Ok(l) => Some(l),
            Err(e) => {
                tracing::warn!(shard = shard.id, error = %e, "cannot listen for KV frames on a Unix socket; clients use HTTP");
                None
            }
        },
        None => None,
    };
    let tcp = tcp.and_then(|l| {
        use std::os::fd::{FromRawFd, IntoRawFd};
        if let Err(e) = l.set_nonblocking(true) {
            tracing::warn!(error = %e, "cannot use the KV frame TCP listener");
            return None;
        }
        // SAFETY: `into_raw_fd` gives up the listening socket's descriptor, which the glommio
        // listener now owns alone.
        Some(unsafe { glommio::net::TcpListener::from_raw_fd(l.into_raw_fd()) })
    });
    let on_unix = async {
        if let Some(l) = &unix {
            loop {
                let Some(accepted) = until_stopped(&shard, l.accept()).await else {
                    return;
                };
                match accepted {
                    // Same host: the loopback address for the bucket policy's `aws:SourceIp`.
                    Ok(s) => open(
                        &shard,
                        &listening,
                        Some(IpAddr::from([127, 0, 0, 1])),
                        true,
                        s,
                    ),
                    Err(e) => backoff(&shard, e).await,
                }
            }
        }
    };
    let on_tcp = async {
        if let Some(l) = &tcp {
            loop {
                let Some(accepted) = until_stopped(&shard, l.accept()).await else {
                    return;
                };
                match accepted {
                    Ok(s) => {
                        let _ = s.set_nodelay(true);
                        let client = s.peer_addr().ok().map(|a| a.ip());
                        open(&shard, &listening, client, false, s)
                    }
                    Err(e) => backoff(&shard, e).await,
                }
            }
        }
    };
    futures::join!(on_unix, on_tcp);
}

/// `f`, or `None` once the node stops.
async fn until_stopped<T>(shard: &Shard, f: impl std::future::Future<Output = T>) -> Option<T> {
    futures_lite::future::or(async { Some(f.await) }, async {
        shard.stop.stopped().await;
        None
    })
    .await
}

/// `f`, or `None` after `limit` or once the node stops.
async fn within<T>(
    shard: &Shard,
    limit: Duration,
    f: impl std::future::Future<Output = T>,
) -> Option<T> {
    until_stopped(
        shard,
        futures_lite::future::or(async { Some(f.await) }, async {
            glommio::timer::sleep(limit).await;
            None
        }),
    )
    .await
    .flatten()
}

async fn backoff(shard: &Shard, e: impl std::fmt::Display) {
    // Typically EMFILE: back off briefly instead of spinning on the error.
    tracing::warn!(shard = shard.id, error = %e, "accepting a KV frame connection failed");
    glommio::timer::sleep(Duration::from_millis(50)).await;
}

/// Serves an accepted connection on its own task, within the node's connection limit.
fn open<S>(shard: &Rc<Shard>, listening: &Listening, client: Option<IpAddr>, unix: bool, stream: S)
where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
{
    if shard.connections.count() >= shard.settings.max_connections {
        shard.metrics.connections_refused.inc();
        return;
    }
    let guard = shard.connections.open();
    let conn = Conn {
        shard: shard.clone(),
        listening: listening.clone(),
        client,
        unix,
        caller: RefCell::new(None),
        challenge: RefCell::new(None),
    };
    glommio::spawn_local(async move {
        let _guard = guard;
        conn.run(stream).await;
    })
    .detach();
}

/// One frame connection: who it is (after its hello) and where it came from.
struct Conn {
    shard: Rc<Shard>,
    listening: Listening,
    client: Option<IpAddr>,
    /// A Unix connection (same host), not TCP.
    unix: bool,
    /// Who calls, from the hello on (`None` before it).
    caller: RefCell<Option<Caller>>,
    /// The arena challenge this connection was given and has not answered yet.
    challenge: RefCell<Option<super::arena_view::Challenge>>,
}

/// Who a connection's calls come from.
enum Caller {
    /// A `--no-auth` node: nobody is checked.
    Open,
    /// A bearer token, verified as an HTTP request's is (`authenticate`), and its claims with
    /// when they were verified. Like the node's cache of verified tokens, the claims are
    /// checked against the clock on every call and the token verified again after
    /// [`CACHE_TTL`].
    Token {
        token: String,
        claims: Arc<Claims>,
        verified: Instant,
    },
}

/// What has arrived on a connection and not been served yet. A client writes a frame in one
/// go, so one receive usually brings the header and the body: a call costs one read, not two.
struct Inbox {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl Inbox {
    /// The buffer a connection keeps; a larger body grows it for that call only.
    const SIZE: usize = 64 << 10;

    fn new() -> Inbox {
        Inbox {
            buf: vec![0; Inbox::SIZE],
            start: 0,
            end: 0,
        }
    }

    /// Bytes received and not taken yet.
    fn waiting(&self) -> usize {
        self.end - self.start
    }

    /// Reads until `n` bytes are waiting (an error at the end of the stream).
    async fn fill<S: AsyncRead + Unpin>(
        &mut self,
        stream: &mut S,
        n: usize,
    ) -> std::io::Result<()> {
        while self.end - self.start < n {
            if self.buf.len() - self.start < n {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
                if self.buf.len() < n {
                    self.buf.resize(n, 0);
                }
            }
            let got = stream.read(&mut self.buf[self.end..]).await?;
            if got == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            self.end += got;
        }
        Ok(())
    }

    /// The next `n` waiting bytes (after [`Inbox::fill`] of at least `n`).
    fn take(&mut self, n: usize) -> &[u8] {
        let at = self.start;
        self.start += n;
        &self.buf[at..at + n]
    }

    /// After a call: gives a grown buffer back once nothing waits in it.
    fn done(&mut self) {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
            if self.buf.len() > Inbox::SIZE {
                self.buf = vec![0; Inbox::SIZE];
            }
        }
    }
}

/// How a call went: its answer, and whether the connection may go on.
enum Outcome {
    Answer(Vec<u8>),
    Failed(S3Error),
    Fatal(S3Error),
}

impl Conn {
    async fn run<S: AsyncRead + AsyncWrite + Unpin>(mut self, mut stream: S) {
        let mut wait = HELLO_TIMEOUT;
        let mut inbox = Inbox::new();
        loop {
            match within(&self.shard, wait, inbox.fill(&mut stream, HEADER_LEN)).await {
                Some(Ok(())) => {}
                // Closed, broken, idle too long, or the node stops.
                _ => return,
            }
            let mut head = [0u8; HEADER_LEN];
            head.copy_from_slice(inbox.take(HEADER_LEN));
            wait = IDLE_TIMEOUT;
            let started = Instant::now();
            let (op, id, outcome) = match Header::decode(&head) {
                Ok(h) => (h.op, h.id, self.call(h, &mut stream, &mut inbox).await),
                Err(e) => (FrameOp::Hello, 0, Outcome::Fatal(bad(e.to_string()))),
            };
            let (frame, go_on, status) = match outcome {
                Outcome::Answer(mut frame) => (
                    kv_frame::seal(&mut frame, op, true, id).map(|()| frame),
                    true,
                    200,
                ),
                Outcome::Failed(e) => {
                    let status = e.code.status();
                    (failure(op, id, e), true, status)
                }
                Outcome::Fatal(e) => {
                    let status = e.code.status();
                    (failure(op, id, e), false, status)
                }
            };
            if op != FrameOp::Hello {
                self.shard
                    .metrics
                    .record(Op::Kv.index(), status, started.elapsed());
            }
            let Ok(frame) = frame else { return };
            let sent = within(&self.shard, BODY_TIMEOUT, async {
                stream.write_all(&frame).await?;
                stream.flush().await
            })
            .await;
            if !matches!(sent, Some(Ok(()))) || !go_on {
                return;
            }
        }
    }

    /// Reads the call's body (within the body budget) and serves it.
    async fn call<S: AsyncRead + Unpin>(
        &mut self,
        h: Header,
        stream: &mut S,
        inbox: &mut Inbox,
    ) -> Outcome {
        let hello = h.op == FrameOp::Hello;
        if hello != self.caller.borrow().is_none() {
            let msg = if hello {
                "A connection sends one hello."
            } else {
                "The first frame on a connection is a hello."
            };
            return Outcome::Fatal(S3Error::new(S3ErrorCode::InvalidRequest).msg(msg));
        }
        if hello && h.len > MAX_HELLO {
            return Outcome::Fatal(bad("The hello is too large."));
        }
        // Only a write carries values; every other call is bounded as its JSON form is.
        if h.op != FrameOp::Write {
            if let Err(e) = check_announced(Some(u64::from(h.len)), MAX_REQUEST_BYTES) {
                return Outcome::Fatal(e);
            }
        }
        // A body that fits the connection's inbox needs no reservation: that memory is the
        // connection's own, and connections are counted. A larger one is reserved in the
        // node's body budget, as an HTTP body is.
        let permit = match hello {
            false if h.len as usize > Inbox::SIZE => {
                let who = self.body_client();
                let reserved = within(
                    &self.shard,
                    BODY_TIMEOUT,
                    self.shard.body_budget.reserve(&who, u64::from(h.len)),
                )
                .await;
                match reserved {
                    Some(Ok(p)) => Some(p),
                    Some(Err(e)) => {
                        return Outcome::Fatal(
                            S3Error::new(S3ErrorCode::EntityTooLarge).msg(e.to_string()),
                        )
                    }
                    None => {
                        return Outcome::Fatal(
                            S3Error::new(S3ErrorCode::SlowDown)
                                .msg("The node's request memory stayed in use; retry later."),
                        )
                    }
                }
            }
            _ => None,
        };
        let len = h.len as usize;
        if inbox.waiting() < len {
            match within(&self.shard, BODY_TIMEOUT, inbox.fill(stream, len)).await {
                Some(Ok(())) => {}
                _ => return Outcome::Fatal(S3Error::new(S3ErrorCode::IncompleteBody)),
            }
        }
        let body = inbox.take(len);
        let served = if hello {
            self.hello(body)
        } else {
            self.serve(h.op, body).await
        };
        inbox.done();
        drop(permit);
        match served {
            Ok(answer) => Outcome::Answer(answer),
            Err(e) if hello => Outcome::Fatal(e),
            Err(e) => Outcome::Failed(e),
        }
    }

    fn hello(&mut self, body: &[u8]) -> Result<Vec<u8>, S3Error> {
        let hello: Hello = Format::Frame.read(body)?;
        let settings = &self.shard.settings;
        let caller = if settings.no_auth {
            Caller::Open
        } else {
            let token = hello.token.ok_or_else(|| {
                S3Error::new(S3ErrorCode::AccessDenied)
                    .msg("Anonymous access is not allowed here; send a token.")
            })?;
            // The token is checked as the `Authorization: Bearer` of an HTTP request is.
            let mut headers = HeaderMap::new();
            let value = HeaderValue::try_from(format!("{BEARER}{token}"))
                .map_err(|_| bad("The token has characters a header cannot."))?;
            headers.insert(http::header::AUTHORIZATION, value);
            let uri = Uri::from_static(RELEASE_PATH);
            let auth = authenticate(
                settings,
                &self.listening.tokens,
                &Method::POST,
                &uri,
                &headers,
                None,
            )?;
            let Identity::Token(claims) = auth.identity else {
                return Err(S3Error::new(S3ErrorCode::InvalidToken));
            };
            Caller::Token {
                token,
                claims,
                verified: Instant::now(),
            }
        };
        *self.caller.borrow_mut() = Some(caller);
        encode(&Welcome {
            shard: self.shard.id as u32,
            shards: self.shard.nshards as u32,
            publish: true,
        })
    }

    /// The caller's presence table of `bucket` on this shard (`FrameOp::Presence`): the
    /// answer names a one-time socket that hands the table's memfd to whoever shows the
    /// answer's nonce (`presence_handoff.rs`). The caller passed [`admit`] for reading;
    /// listing is checked too (the table tells of every key). Unix connections on a single
    /// node only.
    fn presence(&self, ctx: &Ctx, bucket: &str) -> Result<PresenceGrant, S3Error> {
        ctx.allow(Action::List, Some(bucket))?;
        if !self.unix {
            return Err(S3Error::new(S3ErrorCode::InvalidRequest)
                .msg("Presence tables are given only on the node's Unix frame sockets."));
        }
        if ctx.cluster.is_some() {
            return Err(S3Error::new(S3ErrorCode::NotImplemented)
                .msg("Presence tables are not given by a node in a pool."));
        }
        let valid_until_ms = match self.caller.borrow().as_ref() {
            Some(Caller::Token { claims, .. }) => Some(claims.exp.saturating_mul(1000)),
            _ => None,
        };
        let grant = self
            .shard
            .tier
            .presence_grant(bucket, valid_until_ms)?
            .map_err(|e| {
                let code = match e {
                    PresenceRefusal::Off => S3ErrorCode::NotImplemented,
                    PresenceRefusal::Budget(_) => S3ErrorCode::ServiceUnavailable,
                    PresenceRefusal::System(_) => S3ErrorCode::InternalError,
                };
                S3Error::new(code).msg(format!("{}.", capitalised(&e.to_string())))
            })?;
        let handoff = super::presence_handoff::offer(grant.fd).map_err(|e| {
            let code = match e.kind() {
                std::io::ErrorKind::WouldBlock => S3ErrorCode::SlowDown,
                _ => S3ErrorCode::InternalError,
            };
            S3Error::new(code).msg(format!("Cannot offer the presence table: {e}."))
        })?;
        Ok(PresenceGrant {
            shard: self.shard.id as u32,
            bytes: grant.bytes,
            secret: grant.secret.to_vec(),
            valid_until_ms,
            socket: handoff.socket,
            nonce: handoff.nonce.to_vec(),
        })
    }

    /// Who calls, checked now.
    fn identity(&self) -> Result<Identity, S3Error> {
        let mut caller = self.caller.borrow_mut();
        match caller.as_mut() {
            Some(Caller::Open) => Ok(Identity::Open),
            Some(Caller::Token {
                token,
                claims,
                verified,
            }) => {
                let tokens = &self.listening.tokens;
                if verified.elapsed() >= CACHE_TTL {
                    *claims = tokens.verify(token)?;
                    *verified = Instant::now();
                } else {
                    tokens.still_valid(claims)?;
                }
                Ok(Identity::Token(claims.clone()))
            }
            None => Err(S3Error::new(S3ErrorCode::AccessDenied)),
        }
    }

    /// Who the connection's bodies are counted against (as [`Ctx::body_client`]).
    fn body_client(&self) -> BodyClient {
        match self.ctx("kv".into()) {
            Ok(ctx) => ctx.body_client(),
            Err(_) => BodyClient {
                key: Some(self.client.map_or_else(String::new, |ip| ip.to_string())),
                anonymous: true,
            },
        }
    }

    /// The request context of a call, its identity checked now. `key` is what the target of
    /// the same HTTP call would hold (`kv/{bucket}/{op}`, the path after `/v1/`).
    fn ctx(&self, key: String) -> Result<Ctx, S3Error> {
        let identity = self.identity()?;
        Ok(Ctx {
            shard: self.shard.clone(),
            method: Method::POST,
            uri: Uri::from_static(KV_ROOT),
            headers: HeaderMap::new(),
            target: Target {
                bucket: Some("v1".into()),
                key: Some(key),
                query: Vec::new(),
                virtual_host: false,
            },
            auth: RequestAuth {
                identity,
                payload: Payload::Unsigned,
                signer: None,
            },
            cluster: self.listening.cluster.clone(),
            peer: None,
            client: self.client,
            op: Cell::new(Op::Kv),
            deleted_as: Cell::new(None),
        })
    }

    async fn serve(&self, op: FrameOp, body: &[u8]) -> Result<Vec<u8>, S3Error> {
        if op == FrameOp::Release {
            let ctx = self.ctx("kv/release".into())?;
            let req: ReleaseRequest = Format::Frame.read(body)?;
            return encode(&calls::release(&ctx.caller(), req).await?);
        }
        if matches!(op, FrameOp::ArenaChallenge | FrameOp::ArenaView) {
            let ctx = self.ctx("kv/arena-view".into())?;
            super::arena_view::check_allowed(&self.shard, self.unix, ctx.cluster.is_some())?;
            if op == FrameOp::ArenaChallenge {
                super::arena_view::challenge_request(body)?;
                let (challenge, answer) = super::arena_view::Challenge::new()?;
                *self.challenge.borrow_mut() = Some(challenge);
                return encode(&answer);
            }
            let spent = self.challenge.borrow_mut().take();
            return encode(&super::arena_view::grant(&self.shard, spent, body)?);
        }
        let (bucket, request) = kv_frame::split_call(body).map_err(|e| bad(e.to_string()))?;
        yutu_api::validate_bucket_name(bucket)
            .map_err(|e| S3Error::new(S3ErrorCode::InvalidBucketName).msg(e.to_string()))?;
        let (name, needs) = match op {
            FrameOp::Kv(kv) => (kv.as_str(), action(kv)),
            FrameOp::Read => ("read", Action::Read),
            FrameOp::Presence => ("presence", Action::Read),
            _ => ("write", Action::Write),
        };
        let ctx = self.ctx(format!("kv/{bucket}/{name}"))?;
        admit(&ctx, bucket, needs).await?;
        match op {
            FrameOp::Presence => {
                let _: PresenceRequest = Format::Frame.read(request)?;
                encode(&self.presence(&ctx, bucket)?)
            }
            FrameOp::Kv(kv) => {
                let call = KvCall::read(kv, request, Format::Frame)?;
                encode(&answer(&ctx, bucket, call).await?)
            }
            FrameOp::Read => {
                let req = Format::Frame.read(request)?;
                encode(&inline::read_many(&ctx.shard, bucket, req).await?)
            }
            _ => {
                let req = Format::Frame.read(request)?;
                encode(&inline::write_many(&ctx.shard, bucket, req).await?)
            }
        }
    }
}

/// An answer's frame, its header still to be written (`kv_frame::seal`): the body is encoded
/// once, in place.
fn encode<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, S3Error> {
    kv_frame::encode_frame(FrameOp::Hello, true, 0, value)
        .map_err(|e| S3Error::new(S3ErrorCode::InternalError).msg(e.to_string()))
}

fn failure(op: FrameOp, id: u32, e: S3Error) -> Result<Vec<u8>, kv_frame::FrameError> {
    let body = kv_frame::encode(&FrameFailure {
        status: e.code.status(),
        code: e.code.code().to_string(),
        message: e.message,
    })?;
    kv_frame::frame(op, false, id, &body)
}

/// `text` with its first letter in capitals (S3 messages are sentences).
fn capitalised(text: &str) -> String {
    let mut c = text.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}
