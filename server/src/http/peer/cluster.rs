//! Object requests in a cluster: which node serves them, forwarding to it, and replicating
//! writes to the other owners before they are acknowledged.
//!
//! Every node accepts every request. For a key of a cluster bucket the owners are the first N
//! members by rendezvous hashing ([`crate::cluster::View::owners`]):
//! - a write (and every multipart step, whose upload lives on one node) goes to the first
//!   owner that accepts a connection, the *coordinator*; it applies the write and then sends
//!   the object (or the delete) to the other owners, and answers the client only when all of
//!   them have it. An owner that cannot be reached fails the write (503, retryable): the write
//!   is never acknowledged with fewer than N copies.
//! - a read is served here when this node is an owner, otherwise by the first owner that
//!   answers; a refused connection or a 5xx moves on to the next owner at once, and so does a
//!   404 (an owner that joined recently may not have the key yet).
//!
//! A request from another node (a forward or a replica, proved by a node token signed with the
//! cluster key) is always served locally, so a request crosses at most one extra hop and
//! cannot loop.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};
use yutu_api::cluster::{
    Member, FORWARDED_HEADER, NODE_TOKEN_HEADER, REPLICA_HEADER, REPLICA_META_HEADER,
    VERSION_HEADER,
};
use yutu_api::S3ErrorCode;

use super::forward::{self, ProxyBody};
use crate::auth::tokens::TokenVerifier;
use crate::auth::Identity;
use crate::cluster::replica;
use crate::cluster::{Cluster, ClusterMetrics, Lookup, NODE_SUBJECT_PREFIX};
use crate::http::common::unavailable;
use crate::http::ctx::Ctx;
use crate::http::endpoint::Op;
use crate::http::error::S3Error;
use crate::http::Resp;
use crate::model::conditions::ReadConditions;
use crate::model::Version;

/// The name of the node that sent this request, when it proves to be one of the cluster's.
pub fn from_node(
    cluster: &Cluster,
    no_auth: bool,
    tokens: &TokenVerifier,
    headers: &HeaderMap,
    identity: &Identity,
) -> Option<String> {
    let claimed = headers.get(FORWARDED_HEADER)?.to_str().ok()?.to_string();
    if no_auth {
        // Nothing is checked on an open node; the header only stops loops.
        return Some(claimed);
    }
    let is_node = |sub: &str, admin: bool| admin && sub.starts_with(NODE_SUBJECT_PREFIX);
    if let Identity::Token(c) = identity {
        if is_node(&c.sub, c.admin) {
            return Some(claimed);
        }
    }
    let token = headers.get(NODE_TOKEN_HEADER)?.to_str().ok()?;
    let claims = tokens.verify(token.trim()).ok()?;
    is_node(&claims.sub, claims.admin)
        .then_some(claimed)
        .filter(|_| cluster.settings.key.is_some())
}

/// Operations that change the key, and those that must reach the node holding the key's
/// multipart uploads: all go to the coordinator.
pub fn coordinated(op: Op) -> bool {
    matches!(
        op,
        Op::PutObject
            | Op::CopyObject
            | Op::DeleteObject
            | Op::CreateMultipartUpload
            | Op::UploadPart
            | Op::UploadPartCopy
            | Op::CompleteMultipartUpload
            | Op::AbortMultipartUpload
            | Op::ListParts
            | Op::PutObjectAcl
    )
}

/// Writes whose result the coordinator copies to the other owners.
pub fn replicated(op: Op) -> bool {
    matches!(
        op,
        Op::PutObject
            | Op::CopyObject
            | Op::DeleteObject
            | Op::CompleteMultipartUpload
            | Op::PutObjectAcl
    )
}

/// What to do with one object request.
pub enum Plan {
    /// Serve it here; then, for a replicated write, copy it to these owners.
    Local { replicate_to: Vec<Member> },
    /// Serve it here, and for a read that finds nothing try these owners.
    LocalThen(Vec<Member>),
    /// Send it to the first of these that can be reached (this node may be among them, for
    /// writes, when the owners before it are down).
    Remote(Vec<Member>),
    /// A read of a key this node owns while it is not caught up ([`Cluster::caught_up`]):
    /// ask these other owners first, and serve it here only when none answers.
    OthersFirst(Vec<Member>),
    /// A read another node forwarded here while this node is not caught up: answered 503,
    /// so that the forwarding node asks the next owner instead of getting old data.
    CatchingUp,
}

