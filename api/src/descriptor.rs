//! Segment descriptors and node addresses: the capability a peer needs to read or write a
//! range of registered memory, in the two encodings the system uses, and where to reach the
//! transfer engine that owns it.
//!
//! A descriptor is what the storage node's KV control API ([`crate::kv`]) returns from
//! put-start and get, and what a client sends for get-into and put-from, so it has a JSON form
//! for the HTTP control plane and a fixed 45-byte binary form for binary protocols and compact
//! lists. Both carry the same five fields; the token authorises exactly
//! `[offset, offset + len)` of the segment on that node.
//!
//! In JSON the 64-bit node id and the token are hex strings (a JavaScript or Python client
//! would otherwise round a large id through a double); offsets and lengths are plain numbers,
//! which stay exact below 2^53 bytes.
//!
//! These are pure data: minting and verifying tokens (which needs the segment's secret key)
//! and moving bytes belong to `yutu-transfer`, which re-exports every type here at its root.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Identifies a node (an engine) in the cluster. Chosen by whoever starts the engine; the
/// storage node derives it from its configured name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u64);

/// Identifies a registered segment within its node. Never reused by one engine, so a stale
/// descriptor cannot reach memory registered later under the same number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SegmentId(pub u32);

/// 128 bits that authorise one range of one segment: a keyed hash of (node, segment, offset,
/// length) under a secret only the segment's engine knows. Compared in constant time.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct AccessToken(pub [u8; 16]);

/// What a descriptor lets its holder do with the range: a peer *reads* from it or *writes*
/// into it. A storage node's read lease yields read-only descriptors and a pending put
/// write-only ones; the memory a client registers for its own buffers is read-write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Access {
    Read,
    Write,
    ReadWrite,
}

impl Access {
    /// Whether a descriptor with this access allows a peer's `op` (`Read` or `Write`).
    pub fn permits(self, op: Access) -> bool {
        matches!(
            (self, op),
            (Access::ReadWrite, _) | (Access::Read, Access::Read) | (Access::Write, Access::Write)
        )
    }

    fn code(self) -> u8 {
        match self {
            Access::Read => 1,
            Access::Write => 2,
            Access::ReadWrite => 3,
        }
    }

    fn from_code(code: u8) -> Option<Access> {
        match code {
            1 => Some(Access::Read),
            2 => Some(Access::Write),
            3 => Some(Access::ReadWrite),
            _ => None,
        }
    }
}

/// Which grant of the segment's owner a descriptor belongs to: a storage node's lease or
/// pending put. Never reused by one engine, so when a grant ends (release, expiry, delete),
/// its descriptors die with it even if the same bytes are granted again under a new id.
/// `0` is no grant: the range is valid as long as the segment is registered (a client's own
/// buffer).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct GrantId(pub u64);

impl GrantId {
    /// No grant: valid while the segment is registered.
    pub const NONE: GrantId = GrantId(0);
}

/// A range of a registered segment that a peer may read or write one-sidedly: a capability.
/// The token authenticates every other field, so a holder can neither widen the range, nor
/// turn a read into a write, nor move it to another grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SegmentDescriptor {
    pub node: NodeId,
    pub segment: SegmentId,
    /// Byte offset of the range within the segment.
    pub offset: u64,
    /// Length of the range in bytes.
    pub len: u64,
    pub access: Access,
    #[serde(with = "grant_hex")]
    pub grant: GrantId,
    pub token: AccessToken,
}

/// A descriptor or one of its fields did not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DescriptorError {
    #[error("a binary segment descriptor is {expected} bytes, got {got}")]
    Length { expected: usize, got: usize },
    #[error("unknown segment descriptor version {0}")]
    Version(u8),
    #[error("segment descriptor range {offset}+{len} overflows 64 bits")]
    Overflow { offset: u64, len: u64 },
    #[error("{what} is not {digits} hex digits")]
    Hex { what: &'static str, digits: usize },
    #[error("unknown access mode {0} in a segment descriptor")]
    Access(u8),
}

/// Version byte of the binary form; bumped if the layout ever changes (2: access and grant).
const BINARY_VERSION: u8 = 2;

impl SegmentDescriptor {
    /// Bytes of the binary form: version, node (u64), segment (u32), offset (u64), len (u64),
    /// access (u8: 1 read, 2 write, 3 read-write), grant (u64), token (16 bytes); integers
    /// little-endian.
    pub const ENCODED_LEN: usize = 1 + 8 + 4 + 8 + 8 + 1 + 8 + 16;

    /// One past the last byte of the range, or `None` when it overflows (never for a
    /// descriptor that decoded or that an engine minted).
    pub fn end(&self) -> Option<u64> {
        self.offset.checked_add(self.len)
    }

    /// The binary form.
    pub fn encode(&self) -> [u8; Self::ENCODED_LEN] {
        let mut out = [0u8; Self::ENCODED_LEN];
        out[0] = BINARY_VERSION;
        out[1..9].copy_from_slice(&self.node.0.to_le_bytes());
        out[9..13].copy_from_slice(&self.segment.0.to_le_bytes());
        out[13..21].copy_from_slice(&self.offset.to_le_bytes());
        out[21..29].copy_from_slice(&self.len.to_le_bytes());
        out[29] = self.access.code();
        out[30..38].copy_from_slice(&self.grant.0.to_le_bytes());
        out[38..54].copy_from_slice(&self.token.0);
        out
    }

