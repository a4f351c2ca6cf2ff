//! The KV block path on the owning shard: leases and two-phase puts through descriptors
//! ([`ops`]), and the same-host fast path that copies straight between the arena and a
//! client's mapped buffer ([`direct`]).

pub mod direct;
pub mod ops;
