//! The transports behind one trait, and what they are handed to execute.
//!
//! A [`Transport`] is the process-wide part of a path (the rdma device context, the shm
//! mapping cache); a [`Lane`] is one worker thread's private part (its connections, its queue
//! pairs). Each worker owns one lane per transport, so a lane needs no locks and several
//! workers spread one large transfer over several connections. A lane executes a list of
//! [`SliceOp`]s bound for one peer and reports each one's outcome; the worker retries the
//! failed-but-retryable ones on the next path.

use crate::address::NodeAddress;
use crate::descriptor::{NodeId, SegmentDescriptor, SegmentId};
use crate::error::TransferError;
use crate::request::TransferOp;
use crate::segment::LocalSegment;

pub use crate::kind::TransportKind;

pub(crate) mod deadline;
pub mod rdma;
pub(crate) mod serve;
pub mod shm;
pub mod tcp;

/// One contiguous piece of a request (a whole small request, or one slice of a large one).
/// Its ranges were checked against the local segment and the descriptor at submit.
#[derive(Clone, Debug)]
pub struct SliceOp {
    /// Index of the request in its batch.
    pub request: usize,
    pub op: TransferOp,
    pub local: LocalSegment,
    pub local_offset: u64,
    pub remote: SegmentDescriptor,
    /// Offset of this piece within the descriptor's range.
    pub remote_offset: u64,
    pub len: u64,
}

impl SliceOp {
    /// The local bytes of this piece, for the CPU to copy (refused for GPU memory).
    pub(crate) fn local_ptr(&self) -> Result<*mut u8, TransferError> {
        Ok(self.local.region().range_ptr(self.local_offset, self.len)?)
    }

    /// The address of this piece's local bytes for the NIC (host or GPU memory).
    #[cfg_attr(not(feature = "rdma"), allow(dead_code))]
    pub(crate) fn local_addr(&self) -> Result<*mut u8, TransferError> {
        Ok(self
            .local
            .region()
            .range_addr(self.local_offset, self.len)?)
    }

    /// The piece's length as a `usize`; submit refused anything larger than a region, which is
    /// a `usize`, so this cannot fail for a validated op.
    pub(crate) fn len_usize(&self) -> usize {
        usize::try_from(self.len).unwrap_or(usize::MAX)
    }
}

/// A way to move bytes, shared by all workers of an engine.
pub trait Transport: Send + Sync {
    fn kind(&self) -> TransportKind;

    /// A segment was registered with the engine (rdma registers it with the NIC here).
    fn register(&self, _segment: &LocalSegment) -> Result<(), TransferError> {
        Ok(())
    }

    /// A segment was unregistered.
    fn unregister(&self, _segment: SegmentId) {}

    /// Drops process-wide state about a peer (shm mappings).
    fn forget_peer(&self, _node: NodeId) {}

    /// A new worker's private state for this transport.
    fn lane(&self) -> Box<dyn Lane>;
}

/// One worker's private end of a transport.
pub trait Lane {
    /// Executes `ops` (all bound for `peer`) and returns one outcome per op, in order.
    fn execute(&mut self, peer: &NodeAddress, ops: &[SliceOp]) -> Vec<Result<(), TransferError>>;

    /// Drops connections and other state kept for `node`.
    fn forget(&mut self, _node: NodeId) {}
}
