//! Arena views: a shard's arena memfd, handed to a same-host client that proved it can
//! already read and write the node's whole memory, so that the client copies the blocks of
//! its large gets itself (`memcpy` in its own process) instead of the shard copying them
//! through the kernel's cross-memory attach, which moves about half as much per thread.
//!
//! # Why this gives nobody anything new
//!
//! The arena holds every tenant's blocks, so it is never handed to a caller for its token
//! alone. The proof is the kernel's own check: the node puts [`ARENA_NONCE_LEN`] fresh random
//! bytes in its memory, answers only their address ([`FrameOp::ArenaChallenge`]), and the
//! caller must send them back ([`FrameOp::ArenaView`]). Reading them takes
//! `process_vm_readv` on the node's pid (or `/proc/PID/mem`, or `ptrace`), which the kernel
//! allows only with ptrace access to the node (`PTRACE_MODE_ATTACH`: the same user and a
//! dumpable node under what Yama allows, or `CAP_SYS_PTRACE`), and that access covers every
//! byte the node has, its arenas, segment secrets and keys included. So a caller that
//! answers could read (and write) every block of the arena already; the view only lets it do
//! so at `memcpy` speed. Nothing about the check is reimplemented here: whatever makes the
//! kernel refuse (another user, a node made non-dumpable, Yama's `ptrace_scope` 1 for a
//! process that is not the node's ancestor, a seccomp filter) makes the proof fail, and the
//! client keeps the shards' copies.
//!
//! - A challenge is per connection and spent by any answer, right or wrong; the nonce never
//!   leaves the node's memory but through the caller's own read.
//! - A relay gains nothing: a process that can read the node and answers for another could
//!   hand it the arena's bytes anyway.
//! - Tokens do not govern the view, the kernel does: a revoked token ends the caller's
//!   calls (leases) but not a mapping it already has, as it would not end a
//!   `ptrace` attach. Each block still goes through a call checked as usual: the client
//!   copies only under a lease (`get`) it holds.
//! - Unix frame connections of a single node only, and `--no-arena-views` turns it off.

use std::os::fd::AsFd;

use yutu_api::kv_frame::{
    ArenaChallenge, ArenaChallengeRequest, ArenaViewGrant, ArenaViewRequest, ARENA_NONCE_LEN,
};
use yutu_api::S3ErrorCode;

use crate::http::error::S3Error;
use crate::node::Shard;

/// A connection's outstanding challenge: the nonce, boxed so that its address stays put.
pub struct Challenge(Box<[u8; ARENA_NONCE_LEN]>);

impl Challenge {
    /// A fresh challenge and its answer to the caller.
    pub fn new() -> Result<(Challenge, ArenaChallenge), S3Error> {
        let mut nonce = Box::new([0u8; ARENA_NONCE_LEN]);
        getrandom::fill(&mut nonce[..]).map_err(|e| {
            S3Error::new(S3ErrorCode::InternalError).msg(format!("No randomness: {e}."))
        })?;
        let answer = ArenaChallenge {
            address: nonce.as_ptr() as u64,
            len: ARENA_NONCE_LEN as u32,
        };
        Ok((Challenge(nonce), answer))
    }

    /// Whether `proof` is the nonce. Timing does not matter: any answer spends the challenge.
    pub fn answered_by(&self, proof: &[u8]) -> bool {
        proof == &self.0[..]
    }
}

/// Why a view is refused, before any challenge.
pub fn check_allowed(shard: &Shard, unix: bool, pool: bool) -> Result<(), S3Error> {
    if !shard.settings.arena_views {
        return Err(S3Error::new(S3ErrorCode::NotImplemented)
            .msg("This node gives no arena views (--no-arena-views)."));
    }
    if !unix {
        return Err(S3Error::new(S3ErrorCode::InvalidRequest)
            .msg("Arena views are given only on the node's Unix frame sockets."));
    }
    if pool {
        return Err(S3Error::new(S3ErrorCode::NotImplemented)
            .msg("Arena views are not given by a node in a pool."));
    }
    Ok(())
}

/// Parses an [`ArenaChallengeRequest`] (no fields).
pub fn challenge_request(body: &[u8]) -> Result<ArenaChallengeRequest, S3Error> {
    yutu_api::kv_frame::decode(body).map_err(|e| super::api::bad(e.to_string()))
}

/// The view for a caller whose `request` answered `challenge` (`None`: no challenge was
/// asked for on this connection, or it was spent).
pub fn grant(
    shard: &Shard,
    challenge: Option<Challenge>,
    body: &[u8],
) -> Result<ArenaViewGrant, S3Error> {
    let request: ArenaViewRequest =
        yutu_api::kv_frame::decode(body).map_err(|e| super::api::bad(e.to_string()))?;
    let Some(challenge) = challenge else {
        return Err(S3Error::new(S3ErrorCode::InvalidRequest)
            .msg("Ask for an arena challenge on this connection first."));
    };
    if !challenge.answered_by(&request.proof) {
        shard.metrics.arena_views_refused.inc();
        tracing::info!(
            shard = shard.id,
            "an arena view was refused: the caller did not read the challenge out of the node"
        );
        return Err(S3Error::new(S3ErrorCode::AccessDenied)
            .msg("That is not the challenge: arena views are only for a process that can read the node's memory."));
    }
    let Some((engine, segment)) = &shard.transfer else {
        return Err(S3Error::new(S3ErrorCode::NotImplemented)
            .msg("This node has no transfer engine, so no arena to view."));
    };
    let fd = segment
        .region()
        .fd()
        .ok_or_else(|| S3Error::new(S3ErrorCode::NotImplemented).msg("The arena has no memfd."))?
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| {
            S3Error::new(S3ErrorCode::InternalError).msg(format!("Cannot share the arena: {e}."))
        })?;
    let handoff = super::presence_handoff::offer(fd).map_err(|e| {
        let code = match e.kind() {
            std::io::ErrorKind::WouldBlock => S3ErrorCode::SlowDown,
            _ => S3ErrorCode::InternalError,
        };
        S3Error::new(code).msg(format!("Cannot offer the arena: {e}."))
    })?;
    shard.metrics.arena_views.inc();
    tracing::info!(
        shard = shard.id,
        "an arena view was given to a proven same-host client"
    );
    Ok(ArenaViewGrant {
        shard: shard.id as u32,
        node: engine.node().0,
        segment: segment.id().0,
        len: segment.region().len() as u64,
        socket: handoff.socket,
        nonce: handoff.nonce.to_vec(),
    })
}
