//! Everything a handler needs about one request, once it is routed and authenticated.

use std::rc::Rc;

use http::{HeaderMap, Method, Uri};

use super::error::S3Error;
use super::target::Target;
use crate::auth::authenticate::RequestAuth;
use crate::auth::{authorize_object, authorize_with_acl, Action, Gate, Identity};
use crate::net::budget::BodyClient;
use crate::node::Shard;

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
}

impl Ctx {
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

    /// Checks the permission on this shard's copy of the bucket list, and returns the
    /// incarnation of the bucket it was checked against (`None` when it does not exist): a
    /// write carries it to the owning shard, which refuses it if the bucket was deleted and
    /// created again meanwhile.
    pub fn allow(&self, action: Action, bucket: Option<&str>) -> Result<Option<u64>, S3Error> {
        let store = self.shard.tier.store.borrow();
        let found = bucket.and_then(|b| store.bucket_access(b));
        let (owner, incarnation, acl) =
            found.map_or((None, None, None), |(o, i, a)| (Some(o), Some(i), Some(a)));
        authorize_with_acl(&self.auth.identity, action, bucket, owner, acl)?;
        Ok(incarnation)
    }

    /// [`Ctx::allow`] for an operation on an object of `bucket`: the [`Gate`] says whether
    /// the object's own ACL is still to be checked, where its metadata is read.
    pub fn allow_object(
        &self,
        action: Action,
        bucket: &str,
    ) -> Result<(Option<u64>, Gate), S3Error> {
        let store = self.shard.tier.store.borrow();
        let found = store.bucket_access(bucket);
        let gate = authorize_object(
            &self.auth.identity,
            action,
            bucket,
            found.map(|(owner, _, _)| owner),
            found.map(|(_, _, acl)| acl),
        )?;
        Ok((found.map(|(_, incarnation, _)| incarnation), gate))
    }
}
