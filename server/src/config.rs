//! Server settings: command-line flags, an optional TOML file, and the defaults.
//!
//! Every flag has a config key of the same name with `_` for `-` (`max-object-size` ->
//! `max_object_size`). A flag given on the command line wins over the file, and the file wins
//! over the built-in default, so an operator can keep a fleet-wide file and override one knob.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::Parser;
use serde::Deserialize;
use yutu_api::token::{KeyConfig, Keyring};
use yutu_api::ByteSize;

/// Command-line flags. Each is optional so that the config file can supply it.
#[derive(Debug, Parser, Default)]
#[command(
    name = "yutu-server",
    version,
    about = "Yutu storage node: a KV-cache and object store with an S3-like HTTP API"
)]
pub struct Flags {
    /// Address to listen on for HTTP (S3 API, admin, metrics). Port 0 picks a free port.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Directory for the node's files.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// DRAM capacity of the whole node, split evenly across shards (e.g. 1GiB).
    #[arg(long)]
    pub memory: Option<ByteSize>,
    /// Fault all of --memory in at start (in the background), so that puts never wait for
    /// the kernel to allocate the arena's pages: for nodes that give their memory to the
    /// cache anyway.
    #[arg(long)]
    pub prefault: bool,
    /// Number of shards (one pinned thread each). Defaults to the number of CPUs.
    #[arg(long)]
    pub shards: Option<usize>,
    /// Leave the shards' threads unpinned, for the kernel to place: for a node sharing a
    /// few cores with the engines that call it (single-key calls answer sooner, large
    /// batches move a little slower).
    #[arg(long)]
    pub no_pin: bool,
    /// Give no presence tables: same-host clients then ask every `exists` of the node
    /// instead of looking it up in a table the node shares with them (`docs/kv-api.md`).
    #[arg(long)]
    pub no_presence_tables: bool,
    /// Give no arena views: same-host clients that proved they may read the node's memory
    /// anyway then still have the shards copy every large block (`docs/kv-api.md`).
    #[arg(long)]
    pub no_arena_views: bool,
    /// Threads that copy one large transfer (1 MiB or more) between the arena and a
    /// same-host client's memory together, the owning shard's included: 1 keeps every copy
    /// on its shard (a node sharing its cores with busy engines). Defaults to the number of
    /// CPUs.
    #[arg(long)]
    pub copy_threads: Option<usize>,
    /// Memory each shard gives to value mirrors: copies of a bucket's KV blocks of at most
    /// 4 KiB that same-host clients read without a call, next to the presence tables
    /// (`docs/kv-api.md`). 0 turns them off. Default 64MiB.
    #[arg(long)]
    pub value_mirror_bytes: Option<ByteSize>,
    /// Largest object a single PUT may store (e.g. 64MiB).
    #[arg(long)]
    pub max_object_size: Option<ByteSize>,
    /// Serve every request without authentication.
    #[arg(long)]
    pub no_auth: bool,
    /// Answer CreateBucket of a bucket the caller already owns with 409
    /// BucketAlreadyOwnedByYou (as S3 outside us-east-1) instead of 200 (as us-east-1).
    #[arg(long)]
    pub bucket_exists_conflict: bool,
    /// Eviction policy of the DRAM tier: `lru`.
    #[arg(long)]
    pub eviction: Option<String>,
    /// Log format: `text` or `json`.
    #[arg(long)]
    pub log_format: Option<String>,
    /// Domain for virtual-host addressing: `BUCKET.DOMAIN` names a bucket (repeatable).
    #[arg(long = "domain")]
    pub domains: Vec<String>,
    /// Seconds after which an unfinished multipart upload is aborted and its parts freed.
    #[arg(long)]
    pub multipart_timeout_secs: Option<u64>,
    /// File or block device of the NVMe tier (default: DATA_DIR/nvme.img).
    #[arg(long)]
    pub nvme: Option<PathBuf>,
    /// Capacity of the NVMe tier, preallocated in the file (0 turns the tier off).
    #[arg(long)]
    pub nvme_capacity: Option<ByteSize>,
    /// Address of the transfer engine's TCP listener (one-sided reads and writes of KV
    /// blocks); port 0 picks a free port.
    #[arg(long)]
    pub transfer_listen: Option<SocketAddr>,
    /// Default durability of new buckets: `memory` (DRAM, demoted to NVMe on eviction) or
    /// `disk` (written through to NVMe before a PUT is acknowledged).
    #[arg(long)]
    pub durability: Option<String>,
    /// This node's name towards the conductor (default: the host name).
    #[arg(long)]
    pub node_name: Option<String>,
    /// Base URL of the conductor to publish KV events to (e.g. http://10.0.0.5:9100).
    #[arg(long)]
    pub conductor: Option<String>,
    /// The URL the conductor reaches this node at (default: http://LISTEN-ADDRESS).
    #[arg(long)]
    pub advertise_url: Option<String>,
    /// File holding the bearer token the node sends to the conductor (a token with the
    /// `events` conductor scope), for a conductor with authentication.
    #[arg(long)]
    pub conductor_token_file: Option<PathBuf>,
    /// KV bytes one user may hold leased on the node (default: a quarter of --memory).
    #[arg(long)]
    pub kv_user_leased: Option<ByteSize>,
    /// KV bytes one user may hold reserved by put-starts not yet ended (default: a quarter of
    /// --memory).
    #[arg(long)]
    pub kv_user_reserved: Option<ByteSize>,
    /// Leases one user may hold at once on each shard (default 4096).
    #[arg(long)]
    pub kv_user_leases: Option<u64>,
    /// Serve HTTPS with this certificate chain (PEM); needs --tls-key.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Connections one shard serves at once (default 4096); past it a new connection gets
    /// `503 SlowDown` and is closed, so one client cannot take every file descriptor.
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// Bytes of request bodies the node holds at once, all connections together (default:
    /// half of --memory, at least 64 MiB and at most 1 GiB). A body waits for its share; three
    /// quarters of it is the largest body a single request may send (use multipart above).
    #[arg(long)]
    pub body_budget: Option<ByteSize>,
    /// Seconds a request body may wait for the budget, and may go without sending a byte,
    /// before it is refused (default 30).
    #[arg(long)]
    pub body_timeout_secs: Option<u64>,
    /// Slowest average rate a body may arrive at, bytes per second (default 64KiB): a body of
    /// N bytes must be in within body-timeout-secs + N / min-body-rate.
    #[arg(long)]
    pub min_body_rate: Option<ByteSize>,
    /// etcd endpoints (`http://host:2379`, comma-separated): the node joins a cluster. Without
    /// it the node is a single node and nothing below applies.
    #[arg(long, value_delimiter = ',')]
    pub etcd: Vec<String>,
    /// Name of the cluster in etcd (several clusters can share one etcd; default `yutu`).
    #[arg(long)]
    pub cluster: Option<String>,
    /// This node's failure domain: replicas of a key go to distinct zones while there are.
    #[arg(long)]
    pub zone: Option<String>,
    /// Default replica count of new buckets in a cluster (default 1).
    #[arg(long)]
    pub replicas: Option<u32>,
    /// Seconds the node's etcd lease lasts without a keep-alive (default 10): how long a
    /// killed node stays an owner, and how long a node cut off from etcd keeps accepting
    /// writes as an owner.
    #[arg(long)]
    pub lease_ttl_secs: Option<u64>,
    /// The cluster's shared HS256 secret (a file of at least 32 bytes, e.g. from
    /// `openssl rand -hex 32`), the same file on every node: nodes sign their calls to each other with it (kid
    /// `cluster`), and `yutu token issue --secret-file FILE --kid cluster` signs tokens every
    /// node accepts. Required in a cluster unless --no-auth.
    #[arg(long)]
    pub cluster_key_file: Option<PathBuf>,
    /// Bytes per second this node sends when it copies keys to new owners after a membership
    /// change (re-replication, hand-off, drain), so that recovery does not starve clients
    /// (default 256MiB).
    #[arg(long)]
    pub rereplicate_rate: Option<ByteSize>,
    /// Seconds between anti-entropy passes, which bring this node's copies up to the newest
    /// version the other owners hold (default 30; a pass also runs at once after every
    /// membership change and when the node rejoins).
    #[arg(long)]
    pub sync_interval_secs: Option<u64>,
    /// Seconds a delete is remembered (as a tombstone) so that an owner that missed it
    /// cannot bring the object back (default 86400).
    #[arg(long)]
    pub tombstone_ttl_secs: Option<u64>,
    /// TOML file with any of the settings above, and `[[users]]`.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

/// How the node takes part in a cluster (`--etcd`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSettings {
    /// etcd endpoints, tried in order.
    pub etcd: Vec<String>,
    /// The cluster's name: its state lives under `/yutu/NAME/` in etcd.
    pub name: String,
    pub zone: Option<String>,
    /// Replica count of buckets created without `x-yutu-replicas`.
    pub replicas: u32,
    pub lease_ttl: std::time::Duration,
    /// The shared secret nodes sign their calls to each other with (`None` with --no-auth).
    pub key: Option<Vec<u8>>,
    /// Bytes per second re-replication may send.
    pub rereplicate_rate: u64,
    /// How often anti-entropy runs when nothing else triggers it.
    pub sync_interval: std::time::Duration,
}

