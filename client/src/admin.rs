//! [`AdminClient`]: the storage admin API (`/admin/v1/...`), one method per call of
//! [`yutu_api::admin`], whose documents it sends and returns as they are.
//!
//! Any node answers for the whole cluster, so one client for any node is enough. The calls
//! need an admin identity (an access key of a user with `admin = true`, or a token issued with
//! `--admin`); they go through [`Client`], so they are signed or carry the bearer token
//! exactly like the S3 calls, and a refusal arrives as the server's code and message
//! ([`ClientError::S3`], inside [`AdminError::Client`]).
//!
//! Requests are checked here for the shapes the contract documents (a key or a prefix, not
//! both; replicas or a node, not both...) before anything is sent: a node fans most calls out
//! to every member, and a request it refuses halfway could be partly applied.
//!
//! ```no_run
//! # fn main() -> Result<(), yutu_client::AdminError> {
//! let client = yutu_client::Client::with_token("http://127.0.0.1:9000", "eyJ...")?;
//! let admin = yutu_client::AdminClient::new(client);
//! for node in admin.nodes()?.nodes {
//!     println!("{} {:?} {} bytes of DRAM used", node.name, node.state, node.dram().used);
//! }
//! admin.drain("node2")?;
//! # Ok(())
//! # }
//! ```

use yutu_api::admin::{
    DrainRequest, DrainResponse, EvictRequest, EvictResponse, NodesResponse, PinRequest,
    PinResponse, ReplicateRequest, ReplicateResponse, StatsResponse, StatusResponse, DRAIN_PATH,
    EVICT_PATH, NODES_PATH, PIN_PATH, REPLICATE_PATH, STATS_PATH, STATUS_PATH, UNPIN_PATH,
};

use crate::{Client, ClientError};

/// What can go wrong in an admin call.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The request is not one the admin API accepts; caught before sending.
    #[error("invalid admin request: {0}")]
    InvalidRequest(String),
    /// The call failed: the server's refusal (its code and message), the connection, or an
    /// answer that is not the expected document.
    #[error(transparent)]
    Client(#[from] ClientError),
}

impl AdminError {
    /// The server's error code (`AccessDenied`, `InvalidArgument`...), when it sent one.
    pub fn code(&self) -> Option<&str> {
        match self {
            AdminError::Client(c) => c.code(),
            AdminError::InvalidRequest(_) => None,
        }
    }

    /// The HTTP status of the server's refusal, when there was one.
    pub fn status(&self) -> Option<u16> {
        match self {
            AdminError::Client(c) => c.status(),
            AdminError::InvalidRequest(_) => None,
        }
    }

    /// Whether asking again later may succeed: the connection failed, or the node answered
    /// 5xx (a member did not answer its part, etcd was out of reach). Pollers of `status`
    /// and `nodes` retry these until their deadline; a 4xx (no admin rights, no such node)
    /// will not change by waiting.
    pub fn is_transient(&self) -> bool {
        match self {
            AdminError::Client(ClientError::Transport(_) | ClientError::Io(_)) => true,
            AdminError::Client(c) => c.status().is_some_and(|s| s >= 500),
            AdminError::InvalidRequest(_) => false,
        }
    }
}

/// A client of the storage admin API, on top of a [`Client`] (and its credentials).
///
/// Cheap to clone; clones share the connection pool.
#[derive(Debug, Clone)]
pub struct AdminClient {
    client: Client,
}

impl AdminClient {
    pub fn new(client: Client) -> AdminClient {
        AdminClient { client }
    }

    /// The S3 client underneath.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// `GET /admin/v1/nodes`: every member, its state and usage.
    pub fn nodes(&self) -> Result<NodesResponse, AdminError> {
        Ok(self.client.get_json(NODES_PATH)?)
    }

    /// `GET /admin/v1/stats`: the same document as [`AdminClient::nodes`] (per node and per
    /// shard, per tier); kept apart because the API keeps them apart.
    pub fn stats(&self) -> Result<StatsResponse, AdminError> {
        Ok(self.client.get_json(STATS_PATH)?)
    }

    /// `GET /admin/v1/status`: what is in motion (rebalancing, under-replicated keys, drains).
    pub fn status(&self) -> Result<StatusResponse, AdminError> {
        Ok(self.client.get_json(STATUS_PATH)?)
    }

