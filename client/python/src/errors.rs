//! Errors of the extension and the Python exceptions they become.
//!
//! The exception classes are defined in Python (`yutu/_errors.py`), so that they can inherit
//! from built-in ones (`InvalidArgument` is also a `ValueError`) and be caught without
//! importing the extension. Every raised exception carries the node's S3 error code in
//! `.code` (`None` when the failure was not the node's answer) and the node's message; a
//! `TransferError` for a batch whose blocks failed only in part also carries `.failed`, the
//! indices of those blocks in the caller's batch.

use pyo3::prelude::*;
use pyo3::types::PyTuple;
use yutu_client::kv::{DeviceError, KvError};
use yutu_client::ClientError;

/// What a call of the extension can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Kv(#[from] KvError),
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The caller's arguments, caught before anything was sent.
    #[error("{0}")]
    InvalidArgument(String),
    /// A key a single-key read named is absent.
    #[error("{0}")]
    NotFound(String),
    /// A call on a store after `close()`.
    #[error("the store is closed")]
    Closed,
    /// No staging buffer came free in time (every one busy with other threads' calls).
    #[error("{0}")]
    Busy(String),
    /// A GPU could not be opened or used (`name` is `cuda:N`, or `host:N` for the test
    /// stand-in).
    #[error("{name}: {source}")]
    Device { name: String, source: DeviceError },
    /// Some blocks of a batch were not moved: each failed block's index in the caller's batch
    /// and why. The others were moved (a get's lengths are lost with the exception).
    #[error("{}", blocks_message(failed, *total))]
    Blocks {
        failed: Vec<(usize, String)>,
        total: usize,
    },
}

/// "3 of 64 blocks failed (block 3: ...; blocks 9-10: ...)": runs of consecutive blocks that
/// failed for one reason are named together, at most four runs.
fn blocks_message(failed: &[(usize, String)], total: usize) -> String {
    let mut runs: Vec<(usize, usize, &str)> = Vec::new();
    for (i, why) in failed {
        match runs.last_mut() {
            Some((_, end, w)) if *end + 1 == *i && *w == why.as_str() => *end = *i,
            _ => runs.push((*i, *i, why)),
        }
    }
    let shown: Vec<String> = runs
        .iter()
        .take(4)
        .map(|&(a, b, why)| {
            if a == b {
                format!("block {a}: {why}")
            } else {
                format!("blocks {a}-{b}: {why}")
            }
        })
        .collect();
    let more = if runs.len() > shown.len() {
        "; ..."
    } else {
        ""
    };
    format!(
        "{} of {total} blocks failed ({}{more})",
        failed.len(),
        shown.join("; ")
    )
}

impl Error {
    pub fn invalid(msg: impl Into<String>) -> Error {
        Error::InvalidArgument(msg.into())
    }

    /// The indices of the blocks that failed, for a partial failure (`.failed` in Python).
    fn failed(&self) -> Option<Vec<usize>> {
        match self {
            Error::Blocks { failed, .. } => Some(failed.iter().map(|(i, _)| *i).collect()),
            Error::Kv(KvError::Blocks(f)) => Some(f.failed.iter().map(|(i, _)| *i).collect()),
            _ => None,
        }
    }

    /// The node's S3 error code, when the node answered with one.
    fn code(&self) -> Option<&str> {
        match self {
            Error::Kv(e) => e.code(),
            Error::Client(e) => e.code(),
            Error::NotFound(_) => Some("NoSuchKey"),
            _ => None,
        }
    }

    /// The name of the Python exception class in `yutu._errors`.
    fn class(&self) -> &'static str {
        if let Some(code) = self.code() {
            return class_of_code(code);
        }
        match self {
            Error::InvalidArgument(_) => "InvalidArgument",
            Error::Closed => "Closed",
            Error::NotFound(_) => "NotFound",
            Error::Busy(_) => "Busy",
            Error::Device { .. } => "DeviceError",
            Error::Blocks { .. } => "TransferError",
            Error::Kv(KvError::InvalidArgument(_) | KvError::Region(_)) => "InvalidArgument",
            Error::Kv(KvError::Transfer(_) | KvError::Blocks(_)) => "TransferError",
            Error::Kv(KvError::Device(_)) => "DeviceError",
            Error::Kv(KvError::Busy(_)) => "Busy",
            Error::Kv(KvError::Client(e)) | Error::Client(e) => class_of_client(e),
            Error::Kv(KvError::InvalidResponse(_)) => "Error",
        }
    }
}

fn class_of_client(e: &ClientError) -> &'static str {
    match e {
        ClientError::Transport(_) | ClientError::Io(_) => "Unavailable",
        ClientError::InvalidUrl { .. } | ClientError::InvalidArgument(_) => "InvalidArgument",
        _ => "Error",
    }
}

/// The exception for each S3 error code a node answers with.
fn class_of_code(code: &str) -> &'static str {
    match code {
        "NoSuchKey" => "NotFound",
        "NoSuchBucket" => "BucketNotFound",
        "InsufficientStorage" | "QuotaExceeded" => "NoSpace",
        "AccessDenied"
        | "InvalidToken"
        | "ExpiredToken"
        | "SignatureDoesNotMatch"
        | "InvalidAccessKeyId"
        | "RequestTimeTooSkewed"
        | "AuthorizationHeaderMalformed" => "AuthError",
        "SlowDown" | "ServiceUnavailable" | "TooManyRequests" | "RequestTimeout" => "Busy",
        "InvalidArgument" | "InvalidRequest" | "EntityTooLarge" | "KeyTooLongError"
        | "InvalidBucketName" | "InvalidRange" => "InvalidArgument",
        _ => "Error",
    }
}

impl From<Error> for PyErr {
    fn from(e: Error) -> PyErr {
        Python::attach(|py| {
            let code = e.code().map(str::to_string);
            let failed = e.failed();
            let msg = e.to_string();
            let make = || -> PyResult<PyErr> {
                let cls = py.import("yutu._errors")?.getattr(e.class())?;
                let args = PyTuple::new(py, [msg.clone()])?;
                let inst = cls.call1(args)?;
                inst.setattr("code", code.clone())?;
                if let Some(failed) = &failed {
                    inst.setattr("failed", failed.clone())?;
                }
                Ok(PyErr::from_value(inst))
            };
            // Only when the package itself is broken: still an exception, never a crash.
            make().unwrap_or_else(|err| err)
        })
    }
}

/// The results of the extension's functions.
pub type Result<T> = std::result::Result<T, Error>;
