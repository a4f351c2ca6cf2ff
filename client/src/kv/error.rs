//! What can go wrong in a KV call ([`KvError`]).

use yutu_transfer::{RegionError, TransferError};

use super::device::BlockFailures;
use crate::ClientError;

/// What can go wrong in a KV call.
#[derive(Debug, thiserror::Error)]
pub enum KvError {
    /// The HTTP side: an S3 error from the server, a transport failure, a bad URL, or an
    /// answer this client cannot read.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// Moving the bytes failed (or the engine could not start).
    #[error("transfer failed: {0}")]
    Transfer(#[from] TransferError),
    /// Allocating a buffer, or reading or writing it out of bounds.
    #[error("buffer: {0}")]
    Region(#[from] RegionError),
    /// The arguments do not fit together (lengths differ, ranges outside the buffer...);
    /// caught before anything is sent.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The server answered with success, but with something that does not match the request.
    #[error("invalid response from server: {0}")]
    InvalidResponse(String),
    /// A device (GPU) call failed: no driver, memory that is not the device's, a failed copy.
    #[error("device: {0}")]
    Device(#[from] yutu_transfer::device::DeviceError),
    /// Some blocks of a staged (device) batch failed and the others were moved: which
    /// failed, why, and the others' results.
    #[error("{0}")]
    Blocks(Box<BlockFailures>),
    /// Every staging buffer stayed in use by other threads for too long.
    #[error("busy: {0}")]
    Busy(String),
}

impl KvError {
    /// The S3 error code, when the server sent one.
    pub fn code(&self) -> Option<&str> {
        match self {
            KvError::Client(e) => e.code(),
            _ => None,
        }
    }
}
