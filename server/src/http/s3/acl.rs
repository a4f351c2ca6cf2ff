//! ACLs over HTTP: GetBucketAcl/PutBucketAcl, GetObjectAcl/PutObjectAcl, the ACL a write
//! sets (`x-amz-acl`, `x-amz-grant-*`), the object check a [`Gate`] leaves for later, and
//! `x-amz-expected-bucket-owner`.
//!
//! What an ACL allows is decided in `auth::policy`, with everything else; this module only
//! reads, stores and renders ACLs.

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use yutu_api::acl::{parse_policy, Acl, AclError, EXPECTED_OWNER_HEADER};
use yutu_api::xml::to_xml;
use yutu_api::S3ErrorCode;

use crate::auth::{object_allows, Gate};
use crate::http::body;
use crate::http::common::read_local;
use crate::http::ctx::Ctx;
use crate::http::error::S3Error;
use crate::http::{xml_response, Resp};
use crate::model::conditions::WriteConditions;
use crate::model::{ObjectMeta, StoreError};
use crate::node::buckets::{self, BucketChange};

/// Largest AccessControlPolicy document read (100 grants fit in a fraction of it).
const MAX_POLICY_BYTES: u64 = 64 * 1024;

fn acl_error(e: AclError) -> S3Error {
    let code = match e {
        AclError::Malformed(_)
        | AclError::NoGrantee
        | AclError::UnknownPermission(_)
        | AclError::UnknownGroup(_)
        | AclError::TooManyGrants => S3ErrorCode::MalformedACLError,
        AclError::UnknownCanned(_)
        | AclError::BadGrantHeader(_)
        | AclError::Ambiguous
        | AclError::UnknownId(_) => S3ErrorCode::InvalidArgument,
        // S3 answers UnresolvableGrantByEmailAddress (400), a code `S3ErrorCode` does not
        // have yet; InvalidArgument keeps the status and the refusal.
        AclError::UnresolvableEmail(_) => S3ErrorCode::UnresolvableGrantByEmailAddress,
    };
    S3Error::new(code).msg(e.to_string())
}

/// Refuses an ACL granting to a canonical id that names no user of this node (S3:
/// InvalidArgument, "Invalid id"): such a grant would be stored and silently let nobody in,
/// typically because of a typo. The resource's owner and the bucket's owner are known even
/// when they are token subjects rather than users. An open node (`--no-auth`) has no users
/// to check against and takes any id.
fn check_ids(ctx: &Ctx, acl: &Acl, owner: &str, bucket_owner: &str) -> Result<(), S3Error> {
    let settings = &ctx.shard.settings;
    if settings.no_auth {
        return Ok(());
    }
    let known =
        |id: &str| id == owner || id == bucket_owner || settings.users.iter().any(|u| u.name == id);
    match acl.user_ids().find(|id| !known(id)) {
        Some(id) => Err(acl_error(AclError::UnknownId(id.to_string()))),
        None => Ok(()),
    }
}

/// The owner of `bucket` on this shard's copy of the bucket list.
fn bucket_owner(ctx: &Ctx, bucket: &str) -> Result<String, S3Error> {
    ctx.shard
        .tier
        .bucket_owner(bucket)
        .ok_or_else(|| S3Error::new(S3ErrorCode::NoSuchBucket))
}

/// The ACL the request's headers set on a resource `owner` creates in a bucket of
/// `bucket_owner` (`None`: no ACL header, private).
pub fn requested(ctx: &Ctx, owner: &str, bucket_owner: &str) -> Result<Option<Acl>, S3Error> {
    let acl = Acl::from_headers(|name| ctx.header(name), owner, bucket_owner).map_err(acl_error)?;
    if let Some(acl) = &acl {
        check_ids(ctx, acl, owner, bucket_owner)?;
    }
    Ok(acl)
}

/// Stamps a new object's owner and ACL: the writer and the ACL its request's headers ask for,
/// as the bucket's object ownership decides ([`super::ownership::stamp`]); a public ACL is
/// refused where the bucket's public access block says so.
pub fn stamp_object(ctx: &Ctx, bucket: &str, meta: &mut ObjectMeta) -> Result<(), S3Error> {
    let writer = ctx.identity().name().to_string();
    let bucket_owner = bucket_owner(ctx, bucket)?;
    let asked = requested(ctx, &writer, &bucket_owner)?;
    if let Some(acl) = &asked {
        super::bucket_policy::refuse_public_acl(ctx, bucket, acl)?;
    }
    let (owner, acl) = super::ownership::stamp(ctx, bucket, &writer, &bucket_owner, asked)?;
    meta.acl = acl;
    meta.owner = owner;
    Ok(())
}

