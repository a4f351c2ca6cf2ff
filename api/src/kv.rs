//! The storage node's KV control API (`/v1/kv/...`): the JSON bodies of every call, as both
//! the node and the clients read and write them.
//!
//! The control plane is JSON over HTTP; the block bytes never travel in it. They move
//! one-sidedly through the transfer engines, addressed by [`SegmentDescriptor`]s (a range of
//! registered memory and the token that grants it) on engines reached through their
//! [`NodeAddress`].
//!
//! | call | request | answer |
//! |---|---|---|
//! | `GET` [`ENGINE_PATH`] | | [`NodeAddress`] of the node's engine (add it as a peer) |
//! | `POST` [`PEERS_PATH`] | [`PeerRequest`] | [`PeerResponse`]: a session for get-into and put-from |
//! | `DELETE` [`PEERS_PATH`]`/{session}` | | 204: the session is over |
//! | `POST /v1/kv/{bucket}/exists` | [`KeysRequest`] | [`ExistsResponse`] |
//! | `POST /v1/kv/{bucket}/prefix` | [`KeysRequest`] (a chain, in order) | [`PrefixResponse`] |
//! | `POST /v1/kv/{bucket}/put-start` | [`PutStartRequest`] | [`PutStartResponse`] |
//! | `POST /v1/kv/{bucket}/put-end` | [`PutIdsRequest`] | [`EtagsResponse`] |
//! | `POST /v1/kv/{bucket}/revoke` | [`PutIdsRequest`] | [`RevokeResponse`] |
//! | `POST /v1/kv/{bucket}/publish` | [`PublishRequest`] | [`PublishResponse`] |
//! | `POST /v1/kv/{bucket}/get` | [`KeysRequest`] (with `ttl_ms`) | [`GetResponse`] |
//! | `POST /v1/kv/{bucket}/get-into` | [`GetIntoRequest`] | [`CopiedResponse`] |
//! | `POST /v1/kv/{bucket}/put-from` | [`PutFromRequest`] | [`EtagsResponse`] |
//! | `POST /v1/kv/{bucket}/remove` | [`KeysRequest`] | [`RemoveResponse`] |
//! | `POST` [`RELEASE_PATH`] | [`ReleaseRequest`] | [`ReleaseResponse`] |
//!
//! Answers are in request order: the `i`-th entry of every list in an answer is about the
//! `i`-th key, block or id of the request. The one exception is a get that names a key more
//! than once: its blocks are listed once each and [`GetResponse::positions`] maps the request
//! onto them (see [`GetResponse::block`]).
//!
//! Requests refuse unknown fields (a typo is an error, not a silently ignored option);
//! answers accept them, so a newer node may add fields without breaking older clients.
//!
//! A lease (get) keeps the leased bytes from being evicted or reused until it is released or
//! its time is up ([`DEFAULT_TTL_MS`] unless asked, at most [`MAX_TTL_MS`]); the client must
//! not read after that. A started put holds its reserved range for the same kind of time.
//!
//! The admin API's KV snapshot (`GET` [`crate::events::SNAPSHOT_PATH`]) answers a
//! [`crate::events::KvSnapshot`].

use std::fmt;

use serde::{Deserialize, Serialize};

pub use crate::descriptor::{NodeAddress, SegmentDescriptor};

/// Every KV endpoint is under this path.
pub const KV_ROOT: &str = "/v1/kv";

/// `GET`: the node's transfer engine address, a [`NodeAddress`].
pub const ENGINE_PATH: &str = "/v1/kv/engine";

/// `POST` a [`PeerRequest`]: register the client's transfer engine, which the node then
/// reaches for get-into and put-from under the session it answers. `DELETE
/// {PEERS_PATH}/{session}` ends one.
///
/// The node never reaches an address a client names without proof: before it answers, it
/// challenges each path of the address (tcp, shm) and keeps only those whose listener answers
/// with the secret of the request, which the client has given its own engine (its
/// `TransferEngine::trust`). A session belongs to the user who registered it, and a node id
/// belongs to one live session at a time.
pub const PEERS_PATH: &str = "/v1/kv/peers";

/// Every answer of a node names the shard that served the connection and the node's shard
/// count, as `SHARD/SHARDS` (e.g. `1/4`). A client that keeps one connection per shard sends a
/// call whose keys one shard owns ([`crate::placement::shard_for`]) on that shard's
/// connection, which spares the call a hop between shards (on a 2-vCPU VM, about half of a
/// single-key call's time).
pub const SHARD_HEADER: &str = "x-yutu-shard";

/// Parses a [`SHARD_HEADER`] value into (shard, shards).
pub fn parse_shard_header(value: &str) -> Option<(usize, usize)> {
    let (shard, shards) = value.split_once('/')?;
    let (shard, shards) = (shard.parse().ok()?, shards.parse().ok()?);
    (shard < shards).then_some((shard, shards))
}

/// `POST` a [`ReleaseRequest`]: give leases back early. Not per bucket.
pub const RELEASE_PATH: &str = "/v1/kv/release";

/// Most keys (or put ids) in one batch.
pub const MAX_BATCH: usize = 4096;

/// Lifetime of a lease or a started put when the request names none.
pub const DEFAULT_TTL_MS: u64 = 10_000;

/// Longest lifetime a request may ask for; `ttl_ms` must be between 1 and this.
pub const MAX_TTL_MS: u64 = 60_000;

/// Largest request document the node reads (4096 keys and descriptors fit).
pub const MAX_REQUEST_BYTES: u64 = 4 << 20;

/// Most spans one get-into or put-from may name when its blocks are scattered or gathered
/// (`parts`): a layer-first engine names one span per layer and block.
pub const MAX_SPANS: usize = 65_536;

