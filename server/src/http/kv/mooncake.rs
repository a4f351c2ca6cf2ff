//! Mooncake master's read-only HTTP query endpoints (`GET /get_all_segments`, `/query_key`,
//! `/batch_query_keys`), so that engines and routers pointed at this node as their Mooncake
//! "master" work unchanged. The answers are the wire types of [`yutu_api::mooncake_master`].
//!
//! **Routing.** A path-style `GET` of exactly one of the three paths (any query string) is
//! this API, never S3: `get_all_segments`, `query_key` and `batch_query_keys` hold `_`, which
//! no valid bucket name does ([`yutu_api::validate_bucket_name`]), so no bucket is shadowed.
//! Any other method, a key under them (`/query_key/x`) or a virtual-host-style request stays
//! S3 (and fails as an invalid bucket name).
//!
//! **Bucket and permission.** `bucket=` names the bucket queried (Mooncake's tenant;
//! `default` when absent). A key query is allowed exactly when the KV API's `exists` on that
//! bucket is: [`Ctx::allow`] with [`Action::Read`] (bucket-level grants and token scopes;
//! anonymous callers only where that allows them, which is never for an existing bucket, as
//! bucket ACLs grant listing, not reading). A refusal is S3's `AccessDenied` (403). A bucket
//! that does not exist answers every key as `OBJECT_NOT_FOUND`. `/get_all_segments` names
//! member addresses only and is allowed like `GET /v1/cluster`: to every caller with
//! credentials.
//!
//! **Cluster.** A key's copies are this node's (when it holds the key) and those of the key's
//! owners ([`crate::cluster::View::owners`]): the request is forwarded as it came (the owner
//! checks the client itself and answers from its own shards only) to every other owner of any
//! key asked, all at once, with a short deadline. A key found nowhere while one of its owners
//! did not answer is `RPC_FAIL` instead of `OBJECT_NOT_FOUND`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use bytes::Bytes;
use http::{header, Response, StatusCode};
use http_body_util::Full;
use percent_encoding::percent_decode_str;
use serde::Serialize;
use yutu_api::kv::MAX_BATCH;
use yutu_api::mooncake_master::{
    BatchError, BatchQueryResponse, ErrorResponse, KeyResult, QueryKeyResponse, Replica,
    DEFAULT_BUCKET, INVALID_KEY, INVALID_KEY_CODE, JSON_CONTENT_TYPE, NO_KEYS, OBJECT_NOT_FOUND,
    OBJECT_NOT_FOUND_CODE, PROTOCOL_TCP, RPC_FAIL, RPC_FAIL_CODE, SEGMENTS_CONTENT_TYPE,
};
use yutu_api::S3ErrorCode;

use crate::auth::{Action, Identity};
use crate::cluster::ClusterMetrics;
use crate::http::ctx::Ctx;
use crate::http::error::S3Error;
use crate::http::peer::forward;
use crate::http::target::Target;
use crate::http::Resp;

/// Longest wait for an owner's answer (after [`forward::CONNECT_TIMEOUT`] to connect): these
/// are metadata queries, so a slow owner is reported as such rather than waited for.
pub const OWNER_DEADLINE: Duration = Duration::from_secs(3);

/// Largest owner's answer read (a batch of [`MAX_BATCH`] keys, several copies each).
const OWNER_ANSWER_LIMIT: u64 = 16 << 20;

pub use crate::http::endpoint::MooncakeEndpoint as Endpoint;

pub async fn serve(ctx: &Ctx, endpoint: Endpoint) -> Result<Resp, S3Error> {
    match endpoint {
        Endpoint::Segments => segments(ctx),
        Endpoint::QueryKey => query_key(ctx).await,
        Endpoint::BatchQueryKeys => batch_query_keys(ctx).await,
    }
}

// ---- query parsing ----------------------------------------------------------------------------

/// The raw (still encoded) value of the first `name=` in a query string.
fn raw_param<'a>(query: &'a str, name: &str) -> Option<&'a str> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == name).then_some(v)
    })
}

/// `key=` of `/query_key`. Mooncake does not URL-decode it; Yutu decodes percent-escapes
/// (so both an encoded and a plain key are found) but leaves `+` as it is, and keeps the value
/// as sent where decoding does not give UTF-8.
pub fn query_key_param(query: Option<&str>) -> Option<String> {
    let raw = raw_param(query?, "key")?;
    Some(match percent_decode_str(raw).decode_utf8() {
        Ok(k) => k.into_owned(),
        Err(_) => raw.to_string(),
    })
}

