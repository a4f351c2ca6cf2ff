//! Yutu's conductor: the global scheduler of disaggregated LLM serving.
//!
//! For every request it picks the prefill instance where the time to first token is lowest
//! given what each storage node already caches (Mooncake's Algorithm 1), picks the decode
//! instance by the load predicted for when the request gets there, and refuses early
//! (HTTP 429) what would miss its objectives anyway.
//!
//! The pieces, each in its own module:
//! - [`index`]: block hash -> holders (node, tier), fed by KV events and by predictions made
//!   at routing time, over [`table`] (one cache line per block); [`feed`]: per-node event
//!   ordering, gaps, restarts and resyncs;
//! - [`registry`] and [`load`]: the instances and their load, from the conductor's own
//!   bookkeeping corrected by the instances' reports; [`nodes`]: the storage nodes, known
//!   from their registrations and events or from the cluster's etcd membership
//!   ([`membership`], read with [`etcd`]);
//! - [`cost`] (with [`poly`]): configurable prefill, decode-step and transfer time models;
//! - [`routing`]: the policies ([`policy`]), admission and bookkeeping; [`hot`]: which
//!   prefixes deserve replication hints;
//! - [`conductor`]: the state that ties these together, with no I/O and no clock of its own
//!   (time is an argument), so that [`sim`] replays traces through exactly the code that
//!   [`service`] runs;
//! - [`service`]: the HTTP API; [`metrics`]: counters and Prometheus text.
//!
//! # Why tokio and not glommio
//!
//! The storage node is thread-per-core on glommio because its data shards: each core owns a
//! key range and its memory. The conductor's data does not shard: every routing decision
//! reads the prefix index across all nodes and the load of all instances, so splitting the
//! state over cores would turn each decision into a cross-core fan-out. Its work is small
//! (microseconds per request, thousands of requests per second) and latency-bound, not
//! I/O-bound. So it keeps one state behind one lock, and needs what tokio gives for free:
//! an HTTP server and client ecosystem (hyper, ureq on the blocking pool for snapshots and
//! etcd),
//! timers for retries, and it runs anywhere (no io_uring or locked memory requirements,
//! which matters for a process that is often co-located with inference engines).

pub mod conductor;
pub mod config;
pub mod cost;
pub mod etcd;
pub mod feed;
pub mod hot;
pub mod ids;
pub mod index;
pub mod load;
pub mod membership;
pub mod metrics;
pub mod nodes;
pub mod policy;
pub mod poly;
pub mod registry;
pub mod routing;
pub mod service;
pub mod sim;
pub mod table;

pub use conductor::Conductor;
pub use config::ConductorConfig;
pub use policy::Policy;
pub use routing::{Decision, RouteInput};
