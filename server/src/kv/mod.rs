//! The KV block path on the owning shard: leases and two-phase puts through descriptors
//! ([`ops`]), the same-host fast path that copies straight between the arena and a client's
//! mapped buffer ([`direct`]), and small values carried in the call ([`inline`]).

pub mod direct;
pub mod inline;
pub mod ops;
