//! The permission check every request passes through.
//!
//! There is one function so that authentication (SigV4 access keys, bearer JWTs) plugs in
//! here and nowhere else. Until it exists the server only runs with `--no-auth`, which
//! `main` enforces at start-up, so a node is never open by accident.

use yutu_api::S3ErrorCode;

use crate::http::error::S3Error;
use crate::shard::Shard;

/// What a request wants to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    ListBuckets,
    Read,
    Write,
}

pub fn authorize(shard: &Shard, _action: Action, _bucket: Option<&str>) -> Result<(), S3Error> {
    if shard.settings.no_auth {
        Ok(())
    } else {
        Err(S3Error::new(S3ErrorCode::AccessDenied))
    }
}
