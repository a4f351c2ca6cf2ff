//! The KV calls over the shards that own the keys, shared by the KV control API
//! (`api.rs`), get-into and put-from (`copy.rs`) and the engine sessions
//! (`peers.rs`): keys grouped by owning shard, existence, puts started, ended and revoked,
//! leases, and the JSON reading and writing the three share.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use serde::{Deserialize, Serialize};
use yutu_api::kv::{DEFAULT_TTL_MS, MAX_BATCH, MAX_REQUEST_BYTES, MAX_TTL_MS};
use yutu_api::S3ErrorCode;
use yutu_transfer::SegmentDescriptor;

use crate::engine::kv::BlockRef;
use crate::http::body::read_limited;
use crate::http::ctx::Ctx;
use crate::http::error::S3Error;
use crate::http::s3::objects::{check_key, object_limit};
use crate::http::Resp;
use crate::kv::ops;

/// [`DEFAULT_TTL_MS`]: the lifetime of the leases and puts the node takes for get-into and
/// put-from.
pub const DEFAULT_TTL: Duration = Duration::from_millis(DEFAULT_TTL_MS);

pub(in crate::http) fn bad(msg: impl Into<String>) -> S3Error {
    S3Error::new(S3ErrorCode::InvalidArgument).msg(msg)
}

pub(in crate::http) fn json(value: &impl Serialize) -> Resp {
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(
            serde_json::to_vec(value).unwrap_or_default(),
        )))
        .unwrap_or_default()
}

pub(in crate::http) async fn parse<T: for<'de> Deserialize<'de>>(
    ctx: &Ctx,
    body: Incoming,
) -> Result<T, S3Error> {
    let raw = read_limited(ctx, body, MAX_REQUEST_BYTES).await?;
    serde_json::from_slice(&raw.data).map_err(|e| bad(format!("Malformed KV request: {e}.")))
}

/// The lifetime a request asks (`ttl_ms`, [`DEFAULT_TTL_MS`] when absent), in milliseconds.
pub(in crate::http) fn ttl_ms(ms: Option<u64>) -> Result<u64, S3Error> {
    match ms.unwrap_or(DEFAULT_TTL_MS) {
        ms @ 1..=MAX_TTL_MS => Ok(ms),
        _ => Err(bad(format!("ttl_ms must be between 1 and {MAX_TTL_MS}."))),
    }
}

pub(in crate::http) fn check_keys(keys: &[String]) -> Result<(), S3Error> {
    if keys.is_empty() || keys.len() > MAX_BATCH {
        return Err(bad(format!("A batch names 1 to {MAX_BATCH} keys.")));
    }
    keys.iter().try_for_each(|k| check_key(k))
}

/// Indices of `keys` grouped by owning shard.
pub(in crate::http) fn by_shard(
    ctx: &Ctx,
    bucket: &str,
    keys: &[String],
) -> BTreeMap<usize, Vec<usize>> {
    let mut out: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (i, k) in keys.iter().enumerate() {
        out.entry(ctx.shard.owner(bucket, k)).or_default().push(i);
    }
    out
}

pub(in crate::http) async fn exists(
    ctx: &Ctx,
    bucket: &str,
    keys: &[String],
) -> Result<Vec<bool>, S3Error> {
    check_keys(keys)?;
    let groups = by_shard(ctx, bucket, keys);
    if groups.len() == 1 && groups.contains_key(&ctx.shard.id) {
        // All here (a client that sends each call to its keys' shard): no job, no copies.
        return Ok(ctx.shard.tier.exists(bucket, keys)?);
    }
    let mut out = vec![false; keys.len()];
    for (shard, idx) in groups {
        let ks: Vec<String> = idx.iter().map(|i| keys[*i].clone()).collect();
        let b = bucket.to_string();
        let r = ctx
            .shard
            .run(shard, move |s| s.tier.exists(&b, &ks))
            .await??;
        for (i, f) in idx.into_iter().zip(r) {
            out[i] = f;
        }
    }
    Ok(out)
}

/// Reserves `(key, len)` blocks on their shards (one message per shard, all at once); all
/// or none. Returns the put ids and the descriptors of the reserved ranges, in order.
pub(in crate::http) async fn start_puts(
    ctx: &Ctx,
    bucket: &str,
    blocks: &[(String, u64)],
    ttl: Duration,
) -> Result<(Vec<u64>, Vec<SegmentDescriptor>), S3Error> {
    let keys: Vec<String> = blocks.iter().map(|b| b.0.clone()).collect();
    check_keys(&keys)?;
    check_lens(ctx, blocks)?;
    let groups = by_shard(ctx, bucket, &keys);
    let ids: Vec<u64> = keys
        .iter()
        .map(|k| ctx.shard.kv_id_for(ctx.shard.owner(bucket, k)))
        .collect();
    let calls = groups.iter().map(|(shard, idx)| {
        let items: Vec<(u64, String, u64)> = idx
            .iter()
            .map(|i| (ids[*i], blocks[*i].0.clone(), blocks[*i].1))
            .collect();
        let (b, holder) = (bucket.to_string(), ctx.holder());
        ctx.shard
            .run(*shard, move |s| ops::put_start(s, &holder, &b, &items, ttl))
    });
    let answers = futures::future::join_all(calls).await;
    let mut descriptors: Vec<Option<SegmentDescriptor>> = vec![None; keys.len()];
    let mut failure = None;
    for ((_, idx), answer) in groups.iter().zip(answers) {
        match answer {
            Ok(Ok(ds)) => {
                for (i, d) in idx.iter().zip(ds) {
                    descriptors[*i] = Some(d);
                }
            }
            Ok(Err((at, e))) => {
                failure = Some(S3Error::from(e).key(&keys[idx[at.min(idx.len() - 1)]]))
            }
            Err(e) => failure = Some(e.into()),
        }
    }
    if let Some(e) = failure {
        // All or none: revoke what the other shards started.
        let started: Vec<u64> = descriptors
            .iter()
            .zip(&ids)
            .filter(|(d, _)| d.is_some())
            .map(|(_, id)| *id)
            .collect();
        revoke_all(ctx, bucket, &started).await;
        return Err(e);
    }
    Ok((ids, descriptors.into_iter().flatten().collect()))
}

