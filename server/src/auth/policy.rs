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
//! - An **anonymous** request (no credentials, on a node with authentication on) may do only
//!   what an ACL grants `AllUsers`.
//! - A **bucket policy** comes first: a statement that denies the request refuses it whatever
//!   else allows it (its owner too), one that allows it admits it whatever else does not
//!   (`http::bucket_policy` works out which, with the public access block).
//! - **ACLs** add to all of the above, never take away: a bucket's grants (`READ`: list,
//!   `WRITE`: write and delete objects, `READ_ACP`/`WRITE_ACP`: its ACL) to a user by name,
//!   to `AuthenticatedUsers` (any user or token) or to `AllUsers` (anonymous too). An
//!   object's grants decide reading it and its ACL when nothing at the bucket level does
//!   ([`Gate::Object`]): those are checked where the object is, once its metadata is read.

use std::sync::Arc;

use yutu_api::acl::{Acl, Permission, Principal};
use yutu_api::bucket_policy::Decision;
use yutu_api::token::{Access, Claims};
use yutu_api::S3ErrorCode;

use super::AuthError;
use crate::config::User;

/// What a token's principal name starts with (see [`Identity::name`]).
pub const TOKEN_PREFIX: &str = "token:";

/// Who sent a request.
#[derive(Debug, Clone)]
pub enum Identity {
    /// `--no-auth`: no credentials are checked and everything is allowed.
    Open,
    User(Arc<User>),
    Token(Arc<Claims>),
    /// No credentials, with authentication on: only what ACLs grant `AllUsers`.
    Anonymous,
}

impl Identity {
    /// The name recorded as a new bucket's or object's owner and as the holder of leases and
    /// puts. A token's is [`TOKEN_PREFIX`] and its subject, never a user's name (user names
    /// cannot hold a `:`), so a token whose `sub` is named like a user can neither end, revoke
    /// nor release that user's puts and leases, nor own what the user owns.
    pub fn name(&self) -> std::borrow::Cow<'_, str> {
        match self {
            Identity::Open | Identity::Anonymous => "".into(),
            Identity::User(u) => u.name.as_str().into(),
            Identity::Token(c) => format!("{TOKEN_PREFIX}{}", c.sub).into(),
        }
    }

    /// The caller as ACL grants see it: a user by name; a token only as an authenticated
    /// caller (it owns nothing, whatever its subject is called).
    pub fn principal(&self) -> Principal<'_> {
        match self {
            Identity::Anonymous => Principal::Anonymous,
            Identity::User(u) => Principal::User(&u.name),
            Identity::Open | Identity::Token(_) => Principal::Authenticated,
        }
    }

    /// Whether the admin API is open to it.
    pub fn is_admin(&self) -> bool {
        match self {
            Identity::Open => true,
            Identity::User(u) => u.admin,
            Identity::Token(c) => c.admin,
            Identity::Anonymous => false,
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
    /// Read a bucket's or an object's ACL.
    ReadAcl,
    /// Change a bucket's or an object's ACL.
    WriteAcl,
    /// Read or change a bucket's configuration (CORS): its owner's, or an admin's.
    Configure,
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
            Action::Write | Action::CreateBucket | Action::WriteAcl => one(|a| a.write = true),
            Action::Delete | Action::DeleteBucket => one(|a| a.delete = true),
            Action::ReadAcl => one(|a| a.read = true),
            Action::Configure => None,
        }
    }

    /// The bucket ACL permission that allows it (`None`: no grant can).
    fn bucket_permission(self) -> Option<Permission> {
        match self {
            Action::List => Some(Permission::Read),
            Action::Write | Action::Delete => Some(Permission::Write),
            Action::ReadAcl => Some(Permission::ReadAcp),
            Action::WriteAcl => Some(Permission::WriteAcp),
            Action::Read
            | Action::ListBuckets
            | Action::CreateBucket
            | Action::DeleteBucket
            | Action::Configure => None,
        }
    }

    /// The object ACL permission that allows it on an object (`None`: decided at the bucket).
    fn object_permission(self) -> Option<Permission> {
        match self {
            Action::Read => Some(Permission::Read),
            Action::ReadAcl => Some(Permission::ReadAcp),
            Action::WriteAcl => Some(Permission::WriteAcp),
            _ => None,
        }
    }
}

/// The outcome of a check on an object operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Allowed at the bucket level.
    Open,
    /// Allowed only if the object's owner is the caller or its ACL grants this permission:
    /// check with [`object_allows`] once the object's metadata is read, and answer
    /// AccessDenied (never NoSuchKey) when it does not.
    Object(Permission),
}

/// Whether the object (written by `object_owner`, with grants `acl`) lets `who` have
/// `wanted`, for a [`Gate::Object`].
pub fn object_allows(who: &Identity, object_owner: &str, acl: &Acl, wanted: Permission) -> bool {
    let p = who.principal();
    matches!(p, Principal::User(n) if !n.is_empty() && n == object_owner) || acl.allows(p, wanted)
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
        Identity::Anonymous => false,
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
    authorize_with_acl(who, action, bucket, owner, None, Decision::NotApplicable)
}

fn denied_by_policy() -> AuthError {
    AuthError::new(S3ErrorCode::AccessDenied).msg("The bucket policy denies this request.")
}

/// [`authorize`], with the bucket's ACL (`None`: none is known, or the bucket does not
/// exist) and what its bucket policy says of the request: an explicit deny refuses whatever
/// else allows, an allow admits whatever else does not, and without either the rest decides.
pub fn authorize_with_acl(
    who: &Identity,
    action: Action,
    bucket: Option<&str>,
    owner: Option<&str>,
    acl: Option<&Acl>,
    policy: Decision,
) -> Result<(), AuthError> {
    match policy {
        Decision::ExplicitDeny => return Err(denied_by_policy()),
        Decision::Allow => return Ok(()),
        Decision::NotApplicable => {}
    }
    if allowed(who, action, bucket, owner)
        || acl
            .zip(action.bucket_permission())
            .is_some_and(|(acl, p)| acl.allows(who.principal(), p))
    {
        Ok(())
    } else {
        Err(AuthError::new(S3ErrorCode::AccessDenied))
    }
}

/// The check for an operation on an object: [`Gate::Open`] when the bucket level allows it,
/// [`Gate::Object`] when only the object's ACL can (reads and ACL operations of an existing
/// bucket), AccessDenied otherwise.
pub fn authorize_object(
    who: &Identity,
    action: Action,
    bucket: &str,
    owner: Option<&str>,
    acl: Option<&Acl>,
    policy: Decision,
) -> Result<Gate, AuthError> {
    if policy == Decision::ExplicitDeny {
        return Err(denied_by_policy());
    }
    match authorize_with_acl(who, action, Some(bucket), owner, acl, policy) {
        Ok(()) => Ok(Gate::Open),
        Err(e) => match (owner, action.object_permission()) {
            (Some(_), Some(p)) => Ok(Gate::Object(p)),
            _ => Err(e),
        },
    }
}

/// Users' ownership and grants, tokens' scopes: everything but ACLs.
fn allowed(who: &Identity, action: Action, bucket: Option<&str>, owner: Option<&str>) -> bool {
    match who {
        Identity::Open => true,
        // A bucket that does not exist is reported as such by the operation.
        Identity::Anonymous => {
            bucket.is_some() && owner.is_none() && action != Action::CreateBucket
        }
        // Changing an ACL can open a bucket to everyone: no scope letter covers it.
        Identity::Token(claims) if matches!(action, Action::WriteAcl | Action::Configure) => {
            claims.admin
        }
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
