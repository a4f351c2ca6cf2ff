//! The KV block path: what the KV API does, whichever transport carries the call (HTTP/JSON
//! or binary frames; the request layer only parses and answers).
//!
//! - [`owners`]: the one way a call reaches the shards that own its keys.
//! - [`calls`]: the control calls (exists, remove, leases, two-phase puts, releases).
//! - [`copy`]: get-into and put-from, where the node moves the bytes for the client.
//! - [`sessions`]: client engines registered as peers of the node's transfer engine.
//! - [`ops`]: what one owning shard runs (leases with descriptors, put start/end/revoke).
//! - [`direct`]: the same-host fast path, copies straight between the arena and a client's
//!   mapped buffer.
//! - [`inline`]: small values carried in the call.

use std::rc::Rc;

use crate::node::Shard;

pub mod calls;
pub mod copy;
pub mod direct;
pub mod error;
pub mod inline;
pub mod ops;
pub mod owners;
pub mod sessions;

pub use error::KvError;

/// Who a KV call runs for, and where it arrived.
pub struct Caller<'a> {
    /// The shard that received the call; it sends each owning shard its part.
    pub here: &'a Rc<Shard>,
    /// The caller's name: leases, puts and sessions belong to it.
    pub holder: String,
}
