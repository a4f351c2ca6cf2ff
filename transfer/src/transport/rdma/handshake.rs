//! Messages of the RDMA handshake connection (plain TCP).
//!
//! Queue pairs are connected out of band: the initiator sends its queue pair's address
//! (LID, GID, QP number, first packet sequence number, MTU), the target creates a queue pair
//! for it, connects it and answers with its own. The same TCP connection then carries the
//! per-batch descriptor checks, whose answers are the memory keys one-sided operations need:
//! the target's virtual address of the segment and its `rkey`.
//!
//! ```text
//! hello  (40 bytes): magic "YTH1" | version u8 | mtu u8 | lid u16 | node u64 | qpn u32 | psn u32 | gid [16]
//! reply  (48 bytes): magic "YTH2" | status u8 | mtu u8 | lid u16 | node u64 | qpn u32 | psn u32 | gid [16] |
//!                    incarnation u64
//! check:             magic "YTK1" | count u16 | 0u16 | count x descriptor (54 bytes)
//! grants:            magic "YTG1" | count u16 | 0u16 | count x (status u8 | segment len u64 | addr u64 | rkey u32)
//! ```
//!
//! Pure encoding, compiled with or without the `rdma` feature so that it is tested everywhere.

#![cfg_attr(not(feature = "rdma"), allow(dead_code))]

use crate::descriptor::{NodeId, SegmentDescriptor};
use crate::error::Refusal;

pub(crate) const HELLO_MAGIC: [u8; 4] = *b"YTH1";
pub(crate) const REPLY_MAGIC: [u8; 4] = *b"YTH2";
pub(crate) const CHECK_MAGIC: [u8; 4] = *b"YTK1";
pub(crate) const GRANT_MAGIC: [u8; 4] = *b"YTG1";
pub(crate) const VERSION: u8 = 1;
pub(crate) const HELLO_LEN: usize = 40;
pub(crate) const REPLY_LEN: usize = 48;
pub(crate) const HEADER_LEN: usize = 8;
pub(crate) const GRANT_LEN: usize = 21;
/// Descriptors per check message.
pub(crate) const MAX_ENTRIES: usize = 256;

/// The address of one end of an RC queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QpInfo {
    pub(crate) lid: u16,
    pub(crate) qpn: u32,
    pub(crate) psn: u32,
    pub(crate) gid: [u8; 16],
    /// `ibv_mtu` enum value (1 = 256 bytes ... 5 = 4096 bytes).
    pub(crate) mtu: u8,
}

/// What the target granted for one descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Grant {
    pub(crate) status: Result<(), Refusal>,
    pub(crate) segment_len: u64,
    /// The segment's first byte in the target's address space (the MR's address).
    pub(crate) addr: u64,
    pub(crate) rkey: u32,
}

fn put_qp(b: &mut [u8], magic: [u8; 4], byte4: u8, node: NodeId, qp: &QpInfo) {
    b[0..4].copy_from_slice(&magic);
    b[4] = byte4;
    b[5] = qp.mtu;
    b[6..8].copy_from_slice(&qp.lid.to_le_bytes());
    b[8..16].copy_from_slice(&node.0.to_le_bytes());
    b[16..20].copy_from_slice(&qp.qpn.to_le_bytes());
    b[20..24].copy_from_slice(&qp.psn.to_le_bytes());
    b[24..40].copy_from_slice(&qp.gid);
}

fn get_qp(b: &[u8]) -> (NodeId, QpInfo) {
    let mut gid = [0u8; 16];
    gid.copy_from_slice(&b[24..40]);
    (
        NodeId(u64_at(b, 8)),
        QpInfo {
            lid: u16::from_le_bytes([b[6], b[7]]),
            qpn: u32_at(b, 16),
            psn: u32_at(b, 20),
            gid,
            mtu: b[5],
        },
    )
}

/// The initiator's hello to `node` (the node it expects to reach).
pub(crate) fn encode_hello(node: NodeId, qp: &QpInfo) -> [u8; HELLO_LEN] {
    let mut b = [0u8; HELLO_LEN];
    put_qp(&mut b, HELLO_MAGIC, VERSION, node, qp);
    b
}

pub(crate) fn decode_hello(b: &[u8; HELLO_LEN]) -> Result<(NodeId, QpInfo), String> {
    if b[..4] != HELLO_MAGIC {
        return Err("not an rdma handshake".into());
    }
    if b[4] != VERSION {
        return Err(format!("unsupported rdma handshake version {}", b[4]));
    }
    Ok(get_qp(b))
}

/// The target's answer: its queue pair, or a refusal (`qp` is then ignored).
pub(crate) fn encode_reply(
    status: Result<(), Refusal>,
    node: NodeId,
    incarnation: u64,
    qp: &QpInfo,
) -> [u8; REPLY_LEN] {
    let mut b = [0u8; REPLY_LEN];
    let code = match status {
        Ok(()) => 0,
        Err(r) => r.code(),
    };
    put_qp(&mut b, REPLY_MAGIC, code, node, qp);
    b[40..48].copy_from_slice(&incarnation.to_le_bytes());
    b
}