/// The kid of the cluster's shared key in the keyring.
pub const CLUSTER_KID: &str = "cluster";

/// How much request-body data the node holds, and how long a body may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyLimits {
    /// Bytes of bodies held at once, node-wide (`net::budget::BodyBudget`).
    pub budget: u64,
    /// Longest wait for the budget, and longest silence while a body is read.
    pub timeout: std::time::Duration,
    /// Slowest average rate a body may arrive at, bytes per second.
    pub min_rate: u64,
}

impl BodyLimits {
    /// When a body of `len` bytes must have arrived, counted from its first read.
    pub fn deadline(&self, len: u64) -> std::time::Duration {
        self.timeout + std::time::Duration::from_secs(len / self.min_rate.max(1))
    }
}

/// What one user may hold on the KV path, so that one tenant cannot pin or reserve the DRAM
/// every other tenant needs. Node-wide values; [`KvLimits::per_shard`] splits them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLimits {
    /// Bytes of blocks under the user's leases.
    pub leased_bytes: u64,
    /// Bytes reserved by the user's pending puts.
    pub reserved_bytes: u64,
    /// Leases at once, per shard.
    pub leases: u64,
}

impl KvLimits {
    /// No limit (a store on its own, in unit tests).
    pub const NONE: KvLimits = KvLimits {
        leased_bytes: u64::MAX,
        reserved_bytes: u64::MAX,
        leases: u64::MAX,
    };

