//! The node: shards on pinned threads, the job mesh between them, the bucket coordinator and
//! catalog, and the runtime that starts them.

pub mod buckets;
pub mod catalog;
pub mod data_dir;
pub mod publisher;
pub mod quota;
pub mod runtime;
pub mod sessions;
pub mod shard;
pub mod shutdown;

pub use buckets::BucketError;
pub use shard::{CallError, Job, Reply, Shard, ShardError};
