//! Proof that a listener belongs to an engine: the answer to a challenge, and the secrets an
//! engine answers with.
//!
//! A node must not use an address a client names (issue #11): anybody can name somebody
//! else's tcp port or Unix socket, and the node would then read from or write into whatever
//! listens there. So before an address is used, each of its paths is challenged and must
//! prove two things at once: that it is the listener of the engine the address claims
//! (`prover`), and that this engine shares a secret with the challenger. The secret travels
//! only over the authenticated HTTP control plane (the client hands it to its own engine with
//! [`crate::TransferEngine::trust`] and to the node with its request), never over the path
//! being proven, so answering proves the listener is run by the party that authenticated.
//!
//! The answer is `blake3::keyed_hash(secret, "yutu-peer-proof-v1" ‖ challenger ‖ prover ‖
//! nonce)` (node ids as u64 LE, a fresh random 32-byte nonce per challenge):
//!
//! - the nonce makes an answer useless for any other challenge (no replay);
//! - the challenger's id in it means an answer given to one node is no answer for another;
//! - the prover's id in it means a listener cannot pass itself off as a different engine,
//!   even one whose secret it knows (the challenger computes it with the claimed node id);
//! - the domain string keeps these values apart from any other keyed hash of the secret.
//!
//! A listener answers only challengers it holds a secret for; others get
//! [`Refusal::Untrusted`] and learn nothing. Answers are compared in constant time.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use subtle::ConstantTimeEq;

use crate::descriptor::NodeId;
use crate::error::Refusal;

/// Bytes of a challenge's nonce.
pub(crate) const NONCE_LEN: usize = 32;
/// Bytes of an answer.
pub(crate) const MAC_LEN: usize = 32;
/// Separates proof values from every other keyed hash of the same secret.
const DOMAIN: &[u8] = b"yutu-peer-proof-v1";

/// A secret shared between a challenger and the engine that answers its challenges.
pub(crate) type Secret = [u8; 32];
pub(crate) type Nonce = [u8; NONCE_LEN];
pub(crate) type Mac = [u8; MAC_LEN];

/// The answer `prover` gives to `challenger`'s challenge `nonce` when both share `secret`.
pub(crate) fn mac(secret: &Secret, challenger: NodeId, prover: NodeId, nonce: &Nonce) -> Mac {
    let mut msg = [0u8; DOMAIN.len() + 8 + 8 + NONCE_LEN];
    let (domain, rest) = msg.split_at_mut(DOMAIN.len());
    domain.copy_from_slice(DOMAIN);
    rest[..8].copy_from_slice(&challenger.0.to_le_bytes());
    rest[8..16].copy_from_slice(&prover.0.to_le_bytes());
    rest[16..].copy_from_slice(nonce);
    *blake3::keyed_hash(secret, &msg).as_bytes()
}

/// True when `answer` is what `prover` must answer to `challenger`'s `nonce` under `secret`.
/// Constant time: a forger learns nothing from how long the comparison took.
pub(crate) fn verify(
    secret: &Secret,
    challenger: NodeId,
    prover: NodeId,
    nonce: &Nonce,
    answer: &Mac,
) -> bool {
    mac(secret, challenger, prover, nonce).ct_eq(answer).into()
}

/// A fresh challenge nonce from the kernel's CSPRNG.
pub(crate) fn nonce() -> std::io::Result<Nonce> {
    let mut nonce = [0u8; NONCE_LEN];
    crate::sys::fill_random(&mut nonce)?;
    Ok(nonce)
}

/// The challengers an engine answers, with the secret for each. One map per engine, shared by
/// its listeners (tcp and shm) and changed through [`crate::TransferEngine::trust`] and
/// [`crate::TransferEngine::distrust`], so a change holds on every path at once.
///
/// No `Debug`: the secrets must not end up in logs.
#[derive(Default)]
pub(crate) struct TrustedSecrets {
    secrets: RwLock<HashMap<NodeId, Secret>>,
}

impl TrustedSecrets {
    /// Answers `challenger` with `secret` from now on (replacing an earlier secret).
    pub(crate) fn trust(&self, challenger: NodeId, secret: Secret) {
        self.secrets
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(challenger, secret);
    }

