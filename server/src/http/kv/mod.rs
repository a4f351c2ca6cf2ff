//! The KV block API (`/v1/kv/...`): parsing and answering JSON over HTTP (`api`) and the same
//! calls in binary frames on each shard's own sockets (`frames`), with the node moving bytes
//! for same-host clients (`copy`), engine sessions (`peers`) and the per-shard helpers the
//! calls share (`shards`); and Mooncake master's read-only query endpoints (`mooncake`).

pub mod api;
pub mod copy;
pub mod frames;
pub mod mooncake;
pub mod peers;
pub mod shards;