    /// Appends the binary form to `out` (for lists of descriptors in one buffer).
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.encode());
    }

    /// Parses the binary form; `bytes` must be exactly [`Self::ENCODED_LEN`] long.
    pub fn decode(bytes: &[u8]) -> Result<SegmentDescriptor, DescriptorError> {
        let b: &[u8; Self::ENCODED_LEN] =
            bytes.try_into().map_err(|_| DescriptorError::Length {
                expected: Self::ENCODED_LEN,
                got: bytes.len(),
            })?;
        if b[0] != BINARY_VERSION {
            return Err(DescriptorError::Version(b[0]));
        }
        let u64_at = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        let mut seg = [0u8; 4];
        seg.copy_from_slice(&b[9..13]);
        let mut token = [0u8; 16];
        token.copy_from_slice(&b[38..54]);
        let access = Access::from_code(b[29]).ok_or(DescriptorError::Access(b[29]))?;
        let desc = SegmentDescriptor {
            node: NodeId(u64_at(1)),
            segment: SegmentId(u32::from_le_bytes(seg)),
            offset: u64_at(13),
            len: u64_at(21),
            access,
            grant: GrantId(u64_at(30)),
            token: AccessToken(token),
        };
        if desc.end().is_none() {
            return Err(DescriptorError::Overflow {
                offset: desc.offset,
                len: desc.len,
            });
        }
        Ok(desc)
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl FromStr for NodeId {
    type Err = DescriptorError;

    fn from_str(s: &str) -> Result<NodeId, DescriptorError> {
        parse_hex_u64(s, "a node id").map(NodeId)
    }
}

impl Serialize for NodeId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for NodeId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<NodeId, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for SegmentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for AccessToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

/// Shows only the first bytes: enough to tell tokens apart in a log, not enough to reuse one.
impl fmt::Debug for AccessToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AccessToken({}…)", hex::encode(&self.0[..4]))
    }
}

impl FromStr for AccessToken {
    type Err = DescriptorError;

    fn from_str(s: &str) -> Result<AccessToken, DescriptorError> {
        let mut out = [0u8; 16];
        hex::decode_to_slice(s, &mut out).map_err(|_| DescriptorError::Hex {
            what: "an access token",
            digits: 32,
        })?;
        Ok(AccessToken(out))
    }
}

impl Serialize for AccessToken {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for AccessToken {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<AccessToken, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A node's transfer endpoints: what one engine publishes about itself and another one needs
/// before it can move bytes to or from that node.
///
/// The storage node serves it at `GET /v1/kv/engine` ([`crate::kv::ENGINE_PATH`]); a client
/// adds it as a peer of its own engine and from then on resolves every descriptor's node id to
/// it, and sends its own address with get-into and put-from. Only what the node actually offers
/// is present: a missing `shm` socket or `rdma` endpoint removes that path from selection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAddress {
    pub node: NodeId,
    /// Random per engine start. A peer that restarted under the same node id gets a new one,
    /// which drops whatever was cached for the old process (shm mappings, connections).
    #[serde(with = "hex_u64")]
    pub incarnation: u64,
    /// Kernel boot id of the node's host: shm is only tried between equal hosts.
    pub host: String,
    /// Unix socket that hands out memfds of registered segments (same host only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shm: Option<PathBuf>,
    /// The tcp transfer listener.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp: Option<SocketAddr>,
    /// RDMA, when the node has a device and was built with the `rdma` feature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma: Option<RdmaEndpoint>,
}

/// Where a peer exchanges queue-pair numbers and memory keys with a node before one-sided RDMA.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RdmaEndpoint {
    /// TCP address of the queue-pair handshake listener.
    pub handshake: SocketAddr,
    /// The device the node registered its memory with (for diagnostics).
    pub device: String,
}

/// Parses exactly 16 hex digits (the form [`NodeId`]'s `Display` writes).
fn parse_hex_u64(s: &str, what: &'static str) -> Result<u64, DescriptorError> {
    let mut out = [0u8; 8];
    hex::decode_to_slice(s, &mut out).map_err(|_| DescriptorError::Hex { what, digits: 16 })?;
    Ok(u64::from_be_bytes(out))
}

/// Serde helper for a `u64` written as 16 hex digits, for ids that must survive JSON parsers
/// that read numbers as doubles.
mod hex_u64 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&format_args!("{v:016x}"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        super::parse_hex_u64(&s, "an incarnation").map_err(serde::de::Error::custom)
    }
}

/// Serde helper for a [`GrantId`] as 16 hex digits, like node ids.
mod grant_hex {
    use serde::{Deserialize, Deserializer, Serializer};

    use super::GrantId;