pub fn plan(ctx: &Ctx, cluster: &Cluster, op: Op, bucket: &str, key: &str) -> Plan {
    let local = Plan::Local {
        replicate_to: Vec::new(),
    };
    if ctx.peer.is_some() {
        let internal = ctx.headers.contains_key(REPLICA_HEADER);
        if !internal
            && !coordinated(op)
            && (cluster.view().revision == 0
                || (!cluster.caught_up() && cluster.shares(bucket, key)))
        {
            return Plan::CatchingUp;
        }
        if internal || !replicated(op) {
            return local;
        }
        // Forwarded to this node as the coordinator.
        let view = cluster.view();
        let others = view
            .owners(bucket, key)
            .map(|o| {
                o.into_iter()
                    .filter(|m| m.name != cluster.node)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        return Plan::Local {
            replicate_to: others,
        };
    }
    let view = cluster.view();
    if view.revision == 0 {
        // Started, but etcd not read yet: whose keys are whose is unknown, and what this
        // node holds may be old. The client retries (503) in a moment.
        return Plan::CatchingUp;
    }
    let Some(owners) = view.owners(bucket, key) else {
        return local;
    };
    let me = owners.iter().position(|m| m.name == cluster.node);
    if coordinated(op) {
        if me == Some(0) {
            let others = owners[1..].iter().map(|m| (*m).clone()).collect();
            return if replicated(op) {
                Plan::Local {
                    replicate_to: others,
                }
            } else {
                local
            };
        }
        return Plan::Remote(owners.into_iter().cloned().collect());
    }
    match me {
        Some(i) if owners.len() > 1 && !cluster.caught_up() => Plan::OthersFirst(
            owners
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, m)| (*m).clone())
                .collect(),
        ),
        Some(i) => Plan::LocalThen(
            owners
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, m)| (*m).clone())
                .collect(),
        ),
        None => Plan::Remote(owners.into_iter().cloned().collect()),
    }
}

/// What became of a forwarded request.
pub enum Forwarded {
    Done(Result<Resp, S3Error>),
    /// The owners before this node could not be reached: serve it here (with its body).
    Here(hyper::body::Incoming),
}

/// How long an exchange with a peer may take: the client's body at the slowest allowed rate,
/// plus the peer's own work.
fn exchange_timeout(ctx: &Ctx) -> Duration {
    let len = ctx
        .header("content-length")
        .and_then(|l| l.parse::<u64>().ok())
        .unwrap_or(0);
    ctx.shard.settings.body.deadline(len) + Duration::from_secs(30)
}

fn reply_limit(ctx: &Ctx) -> u64 {
    ctx.shard.settings.max_object_size + (1 << 20)
}

/// The request as it goes to an owner: the client's method, target and headers (its signature
/// stays valid: the owner checks it itself) plus this node's name and token.
pub(in crate::http) fn outgoing(
    ctx: &Ctx,
    cluster: &Cluster,
    body: ProxyBody,
) -> Result<http::Request<ProxyBody>, S3Error> {
    let target = ctx
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let mut req = http::Request::builder()
        .method(ctx.method.clone())
        .uri(target)
        .body(body)
        .map_err(|e| S3Error::new(S3ErrorCode::InternalError).msg(e.to_string()))?;
    let headers = req.headers_mut();
    *headers = forward::end_to_end(&ctx.headers);
    // What a client sent in the cluster's own headers is not passed on as if a node said it.
    for h in [
        REPLICA_HEADER,
        NODE_TOKEN_HEADER,
        REPLICA_META_HEADER,
        VERSION_HEADER,
    ] {
        headers.remove(h);
    }
    forward::set(headers, FORWARDED_HEADER, &cluster.node);
    if let Some(token) = cluster.node_token() {
        forward::set(headers, NODE_TOKEN_HEADER, &token);
    }
    Ok(req)
}

