//! S3 errors as the HTTP layer answers them.

use bytes::Bytes;
use http::{header, Response, StatusCode};
use http_body_util::Full;
use yutu_api::error::{json_api, JsonError};
use yutu_api::xml::{to_xml, ErrorDoc};
use yutu_api::S3ErrorCode;

use crate::auth::AuthError;
use crate::kv::KvError;
use crate::model::StoreError;
use crate::node::sessions::PeerError;
use crate::node::{BucketError, CallError, ShardError};

/// An error response in the making: the code, a message, and what it was about.
#[derive(Debug, Clone)]
pub struct S3Error {
    pub code: S3ErrorCode,
    pub message: String,
    pub bucket: Option<String>,
    pub key: Option<String>,
    /// Extra response headers, e.g. `Content-Range: bytes */size` on a 416.
    pub headers: Vec<(header::HeaderName, String)>,
}

impl S3Error {
    pub fn new(code: S3ErrorCode) -> S3Error {
        S3Error {
            code,
            message: code.default_message().to_string(),
            bucket: None,
            key: None,
            headers: Vec::new(),
        }
    }

    pub fn msg(mut self, message: impl Into<String>) -> S3Error {
        self.message = message.into();
        self
    }

    pub fn bucket(mut self, bucket: &str) -> S3Error {
        self.bucket = Some(bucket.to_string());
        self
    }

    pub fn key(mut self, key: &str) -> S3Error {
        self.key = Some(key.to_string());
        self
    }