    /// Stops answering `challenger`.
    pub(crate) fn distrust(&self, challenger: NodeId) {
        self.secrets
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&challenger);
    }

    fn secret(&self, challenger: NodeId) -> Option<Secret> {
        self.secrets
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&challenger)
            .copied()
    }
}

/// What a listener needs to answer challenges: whose listener it is, and the secrets.
#[derive(Clone)]
pub(crate) struct Prover {
    pub(crate) node: NodeId,
    pub(crate) trusted: Arc<TrustedSecrets>,
}

impl Prover {
    /// The answer to `challenger`'s challenge, or a refusal when this engine holds no secret
    /// for it.
    pub(crate) fn answer(&self, challenger: NodeId, nonce: &Nonce) -> Result<Mac, Refusal> {
        let secret = self.trusted.secret(challenger).ok_or(Refusal::Untrusted)?;
        Ok(mac(&secret, challenger, self.node, nonce))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: Secret = [0x5a; 32];
    const NONCE: Nonce = [0xa5; 32];

    /// The value other implementations must compute: pinned, and checked against the
    /// definition fed to blake3 piece by piece.
    #[test]
    fn the_mac_is_the_keyed_hash_of_the_documented_message() {
        let got = mac(&SECRET, NodeId(1), NodeId(2), &NONCE);
        let mut hasher = blake3::Hasher::new_keyed(&SECRET);
        hasher.update(b"yutu-peer-proof-v1");
        hasher.update(&1u64.to_le_bytes());
        hasher.update(&2u64.to_le_bytes());
        hasher.update(&NONCE);
        assert_eq!(got, *hasher.finalize().as_bytes());
        assert_eq!(
            hex::encode(got),
            "a0b8a03f01f195327fcf78011ec65b83b5abf8454a5260193dd5a0ed57fd87f6"
        );
    }

    #[test]
    fn every_input_changes_the_mac() {
        let base = mac(&SECRET, NodeId(1), NodeId(2), &NONCE);
        let mut other_secret = SECRET;
        other_secret[31] ^= 1;
        let mut other_nonce = NONCE;
        other_nonce[0] ^= 1;
        for changed in [
            mac(&other_secret, NodeId(1), NodeId(2), &NONCE),
            mac(&SECRET, NodeId(3), NodeId(2), &NONCE),
            mac(&SECRET, NodeId(1), NodeId(3), &NONCE),
            // Challenger and prover are not interchangeable.
            mac(&SECRET, NodeId(2), NodeId(1), &NONCE),
            mac(&SECRET, NodeId(1), NodeId(2), &other_nonce),
        ] {
            assert_ne!(changed, base);
        }
        assert!(verify(&SECRET, NodeId(1), NodeId(2), &NONCE, &base));
        let mut forged = base;
        forged[17] ^= 0x40;
        assert!(!verify(&SECRET, NodeId(1), NodeId(2), &NONCE, &forged));
        assert!(!verify(
            &SECRET,
            NodeId(1),
            NodeId(2),
            &NONCE,
            &[0; MAC_LEN]
        ));
    }

    #[test]
    fn a_prover_answers_only_trusted_challengers_with_their_secret() {
        let prover = Prover {
            node: NodeId(2),
            trusted: Arc::default(),
        };
        assert_eq!(prover.answer(NodeId(1), &NONCE), Err(Refusal::Untrusted));
        prover.trusted.trust(NodeId(1), SECRET);
        let answer = prover.answer(NodeId(1), &NONCE).unwrap();
        assert!(verify(&SECRET, NodeId(1), NodeId(2), &NONCE, &answer));
        assert_eq!(prover.answer(NodeId(9), &NONCE), Err(Refusal::Untrusted));
        // A new secret replaces the old one.
        prover.trusted.trust(NodeId(1), [7; 32]);
        let answer = prover.answer(NodeId(1), &NONCE).unwrap();
        assert!(!verify(&SECRET, NodeId(1), NodeId(2), &NONCE, &answer));
        assert!(verify(&[7; 32], NodeId(1), NodeId(2), &NONCE, &answer));
        prover.trusted.distrust(NodeId(1));
        assert_eq!(prover.answer(NodeId(1), &NONCE), Err(Refusal::Untrusted));
    }

    #[test]
    fn nonces_are_fresh() {
        assert_ne!(nonce().unwrap(), nonce().unwrap());
    }
}
