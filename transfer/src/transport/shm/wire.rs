//! Messages on the shm control socket. Only control travels here; the bytes are copied
//! between mappings by the initiator.
//!
//! ```text
//! hello    (target → initiator, on accept, 24 bytes):
//!          magic "YTS1" | version u8 | 0u8 x3 | node u64 | incarnation u64
//! check    (initiator → target): magic "YTC1" | count u16 | 0u16 |
//!          count x (descriptor, 54 bytes binary | flags u8: bit 0 = attach)
//! verdicts (target → initiator): magic "YTV1" | count u16 | fds u16 |
//!          count x (status u8: 0 ok or a Refusal code, bit 7 = stable | segment length u64)
//!          with one memfd (SCM_RIGHTS) per accepted entry that asked to attach, in order
//! ```
//!
//! "Stable" (bit 7 of an accepting status) says the segment has no range guard: the verdict
//! holds for as long as the segment stays registered, so an initiator may reuse it for the
//! same descriptor instead of asking again (see `direct.rs`). A guarded segment (a storage
//! node's arena under leases) never sets it; an older target that does not know the bit never
//! sets it either, which only costs the initiator round trips.

use crate::descriptor::{NodeId, SegmentDescriptor};
use crate::error::Refusal;

pub(crate) const HELLO_MAGIC: [u8; 4] = *b"YTS1";
pub(crate) const CHECK_MAGIC: [u8; 4] = *b"YTC1";
pub(crate) const VERDICT_MAGIC: [u8; 4] = *b"YTV1";
pub(crate) const VERSION: u8 = 1;
pub(crate) const HELLO_LEN: usize = 24;
pub(crate) const HEADER_LEN: usize = 8;
pub(crate) const CHECK_ENTRY_LEN: usize = SegmentDescriptor::ENCODED_LEN + 1;
pub(crate) const VERDICT_ENTRY_LEN: usize = 9;
/// Entries per message; also bounds the descriptors passed in one message.
pub(crate) const MAX_ENTRIES: usize = super::fdpass::MAX_FDS;

pub(crate) const FLAG_ATTACH: u8 = 1;
/// Bit 7 of an accepting verdict's status: the verdict does not expire (no range guard).
pub(crate) const STATUS_STABLE: u8 = 0x80;

pub(crate) fn encode_hello(node: NodeId, incarnation: u64) -> [u8; HELLO_LEN] {
    let mut b = [0u8; HELLO_LEN];
    b[..4].copy_from_slice(&HELLO_MAGIC);
    b[4] = VERSION;
    b[8..16].copy_from_slice(&node.0.to_le_bytes());
    b[16..24].copy_from_slice(&incarnation.to_le_bytes());
    b
}

/// `(node, incarnation)` of a hello, or why it is not one.
pub(crate) fn decode_hello(b: &[u8; HELLO_LEN]) -> Result<(NodeId, u64), String> {
    if b[..4] != HELLO_MAGIC {
        return Err("not a yutu shm socket".into());
    }
    if b[4] != VERSION {
        return Err(format!("unsupported shm protocol version {}", b[4]));
    }
    Ok((NodeId(u64_at(b, 8)), u64_at(b, 16)))
}

/// One entry of a check message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CheckEntry {
    pub(crate) desc: SegmentDescriptor,
    pub(crate) attach: bool,
}

/// One verdict: the status and the length of the whole segment (for the initiator's bounds
/// checks and its mapping).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Verdict {
    pub(crate) status: Result<(), Refusal>,
    pub(crate) segment_len: u64,
    /// Accepted, and valid until the segment is unregistered (no guard to consult again).
    pub(crate) stable: bool,
}

pub(crate) fn encode_check(entries: &[CheckEntry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + entries.len() * CHECK_ENTRY_LEN);
    out.extend_from_slice(&CHECK_MAGIC);
    out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    out.extend_from_slice(&[0, 0]);
    for e in entries {
        e.desc.encode_into(&mut out);
        out.push(if e.attach { FLAG_ATTACH } else { 0 });
    }
    out
}

/// Parses a check message's header: the number of entries that follow.
pub(crate) fn decode_check_header(b: &[u8; HEADER_LEN]) -> Result<usize, String> {
    if b[..4] != CHECK_MAGIC {
        return Err("bad check magic".into());
    }
    let count = u16::from_le_bytes([b[4], b[5]]) as usize;
    if count == 0 || count > MAX_ENTRIES {
        return Err(format!(
            "a check carries 1..={MAX_ENTRIES} entries, not {count}"
        ));
    }
    Ok(count)
}

