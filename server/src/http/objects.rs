//! Object operations: PutObject, GetObject (with Range), HeadObject, DeleteObject.

use std::rc::Rc;
use std::time::SystemTime;

use base64::Engine;
use bytes::Bytes;
use http::{header, HeaderMap, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use md5::{Digest, Md5};
use yutu_api::{parse_range, validate_object_key, KeyError, S3ErrorCode};

use super::error::S3Error;
use super::{body, Resp};
use crate::shard::{Request, Shard};
use crate::store::ObjectMeta;

/// Most bytes of `x-amz-meta-*` names and values one object may carry (S3's limit).
pub const MAX_USER_METADATA: usize = 2048;

pub fn check_key(key: &str) -> Result<(), S3Error> {
    validate_object_key(key).map_err(|e| {
        let code = match e {
            KeyError::TooLong(_) => S3ErrorCode::KeyTooLongError,
            _ => S3ErrorCode::InvalidArgument,
        };
        S3Error::new(code).msg(format!("{e}."))
    })
}

fn content_length(headers: &HeaderMap) -> Result<Option<u64>, S3Error> {
    match headers.get(header::CONTENT_LENGTH) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.parse().ok())
            .map(Some)
            .ok_or_else(|| {
                S3Error::new(S3ErrorCode::InvalidArgument).msg("Invalid Content-Length.")
            }),
    }
}

fn user_metadata(headers: &HeaderMap) -> Result<Vec<(String, String)>, S3Error> {
    let mut out = Vec::new();
    let mut total = 0;
    for (name, value) in headers {
        if let Some(suffix) = name.as_str().strip_prefix("x-amz-meta-") {
            let value = value.to_str().map_err(|_| {
                S3Error::new(S3ErrorCode::InvalidArgument)
                    .msg(format!("The value of {name} is not printable ASCII."))
            })?;
            total += suffix.len() + value.len();
            out.push((suffix.to_string(), value.to_string()));
        }
    }
    if total > MAX_USER_METADATA {
        return Err(S3Error::new(S3ErrorCode::MetadataTooLarge).msg(format!(
            "Your metadata headers are {total} bytes; the maximum is {MAX_USER_METADATA}."
        )));
    }
    Ok(out)
}

fn content_md5(headers: &HeaderMap) -> Result<Option<[u8; 16]>, S3Error> {
    let Some(v) = headers.get("content-md5") else {
        return Ok(None);
    };
    base64::engine::general_purpose::STANDARD
        .decode(v.as_bytes())
        .ok()
        .and_then(|d| <[u8; 16]>::try_from(d.as_slice()).ok())
        .map(Some)
        .ok_or_else(|| S3Error::new(S3ErrorCode::InvalidDigest))
}

pub async fn put(
    shard: &Rc<Shard>,
    req: http::Request<Incoming>,
    bucket: &str,
    key: &str,
) -> Result<Resp, S3Error> {
    check_key(key)?;
    if req.headers().contains_key("x-amz-copy-source") {
        return Err(
            S3Error::new(S3ErrorCode::NotImplemented).msg("CopyObject is not implemented yet.")
        );
    }
    let length = content_length(req.headers())?;
    let chunked = req
        .headers()
        .get(header::TRANSFER_ENCODING)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"chunked"));
    if length.is_none() && !chunked {
        return Err(S3Error::new(S3ErrorCode::MissingContentLength));
    }
    let shard_capacity = shard.store.borrow().capacity();
    let limit = shard.settings.max_object_size.min(shard_capacity);
    if let Some(n) = length {
        if n > shard.settings.max_object_size {
            return Err(S3Error::new(S3ErrorCode::EntityTooLarge).msg(format!(
                "Your proposed upload of {n} bytes exceeds the maximum object size of {} bytes.",
                shard.settings.max_object_size
            )));
        }
        if n > shard_capacity {
            return Err(S3Error::new(S3ErrorCode::EntityTooLarge).msg(format!(
                "An object of {n} bytes does not fit in a shard's DRAM capacity of {shard_capacity} bytes."
            )));
        }
    }
    if !shard.store.borrow().bucket_exists(bucket) {
        return Err(S3Error::new(S3ErrorCode::NoSuchBucket));
    }
    let user_meta = user_metadata(req.headers())?;
    let want_md5 = content_md5(req.headers())?;
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let data = body::read_limited(req.into_body(), length, limit).await?;
    shard.metrics.bytes_in.add(data.len() as u64);
    let digest: [u8; 16] = Md5::digest(&data).into();
    if want_md5.is_some_and(|m| m != digest) {
        return Err(S3Error::new(S3ErrorCode::BadDigest));
    }
    let meta = ObjectMeta {
        size: data.len() as u64,
        etag: format!("\"{}\"", hex::encode(digest)),
        last_modified: SystemTime::now(),
        content_type,
        user_meta,
    };
    let (b, k) = (bucket.to_string(), key.to_string());
    let stored = shard
        .call(shard.owner(bucket, key), |reply| Request::Put {
            bucket: b,
            key: k,
            data,
            meta,
            reply,
        })
        .await??;
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(header::ETAG, &stored.etag)
        .body(Full::new(Bytes::new()))
        .unwrap_or_default())
}

pub async fn get(
    shard: &Rc<Shard>,
    headers: &HeaderMap,
    bucket: &str,
    key: &str,
    head_only: bool,
) -> Result<Resp, S3Error> {
    check_key(key)?;
    let range = headers
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(parse_range);
    let (b, k) = (bucket.to_string(), key.to_string());
    let (meta, range, data) = shard
        .call(shard.owner(bucket, key), |reply| Request::Get {
            bucket: b,
            key: k,
            range,
            head_only,
            reply,
        })
        .await??;
    let length = range.map_or(meta.size, |r| r.len());
    let mut resp = Response::builder()
        .status(if range.is_some() {
            StatusCode::PARTIAL_CONTENT
        } else {
            StatusCode::OK
        })
        .header(header::CONTENT_LENGTH, length)
        .header(header::ETAG, &meta.etag)
        .header(
            header::LAST_MODIFIED,
            httpdate::fmt_http_date(meta.last_modified),
        )
        .header(header::ACCEPT_RANGES, "bytes")
        .header(
            header::CONTENT_TYPE,
            meta.content_type
                .as_deref()
                .unwrap_or("binary/octet-stream"),
        );
    if let Some(r) = range {
        resp = resp.header(header::CONTENT_RANGE, r.content_range(meta.size));
    }
    for (name, value) in &meta.user_meta {
        resp = resp.header(format!("x-amz-meta-{name}"), value);
    }
    shard.metrics.bytes_out.add(data.len() as u64);
    resp.body(Full::new(data)).map_err(|e| {
        tracing::error!(error = %e, "cannot build a GET response");
        S3Error::new(S3ErrorCode::InternalError)
    })
}

pub async fn delete(shard: &Rc<Shard>, bucket: &str, key: &str) -> Result<Resp, S3Error> {
    check_key(key)?;
    let (b, k) = (bucket.to_string(), key.to_string());
    shard
        .call(shard.owner(bucket, key), |reply| Request::Delete {
            bucket: b,
            key: k,
            reply,
        })
        .await??;
    Ok(Response::builder()
        .status(StatusCode::NO_CONTENT)
        .body(Full::new(Bytes::new()))
        .unwrap_or_default())
}
