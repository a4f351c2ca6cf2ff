//! Helpers every kind of handler shares, below all of them: an empty answer, an object read
//! on its own shard, and the errors of the cluster's bucket configuration.

use std::sync::Arc;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;
use yutu_api::S3ErrorCode;

use super::ctx::Ctx;
use super::error::S3Error;
use super::Resp;
use crate::model::conditions::ReadConditions;
use crate::model::ObjectMeta;

/// An answer without a body.
pub fn empty(status: StatusCode) -> Resp {
    Response::builder()
        .status(status)
        .body(Full::new(Bytes::new()))
        .unwrap_or_default()
}

/// The object's metadata and (unless `head_only`) bytes, read unconditionally on the shard
/// that owns it.
pub async fn read_local(
    ctx: &Ctx,
    bucket: &str,
    key: &str,
    head_only: bool,
) -> Result<(Arc<ObjectMeta>, Bytes), S3Error> {
    let (b, k) = (bucket.to_string(), key.to_string());
    let found = ctx
        .shard
        .run_step(ctx.shard.owner(bucket, key), move |s| {
            s.tier.get(b, k, None, head_only, ReadConditions::default())
        })
        .await?;
    let (meta, _, data) = found?;
    Ok((meta, data))
}

/// 503 with `msg`: the cluster cannot do it now.
pub fn unavailable(msg: String) -> S3Error {
    S3Error::new(S3ErrorCode::ServiceUnavailable).msg(msg)
}

/// The S3 error of a cluster bucket operation.
pub fn bucket_error(e: crate::cluster::buckets::ClusterBucketError) -> S3Error {
    match e {
        crate::cluster::buckets::ClusterBucketError::Local(e) => e.into(),
        crate::cluster::buckets::ClusterBucketError::Etcd(e) => unavailable(format!(
            "The cluster's configuration store (etcd) cannot be reached, so buckets cannot be created or deleted now: {e}."
        )),
    }
}