/// Parses one check entry; a descriptor that does not decode is refused, not fatal.
pub(crate) fn decode_check_entry(b: &[u8]) -> Result<CheckEntry, Refusal> {
    let desc = SegmentDescriptor::decode(&b[..SegmentDescriptor::ENCODED_LEN])
        .map_err(|_| Refusal::BadRequest)?;
    Ok(CheckEntry {
        desc,
        attach: b[SegmentDescriptor::ENCODED_LEN] & FLAG_ATTACH != 0,
    })
}

pub(crate) fn encode_verdicts(verdicts: &[Verdict], fds: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + verdicts.len() * VERDICT_ENTRY_LEN);
    out.extend_from_slice(&VERDICT_MAGIC);
    out.extend_from_slice(&(verdicts.len() as u16).to_le_bytes());
    out.extend_from_slice(&(fds as u16).to_le_bytes());
    for v in verdicts {
        out.push(match v.status {
            Ok(()) if v.stable => STATUS_STABLE,
            Ok(()) => 0,
            Err(r) => r.code(),
        });
        out.extend_from_slice(&v.segment_len.to_le_bytes());
    }
    out
}

/// Parses a verdicts message of `expected` entries; returns them and the descriptor count.
pub(crate) fn decode_verdicts(b: &[u8], expected: usize) -> Result<(Vec<Verdict>, usize), String> {
    if b.len() != HEADER_LEN + expected * VERDICT_ENTRY_LEN || b[..4] != VERDICT_MAGIC {
        return Err("malformed verdicts".into());
    }
    let count = u16::from_le_bytes([b[4], b[5]]) as usize;
    if count != expected {
        return Err(format!("{count} verdicts for {expected} descriptors"));
    }
    let fds = u16::from_le_bytes([b[6], b[7]]) as usize;
    let verdicts = b[HEADER_LEN..]
        .chunks_exact(VERDICT_ENTRY_LEN)
        .map(|e| Verdict {
            status: match e[0] {
                0 | STATUS_STABLE => Ok(()),
                code => Err(Refusal::from_code(code).unwrap_or(Refusal::BadRequest)),
            },
            segment_len: u64_at(e, 1),
            stable: e[0] == STATUS_STABLE,
        })
        .collect();
    Ok((verdicts, fds))
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[i..i + 8]);
    u64::from_le_bytes(w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::descriptor::{AccessToken, SegmentId};

    #[test]
    fn messages_round_trip() {
        let hello = encode_hello(NodeId(7), 99);
        assert_eq!(decode_hello(&hello), Ok((NodeId(7), 99)));
        assert!(decode_hello(&[0u8; HELLO_LEN]).is_err());

        let desc = SegmentDescriptor {
            node: NodeId(7),
            segment: SegmentId(1),
            offset: 0,
            len: 10,
            access: crate::descriptor::Access::ReadWrite,
            grant: crate::descriptor::GrantId(1),
            token: AccessToken([1; 16]),
        };
        let msg = encode_check(&[CheckEntry { desc, attach: true }]);
        let header: [u8; HEADER_LEN] = msg[..HEADER_LEN].try_into().unwrap();
        assert_eq!(decode_check_header(&header), Ok(1));
        assert_eq!(
            decode_check_entry(&msg[HEADER_LEN..]),
            Ok(CheckEntry { desc, attach: true })
        );

        let verdicts = [
            Verdict {
                status: Ok(()),
                segment_len: 4096,
                stable: false,
            },
            Verdict {
                status: Ok(()),
                segment_len: 8192,
                stable: true,
            },
            Verdict {
                status: Err(Refusal::BadToken),
                segment_len: 0,
                stable: false,
            },
        ];
        let bytes = encode_verdicts(&verdicts, 1);
        assert_eq!(decode_verdicts(&bytes, 3), Ok((verdicts.to_vec(), 1)));
        assert!(decode_verdicts(&bytes, 2).is_err());
    }

    #[test]
    fn check_header_bounds_the_entry_count() {
        let mut h = [0u8; HEADER_LEN];
        h[..4].copy_from_slice(&CHECK_MAGIC);
        assert!(decode_check_header(&h).is_err());
        h[4..6].copy_from_slice(&(MAX_ENTRIES as u16 + 1).to_le_bytes());
        assert!(decode_check_header(&h).is_err());
    }
}
