//! Starting the node: one pinned glommio executor per shard, a channel mesh between them,
//! and one listening socket per shard on the same port.
//!
//! The listening sockets use SO_REUSEPORT so the kernel spreads incoming connections over the
//! shards. The first socket is bound before any shard starts, which fixes the port (also when
//! the configured port is 0) before the others join it.

use std::net::SocketAddr;
use std::os::fd::{FromRawFd, IntoRawFd};
use std::rc::Rc;
use std::sync::Arc;

use glommio::channels::channel_mesh::MeshBuilder;
use glommio::net::TcpListener;
use glommio::{LocalExecutorBuilder, Placement};

use super::catalog::{BucketRecord, Catalog};
use super::quota::{self, BucketUsage};
use super::shard::{Job, Shard};
use super::shutdown::{DrainBarrier, StopFlag, StopSignal};
use crate::config::{EvictionKind, Settings};
use crate::metrics::ShardMetrics;
use crate::net::budget::BodyBudget;
use crate::node::sessions::PeerSessions;
use crate::store::arena::Arena;
use crate::store::eviction::{EvictionPolicy, Lru};
use crate::store::kv::Grants;
use crate::store::ShardStore;
use crate::tier::TieredStore;

/// What runs on each shard once it is ready: the node's services (HTTP, events), given the
/// shard and its listening socket. Supplied by the layers above this one.
pub type Serve = Arc<
    dyn Fn(Rc<Shard>, TcpListener) -> futures::future::LocalBoxFuture<'static, ()> + Send + Sync,
>;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot listen on {0}: the address is in use (another node, or another program, listens there)")]
    InUse(SocketAddr),
    #[error("cannot set up TLS: {0}")]
    Tls(String),
    #[error("cannot start shard {shard}: {message}")]
    Shard { shard: usize, message: String },
    #[error("shard {0} stopped during start-up")]
    ShardDied(usize),
    #[error("{0}")]
    Catalog(String),
}

/// Depth of each shard-to-shard channel.
const MESH_CHANNEL_DEPTH: usize = 1024;
/// Memory glommio registers (and locks) per executor for DMA buffers. The NVMe tier's buffers
/// beyond it come from the heap at no measurable cost, and locked memory counts against the
/// node's RSS bound, so it is kept small.
const EXECUTOR_IO_MEMORY: usize = 2 << 20;
/// With an NVMe tier, a larger pool: reads and writes of the region store then reuse
/// registered buffers instead of faulting in fresh memory (about twice the read bandwidth).
const EXECUTOR_IO_MEMORY_NVME: usize = 16 << 20;

/// A running node.
pub struct Node {
    pub addr: SocketAddr,
    handles: Vec<glommio::ExecutorJoinHandle<()>>,
}

impl Node {
    /// Blocks until every shard has stopped (in practice: until the process is killed).
    pub fn join(self) {
        for h in self.handles {
            let _ = h.join();
        }
    }
}

/// How long [`bind_first`] keeps trying an address in use before it gives up. The shards
/// accept through io_uring, and when a node is SIGKILLed the kernel tears its rings down after
/// the process is gone: until then the accepts still pending keep its listening sockets (and
/// the connections they accepted) open, for tens of milliseconds or more on a busy host. A
/// restart at once would find its port taken and fail; it waits for them instead. A live node
/// on the address keeps it taken, so a second node is still refused, after this long.
const BIND_RETRY: std::time::Duration = std::time::Duration::from_secs(3);
/// Pause between two tries.
const BIND_RETRY_EVERY: std::time::Duration = std::time::Duration::from_millis(25);

fn bind_first(addr: SocketAddr) -> Result<std::net::TcpListener, StartError> {
    let deadline = std::time::Instant::now() + BIND_RETRY;
    let mut waited = false;
    loop {
        match try_bind_first(addr) {
            Err(StartError::InUse(_)) if std::time::Instant::now() < deadline => {
                if !waited {
                    tracing::info!(%addr, "the address is in use; waiting for a previous run's sockets to close");
                    waited = true;
                }
                std::thread::sleep(BIND_RETRY_EVERY);
            }
            other => return other,
        }
    }
}

