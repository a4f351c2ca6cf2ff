//! Copies between nodes: writing one object onto another node as a replica, deleting it there,
//! and asking whether a node holds it. Used by a write's coordinator (before it acknowledges)
//! and by re-replication and hand-off after the membership changes.
//!
//! A replica carries the coordinator's metadata whole ([`REPLICA_META_HEADER`]: the record
//! encoding the NVMe tier stores), so every copy has the same ETag (a multipart ETag is no
//! MD5 of the bytes), checksum, user metadata and modification time. The calls are signed with
//! this node's token, and the receiving node serves them locally (never forwards them).

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method};
use yutu_api::admin::{VersionsPage, VersionsRequest, LOCAL_VERSIONS_PATH};
use yutu_api::cluster::{
    Member, FORWARDED_HEADER, REPLICA_HEADER, REPLICA_META_HEADER, VERSION_HEADER,
};

use super::Cluster;
use crate::model::{ObjectMeta, Version};
use crate::net::client::Client;

#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    #[error("{node} cannot be reached: {reason}")]
    Unreachable { node: String, reason: String },
    #[error("{node} answered {status}: {message}")]
    Refused {
        node: String,
        status: u16,
        message: String,
    },
    #[error("cannot encode the object's metadata: {0}")]
    Meta(String),
}

/// Bytes of a path segment sent percent-encoded: everything but unreserved characters and `/`.
pub const PATH: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'/');

/// `/{bucket}/{key}`, encoded.
pub fn object_path(bucket: &str, key: &str) -> String {
    format!(
        "/{}/{}",
        percent_encoding::utf8_percent_encode(bucket, PATH),
        percent_encoding::utf8_percent_encode(key, PATH)
    )
}

/// Headers of a node's own read of another node's copy (re-replication, anti-entropy, a
/// copy source): the replica header has it served from what that node holds, even while it
/// is catching up (a forwarded client read would be refused then).
fn internal() -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(REPLICA_HEADER, HeaderValue::from_static("1"));
    h
}

/// Idle connections kept per peer and shard.
const POOL_PER_PEER: usize = 8;

thread_local! {
    static POOL: RefCell<HashMap<String, Vec<Client>>> = RefCell::new(HashMap::new());
}

/// How long one call may take: the bytes at a slow 8 MiB/s, plus the peer's own work.
fn timeout_for(len: usize) -> Duration {
    Duration::from_secs(10) + Duration::from_secs(len as u64 / (8 << 20))
}

async fn call(
    cluster: &Cluster,
    to: &Member,
    method: Method,
    path: &str,
    headers: HeaderMap,
    body: Bytes,
) -> Result<(u16, Bytes), ReplicaError> {
    let (status, _, body) = call_full(cluster, to, method, path, headers, body).await?;
    Ok((status, body))
}

async fn call_full(
    cluster: &Cluster,
    to: &Member,
    method: Method,
    path: &str,
    mut headers: HeaderMap,
    body: Bytes,
) -> Result<(u16, HeaderMap, Bytes), ReplicaError> {
    let unreachable = |reason: String| ReplicaError::Unreachable {
        node: to.name.clone(),
        reason,
    };
    let pooled = POOL.with(|p| p.borrow_mut().get_mut(&to.url).and_then(Vec::pop));
    let mut client = match pooled {
        Some(c) => c,
        None => {
            let c = Client::new(
                &to.url,
                timeout_for(body.len().max(cluster.max_object as usize)),
            )
            .map_err(|e| unreachable(e.to_string()))?
            .with_max_reply(cluster.max_object.saturating_add(1 << 20) as usize);
            match cluster.node_token() {
                Some(t) => c.with_bearer(&t).map_err(|e| unreachable(e.to_string()))?,
                None => c,
            }
        }
    };
    if let Ok(v) = HeaderValue::from_str(&cluster.node) {
        headers.insert(FORWARDED_HEADER, v);
    }
    let reply = client
        .send_with(method, path, headers, body)
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        let idle = p.entry(to.url.clone()).or_default();
        if idle.len() < POOL_PER_PEER {
            idle.push(client);
        }
    });
    Ok((reply.status, reply.headers, reply.body))
}

fn refused(to: &Member, status: u16, body: &[u8]) -> ReplicaError {
    ReplicaError::Refused {
        node: to.name.clone(),
        status,
        message: String::from_utf8_lossy(body).chars().take(300).collect(),
    }
}

/// Writes `data` with `meta` as `bucket/key` on `to`; whether a copy was written. With
/// `if_absent` a copy already there is kept (re-replication must not overwrite a newer write
/// the new owner took meanwhile) and `false` answered.
pub async fn push(
    cluster: &Cluster,
    to: &Member,
    bucket: &str,
    key: &str,
    meta: &ObjectMeta,
    data: Bytes,
    if_absent: bool,
) -> Result<bool, ReplicaError> {
    let encoded = crate::tier::record::encode_meta(meta, false)
        .map_err(|e| ReplicaError::Meta(e.to_string()))?;
    let mut headers = HeaderMap::new();
    headers.insert(REPLICA_HEADER, HeaderValue::from_static("1"));
    if if_absent {
        headers.insert(http::header::IF_NONE_MATCH, HeaderValue::from_static("*"));
    }
    let b64 = base64::engine::general_purpose::STANDARD.encode(encoded);
    headers.insert(
        REPLICA_META_HEADER,
        HeaderValue::from_str(&b64).map_err(|e| ReplicaError::Meta(e.to_string()))?,
    );
    let (status, body) = call(
        cluster,
        to,
        Method::PUT,
        &object_path(bucket, key),
        headers,
        data,
    )
    .await?;
    if (200..300).contains(&status) {
        Ok(true)
    } else if if_absent && status == 412 {
        Ok(false)
    } else {
        Err(refused(to, status, &body))
    }
}

