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
use yutu_api::kv::{
    EtagsResponse, ExistsResponse, GetResponse, KeysRequest, KvOp, LeasedBlock, PrefixResponse,
    PutIdsRequest, PutStartRequest, PutStartResponse, ReleaseRequest, ReleaseResponse,
    RemoveResponse, RevokeResponse, StartedPut, ENGINE_PATH, KV_ROOT, PEERS_PATH, RELEASE_PATH,
};
use yutu_api::S3ErrorCode;

use super::shards::{
    by_shard, check_keys, end_puts, exists, json, lease, owner_of, parse, start_puts, ttl_ms,
};
use crate::auth::Action;
use crate::http::ctx::Ctx;
use crate::http::error::S3Error;
use crate::http::s3::objects::bucket_must_exist;
use crate::http::Resp;
use crate::kv::ops;

pub async fn route(ctx: &Ctx, body: Incoming) -> Result<Resp, S3Error> {
    // The request's key is its path after `/v1/`.
    let path = format!("/v1/{}", ctx.target.key.as_deref().unwrap_or_default());
    if path == RELEASE_PATH && ctx.method == Method::POST {
        return release(ctx, parse(ctx, body).await?).await;
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
        crate::http::peer::cluster::know_bucket(ctx, cluster, &bucket).await;
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
        KvOp::GetInto => super::copy::get_into(ctx, &bucket, parse(ctx, body).await?).await,
        KvOp::PutFrom => super::copy::put_from(ctx, &bucket, parse(ctx, body).await?).await,
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

async fn put_end(ctx: &Ctx, bucket: &str, req: PutIdsRequest) -> Result<Resp, S3Error> {
    let etags = end_puts(ctx, bucket, &req.put_ids).await?;
    Ok(json(&EtagsResponse { etags }))
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
