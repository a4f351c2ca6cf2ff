//! One shard's store, synchronous and runtime-free: the DRAM arena and its allocator, the
//! object index, eviction, KV leases and pending puts, multipart uploads, the event log and
//! each bucket's settings (`bucket_settings`).
//!
//! Nothing here awaits, so every operation is atomic with respect to every other on the
//! shard's thread, and all of it is unit-testable without glommio.

pub mod arena;
pub mod bucket_settings;
pub mod events;
pub mod eviction;
pub mod kv;
pub mod multipart;
pub mod pinning;
pub mod prefault;
pub mod presence;
pub mod shard;
pub mod tombstones;

pub use shard::ShardStore;