fn try_bind_first(addr: SocketAddr) -> Result<std::net::TcpListener, StartError> {
    let err = |source| StartError::Listen { addr, source };
    let domain = socket2::Domain::for_address(addr);
    let sock = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))
        .map_err(err)?;
    sock.set_reuse_address(true).map_err(err)?;
    // Bound without SO_REUSEPORT, so the bind fails while any other socket (another node,
    // whose shards all set SO_REUSEPORT) listens on the address: with it, a second node would
    // join the first's port and the kernel would split the connections between them. Set
    // after the bind, it lets this node's other shards join this socket's port.
    sock.bind(&addr.into()).map_err(|e| match e.kind() {
        std::io::ErrorKind::AddrInUse => StartError::InUse(addr),
        _ => err(e),
    })?;
    sock.set_reuse_port(true).map_err(err)?;
    sock.listen(1024).map_err(err)?;
    Ok(sock.into())
}

/// The listening socket of a shard other than the first: it joins the port `bind_first` holds
/// (SO_REUSEPORT) and sets SO_REUSEADDR as that one does. The connections a listener accepts
/// inherit its options, and when the process dies (SIGKILL, or a SIGTERM that closes them
/// first) they linger in TIME_WAIT or FIN_WAIT2 for up to a minute; the kernel lets the next
/// run's `bind_first` (SO_REUSEADDR, no SO_REUSEPORT) share the port with them only if they
/// carry SO_REUSEADDR too. Without it here, a node restarted on its port failed with "address
/// in use" for about a minute after any connection accepted by shards 1 and up.
fn bind_shard(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let domain = socket2::Domain::for_address(addr);
    let sock = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
    sock.set_reuse_address(true)?;
    sock.set_reuse_port(true)?;
    sock.bind(&addr.into())?;
    sock.listen(1024)?;
    Ok(sock.into())
}

fn policy(kind: EvictionKind) -> Box<dyn EvictionPolicy> {
    match kind {
        EvictionKind::Lru => Box::new(Lru::new()),
    }
}

/// Starts every shard and returns once all of them are accepting connections.
/// How long a stopping shard waits for the requests in progress before it stops anyway.
const DRAIN_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// Starts every shard and returns once all of them are accepting connections. Raising `stop`
/// stops them gracefully; [`Node::join`] returns when all have stopped.
pub fn start(settings: Settings, serve: Serve, stop: StopFlag) -> Result<Node, StartError> {
    // The node's versions carry its id (see `model::version`).
    crate::model::version::CLOCK.set_node(crate::model::version::node_id(&settings.node_name));
    let buckets = Catalog::new(&settings.data_dir)
        .load()
        .map_err(|e| StartError::Catalog(e.to_string()))?;
    if !buckets.is_empty() {
        tracing::info!(buckets = buckets.len(), "bucket catalog loaded");
    }
    let engine = start_engine(&settings)?;
    let peers = Arc::new(PeerSessions::default());
    let usage = Arc::new(BucketUsage::new(settings.shards));
    let body_budget = Arc::new(BodyBudget::new(settings.body.budget));
    let settings = Arc::new(settings);
    let n = settings.shards;
    let first = bind_first(settings.listen)?;
    let addr = first.local_addr().map_err(|source| StartError::Listen {
        addr: settings.listen,
        source,
    })?;
    let mut first_fd = Some(first.into_raw_fd());
    let metrics: Arc<Vec<Arc<ShardMetrics>>> =
        Arc::new((0..n).map(|_| Arc::new(ShardMetrics::default())).collect());
    let mesh = MeshBuilder::<Job, _>::full(n, MESH_CHANNEL_DEPTH);
    let cpus = std::thread::available_parallelism()
        .map(|c| c.get())
        .unwrap_or(1);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<usize, String>>();
    let barrier = DrainBarrier::new(n);

    let mut handles = Vec::with_capacity(n);
    for i in 0..n {
        let placement = if settings.pin_shards && n <= cpus {
            Placement::Fixed(i)
        } else {
            Placement::Unbound
        };
        let settings = settings.clone();
        let metrics = metrics.clone();
        let mesh = mesh.clone();
        let ready = ready_tx.clone();
        let fd = if i == 0 { first_fd.take() } else { None };
        let buckets = buckets.clone();
        let engine = engine.clone();
        let peers = peers.clone();
        let usage = usage.clone();
        let body_budget = body_budget.clone();
        let serve = serve.clone();
        let stop = stop.clone();
        let barrier = barrier.clone();
        let handle = LocalExecutorBuilder::new(placement)
            .name(&format!("yutu-shard-{i}"))
            .io_memory(if settings.nvme.is_some() {
                EXECUTOR_IO_MEMORY_NVME
            } else {
                EXECUTOR_IO_MEMORY
            })
            .spawn(move || async move {
                let start = ShardStart {
                    settings,
                    metrics,
                    mesh,
                    fd,
                    addr,
                    buckets,
                    engine,
                    peers,
                    usage,
                    body_budget,
                    serve,
                    stop,
                    barrier,
                };
                if let Err(message) = run_shard(start, ready.clone()).await {
                    let _ = ready.send(Err(message));
                }
            })
            .map_err(|e| StartError::Shard {
                shard: i,
                message: e.to_string(),
            })?;
        handles.push(handle);
    }
    drop(ready_tx);
    for i in 0..n {
        match ready_rx.recv() {
            Ok(Ok(_)) => {}
            Ok(Err(message)) => return Err(StartError::Shard { shard: i, message }),
            Err(_) => return Err(StartError::ShardDied(i)),
        }
    }
    Ok(Node { addr, handles })
}

