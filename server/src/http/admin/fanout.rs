//! The admin API (`/admin/...`, admin users and admin tokens only): the KV snapshot the
//! conductor resyncs from, and the storage admin calls of [`yutu_api::admin`] (nodes, stats,
//! evict, pin, unpin, replicate, drain, status).
//!
//! Any node answers a storage admin call for the whole cluster: it sends the same call to
//! every member under `/admin/v1/local/...` (signed with its node token), where each node
//! does its own part (`local.rs`), and adds the answers up. A single node does its part
//! and answers.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use serde::de::DeserializeOwned;
use serde::Serialize;
use yutu_api::admin::{
    DrainProgress, DrainRequest, DrainResponse, EvictRequest, EvictResponse, NodeState, NodeStats,
    NodesResponse, PinRequest, PinResponse, ReplicateRequest, ReplicateResponse, StatusResponse,
    DRAIN_PATH, EVICT_PATH, LOCAL_PREFIX, NODES_PATH, PIN_PATH, REPLICATE_PATH, STATS_PATH,
    STATUS_PATH, UNPIN_PATH,
};
use yutu_api::cluster::Member;
use yutu_api::S3ErrorCode;

use super::local;
use crate::http::ctx::Ctx;
use crate::http::error::S3Error;
use crate::http::peer::call::{ask_all, MEMBER_TIMEOUT};
use crate::http::Resp;

/// Largest admin request body.
const MAX_BODY: u64 = 64 * 1024;
/// How long a member may take to report its stats (`nodes`, `stats`, `status`), connecting
/// included. Reporting is cheap, so a member that has not answered by then is stopped
/// (SIGSTOP), overloaded or cut off: it is reported unreachable, with the reason, rather than
/// holding the whole answer up to [`MEMBER_TIMEOUT`](crate::http::peer::call::MEMBER_TIMEOUT) (the kernel accepts connections for a
/// stopped process, so only a deadline tells it apart from a slow one).
const STATS_TIMEOUT: Duration = Duration::from_secs(2);

pub(in crate::http) fn json(value: &impl Serialize) -> Result<Resp, S3Error> {
    let body = serde_json::to_vec(value).map_err(|e| {
        tracing::error!(error = %e, "cannot encode an admin answer");
        S3Error::new(S3ErrorCode::InternalError)
    })?;
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_default())
}

pub(in crate::http) fn bad(msg: impl Into<String>) -> S3Error {
    S3Error::new(S3ErrorCode::InvalidArgument).msg(msg)
}

async fn parse<T: DeserializeOwned>(ctx: &Ctx, body: Incoming) -> Result<T, S3Error> {
    let raw = crate::http::body::read_limited(ctx, body, MAX_BODY).await?;
    serde_json::from_slice(&raw.data).map_err(|e| bad(format!("Malformed admin request: {e}.")))
}

/// Serves one admin API request (`/admin/...`).
pub async fn serve(ctx: &Ctx, body: Incoming) -> Result<Resp, S3Error> {
    if !ctx.identity().is_admin() {
        return Err(S3Error::new(S3ErrorCode::AccessDenied)
            .msg("The admin API needs an admin user or an admin token."));
    }
    let path = format!("/admin/{}", ctx.target.key.as_deref().unwrap_or_default());
    if path == yutu_api::events::SNAPSHOT_PATH && ctx.method == Method::GET {
        let snapshot = ctx
            .shard
            .run_async(0, |s| async move { crate::events::snapshot(&s).await })
            .await??;
        return json(&snapshot);
    }
    if let Some(call) = path.strip_prefix(LOCAL_PREFIX) {
        return local_call(ctx, call, body).await;
    }
    let m = &ctx.method;
    match path.as_str() {
        NODES_PATH | STATS_PATH if m == Method::GET => nodes_json(ctx).await,
        STATUS_PATH if m == Method::GET => json(&status(ctx).await?),
        EVICT_PATH if m == Method::POST => {
            let req: EvictRequest = parse(ctx, body).await?;
            json(&evict(ctx, req).await?)
        }
        PIN_PATH | UNPIN_PATH if m == Method::POST => {
            let req: PinRequest = parse(ctx, body).await?;
            json(&pin(ctx, &path, req).await?)
        }
        REPLICATE_PATH if m == Method::POST => {
            let req: ReplicateRequest = parse(ctx, body).await?;
            json(&replicate(ctx, req).await?)
        }
        DRAIN_PATH if m == Method::POST => {
            let req: DrainRequest = parse(ctx, body).await?;
            json(&drain(ctx, req).await?)
        }
        _ => Err(S3Error::new(S3ErrorCode::InvalidRequest).msg("Unknown admin endpoint.")),
    }
}

