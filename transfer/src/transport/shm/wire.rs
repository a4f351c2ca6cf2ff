//! Messages on the shm control socket. Only control travels here; the bytes are copied
//! between mappings by the initiator.
//!
//! ```text
//! hello    (target → initiator, on accept, 24 bytes):
//!          magic "YTS1" | version u8 | 0u8 x3 | node u64 | incarnation u64
//! check    (initiator → target): magic "YTC1" | count u16 | 0u16 |
//!          count x (descriptor, 54 bytes binary | flags u8: bit 0 = attach)
//! verdicts (target → initiator): magic "YTV1" | count u16 | fds u16 |
//!          count x (status u8: 0 ok or a Refusal code, bit 7 = stable, bit 6 = process |
//!                   segment length u64 | segment address u64)
//!          with one fd (SCM_RIGHTS) per accepted entry that asked to attach, in order: the
//!          segment's memfd, or for process memory the target's memory file
//! prove    (initiator → target, in place of a check, 48 bytes):
//!          magic "YTP1" | 0u8 x4 | challenger node u64 | nonce (32 bytes)
//! answer   (target → initiator, 40 bytes): magic "YTA1" |
//!          status u8 (0: the proof follows, else a Refusal code) | 0u8 x3 |
//!          proof (32 bytes; zeros with a refusal)
//! ```
//!
//! "Process" (bit 6 of an accepting status) says the segment is memory the target process
//! already had (`MemoryRegion::process_memory`): the fd is the target's `/proc/self/mem`, and
//! the segment starts at the address that follows the length (zero for a memfd segment).
//!
//! "Stable" (bit 7 of an accepting status) says the segment has no range guard: the verdict
//! holds for as long as the segment stays registered, so an initiator may reuse it for the
//! same descriptor instead of asking again (see `direct.rs`). A guarded segment (a storage
//! node's arena under leases) never sets it; an older target that does not know the bit never
//! sets it either, which only costs the initiator round trips.
//!
//! A prove message is a proof challenge (see `proof.rs`): the answer shows that the socket
//! belongs to the engine its hello names and that this engine shares the challenger's secret.
//! The challenger reads the hello first and sends nothing to a socket whose hello is not the
//! claimed node's. Reserved bytes must be zero; anything else is malformed.

use crate::descriptor::{NodeId, SegmentDescriptor};
use crate::error::Refusal;
use crate::proof::{Mac, Nonce, MAC_LEN, NONCE_LEN};

pub(crate) const HELLO_MAGIC: [u8; 4] = *b"YTS1";
pub(crate) const CHECK_MAGIC: [u8; 4] = *b"YTC1";
pub(crate) const VERDICT_MAGIC: [u8; 4] = *b"YTV1";
pub(crate) const PROVE_MAGIC: [u8; 4] = *b"YTP1";
pub(crate) const ANSWER_MAGIC: [u8; 4] = *b"YTA1";
/// Version 2: verdicts carry the segment address and the process bit.
pub(crate) const VERSION: u8 = 2;
pub(crate) const HELLO_LEN: usize = 24;
pub(crate) const HEADER_LEN: usize = 8;
pub(crate) const CHECK_ENTRY_LEN: usize = SegmentDescriptor::ENCODED_LEN + 1;
pub(crate) const VERDICT_ENTRY_LEN: usize = 17;
/// What follows a prove message's header: the challenger's node id and the nonce.
pub(crate) const PROVE_BODY_LEN: usize = 8 + NONCE_LEN;
pub(crate) const PROVE_LEN: usize = HEADER_LEN + PROVE_BODY_LEN;
pub(crate) const ANSWER_LEN: usize = 8 + MAC_LEN;
/// Entries per message; also bounds the descriptors passed in one message.
pub(crate) const MAX_ENTRIES: usize = super::fdpass::MAX_FDS;

pub(crate) const FLAG_ATTACH: u8 = 1;
/// Bit 7 of an accepting verdict's status: the verdict does not expire (no range guard).
pub(crate) const STATUS_STABLE: u8 = 0x80;
/// Bit 6 of an accepting verdict's status: process memory, reached through the memory file.
pub(crate) const STATUS_PROCESS: u8 = 0x40;

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
    /// For process memory, the segment's address in the target process (its fd is then the
    /// target's memory file); `None` for a memfd segment.
    pub(crate) process: Option<u64>,
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

/// What a message header announces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Header {
    /// A check of this many entries.
    Check(usize),
    /// A proof challenge ([`PROVE_BODY_LEN`] bytes follow).
    Prove,
}

/// Parses the header of a message to the target.
pub(crate) fn decode_header(b: &[u8; HEADER_LEN]) -> Result<Header, String> {
    if b[..4] == PROVE_MAGIC {
        if b[4..] != [0; 4] {
            return Err("reserved bytes of a prove message are not zero".into());
        }
        return Ok(Header::Prove);
    }
    decode_check_header(b).map(Header::Check)
}

pub(crate) fn encode_prove(challenger: NodeId, nonce: &Nonce) -> [u8; PROVE_LEN] {
    let mut b = [0u8; PROVE_LEN];
    b[..4].copy_from_slice(&PROVE_MAGIC);
    b[HEADER_LEN..HEADER_LEN + 8].copy_from_slice(&challenger.0.to_le_bytes());
    b[HEADER_LEN + 8..].copy_from_slice(nonce);
    b
}

/// The challenger and the nonce of a prove message's body.
pub(crate) fn decode_prove_body(b: &[u8; PROVE_BODY_LEN]) -> (NodeId, Nonce) {
    let mut nonce = [0u8; NONCE_LEN];
    nonce.copy_from_slice(&b[8..]);
    (NodeId(u64_at(b, 0)), nonce)
}

