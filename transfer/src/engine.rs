//! The transfer engine: registration, peers, batch submission, and the threads behind them.
//!
//! One engine per process (the storage node, or a client). It owns the listeners that serve its
//! registered segments to peers and the workers that initiate its own transfers; both sides
//! are symmetric, so the storage node can write into a client's registered buffer (get-into)
//! exactly as a client writes into the node's arena (put).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::address::NodeAddress;
use crate::batch::{BatchHandle, BatchResult, BatchState};
use crate::descriptor::{NodeId, SegmentDescriptor};
use crate::error::{Side, TransferError};
use crate::proof::{Prover, Secret, TrustedSecrets};
use crate::region::MemoryRegion;
use crate::request::TransferRequest;
use crate::segment::{LocalSegment, SegmentTable};
use crate::select::{self, LocalPaths, PathHealth};
use crate::stats::{EngineStats, ListenerCounters, TransportCounters};
use crate::transport::rdma::{self, RdmaError, RdmaOptions};
use crate::transport::shm::listener::{ShmListenOptions, ShmListener};
use crate::transport::shm::{DirectRange, ShmTransport};
use crate::transport::tcp::listener::{ListenOptions, TcpTransferListener};
use crate::transport::tcp::TcpTransport;
use crate::transport::{SliceOp, Transport, TransportKind};
use crate::worker::{Job, Paths, Peer, WorkerPool};

/// Whether the engine uses RDMA.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RdmaMode {
    /// Never.
    Off,
    /// When built with the `rdma` feature and a device with an active port exists; otherwise the
    /// reason is kept ([`TransferEngine::rdma_unavailable`]) and the other paths are used.
    #[default]
    Auto,
    /// Fail [`TransferEngine::start`] when RDMA cannot be used.
    Require,
}

/// How to start a [`TransferEngine`]. Start from [`EngineConfig::new`] and set what differs.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub node: NodeId,
    /// Overrides the host id (the kernel's boot id) that decides whether shm is possible. Tests
    /// use it to make two engines on one machine look remote to each other.
    pub host: Option<String>,
    /// Directory for the shm listener's Unix socket; `None` runs no shm listener (this engine's
    /// segments are then not reachable over shm, but it can still use shm towards peers).
    pub shm_dir: Option<PathBuf>,
    /// Mode of the shm socket. `0o600`: only processes of the same user may map segments.
    pub shm_socket_mode: u32,
    /// Address of the tcp transfer listener; `None` runs none (peers then cannot reach this
    /// engine's segments over tcp).
    pub tcp_listen: Option<SocketAddr>,
    /// What peers should connect to, when it differs from the bound address (e.g. bound to
    /// `0.0.0.0`).
    pub tcp_advertise: Option<SocketAddr>,
    pub rdma: RdmaMode,
    /// The RDMA device to use (e.g. `mlx5_0`); the first one with an active port by default.
    pub rdma_device: Option<String>,
    /// Address of the RDMA handshake listener; by default the tcp listener's IP, any port.
    pub rdma_listen: Option<SocketAddr>,
    /// Worker threads initiating transfers; also the most connections one large transfer is
    /// spread over.
    pub workers: usize,
    /// The most workers one peer's transfers may occupy at once (`workers` or more: no cap).
    /// A node serving many clients keeps it below `workers`, so that a peer that stops
    /// answering holds only its share until its I/O deadlines fire.
    pub workers_per_peer: usize,
    /// Transfers larger than this are cut into slices of this size, spread over the workers.
    pub slice_size: u64,
    /// Limit for one blocking step on the initiator side (connect, one read or write).
    pub io_timeout: Duration,
    /// A listener closes a connection that stays silent this long (including one stalled in
    /// the middle of a frame).
    pub idle_timeout: Duration,
    /// Connections each listener keeps at most; more are closed at once.
    pub max_connections: usize,
    /// How long a path that failed for a peer is tried last for that peer.
    pub path_cooldown: Duration,
}