/// Forwards a write (or a multipart step) to the first owner that accepts a connection.
pub async fn forward_write(
    ctx: &Ctx,
    cluster: &Arc<Cluster>,
    owners: &[Member],
    body: hyper::body::Incoming,
) -> Forwarded {
    let mut failures = Vec::new();
    for owner in owners {
        if owner.name == cluster.node {
            return Forwarded::Here(body);
        }
        let Some(peer) = forward::authority(&owner.url) else {
            failures.push(format!("{}: URL {} is not http://", owner.name, owner.url));
            continue;
        };
        let sender = match forward::connect(peer).await {
            Ok(s) => s,
            Err(e) => {
                ClusterMetrics::inc(&cluster.metrics.forward_failures);
                tracing::debug!(owner = %owner.name, error = %e, "owner unreachable; trying the next");
                failures.push(e.to_string());
                continue;
            }
        };
        ClusterMetrics::inc(&cluster.metrics.forwarded);
        let req = match outgoing(ctx, cluster, forward::incoming_body(body)) {
            Ok(r) => r,
            Err(e) => return Forwarded::Done(Err(e)),
        };
        let result =
            forward::exchange(peer, sender, req, exchange_timeout(ctx), reply_limit(ctx)).await;
        return Forwarded::Done(result.map_err(|e| {
            ClusterMetrics::inc(&cluster.metrics.forward_failures);
            unavailable(format!(
                "The owner of this key failed during the request ({e}); it may or may not have been applied. Retry it."
            ))
        }));
    }
    Forwarded::Done(Err(unavailable(format!(
        "No owner of this key can be reached: {}.",
        failures.join("; ")
    ))))
}

/// Forwards a read to the owners in turn until one has the object.
pub async fn forward_read(
    ctx: &Ctx,
    cluster: &Arc<Cluster>,
    owners: &[Member],
) -> Result<Resp, S3Error> {
    let mut last: Option<Resp> = None;
    let mut failures = Vec::new();
    for owner in owners.iter().filter(|m| m.name != cluster.node) {
        let Some(peer) = forward::authority(&owner.url) else {
            continue;
        };
        let sender = match forward::connect(peer).await {
            Ok(s) => s,
            Err(e) => {
                ClusterMetrics::inc(&cluster.metrics.forward_failures);
                failures.push(e.to_string());
                continue;
            }
        };
        ClusterMetrics::inc(&cluster.metrics.forwarded);
        let req = outgoing(ctx, cluster, forward::empty_body())?;
        match forward::exchange(peer, sender, req, exchange_timeout(ctx), reply_limit(ctx)).await {
            Ok(resp)
                if resp.status().is_server_error() || resp.status() == StatusCode::NOT_FOUND =>
            {
                // A 404 naming a delete is the most telling answer kept: it says the key is
                // gone, not that this owner has not got it yet.
                let keeps_tombstone = last.as_ref().is_some_and(|l| {
                    l.status() == StatusCode::NOT_FOUND && l.headers().contains_key(VERSION_HEADER)
                });
                if !keeps_tombstone {
                    last = Some(resp);
                }
            }
            Ok(resp) => return Ok(resp),
            Err(e) => {
                ClusterMetrics::inc(&cluster.metrics.forward_failures);
                failures.push(e.to_string());
            }
        }
    }
    match last {
        Some(resp) => Ok(resp),
        None => Err(unavailable(format!(
            "No owner of this key can be reached: {}.",
            failures.join("; ")
        ))),
    }
}

/// The version this node holds of `bucket/key` (object or tombstone), from its shard.
async fn local_version(ctx: &Ctx, bucket: &str, key: &str) -> Option<(Version, bool)> {
    let (b, k) = (bucket.to_string(), key.to_string());
    ctx.shard
        .run_step(ctx.shard.owner(bucket, key), move |s| {
            crate::tier::Step::Done(s.tier.version_of(&b, &k))
        })
        .await
        .ok()
        .flatten()
}

