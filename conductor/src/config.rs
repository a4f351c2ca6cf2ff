//! The conductor's settings, with their defaults and why.
//!
//! Every field is a key of the TOML file given with `--config` (unknown keys are an error);
//! the most used ones are also flags. The cost model is the `[cost]` table (see
//! [`crate::cost`]), replication hints the `[hot]` table, the etcd membership the `[cluster]`
//! table.
//!
//! ```toml
//! policy = "global-cache-aware"
//! block_tokens = 512
//! ttft_slo_ms = 10000
//! tbt_slo_ms = 100
//! [cost]
//! prefill = "10 + 0.08*n - 0.08*c + 1.5e-6*n^2 - 1.5e-6*c^2"
//! decode_step = "20 + 0.1*b + 2e-5*t"
//! [hot]
//! threshold = 4
//! [cluster]
//! etcd = ["http://10.0.0.2:2379", "http://10.0.0.3:2379"]
//! name = "yutu"
//! ```

use serde::{Deserialize, Serialize};

use crate::cost::CostModel;
use crate::policy::Policy;

/// Routing, admission, membership and bounds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConductorConfig {
    /// Tokens per KV block; must match the engines' (Mooncake: 512).
    pub block_tokens: u32,
    pub policy: Policy,
    /// Reject requests predicted to miss their SLO. Unset: on for the global cache-aware
    /// policy, off for the baselines.
    pub early_rejection: Option<bool>,
    /// With early rejection, still serve a request that would miss its TTFT objective even
    /// with no queue, when an instance is idle for it: nobody waits behind it and its prefix
    /// gets cached (see [`crate::routing`]).
    pub serve_unattainable_when_idle: bool,
    /// Default TTFT objective when a request brings none; unset: no TTFT rejection.
    pub ttft_slo_ms: Option<f64>,
    /// Default TBT objective when a request brings none; unset: no TBT rejection.
    pub tbt_slo_ms: Option<f64>,
    /// Output length assumed for requests that do not say (decode occupancy prediction).
    pub default_output_tokens: u64,
    /// A predicted cache entry lives until the request's predicted first token plus this:
    /// long enough for the node's `stored` event to replace it, short enough that a wrong
    /// guess (the request failed, the node evicted) is forgotten soon.
    pub prediction_grace_ms: f64,
    /// The global policy treats TTFTs within this fraction of the best as equal, and among
    /// those picks the instance that computes the least (see [`crate::routing`]).
    pub reuse_slack: f64,
    /// The local cache-aware baseline only considers instances whose queue is at most this
    /// much longer than the shortest one.
    pub local_queue_limit_ms: f64,
    /// An instance not heard from for this long is not routed to; unset: never expires.
    pub instance_ttl_ms: Option<f64>,
    /// A decode load report is trusted for this long, then bookkeeping alone is used.
    pub report_ttl_ms: f64,
    /// Blocks the index is sized for at start (0: grow on demand). Growing rehashes the
    /// whole table under the lock (about 0.1 s per million blocks), so a deployment that
    /// knows its size sets it; memory is only committed as slots are touched.
    pub index_capacity_blocks: usize,
    /// Blocks' worth of events buffered per node while its snapshot is fetched.
    pub resync_buffer_blocks: usize,
    pub max_nodes: usize,
    pub max_buckets: usize,
    pub max_instances: usize,
    /// Seed of the random policy (reproducible simulations).
    pub seed: u64,
    pub cost: CostModel,
    pub hot: HotConfig,
    /// Who may call the service (`[auth]`, `[[auth.token_keys]]`).
    pub auth: AuthConfig,
    /// Where the storage nodes are listed (`[cluster]`): etcd, when they form a cluster.
    pub cluster: ClusterConfig,
}

/// The cluster membership in etcd. With endpoints, the conductor reads the members the storage
/// nodes register under their leases, so it knows every node (and its URL, for snapshots)
/// without waiting for it to register, stops routing to a node whose lease is gone, and
/// resyncs one that comes back. Without endpoints, nodes are known only from their own
/// registrations and events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// etcd client URLs (`http://host:2379`), tried in turn; empty: no etcd.
    pub etcd: Vec<String>,
    /// The cluster's name, as given to the nodes (`--cluster`): members are read under
    /// `/yutu/<name>/members/`.
    pub name: String,
    /// How often the membership is read while no watch runs (etcd refused it, or it broke
    /// and is being set up again), and after a failed read. Two reads per second notice a
    /// node whose lease expired well within a second of etcd noticing it, at a cost etcd
    /// does not feel.
    pub poll_ms: u64,
    /// Whether to watch the members' prefix, reading the membership again as soon as etcd
    /// reports a change (the read, not the watch, is what is applied).
    pub watch: bool,
    /// How often the membership is read anyway while the watch runs: the safety net for a
    /// change a watch missed without breaking.
    pub resync_ms: u64,
    /// Longest one etcd call may take before the next endpoint is tried: a frozen etcd must
    /// not stall the reads for longer than this.
    pub call_timeout_ms: u64,
    /// Largest membership answer read from etcd, in bytes (an answer is read whole).
    pub max_answer_bytes: u64,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            etcd: Vec::new(),
            name: "yutu".to_string(),
            poll_ms: 500,
            watch: true,
            resync_ms: 10_000,
            call_timeout_ms: 1_000,
            max_answer_bytes: yutu_etcd::MAX_ANSWER_BYTES as u64,
        }
    }
}

