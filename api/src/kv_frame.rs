//! The KV calls in binary frames: the same calls and bodies as the JSON API ([`crate::kv`]),
//! on a connection of their own to one shard, for the small calls whose time HTTP dominates.
//!
//! A single-key `exists` over HTTP spends most of its time outside the lookup: the request
//! line, headers and JSON on both ends, and a client runtime built for HTTP. A frame is a
//! 16-byte header and a MessagePack body holding exactly the JSON API's request or answer
//! struct (MessagePack is self-describing, so optional fields, unknown-field refusal and
//! every bound carry over unchanged). The HTTP/JSON API stays the reference: a frame call
//! means what the JSON call of the same name means, is checked by the same code on the node,
//! and answers the same struct.
//!
//! # Connections
//! A node listens for frames on every shard ([`FramesInfo`], `GET` [`FRAMES_PATH`]): a Unix
//! socket in the abstract namespace (same host and network namespace) and, when the node has
//! no TLS, a TCP port. A client sends a call whose keys one shard owns
//! ([`crate::placement::shard_for`]) to that shard, which spares the hop between shards; any
//! shard serves any call.
//!
//! The first frame on a connection is [`FrameOp::Hello`] with the bearer token (or none, for
//! an open node or an anonymous caller). The node keeps the token and checks it again on every
//! call, as it does for every HTTP request, so an expired or revoked token stops working on an
//! open connection too. A connection carries one call at a time: the client sends a frame and
//! reads its answer before the next. A Unix client checks the socket's peer process
//! (`SO_PEERCRED`) against [`FramesInfo::pid`] before it sends a token.
//!
//! # Frame
//! | bytes | field |
//! |---|---|
//! | 0..2 | [`MAGIC`] `YK` |
//! | 2 | [`VERSION`] |
//! | 3 | op ([`FrameOp`]; an answer repeats its call's) |
//! | 4 | status: 0 success, 1 error (the body is a [`FrameFailure`]) |
//! | 5..8 | zero |
//! | 8..12 | call id, little-endian (an answer repeats its call's) |
//! | 12..16 | body length, little-endian, at most [`MAX_BODY`] |
//!
//! A per-bucket call's body is the MessagePack array `[bucket, request]`; the others' body is
//! the request alone. [`FrameOp::Read`] and [`FrameOp::Write`] carry values inline: the frame
//! forms of reading a small object (S3 `GET`) and of a put-from whose bytes are in the call.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::kv::KvOp;

/// `GET`: where the node's shards take frames, a [`FramesInfo`].
pub const FRAMES_PATH: &str = "/v1/kv/frames";

/// The first two bytes of every frame.
pub const MAGIC: [u8; 2] = *b"YK";
/// The frame format of this crate.
pub const VERSION: u8 = 1;
/// Bytes in a frame header.
pub const HEADER_LEN: usize = 16;
/// Largest body a frame may carry, either way: a [`FrameOp::Write`] or a [`FrameOp::Read`]
/// answer of inline values, or the largest JSON-equivalent request.
pub const MAX_BODY: u32 = 16 << 20;
/// Most bytes of values one [`FrameOp::Read`] answers inline; a value that would pass this
/// is answered [`InlineValue::TooLarge`] (read it with get-into or S3 `GET`).
pub const MAX_INLINE: u64 = 8 << 20;

/// What a frame asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameOp {
    /// [`Hello`] → [`Welcome`]: the first frame on a connection.
    Hello,
    /// A per-bucket call of the JSON API, with its request and answer.
    Kv(KvOp),
    /// [`crate::kv::ReleaseRequest`] → [`crate::kv::ReleaseResponse`].
    Release,
    /// [`ReadRequest`] → [`ReadResponse`]: small values, inline.
    Read,
    /// [`WriteRequest`] → [`crate::kv::EtagsResponse`]: small values, inline.
    Write,
    /// [`PresenceRequest`] → [`PresenceGrant`]: Unix connections only.
    Presence,
    /// [`ArenaChallengeRequest`] → [`ArenaChallenge`]: the first step towards an arena view
    /// (Unix connections only).
    ArenaChallenge,
    /// [`ArenaViewRequest`] → [`ArenaViewGrant`]: the shard's arena, to a caller that proved
    /// it can read the node's memory already (Unix connections only).
    ArenaView,
}

impl FrameOp {
    /// The op byte.
    pub fn code(self) -> u8 {
        match self {
            FrameOp::Hello => 1,
            FrameOp::Release => 2,
            FrameOp::Read => 3,
            FrameOp::Write => 4,
            FrameOp::Presence => 5,
            FrameOp::ArenaChallenge => 6,
            FrameOp::ArenaView => 7,
            FrameOp::Kv(op) => {
                16 + KvOp::ALL.iter().position(|o| *o == op).unwrap_or_default() as u8
            }
        }
    }

