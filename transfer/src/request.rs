//! One transfer of a batch: a local range, a remote range, a direction.

use crate::descriptor::SegmentDescriptor;
use crate::segment::LocalSegment;

/// The direction of a one-sided transfer, seen from the initiator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TransferOp {
    /// Remote bytes into the local segment.
    Read,
    /// Local bytes into the remote segment.
    Write,
}

/// Moves `len` bytes between `local` at `local_offset` and the remote range that `remote`
/// grants, starting `remote_offset` bytes into it.
///
/// The descriptor is sent as granted (its token covers exactly its range) and the part of it to
/// move is given separately, so one descriptor can serve several requests, e.g. a large object
/// fetched in pieces.
#[derive(Clone, Debug)]
pub struct TransferRequest {
    pub op: TransferOp,
    pub local: LocalSegment,
    pub local_offset: u64,
    pub remote: SegmentDescriptor,
    pub remote_offset: u64,
    pub len: u64,
}

impl TransferRequest {
    /// Reads the whole range of `remote` into `local` at `local_offset`.
    pub fn read(local: &LocalSegment, local_offset: u64, remote: &SegmentDescriptor) -> Self {
        TransferRequest {
            op: TransferOp::Read,
            local: local.clone(),
            local_offset,
            remote: *remote,
            remote_offset: 0,
            len: remote.len,
        }
    }

    /// Writes `remote.len` bytes of `local` from `local_offset` into the whole range of `remote`.
    pub fn write(local: &LocalSegment, local_offset: u64, remote: &SegmentDescriptor) -> Self {
        TransferRequest {
            op: TransferOp::Write,
            ..TransferRequest::read(local, local_offset, remote)
        }
    }

    /// Narrows the request to `len` bytes starting `remote_offset` bytes into the descriptor.
    pub fn range(mut self, remote_offset: u64, len: u64) -> Self {
        self.remote_offset = remote_offset;
        self.len = len;
        self
    }
}
