//! Yutu storage node.
//!
//! A node is a set of shards, one pinned thread each (see [`runtime`]). A shard owns the keys
//! that hash to it ([`shard`]), their index and DRAM ([`store`], [`arena`], [`eviction`]), and
//! serves the S3-like HTTP API on its share of the connections ([`http`]).

pub mod arena;
pub mod auth;
pub mod catalog;
pub mod config;
pub mod eviction;
pub mod http;
pub mod kv;
pub mod kv_direct;
pub mod kv_events;
pub mod listing;
pub mod metrics;
pub mod multipart;
pub mod runtime;
pub mod s3;
pub mod shard;
pub mod store;
pub mod tier;
