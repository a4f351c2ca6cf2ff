//! Accepting connections and routing each request to its S3 operation.

use std::convert::Infallible;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use glommio::net::TcpListener;
use http::{header, HeaderMap, HeaderValue, Method, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use yutu_api::S3ErrorCode;

use super::ctx::{Allowed, Ctx};
use super::endpoint::{action, Endpoint, Handler, Op};
use super::error::S3Error;
use super::peer::coordinate;
use super::s3::{
    attributes, bucket_policy, buckets, copy, delete_many, multipart, objects, ownership,
};
use super::target::Target;
use super::{admin, kv, Resp};
use crate::auth::authenticate::authenticate;
use crate::auth::tokens::TokenVerifier;
use crate::auth::{Action, Gate, Identity};
use crate::cluster::Cluster;
use crate::metrics::render;
use crate::net::io::HyperStream;
use crate::net::timer::GlommioTimer;
use crate::node::Shard;

/// Largest request header section answered normally (S3 allows 8 KiB for PUT headers; Yutu
/// allows twice that). Bigger sections up to hyper's buffer get `RequestHeaderSectionTooLarge`;
/// beyond the buffer hyper itself answers 431 and closes the connection.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;

/// A client must send a complete request head within this time (slow-loris protection).
pub const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// After a connection's last answer, what the client still sends is read and dropped for at
/// most this long before the socket closes (see [`linger`]).
pub const LINGER_TIME: std::time::Duration = std::time::Duration::from_secs(5);

/// ... and at most this many bytes of it.
pub const LINGER_BYTES: usize = 64 << 20;

/// What every connection of a listener shares: the token verifier and, with TLS, the
/// acceptor.
#[derive(Clone)]
pub struct Listening {
    pub tokens: Arc<TokenVerifier>,
    pub tls: Option<futures_rustls::TlsAcceptor>,
    /// The cluster the node is part of, if any.
    pub cluster: Option<Arc<Cluster>>,
}

/// Serves connections accepted on this shard's listener until the node stops; then closes the
/// listener and asks every connection to finish its request in progress and close.
pub async fn accept_loop(shard: Rc<Shard>, listener: TcpListener, listening: Listening) {
    loop {
        let accepted = futures_lite::future::or(async { Some(listener.accept().await) }, async {
            shard.stop.stopped().await;
            None
        })
        .await;
        let Some(accepted) = accepted else {
            tracing::info!(shard = shard.id, "listener closed");
            return;
        };
        let stream = match accepted {
            Ok(s) => s,
            Err(e) => {
                // Typically EMFILE: back off briefly instead of spinning on the error.
                tracing::warn!(shard = shard.id, error = %e, "accept failed");
                glommio::timer::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let client = stream.peer_addr().ok().map(|a| a.ip());
        if shard.connections.count() >= shard.settings.max_connections {
            shard.metrics.connections_refused.inc();
            glommio::spawn_local(refuse_connection(stream)).detach();
            continue;
        }
        let shard = shard.clone();
        let listening = listening.clone();
        let guard = shard.connections.open();
        shard
            .metrics
            .connections
            .set(shard.connections.count() as u64);
        glommio::spawn_local(async move {
            let _guard = guard;
            let _count = ConnectionCount(shard.clone());
            let tokens = listening.tokens;
            let cluster = listening.cluster;
            match listening.tls {
                None => serve_connection(shard, tokens, cluster, client, stream).await,
                Some(acceptor) => {
                    let handshake = futures_lite::future::or(
                        async { Some(acceptor.accept(stream).await) },
                        async {
                            glommio::timer::sleep(crate::net::tls::HANDSHAKE_TIMEOUT).await;
                            None
                        },
                    )
                    .await;
                    match handshake {
                        Some(Ok(tls)) => {
                            serve_connection(shard, tokens, cluster, client, tls).await
                        }
                        Some(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
                        None => tracing::debug!("TLS handshake timed out"),
                    }
                }
            }
        })
        .detach();
    }
}

/// Serves HTTP/1.1 on one connection (plain or TLS) until it closes or the node stops.
async fn serve_connection<S>(
    shard: Rc<Shard>,
    tokens: Arc<TokenVerifier>,
    cluster: Option<Arc<Cluster>>,
    client: Option<std::net::IpAddr>,
    stream: S,
) where
    S: futures_lite::AsyncRead + futures_lite::AsyncWrite + Unpin + 'static,
{
    let stop = shard.stop.clone();
    let svc = service_fn(move |mut req: http::Request<Incoming>| {
        if let Some(ip) = client {
            req.extensions_mut().insert(ClientAddr(ip));
        }
        // Boxed: the connection is polled without its shutdown (below), which needs a
        // request's future to be movable.
        Box::pin(handle(shard.clone(), tokens.clone(), cluster.clone(), req))
    });
    let mut conn = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .timer(GlommioTimer)
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(HyperStream(stream), svc);
    let served = futures_lite::future::or(
        async { Some(std::future::poll_fn(|cx| conn.poll_without_shutdown(cx)).await) },
        async {
            stop.stopped().await;
            None
        },
    )
    .await;
    let result = match served {
        Some(r) => r,
        None => {
            // The node stops: no lingering.
            std::pin::Pin::new(&mut conn).graceful_shutdown();
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            return;
        }
    };
    if let Err(e) = &result {
        tracing::debug!(error = %e, "connection ended with an error");
    }
    linger(conn.into_parts().io.0, &stop).await;
}

/// Closes a connection whose last answer is sent: shuts its write side, then reads and drops
/// what the client still sends until it closes too, for at most [`LINGER_TIME`] and
/// [`LINGER_BYTES`] (and not past the node's stop).
///
/// An answer sent before its request's body was read (a body over the size limit or the
/// quota, a refused signature) leaves the rest of the body on its way. A socket closed with
/// bytes unread makes the kernel reset the connection, and a client still writing the body
/// then fails with a broken pipe, or loses the answer already sent: it never learns why it
/// was refused. Lingering as web servers do lets it finish writing and read the answer.
async fn linger<S>(mut stream: S, stop: &crate::node::shutdown::StopSignal)
where
    S: futures_lite::AsyncRead + futures_lite::AsyncWrite + Unpin,
{
    use futures_lite::{AsyncReadExt as _, AsyncWriteExt as _};
    // Flushes what is buffered and shuts the write side (the client reads the end).
    if stream.close().await.is_err() {
        return;
    }
    let drain = async {
        let mut buf = vec![0u8; 16 << 10];
        let mut left = LINGER_BYTES;
        while left > 0 {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    };
    futures_lite::future::or(drain, async {
        stop.sleep(LINGER_TIME).await;
    })
    .await;
}

/// What a connection past `--max-connections` is told before it is closed (within a second:
/// a client that does not read is not waited for).
async fn refuse_connection(mut stream: glommio::net::TcpStream) {
    use futures_lite::AsyncWriteExt as _;
    const BODY: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code><Message>Too many connections; retry later.</Message></Error>";
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\ncontent-type: application/xml\r\ncontent-length: {}\r\n\r\n{BODY}",
        BODY.len()
    );
    let _ = futures_lite::future::or(
        async {
            let _ = stream.write_all(answer.as_bytes()).await;
            let _ = stream.close().await;
        },
        glommio::timer::sleep(std::time::Duration::from_secs(1)),
    )
    .await;
}

/// The address a request's connection comes from (a request extension): what an anonymous
/// caller's share of the body budget is kept under.
#[derive(Debug, Clone, Copy)]
pub struct ClientAddr(pub std::net::IpAddr);

/// Keeps `yutu_connections` right when a connection ends.
struct ConnectionCount(Rc<Shard>);

impl Drop for ConnectionCount {
    fn drop(&mut self) {
        // The guard is dropped after this: count it gone already.
        let open = self.0.connections.count().saturating_sub(1);
        self.0.metrics.connections.set(open as u64);
    }
}

/// One request: route it, turn errors into S3 XML, count it.
pub async fn handle(
    shard: Rc<Shard>,
    tokens: Arc<TokenVerifier>,
    cluster: Option<Arc<Cluster>>,
    req: http::Request<Incoming>,
) -> Result<Resp, Infallible> {
    let started = Instant::now();
    let request_id = shard.next_request_id();
    let head = req.method() == Method::HEAD;
    let resource = req.uri().path().to_string();
    let method = req.method().clone();
    // A cross-origin request: its answer carries the bucket's CORS headers.
    let cors = req
        .headers()
        .get(header::ORIGIN)
        .and_then(|o| o.to_str().ok())
        .map(str::to_string)
        .and_then(|origin| {
            let host = req
                .headers()
                .get(header::HOST)
                .and_then(|h| h.to_str().ok());
            let t = Target::parse_with_host(req.uri(), host, &shard.settings.domains).ok()?;
            Some((origin, t.bucket?))
        });
    // Refused before anything of it is read: its body, if any, is never read, so the
    // connection cannot carry another request, and the answer says so. Without
    // `Connection: close` a client pools the connection and its next request finds it closed.
    let oversized = header_section_size(req.headers()) > MAX_HEADER_BYTES;
    let (op, result) = match oversized {
        true => (
            Op::Unsupported,
            Err(S3Error::new(S3ErrorCode::RequestHeaderSectionTooLarge)),
        ),
        false => dispatch(&shard, &tokens, cluster, req).await,
    };
    let mut resp = result.unwrap_or_else(|e| e.into_response(&resource, &request_id, head));
    if oversized {
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    if let Some((origin, bucket)) = &cors {
        super::s3::cors::decorate(&shard, bucket, origin, &method, &mut resp);
    }
    let headers = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&request_id) {
        headers.insert("x-amz-request-id", v);
    }
    headers.insert(header::SERVER, HeaderValue::from_static("Yutu"));
    if let Ok(v) = HeaderValue::from_str(&format!("{}/{}", shard.id, shard.nshards)) {
        headers.insert(yutu_api::kv::SHARD_HEADER, v);
    }
    let status = resp.status().as_u16();
    let elapsed = started.elapsed();
    shard.metrics.record(op.index(), status, elapsed);
    tracing::debug!(
        shard = shard.id, %method, path = %resource, status, op = op.name(),
        micros = elapsed.as_micros() as u64, request_id, "request"
    );
    Ok(resp)
}

fn header_section_size(headers: &HeaderMap) -> usize {
    headers
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 4)
        .sum()
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Resp {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, content_type)
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_default()
}

/// One request from its endpoint to its answer: parsed, authenticated, handed to its API.
async fn dispatch(
    shard: &Rc<Shard>,
    tokens: &TokenVerifier,
    cluster: Option<Arc<Cluster>>,
    req: http::Request<Incoming>,
) -> (Op, Result<Resp, S3Error>) {
    let (parts, body) = req.into_parts();
    let host = parts
        .headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok());
    let target = match Target::parse_with_host(&parts.uri, host, &shard.settings.domains) {
        Ok(t) => t,
        Err(e) => return (Op::Unsupported, Err(e)),
    };
    let endpoint = match Endpoint::parse(&parts.method, &target, &parts.headers) {
        Ok(e) => e,
        Err(e) => return (Op::Unsupported, Err(e)),
    };
    let op = endpoint.op();
    match endpoint {
        Endpoint::Health => return (op, Ok(text(StatusCode::OK, "text/plain", "ok\n".into()))),
        Endpoint::Metrics => {
            let mut body = render(&shard.all_metrics, &Op::names());
            body.push_str(&crate::metrics::render_copy_helpers(
                yutu_transfer::split_copy::stats(),
            ));
            if let Some(c) = &cluster {
                body.push_str(&c.render_metrics());
            }
            let r = text(StatusCode::OK, "text/plain; version=0.0.4", body);
            return (op, Ok(r));
        }
        Endpoint::CorsPreflight => {
            let r = super::s3::cors::preflight(shard, target.bucket.as_deref(), &parts.headers);
            return (op, r);
        }
        _ => {}
    }
    let virtual_bucket = target.bucket.as_deref().filter(|_| target.virtual_host);
    let auth = match authenticate(
        &shard.settings,
        tokens,
        &parts.method,
        &parts.uri,
        &parts.headers,
        virtual_bucket,
    ) {
        Ok(a) => a,
        Err(e) => return (Op::Unsupported, Err(e.into())),
    };
    let peer = cluster.as_deref().and_then(|c| {
        super::peer::cluster::from_node(
            c,
            shard.settings.no_auth,
            tokens,
            &parts.headers,
            &auth.identity,
        )
    });
    let ctx = Ctx {
        client: parts.extensions.get::<ClientAddr>().map(|c| c.0),
        shard: shard.clone(),
        method: parts.method,
        uri: parts.uri,
        headers: parts.headers,
        target,
        auth,
        cluster,
        peer,
        op: std::cell::Cell::new(op),
        deleted_as: std::cell::Cell::new(None),
    };
    if endpoint.needs_credentials() && matches!(ctx.identity(), Identity::Anonymous) {
        return (
            Op::Unsupported,
            Err(S3Error::new(S3ErrorCode::AccessDenied)
                .msg("Anonymous access is not allowed here; sign the request or send a token.")),
        );
    }
    (op, serve(&ctx, endpoint, body).await)
}

/// Serves an authenticated request at its endpoint: the one dispatch to a handler.
async fn serve(ctx: &Ctx, endpoint: Endpoint, body: Incoming) -> Result<Resp, S3Error> {
    match endpoint {
        Endpoint::Mooncake(m) => super::kv::mooncake::serve(ctx, m).await,
        Endpoint::Membership => {
            // `?bucket=NAME`: a client routing a bucket this node may not have read from
            // etcd yet.
            if let (Some(cluster), Some(b)) = (&ctx.cluster, ctx.target.param("bucket")) {
                if yutu_api::validate_bucket_name(b).is_ok() {
                    super::peer::cluster::know_bucket(ctx, cluster, b).await;
                }
            }
            super::peer::cluster::membership(ctx)
        }
        Endpoint::Admin => admin::fanout::serve(ctx, body).await,
        Endpoint::Kv => kv::api::serve(ctx, body).await,
        Endpoint::ListBuckets => ctx
            .allow(Action::ListBuckets, None)
            .and_then(|_| buckets::list_buckets(ctx)),
        Endpoint::ServiceMethodNotAllowed => Err(S3Error::new(S3ErrorCode::MethodNotAllowed)),
        Endpoint::Bucket { bucket, op } => serve_bucket(ctx, op, &bucket, body)
            .await
            .map_err(|e| e.bucket(&bucket)),
        Endpoint::Object { bucket, key, op } => serve_object(ctx, op, &bucket, &key, body)
            .await
            .map_err(|e| e.bucket(&bucket).key(&key)),
        // Answered before authentication.
        Endpoint::Health | Endpoint::Metrics | Endpoint::CorsPreflight => {
            Err(S3Error::new(S3ErrorCode::InternalError))
        }
    }
}

/// An S3 operation on bucket `b`.
async fn serve_bucket(ctx: &Ctx, op: Op, b: &str, body: Incoming) -> Result<Resp, S3Error> {
    if let Some(cluster) = &ctx.cluster {
        super::peer::cluster::know_bucket(ctx, cluster, b).await;
    }
    if op == Op::PostObject {
        // The form's signer is checked by the upload itself.
        if ctx.cluster.is_some() {
            return Err(S3Error::new(S3ErrorCode::NotImplemented).msg(
                "POST Object (form uploads) is not implemented in a cluster yet; upload with PUT.",
            ));
        }
        return super::s3::post_object::post_object(ctx, body, b).await;
    }
    let incarnation = ctx.allow(action(op), Some(b))?;
    super::s3::acl::check_expected_owner(ctx, b)?;
    use super::s3::{acl, cors};
    match op.handler() {
        Some(Handler::Buckets) => buckets::serve_bucket(ctx, op, b, body, incarnation).await,
        Some(Handler::Acl) => acl::serve_bucket(ctx, op, b, body, incarnation).await,
        Some(Handler::Cors) => cors::serve_bucket(ctx, op, b, body, incarnation).await,
        Some(Handler::BucketPolicy) => {
            bucket_policy::serve_bucket(ctx, op, b, body, incarnation).await
        }
        Some(Handler::Ownership) => ownership::serve_bucket(ctx, op, b, body, incarnation).await,
        Some(Handler::DeleteMany) => delete_many::serve_bucket(ctx, op, b, body, incarnation).await,
        Some(Handler::Multipart) => multipart::serve_bucket(ctx, op, b, body, incarnation).await,
        _ => Err(S3Error::new(S3ErrorCode::NotImplemented)
            .msg("This POST operation on a bucket is not implemented.")),
    }
}

/// An S3 operation on object `b/k`: in a cluster, first where it is served
/// ([`coordinate::coordinate`]); then here, and what a cluster does after.
async fn serve_object(
    ctx: &Ctx,
    op: Op,
    b: &str,
    k: &str,
    body: Incoming,
) -> Result<Resp, S3Error> {
    let (body, after, allowed) = match ctx.cluster.clone() {
        Some(cluster) => match coordinate::coordinate(ctx, &cluster, op, b, k, body).await {
            coordinate::Next::Answered(r) => return r,
            coordinate::Next::Here {
                body,
                after,
                allowed,
            } => (body, Some((cluster, after)), Some(allowed)),
        },
        None => (body, None, None),
    };
    let r = object_here(ctx, op, b, k, body, allowed).await;
    match after {
        Some((cluster, after)) => coordinate::finish(ctx, &cluster, op, b, k, after, r).await,
        None => r,
    }
}

/// An S3 operation on object `b/k`, served from this node's shards; `allowed` is the
/// permission check when the cluster's wrapper already made it.
async fn object_here(
    ctx: &Ctx,
    op: Op,
    b: &str,
    k: &str,
    body: Incoming,
    allowed: Option<Allowed>,
) -> Result<Resp, S3Error> {
    let (incarnation, gate) = match allowed {
        Some(a) => a,
        None => ctx.allow_object(action(op), b)?,
    };
    let reads_the_acl = matches!(
        op,
        Op::GetObject | Op::HeadObject | Op::GetObjectAcl | Op::PutObjectAcl
    );
    if gate != Gate::Open && !reads_the_acl {
        // Only these read the object's ACL before answering.
        return Err(S3Error::new(S3ErrorCode::AccessDenied));
    }
    super::s3::acl::check_expected_owner(ctx, b)?;
    let (inc, g) = (incarnation, gate);
    match op.handler() {
        Some(Handler::Acl) => super::s3::acl::serve_object(ctx, op, b, k, body, inc, g).await,
        Some(Handler::Multipart) => multipart::serve_object(ctx, op, b, k, body, inc, g).await,
        Some(Handler::Objects) => objects::serve_object(ctx, op, b, k, body, inc, g).await,
        Some(Handler::Copy) => copy::serve_object(ctx, op, b, k, body, inc, g).await,
        Some(Handler::Attributes) => attributes::serve_object(ctx, op, b, k, body, inc, g).await,
        _ => Err(S3Error::new(S3ErrorCode::NotImplemented)
            .msg("This POST operation on an object is not implemented.")),
    }
}