    /// The op of a byte, if it names one.
    pub fn from_code(code: u8) -> Option<FrameOp> {
        match code {
            1 => Some(FrameOp::Hello),
            2 => Some(FrameOp::Release),
            3 => Some(FrameOp::Read),
            4 => Some(FrameOp::Write),
            5 => Some(FrameOp::Presence),
            6 => Some(FrameOp::ArenaChallenge),
            7 => Some(FrameOp::ArenaView),
            c => KvOp::ALL
                .get(usize::from(c.checked_sub(16)?))
                .map(|op| FrameOp::Kv(*op)),
        }
    }

    /// Whether the body starts with the bucket (`[bucket, request]`).
    pub fn has_bucket(self) -> bool {
        matches!(
            self,
            FrameOp::Kv(_) | FrameOp::Read | FrameOp::Write | FrameOp::Presence
        )
    }
}

/// A frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub op: FrameOp,
    /// False: the body is a [`FrameFailure`].
    pub ok: bool,
    pub id: u32,
    pub len: u32,
}

/// Why bytes are not a frame, or a body not the struct it should be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("not a Yutu KV frame (bad magic)")]
    Magic,
    #[error("frame version {0} is not supported (this side speaks {VERSION})")]
    Version(u8),
    #[error("unknown frame op {0}")]
    Op(u8),
    #[error("bad frame status {0}")]
    Status(u8),
    #[error("reserved frame bytes are not zero")]
    Reserved,
    #[error("a frame body of {0} bytes is more than the {MAX_BODY} allowed")]
    TooLarge(u32),
    #[error("malformed frame body: {0}")]
    Body(String),
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[..2].copy_from_slice(&MAGIC);
        h[2] = VERSION;
        h[3] = self.op.code();
        h[4] = u8::from(!self.ok);
        h[8..12].copy_from_slice(&self.id.to_le_bytes());
        h[12..16].copy_from_slice(&self.len.to_le_bytes());
        h
    }

    pub fn decode(h: &[u8; HEADER_LEN]) -> Result<Header, FrameError> {
        if h[..2] != MAGIC {
            return Err(FrameError::Magic);
        }
        if h[2] != VERSION {
            return Err(FrameError::Version(h[2]));
        }
        let op = FrameOp::from_code(h[3]).ok_or(FrameError::Op(h[3]))?;
        let ok = match h[4] {
            0 => true,
            1 => false,
            s => return Err(FrameError::Status(s)),
        };
        if h[5..8] != [0, 0, 0] {
            return Err(FrameError::Reserved);
        }
        let id = u32::from_le_bytes([h[8], h[9], h[10], h[11]]);
        let len = u32::from_le_bytes([h[12], h[13], h[14], h[15]]);
        if len > MAX_BODY {
            return Err(FrameError::TooLarge(len));
        }
        Ok(Header { op, ok, id, len })
    }
}

/// A whole frame (header and body) of `body`, an encoded value.
pub fn frame(op: FrameOp, ok: bool, id: u32, body: &[u8]) -> Result<Vec<u8>, FrameError> {
    let len = u32::try_from(body.len())
        .ok()
        .filter(|l| *l <= MAX_BODY)
        .ok_or(FrameError::TooLarge(u32::MAX))?;
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(&Header { op, ok, id, len }.encode());
    out.extend_from_slice(body);
    Ok(out)
}

/// A frame whose body is `value`, encoded in place after the header (no copy of the body).
pub fn encode_frame<T: Serialize + ?Sized>(
    op: FrameOp,
    ok: bool,
    id: u32,
    value: &T,
) -> Result<Vec<u8>, FrameError> {
    let mut out = vec![0u8; HEADER_LEN];
    rmp_serde::encode::write_named(&mut out, value).map_err(|e| FrameError::Body(e.to_string()))?;
    seal(&mut out, op, ok, id)?;
    Ok(out)
}

/// Writes the header of `frame`, whose first [`HEADER_LEN`] bytes are room for it and the
/// rest its body.
pub fn seal(frame: &mut [u8], op: FrameOp, ok: bool, id: u32) -> Result<(), FrameError> {
    let body = frame.len().saturating_sub(HEADER_LEN);
    let len = u32::try_from(body)
        .ok()
        .filter(|l| *l <= MAX_BODY)
        .ok_or(FrameError::TooLarge(
            u32::try_from(body).unwrap_or(u32::MAX),
        ))?;
    let head = Header { op, ok, id, len }.encode();
    frame
        .get_mut(..HEADER_LEN)
        .ok_or(FrameError::Body("no room for the header".into()))?
        .copy_from_slice(&head);
    Ok(())
}