/// What one shard starts from, handed to its executor thread.
struct ShardStart {
    settings: Arc<Settings>,
    metrics: Arc<Vec<Arc<ShardMetrics>>>,
    mesh: MeshBuilder<Job, glommio::channels::channel_mesh::Full>,
    /// The pre-bound listening socket, for the first shard.
    fd: Option<i32>,
    addr: SocketAddr,
    buckets: Vec<BucketRecord>,
    engine: yutu_transfer::TransferEngine,
    peers: Arc<PeerSessions>,
    usage: Arc<BucketUsage>,
    body_budget: Arc<BodyBudget>,
    serve: Serve,
    stop: StopFlag,
    barrier: DrainBarrier,
}

async fn run_shard(
    start: ShardStart,
    ready: std::sync::mpsc::Sender<Result<usize, String>>,
) -> Result<(), String> {
    let ShardStart {
        settings,
        metrics,
        mesh,
        fd,
        addr,
        buckets,
        engine,
        peers,
        usage,
        body_budget,
        serve,
        stop,
        barrier,
    } = start;
    let n = settings.shards;
    // Every shard joins the mesh; its position in the mesh is its shard id.
    let (senders, mut receivers) = mesh
        .join()
        .await
        .map_err(|_| "cannot join the shard mesh".to_string())?;
    let id = senders.peer_id();
    let listener = match fd {
        // SAFETY: the descriptor came from `bind_first`, which gave up ownership of it with
        // `into_raw_fd`; it is moved here exactly once.
        Some(fd) => unsafe { TcpListener::from_raw_fd(fd) },
        None => {
            let sock = bind_shard(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
            // SAFETY: `into_raw_fd` gives up the descriptor, which the listener now owns.
            unsafe { TcpListener::from_raw_fd(sock.into_raw_fd()) }
        }
    };
    let shard_memory = settings.shard_memory();
    // One allocator node per 1 KiB of capacity bounds the object count (and the index
    // memory) while leaving room for small objects; see `Arena::new`.
    let max_objects = (shard_memory / 1024).clamp(4096, 1 << 22) as u32;
    let mut arena = Arena::new(&format!("yutu-shard-{id}"), shard_memory, max_objects)
        .map_err(|e| e.to_string())?;
    if settings.prefault {
        arena
            .prefault(format!("yutu-prefault-{id}"))
            .map_err(|e| format!("cannot start prefaulting the arena: {e}"))?;
    }
    let nvme = match &settings.nvme {
        Some(path) => Some(Rc::new(
            crate::tier::nvme::open(path, settings.nvme_capacity, id as u32, n as u32).await?,
        )),
        None => None,
    };
    let region = yutu_transfer::MemoryRegion::map_memfd(arena.memfd(), arena.capacity() as usize)
        .map_err(|e| format!("cannot map the arena for the transfer engine: {e}"))?;
    let grants = Arc::new(Grants::default());
    let segment = engine
        .register_guarded(region, grants.clone())
        .map_err(|e| format!("cannot register the arena with the transfer engine: {e}"))?;
    let mut store = ShardStore::new(arena, policy(settings.eviction), metrics[id].clone());
    store.set_grants(grants);
    store.set_kv_limits(settings.kv_limits.per_shard(n));
    if nvme.is_some() {
        // Objects waiting for their NVMe append: an eighth of the shard's DRAM, at most 64 MiB.
        store.enable_demotion((shard_memory / 8).min(64 << 20));
    }
    for b in &buckets {
        store.add_bucket(
            &b.name,
            b.created(),
            &b.owner,
            b.durability,
            b.incarnation(),
        );
        if let Some(s) = store.bucket_settings_mut(&b.name) {
            s.quota = b.quota;
            s.acl = b.acl.clone();
            s.set_cors(b.cors.clone());
            s.set_policy(&b.name, b.policy.as_deref());
            s.public_access_block = b.public_access_block;
            s.ownership = b.ownership;
        }
    }
    if settings.conductor.is_some() {
        store.record_events();
    }
    if let Some(nvme) = &nvme {
        let report = nvme.recovery_report();
        tracing::info!(shard = id, report = ?report, "NVMe tier recovered");
    }
    let tier = Rc::new(TieredStore::new(store, nvme, metrics[id].clone()));
    tier.set_tombstone_ttl(settings.tombstone_ttl);
    tier.set_presence_tables(settings.presence_tables);
    tier.set_mirror_budget(settings.value_mirror_bytes);
    let sink_usage = usage.clone();
    tier.on_usage_change(Box::new(move |bucket, bytes| {
        sink_usage.set_shard(bucket, id, bytes)
    }));
    let mut shard = Shard::new(
        id,
        n,
        settings.clone(),
        tier.clone(),
        metrics,
        (n > 1).then_some(senders),
        StopSignal::watch(stop),
    );
    shard.transfer = Some((engine, segment));
    shard.peers = peers;
    shard.usage = usage;
    shard.body_budget = body_budget;
    let shard = Rc::new(shard);
    spawn_kv_expiry(shard.clone());
    spawn_usage_publisher(shard.clone());
    if id == 0 {
        spawn_peer_expiry(shard.clone());
    }
    tier.spawn_background();
    for (_, receiver) in receivers.streams() {
        let shard = shard.clone();
        glommio::spawn_local(async move {
            while let Some(job) = receiver.recv().await {
                shard.execute(job);
            }
        })
        .detach();
    }
    spawn_upload_reaper(shard.clone());
    tracing::info!(shard = id, memory = shard_memory, "shard ready");
    let _ = ready.send(Ok(id));
    serve(shard.clone(), listener).await;
    drain(&shard, &barrier).await;
    Ok(())
}

/// After the listener closed: waits for the connections in progress (up to a deadline), then
/// for the other shards to do the same (serving their jobs meanwhile), then makes everything
/// appended to NVMe durable.
async fn drain(shard: &Shard, barrier: &DrainBarrier) {
    let deadline = std::time::Instant::now() + DRAIN_DEADLINE;
    let left = shard.connections.drained(deadline).await;
    if left > 0 {
        tracing::warn!(
            shard = shard.id,
            connections = left,
            "stopping with connections still open"
        );
    }
    // A little past the connections' deadline, so that a shard that gave up on its own
    // connections at the deadline still counts as drained here.
    let others = barrier
        .arrive_and_wait(deadline + std::time::Duration::from_secs(1))
        .await;
    if others > 0 {
        tracing::warn!(
            shard = shard.id,
            shards = others,
            "stopping while other shards still drain"
        );
    }
    if let Some(nvme) = &shard.tier.nvme {
        if let Err(e) = nvme.flush().await {
            tracing::error!(shard = shard.id, error = %e, "cannot flush the NVMe tier");
        }
    }
    tracing::info!(shard = shard.id, "shard stopped");
}

/// The node's transfer engine: a TCP listener (and a shared-memory socket for same-host
/// peers) serving one-sided reads and writes of the shards' arenas.
fn start_engine(settings: &Settings) -> Result<yutu_transfer::TransferEngine, StartError> {
    let id = u64::from_le_bytes(
        blake3::hash(settings.node_name.as_bytes()).as_bytes()[..8]
            .try_into()
            .unwrap_or([0; 8]),
    );
    let mut cfg = yutu_transfer::EngineConfig::new(yutu_transfer::NodeId(id));
    cfg.tcp_listen = Some(settings.transfer_listen);
    // Many clients: one client engine's transfers hold at most two of the eight workers, and
    // a client engine that stops answering is given up on after ten seconds per step (with
    // at most two calls per user in flight, one user holds at most half the workers).
    cfg.workers = 8;
    cfg.workers_per_peer = 2;
    cfg.io_timeout = std::time::Duration::from_secs(10);
    let shm_dir = settings.data_dir.join("transfer");
    std::fs::create_dir_all(&shm_dir).map_err(|e| StartError::Shard {
        shard: 0,
        message: format!("cannot create {}: {e}", shm_dir.display()),
    })?;
    cfg.shm_dir = Some(shm_dir.clone());
    match yutu_transfer::TransferEngine::start(cfg.clone()) {
        Ok(engine) => Ok(engine),
        Err(e) => {
            // A Unix socket path is limited to ~100 bytes, so a deep data directory can rule
            // out shared memory; the node still serves over TCP.
            tracing::warn!(error = %e, dir = %shm_dir.display(), "no shared-memory transport; using TCP only");
            cfg.shm_dir = None;
            yutu_transfer::TransferEngine::start(cfg).map_err(|e| StartError::Shard {
                shard: 0,
                message: format!("cannot start the transfer engine: {e}"),
            })
        }
    }
}

/// Ends expired read leases and reclaims put-starts never ended, ten times a second.
fn spawn_kv_expiry(shard: Rc<Shard>) {
    glommio::spawn_local(async move {
        loop {
            glommio::timer::sleep(std::time::Duration::from_millis(100)).await;
            let (leases, puts) = shard.tier.expire_kv(std::time::Instant::now());
            if leases + puts > 0 {
                tracing::debug!(shard = shard.id, leases, puts, "expired KV leases and puts");
            }
            // Quota held for puts revoked or expired since: given back (dropped once the
            // maps' borrows end, since an admission reads the store when it goes).
            let released: Vec<_> = {
                let mut held = shard.kv_admitted.borrow_mut();
                let gone: Vec<u64> = held
                    .keys()
                    .filter(|id| !shard.tier.put_pending(**id))
                    .copied()
                    .collect();
                gone.iter().filter_map(|id| held.remove(id)).collect()
            };
            drop(released);
        }
    })
    .detach();
}

/// Republishes this shard's bytes per bucket (for quotas and HeadBucket) every
/// [`quota::PUBLISH_EVERY`]: evictions, reclaims and deletes change them without a write.
/// Shard 0 also forgets deleted buckets.
fn spawn_usage_publisher(shard: Rc<Shard>) {
    glommio::spawn_local(async move {
        loop {
            glommio::timer::sleep(quota::PUBLISH_EVERY).await;
            quota::publish_all(&shard.usage, shard.id, &shard.tier);
            if shard.id == 0 {
                shard.usage.retain(|b| shard.tier.bucket_known(b));
            }
        }
    })
    .detach();
}

/// Ends client sessions unused for their idle time, with their peer entries (and so the
/// pooled connections to them), every few seconds. Shard 0 does it for the node.
fn spawn_peer_expiry(shard: Rc<Shard>) {
    glommio::spawn_local(async move {
        loop {
            glommio::timer::sleep(std::time::Duration::from_secs(5)).await;
            let gone = shard.peers.expire(std::time::Instant::now());
            if let Some((engine, _)) = &shard.transfer {
                for address in &gone {
                    engine.remove_peer(address.node);
                }
            }
            if !gone.is_empty() {
                tracing::debug!(sessions = gone.len(), "ended idle client sessions");
            }
        }
    })
    .detach();
}

/// Aborts multipart uploads older than the configured timeout, checking a few times per
/// timeout (at most once a minute, at least once a second).
fn spawn_upload_reaper(shard: Rc<Shard>) {
    let timeout = shard.settings.multipart_timeout;
    let period = (timeout / 4).clamp(
        std::time::Duration::from_secs(1),
        std::time::Duration::from_secs(60),
    );
    glommio::spawn_local(async move {
        loop {
            glommio::timer::sleep(period).await;
            if let Some(cutoff) = std::time::SystemTime::now().checked_sub(timeout) {
                let reaped = shard.tier.reap_uploads(cutoff);
                if reaped > 0 {
                    tracing::info!(
                        shard = shard.id,
                        reaped,
                        "reaped abandoned multipart uploads"
                    );
                }
            }
        }
    })
    .detach();
}