/// `(node, incarnation, qp)` of an accepting reply.
pub(crate) fn decode_reply(
    b: &[u8; REPLY_LEN],
) -> Result<Result<(NodeId, u64, QpInfo), Refusal>, String> {
    if b[..4] != REPLY_MAGIC {
        return Err("not an rdma handshake reply".into());
    }
    if b[4] != 0 {
        return Ok(Err(Refusal::from_code(b[4]).unwrap_or(Refusal::BadRequest)));
    }
    let (node, qp) = get_qp(b);
    Ok(Ok((node, u64_at(b, 40), qp)))
}

pub(crate) fn encode_check(descs: &[SegmentDescriptor]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + descs.len() * SegmentDescriptor::ENCODED_LEN);
    out.extend_from_slice(&CHECK_MAGIC);
    out.extend_from_slice(&(descs.len() as u16).to_le_bytes());
    out.extend_from_slice(&[0, 0]);
    for d in descs {
        d.encode_into(&mut out);
    }
    out
}

/// Number of descriptors that follow a check header.
pub(crate) fn decode_check_header(b: &[u8; HEADER_LEN]) -> Result<usize, String> {
    if b[..4] != CHECK_MAGIC {
        return Err("bad check magic".into());
    }
    let count = u16::from_le_bytes([b[4], b[5]]) as usize;
    if count == 0 || count > MAX_ENTRIES {
        return Err(format!(
            "a check carries 1..={MAX_ENTRIES} descriptors, not {count}"
        ));
    }
    Ok(count)
}

pub(crate) fn encode_grants(grants: &[Grant]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + grants.len() * GRANT_LEN);
    out.extend_from_slice(&GRANT_MAGIC);
    out.extend_from_slice(&(grants.len() as u16).to_le_bytes());
    out.extend_from_slice(&[0, 0]);
    for g in grants {
        out.push(match g.status {
            Ok(()) => 0,
            Err(r) => r.code(),
        });
        out.extend_from_slice(&g.segment_len.to_le_bytes());
        out.extend_from_slice(&g.addr.to_le_bytes());
        out.extend_from_slice(&g.rkey.to_le_bytes());
    }
    out
}

pub(crate) fn decode_grants(b: &[u8], expected: usize) -> Result<Vec<Grant>, String> {
    if b.len() != HEADER_LEN + expected * GRANT_LEN || b[..4] != GRANT_MAGIC {
        return Err("malformed grants".into());
    }
    if u16::from_le_bytes([b[4], b[5]]) as usize != expected {
        return Err("grant count does not match the check".into());
    }
    Ok(b[HEADER_LEN..]
        .chunks_exact(GRANT_LEN)
        .map(|g| Grant {
            status: match g[0] {
                0 => Ok(()),
                code => Err(Refusal::from_code(code).unwrap_or(Refusal::BadRequest)),
            },
            segment_len: u64_at(g, 1),
            addr: u64_at(g, 9),
            rkey: u32_at(g, 17),
        })
        .collect())
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[i..i + 8]);
    u64::from_le_bytes(w)
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::descriptor::{AccessToken, SegmentId};

    fn qp() -> QpInfo {
        QpInfo {
            lid: 0x1234,
            qpn: 0x00ab_cdef,
            psn: 0x0012_3456,
            gid: [0xfe; 16],
            mtu: 5,
        }
    }

    #[test]
    fn hello_and_reply_round_trip() {
        let hello = encode_hello(NodeId(9), &qp());
        assert_eq!(decode_hello(&hello), Ok((NodeId(9), qp())));
        let mut bad = hello;
        bad[4] = 7;
        assert!(decode_hello(&bad).is_err());

        let reply = encode_reply(Ok(()), NodeId(9), 77, &qp());
        assert_eq!(decode_reply(&reply), Ok(Ok((NodeId(9), 77, qp()))));
        let refused = encode_reply(Err(Refusal::WrongNode), NodeId(9), 77, &qp());
        assert_eq!(decode_reply(&refused), Ok(Err(Refusal::WrongNode)));
        assert!(decode_reply(&[0u8; REPLY_LEN]).is_err());
    }

    #[test]
    fn check_and_grants_round_trip() {
        let d = SegmentDescriptor {
            node: NodeId(9),
            segment: SegmentId(3),
            offset: 64,
            len: 128,
            access: crate::descriptor::Access::ReadWrite,
            grant: crate::descriptor::GrantId(1),
            token: AccessToken([2; 16]),
        };
        let check = encode_check(&[d, d]);
        let header: [u8; HEADER_LEN] = check[..HEADER_LEN].try_into().unwrap();
        assert_eq!(decode_check_header(&header), Ok(2));
        assert_eq!(
            SegmentDescriptor::decode(&check[HEADER_LEN + SegmentDescriptor::ENCODED_LEN..])
                .unwrap(),
            d
        );
        let grants = [
            Grant {
                status: Ok(()),
                segment_len: 1 << 30,
                addr: 0x7f00_0000_0000,
                rkey: 0xdead_beef,
            },
            Grant {
                status: Err(Refusal::BadToken),
                segment_len: 0,
                addr: 0,
                rkey: 0,
            },
        ];
        let bytes = encode_grants(&grants);
        assert_eq!(decode_grants(&bytes, 2), Ok(grants.to_vec()));
        assert!(decode_grants(&bytes, 1).is_err());
        assert!(decode_grants(&bytes[..bytes.len() - 1], 2).is_err());
    }
}
