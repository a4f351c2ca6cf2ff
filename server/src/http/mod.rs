//! The HTTP face of a shard: hyper 1.x connections on glommio, S3 routing and handlers.

pub mod acl;
pub mod admin;
pub mod admin_local;
pub mod attributes;
pub mod body;
pub mod bucket_policy;
pub mod buckets;
pub mod cluster;
pub mod common;
pub mod coordinate;
pub mod copy;
pub mod cors;
pub mod ctx;
pub mod delete_many;
pub mod endpoint;
pub mod error;
pub mod forward;
pub mod kv_api;
pub mod kv_copy;
pub mod kv_peers;
pub mod kv_shards;
pub mod meta;
pub mod mooncake;
pub mod multipart;
pub mod objects;
pub mod ownership;
pub mod payload;
pub mod peer_call;
pub mod permission;
pub mod post_object;
pub mod service;
pub mod target;

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