/// A per-bucket KV call: `POST /v1/kv/{bucket}/{op}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvOp {
    /// [`KeysRequest`] → [`ExistsResponse`]: whether each key is stored, in any tier.
    Exists,
    /// [`KeysRequest`] → [`PrefixResponse`]: how many leading keys of a chain are stored.
    Prefix,
    /// [`PutStartRequest`] → [`PutStartResponse`]: reserve a range per block in the node's
    /// arena and get a descriptor to write it through (first half of a two-phase put).
    PutStart,
    /// [`PutIdsRequest`] → [`EtagsResponse`]: publish started puts (second half).
    PutEnd,
    /// [`PutIdsRequest`] → [`RevokeResponse`]: abandon started puts.
    Revoke,
    /// [`KeysRequest`] → [`GetResponse`]: lease the blocks and get descriptors to read them.
    Get,
    /// [`GetIntoRequest`] → [`CopiedResponse`]: the node writes the blocks into the client's
    /// registered memory.
    GetInto,
    /// [`PutFromRequest`] → [`EtagsResponse`]: the node reads the blocks out of the client's
    /// registered memory and publishes them.
    PutFrom,
    /// [`KeysRequest`] → [`RemoveResponse`]: delete the keys.
    Remove,
    /// [`PublishRequest`] → [`PublishResponse`]: publish started puts and rooms, each under
    /// the key it names, and reserve rooms for later puts (a put through a room is one call).
    Publish,
}

impl KvOp {
    /// Every per-bucket call.
    pub const ALL: [KvOp; 10] = [
        KvOp::Exists,
        KvOp::Prefix,
        KvOp::PutStart,
        KvOp::PutEnd,
        KvOp::Revoke,
        KvOp::Get,
        KvOp::GetInto,
        KvOp::PutFrom,
        KvOp::Remove,
        KvOp::Publish,
    ];

    /// The last path segment.
    pub fn as_str(self) -> &'static str {
        match self {
            KvOp::Exists => "exists",
            KvOp::Prefix => "prefix",
            KvOp::PutStart => "put-start",
            KvOp::PutEnd => "put-end",
            KvOp::Revoke => "revoke",
            KvOp::Get => "get",
            KvOp::GetInto => "get-into",
            KvOp::PutFrom => "put-from",
            KvOp::Remove => "remove",
            KvOp::Publish => "publish",
        }
    }

    /// The call named by a path segment.
    pub fn from_name(name: &str) -> Option<KvOp> {
        KvOp::ALL.into_iter().find(|op| op.as_str() == name)
    }

    /// True for the calls that only read the bucket (exists, prefix, get, get-into); the
    /// others change it and need write permission.
    pub fn is_read(self) -> bool {
        matches!(
            self,
            KvOp::Exists | KvOp::Prefix | KvOp::Get | KvOp::GetInto
        )
    }

    /// `/v1/kv/{bucket}/{op}`. The bucket goes in as given: valid bucket names need no
    /// escaping, and a caller that accepts arbitrary input must escape it first.
    pub fn path(self, bucket: &str) -> String {
        format!("{KV_ROOT}/{bucket}/{}", self.as_str())
    }
}

impl fmt::Display for KvOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

// ---------------------------------------------------------------------------------------------
// Requests.

/// A batch of keys: the request of exists, prefix, get and remove.
///
/// `ttl_ms` is the lease lifetime asked by get; exists, prefix and remove accept and ignore it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeysRequest {
    /// 1 to [`MAX_BATCH`] object keys.
    pub keys: Vec<String>,
    /// Lease lifetime in milliseconds (get): 1 to [`MAX_TTL_MS`]; [`DEFAULT_TTL_MS`] when
    /// absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
}

/// put-start: reserve one range per block.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PutStartRequest {
    /// 1 to [`MAX_BATCH`] blocks.
    pub blocks: Vec<PutStartBlock>,
    /// How long the reserved ranges wait for put-end, in milliseconds: 1 to [`MAX_TTL_MS`];
    /// [`DEFAULT_TTL_MS`] when absent. A put not ended by then is revoked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
}

/// One block of a [`PutStartRequest`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PutStartBlock {
    pub key: String,
    /// The block's exact length in bytes.
    pub len: u64,
}

/// put-end or revoke: the put ids put-start answered.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PutIdsRequest {
    pub put_ids: Vec<u64>,
}

/// Most rooms one publish may ask for.
pub const MAX_ROOMS: usize = 64;

/// publish: ends puts, each under a key, and reserves rooms for later puts.
///
/// A room is a put started without a key: a reserved range of the serving shard's arena
/// ([`Room`]), written like a started put's and published by a later publish that names its
/// key, which that shard must own ([`crate::placement::shard_for`]). So a client that keeps a
/// few rooms makes a put in one call (write into a room, then publish it and ask for the next
/// room) where put-start and put-end are two. A room counts against the caller's unfinished
/// puts and the bucket's quota like a started put, and is revoked at the end of its ttl.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublishRequest {
    /// 0 to [`MAX_BATCH`] puts to publish: rooms, and puts of put-start (whose key must be
    /// the one they started with).
    #[serde(default)]
    pub puts: Vec<PublishPut>,
    /// The lengths of new rooms to reserve on the serving shard, 0 to [`MAX_ROOMS`] of them.
    /// A request names at least one put or room.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rooms: Vec<u64>,
    /// How long the new rooms wait to be published, in milliseconds: 1 to [`MAX_TTL_MS`];
    /// [`DEFAULT_TTL_MS`] when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
}

/// One put of a [`PublishRequest`]: its id and the key it is stored under.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublishPut {
    pub put_id: u64,
    pub key: String,
}

/// release: the lease ids get answered.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseRequest {
    pub leases: Vec<u64>,
}

/// get-into: the node writes each key's block into the client's registered memory.
///
/// The memory is named in one of two forms: `targets`, a descriptor per key (the block goes
/// at its start and must fit in it), or `buffer` and `ranges`, one descriptor and an
/// `[offset, room]` range of it per key. Either way every descriptor must name memory of
/// the session's engine, and the node refuses a mix of the forms ([`GetIntoRequest::targets`]
/// answers `None` for one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GetIntoRequest<K = String> {
    /// 1 to [`MAX_BATCH`] keys.
    pub keys: Vec<K>,
    /// One descriptor per key...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub targets: Option<Vec<SegmentDescriptor>>,
    /// ...or one for a buffer...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffer: Option<SegmentDescriptor>,
    /// ...and an `[offset, room]` range in it per key (offsets relative to `buffer`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ranges: Option<Vec<(u64, u64)>>,
    /// The client's engine, as registered at [`PEERS_PATH`]; it owns the memory.
    pub session: String,
    /// Scatter: key `i`'s block fills the next `parts[i]` targets (or ranges) in order, its
    /// first bytes the first one; the room for it is their sum. Absent: one each. At most
    /// [`MAX_SPANS`] targets in all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parts: Option<Vec<u32>>,
}

