//! Everything a handler needs about one request, once it is routed and authenticated.

use std::rc::Rc;
use std::time::SystemTime;

use http::{HeaderMap, Method, Uri};

use super::error::S3Error;
use super::permission::{self, Asked};
use super::target::Target;
use crate::auth::authenticate::RequestAuth;
use crate::auth::{authorize_object, authorize_with_acl, Action, Gate, Identity};
use crate::http::endpoint::Op;
use crate::net::budget::BodyClient;
use crate::node::Shard;
use crate::store::bucket_settings::BucketSettings;
use yutu_api::bucket_policy::{keys, Context, Decision};

pub struct Ctx {
    pub shard: Rc<Shard>,
    pub method: Method,
    pub uri: Uri,
    pub headers: HeaderMap,
    pub target: Target,
    pub auth: RequestAuth,
    /// The cluster this node is part of (`None`: a single node).
    pub cluster: Option<std::sync::Arc<crate::cluster::Cluster>>,
    /// The node that forwarded this request, when it is proved to come from one.
    pub peer: Option<String>,
    /// The address the connection comes from.
    pub client: Option<std::net::IpAddr>,
    /// The operation, once the request is routed (what the bucket policy evaluates).
    pub op: std::cell::Cell<Op>,
    /// The version a delete was applied with here, for its coordinator to send the other
    /// owners the same one.
    pub deleted_as: std::cell::Cell<Option<crate::model::Version>>,
}

impl Ctx {
    /// The version a replica delete from another node carries (`None` for a client's
    /// delete: the node stamps it).
    pub fn replica_version(&self) -> Option<crate::model::Version> {
        if !self.is_replica_copy() {
            return None;
        }
        self.header(yutu_api::cluster::VERSION_HEADER)
            .and_then(crate::model::Version::parse)
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn identity(&self) -> &Identity {
        &self.auth.identity
    }

    /// Whether this request is a copy another node (proved by its node token) sends as a
    /// replica of a write it coordinated, or as re-replication: a copy of what was already
    /// admitted, which no quota check may refuse.
    pub fn is_replica_copy(&self) -> bool {
        self.peer.is_some() && self.headers.contains_key(yutu_api::cluster::REPLICA_HEADER)
    }

    /// Who this request's body is counted against in the body budget: a user or token by its
    /// name, an anonymous caller by its address (in the anonymous pool); nobody on a
    /// `--no-auth` node or for a peer node's copies.
    pub fn body_client(&self) -> BodyClient {
        self.body_client_as(self.identity())
    }

    /// [`Ctx::body_client`] for `who` (a form upload's signer, once checked).
    pub fn body_client_as(&self, who: &Identity) -> BodyClient {
        match who {
            _ if self.peer.is_some() => BodyClient::UNLIMITED,
            Identity::Open => BodyClient::UNLIMITED,
            Identity::Anonymous => BodyClient {
                key: Some(self.client.map_or_else(String::new, |ip| ip.to_string())),
                anonymous: true,
            },
            Identity::User(_) | Identity::Token(_) => BodyClient {
                key: Some(who.name().into_owned()),
                anonymous: false,
            },
        }
    }

    /// The caller's name, as leases and puts record their holder.
    pub fn holder(&self) -> String {
        self.auth.identity.name().to_string()
    }

    /// Who a KV call runs for: the caller, on this shard.
    pub fn caller(&self) -> crate::kv::Caller<'_> {
        crate::kv::Caller {
            here: &self.shard,
            holder: self.holder(),
        }
    }

    /// The object a request is about, as the bucket policy sees it: its key; for KV calls
    /// and Mooncake's queries (which name many keys in their body) every object, `*`.
    fn policy_key(&self) -> Option<&str> {
        match self.op.get() {
            Op::Kv | Op::MooncakeMaster => Some("*"),
            _ => self.target.key.as_deref(),
        }
    }

    /// Checks the permission on this shard's copy of the bucket list, and returns the
    /// incarnation of the bucket it was checked against (`None` when it does not exist): a
    /// write carries it to the owning shard, which refuses it if the bucket was deleted and
    /// created again meanwhile.
    pub fn allow(&self, action: Action, bucket: Option<&str>) -> Result<Option<u64>, S3Error> {
        self.allow_on(action, bucket, self.policy_key())
    }