/// `/admin/v1/local/...`: this node's part of a call.
async fn local_call(ctx: &Ctx, call: &str, body: Incoming) -> Result<Resp, S3Error> {
    match (call, &ctx.method) {
        ("/stats", &Method::GET) => json(&local::stats(ctx).await?),
        ("/evict", &Method::POST) => json(&local::evict(ctx, parse(ctx, body).await?).await?),
        ("/pin", &Method::POST) => json(&local::pin(ctx, parse(ctx, body).await?, true).await?),
        ("/unpin", &Method::POST) => json(&local::pin(ctx, parse(ctx, body).await?, false).await?),
        ("/replicate", &Method::POST) => {
            json(&local::replicate(ctx, parse(ctx, body).await?).await?)
        }
        ("/list", &Method::POST) => json(&local::list(ctx, parse(ctx, body).await?).await?),
        ("/versions", &Method::POST) => json(&local::versions(ctx, parse(ctx, body).await?).await?),
        _ => Err(S3Error::new(S3ErrorCode::InvalidRequest).msg("Unknown admin endpoint.")),
    }
}

fn unreachable(member: &Member) -> NodeStats {
    NodeStats {
        name: member.name.clone(),
        url: member.url.clone(),
        zone: member.zone.clone(),
        state: NodeState::Unreachable,
        shards: Vec::new(),
        rebalancing: false,
        settled: false,
        rereplicated_keys: 0,
        rereplicated_bytes: 0,
        under_replicated: 0,
        handed_off: 0,
        reason: None,
    }
}

/// `GET /admin/v1/nodes` and `/stats`.
async fn nodes_json(ctx: &Ctx) -> Result<Resp, S3Error> {
    json(&nodes(ctx).await?)
}

/// Every member's stats, asked for in parallel, each within [`STATS_TIMEOUT`]: one that does
/// not answer in time is reported unreachable (never up), with the reason.
async fn nodes(ctx: &Ctx) -> Result<NodesResponse, S3Error> {
    let Some(cluster) = &ctx.cluster else {
        return Ok(NodesResponse {
            cluster: String::new(),
            revision: 0,
            nodes: vec![local::stats(ctx).await?],
        });
    };
    let view = cluster.view();
    let answers: Vec<Result<NodeStats, String>> = ask_all(
        cluster,
        &view.members,
        Method::GET,
        "/stats",
        None,
        STATS_TIMEOUT,
    )
    .await;
    let nodes = view
        .members
        .iter()
        .zip(answers)
        .map(|(m, a)| {
            a.unwrap_or_else(|e| {
                tracing::warn!(node = %m.name, error = %e, "a member did not answer the admin call");
                NodeStats {
                    reason: Some(e),
                    ..unreachable(m)
                }
            })
        })
        .collect();
    Ok(NodesResponse {
        cluster: cluster.settings.name.clone(),
        revision: view.revision,
        nodes,
    })
}

async fn status(ctx: &Ctx) -> Result<StatusResponse, S3Error> {
    let all = nodes(ctx).await?;
    let mut out = StatusResponse {
        cluster: all.cluster.clone(),
        revision: all.revision,
        members: all.nodes.len(),
        ..StatusResponse::default()
    };
    for n in &all.nodes {
        if n.rebalancing {
            out.rebalancing.push(n.name.clone());
        }
        out.under_replicated += n.under_replicated;
        out.rereplicated_keys += n.rereplicated_keys;
        out.rereplicated_bytes += n.rereplicated_bytes;
        match n.state {
            NodeState::Draining | NodeState::Drained => out.drains.push(DrainProgress {
                node: n.name.clone(),
                state: n.state,
                remaining: n.shards.iter().map(|s| s.objects).sum(),
            }),
            NodeState::Unreachable => out.unreachable.push(n.name.clone()),
            NodeState::Up => {}
        }
    }
    Ok(out)
}

/// Sends a body-carrying call to every member (or does it here, alone) and folds the answers.
async fn fan_out<Q: Serialize, T: DeserializeOwned + Default>(
    ctx: &Ctx,
    members: Option<Vec<Member>>,
    call: &str,
    req: &Q,
    fold: impl Fn(&mut T, T),
) -> Result<T, S3Error> {
    let Some(cluster) = &ctx.cluster else {
        return Err(S3Error::new(S3ErrorCode::InternalError));
    };
    let members = members.unwrap_or_else(|| cluster.view().members.clone());
    let body = serde_json::to_vec(req).map_err(|e| bad(e.to_string()))?;
    let answers: Vec<Result<T, String>> = ask_all(
        cluster,
        &members,
        Method::POST,
        call,
        Some(body),
        MEMBER_TIMEOUT,
    )
    .await;
    let mut total = T::default();
    let mut failed = Vec::new();
    for (m, a) in members.iter().zip(answers) {
        match a {
            Ok(part) => fold(&mut total, part),
            Err(e) => failed.push(format!("{}: {e}", m.name)),
        }
    }
    if failed.is_empty() {
        Ok(total)
    } else {
        Err(S3Error::new(S3ErrorCode::ServiceUnavailable).msg(format!(
            "Not every member did its part ({}); the call may be partly applied. Retry it.",
            failed.join("; ")
        )))
    }
}