impl ClusterConfig {
    /// Whether the conductor follows an etcd membership.
    pub fn enabled(&self) -> bool {
        !self.etcd.is_empty()
    }
}

/// The service's authentication: the keys callers' bearer tokens are signed with, and the
/// token the conductor sends to nodes when it fetches their snapshots.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Same form as a node's `[[token_keys]]` (kid, alg, secret or public key).
    pub token_keys: Vec<yutu_api::token::KeyConfig>,
    /// File holding a bearer token for the nodes' admin API (an admin token of each node's
    /// keys), sent with every snapshot fetch.
    pub node_token_file: Option<std::path::PathBuf>,
    /// PEM file of the certificates (or CAs) trusted for nodes that serve HTTPS; without it,
    /// the public web roots.
    pub node_ca_file: Option<std::path::PathBuf>,
}

/// When a hot prefix earns a replication hint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HotConfig {
    pub enabled: bool,
    /// Half-life of a prefix's request count.
    pub half_life_ms: f64,
    /// Decayed requests on a prefix that make it hot.
    pub threshold: f64,
    /// The prefix's holders are "loaded" when the least busy prefill instance on them has
    /// at least this much queued.
    pub loaded_queue_ms: f64,
    /// No hint once this many nodes hold the whole prefix.
    pub max_holders: usize,
    /// Prefixes tracked at most.
    pub max_tracked: usize,
    /// How long the target is predicted to hold the copy before its events confirm it.
    pub replicate_ttl_ms: f64,
}

impl Default for HotConfig {
    fn default() -> Self {
        HotConfig {
            enabled: true,
            half_life_ms: 10_000.0,
            threshold: 4.0,
            loaded_queue_ms: 1_000.0,
            max_holders: 3,
            max_tracked: 100_000,
            replicate_ttl_ms: 10_000.0,
        }
    }
}

impl Default for ConductorConfig {
    fn default() -> Self {
        ConductorConfig {
            block_tokens: 512,
            policy: Policy::GlobalCacheAware,
            early_rejection: None,
            serve_unattainable_when_idle: true,
            ttft_slo_ms: Some(10_000.0),
            tbt_slo_ms: Some(100.0),
            default_output_tokens: 256,
            prediction_grace_ms: 5_000.0,
            reuse_slack: 0.05,
            local_queue_limit_ms: 2_000.0,
            instance_ttl_ms: Some(30_000.0),
            report_ttl_ms: 5_000.0,
            index_capacity_blocks: 0,
            resync_buffer_blocks: 4 << 20,
            max_nodes: 4_096,
            max_buckets: 4_096,
            max_instances: 16_384,
            seed: 0x5eed,
            cost: CostModel::default(),
            hot: HotConfig::default(),
            auth: AuthConfig::default(),
            cluster: ClusterConfig::default(),
        }
    }
}

impl ConductorConfig {
    /// Whether requests predicted to miss their SLO are rejected.
    pub fn rejects(&self) -> bool {
        self.early_rejection
            .unwrap_or_else(|| self.policy.rejects_by_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_keys_override_defaults_and_typos_fail() {
        let c: ConductorConfig = toml::from_str(
            "policy = \"least-loaded\"\nttft_slo_ms = 500\n[cost]\nprefill = \"2*n\"\n[hot]\nthreshold = 9",
        )
        .expect("parses");
        assert_eq!(c.policy, Policy::LeastLoaded);
        assert_eq!(c.ttft_slo_ms, Some(500.0));
        assert_eq!(c.cost.prefill_ms(10, 0), 20.0);
        assert_eq!(c.hot.threshold, 9.0);
        assert_eq!(c.block_tokens, 512);
        assert!(!c.rejects());
        assert!(ConductorConfig::default().rejects());
        assert!(toml::from_str::<ConductorConfig>("polcy = \"random\"").is_err());
        assert!(!c.cluster.enabled());
        assert_eq!(c.cluster.name, "yutu");
        let c: ConductorConfig = toml::from_str(
            "[cluster]\netcd = [\"http://e1:2379\", \"http://e2:2379\"]\nname = \"prod\"",
        )
        .expect("parses");
        assert!(c.cluster.enabled());
        assert_eq!(c.cluster.etcd.len(), 2);
        assert_eq!((c.cluster.name.as_str(), c.cluster.poll_ms), ("prod", 500));
        assert!(toml::from_str::<ConductorConfig>("[cluster]\netc = []").is_err());
        assert!(toml::from_str::<ConductorConfig>("policy = \"fastest\"").is_err());
    }
}