impl EngineConfig {
    /// Defaults for a node: tcp on an ephemeral loopback port, no shm socket, RDMA when
    /// available, four workers, 1 MiB slices.
    pub fn new(node: NodeId) -> EngineConfig {
        EngineConfig {
            node,
            host: None,
            shm_dir: None,
            shm_socket_mode: 0o600,
            tcp_listen: Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0)),
            tcp_advertise: None,
            rdma: RdmaMode::Auto,
            rdma_device: None,
            rdma_listen: None,
            workers: 4,
            workers_per_peer: 4,
            slice_size: 1 << 20,
            io_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(300),
            max_connections: 1024,
            path_cooldown: Duration::from_secs(10),
        }
    }
}

/// A handle to a running engine. Clones share it; the engine stops (listeners closed, queued
/// transfers finished, workers joined) when the last clone is dropped.
#[derive(Clone)]
pub struct TransferEngine {
    inner: Arc<EngineInner>,
}

struct EngineInner {
    address: NodeAddress,
    local: LocalPaths,
    slice_size: u64,
    path_cooldown: Duration,
    segments: Arc<SegmentTable>,
    peers: RwLock<HashMap<NodeId, Arc<Peer>>>,
    /// The challengers this engine's listeners answer (`trust`), shared with them.
    trusted: Arc<TrustedSecrets>,
    paths: Arc<Paths>,
    shm: Arc<ShmTransport>,
    rdma_error: Option<RdmaError>,
    pool: WorkerPool,
    tcp_counters: Arc<ListenerCounters>,
    shm_counters: Arc<ListenerCounters>,
    rdma_counters: Arc<ListenerCounters>,
    // Listeners last: they stop after the workers have drained (see `Drop`).
    _rdma: Option<rdma::Started>,
    _tcp_listener: Option<TcpTransferListener>,
    _shm_listener: Option<ShmListener>,
}

impl Drop for EngineInner {
    fn drop(&mut self) {
        // Workers first: a queued transfer to this very engine still finds its listeners.
        self.pool.shutdown();
    }
}

