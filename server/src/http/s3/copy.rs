//! CopyObject, and reading the source of a copy (also for UploadPartCopy).

use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use http::StatusCode;
use percent_encoding::percent_decode_str;
use yutu_api::xml::{to_xml, CopyResult, S3_NS};
use yutu_api::{RangeSpec, S3ErrorCode};

use super::objects::{bucket_must_exist, check_key, check_write_conditions, object_limit, store};
use crate::http::ctx::Ctx;
use crate::http::error::S3Error;
use crate::http::{s3::meta, xml_response, Resp};
use crate::model::checksum::{md5, Algorithm, Checksum};
use crate::model::conditions::{ReadConditions, WriteConditions};
use crate::model::{ObjectMeta, StoreError};

/// `x-amz-copy-source`: `bucket/key` or `/bucket/key`, percent-encoded, optionally with
/// `?versionId=null`.
pub fn parse_copy_source(v: &str) -> Result<(String, String), S3Error> {
    let bad = || {
        S3Error::new(S3ErrorCode::InvalidArgument)
            .msg("Copy Source must mention the source bucket and key: sourcebucket/sourcekey.")
    };
    let (path, query) = match v.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (v, None),
    };
    if let Some(q) = query {
        if q.strip_prefix("versionId=").is_some_and(|id| id != "null") {
            return Err(
                S3Error::new(S3ErrorCode::InvalidArgument).msg("Invalid version id specified")
            );
        }
    }
    let decoded = percent_decode_str(path.trim_start_matches('/'))
        .decode_utf8()
        .map_err(|_| bad())?;
    let (bucket, key) = decoded.split_once('/').ok_or_else(bad)?;
    if bucket.is_empty() || key.is_empty() {
        return Err(bad());
    }
    Ok((bucket.to_string(), key.to_string()))
}

/// The answer to an `x-amz-copy-source-range` that does not lie inside the source object:
/// InvalidRange, as Ceph RGW answers and ceph/s3-tests (`test_multipart_copy_invalid_range`)
/// expects, with the message S3 gives (S3 itself says InvalidArgument, 400; clients tell a
/// range refused from a malformed one by the code, which InvalidArgument no longer confuses).
pub fn invalid_source_range(size: u64) -> S3Error {
    S3Error::new(S3ErrorCode::InvalidRange).msg(format!(
        "Range specified is not valid for source object of size: {size}"
    ))
}

/// Reads the copy source named by the request, after checking the caller may read it and the
/// `x-amz-copy-source-if-*` conditions (any failure is a 412, as S3 answers).
pub async fn fetch_source(
    ctx: &Ctx,
    range: Option<RangeSpec>,
) -> Result<(Arc<ObjectMeta>, Bytes), S3Error> {
    let source = ctx.header("x-amz-copy-source").unwrap_or("");
    let (sb, sk) = parse_copy_source(source)?;
    check_key(&sk)?;
    ctx.allow_copy_source(&sb, &sk)?;
    let cond = ReadConditions::from_headers(&ctx.headers, "x-amz-copy-source-");
    let owner = ctx.shard.owner(&sb, &sk);
    let (bucket, key) = (sb.clone(), sk.clone());
    let c = cond.clone();
    let local = ctx
        .shard
        .run_step(owner, move |s| s.tier.get(bucket, key, range, false, c))
        .await?;
    let local = match (local, &ctx.cluster) {
        // In a cluster the source may live on other nodes.
        (Err(StoreError::NoSuchKey), Some(cluster)) => {
            crate::http::peer::cluster::fetch_source(cluster, &sb, &sk, range, &cond).await?
        }
        (other, _) => other,
    };
    let (meta, _, data) = local.map_err(|e| match e {
        StoreError::NotModified(_) => S3Error::new(S3ErrorCode::PreconditionFailed),
        // A copy-source range is never cut to the object as a GET's Range is: S3 refuses
        // it with the source's size.
        StoreError::InvalidRange { size } => invalid_source_range(size),
        e => S3Error::from(e).bucket(&sb).key(&sk),
    })?;
    Ok((meta, data))
}

