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
//! get-into and put-from (`copy.rs`) are the one-round-trip forms: the node moves the bytes,
//! and a client on the same host is served by the owning shards copying straight into or out
//! of its mapped buffer.

use std::collections::HashMap;
use std::time::Duration;

use http::Method;
use hyper::body::Incoming;
use serde::de::DeserializeOwned;
use serde::Serialize;
use yutu_api::kv::{
    CopiedResponse, EtagsResponse, ExistsResponse, GetIntoRequest, GetResponse, KeysRequest, KvOp,
    LeasedBlock, PrefixResponse, PutFromRequest, PutIdsRequest, PutStartRequest, PutStartResponse,
    ReleaseRequest, ReleaseResponse, RemoveResponse, RevokeResponse, StartedPut, ENGINE_PATH,
    KV_ROOT, MAX_REQUEST_BYTES, PEERS_PATH, RELEASE_PATH,
};
use yutu_api::kv_frame::FRAMES_PATH;
use yutu_api::S3ErrorCode;

use super::shards::{
    bad, by_shard, check_keys, end_puts, exists, json, lease, owner_of, parse, start_puts, ttl_ms,
};
use crate::auth::Action;
use crate::http::body::read_limited;
use crate::http::ctx::Ctx;
use crate::http::error::S3Error;
use crate::http::s3::objects::bucket_must_exist;
use crate::http::Resp;
use crate::kv::ops;

pub async fn route(ctx: &Ctx, body: Incoming) -> Result<Resp, S3Error> {
    // The request's key is its path after `/v1/`.
    let path = format!("/v1/{}", ctx.target.key.as_deref().unwrap_or_default());
    if path == RELEASE_PATH && ctx.method == Method::POST {
        return Ok(json(&release(ctx, parse(ctx, body).await?).await?));
    }
    if path == PEERS_PATH && ctx.method == Method::POST {
        return super::peers::register(ctx, parse(ctx, body).await?).await;
    }
    if let Some(session) = path
        .strip_prefix(PEERS_PATH)
        .and_then(|p| p.strip_prefix('/'))
    {
        if ctx.method != Method::DELETE {
            return Err(S3Error::new(S3ErrorCode::MethodNotAllowed));
        }
        return super::peers::end(ctx, session);
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
        None if path == FRAMES_PATH && ctx.method == Method::GET => {
            // Where the shards take frames (chosen when the node started; `frames.rs`).
            return Ok(json(&ctx.shard.settings.frames));
        }
        None => return Err(S3Error::new(S3ErrorCode::InvalidRequest).msg("Unknown KV endpoint.")),
    };
    if ctx.method != Method::POST {
        return Err(S3Error::new(S3ErrorCode::MethodNotAllowed));
    }
    // An unknown call needs write permission and an existing bucket before it is refused.
    admit(ctx, &bucket, op.map_or(Action::Write, action)).await?;
    let Some(op) = op else {
        return Err(S3Error::new(S3ErrorCode::InvalidRequest).msg("Unknown KV endpoint."));
    };
    let raw = read_limited(ctx, body, MAX_REQUEST_BYTES).await?;
    let call = KvCall::read(op, &raw.data, Format::Json)?;
    Ok(json(&answer(ctx, &bucket, call).await?))
}

/// What a per-bucket call needs permission for.
pub(in crate::http) fn action(op: KvOp) -> Action {
    match op {
        op if op.is_read() => Action::Read,
        KvOp::Remove => Action::Delete,
        _ => Action::Write,
    }
}

/// Everything a per-bucket call passes before its body is read, whichever way it came (HTTP
/// or a frame): in a cluster, the bucket known and, for a write, a node that may take writes;
/// the caller's permission for `action`; and the bucket's existence.
pub(in crate::http) async fn admit(ctx: &Ctx, bucket: &str, action: Action) -> Result<(), S3Error> {
    if let Some(cluster) = &ctx.cluster {
        crate::http::peer::cluster::know_bucket(ctx, cluster, bucket).await;
        // A node whose lease may be gone does not take KV writes either (the clients route
        // by the membership, which may already have moved its keys elsewhere).
        if action == Action::Write {
            if let Err(e) = cluster.writable() {
                crate::cluster::ClusterMetrics::inc(&cluster.metrics.writes_refused);
                return Err(S3Error::new(S3ErrorCode::ServiceUnavailable).msg(format!("{e}.")));
            }
        }
    }
    ctx.allow(action, Some(bucket))?;
    bucket_must_exist(ctx, bucket).map_err(|e| e.bucket(bucket))
}

/// How a call's body is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::http) enum Format {
    /// The JSON API.
    Json,
    /// A frame's MessagePack body ([`yutu_api::kv_frame`]).
    Frame,
}

impl Format {
    pub(in crate::http) fn read<T: DeserializeOwned>(self, raw: &[u8]) -> Result<T, S3Error> {
        match self {
            Format::Json => {
                serde_json::from_slice(raw).map_err(|e| bad(format!("Malformed KV request: {e}.")))
            }
            Format::Frame => yutu_api::kv_frame::decode(raw)
                .map_err(|e| bad(format!("Malformed KV request: {e}."))),
        }
    }
}

