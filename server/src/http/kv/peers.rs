//! Client engine sessions (`/v1/kv/peers`): the only way a client's transfer engine becomes
//! a peer of the node's, so that get-into and put-from can reach its memory.
//!
//! The node never uses an address a client names until the address proves itself: each path
//! (tcp, shm) is challenged with the secret of the request, which the client's engine was
//! given beforehand, and only the paths that answer are kept. The challenge is the only thing
//! ever sent to an unproven address, under a short deadline, off the shard's thread. The
//! session then belongs to the registering user (`engine::peers`).

use std::time::Duration;

use http::{Response, StatusCode};
use http_body_util::Full;
use yutu_api::kv::{PeerRequest, PeerResponse};
use yutu_api::S3ErrorCode;
use yutu_transfer::{NodeAddress, TransferEngine};

use super::shards::{bad, json};
use crate::engine::peers::PeerError;
use crate::http::ctx::Ctx;
use crate::http::error::S3Error;
use crate::http::Resp;

/// How long each path of a client's address has to answer its challenge.
const PROOF_TIMEOUT: Duration = Duration::from_secs(2);

pub(in crate::http) fn engine(ctx: &Ctx) -> Result<&TransferEngine, S3Error> {
    ctx.shard
        .transfer
        .as_ref()
        .map(|(engine, _)| engine)
        .ok_or_else(|| S3Error::new(S3ErrorCode::ServiceUnavailable))
}

fn refused(e: PeerError) -> S3Error {
    let code = match e {
        PeerError::NodeTaken(_) => S3ErrorCode::OperationAborted,
        PeerError::TooManyForUser(_) | PeerError::Full(_) | PeerError::Busy(_) => {
            S3ErrorCode::TooManyRequests
        }
    };
    S3Error::new(code).msg(format!("Refused: {e}."))
}

/// A session id: 128 random bits in hex.
fn session_id() -> Result<String, S3Error> {
    let mut raw = [0u8; 16];
    getrandom::fill(&mut raw).map_err(|e| {
        tracing::error!(error = %e, "no randomness for a session id");
        S3Error::new(S3ErrorCode::InternalError)
    })?;
    Ok(hex::encode(raw))
}

/// `POST /v1/kv/peers`.
pub(in crate::http) async fn register(ctx: &Ctx, req: PeerRequest) -> Result<Resp, S3Error> {
    let engine = engine(ctx)?.clone();
    let user = ctx.holder();
    if req.client.node == engine.node() {
        return Err(bad("The client's node id is the server's own."));
    }
    ctx.shard
        .peers
        .admit(&user, req.client.node)
        .map_err(refused)?;
    // The challenge runs on the shard's blocking pool, for up to a few seconds per path: a
    // user's registrations in flight count as its engine calls, so one user cannot fill it.
    let _call = engine_call(ctx)?;
    let (e, claimed, secret) = (engine.clone(), req.client, req.secret.0);
    let proven = glommio::executor()
        .spawn_blocking(move || e.verify_peer(&claimed, &secret, PROOF_TIMEOUT))
        .await
        .map_err(|e| {
            S3Error::new(S3ErrorCode::AccessDenied).msg(format!(
                "No path of the client's address proved to be its engine (give the engine the secret with trust() first): {e}."
            ))
        })?;
    let id = session_id()?;
    if let Some(old) = ctx
        .shard
        .peers
        .insert(id.clone(), &user, proven.clone())
        .map_err(refused)?
    {
        // The user's previous session for this node id: drop what was cached for it.
        engine.remove_peer(old.node);
    }
    engine.add_peer(proven.clone());
    tracing::debug!(user, node = %proven.node, "client engine registered");
    Ok(json(&PeerResponse {
        session: id,
        paths: paths(&proven),
    }))
}

fn paths(a: &NodeAddress) -> Vec<String> {
    [("tcp", a.tcp.is_some()), ("shm", a.shm.is_some())]
        .into_iter()
        .filter(|(_, on)| *on)
        .map(|(p, _)| p.to_string())
        .collect()
}

/// `DELETE /v1/kv/peers/{session}`.
pub(in crate::http) fn end(ctx: &Ctx, session: &str) -> Result<Resp, S3Error> {
    let Some(old) = ctx.shard.peers.end(session, &ctx.holder()) else {
        return Err(unknown_session());
    };
    engine(ctx)?.remove_peer(old.node);
    Ok(Response::builder()
        .status(StatusCode::NO_CONTENT)
        .body(Full::default())
        .unwrap_or_default())
}

fn unknown_session() -> S3Error {
    bad("Unknown session (or another user's, or ended); register the engine at /v1/kv/peers.")
}

/// Counts a transfer through the node's engine for the caller until the guard drops (`429`
/// past the per-user limit).
pub(in crate::http) fn engine_call(ctx: &Ctx) -> Result<crate::engine::peers::EngineCall, S3Error> {
    ctx.shard.peers.engine_call(&ctx.holder()).map_err(refused)
}

/// The proven address of the caller's session `id`, and the node's engine with it as a
/// peer.
pub(in crate::http) fn session_peer(
    ctx: &Ctx,
    id: &str,
) -> Result<(TransferEngine, NodeAddress), S3Error> {
    let address = ctx
        .shard
        .peers
        .lookup(id, &ctx.holder())
        .ok_or_else(unknown_session)?;
    let engine = engine(ctx)?;
    // Normally there since registration; after a replaced session or an engine restart, the
    // proven address is put back.
    if engine.peer(address.node).as_ref() != Some(&address) {
        engine.add_peer(address.clone());
    }
    Ok((engine.clone(), address))
}
