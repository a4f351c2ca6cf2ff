//! Bucket policies and public access blocks over HTTP: Get/Put/DeleteBucketPolicy,
//! GetBucketPolicyStatus, Get/Put/DeletePublicAccessBlock, and `BlockPublicAcls`, which
//! refuses a public ACL ([`refuse_public_acl`]). What a policy says about a request is
//! `permission.rs`'s; parsing and evaluating a policy is `yutu_api::bucket_policy`'s.

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use yutu_api::acl::Acl;
use yutu_api::bucket_policy::{BucketPolicy, Effect, Targets, MAX_POLICY_LEN};
use yutu_api::public_access_block::{PolicyStatus, PublicAccessBlock, MAX_DOCUMENT};
use yutu_api::S3ErrorCode;

use crate::http::body;
use crate::http::ctx::Ctx;
use crate::http::error::S3Error;
use crate::http::permission::acl_is_public;
use crate::http::{xml_response, Resp};
use crate::node::buckets::{self, BucketChange};
use crate::store::bucket_settings::BucketGuards;

/// `BlockPublicAcls`: refuses (403) a request that would set a public ACL on `bucket` or one
/// of its objects.
pub fn refuse_public_acl(ctx: &Ctx, bucket: &str, acl: &Acl) -> Result<(), S3Error> {
    let blocked = ctx
        .shard
        .tier
        .bucket_guards(bucket)
        .is_some_and(|g| g.block.block_public_acls);
    if blocked && acl_is_public(acl) {
        return Err(S3Error::new(S3ErrorCode::AccessDenied)
            .msg("The bucket's public access block (BlockPublicAcls) refuses public ACLs."));
    }
    Ok(())
}

fn guards(ctx: &Ctx, bucket: &str) -> Result<BucketGuards, S3Error> {
    ctx.shard
        .tier
        .bucket_guards(bucket)
        .ok_or_else(|| S3Error::new(S3ErrorCode::NoSuchBucket))
}

async fn set(ctx: &Ctx, bucket: &str, change: BucketChange) -> Result<(), S3Error> {
    match &ctx.cluster {
        Some(cluster) => crate::cluster::buckets::change(&ctx.shard, cluster, bucket, change)
            .await
            .map_err(crate::http::common::bucket_error),
        None => Ok(buckets::change(&ctx.shard, bucket.to_string(), change).await?),
    }
}

fn empty(status: StatusCode) -> Resp {
    Response::builder()
        .status(status)
        .body(Full::new(Bytes::new()))
        .unwrap_or_default()
}

/// GetBucketPolicy: the text as it was put.
pub fn get_bucket_policy(ctx: &Ctx, bucket: &str) -> Result<Resp, S3Error> {
    let policy = guards(ctx, bucket)?
        .policy
        .ok_or_else(|| S3Error::new(S3ErrorCode::NoSuchBucketPolicy))?;
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(policy.text().to_string())))
        .unwrap_or_default())
}

/// PutBucketPolicy: 204 once every shard (and, in a cluster, etcd) has it.
pub async fn put_bucket_policy(
    ctx: &Ctx,
    body_in: Incoming,
    bucket: &str,
) -> Result<Resp, S3Error> {
    let g = guards(ctx, bucket)?;
    let raw = body::read_limited(ctx, body_in, MAX_POLICY_LEN as u64).await?;
    let text = std::str::from_utf8(&raw.data)
        .map_err(|_| S3Error::new(S3ErrorCode::MalformedPolicy).msg("The policy is not UTF-8."))?;
    let policy = BucketPolicy::parse(text, bucket)
        .map_err(|e| S3Error::new(S3ErrorCode::MalformedPolicy).msg(e.to_string()))?;
    // AWS refuses `NotPrincipal` with `Allow`: it would allow everybody but a few, anonymous
    // callers included, which is never what its writer meant.
    if policy
        .statements()
        .iter()
        .any(|s| s.effect == Effect::Allow && matches!(s.principal, Targets::Except(_)))
    {
        return Err(S3Error::new(S3ErrorCode::MalformedPolicy)
            .msg("NotPrincipal may only be used with Deny."));
    }
    if g.block.block_public_policy && policy.is_public() {
        return Err(S3Error::new(S3ErrorCode::AccessDenied)
            .msg("The bucket's public access block (BlockPublicPolicy) refuses a public policy."));
    }
    set(ctx, bucket, BucketChange::Policy(Some(text.to_string()))).await?;
    Ok(empty(StatusCode::NO_CONTENT))
}

