//! The KV control API (`/v1/kv/...`): JSON over HTTP for the control plane, while the block
//! bytes move one-sidedly through the transfer engine into or out of the shards' arenas.
//!
//! The calls and their bodies are the wire contract in [`yutu_api::kv`] (the table of calls
//! is there), shared with the clients: this module only reads the requests and writes the
//! answers it defines.
//!
//! A lease keeps the leased bytes from being evicted or reused until it is released or its
//! time is up ([`DEFAULT_TTL_MS`] unless asked, at most [`MAX_TTL_MS`]); the client must not
//! read after that.
//!
//! get-into and put-from (`kv_copy.rs`) are the one-round-trip forms: the node moves the bytes,
//! and a client on the same host is served by the owning shards copying straight into or out
//! of its mapped buffer.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use serde::{Deserialize, Serialize};
use yutu_api::kv::{
    EtagsResponse, ExistsResponse, GetResponse, KeysRequest, KvOp, LeasedBlock, PrefixResponse,
    PutIdsRequest, PutStartRequest, PutStartResponse, ReleaseRequest, ReleaseResponse,
    RemoveResponse, RevokeResponse, StartedPut, DEFAULT_TTL_MS, ENGINE_PATH, KV_ROOT, MAX_BATCH,
    MAX_REQUEST_BYTES, MAX_TTL_MS, PEERS_PATH, RELEASE_PATH,
};
use yutu_api::S3ErrorCode;
use yutu_transfer::SegmentDescriptor;

use super::body::read_limited;
use super::ctx::Ctx;
use super::error::S3Error;
use super::objects::{bucket_must_exist, check_key, object_limit};
use super::Resp;
use crate::auth::Action;
use crate::engine::kv::BlockRef;
use crate::kv::ops;

/// [`DEFAULT_TTL_MS`]: the lifetime of the leases and puts the node takes for get-into and
/// put-from.
pub const DEFAULT_TTL: Duration = Duration::from_millis(DEFAULT_TTL_MS);

pub(super) fn bad(msg: impl Into<String>) -> S3Error {
    S3Error::new(S3ErrorCode::InvalidArgument).msg(msg)
}

pub(super) fn json(value: &impl Serialize) -> Resp {
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(
            serde_json::to_vec(value).unwrap_or_default(),
        )))
        .unwrap_or_default()
}

pub(super) async fn parse<T: for<'de> Deserialize<'de>>(
    ctx: &Ctx,
    body: Incoming,
) -> Result<T, S3Error> {
    let raw = read_limited(ctx, body, MAX_REQUEST_BYTES).await?;
    serde_json::from_slice(&raw.data).map_err(|e| bad(format!("Malformed KV request: {e}.")))
}

/// The lifetime a request asks (`ttl_ms`, [`DEFAULT_TTL_MS`] when absent), in milliseconds.
fn ttl_ms(ms: Option<u64>) -> Result<u64, S3Error> {
    match ms.unwrap_or(DEFAULT_TTL_MS) {
        ms @ 1..=MAX_TTL_MS => Ok(ms),
        _ => Err(bad(format!("ttl_ms must be between 1 and {MAX_TTL_MS}."))),
    }
}

pub(super) fn check_keys(keys: &[String]) -> Result<(), S3Error> {
    if keys.is_empty() || keys.len() > MAX_BATCH {
        return Err(bad(format!("A batch names 1 to {MAX_BATCH} keys.")));
    }
    keys.iter().try_for_each(|k| check_key(k))
}

/// Indices of `keys` grouped by owning shard.
pub(super) fn by_shard(ctx: &Ctx, bucket: &str, keys: &[String]) -> BTreeMap<usize, Vec<usize>> {
    let mut out: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (i, k) in keys.iter().enumerate() {
        out.entry(ctx.shard.owner(bucket, k)).or_default().push(i);
    }
    out
}

