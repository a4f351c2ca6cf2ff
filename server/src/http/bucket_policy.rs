//! Bucket policies and public access blocks over HTTP: Get/Put/DeleteBucketPolicy,
//! GetBucketPolicyStatus, Get/Put/DeletePublicAccessBlock, and what a request's policy
//! decision is ([`decide`]), which the one permission check (`auth::policy`) weighs with
//! ownership, grants, token scopes and ACLs.
//!
//! Parsing and evaluating a policy is `yutu_api::bucket_policy`'s; this module names the
//! action a request is (from its operation), fills the condition context from the request,
//! and applies the public access block: `RestrictPublicBuckets` takes anonymous callers'
//! allows away while the policy is public, `BlockPublicPolicy` refuses a public policy and
//! `BlockPublicAcls` a public ACL ([`refuse_public_acl`]).

use std::time::SystemTime;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use yutu_api::acl::{Acl, Grantee, Permission, Principal};
use yutu_api::bucket_policy::{
    actions, bucket_arn, keys, object_arn, BucketPolicy, Context, Decision, Effect, Request,
    Targets, MAX_POLICY_LEN,
};
use yutu_api::public_access_block::{PolicyStatus, PublicAccessBlock, MAX_DOCUMENT};
use yutu_api::S3ErrorCode;

use super::body;
use super::ctx::Ctx;
use super::error::S3Error;
use super::{xml_response, Resp};
use crate::auth::{Action, Identity};
use crate::engine::store::BucketGuards;
use crate::metrics::Op;
use crate::node::buckets::{self, BucketChange};

/// The policy action a request is evaluated as: its operation's, or (for calls outside the
/// S3 operations: KV, Mooncake's queries, a copy's source) its permission's.
pub fn action_name(op: Op, action: Action) -> &'static str {
    use actions::*;
    match op {
        Op::ListObjects | Op::HeadBucket => LIST_BUCKET,
        Op::ListObjectVersions => LIST_BUCKET_VERSIONS,
        Op::ListMultipartUploads => LIST_BUCKET_MULTIPART_UPLOADS,
        Op::GetBucketLocation => GET_BUCKET_LOCATION,
        Op::ListBuckets => LIST_ALL_MY_BUCKETS,
        Op::CreateBucket => CREATE_BUCKET,
        Op::DeleteBucket => DELETE_BUCKET,
        Op::GetObject | Op::HeadObject => GET_OBJECT,
        Op::GetObjectAttributes => GET_OBJECT_ATTRIBUTES,
        Op::PutObject
        | Op::CopyObject
        | Op::PostObject
        | Op::CreateMultipartUpload
        | Op::UploadPart
        | Op::UploadPartCopy
        | Op::CompleteMultipartUpload => PUT_OBJECT,
        Op::DeleteObject | Op::DeleteObjects => DELETE_OBJECT,
        Op::AbortMultipartUpload => ABORT_MULTIPART_UPLOAD,
        Op::ListParts => LIST_MULTIPART_UPLOAD_PARTS,
        Op::GetBucketAcl => GET_BUCKET_ACL,
        Op::PutBucketAcl => PUT_BUCKET_ACL,
        Op::GetObjectAcl => GET_OBJECT_ACL,
        Op::PutObjectAcl => PUT_OBJECT_ACL,
        Op::GetBucketCors => GET_BUCKET_CORS,
        Op::PutBucketCors | Op::DeleteBucketCors => PUT_BUCKET_CORS,
        Op::GetBucketPolicy => GET_BUCKET_POLICY,
        Op::PutBucketPolicy => PUT_BUCKET_POLICY,
        Op::DeleteBucketPolicy => DELETE_BUCKET_POLICY,
        Op::GetBucketPolicyStatus => GET_BUCKET_POLICY_STATUS,
        Op::GetPublicAccessBlock => GET_BUCKET_PUBLIC_ACCESS_BLOCK,
        Op::PutPublicAccessBlock | Op::DeletePublicAccessBlock => PUT_BUCKET_PUBLIC_ACCESS_BLOCK,
        Op::GetBucketOwnershipControls => "s3:GetBucketOwnershipControls",
        Op::PutBucketOwnershipControls | Op::DeleteBucketOwnershipControls => {
            "s3:PutBucketOwnershipControls"
        }
        Op::CorsPreflight | Op::Admin | Op::Kv | Op::MooncakeMaster | Op::Ops | Op::Unsupported => {
            match action {
                Action::Read => GET_OBJECT,
                Action::List => LIST_BUCKET,
                Action::Write => PUT_OBJECT,
                Action::Delete => DELETE_OBJECT,
                Action::ReadAcl => GET_OBJECT_ACL,
                Action::WriteAcl => PUT_OBJECT_ACL,
                Action::Configure => PUT_BUCKET_CORS,
                Action::CreateBucket => CREATE_BUCKET,
                Action::DeleteBucket => DELETE_BUCKET,
                Action::ListBuckets => LIST_ALL_MY_BUCKETS,
            }
        }
    }
}