    /// `POST /admin/v1/evict`: objects of a bucket (a key, a prefix, or all of them) from
    /// every node and tier, or `free_bytes` of DRAM on a node.
    pub fn evict(&self, req: &EvictRequest) -> Result<EvictResponse, AdminError> {
        check_evict(req)?;
        Ok(self.client.post_json(EVICT_PATH, req)?)
    }

    /// `POST /admin/v1/pin`: hard (no `ttl_secs`) or soft (`ttl_secs`) pin of a key or of
    /// every key under a prefix.
    pub fn pin(&self, req: &PinRequest) -> Result<PinResponse, AdminError> {
        check_pin(req, true)?;
        Ok(self.client.post_json(PIN_PATH, req)?)
    }

    /// `POST /admin/v1/unpin`: clears the pins (hard and soft) of a key or a prefix.
    pub fn unpin(&self, req: &PinRequest) -> Result<PinResponse, AdminError> {
        check_pin(req, false)?;
        Ok(self.client.post_json(UNPIN_PATH, req)?)
    }

    /// `POST /admin/v1/replicate`: copies of a key or a prefix on `replicas` nodes in all, or
    /// on `node`.
    pub fn replicate(&self, req: &ReplicateRequest) -> Result<ReplicateResponse, AdminError> {
        check_replicate(req)?;
        Ok(self.client.post_json(REPLICATE_PATH, req)?)
    }

    /// `POST /admin/v1/drain`: starts draining `node` (its keys move to the others; it owns
    /// nothing new). Follow it with [`AdminClient::status`] until the node is `drained`.
    pub fn drain(&self, node: &str) -> Result<DrainResponse, AdminError> {
        self.drain_request(node, false)
    }

    /// `POST /admin/v1/drain` with `cancel`: `node` owns keys again.
    pub fn cancel_drain(&self, node: &str) -> Result<DrainResponse, AdminError> {
        self.drain_request(node, true)
    }

    fn drain_request(&self, node: &str, cancel: bool) -> Result<DrainResponse, AdminError> {
        check_name("node", node)?;
        let req = DrainRequest {
            node: node.to_string(),
            cancel,
        };
        Ok(self.client.post_json(DRAIN_PATH, &req)?)
    }
}

fn invalid(msg: impl Into<String>) -> AdminError {
    AdminError::InvalidRequest(msg.into())
}

fn check_name(what: &str, name: &str) -> Result<(), AdminError> {
    if name.is_empty() {
        return Err(invalid(format!("the {what} name is empty")));
    }
    Ok(())
}

/// A key or a prefix of `bucket`, not both; `needed`: one of them must be given.
fn check_keys(
    bucket: &str,
    key: &Option<String>,
    prefix: &Option<String>,
    needed: bool,
) -> Result<(), AdminError> {
    check_name("bucket", bucket)?;
    match (key, prefix) {
        (Some(_), Some(_)) => Err(invalid("give a key or a prefix, not both")),
        (Some(k), None) if k.is_empty() => Err(invalid("the key is empty")),
        (None, None) if needed => Err(invalid("give a key or a prefix")),
        _ => Ok(()),
    }
}

fn check_evict(req: &EvictRequest) -> Result<(), AdminError> {
    match (&req.bucket, req.free_bytes) {
        (Some(bucket), None) => check_keys(bucket, &req.key, &req.prefix, false),
        (None, Some(_)) if req.key.is_some() || req.prefix.is_some() => Err(invalid(
            "free_bytes frees DRAM on a node; it takes no key or prefix",
        )),
        (None, Some(0)) => Err(invalid("free_bytes must be positive")),
        (None, Some(_)) => req
            .node
            .as_deref()
            .map_or(Ok(()), |n| check_name("node", n)),
        _ => Err(invalid(
            "give a bucket (with a key or a prefix), or free_bytes (and a node)",
        )),
    }
}

fn check_pin(req: &PinRequest, pinning: bool) -> Result<(), AdminError> {
    check_keys(&req.bucket, &req.key, &req.prefix, true)?;
    match req.ttl_secs {
        Some(_) if !pinning => Err(invalid("unpin takes no ttl_secs")),
        Some(0) => Err(invalid("a soft pin's ttl_secs must be positive")),
        _ => Ok(()),
    }
}

