//! The cluster's wrapper around an object request: before it is served here, where it must
//! be served ([`coordinate`]: here, forwarded to an owner, or refused while this node catches
//! up), and after, what the cluster adds to the answer ([`finish`]: the copies to the other
//! owners, a tombstone's version, the other owners' copy of a key this node lacks).
//!
//! The rules themselves (who owns a key, which writes are coordinated and replicated) are in
//! `cluster.rs`; this module only applies them to one request.

use std::sync::Arc;

use hyper::body::Incoming;
use yutu_api::cluster::Member;
use yutu_api::S3ErrorCode;

use super::cluster::{self, Forwarded, Plan};
use crate::cluster::{Cluster, ClusterMetrics};
use crate::http::ctx::{Allowed, Ctx};
use crate::http::endpoint::action;
use crate::http::endpoint::Op;
use crate::http::error::S3Error;
use crate::http::Resp;

/// Where an object request goes next.
pub enum Next {
    /// Answered without serving it here (forwarded, or refused).
    Answered(Result<Resp, S3Error>),
    /// Serve it here with `body`, then call [`finish`] with `after`. `allowed` is the
    /// permission check already made ([`Ctx::allow_object`]), so that serving the request
    /// does not check it again.
    Here {
        body: Incoming,
        after: After,
        allowed: Allowed,
    },
}

/// What the cluster does once the request was served here.
#[derive(Default)]
pub struct After {
    /// A replicated write that succeeded is copied to these owners before it is answered.
    replicate_to: Vec<Member>,
    /// A read that finds nothing here is asked of these owners.
    read_fallback: Vec<Member>,
}

/// Decides where a request for object `b/k` is served.
pub async fn coordinate(
    ctx: &Ctx,
    cluster: &Arc<Cluster>,
    op: Op,
    b: &str,
    k: &str,
    body: Incoming,
) -> Next {
    cluster::know_bucket(ctx, cluster, b).await;
    // An object's own ACL is checked where the object is.
    let allowed = match ctx.allow_object(action(op), b) {
        Ok(a) => a,
        Err(e) => return Next::Answered(Err(e)),
    };
    let mut after = After::default();
    let mut body = body;
    match cluster::plan(ctx, cluster, op, b, k) {
        Plan::Local { replicate_to } => after.replicate_to = replicate_to,
        Plan::LocalThen(others) => after.read_fallback = others,
        Plan::Remote(owners) if cluster::coordinated(op) => {
            match cluster::forward_write(ctx, cluster, &owners, body).await {
                Forwarded::Done(r) => return Next::Answered(r),
                Forwarded::Here(incoming) => {
                    // The owners before this node do not answer: it coordinates, and the
                    // write is acknowledged only when every owner holds it, those down
                    // included (503 until their leases expire and the owners are recomputed
                    // without them).
                    body = incoming;
                    if cluster::replicated(op) {
                        after.replicate_to = owners
                            .iter()
                            .filter(|m| m.name != cluster.node)
                            .cloned()
                            .collect();
                    }
                }
            }
        }
        Plan::Remote(owners) => {
            return Next::Answered(cluster::forward_read(ctx, cluster, &owners).await)
        }
        Plan::CatchingUp => {
            return Next::Answered(Err(S3Error::new(S3ErrorCode::ServiceUnavailable).msg(
                "This node is joining the cluster or catching up with the other owners of the \
                 key; retry, or ask another owner.",
            )))
        }
        Plan::OthersFirst(others) => {
            // This node may hold old copies (it joined again, and anti-entropy has not
            // caught it up yet): an owner that is caught up answers; only when none answers
            // is it served here.
            if let Some(resp) = cluster::read_from_others(ctx, cluster, &others, b, k).await {
                return Next::Answered(Ok(resp));
            }
        }
    }
    if let Err(e) = writable(ctx, cluster, op, b, k) {
        return Next::Answered(Err(e));
    }
    Next::Here {
        body,
        after,
        allowed,
    }
}

/// Whether this node may coordinate a write of `b/k` now.
fn writable(ctx: &Ctx, cluster: &Cluster, op: Op, b: &str, k: &str) -> Result<(), S3Error> {
    if !cluster::coordinated(op) {
        return Ok(());
    }
    if !ctx.is_replica_copy() {
        cluster::bucket_placed(cluster, b)?;
    }
    if !ctx.is_replica_copy() && !cluster.caught_up() && cluster.shares(b, k) {
        // Coordinating reads the key here first (conditions, ACL changes, copies onto
        // themselves): with what may be old data, it could write that back as the newest
        // version.
        return Err(S3Error::new(S3ErrorCode::ServiceUnavailable).msg(
            "This node is catching up with the other owners of the key after joining the \
             cluster; retry in a moment.",
        ));
    }
    if let Err(e) = cluster.writable() {
        ClusterMetrics::inc(&cluster.metrics.writes_refused);
        return Err(S3Error::new(S3ErrorCode::ServiceUnavailable).msg(format!("{e}.")));
    }
    Ok(())
}

/// What the cluster adds to `r`, the answer served here: a peer's read that found nothing
/// names the delete it holds, a replicated write is copied to the other owners before it is
/// acknowledged, and a read that found nothing here is asked of the other owners.
pub async fn finish(
    ctx: &Ctx,
    cluster: &Arc<Cluster>,
    op: Op,
    b: &str,
    k: &str,
    after: After,
    r: Result<Resp, S3Error>,
) -> Result<Resp, S3Error> {
    match r {
        Err(e)
            if ctx.peer.is_some()
                && e.code == S3ErrorCode::NoSuchKey
                && matches!(op, Op::GetObject | Op::HeadObject) =>
        {
            Err(cluster::with_tombstone(ctx, b, k, e).await)
        }
        Ok(resp) if !after.replicate_to.is_empty() && resp.status().is_success() => {
            cluster::replicate(ctx, cluster, op, b, k, &after.replicate_to)
                .await
                .map(|()| resp)
        }
        Err(e) if !after.read_fallback.is_empty() && e.code == S3ErrorCode::NoSuchKey => {
            cluster::forward_read(ctx, cluster, &after.read_fallback).await
        }
        r => r,
    }
}