/// Refuses blocks larger than an object may be.
pub(in crate::http) fn check_lens(ctx: &Ctx, blocks: &[(String, u64)]) -> Result<(), S3Error> {
    let (limit, what) = object_limit(ctx);
    match blocks.iter().find(|b| b.1 > limit) {
        Some((key, _)) => Err(S3Error::new(S3ErrorCode::EntityTooLarge)
            .msg(format!("Block {key} exceeds {what} of {limit} bytes."))),
        None => Ok(()),
    }
}

/// Best effort: abandons started puts (the reaper would take them at their deadline anyway).
pub(in crate::http) async fn revoke_all(ctx: &Ctx, bucket: &str, put_ids: &[u64]) {
    for &put_id in put_ids {
        let Some(shard) = ctx.shard.shard_of_id(put_id) else {
            continue;
        };
        let (holder, bucket) = (ctx.holder(), bucket.to_string());
        let _ = ctx
            .shard
            .run(shard, move |s| ops::put_revoke(s, put_id, &holder, &bucket))
            .await;
    }
}

pub(in crate::http) fn owner_of(ctx: &Ctx, id: u64) -> Result<usize, S3Error> {
    ctx.shard
        .shard_of_id(id)
        .ok_or_else(|| bad(format!("Unknown id {id}.")))
}

/// Publishes the caller's puts into `bucket` on their shards (all shards at once); their
/// ETags, in order. A put of another holder or another bucket is unknown.
pub(in crate::http) async fn end_puts(
    ctx: &Ctx,
    bucket: &str,
    put_ids: &[u64],
) -> Result<Vec<String>, S3Error> {
    if put_ids.is_empty() || put_ids.len() > MAX_BATCH {
        return Err(bad(format!("A batch names 1 to {MAX_BATCH} puts.")));
    }
    let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (i, id) in put_ids.iter().enumerate() {
        groups.entry(owner_of(ctx, *id)?).or_default().push(i);
    }
    let calls = groups.iter().map(|(shard, idx)| {
        let ids: Vec<u64> = idx.iter().map(|i| put_ids[*i]).collect();
        let (holder, bucket) = (ctx.holder(), bucket.to_string());
        ctx.shard
            .run_async(*shard, move |s| ops::put_end(s, ids, holder, bucket))
    });
    let answers = futures::future::join_all(calls).await;
    let mut etags = vec![String::new(); put_ids.len()];
    for ((_, idx), answer) in groups.iter().zip(answers) {
        for (i, r) in idx.iter().zip(answer?) {
            let id = put_ids[*i];
            let meta = r.map_err(|e| match e {
                crate::model::StoreError::NoSuchUpload => bad(format!(
                    "Put {id} is unknown, already ended, revoked or expired."
                )),
                e => S3Error::from(e),
            })?;
            etags[*i] = meta.etag.clone();
        }
    }
    Ok(etags)
}

/// Leases the blocks on their shards; per key, the block (or `None`) and its shard. The
/// caller has checked the request's keys ([`check_keys`]).
pub(in crate::http) async fn lease(
    ctx: &Ctx,
    bucket: &str,
    keys: &[String],
    ttl: Duration,
) -> Result<(Vec<u64>, Vec<Option<(usize, BlockRef, SegmentDescriptor)>>), S3Error> {
    let mut leases = Vec::new();
    let mut found: Vec<Option<(usize, BlockRef, SegmentDescriptor)>> = vec![None; keys.len()];
    for (shard, idx) in by_shard(ctx, bucket, keys) {
        let lease_id = ctx.shard.kv_id_for(shard);
        let ks: Vec<String> = idx.iter().map(|i| keys[*i].clone()).collect();
        let (b, holder) = (bucket.to_string(), ctx.holder());
        let r = ctx
            .shard
            .run(shard, move |s| {
                ops::lease(s, lease_id, &holder, &b, &ks, ttl)
            })
            .await??;
        leases.push(lease_id);
        for (i, r) in idx.into_iter().zip(r) {
            found[i] = r.map(|(b, d)| (shard, b, d));
        }
    }
    Ok((leases, found))
}