pub async fn route(ctx: &Ctx, body: Incoming) -> Result<Resp, S3Error> {
    // The request's key is its path after `/v1/`.
    let path = format!("/v1/{}", ctx.target.key.as_deref().unwrap_or_default());
    if path == RELEASE_PATH && ctx.method == Method::POST {
        return release(ctx, parse(ctx, body).await?).await;
    }
    if path == PEERS_PATH && ctx.method == Method::POST {
        return super::kv_peers::register(ctx, parse(ctx, body).await?).await;
    }
    if let Some(session) = path
        .strip_prefix(PEERS_PATH)
        .and_then(|p| p.strip_prefix('/'))
    {
        if ctx.method != Method::DELETE {
            return Err(S3Error::new(S3ErrorCode::MethodNotAllowed));
        }
        return super::kv_peers::end(ctx, session);
    }
    let per_bucket = path
        .strip_prefix(KV_ROOT)
        .and_then(|p| p.strip_prefix('/'))
        .and_then(|p| p.rsplit_once('/'));
    let (bucket, op) = match per_bucket {
        Some((b, op)) => (b.to_string(), KvOp::from_name(op)),
        None if path == ENGINE_PATH && ctx.method == Method::GET => {
            let (engine, _) = ctx
                .shard
                .transfer
                .as_ref()
                .ok_or_else(|| S3Error::new(S3ErrorCode::ServiceUnavailable))?;
            return Ok(json(&engine.address()));
        }
        None => return Err(S3Error::new(S3ErrorCode::InvalidRequest).msg("Unknown KV endpoint.")),
    };
    if ctx.method != Method::POST {
        return Err(S3Error::new(S3ErrorCode::MethodNotAllowed));
    }
    // An unknown call needs write permission and an existing bucket before it is refused.
    let action = match op {
        Some(op) if op.is_read() => Action::Read,
        Some(KvOp::Remove) => Action::Delete,
        _ => Action::Write,
    };
    if let Some(cluster) = &ctx.cluster {
        super::cluster::know_bucket(ctx, cluster, &bucket).await;
        // A node whose lease may be gone does not take KV writes either (the clients route
        // by the membership, which may already have moved its keys elsewhere).
        if action == Action::Write {
            if let Err(e) = cluster.writable() {
                crate::cluster::ClusterMetrics::inc(&cluster.metrics.writes_refused);
                return Err(S3Error::new(S3ErrorCode::ServiceUnavailable).msg(format!("{e}.")));
            }
        }
    }
    ctx.allow(action, Some(&bucket))?;
    bucket_must_exist(ctx, &bucket).map_err(|e| e.bucket(&bucket))?;
    let Some(op) = op else {
        return Err(S3Error::new(S3ErrorCode::InvalidRequest).msg("Unknown KV endpoint."));
    };
    match op {
        KvOp::Exists => {
            let k: KeysRequest = parse(ctx, body).await?;
            let exists = exists(ctx, &bucket, &k.keys).await?;
            Ok(json(&ExistsResponse { exists }))
        }
        KvOp::Prefix => {
            let k: KeysRequest = parse(ctx, body).await?;
            let found = exists(ctx, &bucket, &k.keys).await?;
            let present = found.iter().take_while(|f| **f).count() as u64;
            Ok(json(&PrefixResponse { present }))
        }
        KvOp::PutStart => put_start(ctx, &bucket, parse(ctx, body).await?).await,
        KvOp::PutEnd => put_end(ctx, &bucket, parse(ctx, body).await?).await,
        KvOp::Revoke => revoke(ctx, &bucket, parse(ctx, body).await?).await,
        KvOp::Get => get(ctx, &bucket, parse(ctx, body).await?).await,
        KvOp::GetInto => super::kv_copy::get_into(ctx, &bucket, parse(ctx, body).await?).await,
        KvOp::PutFrom => super::kv_copy::put_from(ctx, &bucket, parse(ctx, body).await?).await,
        KvOp::Remove => {
            let k: KeysRequest = parse(ctx, body).await?;
            check_keys(&k.keys)?;
            let mut removed = vec![false; k.keys.len()];
            for (shard, idx) in by_shard(ctx, &bucket, &k.keys) {
                let keys: Vec<String> = idx.iter().map(|i| k.keys[*i].clone()).collect();
                let b = bucket.clone();
                let r = ctx
                    .shard
                    .run_step(shard, move |s| s.tier.delete(b, keys))
                    .await??;
                for (i, r) in idx.into_iter().zip(r) {
                    removed[i] = r;
                }
            }
            Ok(json(&RemoveResponse { removed }))
        }
    }
}