/// Whether an operation manages the policy itself: the bucket's owner may always do it, even
/// where the policy denies it, so no policy can lock its owner out for good (as AWS keeps
/// these open to the account's root).
fn manages_policy(op: Op) -> bool {
    matches!(
        op,
        Op::GetBucketPolicy | Op::PutBucketPolicy | Op::DeleteBucketPolicy
    )
}

/// The condition values of the request: the caller's address and name, the time, its
/// headers and the listing parameters a policy may test (`prefix`, when given, stands for
/// the request's `s3:prefix`).
fn context(ctx: &Ctx, prefix: Option<&str>) -> Context {
    let mut c = Context::new();
    if let Some(ip) = ctx.client {
        c.insert(keys::SOURCE_IP, ip.to_string());
    }
    let tls = ctx.shard.settings.tls.is_some();
    c.insert(keys::SECURE_TRANSPORT, if tls { "true" } else { "false" });
    let now = SystemTime::now();
    c.insert(
        keys::CURRENT_TIME,
        humantime::format_rfc3339_seconds(now).to_string(),
    );
    if let Ok(d) = now.duration_since(SystemTime::UNIX_EPOCH) {
        c.insert(keys::EPOCH_TIME, d.as_secs().to_string());
    }
    if let Identity::User(u) = ctx.identity() {
        c.insert(keys::USERNAME, u.name.clone());
        c.insert(keys::USERID, u.name.clone());
    }
    for (key, header) in [
        (keys::REFERER, "referer"),
        (keys::USER_AGENT, "user-agent"),
        (keys::X_AMZ_ACL, "x-amz-acl"),
        (keys::X_AMZ_CONTENT_SHA256, "x-amz-content-sha256"),
        (keys::X_AMZ_COPY_SOURCE, "x-amz-copy-source"),
        (keys::X_AMZ_METADATA_DIRECTIVE, "x-amz-metadata-directive"),
        (
            keys::X_AMZ_SERVER_SIDE_ENCRYPTION,
            "x-amz-server-side-encryption",
        ),
        (keys::X_AMZ_STORAGE_CLASS, "x-amz-storage-class"),
    ] {
        if let Some(v) = ctx.header(header) {
            c.insert(key, v);
        }
    }
    for grant in [
        "x-amz-grant-read",
        "x-amz-grant-write",
        "x-amz-grant-read-acp",
        "x-amz-grant-write-acp",
        "x-amz-grant-full-control",
    ] {
        if let Some(v) = ctx.header(grant) {
            c.insert(&format!("s3:{grant}"), v);
        }
    }
    if let Some(p) = prefix {
        c.insert(keys::PREFIX, p);
    }
    for (key, param) in [
        (keys::PREFIX, "prefix"),
        (keys::DELIMITER, "delimiter"),
        (keys::MAX_KEYS, "max-keys"),
        (keys::VERSION_ID, "versionId"),
    ] {
        if let Some(v) = ctx.target.param(param).filter(|_| prefix.is_none()) {
            c.insert(key, v);
        }
    }
    c
}