impl TransferEngine {
    /// Starts the listeners and workers the configuration asks for.
    pub fn start(config: EngineConfig) -> Result<TransferEngine, TransferError> {
        let incarnation =
            crate::sys::random_u64().map_err(|e| TransferError::setup("read /dev/urandom", e))?;
        let host = config.host.clone().unwrap_or_else(crate::sys::host_id);
        let segments = Arc::new(SegmentTable::new(config.node, incarnation));
        let tcp_counters = Arc::new(ListenerCounters::default());
        let shm_counters = Arc::new(ListenerCounters::default());
        let rdma_counters = Arc::new(ListenerCounters::default());
        let trusted = Arc::new(TrustedSecrets::default());
        let prover = Prover {
            node: config.node,
            trusted: Arc::clone(&trusted),
        };

        let tcp_listener = match config.tcp_listen {
            Some(bind) => Some(TcpTransferListener::start(
                bind,
                Arc::clone(&segments),
                ListenOptions {
                    idle_timeout: config.idle_timeout,
                    max_connections: config.max_connections,
                    prover: prover.clone(),
                },
                Arc::clone(&tcp_counters),
            )?),
            None => None,
        };
        let shm_listener = match &config.shm_dir {
            Some(dir) => Some(ShmListener::start(
                dir,
                Arc::clone(&segments),
                ShmListenOptions {
                    node: config.node,
                    incarnation,
                    mode: config.shm_socket_mode,
                    idle_timeout: config.idle_timeout,
                    max_connections: config.max_connections,
                    prover,
                },
                Arc::clone(&shm_counters),
            )?),
            None => None,
        };

        let (rdma_started, rdma_error) = match config.rdma {
            RdmaMode::Off => (None, Some(RdmaError::Disabled)),
            mode => {
                let bind = config.rdma_listen.unwrap_or_else(|| {
                    let ip = config
                        .tcp_listen
                        .map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), |a| a.ip());
                    SocketAddr::new(ip, 0)
                });
                let opts = RdmaOptions {
                    node: config.node,
                    incarnation,
                    device: config.rdma_device.clone(),
                    listen: bind,
                    io_timeout: config.io_timeout,
                    idle_timeout: config.idle_timeout,
                    max_connections: config.max_connections,
                };
                match rdma::start(opts, Arc::clone(&segments), Arc::clone(&rdma_counters)) {
                    Ok(started) => (Some(started), None),
                    Err(err) if mode == RdmaMode::Require => return Err(err.into()),
                    Err(err) => {
                        tracing::info!(%err, "rdma unavailable, using shm and tcp");
                        (None, Some(err))
                    }
                }
            }
        };

        let shm = Arc::new(ShmTransport::new(config.io_timeout));
        let mut transports: HashMap<TransportKind, Arc<dyn Transport>> = HashMap::new();
        transports.insert(
            TransportKind::Tcp,
            Arc::new(TcpTransport {
                io_timeout: config.io_timeout,
            }),
        );
        transports.insert(TransportKind::Shm, Arc::clone(&shm) as Arc<dyn Transport>);
        if let Some(started) = &rdma_started {
            transports.insert(TransportKind::Rdma, Arc::clone(&started.transport));
        }
        let counters = transports
            .keys()
            .map(|k| (*k, TransportCounters::default()))
            .collect();
        let paths = Arc::new(Paths {
            transports,
            counters,
        });
        let pool = WorkerPool::start(config.workers, config.workers_per_peer, Arc::clone(&paths))
            .map_err(|e| TransferError::setup("start the transfer workers", e))?;

        let address = NodeAddress {
            node: config.node,
            incarnation,
            host: host.clone(),
            shm: shm_listener.as_ref().map(|l| l.path.clone()),
            tcp: config
                .tcp_advertise
                .or_else(|| tcp_listener.as_ref().map(|l| l.addr)),
            rdma: rdma_started.as_ref().map(|s| s.endpoint.clone()),
        };
        let local = LocalPaths {
            host,
            rdma: rdma_started.is_some(),
            shm: true,
            tcp: true,
        };
        let inner = EngineInner {
            address: address.clone(),
            local,
            slice_size: config.slice_size.max(4096),
            path_cooldown: config.path_cooldown,
            segments,
            peers: RwLock::new(HashMap::new()),
            trusted,
            paths,
            shm,
            rdma_error,
            pool,
            tcp_counters,
            shm_counters,
            rdma_counters,
            _rdma: rdma_started,
            _tcp_listener: tcp_listener,
            _shm_listener: shm_listener,
        };
        let engine = TransferEngine {
            inner: Arc::new(inner),
        };
        // Transfers between two segments of this engine go through its own listeners.
        engine.add_peer(address);
        Ok(engine)
    }

    pub fn node(&self) -> NodeId {
        self.inner.address.node
    }

    /// What peers need to reach this engine; publish it on the control plane.
    pub fn address(&self) -> NodeAddress {
        self.inner.address.clone()
    }

    /// The transports this engine can initiate, best first.
    pub fn paths(&self) -> Vec<TransportKind> {
        let local = &self.inner.local;
        TransportKind::ALL
            .into_iter()
            .filter(|k| match k {
                TransportKind::Rdma => local.rdma,
                TransportKind::Shm => local.shm,
                TransportKind::Tcp => local.tcp,
            })
            .collect()
    }

    /// Why RDMA is not in use (`None` when it is).
    pub fn rdma_unavailable(&self) -> Option<&RdmaError> {
        self.inner.rdma_error.as_ref()
    }

    /// Registers a region; its bytes become reachable by peers holding descriptors minted from
    /// the returned handle. Over shm only if the region is sealed ([`MemoryRegion::sealed`]).
    pub fn register(&self, region: MemoryRegion) -> Result<LocalSegment, TransferError> {
        self.register_inner(region, None)
    }

    /// Registers a region whose ranges stay accessible only while `guard` allows them (a
    /// storage node's leases); see [`crate::RangeGuard`].
    pub fn register_guarded(
        &self,
        region: MemoryRegion,
        guard: Arc<dyn crate::RangeGuard>,
    ) -> Result<LocalSegment, TransferError> {
        self.register_inner(region, Some(guard))
    }

    fn register_inner(
        &self,
        region: MemoryRegion,
        guard: Option<Arc<dyn crate::RangeGuard>>,
    ) -> Result<LocalSegment, TransferError> {
        if region.device().is_some() {
            return self.register_device(region, guard);
        }
        let segment = self.inner.segments.insert(region, true, guard)?;
        for transport in self.inner.paths.transports.values() {
            if let Err(err) = transport.register(&segment) {
                // Not fatal: the other paths still reach the segment, and requests that need
                // this one fail over to them.
                tracing::warn!(%err, kind = %transport.kind(), segment = %segment.id(), "cannot register segment");
            }
        }
        Ok(segment)
    }

    /// GPU memory ([`MemoryRegion::device_memory`]) is reachable only by the NIC, so it is
    /// registered with the rdma transport or not at all: without rdma, or when the NIC refuses
    /// the device address (no peer-memory module), registration fails and nothing stays
    /// registered.
    fn register_device(
        &self,
        region: MemoryRegion,
        guard: Option<Arc<dyn crate::RangeGuard>>,
    ) -> Result<LocalSegment, TransferError> {
        let Some(rdma) = self.inner.paths.transports.get(&TransportKind::Rdma) else {
            let reason = match self.rdma_unavailable() {
                Some(why) => format!("this engine has no rdma transport ({why})"),
                None => "this engine has no rdma transport".to_string(),
            };
            return Err(TransferError::DeviceMemory { reason });
        };
        let segment = self.inner.segments.insert(region, false, guard)?;
        if let Err(err) = rdma.register(&segment) {
            self.inner.segments.remove(segment.id());
            return Err(TransferError::DeviceMemory {
                reason: format!("the NIC refused the device address: {err}"),
            });
        }
        Ok(segment)
    }

    /// Stops serving a segment to peers: requests that arrive after this are refused
    /// ([`crate::Refusal::UnknownSegment`]). Requests already being served finish, and
    /// same-host peers keep the mappings they made (see the crate docs); the memory stays
    /// mapped until every handle and in-flight transfer is gone. Returns false if it was not
    /// registered.
    pub fn unregister(&self, segment: &LocalSegment) -> bool {
        let removed = self.inner.segments.remove(segment.id()).is_some();
        if removed {
            for transport in self.inner.paths.transports.values() {
                transport.unregister(segment.id());
            }
        }
        removed
    }

    /// The segment table itself, for tests that register what `register` would refuse here
    /// (GPU memory without an RDMA device).
    #[cfg(test)]
    pub(crate) fn segment_table(&self) -> &SegmentTable {
        &self.inner.segments
    }

    /// Segments registered now.
    pub fn segment_count(&self) -> usize {
        self.inner.segments.len()
    }

    /// Adds or replaces a peer. A new incarnation of a known node drops what was cached for
    /// the old one.
    pub fn add_peer(&self, addr: NodeAddress) {
        let node = addr.node;
        let old = self.write_peers().insert(
            node,
            Arc::new(Peer {
                addr: addr.clone(),
                health: PathHealth::default(),
            }),
        );
        if old.is_some_and(|old| old.addr.incarnation != addr.incarnation) {
            self.forget(node);
        }
    }

    /// Forgets a peer: its connections are closed and its shm mappings dropped (which lets its
    /// memory be freed if it has exited). Returns false if it was not known.
    pub fn remove_peer(&self, node: NodeId) -> bool {
        let known = self.write_peers().remove(&node).is_some();
        if known {
            self.forget(node);
        }
        known
    }

    /// The address a peer was added with.
    pub fn peer(&self, node: NodeId) -> Option<NodeAddress> {
        self.read_peers().get(&node).map(|p| p.addr.clone())
    }

    /// From now on this engine's listeners (tcp and shm) answer proof challenges that come
    /// from the engine `challenger` with `secret`. Replaces an earlier secret for it.
    ///
    /// This is how a client lets a node use its address: it gives the same secret to the node
    /// over the authenticated control plane, and the node's [`TransferEngine::verify_peer`]
    /// keeps only the paths that answer with it. Challengers without a secret are refused.
    pub fn trust(&self, challenger: NodeId, secret: [u8; 32]) {
        self.inner.trusted.trust(challenger, secret);
    }

    /// Stops answering `challenger`'s challenges.
    pub fn distrust(&self, challenger: NodeId) {
        self.inner.trusted.distrust(challenger);
    }

    /// Challenges each path of `addr` that this engine could use (tcp; shm only when
    /// `addr.host` equals this engine's host) and returns `addr` keeping only the paths whose
    /// listener proved it is engine `addr.node` and knows `secret` for this engine (`rdma` is
    /// always removed: its handshake carries no proof yet). Err (TransferError) when no path
    /// proves.
    ///
    /// Blocking; every connect, write and read is bounded by `timeout`, and each path is tried
    /// once. Never sends anything but the challenge to an unproven address.
    ///
    /// More precisely, each path's whole exchange ends within `timeout` (a peer that trickles
    /// its answer cannot stretch it), and the paths are tried one after the other, so the call
    /// returns within about twice `timeout`. Over shm the socket must first greet as
    /// `addr.node` with `addr.incarnation`, or it is sent nothing at all. The error is
    /// [`TransferError::AllPathsFailed`] with each path's reason, or
    /// [`TransferError::NoPath`] when `addr` offers no path this engine could challenge.
    /// Run it off executor threads.
    pub fn verify_peer(
        &self,
        addr: &NodeAddress,
        secret: &[u8; 32],
        timeout: Duration,
    ) -> Result<NodeAddress, TransferError> {
        let me = self.node();
        let local = &self.inner.local;
        let secret: &Secret = secret;
        let mut proven = addr.clone();
        proven.rdma = None;
        let mut attempts = Vec::new();
        match addr.tcp {
            Some(tcp) if local.tcp => {
                if let Err(err) =
                    crate::transport::tcp::prove::challenge(tcp, me, addr.node, secret, timeout)
                {
                    attempts.push((TransportKind::Tcp, err));
                    proven.tcp = None;
                }
            }
            _ => proven.tcp = None,
        }
        match &addr.shm {
            Some(path) if local.shm && addr.host == local.host => {
                if let Err(err) =
                    crate::transport::shm::prove::challenge(path, addr, me, secret, timeout)
                {
                    attempts.push((TransportKind::Shm, err));
                    proven.shm = None;
                }
            }
            _ => proven.shm = None,
        }
        for (kind, err) in &attempts {
            tracing::debug!(node = %addr.node, %kind, %err, "path did not prove itself");
        }
        if proven.tcp.is_none() && proven.shm.is_none() {
            return Err(if attempts.is_empty() {
                TransferError::NoPath { node: addr.node }
            } else {
                TransferError::AllPathsFailed {
                    node: addr.node,
                    attempts,
                }
            });
        }
        Ok(proven)
    }

    fn forget(&self, node: NodeId) {
        for transport in self.inner.paths.transports.values() {
            transport.forget_peer(node);
        }
        self.inner.pool.forget(node);
    }

    /// Submits a batch over the best paths; returns at once. Requests whose ranges do not fit,
    /// that name an unknown peer, or whose local segment belongs to another engine fail the
    /// whole submission before anything moves.
    pub fn submit(
        &self,
        requests: impl IntoIterator<Item = TransferRequest>,
    ) -> Result<BatchHandle, TransferError> {
        self.submit_inner(requests.into_iter().collect(), None)
    }

    /// As [`TransferEngine::submit`], using only the given transports (in the usual order).
    pub fn submit_via(
        &self,
        requests: impl IntoIterator<Item = TransferRequest>,
        paths: &[TransportKind],
    ) -> Result<BatchHandle, TransferError> {
        self.submit_inner(requests.into_iter().collect(), Some(paths))
    }

    /// Submits a batch and blocks until it completes; the first failed request's error, if any.
    pub fn transfer(
        &self,
        requests: impl IntoIterator<Item = TransferRequest>,
    ) -> Result<Vec<crate::Completion>, TransferError> {
        self.submit(requests)?.wait().into_result()
    }

    /// Submits a batch and blocks until it completes, returning every request's outcome.
    pub fn transfer_all(
        &self,
        requests: impl IntoIterator<Item = TransferRequest>,
    ) -> Result<BatchResult, TransferError> {
        Ok(self.submit(requests)?.wait())
    }

    fn submit_inner(
        &self,
        requests: Vec<TransferRequest>,
        allowed: Option<&[TransportKind]>,
    ) -> Result<BatchHandle, TransferError> {
        let inner = &self.inner;
        let peers = self.read_peers();
        // Validate everything before queueing anything.
        let mut targets: Vec<Arc<Peer>> = Vec::with_capacity(requests.len());
        for (index, req) in requests.iter().enumerate() {
            targets.push(validate(index, req, inner.address.incarnation, &peers)?);
        }
        drop(peers);

        // Cut requests into slices, grouped by peer.
        let mut groups: HashMap<NodeId, (Arc<Peer>, Vec<SliceOp>)> = HashMap::new();
        let mut slice_counts = Vec::with_capacity(requests.len());
        for (index, (req, peer)) in requests.into_iter().zip(targets).enumerate() {
            let ops = &mut groups
                .entry(peer.addr.node)
                .or_insert_with(|| (Arc::clone(&peer), Vec::new()))
                .1;
            let mut done = 0;
            let mut count = 0;
            while done < req.len {
                let len = (req.len - done).min(inner.slice_size);
                ops.push(SliceOp {
                    request: index,
                    op: req.op,
                    local: req.local.clone(),
                    local_offset: req.local_offset + done,
                    remote: req.remote,
                    remote_offset: req.remote_offset + done,
                    len,
                });
                done += len;
                count += 1;
            }
            slice_counts.push(count);
        }

        // Deal each peer's slices over the workers.
        let width = inner.pool.width();
        let start = inner.pool.rotate();
        let mut jobs = Vec::new();
        for (_, (peer, ops)) in groups {
            if ops.is_empty() {
                continue;
            }
            let demoted = peer.health.demoted(inner.path_cooldown);
            let mut candidates = select::candidates(&inner.local, &peer.addr, allowed, &demoted);
            if ops.iter().any(|op| op.local.region().device().is_some()) {
                // GPU memory on this side: only the NIC can reach it.
                candidates.retain(|k| *k == TransportKind::Rdma);
            }
            let mut shares: Vec<Vec<SliceOp>> = vec![Vec::new(); width];
            for (i, op) in ops.into_iter().enumerate() {
                shares[(start + i) % width].push(op);
            }
            for (worker, share) in shares.into_iter().enumerate() {
                if !share.is_empty() {
                    jobs.push((worker, Arc::clone(&peer), share, candidates.clone()));
                }
            }
        }
        let batch = BatchState::new(&slice_counts, jobs.len());
        for (worker, peer, ops, candidates) in jobs {
            inner.pool.send(
                worker,
                Job {
                    batch: Arc::clone(&batch),
                    peer,
                    ops,
                    candidates,
                },
            );
        }
        Ok(BatchHandle { state: batch })
    }

    /// Same-host fast path: the ranges `descs` grant, mapped into this process so the caller
    /// copies with [`DirectRange::write_at`] / [`DirectRange::read_at`] on its own thread, no
    /// worker involved. Each owner checks its descriptors as for any shm transfer (one round
    /// trip per owner, skipped for descriptors of unguarded segments it already accepted).
    ///
    /// Fails as a whole when a descriptor names an unknown peer or one that shm cannot reach
    /// (another host, no shm socket): use [`TransferEngine::submit`] for those. Per
    /// descriptor, a refusal or a broken connection.
    ///
    /// [`DirectRange::write_at`]: crate::transport::shm::DirectRange::write_at
    /// [`DirectRange::read_at`]: crate::transport::shm::DirectRange::read_at
    pub fn map_direct(
        &self,
        descs: &[SegmentDescriptor],
    ) -> Result<Vec<Result<DirectRange, TransferError>>, TransferError> {
        let mut by_peer: HashMap<NodeId, (NodeAddress, Vec<usize>)> = HashMap::new();
        for (index, d) in descs.iter().enumerate() {
            match by_peer.get_mut(&d.node) {
                Some((_, idx)) => idx.push(index),
                None => {
                    let addr = self.direct_peer(index, d.node)?;
                    by_peer.insert(d.node, (addr, vec![index]));
                }
            }
        }
        let mut out: Vec<Option<Result<DirectRange, TransferError>>> = vec![None; descs.len()];
        for (_, (addr, idx)) in by_peer {
            let mine: Vec<SegmentDescriptor> = idx.iter().map(|&i| descs[i]).collect();
            match self.inner.shm.direct.map(&addr, &mine) {
                Ok(ranges) => {
                    for (i, r) in idx.into_iter().zip(ranges) {
                        out[i] = Some(r);
                    }
                }
                Err(err) => {
                    for i in idx {
                        out[i] = Some(Err(err.clone()));
                    }
                }
            }
        }
        Ok(out
            .into_iter()
            .map(|r| r.unwrap_or(Err(TransferError::NoPath { node: self.node() })))
            .collect())
    }

    /// As [`TransferEngine::map_direct`] for one descriptor, answered only from what the engine
    /// already knows (no I/O, so safe on an executor thread); `None` means call `map_direct`.
    pub fn map_direct_cached(&self, desc: &SegmentDescriptor) -> Option<DirectRange> {
        let addr = self.direct_peer(0, desc.node).ok()?;
        self.inner.shm.direct.cached(&addr, desc)
    }

    /// Whether `node` is a known peer that shm reaches; its address.
    fn direct_peer(&self, index: usize, node: NodeId) -> Result<NodeAddress, TransferError> {
        let addr = self
            .read_peers()
            .get(&node)
            .map(|p| p.addr.clone())
            .ok_or(TransferError::UnknownPeer { index, node })?;
        if addr.host != self.inner.local.host || addr.shm.is_none() {
            return Err(TransferError::unavailable(
                TransportKind::Shm,
                node,
                "the peer is not on this host or offers no shm socket",
            ));
        }
        Ok(addr)
    }

    /// Counters of what this engine initiated and served.
    pub fn stats(&self) -> EngineStats {
        let paths = &self.inner.paths;
        let snap = |kind| {
            paths
                .counters
                .get(&kind)
                .map(TransportCounters::snapshot)
                .unwrap_or_default()
        };
        EngineStats {
            rdma: snap(TransportKind::Rdma),
            shm: snap(TransportKind::Shm),
            tcp: snap(TransportKind::Tcp),
            tcp_listener: self.inner.tcp_counters.snapshot(),
            shm_listener: self.inner.shm_counters.snapshot(),
            rdma_listener: self.inner.rdma_counters.snapshot(),
        }
    }

    /// Peers' segments this engine has mapped over shm.
    pub fn shm_mappings(&self) -> usize {
        self.inner.shm.mapped()
    }

    fn read_peers(&self) -> std::sync::RwLockReadGuard<'_, HashMap<NodeId, Arc<Peer>>> {
        self.inner.peers.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write_peers(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<NodeId, Arc<Peer>>> {
        self.inner.peers.write().unwrap_or_else(|p| p.into_inner())
    }
}

