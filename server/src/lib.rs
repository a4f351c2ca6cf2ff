//! Yutu storage node.
//!
//! The crate is built in layers; each folder is one, and a module imports only from the
//! layers listed before its own (`tests/tests/layers.rs` checks every `crate::` path):
//!
//! 1. [`model`], [`metrics`], [`net`]: plain types, counters, the glommio/hyper glue.
//! 2. [`config`]: the node's settings and users.
//! 3. [`store`]: one shard's synchronous store (arena, index, eviction, leases, uploads,
//!    event log), with no runtime and no HTTP, unit-testable on its own.
//! 4. [`tier`]: DRAM and NVMe as one [`tier::TieredStore`] (demotion, promotion, tombstones,
//!    write-through); async methods that return their results.
//! 5. [`node`]: shards, the job mesh between them, the bucket coordinator and catalog, the
//!    runtime that starts and stops them.
//! 6. [`auth`], [`events`], [`kv`], [`cluster`]: permissions and signatures, KV events for
//!    the conductor, the KV calls (reaching the owning shards, leases, puts, copies into
//!    and out of client memory, engine sessions), membership and bucket configuration from
//!    etcd. They do not import each other.
//! 7. [`http`]: one endpoint enum and one error type per API; it parses requests and
//!    answers what the layers below return.
//! 8. [`serve`]: assembles a running node from all of the above.

pub mod auth;
pub mod cluster;
pub mod config;
pub mod events;
pub mod http;
pub mod kv;
pub mod metrics;
pub mod model;
pub mod net;
pub mod node;
pub mod serve;
pub mod store;
pub mod tier;