/// The keys of `/batch_query_keys`: `keys=` URL-decoded and split on `,` (empty pieces
/// dropped), in the order given, repeats kept.
pub fn batch_keys_param(target: &Target) -> Vec<String> {
    target
        .param("keys")
        .map(|v| {
            v.split(',')
                .filter(|k| !k.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// `bucket=`, [`DEFAULT_BUCKET`] when absent or empty.
pub fn bucket_param(target: &Target) -> &str {
    target
        .param("bucket")
        .filter(|b| !b.is_empty())
        .unwrap_or(DEFAULT_BUCKET)
}

// ---- answers ----------------------------------------------------------------------------------

fn json(status: StatusCode, value: &impl Serialize) -> Resp {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, JSON_CONTENT_TYPE)
        .body(Full::new(Bytes::from(
            serde_json::to_vec(value).unwrap_or_default(),
        )))
        .unwrap_or_default()
}

/// This node's transfer-engine address, as `/v1/kv/engine` and its cluster record give it
/// (its name when it has no engine).
fn own_endpoint(ctx: &Ctx) -> String {
    ctx.shard
        .transfer
        .as_ref()
        .and_then(|(engine, _)| engine.address().tcp)
        .map(|a| a.to_string())
        .unwrap_or_else(|| ctx.shard.settings.node_name.clone())
}

/// `GET /get_all_segments`: a line per member (or this node alone), its transfer address.
fn segments(ctx: &Ctx) -> Result<Resp, S3Error> {
    if matches!(ctx.identity(), Identity::Anonymous) {
        // As `GET /v1/cluster`: member addresses, to any caller with credentials.
        return Err(S3Error::new(S3ErrorCode::AccessDenied)
            .msg("Anonymous access is not allowed here; sign the request or send a token."));
    }
    let mut names = Vec::new();
    let mut listed_self = false;
    if let Some(cluster) = &ctx.cluster {
        for m in &cluster.view().members {
            if m.name == cluster.node {
                listed_self = true;
                names.push(own_endpoint(ctx));
                continue;
            }
            names.push(m.transfer.clone().unwrap_or_else(|| {
                forward::authority(&m.url)
                    .map(str::to_string)
                    .unwrap_or_else(|| m.name.clone())
            }));
        }
    }
    if !listed_self {
        names.push(own_endpoint(ctx));
    }
    let body: String = names.into_iter().map(|n| n + "\n").collect();
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, SEGMENTS_CONTENT_TYPE)
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_default())
}

/// The bucket asked, once the caller may read its keys; `None` when it does not exist.
async fn readable_bucket(ctx: &Ctx) -> Result<Option<String>, S3Error> {
    let bucket = bucket_param(&ctx.target).to_string();
    yutu_api::validate_bucket_name(&bucket).map_err(|e| {
        S3Error::new(S3ErrorCode::InvalidBucketName)
            .msg(format!("{e}."))
            .bucket(&bucket)
    })?;
    if let Some(cluster) = &ctx.cluster {
        crate::http::peer::cluster::know_bucket(ctx, cluster, &bucket).await;
    }
    // The KV API's decision for `exists` on the bucket.
    ctx.allow(Action::Read, Some(&bucket))
        .map_err(|e| e.bucket(&bucket))?;
    let exists = ctx.shard.tier.bucket_exists(&bucket);
    Ok(exists.then_some(bucket))
}

/// What became of one key.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Found {
    Copies(Vec<Replica>),
    Missing,
    /// Not found, and an owner of it did not answer.
    Unknown,
}

/// The sizes of the keys this node holds (`None`: not here).
async fn local_sizes(
    ctx: &Ctx,
    bucket: &str,
    keys: &[String],
) -> Result<Vec<Option<u64>>, S3Error> {
    Ok(crate::kv::calls::sizes(&ctx.shard, bucket, keys).await?)
}

