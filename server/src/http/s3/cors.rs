//! CORS over HTTP: Get/Put/DeleteBucketCors, the preflight `OPTIONS` a browser sends before a
//! cross-origin request, and the `Access-Control-*` headers on the requests themselves.
//!
//! A preflight carries no credentials (browsers never send them on one), so it is answered
//! from the bucket's rules alone, before authentication. The headers on a real request are
//! added to whatever it answers, errors included, so that a page can read why it failed.

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use yutu_api::cors::{request_headers, CorsConfiguration, CorsError, CorsRule, MAX_DOCUMENT};
use yutu_api::xml::{to_xml, S3_NS};
use yutu_api::S3ErrorCode;

use crate::http::body;
use crate::http::ctx::Ctx;
use crate::http::error::S3Error;
use crate::http::{xml_response, Resp};
use crate::node::buckets::{self, BucketChange};
use crate::node::Shard;

fn cors_error(e: CorsError) -> S3Error {
    let code = match e {
        CorsError::Malformed(_) => S3ErrorCode::MalformedXML,
        _ => S3ErrorCode::InvalidRequest,
    };
    S3Error::new(code).msg(e.to_string())
}

/// NoSuchBucket unless `bucket` exists: a configuration call on a missing bucket says so
/// (S3 and Ceph RGW answer 404 NoSuchBucket), before reading a body and rather than "no
/// configuration" (GET) or "deleted" (DELETE, 204).
fn bucket_exists(ctx: &Ctx, bucket: &str) -> Result<(), S3Error> {
    if ctx.shard.tier.bucket_exists(bucket) {
        Ok(())
    } else {
        Err(S3Error::new(S3ErrorCode::NoSuchBucket))
    }
}

pub fn get_bucket_cors(ctx: &Ctx, bucket: &str) -> Result<Resp, S3Error> {
    bucket_exists(ctx, bucket)?;
    let cors = ctx
        .shard
        .tier
        .bucket_cors(bucket)
        .ok_or_else(|| S3Error::new(S3ErrorCode::NoSuchCORSConfiguration))?;
    let doc = CorsConfiguration {
        xmlns: Some(S3_NS.to_string()),
        rules: cors.rules.clone(),
    };
    Ok(xml_response(
        StatusCode::OK,
        to_xml("CORSConfiguration", &doc),
    ))
}

async fn set(ctx: &Ctx, bucket: &str, cors: Option<CorsConfiguration>) -> Result<(), S3Error> {
    let change = BucketChange::Cors(cors);
    match &ctx.cluster {
        Some(cluster) => crate::cluster::buckets::change(&ctx.shard, cluster, bucket, change)
            .await
            .map_err(crate::http::common::bucket_error),
        None => Ok(buckets::change(&ctx.shard, bucket.to_string(), change).await?),
    }
}

pub async fn put_bucket_cors(ctx: &Ctx, body_in: Incoming, bucket: &str) -> Result<Resp, S3Error> {
    bucket_exists(ctx, bucket)?;
    let body = body::read_limited(ctx, body_in, MAX_DOCUMENT).await?;
    let text = std::str::from_utf8(&body.data)
        .map_err(|_| S3Error::new(S3ErrorCode::MalformedXML).msg("The document is not UTF-8."))?;
    let cors = CorsConfiguration::parse(text).map_err(cors_error)?;
    set(ctx, bucket, Some(cors)).await?;
    Ok(Response::builder()
        .status(StatusCode::OK)
        .body(Full::new(Bytes::new()))
        .unwrap_or_default())
}

pub async fn delete_bucket_cors(ctx: &Ctx, bucket: &str) -> Result<Resp, S3Error> {
    bucket_exists(ctx, bucket)?;
    set(ctx, bucket, None).await?;
    Ok(Response::builder()
        .status(StatusCode::NO_CONTENT)
        .body(Full::new(Bytes::new()))
        .unwrap_or_default())
}

