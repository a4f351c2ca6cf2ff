//! Wire types and validation shared by every Yutu crate.
//!
//! This crate does no I/O: it says what a valid bucket name, object key, byte range or size is,
//! which S3 error code goes with which HTTP status, and what the S3 XML documents look like;
//! and the KV-cache wire types: chained block hashes (`block_hash`), segment descriptors and
//! transfer-engine addresses (`descriptor`), the storage node's KV control API (`kv`), the
//! events storage nodes publish to the conductor (`events`), and the conductor's routing API
//! (`route`), bearer tokens (`token`: claims, scopes, signing and verifying), and the
//! answers of Mooncake master's read-only query endpoints (`mooncake_master`).
//! Both the server and the clients depend on it, so a rule written here holds on both ends.

pub mod acl;
pub mod admin;
pub mod block_hash;
pub mod bucket;
pub mod bucket_policy;
mod calendar;
pub mod cluster;
pub mod cors;
pub mod descriptor;
pub mod error;
pub mod events;
pub mod key;
pub mod kv;
pub mod kv_frame;
pub mod mirror;
pub mod mooncake_master;
pub mod ownership;
pub mod placement;
pub mod post_policy;
pub mod presence;
pub mod public_access_block;
pub mod range;
pub mod route;
pub mod sigv4;
pub mod size;
pub mod token;
pub mod version;
pub mod xml;
pub mod xml_attributes;

pub use bucket::{validate_bucket_name, BucketNameError};
pub use error::S3ErrorCode;
pub use key::{validate_object_key, KeyError, MAX_KEY_LEN};
pub use range::{parse_range, ByteRange, RangeSpec};
pub use size::{parse_size, ByteSize, SizeError};