/// A per-bucket call as a whole frame: `[bucket, request]` encoded after the header.
pub fn encode_call_frame<T: Serialize>(
    op: FrameOp,
    id: u32,
    bucket: &str,
    request: &T,
) -> Result<Vec<u8>, FrameError> {
    encode_frame(op, true, id, &(bucket, request))
}

/// A value as a body (MessagePack, fields by name).
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, FrameError> {
    rmp_serde::to_vec_named(value).map_err(|e| FrameError::Body(e.to_string()))
}

/// A per-bucket call's body: `[bucket, request]`.
pub fn encode_call<T: Serialize>(bucket: &str, request: &T) -> Result<Vec<u8>, FrameError> {
    encode(&(bucket, request))
}

/// A body as a value.
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, FrameError> {
    rmp_serde::from_slice(body).map_err(|e| FrameError::Body(e.to_string()))
}

/// A per-bucket call's body as its bucket and request.
pub fn decode_call<T: DeserializeOwned>(body: &[u8]) -> Result<(String, T), FrameError> {
    let (bucket, request) = split_call(body)?;
    Ok((bucket.to_string(), decode(request)?))
}

/// A per-bucket call's body as its bucket and the request's still encoded bytes: the bucket
/// is checked before the request is read.
pub fn split_call(body: &[u8]) -> Result<(&str, &[u8]), FrameError> {
    let malformed = |what: &str| FrameError::Body(format!("a call is [bucket, request]: {what}"));
    let mut rest = body;
    match rmp::decode::read_array_len(&mut rest) {
        Ok(2) => {}
        Ok(n) => return Err(malformed(&format!("an array of {n}"))),
        Err(e) => return Err(malformed(&e.to_string())),
    }
    rmp::decode::read_str_from_slice(rest).map_err(|e| malformed(&e.to_string()))
}

/// [`FrameOp::Hello`]: who calls. The token is what HTTP calls send as `Authorization:
/// Bearer`; `None` for an open node or an anonymous caller.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hello {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

/// The answer to [`Hello`]: the shard this connection reaches, of how many.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    pub shard: u32,
    pub shards: u32,
    /// The node takes [`crate::kv::KvOp::Publish`] (rooms). Absent (false) from an older
    /// node, whose clients then end puts with put-end.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub publish: bool,
}

/// [`FrameOp::Presence`]: the shard's presence table of the bucket
/// ([`crate::presence`]). Needs read and list permission on the whole bucket: the table
/// answers `exists` for every key, and its size tells how many keys there are.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PresenceRequest {}

/// The answer to a [`PresenceRequest`]. The table's memfd, sealed against writes, is handed
/// over on [`PresenceGrant::socket`]; map it read-only, [`PresenceGrant::bytes`] long.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PresenceGrant {
    /// The shard whose keys the table holds.
    pub shard: u32,
    /// Bytes of the table ([`crate::presence::bytes_for`] its capacity).
    pub bytes: u64,
    /// The table's hash key ([`crate::presence::fingerprint`]), 32 bytes.
    #[serde(with = "serde_bytes")]
    pub secret: Vec<u8>,
    /// Unix milliseconds after which the caller may no longer use the table (its token
    /// expires then; the node stops updating the table at the latest then). `None`: no
    /// token, no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_until_ms: Option<u64>,
    /// The abstract Unix socket that hands over the memfd, once, within
    /// [`PRESENCE_HANDOFF_TIMEOUT_MS`]: connect, send the nonce, receive one byte with the
    /// descriptor attached (`SCM_RIGHTS`). Check the socket's peer is the node's process.
    pub socket: String,
    /// 16 bytes that only this answer carries.
    #[serde(with = "serde_bytes")]
    pub nonce: Vec<u8>,
}

/// [`FrameOp::ArenaChallenge`]: no fields.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArenaChallengeRequest {}

/// Bytes of an arena challenge's nonce.
pub const ARENA_NONCE_LEN: usize = 32;

/// The answer to an [`ArenaChallengeRequest`]: [`ARENA_NONCE_LEN`] random bytes at `address`
/// in the node's process ([`FramesInfo::pid`]), fresh for this connection. Read them with
/// `process_vm_readv` and send them back in an [`ArenaViewRequest`]: the kernel lets a
/// process do that only where it may read and write all of the node's memory (ptrace access),
/// so the answer proves the caller gains nothing from a view of the arena that it does not
/// have already. One answer per challenge: a wrong one spends it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArenaChallenge {
    pub address: u64,
    pub len: u32,
}

