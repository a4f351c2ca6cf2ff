//! Taking part in a cluster: membership and bucket configuration from etcd, and who owns a key.
//!
//! The node registers itself under an etcd lease it keeps alive ([`agent`]) and reads the
//! cluster's members and buckets back whenever etcd's watch reports a change under the
//! cluster's prefix (every [`agent::RESYNC_INTERVAL`] anyway, and every
//! [`agent::POLL_INTERVAL`] while no watch runs). What it last read is a
//! [`View`], shared by every shard; placement ([`yutu_api::cluster::owners`]) runs on it, so
//! there is no metadata service on the data path. When etcd cannot be reached the node keeps
//! its last view: a running cluster keeps serving known buckets through an etcd outage.
//!
//! A node may act as an owner for writes only while its lease is known to be alive
//! ([`Cluster::writable`]): once the lease may have expired, the other nodes may already have
//! taken over its keys, and acknowledging a write there would split the brain.

pub mod agent;
pub mod buckets;
pub mod etcd;
pub mod hints;
pub mod rebalance;
pub mod replica;
pub mod sync;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use yutu_api::cluster::{BucketConfig, BucketReplicas, Member, Membership};
use yutu_api::token::{issue, Claims, SigningKey};

use crate::config::{ClusterSettings, Settings, CLUSTER_KID};

/// The cluster as this node last read it from etcd.
#[derive(Debug, Clone, Default)]
pub struct View {
    /// etcd revision of the read (0 before the first).
    pub revision: i64,
    /// Live members, sorted by name.
    pub members: Vec<Member>,
    pub buckets: BTreeMap<String, BucketConfig>,
    /// What each node publishes it holds per bucket, by node name (for quotas).
    pub usage: BTreeMap<String, yutu_api::cluster::NodeUsage>,
}

impl View {
    /// The owners of (`bucket`, `key`), best first, or `None` when the bucket is not a
    /// cluster bucket (a node-local bucket from before the node joined).
    pub fn owners(&self, bucket: &str, key: &str) -> Option<Vec<&Member>> {
        let config = self.buckets.get(bucket)?;
        let idx = yutu_api::cluster::owners(bucket, key, &self.members, config.replicas as usize);
        Some(idx.into_iter().map(|i| &self.members[i]).collect())
    }

    pub fn member(&self, name: &str) -> Option<&Member> {
        self.members.iter().find(|m| m.name == name)
    }

    /// Bytes of `bucket` the live members other than `me` hold, every copy counted.
    pub fn held_elsewhere(&self, me: &str, bucket: &str) -> u64 {
        self.usage
            .iter()
            .filter(|(node, _)| node.as_str() != me && self.member(node).is_some())
            .filter_map(|(_, u)| u.buckets.get(bucket))
            .sum()
    }
}

/// Why this node refuses to act as an owner for a write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotWritable {
    #[error("this node has not joined the cluster yet (no etcd lease)")]
    NotJoined,
    #[error(
        "this node's etcd lease may have expired ({0} s without a keep-alive): other nodes may \
         own its keys now, so it does not acknowledge writes until it is back in etcd"
    )]
    LeaseLost(u64),
}

