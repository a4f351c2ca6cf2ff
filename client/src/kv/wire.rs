//! The JSON answers of the KV control API (`/v1/kv/...`), as this client reads them.
//!
//! Unknown fields are ignored so that a newer server can add some; everything read here is
//! checked against the request by the caller before it is trusted.

use serde::Deserialize;
use yutu_transfer::SegmentDescriptor;

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