    /// What the permission check weighs for `action` (evaluated as `op`) on `bucket` and
    /// `key`: the bucket's owner, incarnation and ACL (without its public grants where the
    /// public access block ignores them), and what the bucket policy says (`prefix` stands for
    /// the request's `s3:prefix`). Nothing for a request that names no bucket.
    fn weigh<'s>(
        &self,
        found: Option<(&'s BucketSettings, u64)>,
        op: Op,
        action: Action,
        bucket: Option<&str>,
        key: Option<&str>,
        prefix: Option<&str>,
    ) -> Weighed<'s> {
        let Some(bucket) = bucket else {
            return Weighed {
                owner: None,
                incarnation: None,
                acl: None,
                decision: Decision::NotApplicable,
            };
        };
        let guards = found.map(|(s, _)| s.guards()).unwrap_or_default();
        let owner = found.map(|(s, _)| s.owner.as_str());
        let asked = Asked {
            who: self.identity(),
            op,
            action,
            bucket,
            key,
            prefix,
        };
        Weighed {
            owner,
            incarnation: found.map(|(_, incarnation)| incarnation),
            acl: permission::effective_acl(found.map(|(s, _)| &s.acl), &guards),
            decision: permission::decide(&asked, owner, &guards, |p| self.policy_context(p)),
        }
    }

    /// [`Ctx::weigh`] on this shard's copy of `bucket`'s settings, read in place.
    fn weighed<R>(
        &self,
        op: Op,
        action: Action,
        bucket: Option<&str>,
        key: Option<&str>,
        prefix: Option<&str>,
        then: impl FnOnce(Weighed<'_>) -> R,
    ) -> R {
        match bucket {
            Some(b) => self.shard.tier.with_bucket(b, |found| {
                then(self.weigh(found, op, action, bucket, key, prefix))
            }),
            None => then(self.weigh(None, op, action, None, key, prefix)),
        }
    }

    /// The condition values of the request: the caller's address and name, the time, its
    /// headers and the listing parameters a policy may test (`prefix`, when given, stands for
    /// the request's `s3:prefix`).
    pub fn policy_context(&self, prefix: Option<&str>) -> Context {
        let ctx = self;
        let mut c = Context::new();
        if let Some(ip) = ctx.client {
            c.insert(keys::SOURCE_IP, ip.to_string());
        }
        let tls = ctx.shard.settings.tls.is_some();
        c.insert(keys::SECURE_TRANSPORT, if tls { "true" } else { "false" });
        let now = SystemTime::now();
        c.insert(
            keys::CURRENT_TIME,
            humantime::format_rfc3339_seconds(now).to_string(),
        );
        if let Ok(d) = now.duration_since(SystemTime::UNIX_EPOCH) {
            c.insert(keys::EPOCH_TIME, d.as_secs().to_string());
        }
        if let Identity::User(u) = ctx.identity() {
            c.insert(keys::USERNAME, u.name.clone());
            c.insert(keys::USERID, u.name.clone());
        }
        for (key, header) in [
            (keys::REFERER, "referer"),
            (keys::USER_AGENT, "user-agent"),
            (keys::X_AMZ_ACL, "x-amz-acl"),
            (keys::X_AMZ_CONTENT_SHA256, "x-amz-content-sha256"),
            (keys::X_AMZ_COPY_SOURCE, "x-amz-copy-source"),
            (keys::X_AMZ_METADATA_DIRECTIVE, "x-amz-metadata-directive"),
            (
                keys::X_AMZ_SERVER_SIDE_ENCRYPTION,
                "x-amz-server-side-encryption",
            ),
            (keys::X_AMZ_STORAGE_CLASS, "x-amz-storage-class"),
        ] {
            if let Some(v) = ctx.header(header) {
                c.insert(key, v);
            }
        }
        for grant in [
            "x-amz-grant-read",
            "x-amz-grant-write",
            "x-amz-grant-read-acp",
            "x-amz-grant-write-acp",
            "x-amz-grant-full-control",
        ] {
            if let Some(v) = ctx.header(grant) {
                c.insert(&format!("s3:{grant}"), v);
            }
        }
        if let Some(p) = prefix {
            c.insert(keys::PREFIX, p);
        }
        for (key, param) in [
            (keys::PREFIX, "prefix"),
            (keys::DELIMITER, "delimiter"),
            (keys::MAX_KEYS, "max-keys"),
            (keys::VERSION_ID, "versionId"),
        ] {
            if let Some(v) = ctx.target.param(param).filter(|_| prefix.is_none()) {
                c.insert(key, v);
            }
        }
        c
    }

    /// [`Ctx::allow`] on `key` of `bucket` (a copy's source) as the bucket policy sees it.
    pub fn allow_on(
        &self,
        action: Action,
        bucket: Option<&str>,
        key: Option<&str>,
    ) -> Result<Option<u64>, S3Error> {
        self.weighed(self.op.get(), action, bucket, key, None, |w| {
            let acl = w.acl.as_deref();
            authorize_with_acl(self.identity(), action, bucket, w.owner, acl, w.decision)?;
            Ok(w.incarnation)
        })
    }

    /// Whether the caller may read `key` of `bucket` as a copy's source (the bucket policy
    /// evaluates it as `s3:GetObject` on that object, whatever operation copies it).
    pub fn allow_copy_source(&self, bucket: &str, key: &str) -> Result<Option<u64>, S3Error> {
        let op = self.op.replace(Op::GetObject);
        let r = self.allow_on(Action::Read, Some(bucket), Some(key));
        self.op.set(op);
        r
    }

    /// Whether the caller may list `bucket` under `key` (`s3:ListBucket` with `key` as the
    /// prefix): a read of a missing key answers NoSuchKey then, AccessDenied otherwise.
    pub fn may_list_key(&self, bucket: &str, key: &str) -> bool {
        let (op, action) = (Op::ListObjects, Action::List);
        self.weighed(op, action, Some(bucket), None, Some(key), |w| {
            let acl = w.acl.as_deref();
            let (who, bucket) = (self.identity(), Some(bucket));
            authorize_with_acl(who, action, bucket, w.owner, acl, w.decision).is_ok()
        })
    }

    /// [`Ctx::allow`] for an operation on an object of `bucket`: the [`Gate`] says whether
    /// the object's own ACL is still to be checked, where its metadata is read.
    pub fn allow_object(&self, action: Action, bucket: &str) -> Result<Allowed, S3Error> {
        self.shard.metrics.object_checks.inc();
        let key = self.policy_key();
        self.weighed(self.op.get(), action, Some(bucket), key, None, |w| {
            let acl = w.acl.as_deref();
            let gate = authorize_object(self.identity(), action, bucket, w.owner, acl, w.decision)?;
            Ok((w.incarnation, gate))
        })
    }
}

/// What [`Ctx::allow_object`] decided: the bucket's incarnation, and whether the object's
/// own ACL is still to be checked.
pub type Allowed = (Option<u64>, Gate);

/// What [`Ctx::weigh`] found.
struct Weighed<'s> {
    owner: Option<&'s str>,
    incarnation: Option<u64>,
    acl: Option<std::borrow::Cow<'s, yutu_api::acl::Acl>>,
    decision: Decision,
}
