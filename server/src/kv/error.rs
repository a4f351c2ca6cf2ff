//! Why a KV call failed, as the KV layer knows it. The request layer turns each into the
//! status and S3 code its callers see (`http::error`), the same for HTTP and frames.

use yutu_api::KeyError;

use crate::model::StoreError;
use crate::node::sessions::PeerError;
use crate::node::{CallError, ShardError};

#[derive(Debug, thiserror::Error)]
pub enum KvError {
    /// The request is malformed or names something it may not (the message says what).
    #[error("{0}")]
    Invalid(String),
    /// A key that is not a valid object key.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// A block larger than an object may be.
    #[error("{0}")]
    TooLarge(String),
    /// The store refused, about `key` when one key is to blame.
    #[error("{error}")]
    Store {
        error: StoreError,
        key: Option<String>,
    },
    /// A pin the store cannot take.
    #[error("{0}")]
    Pin(String),
    /// A session or engine call over the caller's or the node's limits.
    #[error(transparent)]
    Refused(#[from] PeerError),
    /// The challenge of a client's engine failed: no path of its address proved itself.
    #[error("{0}")]
    Unproven(String),
    /// The node runs no transfer engine.
    #[error("the node runs no transfer engine")]
    NoEngine,
    /// Moving the bytes to or from the client's memory failed.
    #[error("{0}")]
    Transfer(String),
    /// Another shard could not be reached.
    #[error(transparent)]
    Shard(#[from] ShardError),
    /// Something the node should never see (logged where it happens).
    #[error("internal: {0}")]
    Internal(&'static str),
}

impl KvError {
    /// A malformed request, saying why.
    pub fn invalid(msg: impl Into<String>) -> KvError {
        KvError::Invalid(msg.into())
    }

    /// The store's refusal about one key.
    pub fn about(error: StoreError, key: &str) -> KvError {
        KvError::Store {
            error,
            key: Some(key.to_string()),
        }
    }
}

impl From<StoreError> for KvError {
    fn from(error: StoreError) -> KvError {
        KvError::Store { error, key: None }
    }
}

impl From<CallError> for KvError {
    fn from(e: CallError) -> KvError {
        match e {
            CallError::Shard(e) => e.into(),
            CallError::Store(e) => e.into(),
        }
    }
}
