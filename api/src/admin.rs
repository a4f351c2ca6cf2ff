//! The storage admin API (`/admin/v1/...`, admin identities only): JSON documents shared by
//! the node and the `yutu admin` CLI.
//!
//! | call | body | answer |
//! |---|---|---|
//! | `GET /admin/v1/nodes` | | [`NodesResponse`]: every member, its state and usage |
//! | `GET /admin/v1/stats` | | [`StatsResponse`]: per node and shard, per tier |
//! | `POST /admin/v1/evict` | [`EvictRequest`] | [`EvictResponse`] |
//! | `POST /admin/v1/pin` | [`PinRequest`] | [`PinResponse`] |
//! | `POST /admin/v1/unpin` | [`PinRequest`] (no `ttl_secs`) | [`PinResponse`] |
//! | `POST /admin/v1/replicate` | [`ReplicateRequest`] | [`ReplicateResponse`] |
//! | `POST /admin/v1/drain` | [`DrainRequest`] | [`DrainResponse`] |
//! | `GET /admin/v1/status` | | [`StatusResponse`] |
//!
//! Any node answers for the whole cluster: it asks every member for its part (the same
//! documents under `/admin/v1/local/...`, which a node answers for itself only) and adds the
//! answers up. A member that does not answer is listed with the state `unreachable`.
//! Errors are the JSON error of the KV API (`yutu_api::error::JsonError`).

use serde::{Deserialize, Serialize};

/// Prefix of the calls a node answers for itself only.
pub const LOCAL_PREFIX: &str = "/admin/v1/local";
pub const NODES_PATH: &str = "/admin/v1/nodes";
pub const STATS_PATH: &str = "/admin/v1/stats";
pub const EVICT_PATH: &str = "/admin/v1/evict";
pub const PIN_PATH: &str = "/admin/v1/pin";
pub const UNPIN_PATH: &str = "/admin/v1/unpin";
pub const REPLICATE_PATH: &str = "/admin/v1/replicate";
pub const DRAIN_PATH: &str = "/admin/v1/drain";
pub const STATUS_PATH: &str = "/admin/v1/status";
/// A node's own part of a bucket listing (nodes ask each other when a client lists a cluster
/// bucket): `POST` a [`LocalListRequest`], answered with [`LocalListEntry`]s.
pub const LOCAL_LIST_PATH: &str = "/admin/v1/local/list";
/// The versions of what a node holds (objects and tombstones) of keys it owns with another
/// node, for anti-entropy: `POST` a [`VersionsRequest`], answered with a [`VersionsPage`].
pub const LOCAL_VERSIONS_PATH: &str = "/admin/v1/local/versions";

/// Bytes used of a tier's capacity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub used: u64,
    pub capacity: u64,
}

/// One shard's numbers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardStats {
    pub shard: usize,
    pub dram: Usage,
    pub nvme: Usage,
    /// Objects in DRAM.
    pub objects: u64,
    /// GETs served from DRAM / from NVMe / missed.
    pub dram_hits: u64,
    pub nvme_hits: u64,
    pub misses: u64,
    /// Objects evicted from DRAM (demoted to NVMe or dropped).
    pub evictions: u64,
    pub demotions: u64,
    /// Keys pinned by the admin API (hard and soft).
    pub pinned: u64,
}

/// A node's state in the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeState {
    /// A member, owning keys.
    Up,
    /// Being drained: owns nothing new, still holds keys.
    Draining,
    /// Drained: holds no key of a cluster bucket; may be removed.
    Drained,
    /// A member that did not answer the admin call.
    Unreachable,
}

/// One node's part: identity, state, and per-shard numbers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStats {
    pub name: String,
    pub url: String,
    #[serde(default)]
    pub zone: Option<String>,
    pub state: NodeState,
    pub shards: Vec<ShardStats>,
    /// 1 while the node moves keys after a membership change.
    #[serde(default)]
    pub rebalancing: bool,
    /// The node's last rebalancing pass completed against the membership it sees now (keys
    /// it holds beyond what it owns, a put's extra copies, are no longer dropped by a pass
    /// still to come), and anti-entropy has caught it up with the other owners against that
    /// membership. False while a membership change or a rejoin is not yet worked through.
    #[serde(default)]
    pub settled: bool,
    /// Keys copied to new owners and bytes, since the node started.
    #[serde(default)]
    pub rereplicated_keys: u64,
    #[serde(default)]
    pub rereplicated_bytes: u64,
    /// Keys whose copy to a new owner failed in the last rebalancing pass, plus keys (or
    /// members) the last anti-entropy pass could not bring up to date (both retried): the
    /// node's share of under-replicated keys.
    #[serde(default)]
    pub under_replicated: u64,
    /// Copies dropped because the node no longer owns the key.
    #[serde(default)]
    pub handed_off: u64,
    /// Why the node is reported `unreachable` (no answer within the per-member deadline,
    /// refused connection, ...); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl NodeStats {
    /// Sum of the shards' DRAM usage.
    pub fn dram(&self) -> Usage {
        sum(self.shards.iter().map(|s| s.dram))
    }

    /// Sum of the shards' NVMe usage.
    pub fn nvme(&self) -> Usage {
        sum(self.shards.iter().map(|s| s.nvme))
    }

    /// Objects in DRAM on every shard.
    pub fn objects(&self) -> u64 {
        self.shards.iter().map(|s| s.objects).sum()
    }

    /// DRAM and NVMe hits over all GETs (0 before the first).
    pub fn hit_ratio(&self) -> f64 {
        let hits: u64 = self.shards.iter().map(|s| s.dram_hits + s.nvme_hits).sum();
        let misses: u64 = self.shards.iter().map(|s| s.misses).sum();
        if hits + misses == 0 {
            0.0
        } else {
            hits as f64 / (hits + misses) as f64
        }
    }
}

