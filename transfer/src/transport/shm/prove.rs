//! The challenger's side of a proof over shm: does the Unix socket at a path belong to the
//! engine that claims it (see `proof.rs`)?
//!
//! A fresh connection, never a pooled one. The socket speaks first (its hello): one whose
//! hello is not the claimed engine's, or that stays silent, gets nothing at all; otherwise it
//! gets the prove message and nothing else. The whole exchange (connect, hello, challenge,
//! answer) ends by one deadline whatever the other end does; the connect too, since a Unix
//! socket whose backlog is full would otherwise block it.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use super::wire::{self, ANSWER_LEN, HELLO_LEN};
use crate::address::NodeAddress;
use crate::descriptor::NodeId;
use crate::error::TransferError;
use crate::proof::{self, Secret};
use crate::transport::deadline::{self, Deadline};
use crate::transport::TransportKind;

const KIND: TransportKind = TransportKind::Shm;

/// Challenges the socket at `path` to prove it belongs to the engine `peer` describes (its
/// node and incarnation) and shares `secret` with `challenger` (this engine). `Ok` only for a
/// proof that verifies.
pub(crate) fn challenge(
    path: &Path,
    peer: &NodeAddress,
    challenger: NodeId,
    secret: &Secret,
    timeout: Duration,
) -> Result<(), TransferError> {
    let prover = peer.node;
    let deadline = Deadline::after(timeout);
    let io = |e| TransferError::io(KIND, prover, e);
    let nonce = proof::nonce().map_err(io)?;
    let mut stream = connect(path, deadline).map_err(io)?;

    let mut hello = [0u8; HELLO_LEN];
    deadline::read_exact(&mut stream, &mut hello, deadline).map_err(io)?;
    let (node, incarnation) =
        wire::decode_hello(&hello).map_err(|m| TransferError::protocol(KIND, prover, m))?;
    if node != prover || incarnation != peer.incarnation {
        return Err(TransferError::protocol(
            KIND,
            prover,
            format!(
                "the socket belongs to node {node} incarnation {incarnation:016x}, not {prover} {:016x}",
                peer.incarnation
            ),
        ));
    }

    deadline::write_all(
        &mut stream,
        &wire::encode_prove(challenger, &nonce),
        deadline,
    )
    .map_err(io)?;
    let mut raw = [0u8; ANSWER_LEN];
    deadline::read_exact(&mut stream, &mut raw, deadline).map_err(io)?;
    let answer = wire::decode_answer(&raw).map_err(|m| TransferError::protocol(KIND, prover, m))?;
    let answer = answer.map_err(|reason| {
        TransferError::unavailable(
            KIND,
            prover,
            format!("the listener refused the challenge: {reason}"),
        )
    })?;
    if !proof::verify(secret, challenger, prover, &nonce, &answer) {
        return Err(TransferError::protocol(
            KIND,
            prover,
            format!("the socket did not prove it is node {prover} holding this secret"),
        ));
    }
    Ok(())
}

/// Connects to the Unix socket at `path` before `deadline`.
fn connect(path: &Path, deadline: Deadline) -> std::io::Result<UnixStream> {
    let addr = socket2::SockAddr::unix(path)?;
    // Close-on-exec, as socket2 creates every socket.
    let socket = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None)?;
    socket.connect_timeout(&addr, deadline.left()?)?;
    Ok(UnixStream::from(OwnedFd::from(socket)))
}
