//! Object operations: PutObject, GetObject (with Range and conditions), HeadObject,
//! DeleteObject.

use std::sync::Arc;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use yutu_api::{parse_range, validate_object_key, S3ErrorCode};

use super::{meta, payload};
use crate::auth::Gate;
use crate::http::common::{empty, read_local};
use crate::http::ctx::Ctx;
use crate::http::error::S3Error;
use crate::http::Resp;
use crate::model::conditions::{DeleteConditions, ReadConditions, WriteConditions};
use crate::model::object::ObjectPart;
use crate::model::{ObjectMeta, StoreError};
use crate::node::quota::Admitted;
use crate::tier::Step;

pub fn check_key(key: &str) -> Result<(), S3Error> {
    validate_object_key(key).map_err(crate::http::error::key_error)
}

/// The payload limit for one object: the configured maximum, and what fits in a shard.
pub fn object_limit(ctx: &Ctx) -> (u64, &'static str) {
    ctx.shard.object_limit()
}

pub fn bucket_must_exist(ctx: &Ctx, bucket: &str) -> Result<(), S3Error> {
    if ctx.shard.tier.bucket_exists(bucket) {
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
    let mut meta = meta;
    if checked {
        // A new write (a copy's metadata may come from its source): the tier stamps it with
        // a new version. A replica copy keeps its coordinator's.
        meta.version = crate::model::Version::ZERO;
    }
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
    let part_number = part_number(ctx)?;
    if part_number.is_some() && ctx.header("range").is_some() {
        return Err(S3Error::new(S3ErrorCode::InvalidRequest)
            .msg("Cannot specify both Range header and partNumber query parameter"));
    }
    let cond = ReadConditions::from_headers(&ctx.headers, "");
    let (result, part) = read_for_get(ctx, bucket, key, part_number, head_only, cond).await?;
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
    let resp = found_response(ctx, &meta, range, part.as_ref());
    let resp = response_overrides(ctx, resp);
    ctx.shard.metrics.bytes_out.add(data.len() as u64);
    resp.body(Full::new(data)).map_err(|e| {
        tracing::error!(error = %e, "cannot build a GET response");
        S3Error::new(S3ErrorCode::InternalError)
    })
}

/// Reads the object (or the part `part_number`) from its shard. A part read resolves the
/// part against the current object, then reads its bytes; should the object be replaced in
/// between, the bytes would be another object's, so the read starts again (a few times, then
/// answers with what it found).
async fn read_for_get(
    ctx: &Ctx,
    bucket: &str,
    key: &str,
    part_number: Option<u32>,
    head_only: bool,
    cond: ReadConditions,
) -> Result<(crate::model::GetResult, Option<ObjectPart>), S3Error> {
    let mut attempts = 0;
    loop {
        attempts += 1;
        let (range, part) = match part_number {
            None => (ctx.header("range").and_then(parse_range), None),
            Some(n) => {
                let (meta, _) = read_local(ctx, bucket, key, true).await?;
                match part_of(&meta, n)? {
                    None => (None, None),
                    Some(p) => {
                        let last = (p.offset + p.size).saturating_sub(1);
                        (
                            Some(yutu_api::RangeSpec::FromTo(p.offset, last)),
                            Some((p, meta.etag.clone())),
                        )
                    }
                }
            }
        };
        let (b, k, c) = (bucket.to_string(), key.to_string(), cond.clone());
        let result = ctx
            .shard
            .run_step(ctx.shard.owner(bucket, key), move |s| {
                s.tier.get(b, k, range, head_only, c)
            })
            .await?;
        let changed =
            matches!((&result, &part), (Ok((m, _, _)), Some((_, etag))) if m.etag != *etag);
        if !changed || attempts >= 3 {
            return Ok((result, part.map(|(p, _)| p)));
        }
    }
}

/// Sets the headers the `response-*` query parameters ask for, over this one response's
/// (S3's GetObject).
fn response_overrides(ctx: &Ctx, mut resp: http::response::Builder) -> http::response::Builder {
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
    resp
}

/// The response to a GET or HEAD that found `meta`: status, length, range, the object's
/// headers and (for a part read with checksum mode on) the part's checksum.
fn found_response(
    ctx: &Ctx,
    meta: &ObjectMeta,
    range: Option<yutu_api::ByteRange>,
    part: Option<&ObjectPart>,
) -> http::response::Builder {
    let checksum_mode = ctx
        .header("x-amz-checksum-mode")
        .is_some_and(|v| v.eq_ignore_ascii_case("enabled"));
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
    resp = meta::to_response(resp, meta, checksum_mode, range.is_some());
    if let (Some(p), Some(c), true) = (part, &meta.checksum, checksum_mode) {
        // A part read carries the part's own checksum (of the object's algorithm and type),
        // which describes exactly the bytes sent.
        if let Some(v) = &p.checksum {
            resp = resp
                .header(c.algorithm.header(), v.as_str())
                .header("x-amz-checksum-type", c.type_name());
        }
    }
    if ctx.peer.is_some() {
        // Another node reading a copy (a copy source, a re-replication) gets the metadata
        // whole.
        if let Some(v) = crate::cluster::replica::encode_meta_header(meta) {
            resp = resp.header(yutu_api::cluster::REPLICA_META_HEADER, v);
        }
    }
    resp
}

/// `?partNumber=N` of a GET/HEAD: `None` without one; refused unless 1 to 10,000.
fn part_number(ctx: &Ctx) -> Result<Option<u32>, S3Error> {
    match ctx.target.param("partNumber") {
        None => Ok(None),
        Some(n) => n
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=crate::store::multipart::MAX_PART_NUMBER).contains(n))
            .map(Some)
            .ok_or_else(|| {
                S3Error::new(S3ErrorCode::InvalidArgument)
                    .msg("Part number must be an integer between 1 and 10000, inclusive")
            }),
    }
}