fn sum(u: impl Iterator<Item = Usage>) -> Usage {
    u.fold(Usage::default(), |a, b| Usage {
        used: a.used + b.used,
        capacity: a.capacity + b.capacity,
    })
}

/// `GET /admin/v1/nodes` and `GET /admin/v1/stats` (the same document; the CLI shows less
/// of it for `nodes`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodesResponse {
    /// The cluster's name; empty for a single node.
    pub cluster: String,
    pub revision: i64,
    pub nodes: Vec<NodeStats>,
}

pub type StatsResponse = NodesResponse;

/// What to evict. Either objects (`bucket`, with `key` or `prefix` or neither for the whole
/// bucket), removed from every node and every tier, hard-pinned ones excepted; or
/// `free_bytes` of DRAM on `node` (least recently used first, soft-pinned last, hard-pinned
/// never; `memory` objects go to NVMe when the node has it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvictRequest {
    #[serde(default)]
    pub bucket: Option<String>,
    #[serde(default)]
    pub key: Option<String>,
    #[serde(default)]
    pub prefix: Option<String>,
    #[serde(default)]
    pub node: Option<String>,
    #[serde(default)]
    pub free_bytes: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvictResponse {
    pub objects: u64,
    pub bytes: u64,
    /// Matching objects left in place because they are hard-pinned.
    pub pinned_skipped: u64,
}

/// Keys to pin or unpin: `key`, or every key under `prefix` (stored now), of `bucket`. With
/// `ttl_secs` the pin is soft: the keys are evicted only when nothing else can be, and the pin
/// ends after the TTL. Without, the pin is hard: never evicted from DRAM, until unpinned.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinRequest {
    pub bucket: String,
    #[serde(default)]
    pub key: Option<String>,
    #[serde(default)]
    pub prefix: Option<String>,
    #[serde(default)]
    pub ttl_secs: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinResponse {
    /// Copies (over all nodes) whose pin was set or cleared.
    pub keys: u64,
}

/// Copy `key` (or every key under `prefix`) of `bucket` to `replicas` nodes in all (the key's
/// owners first, then the next nodes in its placement order), or onto `node`. Extra copies
/// serve reads routed to them (the conductor sees them through KV events) and last until
/// the next membership change.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicateRequest {
    pub bucket: String,
    #[serde(default)]
    pub key: Option<String>,
    #[serde(default)]
    pub prefix: Option<String>,
    #[serde(default)]
    pub replicas: Option<u32>,
    #[serde(default)]
    pub node: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicateResponse {
    /// Keys considered.
    pub keys: u64,
    /// Copies made.
    pub copies: u64,
    pub bytes: u64,
}

/// Drain `node` (move every key off it; it owns nothing new), or with `cancel` stop draining
/// it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainRequest {
    pub node: String,
    #[serde(default)]
    pub cancel: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainResponse {
    pub node: String,
    pub state: NodeState,
}

/// `GET /admin/v1/status`: what is in motion.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusResponse {
    pub cluster: String,
    pub revision: i64,
    pub members: usize,
    /// Nodes moving keys now.
    pub rebalancing: Vec<String>,
    /// Keys a node could not yet copy to a new owner (over all nodes).
    pub under_replicated: u64,
    pub rereplicated_keys: u64,
    pub rereplicated_bytes: u64,
    /// Nodes being drained, and how many objects each still holds.
    pub drains: Vec<DrainProgress>,
    /// Members that did not answer.
    pub unreachable: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainProgress {
    pub node: String,
    pub state: NodeState,
    /// Objects of cluster buckets the node still holds.
    pub remaining: u64,
}

/// One page of what a node itself holds of a bucket.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalListRequest {
    pub bucket: String,
    #[serde(default)]
    pub prefix: String,
    #[serde(default)]
    pub delimiter: Option<String>,
    /// Exclusive lower bound (a key or common prefix).
    #[serde(default)]
    pub after: Option<String>,
    pub limit: usize,
}

/// An entry of a node's page: an object, or a common prefix (`prefix` set, the rest empty).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalListEntry {
    pub name: String,
    #[serde(default)]
    pub prefix: bool,
    #[serde(default)]
    pub size: u64,
    #[serde(default)]
    pub etag: String,
    #[serde(default)]
    pub modified_ms: u64,
}

/// One page of the versions a node holds of a bucket's keys that it owns with `partner`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionsRequest {
    pub bucket: String,
    /// Exclusive lower bound.
    #[serde(default)]
    pub after: Option<String>,
    pub limit: usize,
    /// The node asking: only keys it owns too are listed.
    pub partner: String,
    /// The etcd revision of the asker's view of the cluster: a node whose own view is older
    /// refuses (503), as it would compute other owners.
    #[serde(default)]
    pub revision: i64,
}

/// The version of one key a node holds: of its object, or of its delete (a tombstone).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionEntry {
    pub key: String,
    pub version: crate::version::Version,
    #[serde(default)]
    pub deleted: bool,
}

/// A page of [`VersionEntry`]s in key order. `next` is where the next page starts (exclusive;
/// the last key looked at, which may be past the last entry listed), `None` at the end.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionsPage {
    pub entries: Vec<VersionEntry>,
    #[serde(default)]
    pub next: Option<String>,
}