/// The copies of `keys` (distinct, valid) this node and their owners know of.
async fn lookup(
    ctx: &Ctx,
    endpoint: Endpoint,
    bucket: &str,
    keys: &[String],
) -> Result<Vec<Found>, S3Error> {
    let me = own_endpoint(ctx);
    let mut copies: Vec<Vec<Replica>> = local_sizes(ctx, bucket, keys)
        .await?
        .into_iter()
        .map(|size| {
            size.map(|size| Replica {
                size,
                buffer_address: 0,
                protocol: PROTOCOL_TCP.to_string(),
                transport_endpoint: me.clone(),
            })
            .into_iter()
            .collect()
        })
        .collect();
    let mut unanswered_owner = vec![false; keys.len()];
    // Another node's forward is answered from here alone, so a query crosses one hop at most.
    if let (Some(cluster), None) = (&ctx.cluster, &ctx.peer) {
        let view = cluster.view();
        let owners: Vec<Vec<&yutu_api::cluster::Member>> = keys
            .iter()
            .map(|k| {
                view.owners(bucket, k)
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|m| m.name != cluster.node)
                    .collect()
            })
            .collect();
        let mut asked: BTreeMap<&str, &yutu_api::cluster::Member> = BTreeMap::new();
        for m in owners.iter().flatten() {
            asked.insert(m.name.as_str(), m);
        }
        let calls = asked.values().map(|m| ask_owner(ctx, cluster, m, endpoint));
        let answers = futures::future::join_all(calls).await;
        let answers: HashMap<&str, Option<HashMap<String, Vec<Replica>>>> =
            asked.keys().copied().zip(answers).collect();
        for (i, key) in keys.iter().enumerate() {
            for owner in &owners[i] {
                match answers.get(owner.name.as_str()) {
                    Some(Some(found)) => {
                        if let Some(values) = found.get(key) {
                            copies[i].extend(values.iter().cloned());
                        }
                    }
                    _ => unanswered_owner[i] = true,
                }
            }
        }
    }
    Ok(copies
        .into_iter()
        .zip(unanswered_owner)
        .map(|(c, unanswered)| match (c.is_empty(), unanswered) {
            (false, _) => Found::Copies(c),
            (true, false) => Found::Missing,
            (true, true) => Found::Unknown,
        })
        .collect())
}

/// The client's query, forwarded to one owner (which answers from its own shards): the
/// copies it holds by key, or `None` when it did not answer in time or as expected.
async fn ask_owner(
    ctx: &Ctx,
    cluster: &std::sync::Arc<crate::cluster::Cluster>,
    owner: &yutu_api::cluster::Member,
    endpoint: Endpoint,
) -> Option<HashMap<String, Vec<Replica>>> {
    let answer = async {
        let peer = forward::authority(&owner.url)
            .ok_or_else(|| format!("URL {} is not http://", owner.url))?;
        let sender = forward::connect(peer).await.map_err(|e| e.to_string())?;
        ClusterMetrics::inc(&cluster.metrics.forwarded);
        let req = crate::http::peer::cluster::outgoing(ctx, cluster, forward::empty_body())
            .map_err(|e| e.message)?;
        forward::exchange_raw(peer, sender, req, OWNER_DEADLINE, OWNER_ANSWER_LIMIT)
            .await
            .map_err(|e| e.to_string())
    }
    .await;
    let parsed = answer.and_then(|(head, body)| {
        let bad = |e: serde_json::Error| format!("answered {}: {e}", head.status);
        match (endpoint, head.status) {
            (Endpoint::BatchQueryKeys, StatusCode::OK) => {
                let r: BatchQueryResponse = serde_json::from_slice(&body).map_err(bad)?;
                Ok(r.data
                    .into_iter()
                    .filter_map(|(k, v)| Some((k, v.values?)))
                    .collect())
            }
            (Endpoint::QueryKey, StatusCode::OK) => {
                let r: QueryKeyResponse = serde_json::from_slice(&body).map_err(bad)?;
                let key = query_key_param(ctx.uri.query()).unwrap_or_default();
                Ok(HashMap::from([(key, r.data)]))
            }
            (Endpoint::QueryKey, StatusCode::NOT_FOUND) => {
                let r: ErrorResponse = serde_json::from_slice(&body).map_err(bad)?;
                if r.error_code == OBJECT_NOT_FOUND_CODE {
                    Ok(HashMap::new())
                } else {
                    Err(format!("answered {}", r.error_message))
                }
            }
            (_, status) => Err(format!("answered {status}")),
        }
    });
    match parsed {
        Ok(found) => Some(found),
        Err(e) => {
            ClusterMetrics::inc(&cluster.metrics.forward_failures);
            tracing::warn!(node = %owner.name, error = %e, "an owner did not answer a Mooncake key query");
            None
        }
    }
}

/// `GET /query_key?key=`.
async fn query_key(ctx: &Ctx) -> Result<Resp, S3Error> {
    let bucket = readable_bucket(ctx).await?;
    let key = query_key_param(ctx.uri.query()).unwrap_or_default();
    if crate::http::s3::objects::check_key(&key).is_err() {
        return Ok(json(
            StatusCode::NOT_FOUND,
            &ErrorResponse::new(INVALID_KEY_CODE, INVALID_KEY),
        ));
    }
    let Some(bucket) = bucket else {
        return Ok(not_found());
    };
    let found = lookup(ctx, Endpoint::QueryKey, &bucket, std::slice::from_ref(&key)).await?;
    Ok(match found.into_iter().next() {
        Some(Found::Copies(data)) => json(
            StatusCode::OK,
            &QueryKeyResponse {
                success: true,
                data,
            },
        ),
        Some(Found::Unknown) => json(
            StatusCode::NOT_FOUND,
            &ErrorResponse::new(RPC_FAIL_CODE, RPC_FAIL),
        ),
        _ => not_found(),
    })
}

