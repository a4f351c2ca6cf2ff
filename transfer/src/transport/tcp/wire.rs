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
//! ```
//!
//! `offset` is relative to the descriptor's range, as in [`crate::TransferRequest`]. Integers are
//! little-endian. A refused write's payload is still consumed by the target, so the connection
//! stays usable; a frame that does not parse (bad magic or version) closes it.

use crate::descriptor::{DescriptorError, SegmentDescriptor};
use crate::request::TransferOp;

pub const REQUEST_MAGIC: [u8; 4] = *b"YTQ1";
pub const RESPONSE_MAGIC: [u8; 4] = *b"YTR1";
/// 2: descriptors carry their access and grant.
pub const VERSION: u8 = 2;
pub const REQUEST_LEN: usize = 4 + 1 + 1 + 2 + 4 + SegmentDescriptor::ENCODED_LEN + 8 + 8;
/// One past the descriptor in a request frame.
const D_END: usize = 12 + SegmentDescriptor::ENCODED_LEN;
pub const RESPONSE_LEN: usize = 4 + 1 + 3 + 4 + 8;
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
    }
}
