//! How a [`super::KvClient`] is set up ([`KvOptions`]) and what a put does ([`PutOptions`],
//! [`PutMode`]).

use std::net::SocketAddr;

/// What a put does to a key that is already stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PutMode {
    /// Replace it (S3's PUT).
    #[default]
    Overwrite,
    /// Leave it as it is.
    IfAbsent,
}

/// Per-put choices (Mooncake's `ReplicateConfig`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PutOptions {
    pub mode: PutMode,
    /// Copies in a cluster: the first `replicas` nodes of each key's placement order (the
    /// bucket's replica count when `None`). Copies beyond the bucket's owners serve reads
    /// routed to them and last until the next membership change.
    pub replicas: Option<u32>,
    /// A node that gets a copy too (by member name), besides the owners.
    pub preferred_node: Option<String>,
    /// Pin the blocks where they are stored.
    pub pin: Option<yutu_api::kv::BlockPin>,
}

/// How [`KvClient::new`] sets up its transfer engine.
#[derive(Debug, Clone)]
pub struct KvOptions {
    /// The engine's node id; `None` picks a random one (it must differ from the server's).
    pub node_id: Option<u64>,
    /// Offer shm to same-host servers (a Unix socket in a private temporary directory).
    pub shm: bool,
    /// Where the engine's tcp listener binds; `None` is loopback on an ephemeral port, which
    /// only a server on this host can reach.
    pub tcp_listen: Option<SocketAddr>,
    /// What the server should connect to when it differs from the bound address.
    pub tcp_advertise: Option<SocketAddr>,
    /// Lifetime of a put between put-start and put-end (server default when `None`).
    pub put_ttl_ms: Option<u64>,
    /// Sign every call with these (a node with authentication); `None` sends unsigned calls
    /// (a node started with `--no-auth`).
    pub credentials: Option<crate::Credentials>,
    /// Or send this bearer token with every call (`yutu token issue`).
    pub token: Option<String>,
    /// When the node is part of a cluster, route every key to its owners (learned from the
    /// node's membership) instead of sending everything to this one node.
    pub route: bool,
    /// Whether KV calls go in binary frames when the node takes them (see
    /// [`super::FramesMode`]); they need a bearer token or an open node, not SigV4
    /// credentials.
    pub frames: super::FramesMode,
    /// The longest a frame call polls for its answer before its thread sleeps (zero: it
    /// always sleeps at once; default 400 us). Polling spares a call the wake-up of a
    /// sleeping thread (tens of microseconds on a VM); the thread yields between polls, so a
    /// node sharing its core still runs. Within the limit, a call polls for about twice its
    /// op's recent answer time, and not at all when those answers take longer than the limit
    /// (a poll would only take CPU from the node doing the work).
    pub frame_spin: std::time::Duration,
    /// Answer `exists` from the node's presence tables when it shares them (a node on this
    /// host, reached over its Unix frame sockets): a lookup in mapped memory instead of a
    /// call (`docs/kv-api.md`). Keys a table cannot answer are asked of the node.
    pub presence: bool,
}

impl Default for KvOptions {
    fn default() -> KvOptions {
        KvOptions {
            node_id: None,
            shm: true,
            tcp_listen: None,
            tcp_advertise: None,
            put_ttl_ms: None,
            credentials: None,
            token: None,
            route: true,
            frames: super::FramesMode::Auto,
            frame_spin: super::frames::DEFAULT_SPIN,
            presence: true,
        }
    }
}