    /// One shard's share: the byte limits divided evenly (a user's keys spread evenly over
    /// the shards), the lease count as it is.
    pub fn per_shard(&self, shards: usize) -> KvLimits {
        let n = shards.max(1) as u64;
        KvLimits {
            leased_bytes: self.leased_bytes.div_ceil(n),
            reserved_bytes: self.reserved_bytes.div_ceil(n),
            leases: self.leases,
        }
    }
}

/// A `[[users]]` table: an access key pair, and what the user may touch besides the buckets
/// it creates.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct User {
    pub name: String,
    pub access_key: String,
    pub secret_key: String,
    /// Full access to every bucket.
    #[serde(default)]
    pub admin: bool,
    /// Buckets (or `*`) this user may read although another user owns them.
    #[serde(default)]
    pub read: Vec<String>,
    /// Buckets (or `*`) this user may read and write although another user owns them.
    #[serde(default)]
    pub write: Vec<String>,
}

/// Bytes of value mirrors a shard keeps unless told (`--value-mirror-bytes`), see
/// `store::presence`.
pub const DEFAULT_VALUE_MIRROR_BYTES: u64 = 64 << 20;

/// The TOML file. Unknown keys are an error so that a typo does not silently fall back.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub listen: Option<SocketAddr>,
    pub data_dir: Option<PathBuf>,
    pub memory: Option<ByteSize>,
    pub prefault: Option<bool>,
    pub shards: Option<usize>,
    pub no_pin: Option<bool>,
    pub no_presence_tables: Option<bool>,
    pub no_arena_views: Option<bool>,
    pub copy_threads: Option<usize>,
    pub value_mirror_bytes: Option<ByteSize>,
    pub max_object_size: Option<ByteSize>,
    pub no_auth: Option<bool>,
    pub bucket_exists_conflict: Option<bool>,
    pub eviction: Option<String>,
    pub log_format: Option<String>,
    pub domains: Option<Vec<String>>,
    pub multipart_timeout_secs: Option<u64>,
    pub node_name: Option<String>,
    pub conductor: Option<String>,
    pub advertise_url: Option<String>,
    pub conductor_token_file: Option<PathBuf>,
    pub durability: Option<String>,
    pub nvme: Option<PathBuf>,
    pub nvme_capacity: Option<ByteSize>,
    pub transfer_listen: Option<SocketAddr>,
    pub kv_user_leased: Option<ByteSize>,
    pub kv_user_reserved: Option<ByteSize>,
    pub kv_user_leases: Option<u64>,
    pub max_connections: Option<usize>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub body_budget: Option<ByteSize>,
    pub body_timeout_secs: Option<u64>,
    pub min_body_rate: Option<ByteSize>,
    pub etcd: Option<Vec<String>>,
    pub cluster: Option<String>,
    pub zone: Option<String>,
    pub replicas: Option<u32>,
    pub lease_ttl_secs: Option<u64>,
    pub cluster_key_file: Option<PathBuf>,
    pub rereplicate_rate: Option<ByteSize>,
    pub sync_interval_secs: Option<u64>,
    pub tombstone_ttl_secs: Option<u64>,
    #[serde(default)]
    pub users: Vec<User>,
    #[serde(default)]
    pub token_keys: Vec<KeyConfig>,
}

