//! The KV block API (`/v1/kv/...`), parsed and answered: JSON over HTTP (`api`), the same
//! calls in binary frames on each shard's own sockets (`frames`), and Mooncake master's
//! read-only query endpoints (`mooncake`). What the calls do is [`crate::kv`]'s.

pub mod api;
pub mod arena_view;
pub mod frames;
pub mod mooncake;
pub mod presence_handoff;
