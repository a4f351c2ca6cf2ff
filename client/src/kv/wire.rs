//! The JSON documents of the KV control API (`/v1/kv/...`): the requests this client sends
//! for the batch calls, and the answers as it reads them.
//!
//! Unknown fields are ignored so that a newer server can add some; everything read here is
//! checked against the request by the caller before it is trusted.

use serde::{Deserialize, Serialize};
use yutu_transfer::{NodeAddress, SegmentDescriptor};

/// `put-from`: blocks the server reads out of `buffer`.
#[derive(Debug, Serialize)]
pub(crate) struct PutFrom<'a> {
    pub blocks: Vec<PutFromBlock<'a>>,
    pub buffer: SegmentDescriptor,
    pub client: &'a NodeAddress,
}

#[derive(Debug, Serialize)]
pub(crate) struct PutFromBlock<'a> {
    pub key: &'a str,
    pub offset: u64,
    pub len: u64,
}

/// `get-into`: blocks the server writes into ranges of `buffer`.
#[derive(Debug, Serialize)]
pub(crate) struct GetInto<'a> {
    pub keys: &'a [String],
    pub buffer: SegmentDescriptor,
    pub ranges: Vec<(u64, u64)>,
    pub client: &'a NodeAddress,
}

#[derive(Debug, Deserialize)]
pub(crate) struct PutStarted {
    pub puts: Vec<Started>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Started {
    pub key: String,
    pub put_id: u64,
    pub descriptor: SegmentDescriptor,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Etags {
    pub etags: Vec<String>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Copied {
    pub copied: Vec<Option<u64>>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Exists {
    pub exists: Vec<bool>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Present {
    pub present: u64,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Removed {
    pub removed: Vec<bool>,
}