/// Resolved settings the server runs with.
#[derive(Debug, Clone)]
pub struct Settings {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    /// How long a delete is remembered as a tombstone (`--tombstone-ttl-secs`).
    pub tombstone_ttl: std::time::Duration,
    pub memory: u64,
    /// Fault the DRAM arena in at start (`--prefault`).
    pub prefault: bool,
    pub shards: usize,
    /// Each shard's thread pinned to a core of its own (unless there are more shards than
    /// cores); `--no-pin` turns it off.
    pub pin_shards: bool,
    /// Presence tables given to same-host clients (`--no-presence-tables` turns them off),
    /// see `store::presence`.
    pub presence_tables: bool,
    /// Arena views for same-host clients that can read the node's memory already
    /// (`--no-arena-views` turns them off), see `http::kv::arena_view`.
    pub arena_views: bool,
    /// Threads that copy one large same-host transfer together (`--copy-threads`; 1: none
    /// but the shard), see `yutu_transfer::split_copy`.
    pub copy_threads: usize,
    /// Bytes of value mirrors per shard (`--value-mirror-bytes`; 0: none), see
    /// `store::presence`.
    pub value_mirror_bytes: u64,
    pub max_object_size: u64,
    pub no_auth: bool,
    /// CreateBucket of a bucket the caller owns: 409 (true) or 200 (false, us-east-1's way).
    pub bucket_exists_conflict: bool,
    pub eviction: EvictionKind,
    pub log_format: LogFormat,
    pub domains: Vec<String>,
    pub multipart_timeout: std::time::Duration,
    pub users: Vec<std::sync::Arc<User>>,
    pub node_name: String,
    pub conductor: Option<String>,
    pub advertise_url: Option<String>,
    /// The bearer token sent to the conductor (read from `conductor_token_file`).
    pub conductor_token: Option<String>,
    pub durability: crate::model::Durability,
    /// The NVMe tier's file or device; `None` when the tier is off.
    pub nvme: Option<PathBuf>,
    pub nvme_capacity: u64,
    pub transfer_listen: SocketAddr,
    pub kv_limits: KvLimits,
    pub body: BodyLimits,
    /// Connections one shard serves at once.
    pub max_connections: usize,
    /// TLS certificate chain and key (PEM files); `None`: plain HTTP.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// The keys bearer tokens may be signed with (`[[token_keys]]`, and the node's own key
    /// that `main` adds from the data directory).
    pub keyring: Keyring,
    /// This run of the node, in milliseconds since the Unix epoch: KV events are numbered per
    /// epoch, so the conductor can tell a restart from a gap.
    pub epoch: u64,
    /// Cluster membership (`--etcd`); `None`: a single node.
    pub cluster: Option<ClusterSettings>,
    /// Where the shards take KV frames: chosen when the node starts (not configured), and
    /// answered to clients at `GET /v1/kv/frames`.
    pub frames: yutu_api::kv_frame::FramesInfo,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictionKind {
    Lru,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {source}")]
    Parse {
        path: PathBuf,
        source: Box<toml::de::Error>,
    },
    #[error("{0}")]
    Invalid(String),
}

pub const DEFAULT_LISTEN: &str = "127.0.0.1:9000";
pub const DEFAULT_MEMORY: u64 = 1 << 30;
/// Default NVMe tier: a 1 GiB file under the data directory (modest, so that the first start
/// works on a small disk; production sizes it with --nvme-capacity).
pub const DEFAULT_NVME_CAPACITY: u64 = 1 << 30;
/// S3's own limit for a single PUT.
pub const DEFAULT_MAX_OBJECT_SIZE: u64 = 5 << 30;
/// Smallest share of DRAM a shard may get: below this the allocator's bookkeeping dominates.
pub const MIN_SHARD_MEMORY: u64 = 1 << 20;
/// Most threads `--copy-threads` may ask for.
pub const MAX_COPY_THREADS: usize = 256;

impl Settings {
    /// Merges flags over the file over the defaults and checks the result.
    pub fn resolve(flags: Flags) -> Result<Settings, ConfigError> {
        let file = match &flags.config {
            Some(path) => load_file(path)?,
            None => FileConfig::default(),
        };
        let no_auth = flags.no_auth || file.no_auth.unwrap_or(false);
        let etcd = if flags.etcd.is_empty() {
            file.etcd.clone().unwrap_or_default()
        } else {
            flags.etcd.clone()
        };
        let cluster = if etcd.is_empty() {
            None
        } else {
            Some(cluster_settings(&flags, &file, etcd, no_auth)?)
        };
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let shards = flags.shards.or(file.shards).unwrap_or(cpus);
        let copy_threads = flags.copy_threads.or(file.copy_threads).unwrap_or(cpus);
        if !(1..=MAX_COPY_THREADS).contains(&copy_threads) {
            return Err(ConfigError::Invalid(format!(
                "--copy-threads must be 1 to {MAX_COPY_THREADS} (1: each shard copies alone), not {copy_threads}"
            )));
        }
        let memory = flags.memory.or(file.memory).map_or(DEFAULT_MEMORY, |b| b.0);
        let max_object_size = flags
            .max_object_size
            .or(file.max_object_size)
            .map_or(DEFAULT_MAX_OBJECT_SIZE, |b| b.0);
        let eviction = match flags.eviction.or(file.eviction).as_deref().unwrap_or("lru") {
            "lru" => EvictionKind::Lru,
            other => {
                return Err(ConfigError::Invalid(format!(
                    "unknown eviction policy {other:?}; known: lru"
                )))
            }
        };
        let log_format = match flags
            .log_format
            .or(file.log_format)
            .as_deref()
            .unwrap_or("text")
        {
            "text" => LogFormat::Text,
            "json" => LogFormat::Json,
            other => {
                return Err(ConfigError::Invalid(format!(
                    "unknown log format {other:?}; known: text, json"
                )))
            }
        };
        if shards == 0 || shards > 1024 {
            return Err(ConfigError::Invalid(format!(
                "--shards must be between 1 and 1024, got {shards}"
            )));
        }
        if memory / (shards as u64) < MIN_SHARD_MEMORY {
            return Err(ConfigError::Invalid(format!(
                "--memory {memory} gives each of {shards} shards less than {MIN_SHARD_MEMORY} bytes"
            )));
        }
        let durability = match flags.durability.or(file.durability) {
            None => crate::model::Durability::Memory,
            Some(d) => crate::model::Durability::parse(&d).ok_or_else(|| {
                ConfigError::Invalid(format!("unknown durability {d:?}; known: memory, disk"))
            })?,
        };
        let nvme_capacity = flags
            .nvme_capacity
            .or(file.nvme_capacity)
            .map_or(DEFAULT_NVME_CAPACITY, |b| b.0);
        let data_dir = flags
            .data_dir
            .clone()
            .or(file.data_dir.clone())
            .unwrap_or_else(|| PathBuf::from("./yutu-data"));
        let nvme_path = flags
            .nvme
            .clone()
            .or(file.nvme.clone())
            .unwrap_or_else(|| data_dir.join("nvme.img"));
        let mut keys = std::collections::HashSet::new();
        for u in &file.users {
            if u.name.is_empty() || u.access_key.is_empty() || u.secret_key.len() < 8 {
                return Err(ConfigError::Invalid(format!(
                    "user {:?}: name and access_key must be set and secret_key must have at least 8 characters",
                    u.name
                )));
            }
            // A token's principal is `token:<sub>`: no user may be named like one.
            if u.name.contains(':') {
                return Err(ConfigError::Invalid(format!(
                    "user {:?}: a user's name cannot contain ':' (token principals are named token:<sub>)",
                    u.name
                )));
            }
            if !keys.insert(u.access_key.clone()) {
                return Err(ConfigError::Invalid(format!(
                    "access key {:?} is given to more than one user",
                    u.access_key
                )));
            }
        }
        let domains = if flags.domains.is_empty() {
            file.domains
                .unwrap_or_else(|| vec!["localhost".to_string()])
        } else {
            flags.domains
        };
        let kv_limits = KvLimits {
            leased_bytes: flags
                .kv_user_leased
                .or(file.kv_user_leased)
                .map_or(memory / 4, |b| b.0),
            reserved_bytes: flags
                .kv_user_reserved
                .or(file.kv_user_reserved)
                .map_or(memory / 4, |b| b.0),
            leases: flags.kv_user_leases.or(file.kv_user_leases).unwrap_or(4096),
        };
        if kv_limits.leases == 0 {
            return Err(ConfigError::Invalid(
                "--kv-user-leases must be positive".into(),
            ));
        }
        let body = BodyLimits {
            budget: flags
                .body_budget
                .or(file.body_budget)
                .map_or((memory / 2).clamp(64 << 20, 1 << 30), |b| b.0),
            timeout: std::time::Duration::from_secs(
                flags
                    .body_timeout_secs
                    .or(file.body_timeout_secs)
                    .unwrap_or(30),
            ),
            min_rate: flags
                .min_body_rate
                .or(file.min_body_rate)
                .map_or(64 << 10, |b| b.0),
        };
        if body.budget < 1 << 20 || body.timeout.is_zero() || body.min_rate == 0 {
            return Err(ConfigError::Invalid(
                "--body-budget must be at least 1MiB, --body-timeout-secs and --min-body-rate positive".into(),
            ));
        }
        let conductor_token = match flags
            .conductor_token_file
            .as_ref()
            .or(file.conductor_token_file.as_ref())
        {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .map_err(|e| {
                        ConfigError::Invalid(format!(
                            "cannot read --conductor-token-file {}: {e}",
                            path.display()
                        ))
                    })?
                    .trim()
                    .to_string(),
            ),
            None => None,
        };
        let max_connections = flags
            .max_connections
            .or(file.max_connections)
            .unwrap_or(4096);
        if max_connections == 0 {
            return Err(ConfigError::Invalid(
                "--max-connections must be positive".into(),
            ));
        }
        let tls = match (
            flags.tls_cert.or(file.tls_cert.clone()),
            flags.tls_key.or(file.tls_key.clone()),
        ) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => {
                return Err(ConfigError::Invalid(
                    "tls_cert and tls_key go together".into(),
                ))
            }
        };
        let mut keyring = Keyring::default();
        for key in &file.token_keys {
            key.add_to(&mut keyring, |p| std::fs::read(p))
                .map_err(|e| ConfigError::Invalid(format!("[[token_keys]]: {e}")))?;
        }
        if max_object_size == 0 {
            return Err(ConfigError::Invalid(
                "--max-object-size must be positive".into(),
            ));
        }
        if let Some(key) = cluster.as_ref().and_then(|c| c.key.as_ref()) {
            keyring
                .add_secret(CLUSTER_KID, key)
                .map_err(|e| ConfigError::Invalid(format!("--cluster-key-file: {e}")))?;
        }
        Ok(Settings {
            listen: flags.listen.or(file.listen).unwrap_or_else(|| {
                DEFAULT_LISTEN
                    .parse()
                    .expect("the default listen address is a valid socket address")
            }),
            data_dir: data_dir.clone(),
            tombstone_ttl: std::time::Duration::from_secs(
                flags
                    .tombstone_ttl_secs
                    .or(file.tombstone_ttl_secs)
                    .unwrap_or(86_400)
                    .clamp(1, 30 * 86_400),
            ),
            memory,
            prefault: flags.prefault || file.prefault.unwrap_or(false),
            shards,
            pin_shards: !(flags.no_pin || file.no_pin.unwrap_or(false)),
            presence_tables: !(flags.no_presence_tables
                || file.no_presence_tables.unwrap_or(false)),
            arena_views: !(flags.no_arena_views || file.no_arena_views.unwrap_or(false)),
            copy_threads,
            value_mirror_bytes: flags
                .value_mirror_bytes
                .or(file.value_mirror_bytes)
                .map_or(DEFAULT_VALUE_MIRROR_BYTES, |b| b.0),
            max_object_size,
            no_auth,
            bucket_exists_conflict: flags.bucket_exists_conflict
                || file.bucket_exists_conflict.unwrap_or(false),
            eviction,
            log_format,
            domains,
            multipart_timeout: std::time::Duration::from_secs(
                flags
                    .multipart_timeout_secs
                    .or(file.multipart_timeout_secs)
                    .unwrap_or(24 * 3600),
            ),
            users: file.users.into_iter().map(std::sync::Arc::new).collect(),
            node_name: flags.node_name.or(file.node_name).unwrap_or_else(|| {
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .map(|h| h.trim().to_string())
                    .ok()
                    .filter(|h| !h.is_empty())
                    .unwrap_or_else(|| "yutu".to_string())
            }),
            conductor: flags.conductor.or(file.conductor),
            durability,
            nvme_capacity,
            transfer_listen: flags
                .transfer_listen
                .or(file.transfer_listen)
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0))),
            nvme: (nvme_capacity > 0).then(|| nvme_path.clone()),
            kv_limits,
            body,
            max_connections,
            tls,
            keyring,
            advertise_url: flags.advertise_url.or(file.advertise_url),
            conductor_token,
            epoch: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(1),
            cluster,
            frames: Default::default(),
        })
    }

    /// DRAM bytes each shard owns.
    pub fn shard_memory(&self) -> u64 {
        self.memory / self.shards as u64
    }
}

