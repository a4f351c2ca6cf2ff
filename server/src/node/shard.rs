//! A shard: one pinned thread that owns a slice of the keys, their index, DRAM and NVMe.
//!
//! Work reaches the shard that owns its key in one of two ways: directly, when the connection
//! that carried it was accepted by the owner, or over the glommio channel mesh from the shard
//! that accepted the connection. Either way the owner runs it on its own thread, so the data
//! path takes no lock. What travels is a [`Job`]: a closure that runs on the owner with the
//! owner's [`Shard`] and answers on its own one-shot channel, so a reply can never be matched
//! to the wrong request, and this layer needs to know nothing of the operations built on it.

use std::cell::Cell;
use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;

use futures::channel::oneshot;
use glommio::channels::channel_mesh::Senders;

use super::publisher::Publisher;
use super::shutdown::{Connections, StopSignal};
use crate::config::Settings;
use crate::metrics::ShardMetrics;
use crate::model::StoreError;
use crate::tier::{Step, TieredStore};

pub type Reply<T> = oneshot::Sender<T>;

/// Work for the owning shard. It runs on the owner's thread, with the owner's `Shard`.
pub type Job = Box<dyn FnOnce(&Rc<Shard>) + Send>;

/// A failure of the shard mesh itself, never of the request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardError {
    #[error("shard {0} is not reachable")]
    Unreachable(usize),
    #[error("shard {0} dropped the request")]
    Dropped(usize),
}

