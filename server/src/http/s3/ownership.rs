//! Object ownership over HTTP: Get/Put/DeleteBucketOwnershipControls, and what a bucket's
//! setting does to the owner and ACL of what is written into it ([`stamp`]).
//!
//! The setting itself is `yutu_api::ownership`'s; it is kept with the bucket's other settings
//! (catalog, every shard, and in a cluster the bucket's etcd record).

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use yutu_api::acl::{Acl, Canned};
use yutu_api::ownership::{ObjectOwnership, MAX_DOCUMENT};
use yutu_api::S3ErrorCode;

use crate::http::body;
use crate::http::ctx::Ctx;
use crate::http::error::S3Error;
use crate::http::{xml_response, Resp};
use crate::node::buckets::{self, BucketChange};

/// The bucket's setting (`None`: the bucket does not exist; `ObjectWriter` when unset).
pub fn of(ctx: &Ctx, bucket: &str) -> Option<ObjectOwnership> {
    ctx.shard
        .tier
        .bucket_guards(bucket)
        .map(|g| g.ownership.unwrap_or_default())
}

/// `AccessControlListNotSupported` when `bucket` has ACLs off (BucketOwnerEnforced): for a
/// PutBucketAcl or PutObjectAcl, whatever ACL it asks for.
pub fn refuse_acl_change(ctx: &Ctx, bucket: &str) -> Result<(), S3Error> {
    if of(ctx, bucket) == Some(ObjectOwnership::BucketOwnerEnforced) {
        return Err(S3Error::new(S3ErrorCode::AccessControlListNotSupported));
    }
    Ok(())
}

/// The owner and ACL an object written by `writer` into `bucket` (owned by `bucket_owner`)
/// gets, given the ACL its request asks for (`None`: no ACL header) and, for a canned one, its
/// name. BucketOwnerEnforced: the bucket's owner owns it, and any ACL but
/// `bucket-owner-full-control` is refused. BucketOwnerPreferred: the bucket's owner owns what
/// is written with `bucket-owner-full-control`. ObjectWriter: the writer owns it.
pub fn stamp(
    ctx: &Ctx,
    bucket: &str,
    writer: &str,
    bucket_owner: &str,
    requested: Option<Acl>,
) -> Result<(String, Acl), S3Error> {
    let canned = ctx
        .header(yutu_api::acl::ACL_HEADER)
        .and_then(|c| Canned::parse(c).ok());
    let full_control = canned == Some(Canned::BucketOwnerFullControl);
    match of(ctx, bucket).unwrap_or_default() {
        ObjectOwnership::BucketOwnerEnforced => {
            if requested.is_some() && !full_control {
                return Err(S3Error::new(S3ErrorCode::AccessControlListNotSupported));
            }
            Ok((bucket_owner.to_string(), Acl::default()))
        }
        ObjectOwnership::BucketOwnerPreferred if full_control => {
            Ok((bucket_owner.to_string(), Acl::default()))
        }
        _ => Ok((writer.to_string(), requested.unwrap_or_default())),
    }
}

fn exists(ctx: &Ctx, bucket: &str) -> Result<ObjectOwnership, S3Error> {
    of(ctx, bucket).ok_or_else(|| S3Error::new(S3ErrorCode::NoSuchBucket))
}

async fn set(ctx: &Ctx, bucket: &str, o: Option<ObjectOwnership>) -> Result<(), S3Error> {
    let change = BucketChange::Ownership(o);
    match &ctx.cluster {
        Some(cluster) => crate::cluster::buckets::change(&ctx.shard, cluster, bucket, change)
            .await
            .map_err(crate::http::common::bucket_error),
        None => Ok(buckets::change(&ctx.shard, bucket.to_string(), change).await?),
    }
}

/// GetBucketOwnershipControls.
pub fn get(ctx: &Ctx, bucket: &str) -> Result<Resp, S3Error> {
    exists(ctx, bucket)?;
    let set = ctx
        .shard
        .tier
        .bucket_guards(bucket)
        .and_then(|g| g.ownership)
        .ok_or_else(|| S3Error::new(S3ErrorCode::OwnershipControlsNotFoundError))?;
    Ok(xml_response(StatusCode::OK, set.to_xml()))
}

/// PutBucketOwnershipControls. BucketOwnerEnforced needs the bucket's ACL private first.
pub async fn put(ctx: &Ctx, body_in: Incoming, bucket: &str) -> Result<Resp, S3Error> {
    exists(ctx, bucket)?;
    let raw = body::read_limited(ctx, body_in, MAX_DOCUMENT).await?;
    let text = std::str::from_utf8(&raw.data)
        .map_err(|_| S3Error::new(S3ErrorCode::MalformedXML).msg("The document is not UTF-8."))?;
    let o = ObjectOwnership::from_xml(text)
        .map_err(|e| S3Error::new(S3ErrorCode::MalformedXML).msg(e.to_string()))?;
    let acl_open = ctx
        .shard
        .tier
        .with_bucket(bucket, |b| b.is_some_and(|(s, _)| !s.acl.is_empty()));
    if o == ObjectOwnership::BucketOwnerEnforced && acl_open {
        return Err(S3Error::new(
            S3ErrorCode::InvalidBucketAclWithObjectOwnership,
        ));
    }
    set(ctx, bucket, Some(o)).await?;
    Ok(Response::builder()
        .status(StatusCode::OK)
        .body(Full::new(Bytes::new()))
        .unwrap_or_default())
}

/// DeleteBucketOwnershipControls: 204, whether or not it was set.
pub async fn delete(ctx: &Ctx, bucket: &str) -> Result<Resp, S3Error> {
    exists(ctx, bucket)?;
    set(ctx, bucket, None).await?;
    Ok(Response::builder()
        .status(StatusCode::NO_CONTENT)
        .body(Full::new(Bytes::new()))
        .unwrap_or_default())
}

/// Serves this file's bucket operations (the table is
/// [`Op::handler`](crate::http::endpoint::Op::handler)), once the caller may
/// (`incarnation`: the bucket's, as the permission was checked against).
pub async fn serve_bucket(
    ctx: &Ctx,
    op: crate::http::endpoint::Op,
    b: &str,
    body: Incoming,
    _incarnation: Option<u64>,
) -> Result<Resp, S3Error> {
    use crate::http::endpoint::Op;
    match op {
        Op::GetBucketOwnershipControls => get(ctx, b),
        Op::PutBucketOwnershipControls => put(ctx, body, b).await,
        Op::DeleteBucketOwnershipControls => delete(ctx, b).await,
        _ => Err(crate::http::endpoint::not_served(op)),
    }
}