impl std::fmt::Debug for TransferEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransferEngine")
            .field("address", &self.inner.address)
            .field("paths", &self.paths())
            .finish()
    }
}

/// Checks one request against what submit can know: its local range, the descriptor's range,
/// the peer. The target checks the rest (token, segment bounds) when the request arrives.
fn validate(
    index: usize,
    req: &TransferRequest,
    incarnation: u64,
    peers: &HashMap<NodeId, Arc<Peer>>,
) -> Result<Arc<Peer>, TransferError> {
    if req.local.entry.engine != incarnation {
        return Err(TransferError::ForeignSegment {
            index,
            segment: req.local.id(),
        });
    }
    let out = |side, offset, limit| TransferError::OutOfBounds {
        index,
        side,
        offset,
        len: req.len,
        limit,
    };
    let local_len = req.local.len();
    if req
        .local_offset
        .checked_add(req.len)
        .is_none_or(|end| end > local_len)
    {
        return Err(out(Side::Local, req.local_offset, local_len));
    }
    if req.remote.end().is_none()
        || req
            .remote_offset
            .checked_add(req.len)
            .is_none_or(|end| end > req.remote.len)
    {
        return Err(out(Side::Remote, req.remote_offset, req.remote.len));
    }
    peers
        .get(&req.remote.node)
        .cloned()
        .ok_or(TransferError::UnknownPeer {
            index,
            node: req.remote.node,
        })
}