/// What a PutBucketAcl/PutObjectAcl may set on `bucket` or its objects: nothing where ACLs
/// are off (BucketOwnerEnforced), nothing public where the public access block blocks it.
fn check_settable(ctx: &Ctx, bucket: &str, acl: &Acl) -> Result<(), S3Error> {
    super::ownership::refuse_acl_change(ctx, bucket)?;
    super::bucket_policy::refuse_public_acl(ctx, bucket, acl)
}

/// `x-amz-expected-bucket-owner`: the request is refused (403) unless the bucket belongs to
/// the named owner, so a client never writes into a bucket someone else re-created.
pub fn check_expected_owner(ctx: &Ctx, bucket: &str) -> Result<(), S3Error> {
    let Some(expected) = ctx.header(EXPECTED_OWNER_HEADER) else {
        return Ok(());
    };
    match ctx.shard.tier.bucket_owner(bucket) {
        Some(owner) if owner != expected.trim() => Err(S3Error::new(S3ErrorCode::AccessDenied)
            .msg("The bucket belongs to another owner than x-amz-expected-bucket-owner names.")),
        _ => Ok(()),
    }
}

/// Whether a [`Gate`] lets the caller at an object (written by `owner`, with `acl`; its
/// public grants count for nothing where the bucket's public access block ignores them).
pub fn pass(ctx: &Ctx, gate: Gate, meta: &ObjectMeta) -> Result<(), S3Error> {
    let Gate::Object(p) = gate else {
        return Ok(());
    };
    let guards = ctx
        .target
        .bucket
        .as_deref()
        .and_then(|b| ctx.shard.tier.bucket_guards(b))
        .unwrap_or_default();
    let acl = crate::http::permission::effective_acl(Some(&meta.acl), &guards);
    match acl {
        Some(acl) if object_allows(ctx.identity(), &meta.owner, &acl, p) => Ok(()),
        _ => Err(S3Error::new(S3ErrorCode::AccessDenied)),
    }
}

/// What a gated request answers for a key that does not exist: NoSuchKey (404) to a caller
/// that may list the bucket, who could learn as much from a listing anyway; AccessDenied to
/// any other, so that a caller the bucket does not admit learns nothing of its keys. S3
/// answers the same way (404 only with `s3:ListBucket`), e.g. to an anonymous GET of a
/// deleted object in a public-read bucket.
pub fn missing(ctx: &Ctx, bucket: &str, gate: Gate, e: S3Error) -> S3Error {
    match gate {
        Gate::Object(_)
            if e.code == S3ErrorCode::NoSuchKey
                && ctx.may_list_key(bucket, ctx.target.key.as_deref().unwrap_or("")) =>
        {
            e
        }
        Gate::Object(_) => S3Error::new(S3ErrorCode::AccessDenied),
        Gate::Open => e,
    }
}

fn policy_response(acl: &Acl, owner: &str) -> Resp {
    xml_response(
        StatusCode::OK,
        to_xml("AccessControlPolicy", &acl.to_policy(owner)),
    )
}

fn ok_empty() -> Resp {
    Response::builder()
        .status(StatusCode::OK)
        .body(Full::new(Bytes::new()))
        .unwrap_or_default()
}

/// The ACL a PutBucketAcl/PutObjectAcl sets: from its headers or from its body, not both.
async fn acl_to_set(
    ctx: &Ctx,
    body_in: Incoming,
    owner: &str,
    bucket_owner: &str,
) -> Result<Acl, S3Error> {
    let from_headers = requested(ctx, owner, bucket_owner)?;
    let body = body::read_limited(ctx, body_in, MAX_POLICY_BYTES).await?;
    let text = std::str::from_utf8(&body.data).map_err(|_| {
        S3Error::new(S3ErrorCode::MalformedACLError).msg("The document is not UTF-8.")
    })?;
    match (from_headers, text.trim().is_empty()) {
        (Some(acl), true) => Ok(acl),
        (Some(_), false) => Err(acl_error(AclError::Ambiguous)),
        (None, false) => {
            let doc = parse_policy(text).map_err(acl_error)?;
            let acl = Acl::from_policy(&doc, owner).map_err(acl_error)?;
            check_ids(ctx, &acl, owner, bucket_owner)?;
            Ok(acl)
        }
        (None, true) => Err(S3Error::new(S3ErrorCode::MissingSecurityHeader)
            .msg("Your request was missing a required header or body: x-amz-acl, x-amz-grant-* or an AccessControlPolicy document.")),
    }
}