/// DeleteBucketPolicy: 204, whether or not there was one.
pub async fn delete_bucket_policy(ctx: &Ctx, bucket: &str) -> Result<Resp, S3Error> {
    guards(ctx, bucket)?;
    set(ctx, bucket, BucketChange::Policy(None)).await?;
    Ok(empty(StatusCode::NO_CONTENT))
}

/// GetBucketPolicyStatus: public when the policy is, or when the bucket's ACL grants
/// anything to everyone or to every authenticated caller (as Ceph answers).
pub fn get_bucket_policy_status(ctx: &Ctx, bucket: &str) -> Result<Resp, S3Error> {
    let g = guards(ctx, bucket)?;
    let acl_public = ctx
        .shard
        .tier
        .with_bucket(bucket, |b| b.is_some_and(|(s, _)| acl_is_public(&s.acl)));
    let is_public = g.policy.as_ref().is_some_and(|p| p.is_public()) || acl_public;
    Ok(xml_response(
        StatusCode::OK,
        PolicyStatus { is_public }.to_xml(),
    ))
}

/// GetPublicAccessBlock.
pub fn get_public_access_block(ctx: &Ctx, bucket: &str) -> Result<Resp, S3Error> {
    let g = guards(ctx, bucket)?;
    if !g.configured_block {
        return Err(S3Error::new(
            S3ErrorCode::NoSuchPublicAccessBlockConfiguration,
        ));
    }
    Ok(xml_response(StatusCode::OK, g.block.to_xml()))
}

/// PutPublicAccessBlock.
pub async fn put_public_access_block(
    ctx: &Ctx,
    body_in: Incoming,
    bucket: &str,
) -> Result<Resp, S3Error> {
    guards(ctx, bucket)?;
    let raw = body::read_limited(ctx, body_in, MAX_DOCUMENT).await?;
    let text = std::str::from_utf8(&raw.data)
        .map_err(|_| S3Error::new(S3ErrorCode::MalformedXML).msg("The document is not UTF-8."))?;
    let block =
        PublicAccessBlock::parse(text).map_err(|e| S3Error::new(e.s3_code()).msg(e.to_string()))?;
    set(ctx, bucket, BucketChange::PublicAccessBlock(Some(block))).await?;
    Ok(empty(StatusCode::OK))
}

/// DeletePublicAccessBlock: 204, whether or not there was one.
pub async fn delete_public_access_block(ctx: &Ctx, bucket: &str) -> Result<Resp, S3Error> {
    guards(ctx, bucket)?;
    set(ctx, bucket, BucketChange::PublicAccessBlock(None)).await?;
    Ok(empty(StatusCode::NO_CONTENT))
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
        Op::GetBucketPolicy => get_bucket_policy(ctx, b),
        Op::PutBucketPolicy => put_bucket_policy(ctx, body, b).await,
        Op::DeleteBucketPolicy => delete_bucket_policy(ctx, b).await,
        Op::GetBucketPolicyStatus => get_bucket_policy_status(ctx, b),
        Op::GetPublicAccessBlock => get_public_access_block(ctx, b),
        Op::PutPublicAccessBlock => put_public_access_block(ctx, body, b).await,
        Op::DeletePublicAccessBlock => delete_public_access_block(ctx, b).await,
        _ => Err(crate::http::endpoint::not_served(op)),
    }
}