/// Deletes `bucket/key` on `to` (absent counts as done) as of `version`: the owner keeps a
/// tombstone of it, and keeps an object newer than it.
pub async fn remove(
    cluster: &Cluster,
    to: &Member,
    bucket: &str,
    key: &str,
    version: Version,
) -> Result<(), ReplicaError> {
    let mut headers = HeaderMap::new();
    headers.insert(REPLICA_HEADER, HeaderValue::from_static("1"));
    if let Ok(v) = HeaderValue::from_str(&version.to_text()) {
        headers.insert(VERSION_HEADER, v);
    }
    let (status, body) = call(
        cluster,
        to,
        Method::DELETE,
        &object_path(bucket, key),
        headers,
        Bytes::new(),
    )
    .await?;
    if (200..300).contains(&status) || status == 404 {
        Ok(())
    } else {
        Err(refused(to, status, &body))
    }
}

/// Whether `to` holds `bucket/key` itself.
pub async fn holds(
    cluster: &Cluster,
    to: &Member,
    bucket: &str,
    key: &str,
) -> Result<bool, ReplicaError> {
    let (status, body) = call(
        cluster,
        to,
        Method::HEAD,
        &object_path(bucket, key),
        internal(),
        Bytes::new(),
    )
    .await?;
    match status {
        200 => Ok(true),
        404 => Ok(false),
        _ => Err(refused(to, status, &body)),
    }
}

/// The versions `to` holds of a page of keys it owns with this node (anti-entropy).
pub async fn versions(
    cluster: &Cluster,
    to: &Member,
    req: &VersionsRequest,
) -> Result<VersionsPage, ReplicaError> {
    let body = serde_json::to_vec(req).map_err(|e| ReplicaError::Meta(e.to_string()))?;
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    let (status, body) = call(
        cluster,
        to,
        Method::POST,
        LOCAL_VERSIONS_PATH,
        headers,
        Bytes::from(body),
    )
    .await?;
    if status != 200 {
        return Err(refused(to, status, &body));
    }
    serde_json::from_slice(&body).map_err(|e| ReplicaError::Refused {
        node: to.name.clone(),
        status,
        message: format!("an unreadable versions page: {e}"),
    })
}

/// The version of `bucket/key` that `to` holds itself (`None`: it holds no object).
pub async fn held_version(
    cluster: &Cluster,
    to: &Member,
    bucket: &str,
    key: &str,
) -> Result<Option<Version>, ReplicaError> {
    let (status, headers, body) = call_full(
        cluster,
        to,
        Method::HEAD,
        &object_path(bucket, key),
        internal(),
        Bytes::new(),
    )
    .await?;
    match status {
        200 => Ok(Some(
            headers
                .get(REPLICA_META_HEADER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| decode_meta(v, 0))
                .map_or(Version::ZERO, |m| m.version),
        )),
        404 => Ok(None),
        _ => Err(refused(to, status, &body)),
    }
}

/// Decodes a replica's metadata header for an object of `size` bytes.
pub fn decode_meta(header: &str, size: u64) -> Option<ObjectMeta> {
    let raw = base64::engine::general_purpose::STANDARD
        .decode(header.trim())
        .ok()?;
    crate::tier::record::decode_meta(&raw, size)
}

/// The object `bucket/key` as `to` holds it (metadata whole), or `None` when it does not.
pub async fn fetch(
    cluster: &Cluster,
    to: &Member,
    bucket: &str,
    key: &str,
) -> Result<Option<(ObjectMeta, Bytes)>, ReplicaError> {
    let (status, headers, body) = call_full(
        cluster,
        to,
        Method::GET,
        &object_path(bucket, key),
        internal(),
        Bytes::new(),
    )
    .await?;
    match status {
        200 => {
            let meta = headers
                .get(REPLICA_META_HEADER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| decode_meta(v, body.len() as u64))
                .ok_or_else(|| {
                    ReplicaError::Meta(format!("{} sent no object metadata", to.name))
                })?;
            Ok(Some((meta, body)))
        }
        404 => Ok(None),
        _ => Err(refused(to, status, &body)),
    }
}

/// Encodes an object's metadata for [`REPLICA_META_HEADER`].
pub fn encode_meta_header(meta: &ObjectMeta) -> Option<HeaderValue> {
    let raw = crate::tier::record::encode_meta(meta, false).ok()?;
    HeaderValue::from_str(&base64::engine::general_purpose::STANDARD.encode(raw)).ok()
}
