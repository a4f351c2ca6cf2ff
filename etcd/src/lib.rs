//! etcd v3's JSON gateway as Yutu speaks it, without I/O: the requests (path and JSON body)
//! of every call the node and the conductor make, the parsers of etcd's answers, the decoder
//! of the watch stream, endpoint validation and the endpoint rotation.
//!
//! Why a crate of its own: the node (glommio, its own HTTP client) and the conductor (tokio,
//! `ureq` on the blocking pool) cannot share a transport, but they must read etcd's bytes the
//! same way: they used to carry two parsers that disagreed on details (integers given as
//! numbers, absent fields, non-UTF-8 keys). It is not a module of `yutu-api` because it is no
//! contract between Yutu's own programs: it is etcd's wire format, and `yutu-api` is what
//! clients of Yutu build against. Each side keeps only a thin adapter that sends a
//! [`Call`] and hands the bytes back here.
//!
//! Why the gateway and not gRPC (`etcd-client`): gRPC through tonic needs `protoc` to build
//! and a tokio runtime next to the node's glommio executors; every call Yutu needs, watches
//! included, is served as JSON on etcd's client port (the gateway is on by default since
//! etcd 3.3). In that JSON, keys and values are base64, 64-bit integers are strings (numbers
//! are accepted too), and fields holding their proto3 default (0, "", false, []) are left out.

mod answer;
mod endpoints;
mod request;
mod watch;

pub use answer::{
    parse_delete, parse_grant, parse_keep_alive, parse_ok, parse_range, parse_txn, KeyValue,
    RangeAnswer,
};
pub use endpoints::{endpoint, Endpoints};
pub use request::{prefix_end, Call};
pub use watch::{EventKind, WatchDecoder, WatchEvent, WatchResponse, MAX_WATCH_LINE};

/// The default bound on one answer read whole (a range over a cluster's prefix): the
/// node's, and the conductor's unless configured. Thousands of members, buckets and usage
/// records fit well within it; an answer past it is refused rather than read into memory.
pub const MAX_ANSWER_BYTES: usize = 16 << 20;

/// Why an etcd call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EtcdError {
    #[error("no etcd endpoint given")]
    NoEndpoint,
    #[error("etcd endpoint must be http://host:port or https://host:port, got {0:?}")]
    BadEndpoint(String),
    #[error("etcd is unreachable ({0})")]
    Unreachable(String),
    #[error("etcd answered {status}: {message}")]
    Status { status: u16, message: String },
    #[error("etcd sent an answer Yutu cannot read: {0}")]
    Answer(String),
    /// The watch ended on etcd's side (canceled, or its start revision compacted).
    #[error("etcd canceled the watch: {0}")]
    WatchCanceled(String),
}

impl EtcdError {
    /// A metric label.
    pub fn kind(&self) -> &'static str {
        match self {
            EtcdError::NoEndpoint | EtcdError::BadEndpoint(_) | EtcdError::Unreachable(_) => {
                "unreachable"
            }
            EtcdError::Status { .. } => "status",
            EtcdError::Answer(_) => "answer",
            EtcdError::WatchCanceled(_) => "watch",
        }
    }

    /// The error for a non-200 answer (its body cut short for the log).
    pub fn status(status: u16, body: &[u8]) -> EtcdError {
        EtcdError::Status {
            status,
            message: String::from_utf8_lossy(body).chars().take(300).collect(),
        }
    }
}