fn check_replicate(req: &ReplicateRequest) -> Result<(), AdminError> {
    check_keys(&req.bucket, &req.key, &req.prefix, true)?;
    match (req.replicas, &req.node) {
        (Some(0), None) => Err(invalid("replicas must be at least 1")),
        (Some(_), None) => Ok(()),
        (None, Some(node)) => check_name("node", node),
        _ => Err(invalid("give replicas or a node, not both")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> Option<String> {
        Some(v.to_string())
    }

    #[test]
    fn evict_shapes() {
        let ok = |r: EvictRequest| check_evict(&r).is_ok();
        let bucket = EvictRequest {
            bucket: s("b"),
            ..EvictRequest::default()
        };
        assert!(ok(bucket.clone()));
        assert!(ok(EvictRequest {
            key: s("k"),
            ..bucket.clone()
        }));
        assert!(ok(EvictRequest {
            prefix: s("p/"),
            ..bucket.clone()
        }));
        assert!(!ok(EvictRequest {
            key: s("k"),
            prefix: s("p/"),
            ..bucket.clone()
        }));
        assert!(!ok(EvictRequest {
            free_bytes: Some(1),
            ..bucket
        }));
        let free = EvictRequest {
            node: s("node1"),
            free_bytes: Some(1 << 20),
            ..EvictRequest::default()
        };
        assert!(ok(free.clone()));
        assert!(!ok(EvictRequest {
            free_bytes: Some(0),
            ..free.clone()
        }));
        assert!(!ok(EvictRequest {
            key: s("k"),
            ..free
        }));
        assert!(!ok(EvictRequest::default()));
    }

    #[test]
    fn pin_shapes() {
        let key = PinRequest {
            bucket: "b".into(),
            key: s("k"),
            ..PinRequest::default()
        };
        assert!(check_pin(&key, true).is_ok());
        assert!(check_pin(&key, false).is_ok());
        let soft = PinRequest {
            ttl_secs: Some(60),
            ..key.clone()
        };
        assert!(check_pin(&soft, true).is_ok());
        assert!(check_pin(&soft, false).is_err(), "unpin takes no TTL");
        let zero = PinRequest {
            ttl_secs: Some(0),
            ..key.clone()
        };
        assert!(check_pin(&zero, true).is_err());
        let neither = PinRequest {
            key: None,
            ..key.clone()
        };
        assert!(check_pin(&neither, true).is_err());
        let nameless = PinRequest {
            bucket: String::new(),
            ..key
        };
        assert!(check_pin(&nameless, true).is_err());
    }

    #[test]
    fn replicate_shapes() {
        let base = ReplicateRequest {
            bucket: "b".into(),
            prefix: s("p/"),
            ..ReplicateRequest::default()
        };
        let with = |replicas: Option<u32>, node: Option<String>| {
            check_replicate(&ReplicateRequest {
                replicas,
                node,
                ..base.clone()
            })
            .is_ok()
        };
        assert!(with(Some(3), None));
        assert!(with(None, s("node1")));
        assert!(!with(Some(0), None));
        assert!(!with(None, None));
        assert!(!with(Some(2), s("node1")));
        assert!(!with(None, s("")));
    }

    #[test]
    fn error_accessors() {
        let refused = AdminError::Client(ClientError::S3 {
            status: 403,
            code: "AccessDenied".into(),
            message: "no".into(),
        });
        assert_eq!(refused.code(), Some("AccessDenied"));
        assert_eq!(refused.status(), Some(403));
        assert!(!refused.is_transient());
        assert_eq!(refused.to_string(), "AccessDenied: no");
        let busy = AdminError::Client(ClientError::S3 {
            status: 503,
            code: "ServiceUnavailable".into(),
            message: "a member did not answer".into(),
        });
        assert!(busy.is_transient());
        let local = invalid("x");
        assert!(!local.is_transient());
        assert_eq!(local.code(), None);
    }

    #[test]
    fn drain_needs_a_node_name() {
        let admin = AdminClient::new(Client::new("http://127.0.0.1:9").unwrap());
        assert!(matches!(
            admin.drain(""),
            Err(AdminError::InvalidRequest(_))
        ));
    }
}