/// Counters of the cluster layer, rendered after the shards' metrics.
#[derive(Debug, Default)]
pub struct ClusterMetrics {
    pub etcd_errors: AtomicU64,
    pub lease_expired: AtomicU64,
    /// Watches of the cluster's prefix set up in etcd (the first, then one per break or
    /// session end).
    pub watch_starts: AtomicU64,
    /// View reads woken by a change etcd's watch reported (rather than by the resync timer).
    pub watch_wakeups: AtomicU64,
    pub forwarded: AtomicU64,
    pub forward_failures: AtomicU64,
    pub replicated: AtomicU64,
    pub replication_failures: AtomicU64,
    pub writes_refused: AtomicU64,
    /// 1 while a rebalancing pass runs.
    pub rebalancing: AtomicU64,
    /// [`members_digest`] of the membership the last pass completed against, once the
    /// rebalancer has seen it unchanged since (see `NodeStats::settled`); 0 otherwise.
    pub settled: AtomicU64,
    pub rereplicated_keys: AtomicU64,
    pub rereplicated_bytes: AtomicU64,
    pub rereplication_failures: AtomicU64,
    /// Copies dropped by a node that is no longer an owner (hand-off, drain).
    pub handed_off: AtomicU64,
    /// Keys the last rebalancing pass could not move (an owner unreachable): retried.
    pub pending_moves: AtomicU64,
    /// Keys (or members) the last anti-entropy pass could not bring up to date: retried.
    pub sync_pending: AtomicU64,
    /// Hints delivered (a copy an owner missed, sent again) and dropped past the limit.
    pub hints_delivered: AtomicU64,
    pub hints_dropped: AtomicU64,
    /// Keys anti-entropy brought up to date, objects bytes it pulled, deletes it applied.
    pub synced_keys: AtomicU64,
    pub synced_bytes: AtomicU64,
    pub synced_deletes: AtomicU64,
}

/// A digest of a membership, to tell whether the rebalancer's last completed pass was
/// against the membership a caller sees (same process only: not a wire value). Never 0.
pub fn members_digest(members: &[yutu_api::cluster::Member]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    format!("{members:?}").hash(&mut h);
    h.finish().max(1)
}

impl ClusterMetrics {
    pub fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The lease as the agent last knew it.
#[derive(Debug, Default)]
struct Lease {
    id: Option<i64>,
    /// Until when the lease is surely alive: send time of the last successful keep-alive plus
    /// the TTL etcd granted.
    alive_until: Option<Instant>,
    /// When etcd last answered.
    etcd_ok: Option<Instant>,
    /// How many times the node has joined (a new lease each time): a node that joins again
    /// must catch up before it answers reads as an owner.
    epoch: u64,
}

/// The node's part in the cluster, shared by every shard.
pub struct Cluster {
    pub settings: ClusterSettings,
    /// This node's name (`--node-name`).
    pub node: String,
    /// The largest object (`--max-object-size`): the most a copy between nodes reads.
    pub max_object: u64,
    /// This data directory's instance id (see [`yutu_api::cluster::Member::instance`]).
    pub instance: String,
    view: RwLock<Arc<View>>,
    lease: Mutex<Lease>,
    pub metrics: ClusterMetrics,
    /// The token this node sends to the others, and its expiry (seconds since the epoch).
    token: Mutex<Option<(String, u64)>>,
    /// Set while etcd is out of reach of this node *and* of every peer that answered: etcd
    /// is down, nobody can change the membership, and the last view stays authoritative.
    outage: AtomicBool,
    /// Buckets this node holds because etcd has them (created here or mirrored): the ones it
    /// drops when they disappear from etcd.
    mirrored: Mutex<std::collections::BTreeSet<String>>,
    /// Registrations refused because another node holds this node's name.
    pub name_conflicts: AtomicU64,
    /// Re-replication's token bucket: bytes it may send, and when it was last filled.
    budget: Mutex<(f64, Instant)>,
    /// Bucket names this node's view lacks, what etcd answered when last asked about them,
    /// and when: a client naming buckets that do not exist must not turn every request into
    /// an etcd read.
    absent: Mutex<HashMap<String, (Instant, Lookup)>>,
    /// The lease epoch and membership digest of the last completed anti-entropy pass
    /// ([`Cluster::caught_up`]).
    synced: Mutex<(u64, u64)>,
    /// Copies owed to other owners ([`hints::Hints`]).
    pub hints: Mutex<hints::Hints>,
}

/// What etcd answered about a bucket this node's view lacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// Etcd has no such bucket: a bucket of this node alone (or none), never replicated.
    Absent,
    /// Etcd could not be asked: whether the bucket is the cluster's, and with how many
    /// replicas, is unknown.
    Failed,
}

