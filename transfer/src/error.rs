//! The engine's error type and the refusals a target sends back.
//!
//! Errors are `Clone` because a batch's outcome can be looked at more than once (polled, then
//! awaited) and one failure can belong to several slices of a request; I/O errors are kept
//! behind an `Arc` for that. The split that matters to callers is [`TransferError::is_retryable`]:
//! a refusal (bad token, out of bounds, unknown segment) is the target's decision and every path
//! would get the same answer, so it is reported at once; an I/O or protocol failure belongs to
//! one path, so the request is tried on the next one first.

use std::fmt;
use std::io;
use std::sync::Arc;

use crate::descriptor::{DescriptorError, NodeId, SegmentId};
use crate::kind::TransportKind;
use crate::region::RegionError;

pub mod rdma;

use rdma::RdmaError;

/// Which side of a request a bounds error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The caller's own registered segment.
    Local,
    /// The range the remote descriptor grants.
    Remote,
}

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Side::Local => "the local segment",
            Side::Remote => "the remote descriptor",
        })
    }
}

/// Why a target refused a request. Travels as one byte on every transport's control channel;
/// permanent, so never retried on another path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[repr(u8)]
pub enum Refusal {
    #[error("the descriptor names another node")]
    WrongNode = 1,
    #[error("no such segment is registered (or it was unregistered)")]
    UnknownSegment = 2,
    #[error("the access token does not authorise this range")]
    BadToken = 3,
    #[error("the range is outside the descriptor or the segment")]
    OutOfBounds = 4,
    #[error("the segment is not shared over shared memory (its memfd cannot be sealed)")]
    NotShareable = 5,
    #[error("the request is larger than the transport's frame limit")]
    TooLarge = 6,
    #[error("malformed request")]
    BadRequest = 7,
    #[error("the range is no longer granted (its lease expired or was released)")]
    Expired = 8,
    #[error("the descriptor does not grant this access (a read lease cannot be written)")]
    WrongAccess = 9,
    /// Answer to a proof challenge (see `proof.rs`) from a node this engine shares no secret
    /// with.
    #[error("the engine does not answer proof challenges from this node (no shared secret)")]
    Untrusted = 10,
    /// The segment is GPU memory, which only an RDMA NIC reaches (GPUDirect): the initiator
    /// tries its next path instead of failing the request.
    #[error("the segment is GPU memory, reachable over rdma only")]
    DeviceMemory = 11,
}

impl Refusal {
    /// The wire byte (0 means success and is never a refusal).
    pub fn code(self) -> u8 {
        self as u8
    }

    /// Parses a wire byte; `None` for 0 (success) and for codes this version does not know.
    pub fn from_code(code: u8) -> Option<Refusal> {
        Some(match code {
            1 => Refusal::WrongNode,
            2 => Refusal::UnknownSegment,
            3 => Refusal::BadToken,
            4 => Refusal::OutOfBounds,
            5 => Refusal::NotShareable,
            6 => Refusal::TooLarge,
            7 => Refusal::BadRequest,
            8 => Refusal::Expired,
            9 => Refusal::WrongAccess,
            10 => Refusal::Untrusted,
            11 => Refusal::DeviceMemory,
            _ => return None,
        })
    }
}

/// Everything that can go wrong in the transfer engine.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TransferError {
    #[error(transparent)]
    Region(#[from] RegionError),
    #[error(transparent)]
    Descriptor(#[from] DescriptorError),
    #[error(transparent)]
    Rdma(#[from] RdmaError),
    /// A request's range does not fit the memory it names; found at submit, nothing moved.
    #[error("request {index}: bytes {offset}..{offset}+{len} are outside {side} ({limit} bytes)")]
    OutOfBounds {
        index: usize,
        side: Side,
        offset: u64,
        len: u64,
        limit: u64,
    },
    /// The descriptor names a node this engine has no address for ([`crate::TransferEngine::add_peer`]).
    #[error("request {index}: node {node} is not a known peer")]
    UnknownPeer { index: usize, node: NodeId },
    /// The local segment was registered with another engine (its RDMA keys and its mapping
    /// belong to that one).
    #[error("request {index}: local segment {segment} is not registered with this engine")]
    ForeignSegment { index: usize, segment: SegmentId },
    /// The target checked the request and said no.
    #[error("node {node} refused access to segment {segment}: {reason}")]
    Refused {
        node: NodeId,
        segment: SegmentId,
        reason: Refusal,
    },
    /// The path broke (connection refused or reset, timeout, short read).
    #[error("{transport} to node {node}: {source}")]
    Io {
        transport: TransportKind,
        node: NodeId,
        #[source]
        source: Arc<io::Error>,
    },
    /// The peer answered something this engine does not understand.
    #[error("{transport} to node {node}: protocol error: {message}")]
    Protocol {
        transport: TransportKind,
        node: NodeId,
        message: String,
    },
    /// This path cannot be used with this peer (not offered, not compiled in, no device).
    #[error("{transport} to node {node} is unavailable: {reason}")]
    Unavailable {
        transport: TransportKind,
        node: NodeId,
        reason: String,
    },
    /// The two ends share no transport at all.
    #[error("node {node} shares no transport with this engine")]
    NoPath { node: NodeId },
    /// Every shared path was tried and failed; the attempts are listed in order.
    #[error("node {node}: every path failed: {}", Attempts(attempts))]
    AllPathsFailed {
        node: NodeId,
        attempts: Vec<(TransportKind, TransferError)>,
    },
    /// Starting the engine failed (binding a listener, creating its socket directory...).
    #[error("cannot {what}: {source}")]
    Setup {
        what: String,
        #[source]
        source: Arc<io::Error>,
    },
    /// The engine is shutting down and no longer takes batches.
    #[error("the transfer engine has shut down")]
    Shutdown,
    /// GPU memory can only be registered where the NIC can reach it: with the rdma transport
    /// running and the memory registered with it (GPUDirect RDMA).
    #[error("cannot register GPU memory for GPUDirect RDMA: {reason}")]
    DeviceMemory { reason: String },
}

impl TransferError {
    /// True when another path might succeed where this one failed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            TransferError::Io { .. }
                | TransferError::Protocol { .. }
                | TransferError::Unavailable { .. }
                | TransferError::Rdma(_)
        )
    }

    pub(crate) fn io(transport: TransportKind, node: NodeId, source: io::Error) -> Self {
        TransferError::Io {
            transport,
            node,
            source: Arc::new(source),
        }
    }

    pub(crate) fn protocol(
        transport: TransportKind,
        node: NodeId,
        message: impl Into<String>,
    ) -> Self {
        TransferError::Protocol {
            transport,
            node,
            message: message.into(),
        }
    }

    pub(crate) fn unavailable(
        transport: TransportKind,
        node: NodeId,
        reason: impl Into<String>,
    ) -> Self {
        TransferError::Unavailable {
            transport,
            node,
            reason: reason.into(),
        }
    }

    pub(crate) fn setup(what: impl Into<String>, source: io::Error) -> Self {
        TransferError::Setup {
            what: what.into(),
            source: Arc::new(source),
        }
    }
}

/// Formats the attempts of [`TransferError::AllPathsFailed`] as `tcp: ...; shm: ...`.
struct Attempts<'a>(&'a [(TransportKind, TransferError)]);

impl fmt::Display for Attempts<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (kind, err)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{kind}: {err}")?;
        }
        Ok(())
    }
}
