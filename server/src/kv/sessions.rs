//! Client engine sessions: the only way a client's transfer engine becomes a peer of the
//! node's, so that get-into and put-from can reach its memory.
//!
//! The node never uses an address a client names until the address proves itself: each path
//! (tcp, shm) is challenged with the secret of the request, which the client's engine was
//! given beforehand, and only the paths that answer are kept. The challenge is the only thing
//! ever sent to an unproven address, under a short deadline, off the shard's thread. The
//! session then belongs to the registering user (the registry is `node::sessions`).

use std::time::Duration;

use yutu_api::kv::{PeerRequest, PeerResponse};
use yutu_transfer::{NodeAddress, TransferEngine};

use crate::kv::error::KvError;
use crate::kv::Caller;
use crate::node::sessions::EngineCall;
use crate::node::Shard;

/// How long each path of a client's address has to answer its challenge.
const PROOF_TIMEOUT: Duration = Duration::from_secs(2);

/// The node's transfer engine.
pub fn engine(here: &Shard) -> Result<&TransferEngine, KvError> {
    here.transfer
        .as_ref()
        .map(|(engine, _)| engine)
        .ok_or(KvError::NoEngine)
}

/// A session id: 128 random bits in hex.
fn session_id() -> Result<String, KvError> {
    let mut raw = [0u8; 16];
    getrandom::fill(&mut raw).map_err(|e| {
        tracing::error!(error = %e, "no randomness for a session id");
        KvError::Internal("no randomness for a session id")
    })?;
    Ok(hex::encode(raw))
}

/// Registers the caller's engine once one of its paths has proved itself.
pub async fn register(caller: &Caller<'_>, req: PeerRequest) -> Result<PeerResponse, KvError> {
    let here = caller.here;
    let engine = engine(here)?.clone();
    let user = &caller.holder;
    if req.client.node == engine.node() {
        return Err(KvError::invalid(
            "The client's node id is the server's own.",
        ));
    }
    here.peers.admit(user, req.client.node)?;
    // The challenge runs on the shard's blocking pool, for up to a few seconds per path: a
    // user's registrations in flight count as its engine calls, so one user cannot fill it.
    let _call = engine_call(caller)?;
    let (e, claimed, secret) = (engine.clone(), req.client, req.secret.0);
    let proven = glommio::executor()
        .spawn_blocking(move || e.verify_peer(&claimed, &secret, PROOF_TIMEOUT))
        .await
        .map_err(|e| {
            KvError::Unproven(format!(
                "No path of the client's address proved to be its engine (give the engine the secret with trust() first): {e}."
            ))
        })?;
    let id = session_id()?;
    if let Some(old) = here.peers.insert(id.clone(), user, proven.clone())? {
        // The user's previous session for this node id: drop what was cached for it.
        engine.remove_peer(old.node);
    }
    engine.add_peer(proven.clone());
    tracing::debug!(user, node = %proven.node, "client engine registered");
    Ok(PeerResponse {
        session: id,
        paths: paths(&proven),
    })
}

fn paths(a: &NodeAddress) -> Vec<String> {
    [("tcp", a.tcp.is_some()), ("shm", a.shm.is_some())]
        .into_iter()
        .filter(|(_, on)| *on)
        .map(|(p, _)| p.to_string())
        .collect()
}

/// Ends the caller's session `session`.
pub fn end(caller: &Caller<'_>, session: &str) -> Result<(), KvError> {
    let Some(old) = caller.here.peers.end(session, &caller.holder) else {
        return Err(unknown_session());
    };
    engine(caller.here)?.remove_peer(old.node);
    Ok(())
}

fn unknown_session() -> KvError {
    KvError::invalid(
        "Unknown session (or another user's, or ended); register the engine at /v1/kv/peers.",
    )
}

/// Counts a transfer through the node's engine for the caller until the guard drops
/// (refused past the per-user limit).
pub fn engine_call(caller: &Caller<'_>) -> Result<EngineCall, KvError> {
    Ok(caller.here.peers.engine_call(&caller.holder)?)
}

/// The proven address of the caller's session `id`, and the node's engine with it as a
/// peer.
pub fn session_peer(
    caller: &Caller<'_>,
    id: &str,
) -> Result<(TransferEngine, NodeAddress), KvError> {
    let address = caller
        .here
        .peers
        .lookup(id, &caller.holder)
        .ok_or_else(unknown_session)?;
    let engine = engine(caller.here)?;
    // Normally there since registration; after a replaced session or an engine restart, the
    // proven address is put back.
    if engine.peer(address.node).as_ref() != Some(&address) {
        engine.add_peer(address.clone());
    }
    Ok((engine.clone(), address))
}
