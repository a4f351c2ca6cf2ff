//! The tcp transport's frames. Public so that other implementations (and tests that play a
//! misbehaving peer) can speak it.
//!
//! A connection carries requests one way and responses the other, in order:
//!
//! ```text
//! request  (82 bytes): magic "YTQ1" | version u8 | op u8 (1 read, 2 write) | 0u16 | seq u32 |
//!                      descriptor (54 bytes, binary form) | offset u64 | len u64
//!                      then, for a write, `len` payload bytes
//! response (20 bytes): magic "YTR1" | status u8 (0 ok, else a Refusal code) | 0u8 x3 | seq u32 |
//!                      len u64 (payload bytes that follow: `len` for an accepted read, else 0)
//!
//! prove    (82 bytes, in place of a request): magic "YTP1" | version u8 | 0u8 x3 |
//!                      challenger node u64 | nonce (32 bytes) | 0u8 x34
//! answer   a response with seq 0: status 0, len 32, then the 32-byte proof;
//!          or status Untrusted (a Refusal code), len 0, nothing after it
//! ```
//!
//! `offset` is relative to the descriptor's range, as in [`crate::TransferRequest`]. Integers are
//! little-endian. A refused write's payload is still consumed by the target, so the connection
//! stays usable; a frame that does not parse (bad magic or version, a prove frame whose padding
//! is not zero) closes it.
//!
//! A prove frame is a proof challenge (see `proof.rs`): the listener answers with the keyed
//! hash that shows it belongs to the engine an address claims and shares the challenger's
//! secret. It has the length of a request so that the listener reads every frame the same way;
//! it carries no payload and needs no descriptor.

use crate::descriptor::{DescriptorError, NodeId, SegmentDescriptor};
use crate::request::TransferOp;

pub const REQUEST_MAGIC: [u8; 4] = *b"YTQ1";
pub const RESPONSE_MAGIC: [u8; 4] = *b"YTR1";
pub const PROVE_MAGIC: [u8; 4] = *b"YTP1";
/// 2: descriptors carry their access and grant.
pub const VERSION: u8 = 2;
pub const REQUEST_LEN: usize = 4 + 1 + 1 + 2 + 4 + SegmentDescriptor::ENCODED_LEN + 8 + 8;
/// One past the descriptor in a request frame.
const D_END: usize = 12 + SegmentDescriptor::ENCODED_LEN;
pub const RESPONSE_LEN: usize = 4 + 1 + 3 + 4 + 8;
/// Bytes of a prove frame's nonce, and of the proof that answers it.
pub const PROOF_LEN: usize = 32;
/// One past the nonce in a prove frame; zeros from there to [`REQUEST_LEN`].
const NONCE_END: usize = 16 + PROOF_LEN;
/// The largest payload one frame may carry; larger transfers are sliced well below this.
pub const MAX_FRAME: u64 = 256 << 20;

const OP_READ: u8 = 1;
const OP_WRITE: u8 = 2;

/// A request frame's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestHeader {
    pub op: TransferOp,
    pub seq: u32,
    pub desc: SegmentDescriptor,
    pub offset: u64,
    pub len: u64,
}

/// A response frame's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResponseHeader {
    /// 0 for success, else a [`crate::Refusal`] code.
    pub status: u8,
    pub seq: u32,
    pub len: u64,
}

/// A proof challenge: `challenger` asks the listener to prove which engine it belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProveFrame {
    pub challenger: NodeId,
    pub nonce: [u8; PROOF_LEN],
}

/// What a listener reads: every frame has [`REQUEST_LEN`] bytes, told apart by its magic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame {
    Request(RequestHeader),
    Prove(ProveFrame),
}

/// A frame that does not parse; the connection cannot be trusted to be in sync after it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("bad frame magic {0:02x?}")]
    Magic([u8; 4]),
    #[error("unsupported protocol version {0}")]
    Version(u8),
    #[error("unknown operation {0}")]
    Op(u8),
    #[error(transparent)]
    Descriptor(#[from] DescriptorError),
    #[error("reserved bytes are not zero")]
    Reserved,
}

impl Frame {
    pub fn decode(b: &[u8; REQUEST_LEN]) -> Result<Frame, WireError> {
        if b[0..4] == PROVE_MAGIC {
            ProveFrame::decode(b).map(Frame::Prove)
        } else {
            RequestHeader::decode(b).map(Frame::Request)
        }
    }
}

impl ProveFrame {
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0..4].copy_from_slice(&PROVE_MAGIC);
        b[4] = VERSION;
        b[8..16].copy_from_slice(&self.challenger.0.to_le_bytes());
        b[16..NONCE_END].copy_from_slice(&self.nonce);
        b
    }

    pub fn decode(b: &[u8; REQUEST_LEN]) -> Result<ProveFrame, WireError> {
        let magic = [b[0], b[1], b[2], b[3]];
        if magic != PROVE_MAGIC {
            return Err(WireError::Magic(magic));
        }
        if b[4] != VERSION {
            return Err(WireError::Version(b[4]));
        }
        if b[5..8].iter().chain(&b[NONCE_END..]).any(|&x| x != 0) {
            return Err(WireError::Reserved);
        }
        let mut nonce = [0u8; PROOF_LEN];
        nonce.copy_from_slice(&b[16..NONCE_END]);
        Ok(ProveFrame {
            challenger: NodeId(u64_at(b, 8)),
            nonce,
        })
    }
}