/// A 404 answered to another node names the delete's version when a tombstone is held: the
/// asking node can tell "deleted" from "not here yet".
pub async fn with_tombstone(ctx: &Ctx, bucket: &str, key: &str, mut e: S3Error) -> S3Error {
    if let Some((v, true)) = local_version(ctx, bucket, key).await {
        if let Ok(name) = http::header::HeaderName::from_bytes(VERSION_HEADER.as_bytes()) {
            e.headers.push((name, v.to_text()));
        }
    }
    e
}

/// A read of a key this node owns while it is not caught up: the other owners' answer when
/// it is authoritative (the object, or a 404 of a delete newer than what is held here),
/// `None` when the read is to be served here (no other owner answered, or none holds the key
/// and none knows it deleted).
pub async fn read_from_others(
    ctx: &Ctx,
    cluster: &Arc<Cluster>,
    others: &[Member],
    bucket: &str,
    key: &str,
) -> Option<Resp> {
    let resp = forward_read(ctx, cluster, others).await.ok()?;
    let status = resp.status();
    if status.is_server_error() {
        return None;
    }
    if status != StatusCode::NOT_FOUND {
        return Some(resp);
    }
    let deleted = resp
        .headers()
        .get(VERSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(Version::parse)?;
    match local_version(ctx, bucket, key).await {
        Some((held, false)) if held > deleted => None,
        _ => Some(resp),
    }
}

/// Copies the result of a write the coordinator has just applied to the other owners; fails
/// if any of them does not confirm.
pub async fn replicate(
    ctx: &Ctx,
    cluster: &Arc<Cluster>,
    op: Op,
    bucket: &str,
    key: &str,
    to: &[Member],
) -> Result<(), S3Error> {
    if to.is_empty() {
        return Ok(());
    }
    let object = if op == Op::DeleteObject {
        None
    } else {
        let (b, k) = (bucket.to_string(), key.to_string());
        let found = ctx
            .shard
            .run_step(ctx.shard.owner(bucket, key), move |s| {
                s.tier.get(b, k, None, false, ReadConditions::default())
            })
            .await?;
        match found {
            Ok((meta, _, data)) => Some((meta, data)),
            // Deleted again meanwhile: the later delete replicates itself.
            Err(crate::model::StoreError::NoSuchKey) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    };
    let sends = to.iter().map(|owner| {
        let object = object.clone();
        async move {
            match object {
                Some((meta, data)) => {
                    replica::push(cluster, owner, bucket, key, &meta, data, false)
                        .await
                        .map(|_| ())
                }
                None => {
                    let version = ctx
                        .deleted_as
                        .get()
                        .unwrap_or_else(|| crate::model::version::CLOCK.now());
                    replica::remove(cluster, owner, bucket, key, version).await
                }
            }
        }
    });
    let results = futures::future::join_all(sends).await;
    let mut failed: Vec<String> = Vec::new();
    for (owner, r) in to.iter().zip(results) {
        if let Err(e) = r {
            // Applied here but not there: sent again until it lands (a hint).
            cluster.hint(&owner.name, bucket, key);
            failed.push(e.to_string());
        }
    }
    let sent = to.len() - failed.len();
    cluster
        .metrics
        .replicated
        .fetch_add(sent as u64, std::sync::atomic::Ordering::Relaxed);
    if failed.is_empty() {
        return Ok(());
    }
    cluster
        .metrics
        .replication_failures
        .fetch_add(failed.len() as u64, std::sync::atomic::Ordering::Relaxed);
    tracing::warn!(bucket, key, failed = ?failed, "replication failed; the write is not acknowledged");
    Err(unavailable(format!(
        "The write reached this node but not every replica ({}); it is not acknowledged. Retry it.",
        failed.join("; ")
    )))
}

fn json_response(value: &impl serde::Serialize) -> Result<Resp, S3Error> {
    let body = serde_json::to_vec(value)
        .map_err(|e| S3Error::new(S3ErrorCode::InternalError).msg(e.to_string()))?;
    Ok(http::Response::builder()
        .status(StatusCode::OK)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(http_body_util::Full::new(Bytes::from(body)))
        .unwrap_or_default())
}

/// `GET /v1/cluster`: the membership a client routes itself with (any authenticated caller;
/// it names the nodes and their URLs, nothing stored on them). A single node answers with no
/// members: the client talks to it directly.
pub fn membership(ctx: &Ctx) -> Result<Resp, S3Error> {
    match &ctx.cluster {
        Some(c) => json_response(&c.membership()),
        None => json_response(&yutu_api::cluster::Membership {
            node: ctx.shard.settings.node_name.clone(),
            ..Default::default()
        }),
    }
}

/// Makes sure this node's view has a cluster bucket created through another node moments
/// ago: its replica count decides where a write goes.
///
/// The view, not the local bucket list, is what must know it. A node creates a bucket it
/// reads from etcd locally first and puts it into its view after: in between, a write it
/// coordinated found the bucket but no owners, and was stored here alone (acknowledged with
/// one copy). A local bucket from before the node joined is in no view either: etcd is asked
/// about a name the view lacks at most once a second, or every time while this node is
/// mirroring it (its view is about to have it).
pub async fn know_bucket(ctx: &Ctx, cluster: &Arc<Cluster>, bucket: &str) {
    if cluster.view().buckets.contains_key(bucket)
        || (cluster.recent_lookup(bucket).is_some() && !cluster.is_mirrored(bucket))
    {
        return;
    }
    match crate::cluster::buckets::ensure(&ctx.shard, cluster, bucket).await {
        Ok(true) => {}
        Ok(false) => cluster.note_lookup(bucket, Lookup::Absent),
        Err(e) => {
            cluster.note_lookup(bucket, Lookup::Failed);
            tracing::warn!(bucket, error = %e, "cannot look the bucket up in etcd");
        }
    }
}

/// Whether this node can coordinate a write to `bucket`: its view has the bucket (and so its
/// replica count), or etcd said it has no such bucket (a local bucket of this node, written
/// here alone). When etcd could not be asked, writing here alone could acknowledge a write
/// of a replicated bucket with one copy.
pub fn bucket_placed(cluster: &Cluster, bucket: &str) -> Result<(), S3Error> {
    if cluster.view().buckets.contains_key(bucket)
        || cluster.recent_lookup(bucket) == Some(Lookup::Absent)
    {
        return Ok(());
    }
    Err(S3Error::new(S3ErrorCode::ServiceUnavailable).msg(format!(
        "This node has not read bucket {bucket}'s replica count from etcd yet (etcd does not \
         answer); retry, or write through another node."
    )))
}

/// The other members' pages of a cluster bucket's listing. A member that does not answer is
/// left out (its keys are on their other owners when the bucket has replicas) and logged.
pub async fn member_pages(
    cluster: &Arc<Cluster>,
    bucket: &str,
    query: &crate::model::listing::ListQuery,
) -> Vec<Vec<crate::model::listing::ListItem>> {
    use crate::model::listing::ListItem;
    use yutu_api::admin::{LocalListEntry, LocalListRequest};
    let req = LocalListRequest {
        bucket: bucket.to_string(),
        prefix: query.prefix.clone(),
        delimiter: query.delimiter.clone(),
        after: query.after.clone(),
        limit: query.limit,
    };
    let Ok(body) = serde_json::to_vec(&req) else {
        return Vec::new();
    };
    let view = cluster.view();
    let others: Vec<&Member> = view
        .members
        .iter()
        .filter(|m| m.name != cluster.node)
        .collect();
    let calls = others.iter().map(|m| {
        super::call::ask::<Vec<LocalListEntry>>(
            cluster,
            m,
            Method::POST,
            "/list",
            Some(body.clone()),
        )
    });
    let answers = futures::future::join_all(calls).await;
    let mut pages = Vec::new();
    for (m, a) in others.iter().zip(answers) {
        match a {
            Ok(entries) => pages.push(
                entries
                    .into_iter()
                    .map(|e| {
                        if e.prefix {
                            ListItem::Prefix(e.name)
                        } else {
                            ListItem::Object {
                                key: e.name,
                                size: e.size,
                                etag: e.etag,
                                last_modified: std::time::UNIX_EPOCH
                                    + Duration::from_millis(e.modified_ms),
                            }
                        }
                    })
                    .collect(),
            ),
            Err(e) => {
                ClusterMetrics::inc(&cluster.metrics.forward_failures);
                tracing::warn!(node = %m.name, error = %e, "a member did not answer a listing; it is left out");
            }
        }
    }
    pages
}

/// Deletes `keys` (grouped by local shard) on every other owner as of `version`, for
/// DeleteObjects; the keys some owner could not delete are moved to `errors` and left out of
/// the answer.
pub async fn delete_elsewhere(
    cluster: &Arc<Cluster>,
    bucket: &str,
    version: crate::model::Version,
    by_shard: std::collections::BTreeMap<usize, Vec<String>>,
    errors: &mut Vec<yutu_api::xml::DeleteError>,
) -> std::collections::BTreeMap<usize, Vec<String>> {
    let view = cluster.view();
    if !view.buckets.contains_key(bucket) {
        return by_shard;
    }
    let mut kept = std::collections::BTreeMap::new();
    for (shard, keys) in by_shard {
        let mut ok_keys = Vec::new();
        for chunk in keys.chunks(32) {
            let calls = chunk.iter().map(|key| {
                let owners: Vec<Member> = view
                    .owners(bucket, key)
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|m| m.name != cluster.node)
                    .cloned()
                    .collect();
                async move {
                    for o in &owners {
                        replica::remove(cluster, o, bucket, key, version).await?;
                    }
                    Ok::<(), replica::ReplicaError>(())
                }
            });
            let results = futures::future::join_all(calls).await;
            for (key, r) in chunk.iter().zip(results) {
                match r {
                    Ok(()) => ok_keys.push(key.clone()),
                    Err(e) => errors.push(yutu_api::xml::DeleteError {
                        key: key.clone(),
                        code: "ServiceUnavailable".into(),
                        message: format!("An owner of the key could not delete it: {e}."),
                    }),
                }
            }
        }
        kept.insert(shard, ok_keys);
    }
    kept
}

/// A copy source this node does not hold, read from its owners (whole, then cut to `range`,
/// with the copy-source conditions checked here), as the local read would answer it.
pub async fn fetch_source(
    cluster: &Arc<Cluster>,
    bucket: &str,
    key: &str,
    range: Option<yutu_api::RangeSpec>,
    cond: &ReadConditions,
) -> Result<crate::model::GetResult, S3Error> {
    use crate::model::StoreError;
    let view = cluster.view();
    let Some(owners) = view.owners(bucket, key) else {
        return Ok(Err(StoreError::NoSuchKey));
    };
    let mut failure = None;
    for owner in owners.into_iter().filter(|m| m.name != cluster.node) {
        match replica::fetch(cluster, owner, bucket, key).await {
            Ok(Some((meta, data))) => {
                if let Err(f) = cond.check(&meta.etag, meta.last_modified) {
                    return Ok(Err(match f {
                        crate::model::conditions::Failed::NotModified => {
                            StoreError::NotModified(Arc::new(meta))
                        }
                        crate::model::conditions::Failed::Precondition => {
                            StoreError::PreconditionFailed
                        }
                    }));
                }
                let size = data.len() as u64;
                let resolved = match range {
                    None => None,
                    Some(r) => match r.resolve(size) {
                        Some(b) => Some(b),
                        None => return Ok(Err(StoreError::InvalidRange { size })),
                    },
                };
                let data = match resolved {
                    Some(b) => data.slice(b.start as usize..b.end as usize),
                    None => data,
                };
                return Ok(Ok((Arc::new(meta), resolved, data)));
            }
            Ok(None) => {}
            Err(e) => failure = Some(e),
        }
    }
    match failure {
        Some(e) => Err(unavailable(format!(
            "The copy source is on other nodes, and none could be read: {e}."
        ))),
        None => Ok(Err(StoreError::NoSuchKey)),
    }
}