/// Where a [`GetIntoRequest`] wants its blocks, once the form is known to be consistent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GetIntoTargets<'a> {
    /// A descriptor per key.
    PerKey(&'a [SegmentDescriptor]),
    /// One buffer and an `[offset, room]` range of it per key.
    Buffer {
        buffer: &'a SegmentDescriptor,
        ranges: &'a [(u64, u64)],
    },
}

/// The request types are generic over the key type so that a client serializes a request
/// from keys it borrows (`&str`: the same bytes on the wire as `String`) instead of copying
/// every key of a batch; the node decodes the owned form (the default, `String`).
impl<K> GetIntoRequest<K> {
    /// The per-key descriptor form.
    pub fn per_key(
        keys: Vec<K>,
        targets: Vec<SegmentDescriptor>,
        session: String,
    ) -> GetIntoRequest<K> {
        GetIntoRequest {
            keys,
            targets: Some(targets),
            buffer: None,
            ranges: None,
            session,
            parts: None,
        }
    }

    /// The buffer-and-ranges form.
    pub fn into_buffer(
        keys: Vec<K>,
        buffer: SegmentDescriptor,
        ranges: Vec<(u64, u64)>,
        session: String,
    ) -> GetIntoRequest<K> {
        GetIntoRequest {
            keys,
            targets: None,
            buffer: Some(buffer),
            ranges: Some(ranges),
            session,
            parts: None,
        }
    }

    /// The form used: `targets` alone, or `buffer` with `ranges`; `None` for anything else.
    /// (The number of targets is not checked against the keys.)
    pub fn targets(&self) -> Option<GetIntoTargets<'_>> {
        match (&self.targets, &self.buffer, &self.ranges) {
            (Some(t), None, None) => Some(GetIntoTargets::PerKey(t)),
            (None, Some(buffer), Some(ranges)) => Some(GetIntoTargets::Buffer { buffer, ranges }),
            _ => None,
        }
    }

    /// The request for the keys at `idx` alone, in that order, each with its targets or
    /// ranges: what a client sends each shard when it splits a batch by owner. `None` when
    /// the form is inconsistent or an index is out of range (the node would refuse the
    /// request whole).
    pub fn subset(&self, idx: &[usize]) -> Option<GetIntoRequest<K>>
    where
        K: Clone,
    {
        let spans = match self.targets()? {
            GetIntoTargets::PerKey(t) => t.len(),
            GetIntoTargets::Buffer { ranges, .. } => ranges.len(),
        };
        let groups = part_ranges(self.parts.as_deref(), spans).ok()?;
        if groups.len() != self.keys.len() {
            return None;
        }
        let picked = idx
            .iter()
            .map(|&i| groups.get(i).cloned())
            .collect::<Option<Vec<_>>>()?;
        Some(GetIntoRequest {
            keys: idx.iter().map(|&i| self.keys[i].clone()).collect(),
            targets: self.targets.as_deref().map(|t| pick_groups(t, &picked)),
            buffer: self.buffer,
            ranges: self.ranges.as_deref().map(|r| pick_groups(r, &picked)),
            session: self.session.clone(),
            parts: self
                .parts
                .as_ref()
                .map(|_| picked.iter().map(|r| r.len() as u32).collect()),
        })
    }
}

/// put-from: the node reads each block out of the client's registered buffer, stores and
/// publishes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PutFromRequest<K = String> {
    /// 1 to [`MAX_BATCH`] blocks.
    pub blocks: Vec<PutFromBlock<K>>,
    /// The client's buffer; each block is `[offset, offset + len)` of it.
    pub buffer: SegmentDescriptor,
    /// The client's engine, as registered at [`PEERS_PATH`]; it owns the buffer.
    pub session: String,
    /// Store only the blocks whose key is absent; a present key keeps its bytes and answers
    /// an empty ETag. Mooncake's `put` has these semantics (`upsert` is the plain put): with
    /// chained block hashes as keys, a present key already holds the same bytes, and leaving
    /// it saves the copy. Checked when the batch arrives; two puts of one new key racing each
    /// other may both store it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub if_absent: bool,
    /// Pin the blocks on the node that stores them (Mooncake's `ReplicateConfig` pins): a
    /// hard pin keeps them in DRAM until unpinned (`yutu admin unpin`), a soft pin lets them
    /// be evicted only when nothing else can be, for its TTL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pin: Option<BlockPin>,
    /// Gather: the `i`th block stored is the concatenation of the next `parts[i]` entries of
    /// `blocks`, in order, which must all name its key. Absent: one entry per block. At most
    /// [`MAX_SPANS`] entries in all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parts: Option<Vec<u32>>,
}

impl<K: Clone> PutFromRequest<K> {
    /// The request for the blocks at `idx` alone (block `i` being the `i`th group of
    /// entries, see [`PutFromRequest::parts`]), in that order: what a client sends each
    /// shard when it splits a batch by owner. `None` when the parts do not fit the entries
    /// or an index is out of range.
    pub fn subset(&self, idx: &[usize]) -> Option<PutFromRequest<K>> {
        let groups = part_ranges(self.parts.as_deref(), self.blocks.len()).ok()?;
        let picked = idx
            .iter()
            .map(|&i| groups.get(i).cloned())
            .collect::<Option<Vec<_>>>()?;
        Some(PutFromRequest {
            blocks: pick_groups(&self.blocks, &picked),
            buffer: self.buffer,
            session: self.session.clone(),
            if_absent: self.if_absent,
            pin: self.pin,
            parts: self
                .parts
                .as_ref()
                .map(|_| picked.iter().map(|r| r.len() as u32).collect()),
        })
    }
}

