//! Bucket operations: ListBuckets, CreateBucket, DeleteBucket, HeadBucket, GetBucketLocation,
//! ListObjects (v1) and ListObjectsV2.

use std::rc::Rc;

use bytes::Bytes;
use http::{header, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use yutu_api::xml::{
    to_xml, BucketEntry, Buckets, CommonPrefix, ListAllMyBucketsResult, ListBucketResult,
    ObjectEntry, Owner, S3_NS,
};
use yutu_api::{validate_bucket_name, S3ErrorCode};

use super::error::S3Error;
use super::target::Target;
use super::{body, xml_response, Resp};
use crate::listing::{merge, ListItem, ListQuery};
use crate::shard::{Request, Shard};

/// Most keys one listing page returns, and the default (S3's).
pub const MAX_KEYS: usize = 1000;

fn owner() -> Owner {
    Owner {
        id: "yutu".into(),
        display_name: "yutu".into(),
    }
}

pub fn list_buckets(shard: &Rc<Shard>) -> Result<Resp, S3Error> {
    let bucket = shard
        .store
        .borrow()
        .buckets()
        .into_iter()
        .map(|b| BucketEntry {
            name: b.name,
            creation_date: humantime::format_rfc3339_millis(b.created).to_string(),
        })
        .collect();
    let doc = ListAllMyBucketsResult {
        xmlns: S3_NS,
        owner: owner(),
        buckets: Buckets { bucket },
    };
    Ok(xml_response(
        StatusCode::OK,
        to_xml("ListAllMyBucketsResult", &doc),
    ))
}

pub async fn create(
    shard: &Rc<Shard>,
    req: http::Request<Incoming>,
    bucket: &str,
) -> Result<Resp, S3Error> {
    validate_bucket_name(bucket)
        .map_err(|e| S3Error::new(S3ErrorCode::InvalidBucketName).msg(format!("{e}.")))?;
    // The optional CreateBucketConfiguration names a region; a single-region store accepts
    // any and ignores it, but still reads it (bounded) so the connection stays usable.
    body::read_limited(req.into_body(), None, 64 * 1024).await?;
    let name = bucket.to_string();
    shard
        .call(0, |reply| Request::CreateBucket { name, reply })
        .await??;
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(header::LOCATION, format!("/{bucket}"))
        .body(Full::new(Bytes::new()))
        .unwrap_or_default())
}

pub async fn delete(shard: &Rc<Shard>, bucket: &str) -> Result<Resp, S3Error> {
    let name = bucket.to_string();
    shard
        .call(0, |reply| Request::DeleteBucket { name, reply })
        .await??;
    Ok(Response::builder()
        .status(StatusCode::NO_CONTENT)
        .body(Full::new(Bytes::new()))
        .unwrap_or_default())
}

pub fn head(shard: &Rc<Shard>, bucket: &str) -> Result<Resp, S3Error> {
    if !shard.store.borrow().bucket_exists(bucket) {
        return Err(S3Error::new(S3ErrorCode::NoSuchBucket));
    }
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header("x-amz-bucket-region", "us-east-1")
        .body(Full::new(Bytes::new()))
        .unwrap_or_default())
}

pub fn location(shard: &Rc<Shard>, bucket: &str) -> Result<Resp, S3Error> {
    if !shard.store.borrow().bucket_exists(bucket) {
        return Err(S3Error::new(S3ErrorCode::NoSuchBucket));
    }
    let xml = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<LocationConstraint xmlns=\"{S3_NS}\"/>"
    );
    Ok(xml_response(StatusCode::OK, xml))
}

/// Characters S3 leaves unencoded with `encoding-type=url`.
const URL_SAFE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'/');

fn invalid(msg: &str) -> S3Error {
    S3Error::new(S3ErrorCode::InvalidArgument).msg(msg)
}

/// ListObjectsV2 when `list-type=2`, ListObjects (v1) otherwise.
pub async fn list_objects(shard: &Rc<Shard>, t: &Target, bucket: &str) -> Result<Resp, S3Error> {
    let v2 = match t.param("list-type") {
        None => false,
        Some("2") => true,
        Some(_) => return Err(invalid("Invalid list-type; only 2 is supported.")),
    };
    let max_keys = match t.param("max-keys") {
        None => MAX_KEYS,
        Some(s) => s
            .parse::<usize>()
            .map_err(|_| invalid("max-keys must be a non-negative integer."))?
            .min(MAX_KEYS),
    };
    let url_encode = match t.param("encoding-type") {
        None => false,
        Some("url") => true,
        Some(_) => return Err(invalid("Invalid Encoding Method specified in Request")),
    };
    let prefix = t.param("prefix").unwrap_or("").to_string();
    let delimiter = t
        .param("delimiter")
        .filter(|d| !d.is_empty())
        .map(str::to_string);
    let token = t.param("continuation-token").map(str::to_string);
    let after = if v2 {
        match &token {
            Some(tok) => Some(
                hex::decode(tok)
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok())
                    .ok_or_else(|| invalid("The continuation token provided is incorrect"))?,
            ),
            None => t.param("start-after").map(str::to_string),
        }
    } else {
        t.param("marker").map(str::to_string)
    };
    if !shard.store.borrow().bucket_exists(bucket) {
        return Err(S3Error::new(S3ErrorCode::NoSuchBucket));
    }

    let (items, truncated) = if max_keys == 0 {
        (Vec::new(), false)
    } else {
        let query = ListQuery {
            prefix: prefix.clone(),
            delimiter: delimiter.clone(),
            after,
            limit: max_keys,
        };
        let pages = shard
            .broadcast(|reply| Request::List {
                bucket: bucket.to_string(),
                query: query.clone(),
                reply,
            })
            .await?;
        let pages = pages.into_iter().collect::<Result<Vec<_>, _>>()?;
        merge(pages, max_keys)
    };

    let enc = |s: &str| -> String {
        if url_encode {
            utf8_percent_encode(s, URL_SAFE).to_string()
        } else {
            s.to_string()
        }
    };
    let last = items.last().map(|i| i.name().to_string());
    let mut contents = Vec::new();
    let mut common_prefixes = Vec::new();
    for item in items {
        match item {
            ListItem::Object {
                key,
                size,
                etag,
                last_modified,
            } => contents.push(ObjectEntry {
                key: enc(&key),
                last_modified: humantime::format_rfc3339_millis(last_modified).to_string(),
                etag,
                size,
                storage_class: "STANDARD",
            }),
            ListItem::Prefix(p) => common_prefixes.push(CommonPrefix { prefix: enc(&p) }),
        }
    }
    let mut doc = ListBucketResult {
        xmlns: S3_NS,
        name: bucket.to_string(),
        prefix: enc(&prefix),
        max_keys,
        delimiter: delimiter.as_deref().map(enc),
        encoding_type: url_encode.then_some("url"),
        is_truncated: truncated,
        ..Default::default()
    };
    if v2 {
        doc.key_count = Some(contents.len() + common_prefixes.len());
        doc.continuation_token = token;
        doc.start_after = t.param("start-after").map(enc);
        if truncated {
            doc.next_continuation_token = last.map(|l| hex::encode(l.as_bytes()));
        }
    } else {
        doc.marker = Some(enc(t.param("marker").unwrap_or("")));
        if truncated && delimiter.is_some() {
            doc.next_marker = last.map(|l| enc(&l));
        }
    }
    doc.contents = contents;
    doc.common_prefixes = common_prefixes;
    Ok(xml_response(
        StatusCode::OK,
        to_xml("ListBucketResult", &doc),
    ))
}
