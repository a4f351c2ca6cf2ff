//! Minting and checking access tokens.
//!
//! Each registered segment gets a random 256-bit key. A token is the first 128 bits of
//! `blake3::keyed_hash(key, node ‖ segment ‖ offset ‖ len ‖ access ‖ grant)`: it authorises
//! exactly one range, one direction and one grant; a peer holding one descriptor cannot forge
//! another (a larger range, a neighbour's object, a write where it may read, another grant's
//! id). Whether the grant is still live is the segment's [`crate::RangeGuard`]'s to say. A new
//! registration gets a new key, so descriptors minted before a restart or before a
//! re-registration stop working.

use subtle::ConstantTimeEq;

use crate::descriptor::{Access, AccessToken, GrantId, NodeId, SegmentDescriptor, SegmentId};

/// The secret behind a segment's tokens. Never leaves the process.
pub(crate) struct SegmentKey([u8; 32]);

impl SegmentKey {
    pub(crate) fn random() -> std::io::Result<SegmentKey> {
        let mut key = [0u8; 32];
        crate::sys::fill_random(&mut key)?;
        Ok(SegmentKey(key))
    }

    pub(crate) fn mint(
        &self,
        node: NodeId,
        segment: SegmentId,
        range: (u64, u64),
        access: Access,
        grant: GrantId,
    ) -> AccessToken {
        let mut msg = [0u8; 37];
        msg[..8].copy_from_slice(&node.0.to_le_bytes());
        msg[8..12].copy_from_slice(&segment.0.to_le_bytes());
        msg[12..20].copy_from_slice(&range.0.to_le_bytes());
        msg[20..28].copy_from_slice(&range.1.to_le_bytes());
        msg[28] = match access {
            Access::Read => 1,
            Access::Write => 2,
            Access::ReadWrite => 3,
        };
        msg[29..37].copy_from_slice(&grant.0.to_le_bytes());
        let hash = blake3::keyed_hash(&self.0, &msg);
        let mut token = [0u8; 16];
        token.copy_from_slice(&hash.as_bytes()[..16]);
        AccessToken(token)
    }

    /// True when `desc.token` is the token this key mints for `desc`'s fields.
    pub(crate) fn verify(&self, desc: &SegmentDescriptor) -> bool {
        let expected = self.mint(
            desc.node,
            desc.segment,
            (desc.offset, desc.len),
            desc.access,
            desc.grant,
        );
        expected.0.ct_eq(&desc.token.0).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_bind_every_field_and_the_key() {
        let key = SegmentKey::random().unwrap();
        let other = SegmentKey::random().unwrap();
        let desc = SegmentDescriptor {
            node: NodeId(1),
            segment: SegmentId(2),
            offset: 4096,
            len: 100,
            access: Access::Read,
            grant: GrantId(5),
            token: key.mint(
                NodeId(1),
                SegmentId(2),
                (4096, 100),
                Access::Read,
                GrantId(5),
            ),
        };
        assert!(key.verify(&desc));
        assert!(!other.verify(&desc));
        assert!(!key.verify(&SegmentDescriptor { len: 101, ..desc }));
        assert!(!key.verify(&SegmentDescriptor { offset: 0, ..desc }));
        assert!(!key.verify(&SegmentDescriptor {
            segment: SegmentId(3),
            ..desc
        }));
        assert!(!key.verify(&SegmentDescriptor {
            node: NodeId(9),
            ..desc
        }));
        assert!(!key.verify(&SegmentDescriptor {
            access: Access::ReadWrite,
            ..desc
        }));
        assert!(!key.verify(&SegmentDescriptor {
            grant: GrantId(6),
            ..desc
        }));
    }
}