/// Checks the cluster flags; adds the cluster key to the keyring.
fn cluster_settings(
    flags: &Flags,
    file: &FileConfig,
    etcd: Vec<String>,
    no_auth: bool,
) -> Result<ClusterSettings, ConfigError> {
    for url in &etcd {
        if !url.starts_with("http://") {
            return Err(ConfigError::Invalid(format!(
                "--etcd {url:?}: endpoints are http://host:port (etcd's client URL)"
            )));
        }
    }
    let name = flags
        .cluster
        .clone()
        .or(file.cluster.clone())
        .unwrap_or_else(|| "yutu".into());
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(ConfigError::Invalid(format!(
            "--cluster {name:?}: letters, digits, '-' and '_' only"
        )));
    }
    let replicas = flags.replicas.or(file.replicas).unwrap_or(1);
    if replicas == 0 || replicas > yutu_api::cluster::MAX_REPLICAS {
        return Err(ConfigError::Invalid(format!(
            "--replicas must be 1 to {}",
            yutu_api::cluster::MAX_REPLICAS
        )));
    }
    let ttl = flags.lease_ttl_secs.or(file.lease_ttl_secs).unwrap_or(10);
    if !(2..=300).contains(&ttl) {
        return Err(ConfigError::Invalid(
            "--lease-ttl-secs must be 2 to 300".into(),
        ));
    }
    let sync = flags
        .sync_interval_secs
        .or(file.sync_interval_secs)
        .unwrap_or(30);
    if !(1..=86_400).contains(&sync) {
        return Err(ConfigError::Invalid(
            "--sync-interval-secs must be 1 to 86400".into(),
        ));
    }
    let key =
        match flags
            .cluster_key_file
            .clone()
            .or(file.cluster_key_file.clone())
        {
            Some(path) => {
                let raw = std::fs::read(&path).map_err(|source| ConfigError::Read {
                    path: path.clone(),
                    source,
                })?;
                // As `yutu token issue --secret-file` reads it: the bytes, less a final newline.
                let secret = raw
                    .strip_suffix(b"\n")
                    .map(|s| s.strip_suffix(b"\r").unwrap_or(s))
                    .unwrap_or(&raw)
                    .to_vec();
                if secret.len() < 32 {
                    return Err(ConfigError::Invalid(format!(
                        "--cluster-key-file {}: the secret must have at least 32 bytes",
                        path.display()
                    )));
                }
                Some(secret)
            }
            None if no_auth => None,
            None => return Err(ConfigError::Invalid(
                "a cluster node needs --cluster-key-file (the secret every node of the cluster \
                 shares; create one with `openssl rand -hex 32 > FILE`) unless --no-auth"
                    .into(),
            )),
        };
    Ok(ClusterSettings {
        etcd,
        name,
        zone: flags.zone.clone().or(file.zone.clone()),
        replicas,
        lease_ttl: std::time::Duration::from_secs(ttl),
        key,
        rereplicate_rate: flags
            .rereplicate_rate
            .or(file.rereplicate_rate)
            .map_or(256 << 20, |b| b.0)
            .max(1),
        sync_interval: std::time::Duration::from_secs(sync),
    })
}