/// How long a bucket etcd did not have is not asked about again.
const ABSENT_TTL: Duration = Duration::from_secs(1);
/// Most names remembered as absent.
const ABSENT_MAX: usize = 4096;

/// How long a node token lives; a fresh one is signed when less than half is left.
const NODE_TOKEN_TTL: Duration = Duration::from_secs(3600);

impl Cluster {
    pub fn new(settings: &Settings) -> Option<Arc<Cluster>> {
        let c = settings.cluster.clone()?;
        Some(Arc::new(Cluster {
            settings: c,
            node: settings.node_name.clone(),
            max_object: settings.max_object_size,
            instance: instance_id(&settings.data_dir),
            view: RwLock::new(Arc::new(View::default())),
            lease: Mutex::new(Lease::default()),
            metrics: ClusterMetrics::default(),
            token: Mutex::new(None),
            outage: AtomicBool::new(false),
            mirrored: Mutex::new(Default::default()),
            budget: Mutex::new((0.0, Instant::now())),
            absent: Mutex::new(HashMap::new()),
            name_conflicts: AtomicU64::new(0),
            synced: Mutex::new((0, 0)),
            hints: Mutex::new(hints::Hints::default()),
        }))
    }

    /// The last view read from etcd.
    pub fn view(&self) -> Arc<View> {
        match self.view.read() {
            Ok(v) => v.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    fn set_view(&self, view: View) {
        self.update_view(|v| *v = view);
    }

    /// Changes the current view in place, under its lock: a read-modify-write that copied the
    /// view outside the lock could put back a view older than one the agent stored meanwhile
    /// (a member that had just joined vanished from it until etcd's revision moved again).
    fn update_view(&self, change: impl FnOnce(&mut View)) {
        let mut slot = match self.view.write() {
            Ok(v) => v,
            Err(p) => p.into_inner(),
        };
        change(Arc::make_mut(&mut slot));
    }

    /// Adds one bucket to the current view (created here, or just read from etcd), so that
    /// this node routes it before the next poll.
    pub fn learn_bucket(&self, name: &str, config: BucketConfig) {
        self.update_view(|v| {
            v.buckets.insert(name.to_string(), config);
        });
    }

    fn mirrored<T>(&self, f: impl FnOnce(&mut std::collections::BTreeSet<String>) -> T) -> T {
        match self.mirrored.lock() {
            Ok(mut m) => f(&mut m),
            Err(p) => f(&mut p.into_inner()),
        }
    }

    /// Records that this node holds `bucket` because the cluster has it.
    pub fn mark_mirrored(&self, bucket: &str) {
        self.mirrored(|m| m.insert(bucket.to_string()));
    }

    /// The mirrored buckets etcd no longer has (forgetting them).
    pub fn take_vanished(&self, now: &BTreeMap<String, BucketConfig>) -> Vec<String> {
        self.mirrored(|m| {
            let gone: Vec<String> = m
                .iter()
                .filter(|b| !now.contains_key(*b))
                .cloned()
                .collect();
            for b in &gone {
                m.remove(b);
            }
            gone
        })
    }

    /// What looking `bucket` up in etcd gave within the last second, if it was.
    pub fn recent_lookup(&self, bucket: &str) -> Option<Lookup> {
        let absent = match self.absent.lock() {
            Ok(a) => a,
            Err(p) => p.into_inner(),
        };
        absent
            .get(bucket)
            .filter(|(t, _)| t.elapsed() < ABSENT_TTL)
            .map(|&(_, l)| l)
    }

    /// Remembers what etcd answered about `bucket` (for [`ABSENT_TTL`]).
    pub fn note_lookup(&self, bucket: &str, lookup: Lookup) {
        let mut absent = match self.absent.lock() {
            Ok(a) => a,
            Err(p) => p.into_inner(),
        };
        if absent.len() >= ABSENT_MAX {
            absent.retain(|_, (t, _)| t.elapsed() < ABSENT_TTL);
            if absent.len() >= ABSENT_MAX {
                absent.clear();
            }
        }
        absent.insert(bucket.to_string(), (Instant::now(), lookup));
    }

    /// Whether this node is mirroring `bucket` from etcd.
    pub fn is_mirrored(&self, bucket: &str) -> bool {
        self.mirrored(|m| m.contains(bucket))
    }

    /// Marks `node` draining (or not) in this node's view before the next poll confirms it.
    pub fn set_draining_locally(&self, node: &str, on: bool) {
        self.update_view(|v| {
            for m in &mut v.members {
                if m.name == node {
                    m.draining = on;
                }
            }
        });
    }

    /// Drops one bucket from the current view.
    pub fn forget_bucket(&self, name: &str) {
        self.update_view(|v| {
            v.buckets.remove(name);
        });
    }

    fn with_lease<T>(&self, f: impl FnOnce(&mut Lease) -> T) -> T {
        match self.lease.lock() {
            Ok(mut l) => f(&mut l),
            Err(p) => f(&mut p.into_inner()),
        }
    }

    /// Whether this node may acknowledge a write as an owner now: while its lease is surely
    /// alive, or while etcd is down for the whole cluster (see [`Membership::etcd_reachable`]).
    pub fn writable(&self) -> Result<(), NotWritable> {
        self.with_lease(|l| match (l.id, l.alive_until) {
            (Some(_), Some(until)) if Instant::now() < until => Ok(()),
            (Some(_), Some(_)) if self.outage.load(Ordering::Relaxed) => Ok(()),
            (Some(_), Some(until)) => Err(NotWritable::LeaseLost(
                (Instant::now() - until + self.settings.lease_ttl).as_secs(),
            )),
            _ => Err(NotWritable::NotJoined),
        })
    }

    /// Waits until re-replication may send `bytes` more (`--rereplicate-rate`, node-wide).
    pub async fn throttle(&self, bytes: u64) {
        let rate = self.settings.rereplicate_rate.max(1) as f64;
        let wait = {
            let mut b = match self.budget.lock() {
                Ok(b) => b,
                Err(p) => p.into_inner(),
            };
            let now = Instant::now();
            // At most a second's worth saved up.
            b.0 = (b.0 + now.duration_since(b.1).as_secs_f64() * rate).min(rate);
            b.1 = now;
            b.0 -= bytes as f64;
            if b.0 >= 0.0 {
                Duration::ZERO
            } else {
                Duration::from_secs_f64(-b.0 / rate)
            }
        };
        if !wait.is_zero() {
            glommio::timer::sleep(wait).await;
        }
    }

    /// How many times this node has joined the cluster (0 before the first time).
    pub fn lease_epoch(&self) -> u64 {
        self.with_lease(|l| l.epoch)
    }

    /// Records that an anti-entropy pass completed under lease `epoch` against the members
    /// of `digest` ([`members_digest`]).
    pub fn set_caught_up(&self, epoch: u64, digest: u64) {
        match self.synced.lock() {
            Ok(mut s) => *s = (epoch, digest),
            Err(p) => *p.into_inner() = (epoch, digest),
        }
    }

    /// Whether this node's copies are known to be as new as the other owners': it may act as
    /// an owner now, and an anti-entropy pass completed since it last joined (a restart, or
    /// a lease lost to a pause or a cut from etcd, makes it join again). Until then it sends
    /// reads of its keys to the other owners first: it may have come back with old data. A
    /// node that stayed in the cluster through a membership change missed no acknowledged
    /// write of the keys it owned, so the change alone does not make it fall behind.
    pub fn caught_up(&self) -> bool {
        if self.writable().is_err() {
            return false;
        }
        let synced = match self.synced.lock() {
            Ok(s) => *s,
            Err(p) => *p.into_inner(),
        };
        synced.0 == self.lease_epoch()
    }

    /// Whether this node owns `bucket/key` together with other nodes (a bucket of more than
    /// one replica): the keys anti-entropy keeps up to date.
    pub fn shares(&self, bucket: &str, key: &str) -> bool {
        self.view()
            .owners(bucket, key)
            .is_some_and(|o| o.len() > 1 && o.iter().any(|m| m.name == self.node))
    }

    /// Remembers that `member` missed the write of `bucket/key` this node applied: the copy is
    /// sent again until it lands ([`sync`]).
    pub fn hint(&self, member: &str, bucket: &str, key: &str) {
        let mut h = match self.hints.lock() {
            Ok(h) => h,
            Err(p) => p.into_inner(),
        };
        if !h.add(member, bucket, key) {
            ClusterMetrics::inc(&self.metrics.hints_dropped);
        }
    }

    /// Copies owed to other owners now.
    pub fn hints_pending(&self) -> u64 {
        match self.hints.lock() {
            Ok(h) => h.len() as u64,
            Err(p) => p.into_inner().len() as u64,
        }
    }

    /// Whether the last anti-entropy pass ran against the membership seen now.
    pub fn synced_with_members(&self) -> bool {
        let synced = match self.synced.lock() {
            Ok(s) => *s,
            Err(p) => *p.into_inner(),
        };
        synced.1 == members_digest(&self.view().members)
    }

    /// Whether the lease is surely alive (a keep-alive succeeded within its TTL).
    pub fn lease_alive(&self) -> bool {
        self.with_lease(|l| l.alive_until.is_some_and(|u| Instant::now() < u))
    }

    /// Whether the cluster-wide etcd outage rule applies now.
    pub fn in_outage(&self) -> bool {
        self.outage.load(Ordering::Relaxed)
    }

    fn set_outage(&self, on: bool) {
        if self.outage.swap(on, Ordering::Relaxed) != on {
            if on {
                tracing::warn!(
                    "etcd is out of reach of this node and of every peer that answered: serving \
                     with the last membership read until it returns"
                );
            } else {
                tracing::info!("etcd outage over");
            }
        }
    }

    /// Whether etcd answered within the last half lease TTL (a healthy node reads it every
    /// poll interval; half the TTL lets a peer that lost etcd tell an outage from a partition
    /// before its own lease runs out).
    pub fn etcd_reachable(&self) -> bool {
        self.with_lease(|l| {
            l.etcd_ok
                .is_some_and(|t| t.elapsed() < self.settings.lease_ttl / 2)
        })
    }

    /// The membership document (`GET /v1/cluster`).
    pub fn membership(&self) -> Membership {
        let view = self.view();
        Membership {
            cluster: self.settings.name.clone(),
            revision: view.revision,
            node: self.node.clone(),
            members: view.members.clone(),
            buckets: view
                .buckets
                .iter()
                .map(|(b, c)| BucketReplicas {
                    bucket: b.clone(),
                    replicas: c.replicas,
                })
                .collect(),
            etcd_reachable: self.etcd_reachable(),
        }
    }

    /// The bearer token this node presents to the other nodes (an admin token for
    /// `node:NAME`, signed with the cluster key); `None` without a key (--no-auth).
    pub fn node_token(&self) -> Option<String> {
        let key = self.settings.key.as_ref()?;
        let now = yutu_api::token::unix_now();
        let mut slot = match self.token.lock() {
            Ok(t) => t,
            Err(p) => p.into_inner(),
        };
        if let Some((token, exp)) = slot.as_ref() {
            if *exp > now + NODE_TOKEN_TTL.as_secs() / 2 {
                return Some(token.clone());
            }
        }
        let claims = Claims {
            admin: true,
            ..Claims::new(
                &format!("{NODE_SUBJECT_PREFIX}{}", self.node),
                NODE_TOKEN_TTL,
            )
        };
        match issue(&claims, CLUSTER_KID, &SigningKey::Secret(key.clone())) {
            Ok(token) => {
                *slot = Some((token.clone(), claims.exp));
                Some(token)
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot sign a node token");
                None
            }
        }
    }

    /// Prometheus text of the cluster's gauges and counters.
    pub fn render_metrics(&self) -> String {
        let view = self.view();
        let writable = self.writable().is_ok() as u8;
        let m = &self.metrics;
        let c = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "# HELP yutu_cluster_members Live members in this node's view of the cluster.\n\
             # TYPE yutu_cluster_members gauge\nyutu_cluster_members {}\n\
             # HELP yutu_cluster_revision etcd revision of this node's view.\n\
             # TYPE yutu_cluster_revision gauge\nyutu_cluster_revision {}\n\
             # HELP yutu_cluster_writable 1 while this node's lease is alive and it acknowledges writes as an owner.\n\
             # TYPE yutu_cluster_writable gauge\nyutu_cluster_writable {writable}\n\
             # HELP yutu_cluster_etcd_outage 1 from when etcd is out of reach of this node and of every peer that answered until this node's lease is renewed (the last membership stays in force).\n\
             # TYPE yutu_cluster_etcd_outage gauge\nyutu_cluster_etcd_outage {}\n\
             # HELP yutu_cluster_etcd_reachable 1 while etcd answered within half the lease TTL.\n\
             # TYPE yutu_cluster_etcd_reachable gauge\nyutu_cluster_etcd_reachable {}\n\
             # HELP yutu_cluster_etcd_errors_total Failed calls to etcd.\n\
             # TYPE yutu_cluster_etcd_errors_total counter\nyutu_cluster_etcd_errors_total {}\n\
             # HELP yutu_cluster_lease_expired_total Times this node found its lease expired and registered again.\n\
             # TYPE yutu_cluster_lease_expired_total counter\nyutu_cluster_lease_expired_total {}\n\
             # HELP yutu_cluster_etcd_watch_starts_total Watches of the cluster's keys set up in etcd (the first, then one per break).\n\
             # TYPE yutu_cluster_etcd_watch_starts_total counter\nyutu_cluster_etcd_watch_starts_total {}\n\
             # HELP yutu_cluster_etcd_watch_wakeups_total Reads of the cluster's keys woken by a change etcd's watch reported.\n\
             # TYPE yutu_cluster_etcd_watch_wakeups_total counter\nyutu_cluster_etcd_watch_wakeups_total {}\n\
             # HELP yutu_cluster_forwarded_total Requests forwarded to the key's owner.\n\
             # TYPE yutu_cluster_forwarded_total counter\nyutu_cluster_forwarded_total {}\n\
             # HELP yutu_cluster_forward_failures_total Owners that could not be reached (the next owner was tried).\n\
             # TYPE yutu_cluster_forward_failures_total counter\nyutu_cluster_forward_failures_total {}\n\
             # HELP yutu_cluster_replicated_total Replica writes sent to other owners.\n\
             # TYPE yutu_cluster_replicated_total counter\nyutu_cluster_replicated_total {}\n\
             # HELP yutu_cluster_replication_failures_total Replica writes that failed (the client's write failed with them).\n\
             # TYPE yutu_cluster_replication_failures_total counter\nyutu_cluster_replication_failures_total {}\n\
             # HELP yutu_cluster_writes_refused_total Writes refused because this node's lease may have expired.\n\
             # TYPE yutu_cluster_writes_refused_total counter\nyutu_cluster_writes_refused_total {}\n\
             # HELP yutu_cluster_name_conflicts_total Registrations refused because another node runs under this node's name.\n\
             # TYPE yutu_cluster_name_conflicts_total counter\nyutu_cluster_name_conflicts_total {}\n\
             # HELP yutu_cluster_rebalancing 1 while this node moves keys after a membership change.\n\
             # TYPE yutu_cluster_rebalancing gauge\nyutu_cluster_rebalancing {}\n\
             # HELP yutu_cluster_rereplicated_keys_total Keys copied to a new owner after a membership change.\n\
             # TYPE yutu_cluster_rereplicated_keys_total counter\nyutu_cluster_rereplicated_keys_total {}\n\
             # HELP yutu_cluster_rereplicated_bytes_total Bytes copied to new owners after membership changes.\n\
             # TYPE yutu_cluster_rereplicated_bytes_total counter\nyutu_cluster_rereplicated_bytes_total {}\n\
             # HELP yutu_cluster_rereplication_failures_total Copies to a new owner that failed (retried).\n\
             # TYPE yutu_cluster_rereplication_failures_total counter\nyutu_cluster_rereplication_failures_total {}\n\
             # HELP yutu_cluster_handed_off_total Copies this node dropped once it no longer owned the key and every owner held it.\n\
             # TYPE yutu_cluster_handed_off_total counter\nyutu_cluster_handed_off_total {}\n\
             # HELP yutu_cluster_caught_up 1 once an anti-entropy pass completed since this node last joined (before that it sends reads of its keys to the other owners first).\n\
             # TYPE yutu_cluster_caught_up gauge\nyutu_cluster_caught_up {}\n\
             # HELP yutu_cluster_sync_pending Keys or members the last anti-entropy pass could not bring up to date (retried).\n\
             # TYPE yutu_cluster_sync_pending gauge\nyutu_cluster_sync_pending {}\n\
             # HELP yutu_cluster_synced_keys_total Keys anti-entropy brought up to date from another owner.\n\
             # TYPE yutu_cluster_synced_keys_total counter\nyutu_cluster_synced_keys_total {}\n\
             # HELP yutu_cluster_synced_bytes_total Object bytes anti-entropy pulled from other owners.\n\
             # TYPE yutu_cluster_synced_bytes_total counter\nyutu_cluster_synced_bytes_total {}\n\
             # HELP yutu_cluster_synced_deletes_total Deletes anti-entropy applied from other owners' tombstones.\n\
             # TYPE yutu_cluster_synced_deletes_total counter\nyutu_cluster_synced_deletes_total {}\n\
             # HELP yutu_cluster_hints Copies of writes this node applied that an owner missed (its write was refused with 503) and that are sent again until they land: keys under-replicated meanwhile.\n\
             # TYPE yutu_cluster_hints gauge\nyutu_cluster_hints {}\n\
             # HELP yutu_cluster_hints_delivered_total Missed copies sent again and applied by their owner.\n\
             # TYPE yutu_cluster_hints_delivered_total counter\nyutu_cluster_hints_delivered_total {}\n\
             # HELP yutu_cluster_hints_dropped_total Missed copies not remembered because the hint limit was reached (anti-entropy repairs them within a sync interval).\n\
             # TYPE yutu_cluster_hints_dropped_total counter\nyutu_cluster_hints_dropped_total {}\n",
            view.members.len(),
            view.revision,
            self.in_outage() as u8,
            self.etcd_reachable() as u8,
            c(&m.etcd_errors),
            c(&m.lease_expired),
            c(&m.watch_starts),
            c(&m.watch_wakeups),
            c(&m.forwarded),
            c(&m.forward_failures),
            c(&m.replicated),
            c(&m.replication_failures),
            c(&m.writes_refused),
            c(&self.name_conflicts),
            c(&m.rebalancing),
            c(&m.rereplicated_keys),
            c(&m.rereplicated_bytes),
            c(&m.rereplication_failures),
            c(&m.handed_off),
            self.caught_up() as u8,
            c(&m.sync_pending),
            c(&m.synced_keys),
            c(&m.synced_bytes),
            c(&m.synced_deletes),
            self.hints_pending(),
            c(&m.hints_delivered),
            c(&m.hints_dropped),
        )
    }
}

/// The file in the data directory that keeps the node's instance id.
const INSTANCE_FILE: &str = "cluster-instance";

/// The instance id kept in `data_dir` (made at the first start in a cluster): what tells a
/// restart of this node from another node started under its name.
fn instance_id(data_dir: &std::path::Path) -> String {
    let path = data_dir.join(INSTANCE_FILE);
    if let Ok(text) = std::fs::read_to_string(&path) {
        let id = text.trim();
        if !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return id.to_string();
        }
    }
    let mut raw = [0u8; 16];
    if getrandom::fill(&mut raw).is_err() {
        // No randomness: the clock still tells two nodes apart.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        raw = t.to_le_bytes();
    }
    let id = hex::encode(raw);
    if let Err(e) = std::fs::create_dir_all(data_dir).and_then(|()| std::fs::write(&path, &id)) {
        tracing::warn!(error = %e, path = %path.display(), "cannot keep the node's instance id");
    }
    id
}

