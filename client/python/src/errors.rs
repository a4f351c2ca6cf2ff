//! Errors of the extension and the Python exceptions they become.
//!
//! The exception classes are defined in Python (`yutu/_errors.py`), so that they can inherit
//! from built-in ones (`InvalidArgument` is also a `ValueError`) and be caught without
//! importing the extension. Every raised exception carries the node's S3 error code in
//! `.code` (`None` when the failure was not the node's answer) and the node's message.

use pyo3::prelude::*;
use pyo3::types::PyTuple;
use yutu_client::kv::KvError;
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
}

impl Error {
    pub fn invalid(msg: impl Into<String>) -> Error {
        Error::InvalidArgument(msg.into())
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
            let msg = e.to_string();
            let make = || -> PyResult<PyErr> {
                let cls = py.import("yutu._errors")?.getattr(e.class())?;
                let args = PyTuple::new(py, [msg.clone()])?;
                let inst = cls.call1(args)?;
                inst.setattr("code", code.clone())?;
                Ok(PyErr::from_value(inst))
            };
            // Only when the package itself is broken: still an exception, never a crash.
            make().unwrap_or_else(|err| err)
        })
    }
}

/// The results of the extension's functions.
pub type Result<T> = std::result::Result<T, Error>;
