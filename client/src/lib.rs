//! Yutu client library: a blocking client for Yutu's S3-like object API, and ([`kv`]) for
//! its KV block API, whose bytes move one-sidedly through a transfer engine.
//!
//! Yutu speaks S3 in path style (`/{bucket}/{key}`), so this crate is a small S3 client:
//! one method per operation on [`Client`], typed results, and S3 errors kept as the server
//! sent them ([`ClientError::S3`]) so that callers can branch on the code. Object bodies are
//! streamed both ways, never buffered whole, because KV-cache objects and their batches run
//! to gigabytes. [`AdminClient`] speaks the storage admin API (`/admin/v1`) over the same
//! client. The `yutu` CLI (`src/bin/yutu/`) is a thin layer over this crate.
//!
//! ```no_run
//! # fn main() -> Result<(), yutu_client::ClientError> {
//! let client = yutu_client::Client::new("http://127.0.0.1:9000")?;
//! client.create_bucket("models")?;
//! client.put_bytes("models", "llama/0001", b"kv block")?;
//! assert_eq!(client.get_bytes("models", "llama/0001")?, b"kv block");
//! for page in client.list_pages("models", Some("llama/"), Some("/")) {
//!     for obj in page?.objects {
//!         println!("{} {}", obj.size, obj.key);
//!     }
//! }
//! # Ok(())
//! # }
//! ```

mod address;
mod admin;
mod bearer;
mod client;
mod coalesce;
mod credentials;
mod download;
mod error;
pub mod kv;
mod listing;
mod object;
mod paging;
mod sigv4;
mod tcp;
pub mod timestamp;
mod upload;
mod xml;

pub use address::encode_key;
pub use admin::{AdminClient, AdminError};
pub use client::{BucketOptions, BucketStatus, Client, Durability};
pub use credentials::{CredentialSource, CredentialsError};
pub use download::GetObject;
pub use error::ClientError;
pub use kv::{BlockHash, BlockHasher, Buffer, KvClient, KvError, KvOptions, PutMode};
pub use listing::{BucketInfo, ListPage, Listing, ObjectSummary};
pub use object::{ObjectInfo, PutResult};
pub use paging::ListPages;
pub use sigv4::Credentials;