/// The entries of `v` in the index ranges `groups`, one group after another.
fn pick_groups<T: Clone>(v: &[T], groups: &[std::ops::Range<usize>]) -> Vec<T> {
    groups
        .iter()
        .flat_map(|r| v[r.clone()].iter().cloned())
        .collect()
}

/// Groups `n` entries by `parts` (see [`GetIntoRequest::parts`]): the index range of each
/// group, or why the counts do not fit (a zero count, a sum other than `n`, too many spans).
pub fn part_ranges(parts: Option<&[u32]>, n: usize) -> Result<Vec<std::ops::Range<usize>>, String> {
    let Some(parts) = parts else {
        return Ok((0..n).map(|i| i..i + 1).collect());
    };
    if n > MAX_SPANS {
        return Err(format!("{n} spans; at most {MAX_SPANS} in one call"));
    }
    let mut out = Vec::with_capacity(parts.len());
    let mut at = 0usize;
    for (i, &p) in parts.iter().enumerate() {
        if p == 0 {
            return Err(format!("parts[{i}] is 0; a block has at least one span"));
        }
        let end = at.saturating_add(p as usize);
        if end > n {
            return Err(format!("parts add up to more than the {n} spans given"));
        }
        out.push(at..end);
        at = end;
    }
    if at != n {
        return Err(format!("parts add up to {at}, but {n} spans are given"));
    }
    Ok(out)
}

/// How put blocks are pinned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BlockPin {
    /// Seconds of a soft pin (1 to [`MAX_SOFT_PIN_SECS`]); absent: a hard pin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soft_ttl_secs: Option<u64>,
}

/// The longest soft pin a put may ask for (30 days).
pub const MAX_SOFT_PIN_SECS: u64 = 30 * 24 * 3600;

/// Registers the client's transfer engine ([`PEERS_PATH`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerRequest {
    /// The client engine's address (`TransferEngine::address`).
    pub client: NodeAddress,
    /// 32 random bytes, 64 hex digits, that the client's engine answers the node's challenges
    /// with (`TransferEngine::trust(node, secret)` before this call).
    pub secret: PeerSecret,
}

/// A session secret: 32 bytes, written as 64 hex digits. Its `Debug` hides it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PeerSecret(pub [u8; 32]);

impl fmt::Debug for PeerSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PeerSecret(…)")
    }
}

impl Serialize for PeerSecret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&hex::encode(self.0))
    }
}

impl<'de> Deserialize<'de> for PeerSecret {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<PeerSecret, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        let mut out = [0u8; 32];
        hex::decode_to_slice(text.as_ref(), &mut out)
            .map_err(|_| serde::de::Error::custom("a peer secret is 64 hex digits"))?;
        Ok(PeerSecret(out))
    }
}

/// The answer to a [`PeerRequest`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerResponse {
    /// Names the registration in get-into and put-from.
    pub session: String,
    /// The paths of the client's address that proved to be the client's (`tcp`, `shm`); the
    /// node uses only these.
    pub paths: Vec<String>,
}

/// One block of a [`PutFromRequest`]: `{"key", "offset", "len"}` in JSON, and in the
/// binary encoding of frames the array `[key, offset, len]` (either form is read in both):
/// a batch of 4 KiB blocks otherwise spends a good part of its encoding and decoding on the
/// three field names of every block.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PutFromBlock<K = String> {
    pub key: K,
    /// Where the block starts in the buffer.
    pub offset: u64,
    /// The block's length in bytes.
    pub len: u64,
}

impl<K: Serialize> Serialize for PutFromBlock<K> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            use serde::ser::SerializeStruct;
            let mut block = s.serialize_struct("PutFromBlock", 3)?;
            block.serialize_field("key", &self.key)?;
            block.serialize_field("offset", &self.offset)?;
            block.serialize_field("len", &self.len)?;
            block.end()
        } else {
            (&self.key, self.offset, self.len).serialize(s)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Answers. Unknown fields are accepted: a newer node may add some.

/// exists: per key, whether it is stored (in any tier).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExistsResponse {
    pub exists: Vec<bool>,
}

/// prefix: how many leading keys of the chain are stored (the usable cached prefix).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrefixResponse {
    pub present: u64,
}

/// put-start: a put per block, in request order, and the lifetime granted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PutStartResponse {
    pub puts: Vec<StartedPut>,
    /// Milliseconds the puts wait for put-end.
    pub ttl_ms: u64,
}

/// One reserved block: write its bytes through `descriptor`, then name `put_id` in put-end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartedPut {
    pub key: String,
    pub put_id: u64,
    /// The reserved range in the node's arena (exactly the block's length).
    pub descriptor: SegmentDescriptor,
}

/// put-end and put-from: the stored blocks' ETags, in request order. The blocks are
/// published: visible through KV and S3 calls alike.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EtagsResponse {
    pub etags: Vec<String>,
}

/// publish: the published blocks' ETags, in request order, and the rooms reserved.
///
/// The rooms are as many as the shard could reserve, at most as many as asked and in the
/// order asked: a room refused (the caller's limit on unfinished puts, the bucket's quota, a
/// full arena) ends the list without failing the call, since the puts are published.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishResponse {
    pub etags: Vec<String>,
    #[serde(default)]
    pub rooms: Vec<Room>,
    /// Milliseconds the rooms wait to be published.
    #[serde(default)]
    pub ttl_ms: u64,
}

/// A reserved range with no key yet: write a block of exactly `descriptor.len` bytes through
/// it, then publish `put_id` under a key the room's shard owns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Room {
    pub put_id: u64,
    pub descriptor: SegmentDescriptor,
}

/// revoke: per put id, whether a pending put was abandoned (false when it had already ended,
/// been revoked or expired).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevokeResponse {
    pub revoked: Vec<bool>,
}

/// get: the leases taken (release them when done), a block per distinct key, and the
/// lifetime granted.
///
/// A key named several times in one request is one lease of one block, answered once: an
/// answer repeating its descriptor would cost the node (and the network) a full descriptor per
/// repetition, which is how one call of one key named [`MAX_BATCH`] times used to make a
/// megabyte of JSON.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetResponse {
    /// Lease ids for [`ReleaseRequest`]; one per shard involved, not per key.
    pub leases: Vec<u64>,
    /// One per distinct key, in the order of their first appearance in the request.
    pub blocks: Vec<LeasedBlock>,
    /// Present only when the request named a key more than once: the `i`-th requested key is
    /// `blocks[positions[i]]`. Absent, `blocks[i]` is the `i`-th key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub positions: Option<Vec<u32>>,
    /// Milliseconds the leases last.
    pub ttl_ms: u64,
}

