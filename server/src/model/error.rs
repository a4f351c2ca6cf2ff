//! The one error type of the storage layers below HTTP (engine, tier, node operations).

use std::sync::Arc;

use super::object::ObjectMeta;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("the bucket does not exist")]
    NoSuchBucket,
    #[error("the key does not exist")]
    NoSuchKey,
    #[error("the bucket is being deleted")]
    BucketClosing,
    #[error(
        "an object of {size} bytes does not fit in a shard's DRAM capacity of {capacity} bytes"
    )]
    TooLarge { size: u64, capacity: u64 },
    #[error("range not satisfiable for an object of {size} bytes")]
    InvalidRange { size: u64 },
    #[error("no evictable object is left to make room for {0} bytes")]
    NoSpace(u64),
    #[error("a precondition failed")]
    PreconditionFailed,
    #[error("not modified")]
    NotModified(Arc<ObjectMeta>),
    #[error("the multipart upload does not exist")]
    NoSuchUpload,
    #[error("{0}")]
    InvalidPart(String),
    #[error("the parts are not in ascending order")]
    InvalidPartOrder,
    #[error("{0}")]
    EntityTooSmall(String),
    #[error("{0}")]
    BadDigest(String),
    #[error("another write of the key is in flight; retry the conditional request")]
    Conflict,
    #[error("{0}")]
    InsufficientStorage(String),
    /// A per-user KV limit is reached (the message says which).
    #[error("{0}")]
    UserLimit(String),
    /// A put ended under a key it may not take (another key than it started with, a room
    /// without a key): the message says which.
    #[error("{0}")]
    PutKey(String),
    /// A write would take the bucket past its quota.
    #[error(
        "the bucket {bucket} holds {used} bytes of its {quota}-byte quota; {size} more do not fit"
    )]
    QuotaExceeded {
        bucket: String,
        quota: u64,
        used: u64,
        size: u64,
    },
    #[error("NVMe tier: {0}")]
    Device(String),
}