fn check_bucket(bucket: &str) -> Result<(), S3Error> {
    yutu_api::validate_bucket_name(bucket).map_err(|e| bad(format!("{e}.")))
}

fn check_target(key: &Option<String>, prefix: &Option<String>) -> Result<(), S3Error> {
    if key.is_some() && prefix.is_some() {
        return Err(bad("Give a key or a prefix, not both."));
    }
    if let Some(k) = key {
        crate::http::s3::objects::check_key(k)?;
    }
    Ok(())
}

async fn evict(ctx: &Ctx, req: EvictRequest) -> Result<EvictResponse, S3Error> {
    match (&req.bucket, req.free_bytes) {
        (Some(b), None) => {
            check_bucket(b)?;
            check_target(&req.key, &req.prefix)?;
        }
        (None, Some(_)) => {
            if req.key.is_some() || req.prefix.is_some() {
                return Err(bad("free_bytes takes a node, not keys."));
            }
        }
        _ => {
            return Err(bad(
                "Give a bucket (with a key or prefix), or free_bytes and a node.",
            ))
        }
    }
    let members = match (&ctx.cluster, &req.node) {
        (Some(c), Some(node)) => {
            Some(vec![c.view().member(node).cloned().ok_or_else(|| {
                bad(format!("No member is named {node:?}."))
            })?])
        }
        (None, Some(node)) if *node != ctx.shard.settings.node_name => {
            return Err(bad(format!(
                "This node is {:?}, not {node:?}.",
                ctx.shard.settings.node_name
            )))
        }
        _ => None,
    };
    if ctx.cluster.is_none() {
        return local::evict(ctx, req).await;
    }
    fan_out(ctx, members, "/evict", &req, |t: &mut EvictResponse, p| {
        t.objects += p.objects;
        t.bytes += p.bytes;
        t.pinned_skipped += p.pinned_skipped;
    })
    .await
}

async fn pin(ctx: &Ctx, path: &str, req: PinRequest) -> Result<PinResponse, S3Error> {
    check_bucket(&req.bucket)?;
    check_target(&req.key, &req.prefix)?;
    if req.key.is_none() && req.prefix.is_none() {
        return Err(bad("Give a key or a prefix."));
    }
    let pinning = path == PIN_PATH;
    if !pinning && req.ttl_secs.is_some() {
        return Err(bad("unpin takes no ttl_secs."));
    }
    if req.ttl_secs == Some(0) {
        return Err(bad("ttl_secs must be positive."));
    }
    if ctx.cluster.is_none() {
        return local::pin(ctx, req, pinning).await;
    }
    let call = if pinning { "/pin" } else { "/unpin" };
    fan_out(ctx, None, call, &req, |t: &mut PinResponse, p| {
        t.keys += p.keys
    })
    .await
}

async fn replicate(ctx: &Ctx, req: ReplicateRequest) -> Result<ReplicateResponse, S3Error> {
    check_bucket(&req.bucket)?;
    check_target(&req.key, &req.prefix)?;
    if req.key.is_none() && req.prefix.is_none() {
        return Err(bad("Give a key or a prefix."));
    }
    let Some(cluster) = &ctx.cluster else {
        return Err(bad(
            "replicate needs a cluster (start the node with --etcd).",
        ));
    };
    let view = cluster.view();
    match (&req.replicas, &req.node) {
        (Some(n), None) if (1..=view.members.len() as u32).contains(n) => {}
        (Some(n), None) => {
            return Err(bad(format!(
                "replicas {n} is out of range: 1 to {} (the members).",
                view.members.len()
            )))
        }
        (None, Some(node)) if view.member(node).is_some() => {}
        (None, Some(node)) => return Err(bad(format!("No member is named {node:?}."))),
        _ => return Err(bad("Give replicas or a node, not both.")),
    }
    fan_out(
        ctx,
        None,
        "/replicate",
        &req,
        |t: &mut ReplicateResponse, p| {
            t.keys += p.keys;
            t.copies += p.copies;
            t.bytes += p.bytes;
        },
    )
    .await
}

async fn drain(ctx: &Ctx, req: DrainRequest) -> Result<DrainResponse, S3Error> {
    let Some(cluster) = &ctx.cluster else {
        return Err(bad("drain needs a cluster (start the node with --etcd)."));
    };
    if cluster.view().member(&req.node).is_none() {
        return Err(bad(format!("No member is named {:?}.", req.node)));
    }
    crate::cluster::set_draining(cluster, &req.node, !req.cancel)
        .await
        .map_err(|e| {
            S3Error::new(S3ErrorCode::ServiceUnavailable)
                .msg(format!("Cannot record the drain in etcd: {e}."))
        })?;
    // Seen by this node at once; the others read it from etcd.
    cluster.set_draining_locally(&req.node, !req.cancel);
    tracing::info!(node = %req.node, cancel = req.cancel, "drain requested");
    Ok(DrainResponse {
        node: req.node,
        state: if req.cancel {
            NodeState::Up
        } else {
            NodeState::Draining
        },
    })
}
