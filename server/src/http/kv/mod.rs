//! The KV block API over HTTP (`/v1/kv/...`): parsing and answering, with the node moving
//! bytes for same-host clients (`copy`), engine sessions (`peers`) and the per-shard helpers
//! the calls share (`shards`); and Mooncake master's read-only query endpoints (`mooncake`).

pub mod api;
pub mod copy;
pub mod mooncake;
pub mod peers;
pub mod shards;
