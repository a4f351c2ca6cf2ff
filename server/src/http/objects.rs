//! Object operations: PutObject, GetObject (with Range and conditions), HeadObject,
//! DeleteObject.

use std::sync::Arc;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use yutu_api::{parse_range, validate_object_key, KeyError, S3ErrorCode};

use super::ctx::Ctx;
use super::error::S3Error;
use super::{meta, payload, Resp};
use crate::auth::Gate;
use crate::model::conditions::{ReadConditions, WriteConditions};
use crate::model::{ObjectMeta, StoreError};
use crate::node::quota::Admitted;
use crate::tier::Step;

pub fn check_key(key: &str) -> Result<(), S3Error> {
    validate_object_key(key).map_err(|e| {
        let code = match e {
            KeyError::TooLong(_) => S3ErrorCode::KeyTooLongError,
            _ => S3ErrorCode::InvalidArgument,
        };
        S3Error::new(code).msg(format!("{e}."))
    })
}

pub fn empty(status: StatusCode) -> Resp {
    Response::builder()
        .status(status)
        .body(Full::new(Bytes::new()))
        .unwrap_or_default()
}

/// The payload limit for one object: the configured maximum, and what fits in a shard.
pub fn object_limit(ctx: &Ctx) -> (u64, &'static str) {
    let shard_capacity = ctx.shard.tier.store.borrow().capacity();
    if ctx.shard.settings.max_object_size <= shard_capacity {
        (
            ctx.shard.settings.max_object_size,
            "the maximum object size",
        )
    } else {
        (shard_capacity, "a shard's DRAM capacity")
    }
}

pub fn bucket_must_exist(ctx: &Ctx, bucket: &str) -> Result<(), S3Error> {
    if ctx.shard.tier.store.borrow().bucket_exists(bucket) {
        Ok(())
    } else {
        Err(S3Error::new(S3ErrorCode::NoSuchBucket))
    }
}

/// Refuses write conditions S3 does not implement (`501 NotImplemented`, as S3 answers),
/// before any of the body is read.
pub fn check_write_conditions(ctx: &Ctx) -> Result<(), S3Error> {
    WriteConditions::supported(&ctx.headers)
        .map_err(|e| S3Error::new(S3ErrorCode::NotImplemented).msg(e.to_string()))
}

/// PutObject; `incarnation` is the bucket's as the permission check saw it.
pub async fn put(
    ctx: &Ctx,
    body: Incoming,
    bucket: &str,
    key: &str,
    incarnation: Option<u64>,
) -> Result<Resp, S3Error> {
    check_key(key)?;
    check_write_conditions(ctx)?;
    let (limit, what) = object_limit(ctx);
    payload::precheck(ctx, limit, what)?;
    bucket_must_exist(ctx, bucket)?;
    let req_meta = meta::from_request(&ctx.headers)?;
    let cond = WriteConditions::for_bucket(&ctx.headers, incarnation);
    let received = payload::receive(ctx, body, limit).await?;
    let mut meta = req_meta.into_object_meta();
    super::acl::stamp_object(ctx, bucket, &mut meta)?;
    meta.size = received.data.len() as u64;
    meta.etag = format!("\"{}\"", hex::encode(received.md5));
    if ctx.peer.is_some() {
        // A replica keeps its coordinator's metadata whole (a multipart ETag is no MD5 of the
        // bytes; the modification time is the write's, not the copy's).
        if let Some(m) = ctx.header(yutu_api::cluster::REPLICA_META_HEADER) {
            meta = crate::cluster::replica::decode_meta(m, meta.size).ok_or_else(|| {
                S3Error::new(S3ErrorCode::InvalidArgument)
                    .msg("The replica's metadata header cannot be read.")
            })?;
        }
    }
    meta.checksum = received.checksum;
    let stored = store(ctx, bucket, key, received.data, meta, cond).await?;
    let mut resp = Response::builder()
        .status(StatusCode::OK)
        .header("etag", &stored.etag);
    if let Some(c) = &stored.checksum {
        resp = resp.header(c.algorithm.header(), c.header_value());
    }
    Ok(resp.body(Full::new(Bytes::new())).unwrap_or_default())
}