fn load_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    toml::from_str(&text).map_err(|source| ConfigError::Parse {
        path: path.to_path_buf(),
        source: Box::new(source),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_file_override_defaults() {
        // Removed when the test ends, whatever happens.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "memory = \"64MiB\"\nshards = 2\nmax_object_size = 1048576\n",
        )
        .unwrap();
        let s = Settings::resolve(Flags {
            config: Some(path.clone()),
            shards: Some(1),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(s.memory, 64 << 20);
        assert_eq!(s.shards, 1);
        assert_eq!(s.max_object_size, 1 << 20);
        assert_eq!(s.listen.to_string(), DEFAULT_LISTEN);
        assert!(s.pin_shards, "shards are pinned by default");
        std::fs::write(&path, "memory = \"64MiB\"\nno_pin = true\n").unwrap();
        let s = Settings::resolve(Flags {
            config: Some(path.clone()),
            ..Default::default()
        })
        .unwrap();
        assert!(!s.pin_shards, "no_pin in the file");
        assert!(s.presence_tables, "presence tables are on by default");
        std::fs::write(&path, "memory = \"64MiB\"\nno_presence_tables = true\n").unwrap();
        let s = Settings::resolve(Flags {
            config: Some(path.clone()),
            ..Default::default()
        })
        .unwrap();
        assert!(!s.presence_tables, "no_presence_tables in the file");
        std::fs::write(&path, "memory = \"64MiB\"\ncopy_threads = 1\n").unwrap();
        let s = Settings::resolve(Flags {
            config: Some(path.clone()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(s.copy_threads, 1, "copy_threads in the file");
        let err = Settings::resolve(Flags {
            config: Some(path.clone()),
            copy_threads: Some(0),
            ..Default::default()
        })
        .unwrap_err();
        assert!(
            err.to_string().contains("--copy-threads must be 1"),
            "{err}"
        );
        std::fs::write(&path, "memroy = 1\n").unwrap();
        let err = Settings::resolve(Flags {
            config: Some(path),
            ..Default::default()
        })
        .unwrap_err();
        assert!(err.to_string().contains("memroy"), "{err}");
    }

    #[test]
    fn refuses_tiny_shards() {
        let err = Settings::resolve(Flags {
            memory: Some(ByteSize(1 << 20)),
            shards: Some(4),
            ..Default::default()
        })
        .unwrap_err();
        assert!(err.to_string().contains("less than"), "{err}");
    }
}