/// [`FrameOp::ArenaView`]: the challenge's bytes, as read out of the node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArenaViewRequest {
    #[serde(with = "serde_bytes")]
    pub proof: Vec<u8>,
}

/// The answer to a proven [`ArenaViewRequest`]: the shard's arena memfd, handed over on
/// `socket` as a presence table's is (see [`PresenceGrant::socket`]). Map it shared, `len`
/// bytes; a descriptor of this shard's blocks (`get`) names `segment` of engine `node`, and
/// its offset and length are the block's place in the mapping. The caller copies only within
/// descriptors it holds, while it holds them (a lease): the node keeps no other watch on the
/// view. Yutu's client maps it read-only and copies gets out of it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArenaViewGrant {
    pub shard: u32,
    /// The node's transfer engine id (a descriptor's `node`).
    pub node: u64,
    /// The arena's segment id (a descriptor's `segment`).
    pub segment: u32,
    pub len: u64,
    pub socket: String,
    #[serde(with = "serde_bytes")]
    pub nonce: Vec<u8>,
}

/// How long a [`PresenceGrant`]'s socket waits for its caller.
pub const PRESENCE_HANDOFF_TIMEOUT_MS: u64 = 5_000;

/// [`FrameOp::Read`]: the values of 1 to [`crate::kv::MAX_BATCH`] keys.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadRequest {
    pub keys: Vec<String>,
    /// Largest value answered inline; a larger one is answered [`InlineValue::TooLarge`]
    /// with its size (a client that moves large values through registered memory asks for
    /// the size first). [`MAX_INLINE`] when absent. Only for a node whose
    /// [`FramesInfo::read_limit`] is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_max: Option<u64>,
}

/// The answer to a [`ReadRequest`], one value per key in order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadResponse {
    pub values: Vec<InlineValue>,
}

/// One key of a [`ReadResponse`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum InlineValue {
    /// No such key.
    Missing,
    /// The whole value.
    Bytes(#[serde(with = "serde_bytes")] Vec<u8>),
    /// Stored, but this many bytes would take the answer past [`MAX_INLINE`].
    TooLarge(u64),
}

/// [`FrameOp::Write`]: blocks stored whole from the bytes in the call, as put-from stores
/// them (published at once, visible to KV and S3 calls alike).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriteRequest {
    /// 1 to [`crate::kv::MAX_BATCH`] blocks; their bytes within [`MAX_BODY`].
    pub blocks: Vec<InlineBlock>,
    /// Store only the blocks whose key is absent; the others are left as they are and
    /// answer an empty ETag (put-from's `if_absent`, Mooncake's `put`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub if_absent: bool,
}

/// One block of a [`WriteRequest`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InlineBlock {
    pub key: String,
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
}

/// An error answer: what the JSON API would answer, status and S3 code included.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrameFailure {
    /// The HTTP status the same call would get.
    pub status: u16,
    /// The S3 error code (`NoSuchBucket`, `AccessDenied`, ...).
    pub code: String,
    pub message: String,
}