pub fn get_bucket_acl(ctx: &Ctx, bucket: &str) -> Result<Resp, S3Error> {
    ctx.shard.tier.with_bucket(bucket, |b| {
        let (settings, _) = b.ok_or_else(|| S3Error::new(S3ErrorCode::NoSuchBucket))?;
        Ok(policy_response(&settings.acl, &settings.owner))
    })
}

pub async fn put_bucket_acl(ctx: &Ctx, body_in: Incoming, bucket: &str) -> Result<Resp, S3Error> {
    let owner = bucket_owner(ctx, bucket)?;
    let acl = acl_to_set(ctx, body_in, &owner, &owner).await?;
    check_settable(ctx, bucket, &acl)?;
    match &ctx.cluster {
        Some(cluster) => {
            let change = BucketChange::Acl(acl);
            crate::cluster::buckets::change(&ctx.shard, cluster, bucket, change)
                .await
                .map_err(crate::http::common::bucket_error)?;
        }
        None => buckets::change(&ctx.shard, bucket.to_string(), BucketChange::Acl(acl)).await?,
    }
    Ok(ok_empty())
}

/// Who owns an object: its writer, or for an object from an open node (no writer recorded),
/// the bucket's owner.
fn object_owner(ctx: &Ctx, bucket: &str, meta: &ObjectMeta) -> Result<String, S3Error> {
    if meta.owner.is_empty() {
        bucket_owner(ctx, bucket)
    } else {
        Ok(meta.owner.clone())
    }
}

pub async fn get_object_acl(
    ctx: &Ctx,
    bucket: &str,
    key: &str,
    gate: Gate,
) -> Result<Resp, S3Error> {
    let (meta, _) = read_local(ctx, bucket, key, true)
        .await
        .map_err(|e| missing(ctx, bucket, gate, e))?;
    pass(ctx, gate, &meta)?;
    Ok(policy_response(
        &meta.acl,
        &object_owner(ctx, bucket, &meta)?,
    ))
}

/// PutObjectAcl: the object is stored again with the new ACL and everything else unchanged
/// (ETag, modification time, metadata), only if it is still the version read, so a write in
/// between is never undone.
pub async fn put_object_acl(
    ctx: &Ctx,
    body_in: Incoming,
    bucket: &str,
    key: &str,
    gate: Gate,
    incarnation: Option<u64>,
) -> Result<Resp, S3Error> {
    let (meta, data) = read_local(ctx, bucket, key, false)
        .await
        .map_err(|e| missing(ctx, bucket, gate, e))?;
    pass(ctx, gate, &meta)?;
    let owner = object_owner(ctx, bucket, &meta)?;
    let acl = acl_to_set(ctx, body_in, &owner, &bucket_owner(ctx, bucket)?).await?;
    check_settable(ctx, bucket, &acl)?;
    let mut new = (*meta).clone();
    new.acl = acl;
    // An ACL change is a write of its own: it gets a new version, so that the other owners
    // take it.
    new.version = crate::model::Version::ZERO;
    let cond = WriteConditions {
        if_match: Some(meta.etag.clone()),
        incarnation,
        ..WriteConditions::default()
    };
    let (b, k) = (bucket.to_string(), key.to_string());
    let stored = ctx
        .shard
        .run_step(ctx.shard.owner(bucket, key), move |s| {
            s.tier.put(b, k, data, new, cond)
        })
        .await?;
    match stored {
        Ok(_) => Ok(ok_empty()),
        Err(StoreError::PreconditionFailed) => Err(S3Error::new(S3ErrorCode::OperationAborted)
            .msg("The object was written while its ACL was being changed; try again.")),
        Err(e) => Err(e.into()),
    }
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
        Op::GetBucketAcl => get_bucket_acl(ctx, b),
        Op::PutBucketAcl => put_bucket_acl(ctx, body, b).await,
        _ => Err(crate::http::endpoint::not_served(op)),
    }
}

/// Serves this file's object operations (the table is
/// [`Op::handler`](crate::http::endpoint::Op::handler)), once the caller may (`incarnation`
/// as for a bucket, `gate`: whether the object's ACL is still to be checked).
pub async fn serve_object(
    ctx: &Ctx,
    op: crate::http::endpoint::Op,
    b: &str,
    k: &str,
    body: Incoming,
    incarnation: Option<u64>,
    gate: crate::auth::Gate,
) -> Result<Resp, S3Error> {
    use crate::http::endpoint::Op;
    match op {
        Op::GetObjectAcl => get_object_acl(ctx, b, k, gate).await,
        Op::PutObjectAcl => put_object_acl(ctx, body, b, k, gate, incarnation).await,
        _ => Err(crate::http::endpoint::not_served(op)),
    }
}