    /// The error response: XML on the S3 API, JSON ([`JsonError`]) on the KV and admin
    /// APIs. HEAD answers carry no body, as in S3.
    pub fn into_response(
        self,
        resource: &str,
        request_id: &str,
        head: bool,
    ) -> Response<Full<Bytes>> {
        let status =
            StatusCode::from_u16(self.code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let json = json_api(resource);
        let body = if head {
            Bytes::new()
        } else if json {
            Bytes::from(
                serde_json::to_vec(&JsonError {
                    code: self.code.code().to_string(),
                    message: self.message.clone(),
                    bucket: self.bucket.clone(),
                    key: self.key.clone(),
                    resource: resource.to_string(),
                    request_id: request_id.to_string(),
                })
                .unwrap_or_default(),
            )
        } else {
            Bytes::from(to_xml(
                "Error",
                &ErrorDoc {
                    code: self.code.code(),
                    message: &self.message,
                    bucket_name: self.bucket.as_deref(),
                    key: self.key.as_deref(),
                    resource,
                    request_id,
                },
            ))
        };
        let mut builder = Response::builder().status(status).header(
            header::CONTENT_TYPE,
            if json {
                "application/json"
            } else {
                "application/xml"
            },
        );
        if status == StatusCode::UNAUTHORIZED {
            builder = builder.header(
                header::WWW_AUTHENTICATE,
                "Bearer realm=\"yutu\", error=\"invalid_token\"",
            );
        }
        for (name, value) in self.headers {
            builder = builder.header(name, value);
        }
        builder
            .body(Full::new(body))
            .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
    }
}

impl From<StoreError> for S3Error {
    fn from(e: StoreError) -> S3Error {
        match e {
            StoreError::NoSuchBucket => S3Error::new(S3ErrorCode::NoSuchBucket),
            StoreError::NoSuchKey => S3Error::new(S3ErrorCode::NoSuchKey),
            StoreError::BucketClosing => S3Error::new(S3ErrorCode::OperationAborted)
                .msg("The bucket is being deleted; try again."),
            StoreError::TooLarge { .. } => {
                S3Error::new(S3ErrorCode::EntityTooLarge).msg(format!("{e}."))
            }
            StoreError::InvalidRange { size } => {
                let mut err = S3Error::new(S3ErrorCode::InvalidRange);
                err.headers
                    .push((header::CONTENT_RANGE, format!("bytes */{size}")));
                err
            }
            StoreError::NoSpace(_) => {
                S3Error::new(S3ErrorCode::SlowDown).msg(format!("{e}; try again."))
            }
            StoreError::PreconditionFailed => S3Error::new(S3ErrorCode::PreconditionFailed),
            // Handlers that can answer 304 do so before converting; anywhere else a "not
            // modified" outcome is a failed precondition.
            StoreError::NotModified(_) => S3Error::new(S3ErrorCode::PreconditionFailed),
            StoreError::NoSuchUpload => S3Error::new(S3ErrorCode::NoSuchUpload),
            StoreError::InvalidPart(m) => S3Error::new(S3ErrorCode::InvalidPart).msg(m),
            StoreError::InvalidPartOrder => S3Error::new(S3ErrorCode::InvalidPartOrder),
            StoreError::EntityTooSmall(m) => S3Error::new(S3ErrorCode::EntityTooSmall).msg(m),
            StoreError::BadDigest(m) => S3Error::new(S3ErrorCode::BadDigest).msg(m),
            StoreError::Conflict => S3Error::new(S3ErrorCode::ConditionalRequestConflict),
            StoreError::InsufficientStorage(m) => {
                S3Error::new(S3ErrorCode::InsufficientStorage).msg(m)
            }
            StoreError::UserLimit(m) => S3Error::new(S3ErrorCode::TooManyRequests).msg(m),
            StoreError::PutKey(m) => S3Error::new(S3ErrorCode::InvalidArgument).msg(m),
            StoreError::QuotaExceeded { .. } => {
                S3Error::new(S3ErrorCode::QuotaExceeded).msg(format!("{e}."))
            }
            StoreError::Device(_) => S3Error::new(S3ErrorCode::InternalError)
                .msg("The storage device failed or returned a corrupt record; the bytes were not served."),
        }
    }
}

/// An invalid object key: too long, or not a key at all.
pub fn key_error(e: yutu_api::KeyError) -> S3Error {
    let code = match e {
        yutu_api::KeyError::TooLong(_) => S3ErrorCode::KeyTooLongError,
        _ => S3ErrorCode::InvalidArgument,
    };
    S3Error::new(code).msg(format!("{e}."))
}

impl From<KvError> for S3Error {
    fn from(e: KvError) -> S3Error {
        match e {
            KvError::Invalid(m) => S3Error::new(S3ErrorCode::InvalidArgument).msg(m),
            KvError::Key(e) => key_error(e),
            KvError::TooLarge(m) => S3Error::new(S3ErrorCode::EntityTooLarge).msg(m),
            KvError::Store { error, key } => {
                let err = S3Error::from(error);
                match key {
                    Some(k) => err.key(&k),
                    None => err,
                }
            }
            KvError::Pin(m) => S3Error::new(S3ErrorCode::InvalidRequest).msg(m),
            KvError::Refused(e) => {
                let code = match e {
                    PeerError::NodeTaken(_) => S3ErrorCode::OperationAborted,
                    PeerError::TooManyForUser(_) | PeerError::Full(_) | PeerError::Busy(_) => {
                        S3ErrorCode::TooManyRequests
                    }
                };
                S3Error::new(code).msg(format!("Refused: {e}."))
            }
            KvError::Unproven(m) => S3Error::new(S3ErrorCode::AccessDenied).msg(m),
            KvError::NoEngine => S3Error::new(S3ErrorCode::ServiceUnavailable),
            KvError::Transfer(m) => S3Error::new(S3ErrorCode::InternalError).msg(m),
            KvError::Shard(e) => e.into(),
            KvError::Internal(why) => {
                tracing::error!(why, "KV call");
                S3Error::new(S3ErrorCode::InternalError)
            }
        }
    }
}

impl From<ShardError> for S3Error {
    fn from(e: ShardError) -> S3Error {
        tracing::error!(error = %e, "shard mesh failure");
        S3Error::new(S3ErrorCode::InternalError)
    }
}

impl From<CallError> for S3Error {
    fn from(e: CallError) -> S3Error {
        match e {
            CallError::Shard(e) => e.into(),
            CallError::Store(e) => e.into(),
        }
    }
}

impl From<AuthError> for S3Error {
    fn from(e: AuthError) -> S3Error {
        let err = S3Error::new(e.code);
        match e.message {
            Some(m) => err.msg(m),
            None => err,
        }
    }
}

impl From<BucketError> for S3Error {
    fn from(e: BucketError) -> S3Error {
        match e {
            BucketError::AlreadyOwned => S3Error::new(S3ErrorCode::BucketAlreadyOwnedByYou),
            BucketError::AlreadyExists => S3Error::new(S3ErrorCode::BucketAlreadyExists),
            BucketError::NoSuchBucket => S3Error::new(S3ErrorCode::NoSuchBucket),
            BucketError::NotEmpty => S3Error::new(S3ErrorCode::BucketNotEmpty),
            BucketError::Conflict => S3Error::new(S3ErrorCode::OperationAborted),
            BucketError::Shard(s) => s.into(),
            BucketError::Catalog(e) => {
                tracing::error!(error = %e, "bucket catalog");
                S3Error::new(S3ErrorCode::InternalError)
                    .msg("The bucket catalog could not be written.")
            }
        }
    }
}