/// Marks `node` as being drained (or no longer, with `on` false) in etcd.
pub async fn set_draining(cluster: &Cluster, node: &str, on: bool) -> Result<(), etcd::EtcdError> {
    let mut etcd = etcd::Etcd::new(&cluster.settings.etcd);
    let key = yutu_api::cluster::drain_key(&cluster.settings.name, node);
    if on {
        etcd.put(&key, b"1", None).await
    } else {
        etcd.delete(&key).await.map(|_| ())
    }
}

/// Subjects of node tokens start with this; users cannot be named so (a token's `sub` is the
/// issuer's choice, but only a holder of the cluster key can sign one).
pub const NODE_SUBJECT_PREFIX: &str = "node:";

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> BucketConfig {
        serde_json::from_str(r#"{"owner":"u","durability":"memory","replicas":2,"created_ms":0}"#)
            .expect("a bucket configuration")
    }

    /// Defect: `learn_bucket` copied the view, changed the copy and stored it, outside the
    /// lock; a view the agent stored meanwhile was put back to the older one (a member that
    /// had just joined vanished until etcd's revision moved again). Two threads race: the
    /// agent's stand-in stores views of ever higher revisions, the other learns buckets; a
    /// reader must never see the revision go down, and the last one stored must stay.
    #[test]
    fn learning_a_bucket_never_puts_back_an_older_view() {
        let dir = tempfile::tempdir().expect("tempdir");
        let settings = crate::config::Settings::resolve(crate::config::Flags {
            etcd: vec!["http://127.0.0.1:1".into()],
            no_auth: true,
            data_dir: Some(dir.path().to_path_buf()),
            ..Default::default()
        })
        .expect("settings");
        let cluster = Cluster::new(&settings).expect("a cluster node");
        let last = 200_000;
        let done = AtomicBool::new(false);
        let went_back = std::thread::scope(|s| {
            s.spawn(|| {
                for revision in 1..=last {
                    cluster.set_view(View {
                        revision,
                        ..View::default()
                    });
                }
                done.store(true, Ordering::Release);
            });
            let learner = s.spawn(|| {
                let mut i = 0u64;
                while !done.load(Ordering::Acquire) {
                    cluster.learn_bucket(&format!("b{}", i % 8), config());
                    i += 1;
                }
            });
            let mut seen = 0;
            let mut went_back = None;
            while !done.load(Ordering::Acquire) && went_back.is_none() {
                let now = cluster.view().revision;
                if now < seen {
                    went_back = Some((seen, now));
                }
                seen = now;
            }
            learner.join().expect("learner");
            went_back
        });
        assert_eq!(went_back, None, "the revision went back (seen, then read)");
        assert_eq!(cluster.view().revision, last);
    }
}