/// A per-bucket call with its request, read from either encoding.
pub(in crate::http) enum KvCall {
    Exists(KeysRequest),
    Prefix(KeysRequest),
    PutStart(PutStartRequest),
    PutEnd(PutIdsRequest),
    Revoke(PutIdsRequest),
    Get(KeysRequest),
    GetInto(GetIntoRequest),
    PutFrom(PutFromRequest),
    Remove(KeysRequest),
}

impl KvCall {
    /// `op`'s request, read from `raw`.
    pub(in crate::http) fn read(op: KvOp, raw: &[u8], format: Format) -> Result<KvCall, S3Error> {
        Ok(match op {
            KvOp::Exists => KvCall::Exists(format.read(raw)?),
            KvOp::Prefix => KvCall::Prefix(format.read(raw)?),
            KvOp::PutStart => KvCall::PutStart(format.read(raw)?),
            KvOp::PutEnd => KvCall::PutEnd(format.read(raw)?),
            KvOp::Revoke => KvCall::Revoke(format.read(raw)?),
            KvOp::Get => KvCall::Get(format.read(raw)?),
            KvOp::GetInto => KvCall::GetInto(format.read(raw)?),
            KvOp::PutFrom => KvCall::PutFrom(format.read(raw)?),
            KvOp::Remove => KvCall::Remove(format.read(raw)?),
        })
    }
}

/// The answer of a call, written in either encoding (each variant is the struct itself).
#[derive(Serialize)]
#[serde(untagged)]
pub(in crate::http) enum KvAnswer {
    Exists(ExistsResponse),
    Prefix(PrefixResponse),
    PutStart(PutStartResponse),
    Etags(EtagsResponse),
    Revoke(RevokeResponse),
    Get(GetResponse),
    Copied(CopiedResponse),
    Remove(RemoveResponse),
}

/// Serves an admitted per-bucket call (see [`admit`]).
pub(in crate::http) async fn answer(
    ctx: &Ctx,
    bucket: &str,
    call: KvCall,
) -> Result<KvAnswer, S3Error> {
    Ok(match call {
        KvCall::Exists(k) => KvAnswer::Exists(ExistsResponse {
            exists: exists(ctx, bucket, &k.keys).await?,
        }),
        KvCall::Prefix(k) => {
            let found = exists(ctx, bucket, &k.keys).await?;
            let present = found.iter().take_while(|f| **f).count() as u64;
            KvAnswer::Prefix(PrefixResponse { present })
        }
        KvCall::PutStart(r) => KvAnswer::PutStart(put_start(ctx, bucket, r).await?),
        KvCall::PutEnd(r) => KvAnswer::Etags(EtagsResponse {
            etags: end_puts(ctx, bucket, &r.put_ids).await?,
        }),
        KvCall::Revoke(r) => KvAnswer::Revoke(revoke(ctx, bucket, r).await?),
        KvCall::Get(r) => KvAnswer::Get(get(ctx, bucket, r).await?),
        KvCall::GetInto(r) => KvAnswer::Copied(super::copy::get_into(ctx, bucket, r).await?),
        KvCall::PutFrom(r) => KvAnswer::Etags(super::copy::put_from(ctx, bucket, r).await?),
        KvCall::Remove(k) => KvAnswer::Remove(RemoveResponse {
            removed: remove(ctx, bucket, &k.keys).await?,
        }),
    })
}

async fn remove(ctx: &Ctx, bucket: &str, keys: &[String]) -> Result<Vec<bool>, S3Error> {
    check_keys(keys)?;
    let mut removed = vec![false; keys.len()];
    for (shard, idx) in by_shard(ctx, bucket, keys) {
        let ks: Vec<String> = idx.iter().map(|i| keys[*i].clone()).collect();
        let b = bucket.to_string();
        let r = ctx
            .shard
            .run_step(shard, move |s| s.tier.delete(b, ks))
            .await??;
        for (i, r) in idx.into_iter().zip(r) {
            removed[i] = r;
        }
    }
    Ok(removed)
}

async fn put_start(
    ctx: &Ctx,
    bucket: &str,
    req: PutStartRequest,
) -> Result<PutStartResponse, S3Error> {
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
    Ok(PutStartResponse { puts, ttl_ms })
}

async fn revoke(ctx: &Ctx, bucket: &str, req: PutIdsRequest) -> Result<RevokeResponse, S3Error> {
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
    Ok(RevokeResponse { revoked })
}

/// Gives leases back (`POST` [`RELEASE_PATH`], or a frame).
pub(in crate::http) async fn release(
    ctx: &Ctx,
    req: ReleaseRequest,
) -> Result<ReleaseResponse, S3Error> {
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
    Ok(ReleaseResponse { released })
}

async fn get(ctx: &Ctx, bucket: &str, req: KeysRequest) -> Result<GetResponse, S3Error> {
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
    Ok(GetResponse {
        leases,
        blocks,
        positions: repeated.then_some(positions),
        ttl_ms,
    })
}