/// What an operation on a shard can fail with: the mesh, or the store.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    #[error(transparent)]
    Shard(#[from] ShardError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

pub struct Shard {
    pub id: usize,
    pub nshards: usize,
    pub settings: Arc<Settings>,
    /// This shard's objects, in DRAM and on NVMe.
    pub tier: Rc<TieredStore>,
    pub metrics: Arc<ShardMetrics>,
    pub all_metrics: Arc<Vec<Arc<ShardMetrics>>>,
    senders: Option<Senders<Job>>,
    /// Shard 0: numbers the node's KV events.
    pub publisher: Option<Rc<Publisher>>,
    /// The node's transfer engine and this shard's arena registered with it: KV blocks are
    /// read and written one-sidedly through descriptors into this segment.
    pub transfer: Option<(yutu_transfer::TransferEngine, yutu_transfer::LocalSegment)>,
    /// The client engines registered for get-into and put-from (node-wide, shared).
    pub peers: Arc<crate::node::sessions::PeerSessions>,
    /// Request-body bytes the node holds at once (node-wide, shared).
    pub body_budget: Arc<crate::net::budget::BodyBudget>,
    /// Every bucket's bytes over the node's shards and the cluster (node-wide, shared).
    pub usage: Arc<super::quota::BucketUsage>,
    /// Quota admitted to two-phase KV puts of this shard, by put id, held until each ends
    /// (or is revoked or expires: the KV expiry task drops those).
    pub kv_admitted: std::cell::RefCell<std::collections::HashMap<u64, super::quota::Admitted>>,
    /// Lease and put ids handed out by this shard: a counter, turned unguessable by
    /// [`Shard::kv_id_for`] with this shard's random key.
    kv_seq: Cell<u64>,
    kv_id_key: [u8; 32],
    /// Serialises bucket creation and deletion on the coordinator.
    pub(crate) bucket_lock: glommio::sync::Semaphore,
    request_seq: Cell<u64>,
    /// Resolves when the node is stopping (SIGTERM).
    pub stop: StopSignal,
    /// Connections being served, so that a stop can wait for them.
    pub connections: Connections,
}

impl Shard {
    pub fn new(
        id: usize,
        nshards: usize,
        settings: Arc<Settings>,
        tier: Rc<TieredStore>,
        all_metrics: Arc<Vec<Arc<ShardMetrics>>>,
        senders: Option<Senders<Job>>,
        stop: StopSignal,
    ) -> Shard {
        let body_budget = Arc::new(crate::net::budget::BodyBudget::new(settings.body.budget));
        let publisher =
            (id == 0).then(|| Rc::new(Publisher::new(settings.node_name.clone(), settings.epoch)));
        Shard {
            id,
            nshards,
            settings,
            tier,
            metrics: all_metrics[id].clone(),
            all_metrics,
            publisher,
            transfer: None,
            peers: Arc::default(),
            usage: Arc::new(super::quota::BucketUsage::new(nshards)),
            kv_admitted: Default::default(),
            body_budget,
            kv_seq: Cell::new(0),
            kv_id_key: random_key(),
            senders,
            bucket_lock: glommio::sync::Semaphore::new(1),
            request_seq: Cell::new(0),
            stop,
            connections: Connections::default(),
        }
    }

    /// The payload limit for one object: the configured maximum, or what fits in a shard's
    /// DRAM when that is less; and which of the two it is, for the error message.
    pub fn object_limit(&self) -> (u64, &'static str) {
        let shard_capacity = self.tier.capacity();
        if self.settings.max_object_size <= shard_capacity {
            (self.settings.max_object_size, "the maximum object size")
        } else {
            (shard_capacity, "a shard's DRAM capacity")
        }
    }

    /// A lease or put id for shard `owner`: the owner in the top 16 bits, so it routes back to
    /// it, and 48 bits no other client can guess (a keyed hash of this shard's counter and
    /// its id), so an id seen in a log or learnt by another tenant is not a handle on
    /// anything. Two live ids of one owner are equal with odds of about one in 2^48 per
    /// pair; the owner refuses the second ([`crate::store::kv`]) rather than mix them up.
    pub fn kv_id_for(&self, owner: usize) -> u64 {
        let n = self.kv_seq.get() + 1;
        self.kv_seq.set(n);
        let mut input = [0u8; 16];
        input[..8].copy_from_slice(&(self.id as u64).to_le_bytes());
        input[8..].copy_from_slice(&n.to_le_bytes());
        let hash = blake3::keyed_hash(&self.kv_id_key, &input);
        let mut low = [0u8; 8];
        low.copy_from_slice(&hash.as_bytes()[..8]);
        ((owner as u64) << 48) | (u64::from_le_bytes(low) & 0xffff_ffff_ffff)
    }

    /// Admits client writes of `(key, size)` into `bucket` stored on this shard, against the
    /// bucket's quota (see [`super::quota`]); hold the answer until the writes are done.
    pub fn admit(
        &self,
        bucket: &str,
        writes: &[(&str, u64)],
    ) -> Result<super::quota::Admitted, StoreError> {
        let admitted = super::quota::admit(&self.usage, self.id, &self.tier, bucket, writes);
        if let Err(e) = &admitted {
            self.metrics.quota_refused.inc();
            tracing::debug!(error = %e, "write refused by the bucket quota");
        }
        admitted
    }

    /// The shard that issued a lease or put id.
    pub fn shard_of_id(&self, id: u64) -> Option<usize> {
        let s = (id >> 48) as usize;
        (s < self.nshards).then_some(s)
    }

    /// A request id unique across shards and restarts of the same process.
    pub fn next_request_id(&self) -> String {
        let n = self.request_seq.get() + 1;
        self.request_seq.set(n);
        format!("{:x}-{:x}-{n:x}", std::process::id(), self.id)
    }

    /// The shard that owns `bucket/key`.
    pub fn owner(&self, bucket: &str, key: &str) -> usize {
        yutu_api::placement::shard_for(bucket, key, self.nshards)
    }

    /// Runs a job received from another shard.
    pub fn execute(self: &Rc<Self>, job: Job) {
        job(self)
    }

    /// Runs `job` on `shard` (here, when it is this one) and waits for the answer it sends.
    /// A dropped receiver means the requester went away (its client disconnected); the
    /// operation itself still happened, so jobs ignore a failed send.
    pub async fn call<T: Send + 'static>(
        self: &Rc<Self>,
        shard: usize,
        job: impl FnOnce(&Rc<Shard>, Reply<T>) + Send + 'static,
    ) -> Result<T, ShardError> {
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move |s| job(s, tx));
        if shard == self.id {
            self.execute(job);
        } else {
            let senders = self
                .senders
                .as_ref()
                .ok_or(ShardError::Unreachable(shard))?;
            self.metrics.forwarded.inc();
            if senders.send_to(shard, job).await.is_err() {
                return Err(ShardError::Unreachable(shard));
            }
        }
        rx.await.map_err(|_| ShardError::Dropped(shard))
    }

    /// Runs a synchronous `f` on `shard` and returns its result.
    pub async fn run<T: Send + 'static>(
        self: &Rc<Self>,
        shard: usize,
        f: impl FnOnce(&Rc<Shard>) -> T + Send + 'static,
    ) -> Result<T, ShardError> {
        self.call(shard, move |s, reply| {
            let _ = reply.send(f(s));
        })
        .await
    }

    /// Runs `f` on `shard`; its [`Step`] answers at once or in a task on that shard.
    pub async fn run_step<T: Send + 'static>(
        self: &Rc<Self>,
        shard: usize,
        f: impl FnOnce(&Rc<Shard>) -> Step<T> + Send + 'static,
    ) -> Result<T, ShardError> {
        self.call(shard, move |s, reply| match f(s) {
            Step::Done(v) => {
                let _ = reply.send(v);
            }
            Step::Wait(fut) => {
                glommio::spawn_local(async move {
                    let _ = reply.send(fut.await);
                })
                .detach();
            }
        })
        .await
    }

    /// Runs the future `f` makes in a task on `shard` and returns its output.
    pub async fn run_async<T, F>(
        self: &Rc<Self>,
        shard: usize,
        f: impl FnOnce(Rc<Shard>) -> F + Send + 'static,
    ) -> Result<T, ShardError>
    where
        T: Send + 'static,
        F: Future<Output = T> + 'static,
    {
        self.call(shard, move |s, reply| {
            let fut = f(s.clone());
            glommio::spawn_local(async move {
                let _ = reply.send(fut.await);
            })
            .detach();
        })
        .await
    }

    /// Runs `f` on every shard, in parallel; the answers in shard order.
    pub async fn broadcast<T: Send + 'static>(
        self: &Rc<Self>,
        f: impl Fn(&Rc<Shard>) -> T + Send + Sync + 'static,
    ) -> Result<Vec<T>, ShardError> {
        let f = Arc::new(f);
        let calls = (0..self.nshards).map(|s| {
            let f = f.clone();
            self.run(s, move |shard| f(shard))
        });
        futures::future::try_join_all(calls).await
    }
}

/// A random key for [`Shard::kv_id_for`]. The OS generator does not fail on Linux once
/// booted; if it ever did, the time and the process id make a key that still differs per
/// start (guessable only by someone on the host).
fn random_key() -> [u8; 32] {
    let mut key = [0u8; 32];
    if getrandom::fill(&mut key).is_err() {
        let seed = format!("{:?}{}", std::time::SystemTime::now(), std::process::id());
        key = *blake3::hash(seed.as_bytes()).as_bytes();
    }
    key
}