impl GetResponse {
    /// The block of the `i`-th requested key, whether or not keys were repeated; `None` past
    /// the request's end or when `positions` points outside `blocks` (a malformed answer).
    pub fn block(&self, i: usize) -> Option<&LeasedBlock> {
        match &self.positions {
            Some(p) => self.blocks.get(*p.get(i)? as usize),
            None => self.blocks.get(i),
        }
    }

    /// How many keys the request named.
    pub fn requested(&self) -> usize {
        self.positions
            .as_ref()
            .map_or(self.blocks.len(), |p| p.len())
    }
}

/// One key of a [`GetResponse`].
///
/// `descriptor` (and `etag`) are null when the block is not in the node's DRAM tier (absent,
/// or only on a slower tier); `len` is 0 then.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeasedBlock {
    pub key: String,
    /// The leased bytes, readable until the lease ends.
    pub descriptor: Option<SegmentDescriptor>,
    pub len: u64,
    pub etag: Option<String>,
}

/// get-into: per key, the bytes written into the client's memory, or null where the key is
/// absent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopiedResponse {
    pub copied: Vec<Option<u64>>,
}

/// remove: per key, whether it was there.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoveResponse {
    pub removed: Vec<bool>,
}

/// release: how many of the leases were still held (and are now released).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseResponse {
    pub released: u64,
}

#[cfg(test)]
mod tests {
    use serde::de::DeserializeOwned;
    use serde_json::{json, Value};

    use super::*;
    use crate::descriptor::{Access, AccessToken, GrantId, NodeId, SegmentId};

    fn desc(offset: u64, len: u64) -> SegmentDescriptor {
        SegmentDescriptor {
            node: NodeId(0xfedc_ba98_7654_3210),
            segment: SegmentId(7),
            offset,
            len,
            access: Access::ReadWrite,
            grant: GrantId::NONE,
            token: AccessToken([0xab; 16]),
        }
    }

    const DESC_JSON: &str = r#"{"node":"fedcba9876543210","segment":7,"offset":4096,"len":2097152,"access":"read-write","grant":"0000000000000000","token":"abababababababababababababababab"}"#;

    fn client() -> NodeAddress {
        NodeAddress {
            node: NodeId(42),
            incarnation: u64::MAX,
            host: "b00t".into(),
            shm: None,
            tcp: Some("127.0.0.1:7000".parse().unwrap()),
            rdma: None,
        }
    }

    const CLIENT_JSON: &str = r#"{"node":"000000000000002a","incarnation":"ffffffffffffffff","host":"b00t","tcp":"127.0.0.1:7000"}"#;

    /// Serializes to exactly `want`, and `want` deserializes back to the value.
    fn exact<T>(value: &T, want: &str)
    where
        T: Serialize + DeserializeOwned + PartialEq + fmt::Debug,
    {
        assert_eq!(serde_json::to_string(value).unwrap(), want);
        assert_eq!(&serde_json::from_str::<T>(want).unwrap(), value);
    }

    /// Serializes and deserializes back to an equal value.
    fn round_trip<T>(value: &T)
    where
        T: Serialize + DeserializeOwned + PartialEq + fmt::Debug,
    {
        let json = serde_json::to_string(value).unwrap();
        assert_eq!(&serde_json::from_str::<T>(&json).unwrap(), value, "{json}");
    }

    /// A batch split by owner: each part keeps its keys' own spans, in the order asked, with
    /// the flags of the whole; indices out of range or parts that do not fit give `None`.
    #[test]
    fn a_request_split_by_owner_keeps_each_keys_spans() {
        let keys: Vec<String> = ["a", "b", "c"].iter().map(|k| k.to_string()).collect();
        let mut get = GetIntoRequest::into_buffer(
            keys.clone(),
            desc(0, 1 << 20),
            vec![(0, 1), (1, 2), (3, 3), (6, 4), (10, 5), (15, 6)],
            "s".into(),
        );
        get.parts = Some(vec![2, 1, 3]);
        let part = get.subset(&[2, 0]).unwrap();
        assert_eq!(part.keys, ["c", "a"]);
        assert_eq!(
            part.ranges.as_deref(),
            Some(&[(6, 4), (10, 5), (15, 6), (0, 1), (1, 2)][..])
        );
        assert_eq!(part.parts.as_deref(), Some(&[3, 2][..]));
        assert_eq!(part.buffer, get.buffer);
        assert!(get.subset(&[3]).is_none());
        get.parts = Some(vec![2, 1, 2]);
        assert!(get.subset(&[0]).is_none(), "parts that do not add up");
        let per_key = GetIntoRequest::per_key(
            keys.clone(),
            vec![desc(0, 1), desc(1, 1), desc(2, 1)],
            "s".into(),
        );
        let part = per_key.subset(&[1]).unwrap();
        assert_eq!(part.targets, Some(vec![desc(1, 1)]));
        assert_eq!(part.parts, None);

        let block = |key: &str, offset| PutFromBlock {
            key: key.to_string(),
            offset,
            len: 8,
        };
        let put = PutFromRequest {
            blocks: vec![block("a", 0), block("b", 8), block("b", 16), block("c", 24)],
            buffer: desc(0, 64),
            session: "s".into(),
            if_absent: true,
            pin: Some(BlockPin {
                soft_ttl_secs: None,
            }),
            parts: Some(vec![1, 2, 1]),
        };
        let part = put.subset(&[1, 2]).unwrap();
        assert_eq!(
            part.blocks,
            vec![block("b", 8), block("b", 16), block("c", 24)]
        );
        assert_eq!(part.parts, Some(vec![2, 1]));
        assert!(part.if_absent && part.pin == put.pin);
        assert!(put.subset(&[0, 3]).is_none());
    }

