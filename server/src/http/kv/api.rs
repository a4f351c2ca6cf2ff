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
//! What each call does is the KV layer's ([`crate::kv`]); get-into and put-from
//! ([`crate::kv::copy`]) are the one-round-trip forms, where the node moves the bytes.

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use yutu_api::kv::{
    CopiedResponse, EtagsResponse, ExistsResponse, GetIntoRequest, GetResponse, KeysRequest, KvOp,
    PrefixResponse, PublishResponse, PutFromRequest, PutIdsRequest, PutStartRequest,
    PutStartResponse, RemoveResponse, RevokeResponse, ENGINE_PATH, KV_ROOT, MAX_REQUEST_BYTES,
    PEERS_PATH, RELEASE_PATH,
};
use yutu_api::kv_frame::FRAMES_PATH;
use yutu_api::S3ErrorCode;

use crate::auth::Action;
use crate::http::body::read_limited;
use crate::http::ctx::Ctx;
use crate::http::error::S3Error;
use crate::http::s3::objects::bucket_must_exist;
use crate::http::Resp;
use crate::kv::{calls, copy, sessions};

/// A malformed request, saying why.
pub(in crate::http) fn bad(msg: impl Into<String>) -> S3Error {
    S3Error::new(S3ErrorCode::InvalidArgument).msg(msg)
}

/// A `200` with `value` as its JSON body.
pub(in crate::http) fn json(value: &impl Serialize) -> Resp {
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(
            serde_json::to_vec(value).unwrap_or_default(),
        )))
        .unwrap_or_default()
}

/// A JSON request body of at most [`MAX_REQUEST_BYTES`].
async fn parse<T: for<'de> Deserialize<'de>>(ctx: &Ctx, body: Incoming) -> Result<T, S3Error> {
    let raw = read_limited(ctx, body, MAX_REQUEST_BYTES).await?;
    serde_json::from_slice(&raw.data).map_err(|e| bad(format!("Malformed KV request: {e}.")))
}

/// Serves one KV API request (`/v1/kv/...`): parsed here, done by [`crate::kv`].
pub async fn serve(ctx: &Ctx, body: Incoming) -> Result<Resp, S3Error> {
    // The request's key is its path after `/v1/`.
    let path = format!("/v1/{}", ctx.target.key.as_deref().unwrap_or_default());
    if path == RELEASE_PATH && ctx.method == Method::POST {
        let req = parse(ctx, body).await?;
        return Ok(json(&calls::release(&ctx.caller(), req).await?));
    }
    if path == PEERS_PATH && ctx.method == Method::POST {
        let req = parse(ctx, body).await?;
        return Ok(json(&sessions::register(&ctx.caller(), req).await?));
    }
    if let Some(session) = path
        .strip_prefix(PEERS_PATH)
        .and_then(|p| p.strip_prefix('/'))
    {
        if ctx.method != Method::DELETE {
            return Err(S3Error::new(S3ErrorCode::MethodNotAllowed));
        }
        sessions::end(&ctx.caller(), session)?;
        return Ok(Response::builder()
            .status(StatusCode::NO_CONTENT)
            .body(Full::default())
            .unwrap_or_default());
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
    Publish(yutu_api::kv::PublishRequest),
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
            KvOp::Publish => KvCall::Publish(format.read(raw)?),
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
    Publish(PublishResponse),
}

/// Serves an admitted per-bucket call (see [`admit`]).
pub(in crate::http) async fn answer(
    ctx: &Ctx,
    bucket: &str,
    call: KvCall,
) -> Result<KvAnswer, S3Error> {
    let (here, caller) = (&ctx.shard, ctx.caller());
    Ok(match call {
        KvCall::Exists(k) => KvAnswer::Exists(ExistsResponse {
            exists: calls::exists(here, bucket, &k.keys).await?,
        }),
        KvCall::Prefix(k) => KvAnswer::Prefix(PrefixResponse {
            present: calls::prefix(here, bucket, &k.keys).await?,
        }),
        KvCall::PutStart(r) => KvAnswer::PutStart(calls::put_start(&caller, bucket, r).await?),
        KvCall::PutEnd(r) => KvAnswer::Etags(EtagsResponse {
            etags: calls::end_puts(&caller, bucket, &r.put_ids).await?,
        }),
        KvCall::Revoke(r) => KvAnswer::Revoke(calls::revoke(&caller, bucket, r).await?),
        KvCall::Get(r) => KvAnswer::Get(calls::get(&caller, bucket, r).await?),
        KvCall::GetInto(r) => KvAnswer::Copied(copy::get_into(&caller, bucket, r).await?),
        KvCall::PutFrom(r) => KvAnswer::Etags(copy::put_from(&caller, bucket, r).await?),
        KvCall::Remove(k) => KvAnswer::Remove(RemoveResponse {
            removed: calls::remove(here, bucket, &k.keys).await?,
        }),
        KvCall::Publish(r) => KvAnswer::Publish(calls::publish(&caller, bucket, r).await?),
    })
}