/// CopyObject; `incarnation` is the destination bucket's as the permission check saw it.
pub async fn copy_object(
    ctx: &Ctx,
    bucket: &str,
    key: &str,
    incarnation: Option<u64>,
) -> Result<Resp, S3Error> {
    check_key(key)?;
    check_write_conditions(ctx)?;
    bucket_must_exist(ctx, bucket)?;
    let (src_meta, data) = fetch_source(ctx, None).await?;
    let (limit, what) = object_limit(ctx);
    if data.len() as u64 > limit {
        return Err(S3Error::new(S3ErrorCode::EntityTooLarge).msg(format!(
            "The source object exceeds {what} of {limit} bytes."
        )));
    }
    let replace = match ctx.header("x-amz-metadata-directive").unwrap_or("COPY") {
        "COPY" => false,
        "REPLACE" => true,
        _ => {
            return Err(
                S3Error::new(S3ErrorCode::InvalidArgument).msg("Unknown metadata directive.")
            )
        }
    };
    let (sb, sk) = parse_copy_source(ctx.header("x-amz-copy-source").unwrap_or(""))?;
    let new_alg = ctx
        .header("x-amz-checksum-algorithm")
        .and_then(Algorithm::from_name);
    if sb == bucket && sk == key && !replace && new_alg.is_none() {
        return Err(S3Error::new(S3ErrorCode::InvalidRequest).msg("This copy request is illegal because it is trying to copy an object to itself without changing the object's metadata, storage class, website redirect location or encryption attributes."));
    }
    let mut new = if replace {
        meta::from_request(&ctx.headers)?.into_object_meta()
    } else {
        (*src_meta).clone()
    };
    // The copy is the copier's, with the ACL its request names (private by default), as S3
    // does: the source's grants do not travel.
    super::acl::stamp_object(ctx, bucket, &mut new)?;
    new.size = data.len() as u64;
    new.etag = format!("\"{}\"", hex::encode(md5(&data)));
    new.last_modified = SystemTime::now();
    new.parts = None;
    // An S3 copy is an S3 write: it is a KV block only if its key is a block hash.
    new.kv = false;
    // The copy is a single-part object: a composite checksum of the source's parts no longer
    // describes it, so it is recomputed over the whole object.
    let alg = new_alg.or(src_meta.checksum.as_ref().map(|c| c.algorithm));
    new.checksum = alg.map(|a| Checksum {
        algorithm: a,
        value: a.digest(&data),
        composite_parts: None,
    });
    let cond = WriteConditions::for_bucket(&ctx.headers, incarnation);
    let stored = store(ctx, bucket, key, data, new, cond).await?;
    let doc = CopyResult {
        xmlns: S3_NS,
        last_modified: humantime::format_rfc3339_millis(stored.last_modified).to_string(),
        etag: stored.etag.clone(),
        checksum_crc32: None,
    };
    Ok(xml_response(
        StatusCode::OK,
        to_xml("CopyObjectResult", &doc),
    ))
}

/// Serves this file's object operations (the table is
/// [`Op::handler`](crate::http::endpoint::Op::handler)), once the caller may (`incarnation`
/// as for a bucket, `gate`: whether the object's ACL is still to be checked).
pub async fn serve_object(
    ctx: &Ctx,
    op: crate::http::endpoint::Op,
    b: &str,
    k: &str,
    _body: hyper::body::Incoming,
    incarnation: Option<u64>,
    _gate: crate::auth::Gate,
) -> Result<Resp, S3Error> {
    use crate::http::endpoint::Op;
    match op {
        Op::CopyObject => copy_object(ctx, b, k, incarnation).await,
        _ => Err(crate::http::endpoint::not_served(op)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_source_forms() {
        assert_eq!(
            parse_copy_source("/b/k%20x").unwrap(),
            ("b".into(), "k x".into())
        );
        assert_eq!(
            parse_copy_source("b/d/k?versionId=null").unwrap(),
            ("b".into(), "d/k".into())
        );
        assert!(parse_copy_source("b").is_err());
        assert!(parse_copy_source("/b/").is_err());
        assert!(parse_copy_source("b/k?versionId=123").is_err());
    }
}