pub(crate) fn encode_answer(answer: &Result<Mac, Refusal>) -> [u8; ANSWER_LEN] {
    let mut b = [0u8; ANSWER_LEN];
    b[..4].copy_from_slice(&ANSWER_MAGIC);
    match answer {
        Ok(mac) => b[8..].copy_from_slice(mac),
        Err(refusal) => b[4] = refusal.code(),
    }
    b
}

/// The proof an answer carries, or the target's refusal; `Err` when it is not an answer.
pub(crate) fn decode_answer(b: &[u8; ANSWER_LEN]) -> Result<Result<Mac, Refusal>, String> {
    if b[..4] != ANSWER_MAGIC {
        return Err("not an answer to a proof challenge".into());
    }
    if b[5..8] != [0; 3] {
        return Err("reserved bytes of an answer are not zero".into());
    }
    let mut mac = [0u8; MAC_LEN];
    mac.copy_from_slice(&b[8..]);
    match b[4] {
        0 => Ok(Ok(mac)),
        _ if mac != [0; MAC_LEN] => Err("a refusal that carries a proof".into()),
        code => Ok(Err(Refusal::from_code(code).unwrap_or(Refusal::BadRequest))),
    }
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
            Ok(()) => {
                (if v.stable { STATUS_STABLE } else { 0 })
                    | (if v.process.is_some() {
                        STATUS_PROCESS
                    } else {
                        0
                    })
            }
            Err(r) => r.code(),
        });
        out.extend_from_slice(&v.segment_len.to_le_bytes());
        out.extend_from_slice(&v.process.unwrap_or(0).to_le_bytes());
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
        .map(|e| {
            let accepted = e[0] & !(STATUS_STABLE | STATUS_PROCESS) == 0;
            Verdict {
                status: if accepted {
                    Ok(())
                } else {
                    Err(Refusal::from_code(e[0]).unwrap_or(Refusal::BadRequest))
                },
                segment_len: u64_at(e, 1),
                stable: accepted && e[0] & STATUS_STABLE != 0,
                process: (accepted && e[0] & STATUS_PROCESS != 0).then(|| u64_at(e, 9)),
            }
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
                process: None,
            },
            Verdict {
                status: Ok(()),
                segment_len: 8192,
                stable: true,
                process: None,
            },
            Verdict {
                status: Err(Refusal::BadToken),
                segment_len: 0,
                stable: false,
                process: None,
            },
            Verdict {
                status: Ok(()),
                segment_len: 1 << 20,
                stable: true,
                process: Some(0x7f12_3456_7000),
            },
        ];
        let bytes = encode_verdicts(&verdicts, 1);
        assert_eq!(decode_verdicts(&bytes, 4), Ok((verdicts.to_vec(), 1)));
        assert!(decode_verdicts(&bytes, 3).is_err());
    }

    #[test]
    fn prove_messages_round_trip_and_reject_garbage() {
        let nonce: Nonce = std::array::from_fn(|i| i as u8 + 1);
        let msg = encode_prove(NodeId(0x0102_0304_0506_0708), &nonce);
        assert_eq!(msg.len(), 48);
        let header: [u8; HEADER_LEN] = msg[..HEADER_LEN].try_into().unwrap();
        assert_eq!(decode_header(&header), Ok(Header::Prove));
        let body: [u8; PROVE_BODY_LEN] = msg[HEADER_LEN..].try_into().unwrap();
        assert_eq!(body[0], 0x08, "node ids are little-endian");
        assert_eq!(
            decode_prove_body(&body),
            (NodeId(0x0102_0304_0506_0708), nonce)
        );
        // A check header still parses as one; garbage and dirty reserved bytes do not.
        let check = encode_check(&[CheckEntry {
            desc: SegmentDescriptor {
                node: NodeId(7),
                segment: crate::descriptor::SegmentId(1),
                offset: 0,
                len: 10,
                access: crate::descriptor::Access::ReadWrite,
                grant: crate::descriptor::GrantId(1),
                token: crate::descriptor::AccessToken([1; 16]),
            },
            attach: false,
        }]);
        let check: [u8; HEADER_LEN] = check[..HEADER_LEN].try_into().unwrap();
        assert_eq!(decode_header(&check), Ok(Header::Check(1)));
        assert!(decode_header(b"YTP2\0\0\0\0").is_err());
        assert!(decode_header(&[0xAB; HEADER_LEN]).is_err());
        for i in 4..HEADER_LEN {
            let mut bad = header;
            bad[i] = 1;
            assert!(decode_header(&bad).is_err(), "byte {i}");
        }

        let mac: Mac = [9; MAC_LEN];
        let ok = encode_answer(&Ok(mac));
        assert_eq!(ok.len(), 40);
        assert_eq!(decode_answer(&ok), Ok(Ok(mac)));
        let refused = encode_answer(&Err(Refusal::Untrusted));
        assert_eq!(decode_answer(&refused), Ok(Err(Refusal::Untrusted)));
        assert_eq!(&refused[8..], &[0; MAC_LEN]);
        let mut bad = refused;
        bad[20] = 1;
        assert!(decode_answer(&bad).is_err(), "a refusal with a proof");
        let mut bad = ok;
        bad[6] = 1;
        assert!(decode_answer(&bad).is_err(), "dirty reserved bytes");
        let mut bad = ok;
        bad[..4].copy_from_slice(b"YTV1");
        assert!(decode_answer(&bad).is_err(), "another message's magic");
        assert!(decode_answer(&[0; ANSWER_LEN]).is_err());
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