pub(super) async fn exists(ctx: &Ctx, bucket: &str, keys: &[String]) -> Result<Vec<bool>, S3Error> {
    check_keys(keys)?;
    let mut out = vec![false; keys.len()];
    for (shard, idx) in by_shard(ctx, bucket, keys) {
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

async fn put_start(ctx: &Ctx, bucket: &str, req: PutStartRequest) -> Result<Resp, S3Error> {
    let ttl_ms = ttl_ms(req.ttl_ms)?;
    let blocks: Vec<(String, u64)> = req.blocks.into_iter().map(|b| (b.key, b.len)).collect();
    let (ids, descriptors) =
        start_puts(ctx, bucket, &blocks, Duration::from_millis(ttl_ms)).await?;
    let puts: Vec<StartedPut> = blocks
        .into_iter()
        .zip(ids)
        .zip(descriptors)
        .map(|(((key, _), put_id), descriptor)| StartedPut {
            key,
            put_id,
            descriptor,
        })
        .collect();
    Ok(json(&PutStartResponse { puts, ttl_ms }))
}

/// Reserves `(key, len)` blocks on their shards (one message per shard, all at once); all
/// or none. Returns the put ids and the descriptors of the reserved ranges, in order.
pub(super) async fn start_puts(
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
pub(super) fn check_lens(ctx: &Ctx, blocks: &[(String, u64)]) -> Result<(), S3Error> {
    let (limit, what) = object_limit(ctx);
    match blocks.iter().find(|b| b.1 > limit) {
        Some((key, _)) => Err(S3Error::new(S3ErrorCode::EntityTooLarge)
            .msg(format!("Block {key} exceeds {what} of {limit} bytes."))),
        None => Ok(()),
    }
}

/// Best effort: abandons started puts (the reaper would take them at their deadline anyway).
pub(super) async fn revoke_all(ctx: &Ctx, bucket: &str, put_ids: &[u64]) {
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

pub(super) fn owner_of(ctx: &Ctx, id: u64) -> Result<usize, S3Error> {
    ctx.shard
        .shard_of_id(id)
        .ok_or_else(|| bad(format!("Unknown id {id}.")))
}

async fn put_end(ctx: &Ctx, bucket: &str, req: PutIdsRequest) -> Result<Resp, S3Error> {
    let etags = end_puts(ctx, bucket, &req.put_ids).await?;
    Ok(json(&EtagsResponse { etags }))
}

/// Publishes the caller's puts into `bucket` on their shards (all shards at once); their
/// ETags, in order. A put of another holder or another bucket is unknown.
pub(super) async fn end_puts(
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

async fn revoke(ctx: &Ctx, bucket: &str, req: PutIdsRequest) -> Result<Resp, S3Error> {
    let mut revoked = Vec::with_capacity(req.put_ids.len());
    for id in req.put_ids {
        let shard = owner_of(ctx, id)?;
        let (holder, bucket) = (ctx.holder(), bucket.to_string());
        revoked.push(
            ctx.shard
                .run(shard, move |s| ops::put_revoke(s, id, &holder, &bucket))
                .await?,
        );
    }
    Ok(json(&RevokeResponse { revoked }))
}

/// Leases the blocks on their shards; per key, the block (or `None`) and its shard. The
/// caller has checked the request's keys ([`check_keys`]).
pub(super) async fn lease(
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

async fn release(ctx: &Ctx, req: ReleaseRequest) -> Result<Resp, S3Error> {
    let mut released = 0;
    for id in req.leases {
        let shard = owner_of(ctx, id)?;
        let holder = ctx.holder();
        if ctx
            .shard
            .run(shard, move |s| {
                s.tier.store.borrow_mut().release_lease_by(id, &holder)
            })
            .await?
        {
            released += 1;
        }
    }
    Ok(json(&ReleaseResponse { released }))
}

async fn get(ctx: &Ctx, bucket: &str, req: KeysRequest) -> Result<Resp, S3Error> {
    let ttl_ms = ttl_ms(req.ttl_ms)?;
    check_keys(&req.keys)?;
    // Each distinct key is leased and answered once (see `GetResponse::positions`).
    let mut first: HashMap<&str, u32> = HashMap::with_capacity(req.keys.len());
    let mut distinct: Vec<String> = Vec::with_capacity(req.keys.len());
    let mut positions = Vec::with_capacity(req.keys.len());
    for key in &req.keys {
        let next = distinct.len() as u32;
        let at = *first.entry(key.as_str()).or_insert(next);
        if at == next {
            distinct.push(key.clone());
        }
        positions.push(at);
    }
    let repeated = distinct.len() < req.keys.len();
    let (leases, found) = lease(ctx, bucket, &distinct, Duration::from_millis(ttl_ms)).await?;
    let blocks = distinct
        .into_iter()
        .zip(found)
        .map(|(key, f)| match f {
            Some((_, b, d)) => LeasedBlock {
                key,
                descriptor: Some(d),
                len: b.len,
                etag: Some(b.etag),
            },
            None => LeasedBlock {
                key,
                descriptor: None,
                len: 0,
                etag: None,
            },
        })
        .collect();
    Ok(json(&GetResponse {
        leases,
        blocks,
        positions: repeated.then_some(positions),
        ttl_ms,
    }))
}