    pub fn serialize<S: Serializer>(v: &GrantId, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&format_args!("{:016x}", v.0))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<GrantId, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        super::parse_hex_u64(&s, "a grant id")
            .map(GrantId)
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> SegmentDescriptor {
        SegmentDescriptor {
            node: NodeId(0xfedc_ba98_7654_3210),
            segment: SegmentId(7),
            offset: 4096,
            len: 2 << 20,
            access: Access::Read,
            grant: GrantId(0x2a),
            token: AccessToken([0xab; 16]),
        }
    }

    #[test]
    fn access_modes_permit_only_their_direction() {
        assert!(Access::Read.permits(Access::Read));
        assert!(!Access::Read.permits(Access::Write));
        assert!(Access::Write.permits(Access::Write));
        assert!(!Access::Write.permits(Access::Read));
        assert!(Access::ReadWrite.permits(Access::Read));
        assert!(Access::ReadWrite.permits(Access::Write));
        let mut bad = sample().encode();
        bad[29] = 9;
        assert_eq!(
            SegmentDescriptor::decode(&bad),
            Err(DescriptorError::Access(9))
        );
    }

    #[test]
    fn binary_round_trip_and_layout() {
        let d = sample();
        let bytes = d.encode();
        assert_eq!(bytes.len(), 54);
        assert_eq!(bytes[0], 2);
        assert_eq!(&bytes[1..9], &0xfedc_ba98_7654_3210u64.to_le_bytes());
        assert_eq!(bytes[29], 1);
        assert_eq!(&bytes[30..38], &0x2au64.to_le_bytes());
        assert_eq!(SegmentDescriptor::decode(&bytes).unwrap(), d);
        let mut list = Vec::new();
        d.encode_into(&mut list);
        d.encode_into(&mut list);
        assert_eq!(list.len(), 108);
        assert_eq!(SegmentDescriptor::decode(&list[54..]).unwrap(), d);
    }

    #[test]
    fn binary_rejects_bad_input() {
        let d = sample();
        let bytes = d.encode();
        assert_eq!(
            SegmentDescriptor::decode(&bytes[..53]),
            Err(DescriptorError::Length {
                expected: 54,
                got: 53
            })
        );
        let mut v1 = bytes;
        v1[0] = 1;
        assert_eq!(
            SegmentDescriptor::decode(&v1),
            Err(DescriptorError::Version(1))
        );
        let overflow = SegmentDescriptor {
            offset: u64::MAX,
            len: 2,
            ..d
        };
        assert!(matches!(
            SegmentDescriptor::decode(&overflow.encode()),
            Err(DescriptorError::Overflow { .. })
        ));
    }

    #[test]
    fn json_shape_is_stable() {
        let d = sample();
        let json = serde_json::to_string(&d).unwrap();
        assert_eq!(
            json,
            r#"{"node":"fedcba9876543210","segment":7,"offset":4096,"len":2097152,"access":"read","grant":"000000000000002a","token":"abababababababababababababababab"}"#
        );
        let back: SegmentDescriptor = serde_json::from_str(&json).unwrap();
        assert_eq!(back, d);
    }

    #[test]
    fn json_rejects_bad_fields() {
        let ok = r#"{"node":"fedcba9876543210","segment":7,"offset":0,"len":1,"access":"write","grant":"0000000000000001","token":"abababababababababababababababab"}"#;
        assert!(serde_json::from_str::<SegmentDescriptor>(ok).is_ok());
        for bad in [
            ok.replace(
                r#""token":"abababababababababababababababab""#,
                r#""token":"zz""#,
            ),
            ok.replace(r#""node":"fedcba9876543210""#, r#""node":5"#),
            ok.replace(r#""access":"write""#, r#""access":"all""#),
            ok.replace(r#""grant":"0000000000000001""#, r#""grant":1"#),
            ok.replace(r#","access":"write""#, ""),
            ok.replace('}', r#","x":1}"#),
        ] {
            assert!(
                serde_json::from_str::<SegmentDescriptor>(&bad).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn token_debug_does_not_leak_the_whole_token() {
        let t = AccessToken([0x11; 16]);
        let dbg = format!("{t:?}");
        assert!(dbg.contains("11111111"));
        assert!(!dbg.contains(&t.to_string()));
    }

    #[test]
    fn json_round_trip_leaves_out_missing_paths() {
        let addr = NodeAddress {
            node: NodeId(42),
            incarnation: u64::MAX,
            host: "b00t".into(),
            shm: None,
            tcp: Some("127.0.0.1:7000".parse().unwrap()),
            rdma: None,
        };
        let json = serde_json::to_string(&addr).unwrap();
        assert_eq!(
            json,
            r#"{"node":"000000000000002a","incarnation":"ffffffffffffffff","host":"b00t","tcp":"127.0.0.1:7000"}"#
        );
        assert_eq!(serde_json::from_str::<NodeAddress>(&json).unwrap(), addr);
        let full = NodeAddress {
            shm: Some("/run/yutu/x.sock".into()),
            rdma: Some(RdmaEndpoint {
                handshake: "127.0.0.1:7001".parse().unwrap(),
                device: "mlx5_0".into(),
            }),
            ..addr
        };
        let back: NodeAddress =
            serde_json::from_str(&serde_json::to_string(&full).unwrap()).unwrap();
        assert_eq!(back, full);
    }
}
