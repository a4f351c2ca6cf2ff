//! The challenger's side of a proof over tcp: does the listener at an address belong to the
//! engine that claims it (see `proof.rs`)?
//!
//! A fresh connection, never a pooled one: the address is not trusted yet, so nothing but the
//! prove frame may be sent to it, and nothing but its answer is read. The whole exchange
//! (connect, send, answer) ends by one deadline whatever the other end does.

use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use super::wire::{ProveFrame, ResponseHeader, PROOF_LEN, RESPONSE_LEN};
use crate::descriptor::NodeId;
use crate::error::{Refusal, TransferError};
use crate::proof::{self, Mac, Secret};
use crate::transport::deadline::{self, Deadline};
use crate::transport::TransportKind;

const KIND: TransportKind = TransportKind::Tcp;

/// Challenges the listener at `addr` to prove it belongs to engine `prover` and shares
/// `secret` with `challenger` (this engine). `Ok` only for a proof that verifies.
pub(crate) fn challenge(
    addr: SocketAddr,
    challenger: NodeId,
    prover: NodeId,
    secret: &Secret,
    timeout: Duration,
) -> Result<(), TransferError> {
    let deadline = Deadline::after(timeout);
    let io = |e| TransferError::io(KIND, prover, e);
    let nonce = proof::nonce().map_err(io)?;
    let mut stream = TcpStream::connect_timeout(&addr, deadline.left().map_err(io)?).map_err(io)?;
    stream.set_nodelay(true).map_err(io)?;
    let frame = ProveFrame { challenger, nonce }.encode();
    deadline::write_all(&mut stream, &frame, deadline).map_err(io)?;

    let mut raw = [0u8; RESPONSE_LEN];
    deadline::read_exact(&mut stream, &mut raw, deadline).map_err(io)?;
    let header = ResponseHeader::decode(&raw)
        .map_err(|e| TransferError::protocol(KIND, prover, e.to_string()))?;
    if header.seq != 0 {
        return Err(TransferError::protocol(
            KIND,
            prover,
            format!("an answer to a challenge with seq {}", header.seq),
        ));
    }
    if header.status != 0 {
        let reason = Refusal::from_code(header.status).unwrap_or(Refusal::BadRequest);
        return Err(TransferError::unavailable(
            KIND,
            prover,
            format!("the listener refused the challenge: {reason}"),
        ));
    }
    if header.len != PROOF_LEN as u64 {
        return Err(TransferError::protocol(
            KIND,
            prover,
            format!("a proof of {} bytes, not {PROOF_LEN}", header.len),
        ));
    }
    let mut answer: Mac = [0u8; PROOF_LEN];
    deadline::read_exact(&mut stream, &mut answer, deadline).map_err(io)?;
    if !proof::verify(secret, challenger, prover, &nonce, &answer) {
        return Err(TransferError::protocol(
            KIND,
            prover,
            format!("the listener at {addr} did not prove it is node {prover} holding this secret"),
        ));
    }
    Ok(())
}