/// Where a node takes frames: per shard, in shard order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FramesInfo {
    /// [`VERSION`] of the node.
    pub version: u8,
    /// The node's process id: a Unix client checks that its socket's peer is this process.
    pub pid: u32,
    /// Abstract Unix socket names (without the leading NUL), one per shard.
    pub unix: Vec<String>,
    /// TCP ports on the node's HTTP address, one per shard; empty on a node with TLS (frames
    /// are not encrypted, so they do not cross hosts in the clear where HTTP does not).
    pub tcp: Vec<u16>,
    /// The node takes [`ReadRequest::value_max`]. Absent (false) from older nodes, which
    /// refuse the field: a client sends it only to a node that says so.
    #[serde(default)]
    pub read_limit: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_welcome_says_publish_only_when_the_node_takes_it() {
        // What a node from before publish sends.
        #[derive(Serialize)]
        struct Older {
            shard: u32,
            shards: u32,
        }
        let old: Welcome = decode(
            &encode(&Older {
                shard: 0,
                shards: 2,
            })
            .unwrap(),
        )
        .unwrap();
        assert_eq!((old.shard, old.shards, old.publish), (0, 2, false));
        let new = Welcome {
            shard: 1,
            shards: 2,
            publish: true,
        };
        assert_eq!(decode::<Welcome>(&encode(&new).unwrap()).unwrap(), new);
    }
    use crate::kv::{ExistsResponse, KeysRequest};

    /// A node older than the read limit says nothing of it: its frames info reads as not
    /// taking `value_max` (the client then never sends the field, which such a node refuses),
    /// and a read without a limit is encoded as it always was.
    #[test]
    fn an_older_nodes_frames_info_takes_no_read_limit() {
        let old: FramesInfo =
            serde_json::from_str(r#"{"version":1,"pid":5,"unix":["a"],"tcp":[]}"#).unwrap();
        assert!(!old.read_limit);
        let plain = ReadRequest {
            keys: vec!["k".into()],
            value_max: None,
        };
        assert_eq!(serde_json::to_string(&plain).unwrap(), r#"{"keys":["k"]}"#);
    }

    #[test]
    fn every_op_has_its_own_code() {
        let mut ops = vec![
            FrameOp::Hello,
            FrameOp::Release,
            FrameOp::Read,
            FrameOp::Write,
            FrameOp::Presence,
            FrameOp::ArenaChallenge,
            FrameOp::ArenaView,
        ];
        ops.extend(KvOp::ALL.iter().map(|o| FrameOp::Kv(*o)));
        let mut codes: Vec<u8> = ops.iter().map(|o| o.code()).collect();
        for op in &ops {
            assert_eq!(FrameOp::from_code(op.code()), Some(*op));
        }
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), ops.len());
        assert_eq!(FrameOp::from_code(0), None);
        assert_eq!(FrameOp::from_code(255), None);
    }

    #[test]
    fn a_header_is_read_back_and_bad_ones_are_refused() {
        let h = Header {
            op: FrameOp::Kv(KvOp::Exists),
            ok: false,
            id: 0xdead_beef,
            len: 77,
        };
        assert_eq!(Header::decode(&h.encode()), Ok(h));
        let mut bad = h.encode();
        bad[0] = b'X';
        assert_eq!(Header::decode(&bad), Err(FrameError::Magic));
        let mut bad = h.encode();
        bad[2] = 9;
        assert_eq!(Header::decode(&bad), Err(FrameError::Version(9)));
        let mut bad = h.encode();
        bad[4] = 2;
        assert_eq!(Header::decode(&bad), Err(FrameError::Status(2)));
        let mut bad = h.encode();
        bad[6] = 1;
        assert_eq!(Header::decode(&bad), Err(FrameError::Reserved));
        let mut bad = h.encode();
        bad[12..16].copy_from_slice(&(MAX_BODY + 1).to_le_bytes());
        assert_eq!(
            Header::decode(&bad),
            Err(FrameError::TooLarge(MAX_BODY + 1))
        );
    }

    #[test]
    fn a_frame_encoded_in_place_is_the_same_frame() {
        let req = KeysRequest {
            keys: vec!["k".into()],
            ttl_ms: Some(5),
        };
        let op = FrameOp::Kv(KvOp::Get);
        let whole = encode_call_frame(op, 3, "b", &req).unwrap();
        assert_eq!(
            whole,
            frame(op, true, 3, &encode_call("b", &req).unwrap()).unwrap()
        );
        let mut short = vec![0u8; 3];
        assert!(seal(&mut short, op, true, 1).is_err());
    }

    #[test]
    fn bodies_are_the_json_api_structs() {
        let req = KeysRequest {
            keys: vec!["a".into(), "b/c".into()],
            ttl_ms: None,
        };
        let body = encode_call("bkt", &req).unwrap();
        let (bucket, back): (String, KeysRequest) = decode_call(&body).unwrap();
        assert_eq!((bucket.as_str(), &back), ("bkt", &req));
        // Unknown fields are refused in requests, as in JSON.
        let odd = encode(&("bkt", serde_json::json!({"keys": ["a"], "tll_ms": 5}))).unwrap();
        assert!(decode_call::<KeysRequest>(&odd).is_err());
        let answer = ExistsResponse {
            exists: vec![true, false],
        };
        assert_eq!(
            decode::<ExistsResponse>(&encode(&answer).unwrap()).unwrap(),
            answer
        );
        let values = ReadResponse {
            values: vec![
                InlineValue::Missing,
                InlineValue::Bytes(vec![1, 2, 3]),
                InlineValue::TooLarge(9),
            ],
        };
        let raw = encode(&values).unwrap();
        assert_eq!(decode::<ReadResponse>(&raw).unwrap(), values);
        assert!(decode::<ReadResponse>(&raw[..raw.len() - 1]).is_err());
        // A call body that is not `[bucket, request]`.
        assert!(split_call(&encode(&("bkt",)).unwrap()).is_err());
        assert!(split_call(&encode(&(7, req.clone())).unwrap()).is_err());
        assert!(split_call(&[]).is_err());
    }
}