/// What a policy check is about: who asks for which operation on which resource.
pub struct Asked<'a> {
    /// The request's identity, or a form's signer.
    pub who: &'a Identity,
    pub op: Op,
    pub action: Action,
    pub bucket: &'a str,
    /// The object (`None`: the bucket itself).
    pub key: Option<&'a str>,
    /// Stands for the request's `s3:prefix` (a read of a missing key asks whether the caller
    /// may list it).
    pub prefix: Option<&'a str>,
}

/// What the bucket's policy says about a request (`owner`: the bucket's).
pub fn decide(ctx: &Ctx, asked: &Asked, owner: Option<&str>, guards: &BucketGuards) -> Decision {
    let Some(policy) = &guards.policy else {
        return Decision::NotApplicable;
    };
    let Asked {
        who,
        op,
        action,
        bucket,
        key,
        prefix,
    } = *asked;
    let is_owner = owner.is_some_and(|o| !o.is_empty() && who.name() == o);
    if (is_owner || who.is_admin()) && manages_policy(op) {
        return Decision::NotApplicable;
    }
    let resource = match key {
        Some(k) => object_arn(bucket, k),
        None => bucket_arn(bucket),
    };
    let context = context(ctx, prefix);
    let decision = policy.evaluate(&Request {
        principal: who.principal(),
        action: action_name(op, action),
        resource: &resource,
        context: &context,
    });
    if decision == Decision::Allow
        && guards.block.restrict_public_buckets
        && !is_owner
        && matches!(who, Identity::Anonymous)
        && policy.is_public()
    {
        return Decision::NotApplicable;
    }
    decision
}

/// Whether an ACL grants anything to everyone or to every authenticated caller.
pub fn acl_is_public(acl: &Acl) -> bool {
    [
        Permission::Read,
        Permission::Write,
        Permission::ReadAcp,
        Permission::WriteAcp,
    ]
    .into_iter()
    .any(|p| acl.allows(Principal::Anonymous, p) || acl.allows(Principal::Authenticated, p))
}

/// `IgnorePublicAcls`: the ACL without its grants to everyone and to every authenticated
/// caller.
pub fn without_public(acl: &Acl) -> Acl {
    Acl {
        grants: acl
            .grants
            .iter()
            .filter(|g| matches!(g.grantee, Grantee::User(_)))
            .cloned()
            .collect(),
        exact: acl.exact,
    }
}

/// The ACL the permission check weighs: the bucket's or object's own, without its public
/// grants when the bucket's public access block ignores them.
pub fn effective_acl<'a>(
    acl: Option<&'a Acl>,
    guards: &BucketGuards,
) -> Option<std::borrow::Cow<'a, Acl>> {
    acl.map(|a| {
        if guards.block.ignore_public_acls {
            std::borrow::Cow::Owned(without_public(a))
        } else {
            std::borrow::Cow::Borrowed(a)
        }
    })
}

/// `BlockPublicAcls`: refuses (403) a request that would set a public ACL on `bucket` or one
/// of its objects.
pub fn refuse_public_acl(ctx: &Ctx, bucket: &str, acl: &Acl) -> Result<(), S3Error> {
    let blocked = ctx
        .shard
        .tier
        .store
        .borrow()
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
        .store
        .borrow()
        .bucket_guards(bucket)
        .ok_or_else(|| S3Error::new(S3ErrorCode::NoSuchBucket))
}

async fn set(ctx: &Ctx, bucket: &str, change: BucketChange) -> Result<(), S3Error> {
    match &ctx.cluster {
        Some(cluster) => crate::cluster::buckets::change(&ctx.shard, cluster, bucket, change)
            .await
            .map_err(super::cluster::bucket_error),
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
        .store
        .borrow()
        .bucket_access(bucket)
        .is_some_and(|(_, _, acl)| acl_is_public(acl));
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
