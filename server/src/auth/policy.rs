//! Who may do what: the one permission check every request passes through.
//!
//! Authentication yields an [`Identity`]: a `[[users]]` entry (SigV4/SigV2 access keys), a
//! bearer token's claims, or `Open` under `--no-auth`. [`authorize`] decides for all of them,
//! so the S3 API, the KV API, presigned URLs and the admin API cannot disagree:
//!
//! - A **user** owns the buckets it creates; other buckets need a grant in its table (`read`
//!   allows read and list, `write` also write and delete; a name, a `prefix*`, or `*` for
//!   all) or `admin = true`.
//! - A **token** owns nothing: it may do exactly what its scopes say, per bucket name or
//!   prefix (`r`ead, `w`rite, `d`elete, `l`ist), or everything with `admin`. Creating a bucket
//!   needs `w` on its name, deleting it `d`.

use std::sync::Arc;

use yutu_api::token::{Access, Claims};
use yutu_api::S3ErrorCode;

use super::AuthError;
use crate::config::User;

/// Who sent a request.
#[derive(Debug, Clone)]
pub enum Identity {
    /// `--no-auth`: no credentials are checked and everything is allowed.
    Open,
    User(Arc<User>),
    Token(Arc<Claims>),
}

impl Identity {
    /// The name recorded as a new bucket's owner and as the holder of leases and puts.
    pub fn name(&self) -> &str {
        match self {
            Identity::Open => "",
            Identity::User(u) => &u.name,
            Identity::Token(c) => &c.sub,
        }
    }

    /// Whether the admin API is open to it.
    pub fn is_admin(&self) -> bool {
        match self {
            Identity::Open => true,
            Identity::User(u) => u.admin,
            Identity::Token(c) => c.admin,
        }
    }
}

/// What a request wants to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    ListBuckets,
    CreateBucket,
    DeleteBucket,
    /// Read objects or blocks (GET, HEAD, KV get and exists, a copy's source).
    Read,
    /// List a bucket's keys, uploads or parts, or ask whether it exists.
    List,
    /// Write objects or blocks (PUT, copy, multipart, KV puts).
    Write,
    /// Delete objects or blocks.
    Delete,
}

impl Action {
    /// The scope letter a token needs for it (`None`: no bucket scope involved).
    fn needs(self) -> Option<Access> {
        let one = |f: fn(&mut Access)| {
            let mut a = Access::default();
            f(&mut a);
            Some(a)
        };
        match self {
            Action::ListBuckets => None,
            Action::Read => one(|a| a.read = true),
            Action::List => one(|a| a.list = true),
            Action::Write | Action::CreateBucket => one(|a| a.write = true),
            Action::Delete | Action::DeleteBucket => one(|a| a.delete = true),
        }
    }
}

/// Whether a grant list names `bucket`: exactly, or as a prefix ending in `*` (`*` alone is
/// every bucket), as a token's bucket scopes do.
fn granted(list: &[String], bucket: &str) -> bool {
    list.iter().any(|b| match b.strip_suffix('*') {
        Some(prefix) => bucket.starts_with(prefix),
        None => b == bucket,
    })
}

/// Whether `who` may see a bucket owned by `owner` in ListBuckets.
pub fn can_see(who: &Identity, bucket: &str, owner: &str) -> bool {
    match who {
        Identity::Open => true,
        Identity::User(u) => {
            u.admin || u.name == owner || granted(&u.read, bucket) || granted(&u.write, bucket)
        }
        Identity::Token(c) => c.access(bucket) != Access::default(),
    }
}

/// Whether `who` may perform `action` on `bucket`, owned by `owner` (`None`: the bucket does
/// not exist, which the operation itself reports; a token is still checked, so it learns
/// nothing about buckets outside its scopes).
pub fn authorize(
    who: &Identity,
    action: Action,
    bucket: Option<&str>,
    owner: Option<&str>,
) -> Result<(), AuthError> {
    let allowed = match who {
        Identity::Open => true,
        Identity::Token(claims) => match (action.needs(), bucket) {
            (None, _) => true,
            (Some(need), Some(bucket)) => claims.access(bucket).covers(need),
            (Some(_), None) => claims.admin,
        },
        Identity::User(user) => {
            if user.admin || matches!(action, Action::ListBuckets | Action::CreateBucket) {
                true
            } else {
                match (bucket, owner) {
                    // A bucket that does not exist is reported as such by the operation.
                    (None, _) | (_, None) => true,
                    (Some(bucket), Some(owner)) => {
                        owner == user.name
                            || match action {
                                Action::Read | Action::List => {
                                    granted(&user.read, bucket) || granted(&user.write, bucket)
                                }
                                Action::Write | Action::Delete => granted(&user.write, bucket),
                                _ => false,
                            }
                    }
                }
            }
        }
    };
    if allowed {
        Ok(())
    } else {
        Err(AuthError::new(S3ErrorCode::AccessDenied))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use yutu_api::token::BucketScope;

    fn token(scopes: &[&str], admin: bool) -> Identity {
        Identity::Token(Arc::new(Claims {
            admin,
            buckets: scopes
                .iter()
                .map(|s| BucketScope::parse(s).unwrap())
                .collect(),
            ..Claims::new("t", std::time::Duration::from_secs(60))
        }))
    }

    #[test]
    fn a_token_may_do_what_its_scopes_say_and_nothing_else() {
        let t = token(&["a:rl", "w-*:w"], false);
        let ok = |action, bucket| authorize(&t, action, Some(bucket), Some("someone")).is_ok();
        assert!(ok(Action::Read, "a") && ok(Action::List, "a"));
        assert!(!ok(Action::Write, "a") && !ok(Action::Delete, "a"));
        assert!(!ok(Action::Read, "b") && !ok(Action::List, "ab"));
        assert!(ok(Action::Write, "w-1") && ok(Action::CreateBucket, "w-2"));
        assert!(!ok(Action::Read, "w-1") && !ok(Action::DeleteBucket, "w-1"));
        // Missing buckets are checked too: the token learns nothing outside its scopes.
        assert!(authorize(&t, Action::Read, Some("b"), None).is_err());
        assert!(authorize(&t, Action::ListBuckets, None, None).is_ok());
        assert!(can_see(&t, "a", "x") && !can_see(&t, "b", "x"));
        let admin = token(&[], true);
        assert!(authorize(&admin, Action::Delete, Some("any"), Some("x")).is_ok());
        assert!(admin.is_admin() && !t.is_admin());
    }

    #[test]
    fn users_keep_ownership_and_grants() {
        let u = Identity::User(Arc::new(User {
            name: "bob".into(),
            access_key: "K".into(),
            secret_key: "secret-key".into(),
            admin: false,
            read: vec!["r".into(), "shared-*".into()],
            write: vec!["w".into()],
        }));
        let ok = |action, bucket| authorize(&u, action, Some(bucket), Some("alice")).is_ok();
        assert!(authorize(&u, Action::Delete, Some("mine"), Some("bob")).is_ok());
        assert!(ok(Action::Read, "r") && ok(Action::List, "r") && !ok(Action::Write, "r"));
        assert!(ok(Action::Write, "w") && ok(Action::Delete, "w"));
        assert!(!ok(Action::Read, "other"));
        assert!(ok(Action::List, "shared-x") && !ok(Action::Write, "shared-x"));
        assert!(!ok(Action::Read, "shared"));
    }
}