fn not_found() -> Resp {
    json(
        StatusCode::NOT_FOUND,
        &ErrorResponse::new(OBJECT_NOT_FOUND_CODE, OBJECT_NOT_FOUND),
    )
}

/// `GET /batch_query_keys?keys=`.
async fn batch_query_keys(ctx: &Ctx) -> Result<Resp, S3Error> {
    let asked = batch_keys_param(&ctx.target);
    if asked.is_empty() {
        return Ok(json(StatusCode::BAD_REQUEST, &BatchError::new(NO_KEYS)));
    }
    if asked.len() > MAX_BATCH {
        return Ok(json(
            StatusCode::BAD_REQUEST,
            &BatchError::new(format!("Too many keys: at most {MAX_BATCH} per request.")),
        ));
    }
    let bucket = readable_bucket(ctx).await?;
    let distinct: BTreeSet<String> = asked.into_iter().collect();
    let mut data = BTreeMap::new();
    let mut valid = Vec::new();
    for key in distinct {
        if crate::http::s3::objects::check_key(&key).is_err() {
            data.insert(key, KeyResult::failed(INVALID_KEY));
        } else {
            valid.push(key);
        }
    }
    let found = match &bucket {
        Some(b) if !valid.is_empty() => lookup(ctx, Endpoint::BatchQueryKeys, b, &valid).await?,
        _ => vec![Found::Missing; valid.len()],
    };
    for (key, f) in valid.into_iter().zip(found) {
        let r = match f {
            Found::Copies(values) => KeyResult::found(values),
            Found::Missing => KeyResult::failed(OBJECT_NOT_FOUND),
            Found::Unknown => KeyResult::failed(RPC_FAIL),
        };
        data.insert(key, r);
    }
    Ok(json(
        StatusCode::OK,
        &BatchQueryResponse {
            success: true,
            data,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(uri: &str) -> Target {
        Target::parse(&uri.parse().unwrap()).unwrap()
    }

    #[test]
    fn the_single_key_is_percent_decoded_safely() {
        assert_eq!(query_key_param(Some("key=abc")).as_deref(), Some("abc"));
        // Encoded and plain name the same key; `+` stays (Mooncake does not decode at all).
        assert_eq!(
            query_key_param(Some("bucket=b&key=a%2Fb%20c")).as_deref(),
            Some("a/b c")
        );
        assert_eq!(query_key_param(Some("key=a/b+c")).as_deref(), Some("a/b+c"));
        // Not UTF-8 once decoded, or a stray `%`: the key as sent.
        assert_eq!(query_key_param(Some("key=a%FFb")).as_deref(), Some("a%FFb"));
        assert_eq!(query_key_param(Some("key=50%")).as_deref(), Some("50%"));
        assert_eq!(query_key_param(Some("key=")).as_deref(), Some(""));
        assert_eq!(query_key_param(Some("key")).as_deref(), Some(""));
        assert_eq!(query_key_param(Some("keys=a")), None);
        assert_eq!(query_key_param(None), None);
        // The first `key=` wins.
        assert_eq!(query_key_param(Some("key=1&key=2")).as_deref(), Some("1"));
    }

    #[test]
    fn batch_keys_are_url_decoded_and_split_on_commas() {
        let keys = |uri: &str| batch_keys_param(&target(uri));
        assert_eq!(keys("/batch_query_keys?keys=a,b,a"), ["a", "b", "a"]);
        assert_eq!(
            keys("/batch_query_keys?keys=a%2Cb,c%20d"),
            ["a", "b", "c d"]
        );
        assert_eq!(keys("/batch_query_keys?keys=,a,,"), ["a"]);
        assert!(keys("/batch_query_keys?keys=").is_empty());
        assert!(keys("/batch_query_keys?keys=,,").is_empty());
        assert!(keys("/batch_query_keys").is_empty());
    }

    #[test]
    fn the_bucket_defaults_to_mooncakes_tenant() {
        assert_eq!(bucket_param(&target("/query_key?key=a")), "default");
        assert_eq!(bucket_param(&target("/query_key?key=a&bucket=")), "default");
        assert_eq!(bucket_param(&target("/query_key?key=a&bucket=kv")), "kv");
    }
}