/// Stores an object on the shard that owns it, within the bucket's quota (a replica copy
/// from its coordinator is not checked again).
pub async fn store(
    ctx: &Ctx,
    bucket: &str,
    key: &str,
    data: Bytes,
    meta: ObjectMeta,
    cond: WriteConditions,
) -> Result<Arc<ObjectMeta>, S3Error> {
    let (b, k) = (bucket.to_string(), key.to_string());
    let checked = !ctx.is_replica_copy();
    Ok(ctx
        .shard
        .run_step(ctx.shard.owner(bucket, key), move |s| {
            let admitted = if checked {
                match s.admit(&b, &[(&k, data.len() as u64)]) {
                    Ok(a) => a,
                    Err(e) => return Step::Done(Err(e)),
                }
            } else {
                Admitted::unchecked()
            };
            s.tier.put(b, k, data, meta, cond).holding(admitted)
        })
        .await??)
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

/// GetObject/HeadObject. A [`Gate::Object`] request is first checked against the object's
/// own ACL (and refused with AccessDenied, or NoSuchKey where the caller may list the bucket
/// anyway: [`super::acl::missing`]), before any condition or range could tell it something
/// about the object.
pub async fn get(
    ctx: &Ctx,
    bucket: &str,
    key: &str,
    head_only: bool,
    gate: Gate,
) -> Result<Resp, S3Error> {
    check_key(key)?;
    if gate != Gate::Open {
        match read_local(ctx, bucket, key, true).await {
            Ok((meta, _)) => super::acl::pass(ctx, gate, &meta)?,
            Err(e) => return Err(super::acl::missing(ctx, bucket, gate, e)),
        }
    }
    if let Some(v) = ctx.target.param("versionId") {
        if v != "null" {
            return Err(
                S3Error::new(S3ErrorCode::InvalidArgument).msg("Invalid version id specified")
            );
        }
    }
    let range = ctx.header("range").and_then(parse_range);
    let cond = ReadConditions::from_headers(&ctx.headers, "");
    let (b, k) = (bucket.to_string(), key.to_string());
    let result = ctx
        .shard
        .run_step(ctx.shard.owner(bucket, key), move |s| {
            s.tier.get(b, k, range, head_only, cond)
        })
        .await?;
    let checksum_mode = ctx
        .header("x-amz-checksum-mode")
        .is_some_and(|v| v.eq_ignore_ascii_case("enabled"));
    let (meta, range, data) = match result {
        Ok(x) => x,
        Err(StoreError::NotModified(meta)) => {
            let b = meta::to_response(
                Response::builder().status(StatusCode::NOT_MODIFIED),
                &meta,
                false,
                false,
            );
            return Ok(b.body(Full::new(Bytes::new())).unwrap_or_default());
        }
        Err(e) => return Err(e.into()),
    };
    let length = range.map_or(meta.size, |r| r.len());
    let mut resp = Response::builder()
        .status(if range.is_some() {
            StatusCode::PARTIAL_CONTENT
        } else {
            StatusCode::OK
        })
        .header("content-length", length)
        .header("accept-ranges", "bytes");
    if let Some(r) = range {
        resp = resp.header("content-range", r.content_range(meta.size));
    }
    resp = meta::to_response(resp, &meta, checksum_mode, range.is_some());
    if ctx.peer.is_some() {
        // Another node reading a copy (a copy source, a re-replication) gets the metadata
        // whole.
        if let Some(v) = crate::cluster::replica::encode_meta_header(&meta) {
            resp = resp.header(yutu_api::cluster::REPLICA_META_HEADER, v);
        }
    }
    // `response-*` query parameters override headers of this one response (S3's GetObject).
    for (param, header) in [
        ("response-content-type", "content-type"),
        ("response-content-disposition", "content-disposition"),
        ("response-cache-control", "cache-control"),
        ("response-content-encoding", "content-encoding"),
        ("response-content-language", "content-language"),
        ("response-expires", "expires"),
    ] {
        if let Some(v) = ctx.target.param(param) {
            if let Some(h) = resp.headers_mut() {
                if let Ok(v) = http::HeaderValue::from_str(v) {
                    h.insert(header, v);
                }
            }
        }
    }
    ctx.shard.metrics.bytes_out.add(data.len() as u64);
    resp.body(Full::new(data)).map_err(|e| {
        tracing::error!(error = %e, "cannot build a GET response");
        S3Error::new(S3ErrorCode::InternalError)
    })
}

/// DeleteObject; `incarnation` is the bucket's as the permission check saw it.
pub async fn delete(
    ctx: &Ctx,
    bucket: &str,
    key: &str,
    incarnation: Option<u64>,
) -> Result<Resp, S3Error> {
    check_key(key)?;
    let (b, k) = (bucket.to_string(), key.to_string());
    ctx.shard
        .run_step(ctx.shard.owner(bucket, key), move |s| {
            s.tier.delete_in(b, vec![k], incarnation)
        })
        .await??;
    Ok(empty(StatusCode::NO_CONTENT))
}
