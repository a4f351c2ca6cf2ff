//! Who may do what: the permission check every request passes through.
//!
//! Authentication (SigV4 header or presigned URL, see `s3::authenticate`) yields an
//! [`Identity`]; this module decides whether that identity may perform an action on a bucket.
//! A bucket belongs to the user who created it; other users need a grant in their `[[users]]`
//! table (`read`/`write` lists, `*` for all) or `admin = true`. With `--no-auth` everything is
//! allowed.

use std::sync::Arc;

use yutu_api::S3ErrorCode;

use super::AuthError;
use crate::config::User;

/// Who sent a request.
#[derive(Debug, Clone)]
pub enum Identity {
    /// `--no-auth`: no credentials are checked and everything is allowed.
    Open,
    User(Arc<User>),
}

impl Identity {
    /// The name recorded as a new bucket's owner.
    pub fn name(&self) -> &str {
        match self {
            Identity::Open => "",
            Identity::User(u) => &u.name,
        }
    }
}

/// What a request wants to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    ListBuckets,
    CreateBucket,
    DeleteBucket,
    Read,
    Write,
}

fn granted(list: &[String], bucket: &str) -> bool {
    list.iter().any(|b| b == "*" || b == bucket)
}

/// Whether `who` may see a bucket owned by `owner` in ListBuckets.
pub fn can_see(who: &Identity, bucket: &str, owner: &str) -> bool {
    match who {
        Identity::Open => true,
        Identity::User(u) => {
            u.admin || u.name == owner || granted(&u.read, bucket) || granted(&u.write, bucket)
        }
    }
}

/// Whether `who` may perform `action` on `bucket`, owned by `owner` (`None`: the bucket does
/// not exist, which the operation itself reports).
pub fn authorize(
    who: &Identity,
    action: Action,
    bucket: Option<&str>,
    owner: Option<&str>,
) -> Result<(), AuthError> {
    let Identity::User(user) = who else {
        return Ok(());
    };
    if user.admin || matches!(action, Action::ListBuckets | Action::CreateBucket) {
        return Ok(());
    }
    let Some(bucket) = bucket else {
        return Ok(());
    };
    // A bucket that does not exist is reported as such by the operation itself.
    let Some(owner) = owner else {
        return Ok(());
    };
    let allowed = owner == user.name
        || match action {
            Action::Read => granted(&user.read, bucket) || granted(&user.write, bucket),
            Action::Write => granted(&user.write, bucket),
            _ => false,
        };
    if allowed {
        Ok(())
    } else {
        Err(AuthError::new(S3ErrorCode::AccessDenied))
    }
}