fn header_text<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn insert(headers: &mut HeaderMap, name: &'static str, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        headers.insert(name, v);
    }
}

/// The headers a matching rule puts on an answer to `origin`.
fn allow(headers: &mut HeaderMap, rule: &CorsRule, origin: &str) {
    let allow_origin = rule.allow_origin(origin);
    insert(headers, "access-control-allow-origin", allow_origin);
    insert(
        headers,
        "access-control-allow-methods",
        &rule.allowed_method.join(", "),
    );
    if !rule.expose_header.is_empty() {
        insert(
            headers,
            "access-control-expose-headers",
            &rule.expose_header.join(", "),
        );
    }
    if let Some(age) = rule.max_age_seconds {
        insert(headers, "access-control-max-age", &age.to_string());
    }
    if allow_origin != "*" {
        insert(headers, "access-control-allow-credentials", "true");
    }
    headers.append(header::VARY, HeaderValue::from_static("Origin"));
}

/// The preflight `OPTIONS /bucket[/key]`: answered from the bucket's rules, without
/// credentials. A bucket that does not exist is NoSuchBucket (404), before the preflight's
/// own headers are looked at, as Ceph RGW answers: a browser then fails the request as
/// surely as on a 403, and a person reading the console learns why. In a cluster a bucket
/// this node has not heard of may still exist elsewhere: there it is AccessForbidden, as for
/// a bucket without rules.
pub fn preflight(
    shard: &Shard,
    bucket: Option<&str>,
    headers: &HeaderMap,
) -> Result<Resp, S3Error> {
    let bad = |m: &str| S3Error::new(S3ErrorCode::InvalidRequest).msg(m);
    let bucket = bucket.ok_or_else(|| bad("A CORS preflight names a bucket."))?;
    if shard.settings.cluster.is_none() && !shard.tier.bucket_exists(bucket) {
        return Err(S3Error::new(S3ErrorCode::NoSuchBucket));
    }
    let origin = header_text(headers, "origin")
        .ok_or_else(|| bad("Insufficient information. Origin request header needed."))?;
    let method = header_text(headers, "access-control-request-method")
        .filter(|m| yutu_api::cors::METHODS.contains(m))
        .ok_or_else(|| bad("Invalid Access-Control-Request-Method."))?;
    let wanted = header_text(headers, "access-control-request-headers")
        .map(request_headers)
        .unwrap_or_default();
    let cors = shard.tier.bucket_cors(bucket);
    let rule = cors
        .as_deref()
        .and_then(|c| c.find(origin, method, &wanted))
        .ok_or_else(|| S3Error::new(S3ErrorCode::AccessForbidden))?;
    let mut resp = Response::builder()
        .status(StatusCode::OK)
        .body(Full::new(Bytes::new()))
        .unwrap_or_default();
    let out = resp.headers_mut();
    allow(out, rule, origin);
    if !wanted.is_empty() {
        insert(out, "access-control-allow-headers", &wanted.join(", "));
    }
    Ok(resp)
}

/// Adds the `Access-Control-*` headers to the answer of a request from `origin` to `bucket`,
/// when one of the bucket's rules allows its method.
pub fn decorate(shard: &Shard, bucket: &str, origin: &str, method: &Method, resp: &mut Resp) {
    if resp.headers().contains_key("access-control-allow-origin") {
        return;
    }
    let Some(cors) = shard.tier.bucket_cors(bucket) else {
        return;
    };
    if let Some(rule) = cors.find(origin, method.as_str(), &[]) {
        allow(resp.headers_mut(), rule, origin);
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
        Op::GetBucketCors => get_bucket_cors(ctx, b),
        Op::PutBucketCors => put_bucket_cors(ctx, body, b).await,
        Op::DeleteBucketCors => delete_bucket_cors(ctx, b).await,
        _ => Err(crate::http::endpoint::not_served(op)),
    }
}