/// Part `n` of the object: `None` for part 1 of an object not made by a multipart upload,
/// which is the whole object (as S3 reads it); InvalidPart past the last part.
fn part_of(meta: &ObjectMeta, n: u32) -> Result<Option<ObjectPart>, S3Error> {
    let invalid = || {
        S3Error::new(S3ErrorCode::InvalidPart).msg(format!(
            "The requested partnumber {n} is not satisfiable: the object has {} part(s).",
            meta.parts.as_ref().map_or(1, |p| p.count)
        ))
    };
    let Some(layout) = &meta.parts else {
        return if n == 1 { Ok(None) } else { Err(invalid()) };
    };
    if n > layout.count {
        return Err(invalid());
    }
    match layout.part(n) {
        Some(p) => Ok(Some(p)),
        // Completed before Yutu recorded part sizes: the part's bytes cannot be told apart.
        None => Err(S3Error::new(S3ErrorCode::NotImplemented).msg(
            "The part boundaries of this object were not recorded when it was completed; read it whole or by Range.",
        )),
    }
}

/// The conditions of a DeleteObject: `If-Match`, `x-amz-if-match-last-modified-time`,
/// `x-amz-if-match-size`. S3 honours them (on directory buckets; Ceph RGW on every bucket).
/// Ignoring them would delete an object the client meant to keep.
fn delete_conditions(ctx: &Ctx) -> Result<DeleteConditions, S3Error> {
    DeleteConditions::from_headers(&ctx.headers)
        .map_err(|e| S3Error::new(S3ErrorCode::InvalidArgument).msg(e.to_string()))
}

/// DeleteObject; `incarnation` is the bucket's as the permission check saw it. A conditional
/// delete checks the current object and deletes it in one step on the shard that owns the
/// key (its metadata is in memory in every tier), so no write comes in between; a missing
/// key is deleted as ever (204), as S3 answers.
pub async fn delete(
    ctx: &Ctx,
    bucket: &str,
    key: &str,
    incarnation: Option<u64>,
) -> Result<Resp, S3Error> {
    check_key(key)?;
    let cond = delete_conditions(ctx)?;
    let (b, k) = (bucket.to_string(), key.to_string());
    // A replica delete keeps its coordinator's version; a client's is stamped here.
    let version = ctx.replica_version();
    let applied = ctx
        .shard
        .run_step(ctx.shard.owner(bucket, key), move |s| {
            if !cond.is_empty() {
                let current =
                    s.tier
                        .get(b.clone(), k.clone(), None, true, ReadConditions::default());
                let failed = match current {
                    Step::Done(Ok((meta, _, _))) => !cond.check(&meta),
                    Step::Done(Err(StoreError::NoSuchKey)) => false,
                    Step::Done(Err(e)) => return Step::Done(Err(e)),
                    // A metadata read never waits; were it to, the delete follows it.
                    Step::Wait(f) => {
                        let tier = s.tier.clone();
                        return Step::Wait(Box::pin(async move {
                            match f.await {
                                Ok((meta, _, _)) if !cond.check(&meta) => {
                                    Err(StoreError::PreconditionFailed)
                                }
                                Err(e) if e != StoreError::NoSuchKey => Err(e),
                                _ => {
                                    match tier.delete_versioned(b, vec![k], version, incarnation) {
                                        Step::Done(r) => r,
                                        Step::Wait(f) => f.await,
                                    }
                                }
                            }
                        }));
                    }
                };
                if failed {
                    return Step::Done(Err(StoreError::PreconditionFailed));
                }
            }
            s.tier.delete_versioned(b, vec![k], version, incarnation)
        })
        .await??;
    ctx.deleted_as.set(Some(applied.0));
    Ok(empty(StatusCode::NO_CONTENT))
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
        Op::PutObject => put(ctx, body, b, k, incarnation).await,
        Op::DeleteObject => delete(ctx, b, k, incarnation).await,
        Op::HeadObject => get(ctx, b, k, true, gate).await,
        Op::GetObject => get(ctx, b, k, false, gate).await,
        _ => Err(crate::http::endpoint::not_served(op)),
    }
}