impl RequestHeader {
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0..4].copy_from_slice(&REQUEST_MAGIC);
        b[4] = VERSION;
        b[5] = match self.op {
            TransferOp::Read => OP_READ,
            TransferOp::Write => OP_WRITE,
        };
        b[8..12].copy_from_slice(&self.seq.to_le_bytes());
        b[12..D_END].copy_from_slice(&self.desc.encode());
        b[D_END..D_END + 8].copy_from_slice(&self.offset.to_le_bytes());
        b[D_END + 8..D_END + 16].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; REQUEST_LEN]) -> Result<RequestHeader, WireError> {
        let magic = [b[0], b[1], b[2], b[3]];
        if magic != REQUEST_MAGIC {
            return Err(WireError::Magic(magic));
        }
        if b[4] != VERSION {
            return Err(WireError::Version(b[4]));
        }
        let op = match b[5] {
            OP_READ => TransferOp::Read,
            OP_WRITE => TransferOp::Write,
            other => return Err(WireError::Op(other)),
        };
        Ok(RequestHeader {
            op,
            seq: u32::from_le_bytes([b[8], b[9], b[10], b[11]]),
            desc: SegmentDescriptor::decode(&b[12..D_END])?,
            offset: u64_at(b, D_END),
            len: u64_at(b, D_END + 8),
        })
    }
}

impl ResponseHeader {
    pub fn encode(&self) -> [u8; RESPONSE_LEN] {
        let mut b = [0u8; RESPONSE_LEN];
        b[0..4].copy_from_slice(&RESPONSE_MAGIC);
        b[4] = self.status;
        b[8..12].copy_from_slice(&self.seq.to_le_bytes());
        b[12..20].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; RESPONSE_LEN]) -> Result<ResponseHeader, WireError> {
        let magic = [b[0], b[1], b[2], b[3]];
        if magic != RESPONSE_MAGIC {
            return Err(WireError::Magic(magic));
        }
        Ok(ResponseHeader {
            status: b[4],
            seq: u32::from_le_bytes([b[8], b[9], b[10], b[11]]),
            len: u64_at(b, 12),
        })
    }
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[i..i + 8]);
    u64::from_le_bytes(w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::descriptor::{AccessToken, NodeId, SegmentId};

    #[test]
    fn frames_round_trip_and_reject_garbage() {
        let req = RequestHeader {
            op: TransferOp::Write,
            seq: 9,
            desc: SegmentDescriptor {
                node: NodeId(3),
                segment: SegmentId(4),
                offset: 5,
                len: 6,
                access: crate::descriptor::Access::ReadWrite,
                grant: crate::descriptor::GrantId(1),
                token: AccessToken([7; 16]),
            },
            offset: 1,
            len: 2,
        };
        let bytes = req.encode();
        assert_eq!(bytes.len(), 82);
        assert_eq!(RequestHeader::decode(&bytes), Ok(req));
        let mut bad = bytes;
        bad[0] = b'X';
        assert!(matches!(
            RequestHeader::decode(&bad),
            Err(WireError::Magic(_))
        ));
        let mut bad = bytes;
        bad[5] = 9;
        assert_eq!(RequestHeader::decode(&bad), Err(WireError::Op(9)));
        let mut bad = bytes;
        bad[4] = 1;
        assert_eq!(RequestHeader::decode(&bad), Err(WireError::Version(1)));

        let resp = ResponseHeader {
            status: 3,
            seq: 9,
            len: 0,
        };
        assert_eq!(ResponseHeader::decode(&resp.encode()), Ok(resp));
        assert!(ResponseHeader::decode(&[0u8; RESPONSE_LEN]).is_err());

        // Both kinds of frame go through `Frame::decode`; garbage is still an error.
        assert_eq!(Frame::decode(&bytes), Ok(Frame::Request(req)));
        assert!(matches!(
            Frame::decode(&[0xAB; REQUEST_LEN]),
            Err(WireError::Magic(_))
        ));
        assert!(Frame::decode(&[0; REQUEST_LEN]).is_err());
    }

    #[test]
    fn prove_frames_round_trip_and_reject_garbage() {
        let prove = ProveFrame {
            challenger: NodeId(0x0102_0304_0506_0708),
            nonce: std::array::from_fn(|i| i as u8 + 1),
        };
        let bytes = prove.encode();
        assert_eq!(bytes.len(), REQUEST_LEN);
        assert_eq!(&bytes[..4], b"YTP1");
        assert_eq!(bytes[8], 0x08, "node ids are little-endian");
        assert_eq!(ProveFrame::decode(&bytes), Ok(prove));
        assert_eq!(Frame::decode(&bytes), Ok(Frame::Prove(prove)));
        // A prove frame is not a request, and a request is not a prove frame.
        assert!(matches!(
            RequestHeader::decode(&bytes),
            Err(WireError::Magic(_))
        ));

        let mut bad = bytes;
        bad[3] = b'2';
        assert!(matches!(Frame::decode(&bad), Err(WireError::Magic(_))));
        let mut bad = bytes;
        bad[4] = VERSION + 1;
        assert_eq!(Frame::decode(&bad), Err(WireError::Version(VERSION + 1)));
        // Every reserved byte must be zero, before and after the nonce.
        for i in (5..8).chain(NONCE_END..REQUEST_LEN) {
            let mut bad = bytes;
            bad[i] = 1;
            assert_eq!(Frame::decode(&bad), Err(WireError::Reserved), "byte {i}");
        }
    }
}
