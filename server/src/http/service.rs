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

use super::ctx::Ctx;
use super::error::S3Error;
use super::target::Target;
use super::{
    admin, attributes, bucket_policy, buckets, copy, delete_many, kv_api, multipart, objects,
    ownership, Resp,
};
use crate::auth::authenticate::authenticate;
use crate::auth::tokens::TokenVerifier;
use crate::auth::{Action, Gate, Identity};
use crate::cluster::Cluster;
use crate::metrics::{render, Op};
use crate::net::io::HyperStream;
use crate::net::timer::GlommioTimer;
use crate::node::Shard;

/// Largest request header section answered normally (S3 allows 8 KiB for PUT headers; Yutu
/// allows twice that). Bigger sections up to hyper's buffer get `RequestHeaderSectionTooLarge`;
/// beyond the buffer hyper itself answers 431 and closes the connection.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;

/// A client must send a complete request head within this time (slow-loris protection).
pub const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

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
        handle(shard.clone(), tokens.clone(), cluster.clone(), req)
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .timer(GlommioTimer)
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(HyperStream(stream), svc);
    let mut conn = std::pin::pin!(conn);
    let served = futures_lite::future::or(async { Some(conn.as_mut().await) }, async {
        stop.stopped().await;
        None
    })
    .await;
    let result = match served {
        Some(r) => r,
        None => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "connection ended with an error");
    }
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
    let (op, result) = route(&shard, &tokens, cluster, req).await;
    let mut resp = result.unwrap_or_else(|e| e.into_response(&resource, &request_id, head));
    if let Some((origin, bucket)) = &cors {
        super::cors::decorate(&shard, bucket, origin, &method, &mut resp);
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
    shard.metrics.record(op, status, elapsed);
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

async fn route(
    shard: &Rc<Shard>,
    tokens: &TokenVerifier,
    cluster: Option<Arc<Cluster>>,
    req: http::Request<Incoming>,
) -> (Op, Result<Resp, S3Error>) {
    if header_section_size(req.headers()) > MAX_HEADER_BYTES {
        return (
            Op::Unsupported,
            Err(S3Error::new(S3ErrorCode::RequestHeaderSectionTooLarge)),
        );
    }
    let (parts, body) = req.into_parts();
    let host = parts
        .headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok());
    let target = match Target::parse_with_host(&parts.uri, host, &shard.settings.domains) {
        Ok(t) => t,
        Err(e) => return (Op::Unsupported, Err(e)),
    };
    let method = parts.method.clone();
    // Ops endpoints. Their names are reserved bucket names, so they never shadow a bucket.
    if method == Method::GET && target.key.is_none() && target.query.is_empty() {
        match target.bucket.as_deref() {
            Some("health") | Some("ready") => {
                return (
                    Op::Ops,
                    Ok(text(StatusCode::OK, "text/plain", "ok\n".into())),
                )
            }
            Some("metrics") => {
                let mut body = render(&shard.all_metrics);
                if let Some(c) = &cluster {
                    body.push_str(&c.render_metrics());
                }
                return (
                    Op::Ops,
                    Ok(text(StatusCode::OK, "text/plain; version=0.0.4", body)),
                );
            }
            _ => {}
        }
    }
    if method == Method::OPTIONS {
        // A CORS preflight: browsers send it without credentials.
        let r = super::cors::preflight(shard, target.bucket.as_deref(), &parts.headers);
        return (Op::CorsPreflight, r);
    }
    if !matches!(
        method,
        Method::GET | Method::HEAD | Method::PUT | Method::DELETE | Method::POST
    ) {
        return (
            Op::Unsupported,
            Err(S3Error::new(S3ErrorCode::MethodNotAllowed).msg(format!(
                "The method {method} is not allowed against this resource."
            ))),
        );
    }
    if let Some(sub) = target.unsupported_subresource() {
        return (
            Op::Unsupported,
            Err(S3Error::new(S3ErrorCode::NotImplemented)
                .msg(format!("The ?{sub} sub-resource is not implemented."))),
        );
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
        super::cluster::from_node(
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
        op: std::cell::Cell::new(Op::Unsupported),
        deleted_as: std::cell::Cell::new(None),
    };
    // Mooncake master's query endpoints: a GET of exactly `/get_all_segments`, `/query_key`
    // or `/batch_query_keys` (no valid bucket name holds `_`, so no bucket is shadowed).
    if let Some(endpoint) = super::mooncake::endpoint(&ctx.method, &ctx.target) {
        ctx.op.set(Op::MooncakeMaster);
        return (
            Op::MooncakeMaster,
            super::mooncake::serve(&ctx, endpoint).await,
        );
    }
    let own_api = !ctx.target.virtual_host
        && matches!(ctx.target.bucket.as_deref(), Some("v1") | Some("admin"));
    if own_api && matches!(ctx.identity(), Identity::Anonymous) {
        // ACLs open S3 buckets and objects only; the KV, cluster and admin APIs always
        // need credentials.
        return (
            Op::Unsupported,
            Err(S3Error::new(S3ErrorCode::AccessDenied)
                .msg("Anonymous access is not allowed here; sign the request or send a token.")),
        );
    }
    if method == Method::GET
        && ctx.target.bucket.as_deref() == Some("v1")
        && ctx.target.key.as_deref() == Some("cluster")
        && !ctx.target.virtual_host
    {
        // `?bucket=NAME`: a client routing a bucket this node may not have read from etcd yet.
        if let (Some(cluster), Some(b)) = (&ctx.cluster, ctx.target.param("bucket")) {
            if yutu_api::validate_bucket_name(b).is_ok() {
                super::cluster::know_bucket(&ctx, cluster, b).await;
            }
        }
        return (Op::Admin, super::cluster::membership(&ctx));
    }
    if ctx.target.bucket.as_deref() == Some("admin") && !ctx.target.virtual_host {
        return (Op::Admin, admin::route(&ctx, body).await);
    }
    // `v1` is not a valid bucket name, so the KV control API cannot shadow a bucket.
    if ctx.target.bucket.as_deref() == Some("v1") && !ctx.target.virtual_host {
        ctx.op.set(Op::Kv);
        return (Op::Kv, kv_api::route(&ctx, body).await);
    }
    let bucket = ctx.target.bucket.clone();
    let key = ctx.target.key.clone();
    match (bucket, key) {
        (None, _) => {
            if method != Method::GET {
                return (
                    Op::Unsupported,
                    Err(S3Error::new(S3ErrorCode::MethodNotAllowed)),
                );
            }
            ctx.op.set(Op::ListBuckets);
            let r = ctx
                .allow(Action::ListBuckets, None)
                .and_then(|_| buckets::list_buckets(&ctx));
            (Op::ListBuckets, r)
        }
        (Some(b), None) => {
            let t = &ctx.target;
            let (op, action) = match method {
                Method::PUT if t.has("acl") => (Op::PutBucketAcl, Action::WriteAcl),
                Method::GET if t.has("acl") => (Op::GetBucketAcl, Action::ReadAcl),
                Method::PUT if t.has("cors") => (Op::PutBucketCors, Action::Configure),
                Method::GET if t.has("cors") => (Op::GetBucketCors, Action::Configure),
                Method::DELETE if t.has("cors") => (Op::DeleteBucketCors, Action::Configure),
                Method::GET if t.has("policy") => (Op::GetBucketPolicy, Action::Configure),
                Method::PUT if t.has("policy") => (Op::PutBucketPolicy, Action::Configure),
                Method::DELETE if t.has("policy") => (Op::DeleteBucketPolicy, Action::Configure),
                Method::GET if t.has("policyStatus") => {
                    (Op::GetBucketPolicyStatus, Action::Configure)
                }
                Method::GET if t.has("publicAccessBlock") => {
                    (Op::GetPublicAccessBlock, Action::Configure)
                }
                Method::PUT if t.has("publicAccessBlock") => {
                    (Op::PutPublicAccessBlock, Action::Configure)
                }
                Method::DELETE if t.has("publicAccessBlock") => {
                    (Op::DeletePublicAccessBlock, Action::Configure)
                }
                Method::GET if t.has("ownershipControls") => {
                    (Op::GetBucketOwnershipControls, Action::Configure)
                }
                Method::PUT if t.has("ownershipControls") => {
                    (Op::PutBucketOwnershipControls, Action::Configure)
                }
                Method::DELETE if t.has("ownershipControls") => {
                    (Op::DeleteBucketOwnershipControls, Action::Configure)
                }
                Method::PUT => (Op::CreateBucket, Action::CreateBucket),
                Method::DELETE => (Op::DeleteBucket, Action::DeleteBucket),
                Method::HEAD => (Op::HeadBucket, Action::List),
                Method::POST if t.has("delete") => (Op::DeleteObjects, Action::Delete),
                // The form's signer is checked by the upload itself.
                Method::POST if super::post_object::is_form(&ctx) => {
                    (Op::PostObject, Action::ListBuckets)
                }
                Method::POST => (Op::Unsupported, Action::Write),
                _ if t.has("location") => (Op::GetBucketLocation, Action::List),
                _ if t.has("uploads") => (Op::ListMultipartUploads, Action::List),
                _ if t.has("versions") => (Op::ListObjectVersions, Action::List),
                _ => (Op::ListObjects, Action::List),
            };
            ctx.op.set(op);
            if let Some(cluster) = &ctx.cluster {
                super::cluster::know_bucket(&ctx, cluster, &b).await;
            }
            let r = async {
                if op == Op::PostObject {
                    if ctx.cluster.is_some() {
                        return Err(S3Error::new(S3ErrorCode::NotImplemented)
                            .msg("POST Object (form uploads) is not implemented in a cluster yet; upload with PUT."));
                    }
                    return super::post_object::post_object(&ctx, body, &b).await;
                }
                let incarnation = ctx.allow(action, Some(&b))?;
                super::acl::check_expected_owner(&ctx, &b)?;
                match op {
                    Op::CreateBucket => buckets::create(&ctx, body, &b).await,
                    Op::GetBucketAcl => super::acl::get_bucket_acl(&ctx, &b),
                    Op::PutBucketAcl => super::acl::put_bucket_acl(&ctx, body, &b).await,
                    Op::GetBucketCors => super::cors::get_bucket_cors(&ctx, &b),
                    Op::PutBucketCors => super::cors::put_bucket_cors(&ctx, body, &b).await,
                    Op::DeleteBucketCors => super::cors::delete_bucket_cors(&ctx, &b).await,
                    Op::GetBucketPolicy => bucket_policy::get_bucket_policy(&ctx, &b),
                    Op::PutBucketPolicy => bucket_policy::put_bucket_policy(&ctx, body, &b).await,
                    Op::DeleteBucketPolicy => bucket_policy::delete_bucket_policy(&ctx, &b).await,
                    Op::GetBucketPolicyStatus => {
                        bucket_policy::get_bucket_policy_status(&ctx, &b)
                    }
                    Op::GetPublicAccessBlock => bucket_policy::get_public_access_block(&ctx, &b),
                    Op::PutPublicAccessBlock => {
                        bucket_policy::put_public_access_block(&ctx, body, &b).await
                    }
                    Op::DeletePublicAccessBlock => {
                        bucket_policy::delete_public_access_block(&ctx, &b).await
                    }
                    Op::GetBucketOwnershipControls => ownership::get(&ctx, &b),
                    Op::PutBucketOwnershipControls => ownership::put(&ctx, body, &b).await,
                    Op::DeleteBucketOwnershipControls => ownership::delete(&ctx, &b).await,
                    Op::DeleteBucket if ctx.cluster.is_some() && ctx.peer.is_none() => {
                        super::cluster::delete_bucket(&ctx, &b).await
                    }
                    Op::DeleteBucket => buckets::delete(&ctx, &b).await,
                    Op::HeadBucket => buckets::head(&ctx, &b),
                    Op::DeleteObjects => {
                        delete_many::delete_objects(&ctx, body, &b, incarnation).await
                    }
                    Op::GetBucketLocation => buckets::location(&ctx, &b),
                    Op::ListMultipartUploads => multipart::list_uploads(&ctx, &b).await,
                    Op::ListObjectVersions => buckets::list_versions(&ctx, &b).await,
                    Op::ListObjects => buckets::list_objects(&ctx, &b).await,
                    _ => Err(S3Error::new(S3ErrorCode::NotImplemented)
                        .msg("This POST operation on a bucket is not implemented.")),
                }
            }
            .await
            .map_err(|e| e.bucket(&b));
            (op, r)
        }
        (Some(b), Some(k)) => {
            let t = &ctx.target;
            let copy = ctx.headers.contains_key("x-amz-copy-source");
            let (op, action) = match method {
                Method::PUT if t.has("acl") => (Op::PutObjectAcl, Action::WriteAcl),
                Method::GET if t.has("acl") => (Op::GetObjectAcl, Action::ReadAcl),
                Method::PUT if t.has("uploadId") && copy => (Op::UploadPartCopy, Action::Write),
                Method::PUT if t.has("uploadId") => (Op::UploadPart, Action::Write),
                Method::PUT if copy => (Op::CopyObject, Action::Write),
                Method::PUT => (Op::PutObject, Action::Write),
                Method::POST if t.has("uploads") => (Op::CreateMultipartUpload, Action::Write),
                Method::POST if t.has("uploadId") => (Op::CompleteMultipartUpload, Action::Write),
                Method::POST => (Op::Unsupported, Action::Write),
                Method::DELETE if t.has("uploadId") => (Op::AbortMultipartUpload, Action::Write),
                Method::DELETE => (Op::DeleteObject, Action::Delete),
                Method::HEAD => (Op::HeadObject, Action::Read),
                _ if t.has("uploadId") => (Op::ListParts, Action::List),
                // Reads metadata only: the permission of GetObject, as S3 asks for.
                _ if t.has("attributes") => (Op::GetObjectAttributes, Action::Read),
                _ => (Op::GetObject, Action::Read),
            };
            ctx.op.set(op);
            let mut body = Some(body);
            let mut replicate_to = Vec::new();
            let mut read_fallback = Vec::new();
            if let Some(cluster) = ctx.cluster.clone() {
                let prepared = async {
                    super::cluster::know_bucket(&ctx, &cluster, &b).await;
                    // An object's own ACL is checked where the object is.
                    ctx.allow_object(action, &b)?;
                    Ok::<_, S3Error>(())
                }
                .await;
                if let Err(e) = prepared {
                    return (op, Err(e.bucket(&b).key(&k)));
                }
                match super::cluster::plan(&ctx, &cluster, op, &b, &k) {
                    super::cluster::Plan::Local { replicate_to: to } => replicate_to = to,
                    super::cluster::Plan::LocalThen(others) => read_fallback = others,
                    super::cluster::Plan::Remote(owners) if super::cluster::coordinated(op) => {
                        let Some(incoming) = body.take() else {
                            return (op, Err(S3Error::new(S3ErrorCode::InternalError)));
                        };
                        match super::cluster::forward_write(&ctx, &cluster, &owners, incoming).await
                        {
                            super::cluster::Forwarded::Done(r) => {
                                return (op, r.map_err(|e| e.bucket(&b).key(&k)))
                            }
                            super::cluster::Forwarded::Here(incoming) => {
                                // The owners before this node do not answer: it
                                // coordinates, and the write is acknowledged only when every
                                // owner holds it, those down included (503 until their
                                // leases expire and the owners are recomputed without them).
                                body = Some(incoming);
                                if super::cluster::replicated(op) {
                                    replicate_to = owners
                                        .iter()
                                        .filter(|m| m.name != cluster.node)
                                        .cloned()
                                        .collect();
                                }
                            }
                        }
                    }
                    super::cluster::Plan::Remote(owners) => {
                        let r = super::cluster::forward_read(&ctx, &cluster, &owners).await;
                        return (op, r.map_err(|e| e.bucket(&b).key(&k)));
                    }
                    super::cluster::Plan::CatchingUp => {
                        return (
                            op,
                            Err(S3Error::new(S3ErrorCode::ServiceUnavailable)
                                .msg("This node is joining the cluster or catching up with the other owners of the key; retry, or ask another owner.")
                                .bucket(&b)
                                .key(&k)),
                        );
                    }
                    super::cluster::Plan::OthersFirst(others) => {
                        // This node may hold old copies (it joined again, and anti-entropy
                        // has not caught it up yet): an owner that is caught up answers;
                        // only when none answers is it served here.
                        if let Some(resp) =
                            super::cluster::read_from_others(&ctx, &cluster, &others, &b, &k).await
                        {
                            return (op, Ok(resp));
                        }
                    }
                }
                if super::cluster::coordinated(op)
                    && !ctx.is_replica_copy()
                    && !cluster.caught_up()
                    && cluster.shares(&b, &k)
                {
                    // Coordinating reads the key here first (conditions, ACL changes, copies
                    // onto themselves): with what may be old data, it could write that back
                    // as the newest version.
                    return (
                        op,
                        Err(S3Error::new(S3ErrorCode::ServiceUnavailable)
                            .msg("This node is catching up with the other owners of the key after joining the cluster; retry in a moment.")
                            .bucket(&b)
                            .key(&k)),
                    );
                }
                if super::cluster::coordinated(op) {
                    if let Err(e) = cluster.writable() {
                        crate::cluster::ClusterMetrics::inc(&cluster.metrics.writes_refused);
                        return (
                            op,
                            Err(S3Error::new(S3ErrorCode::ServiceUnavailable)
                                .msg(format!("{e}."))
                                .bucket(&b)
                                .key(&k)),
                        );
                    }
                }
            }
            let r = async {
                let (incarnation, gate) = ctx.allow_object(action, &b)?;
                let reads_the_acl = matches!(
                    op,
                    Op::GetObject | Op::HeadObject | Op::GetObjectAcl | Op::PutObjectAcl
                );
                if gate != Gate::Open && !reads_the_acl {
                    // Only these read the object's ACL before answering.
                    return Err(S3Error::new(S3ErrorCode::AccessDenied));
                }
                super::acl::check_expected_owner(&ctx, &b)?;
                let body = body
                    .take()
                    .ok_or_else(|| S3Error::new(S3ErrorCode::InternalError))?;
                match op {
                    Op::GetObjectAcl => super::acl::get_object_acl(&ctx, &b, &k, gate).await,
                    Op::PutObjectAcl => {
                        super::acl::put_object_acl(&ctx, body, &b, &k, gate, incarnation).await
                    }
                    Op::UploadPartCopy => multipart::upload_part_copy(&ctx, &b, &k).await,
                    Op::UploadPart => multipart::upload_part(&ctx, body, &b, &k).await,
                    Op::CopyObject => copy::copy_object(&ctx, &b, &k, incarnation).await,
                    Op::PutObject => objects::put(&ctx, body, &b, &k, incarnation).await,
                    Op::CreateMultipartUpload => multipart::create(&ctx, &b, &k).await,
                    Op::CompleteMultipartUpload => {
                        multipart::complete(&ctx, body, &b, &k, incarnation).await
                    }
                    Op::AbortMultipartUpload => multipart::abort(&ctx, &b, &k).await,
                    Op::DeleteObject => objects::delete(&ctx, &b, &k, incarnation).await,
                    Op::HeadObject => objects::get(&ctx, &b, &k, true, gate).await,
                    Op::ListParts => multipart::list_parts(&ctx, &b, &k).await,
                    Op::GetObject => objects::get(&ctx, &b, &k, false, gate).await,
                    Op::GetObjectAttributes => attributes::get_attributes(&ctx, &b, &k).await,
                    _ => Err(S3Error::new(S3ErrorCode::NotImplemented)
                        .msg("This POST operation on an object is not implemented.")),
                }
            }
            .await;
            let r = match (&ctx.cluster, r) {
                (Some(_), Err(e))
                    if ctx.peer.is_some()
                        && e.code == S3ErrorCode::NoSuchKey
                        && matches!(op, Op::GetObject | Op::HeadObject) =>
                {
                    Err(super::cluster::with_tombstone(&ctx, &b, &k, e).await)
                }
                (Some(cluster), Ok(resp))
                    if !replicate_to.is_empty() && resp.status().is_success() =>
                {
                    super::cluster::replicate(&ctx, cluster, op, &b, &k, &replicate_to)
                        .await
                        .map(|()| resp)
                }
                (Some(cluster), Err(e))
                    if !read_fallback.is_empty() && e.code == S3ErrorCode::NoSuchKey =>
                {
                    super::cluster::forward_read(&ctx, cluster, &read_fallback).await
                }
                (_, r) => r,
            };
            (op, r.map_err(|e| e.bucket(&b).key(&k)))
        }
    }
}
