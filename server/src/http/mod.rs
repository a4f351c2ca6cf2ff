//! The HTTP face of a shard: hyper 1.x connections on glommio, S3 routing and handlers.

// Shared by every kind of request, below the folders: the request's context and errors, its
// parsing into an endpoint, bodies, permissions, and the one dispatch.
pub mod body;
pub mod common;
pub mod ctx;
pub mod endpoint;
pub mod error;
pub mod permission;
pub mod service;
pub mod target;

/// The node's own admin API: answered for the whole cluster, and this node's part of it.
pub mod admin;
/// The KV block API, its same-host fast path, and Mooncake master's query endpoints.
pub mod kv;
/// Between the nodes of a cluster: where a request is served, forwarding, replication and
/// calls to other members.
pub mod peer;
/// The S3 API: objects, buckets and their settings.
pub mod s3;

use bytes::Bytes;
use http::{header, Response, StatusCode};
use http_body_util::Full;

/// Every response body is a complete buffer: objects live in DRAM, so there is nothing to
/// stream from.
pub type Resp = Response<Full<Bytes>>;

pub fn xml_response(status: StatusCode, xml: String) -> Resp {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/xml")
        .body(Full::new(Bytes::from(xml)))
        .unwrap_or_default()
}
