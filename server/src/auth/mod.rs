//! Who sent a request, and whether they may do what it asks.
//!
//! [`authenticate`] checks bearer tokens ([`tokens`]) and AWS signatures (SigV4 header and
//! presigned, SigV2 header and presigned, aws-chunked payload signatures) and yields an
//! [`Identity`]; [`policy`] decides
//! what that identity may do to a bucket. Both answer with an [`AuthError`] carrying the S3
//! error code the HTTP layer returns.

pub mod authenticate;
pub mod chunked;
pub mod local_key;
pub mod policy;
pub mod sigv2;
pub mod sigv4;
pub mod tokens;

pub use policy::{
    authorize, authorize_object, authorize_with_acl, can_see, object_allows, Action, Gate, Identity,
};

use yutu_api::S3ErrorCode;

/// Why a request is refused, as an S3 error code and an optional message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code:?}: {}", message.as_deref().unwrap_or(code.default_message()))]
pub struct AuthError {
    pub code: S3ErrorCode,
    pub message: Option<String>,
}

impl AuthError {
    pub fn new(code: S3ErrorCode) -> AuthError {
        AuthError {
            code,
            message: None,
        }
    }

    pub fn msg(mut self, message: impl Into<String>) -> AuthError {
        self.message = Some(message.into());
        self
    }
}