    #[test]
    fn paths() {
        assert_eq!(KvOp::GetInto.path("models"), "/v1/kv/models/get-into");
        for op in KvOp::ALL {
            assert_eq!(KvOp::from_name(op.as_str()), Some(op));
            assert_eq!(op.to_string(), op.as_str());
        }
        assert_eq!(KvOp::from_name("engine"), None);
        assert_eq!(KvOp::from_name("release"), None);
        let reads: Vec<&str> = KvOp::ALL
            .into_iter()
            .filter(|op| op.is_read())
            .map(KvOp::as_str)
            .collect();
        assert_eq!(reads, ["exists", "prefix", "get", "get-into"]);
        assert_eq!(ENGINE_PATH, format!("{KV_ROOT}/engine"));
        assert_eq!(RELEASE_PATH, format!("{KV_ROOT}/release"));
    }

    #[test]
    fn keys_request() {
        let plain = KeysRequest {
            keys: vec!["a".into(), "b".into()],
            ttl_ms: None,
        };
        exact(&plain, r#"{"keys":["a","b"]}"#);
        let leased = KeysRequest {
            ttl_ms: Some(500),
            ..plain.clone()
        };
        exact(&leased, r#"{"keys":["a","b"],"ttl_ms":500}"#);
        // An explicit null is the default, as the node has always read it.
        let null: KeysRequest =
            serde_json::from_str(r#"{"keys":["a","b"],"ttl_ms":null}"#).unwrap();
        assert_eq!(null, plain);
    }

    #[test]
    fn publish() {
        let req = PublishRequest {
            puts: vec![PublishPut {
                put_id: 9,
                key: "blk-1".into(),
            }],
            rooms: vec![1 << 20],
            ttl_ms: None,
        };
        exact(
            &req,
            r#"{"puts":[{"put_id":9,"key":"blk-1"}],"rooms":[1048576]}"#,
        );
        // Rooms alone; no rooms is no field.
        let rooms: PublishRequest = serde_json::from_str(r#"{"rooms":[4096]}"#).unwrap();
        assert!(rooms.puts.is_empty() && rooms.rooms == [4096]);
        exact(
            &PublishRequest {
                rooms: Vec::new(),
                ..req.clone()
            },
            r#"{"puts":[{"put_id":9,"key":"blk-1"}]}"#,
        );
        assert!(serde_json::from_str::<PublishRequest>(r#"{"rooms":[1],"room":[2]}"#).is_err());
        let resp = PublishResponse {
            etags: vec!["\"e\"".into()],
            rooms: vec![Room {
                put_id: 10,
                descriptor: desc(0, 1 << 20),
            }],
            ttl_ms: 5000,
        };
        round_trip(&resp);
        // An answer of a node that reserved no room may leave the list out.
        let bare: PublishResponse = serde_json::from_str(r#"{"etags":["x"]}"#).unwrap();
        assert!(bare.rooms.is_empty());
        assert_eq!(KvOp::from_name("publish"), Some(KvOp::Publish));
        assert!(!KvOp::Publish.is_read());
    }

    #[test]
    fn put_start() {
        let req = PutStartRequest {
            blocks: vec![PutStartBlock {
                key: "blk-0".into(),
                len: 8,
            }],
            ttl_ms: Some(2000),
        };
        exact(
            &req,
            r#"{"blocks":[{"key":"blk-0","len":8}],"ttl_ms":2000}"#,
        );
        // What the client has always sent (serde_json::json!, keys sorted) is the same text.
        let old = json!({"blocks": [json!({"key": "blk-0", "len": 8})], "ttl_ms": 2000});
        assert_eq!(
            serde_json::to_string(&old).unwrap(),
            serde_json::to_string(&req).unwrap()
        );
        round_trip(&PutStartRequest {
            ttl_ms: None,
            ..req
        });

        let resp = PutStartResponse {
            puts: vec![StartedPut {
                key: "blk-0".into(),
                put_id: 77,
                descriptor: desc(4096, 2 << 20),
            }],
            ttl_ms: 10_000,
        };
        exact(
            &resp,
            &format!(
                r#"{{"puts":[{{"key":"blk-0","put_id":77,"descriptor":{DESC_JSON}}}],"ttl_ms":10000}}"#
            ),
        );
    }

    #[test]
    fn put_ids_and_release() {
        exact(
            &PutIdsRequest {
                put_ids: vec![1, u64::MAX],
            },
            r#"{"put_ids":[1,18446744073709551615]}"#,
        );
        exact(
            &EtagsResponse {
                etags: vec!["\"abc\"".into()],
            },
            r#"{"etags":["\"abc\""]}"#,
        );
        exact(
            &RevokeResponse {
                revoked: vec![true, false],
            },
            r#"{"revoked":[true,false]}"#,
        );
        exact(
            &ReleaseRequest { leases: vec![3, 4] },
            r#"{"leases":[3,4]}"#,
        );
        exact(&ReleaseResponse { released: 2 }, r#"{"released":2}"#);
    }

    #[test]
    fn get() {
        let resp = GetResponse {
            leases: vec![9],
            blocks: vec![
                LeasedBlock {
                    key: "hot".into(),
                    descriptor: Some(desc(4096, 2 << 20)),
                    len: 2 << 20,
                    etag: Some("e".into()),
                },
                LeasedBlock {
                    key: "cold".into(),
                    descriptor: None,
                    len: 0,
                    etag: None,
                },
            ],
            positions: None,
            ttl_ms: 10_000,
        };
        // A missing block is written with explicit nulls.
        exact(
            &resp,
            &format!(
                r#"{{"leases":[9],"blocks":[{{"key":"hot","descriptor":{DESC_JSON},"len":2097152,"etag":"e"}},{{"key":"cold","descriptor":null,"len":0,"etag":null}}],"ttl_ms":10000}}"#
            ),
        );
        // ...and read as absent too.
        let b: LeasedBlock = serde_json::from_str(r#"{"key":"cold","len":0}"#).unwrap();
        assert_eq!(b, resp.blocks[1]);
        assert_eq!(resp.block(1), Some(&resp.blocks[1]));
        assert_eq!((resp.block(2), resp.requested()), (None, 2));

        // Repeated keys: hot, cold, hot, hot.
        let repeated = GetResponse {
            positions: Some(vec![0, 1, 0, 0]),
            ..resp.clone()
        };
        let text = serde_json::to_string(&repeated).unwrap();
        assert!(text.contains(r#""positions":[0,1,0,0]"#), "{text}");
        assert_eq!(
            serde_json::from_str::<GetResponse>(&text).unwrap(),
            repeated
        );
        assert_eq!(repeated.requested(), 4);
        assert_eq!(repeated.block(3), Some(&resp.blocks[0]));
        assert_eq!(repeated.block(4), None);
        let malformed = GetResponse {
            positions: Some(vec![7]),
            ..resp
        };
        assert_eq!(malformed.block(0), None);
    }

    #[test]
    fn get_into() {
        let req: GetIntoRequest = GetIntoRequest::into_buffer(
            vec!["a".into(), "b".into()],
            desc(4096, 2 << 20),
            vec![(0, 1024), (1024, 4096)],
            "s1".into(),
        );
        exact(
            &req,
            &format!(
                r#"{{"keys":["a","b"],"buffer":{DESC_JSON},"ranges":[[0,1024],[1024,4096]],"session":"s1"}}"#
            ),
        );
        assert!(matches!(
            req.targets(),
            Some(GetIntoTargets::Buffer { ranges, .. }) if ranges.len() == 2
        ));
        let per_key: GetIntoRequest =
            GetIntoRequest::per_key(vec!["a".into()], vec![desc(4096, 2 << 20)], "s1".into());
        exact(
            &per_key,
            &format!(r#"{{"keys":["a"],"targets":[{DESC_JSON}],"session":"s1"}}"#),
        );
        assert!(matches!(per_key.targets(), Some(GetIntoTargets::PerKey(t)) if t.len() == 1));
        let mixed = GetIntoRequest {
            buffer: Some(desc(0, 1)),
            ..per_key.clone()
        };
        round_trip(&mixed);
        assert_eq!(mixed.targets(), None);
        let ranges_only = GetIntoRequest {
            targets: None,
            ranges: Some(vec![(0, 1)]),
            ..per_key
        };
        assert_eq!(ranges_only.targets(), None);

        exact(
            &CopiedResponse {
                copied: vec![Some(8), None],
            },
            r#"{"copied":[8,null]}"#,
        );
    }

    #[test]
    fn peers() {
        let req = PeerRequest {
            client: client(),
            secret: PeerSecret([0x5a; 32]),
        };
        exact(
            &req,
            &format!(
                r#"{{"client":{CLIENT_JSON},"secret":"{}"}}"#,
                "5a".repeat(32)
            ),
        );
        assert!(
            !format!("{req:?}").contains("5a5a"),
            "Debug leaks the secret"
        );
        for bad in ["5a", "zz", ""] {
            let text = format!(r#"{{"client":{CLIENT_JSON},"secret":"{bad}"}}"#);
            assert!(serde_json::from_str::<PeerRequest>(&text).is_err(), "{bad}");
        }
        exact(
            &PeerResponse {
                session: "s1".into(),
                paths: vec!["tcp".into(), "shm".into()],
            },
            r#"{"session":"s1","paths":["tcp","shm"]}"#,
        );
    }

    #[test]
    fn parts_group_spans_by_block() {
        assert_eq!(part_ranges(None, 3), Ok(vec![0..1, 1..2, 2..3]));
        assert_eq!(part_ranges(Some(&[2, 1, 3]), 6), Ok(vec![0..2, 2..3, 3..6]));
        assert!(part_ranges(Some(&[2, 0, 3]), 5).is_err());
        assert!(part_ranges(Some(&[2, 2]), 3).is_err());
        assert!(part_ranges(Some(&[1]), 3).is_err());
        assert!(part_ranges(Some(&[u32::MAX, u32::MAX]), 3).is_err());
        assert!(part_ranges(Some(&[1; 2]), MAX_SPANS + 1).is_err());
        let text =
            r#"{"keys":["a"],"buffer":null,"ranges":[[0,4],[8,4]],"session":"s","parts":[2]}"#;
        assert!(serde_json::from_str::<GetIntoRequest>(text).is_ok());
    }

    #[test]
    fn shard_header() {
        assert_eq!(parse_shard_header("1/4"), Some((1, 4)));
        for bad in ["4/4", "1", "a/2", "1/", "-1/2", ""] {
            assert_eq!(parse_shard_header(bad), None, "{bad}");
        }
    }

    /// A put-from block is a map in JSON and an array in frames, and a node reads either form
    /// in either encoding (an older client's frames carry maps).
    #[test]
    fn a_put_from_block_is_a_map_in_json_and_an_array_in_frames() {
        let block = PutFromBlock {
            key: "k".to_string(),
            offset: 4096,
            len: 8,
        };
        assert_eq!(
            serde_json::to_value(&block).unwrap(),
            json!({"key": "k", "offset": 4096, "len": 8})
        );
        let framed = crate::kv_frame::encode(&block).unwrap();
        assert_eq!(framed, rmp_serde::to_vec(&("k", 4096u64, 8u64)).unwrap());
        assert!(
            framed.len()
                < rmp_serde::to_vec_named(&json!({"key": "k", "offset": 4096, "len": 8}))
                    .unwrap()
                    .len()
        );
        let as_map =
            rmp_serde::to_vec_named(&json!({"key": "k", "offset": 4096, "len": 8})).unwrap();
        for bytes in [&framed, &as_map] {
            assert_eq!(
                crate::kv_frame::decode::<PutFromBlock>(bytes).unwrap(),
                block
            );
        }
        let as_array: PutFromBlock = serde_json::from_value(json!(["k", 4096, 8])).unwrap();
        assert_eq!(as_array, block);
        // Neither form takes a block with a field too many.
        assert!(serde_json::from_value::<PutFromBlock>(
            json!({"key": "k", "offset": 0, "len": 8, "x": 1})
        )
        .is_err());
        let long = rmp_serde::to_vec(&("k", 0u64, 8u64, 1u64)).unwrap();
        assert!(crate::kv_frame::decode::<PutFromBlock>(&long).is_err());
    }

    /// A client serializes requests from borrowed keys; the node decodes the owned form. Both
    /// must be the same bytes, in JSON (HTTP) and in MessagePack (frames).
    #[test]
    fn borrowed_keys_encode_as_owned_ones() {
        fn same<O, B>(owned: O, borrowed: B)
        where
            O: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug,
            B: Serialize,
        {
            assert_eq!(
                serde_json::to_string(&owned).unwrap(),
                serde_json::to_string(&borrowed).unwrap()
            );
            let framed = crate::kv_frame::encode_call("b", &borrowed).unwrap();
            assert_eq!(framed, crate::kv_frame::encode_call("b", &owned).unwrap());
            assert_eq!(
                crate::kv_frame::decode_call::<O>(&framed).unwrap(),
                ("b".to_string(), owned)
            );
        }
        fn get<K>(keys: Vec<K>) -> GetIntoRequest<K> {
            GetIntoRequest::into_buffer(
                keys,
                desc(4096, 2 << 20),
                vec![(0, 1024), (1024, 4096)],
                "s1".into(),
            )
        }
        fn put<K: Clone>(key: K) -> PutFromRequest<K> {
            let block = |offset| PutFromBlock {
                key: key.clone(),
                offset,
                len: 8,
            };
            PutFromRequest {
                blocks: vec![block(0), block(8)],
                buffer: desc(4096, 2 << 20),
                session: "s1".into(),
                if_absent: true,
                pin: None,
                parts: Some(vec![2]),
            }
        }
        let keys = ["a".to_string(), "b/c".to_string()];
        same(
            get(keys.to_vec()),
            get(keys.iter().map(String::as_str).collect()),
        );
        same(put("k".to_string()), put("k"));
    }

    #[test]
    fn put_from() {
        let req: PutFromRequest = PutFromRequest {
            blocks: vec![PutFromBlock {
                key: "k".into(),
                offset: 64,
                len: 8,
            }],
            buffer: desc(4096, 2 << 20),
            session: "s1".into(),
            if_absent: false,
            pin: None,
            parts: None,
        };
        exact(
            &req,
            &format!(
                r#"{{"blocks":[{{"key":"k","offset":64,"len":8}}],"buffer":{DESC_JSON},"session":"s1"}}"#
            ),
        );
        exact(
            &PutFromRequest {
                if_absent: true,
                ..req.clone()
            },
            &format!(
                r#"{{"blocks":[{{"key":"k","offset":64,"len":8}}],"buffer":{DESC_JSON},"session":"s1","if_absent":true}}"#
            ),
        );
        exact(
            &PutFromRequest {
                pin: Some(BlockPin {
                    soft_ttl_secs: Some(60),
                }),
                ..req
            },
            &format!(
                r#"{{"blocks":[{{"key":"k","offset":64,"len":8}}],"buffer":{DESC_JSON},"session":"s1","pin":{{"soft_ttl_secs":60}}}}"#
            ),
        );
    }

    #[test]
    fn keys_answers() {
        exact(
            &ExistsResponse {
                exists: vec![true, false],
            },
            r#"{"exists":[true,false]}"#,
        );
        exact(&PrefixResponse { present: 3 }, r#"{"present":3}"#);
        exact(
            &RemoveResponse {
                removed: vec![false],
            },
            r#"{"removed":[false]}"#,
        );
    }

    #[test]
    fn requests_refuse_unknown_fields() {
        fn refused<T: DeserializeOwned + fmt::Debug>(v: Value) {
            assert!(serde_json::from_value::<T>(v.clone()).is_err(), "{v}");
        }
        refused::<KeysRequest>(json!({"keys": ["a"], "tll_ms": 5}));
        refused::<PutStartRequest>(json!({"blocks": [], "extra": 1}));
        refused::<PutStartRequest>(json!({"blocks": [{"key": "a", "len": 1, "x": 0}]}));
        refused::<PutIdsRequest>(json!({"put_ids": [1], "x": 0}));
        refused::<ReleaseRequest>(json!({"leases": [1], "x": 0}));
        refused::<PutFromRequest>(json!({"blocks": [], "buffer": null, "session": null}));
        let mut get_into: Value = serde_json::to_value(GetIntoRequest::per_key(
            vec!["a".to_string()],
            vec![desc(0, 1)],
            "s1".into(),
        ))
        .unwrap();
        get_into["x"] = json!(1);
        refused::<GetIntoRequest>(get_into);
        // Required fields are required.
        refused::<KeysRequest>(json!({}));
        refused::<GetIntoRequest>(json!({"keys": ["a"], "targets": []}));
    }

    #[test]
    fn answers_accept_unknown_fields() {
        let e: EtagsResponse = serde_json::from_value(json!({"etags": ["x"], "new": 1})).unwrap();
        assert_eq!(e.etags, ["x"]);
        let g: GetResponse = serde_json::from_value(json!({
            "leases": [], "blocks": [{"key": "a", "descriptor": null, "len": 0, "etag": null, "tier": "nvme"}],
            "ttl_ms": 1, "more": {}
        }))
        .unwrap();
        assert_eq!(g.blocks.len(), 1);
        let s: PutStartResponse = serde_json::from_value(json!({
            "puts": [{"key": "a", "put_id": 1, "descriptor": serde_json::from_str::<Value>(DESC_JSON).unwrap(), "v": 2}],
            "ttl_ms": 1, "more": true
        }))
        .unwrap();
        assert_eq!(s.puts[0].descriptor, desc(4096, 2 << 20));
        fn accepted<T: DeserializeOwned>(v: Value) {
            assert!(serde_json::from_value::<T>(v.clone()).is_ok(), "{v}");
        }
        accepted::<ExistsResponse>(json!({"exists": [], "x": 1}));
        accepted::<PrefixResponse>(json!({"present": 0, "x": 1}));
        accepted::<RemoveResponse>(json!({"removed": [], "x": 1}));
        accepted::<RevokeResponse>(json!({"revoked": [], "x": 1}));
        accepted::<CopiedResponse>(json!({"copied": [], "x": 1}));
        accepted::<ReleaseResponse>(json!({"released": 0, "x": 1}));
    }
}
