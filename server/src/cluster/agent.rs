//! The cluster agent, on shard 0: registers the node under an etcd lease, keeps the lease
//! alive, and reads members and buckets back into the shared [`View`].
//!
//! When it reads: a watch of the cluster's prefix wakes it as soon as etcd reports a change,
//! and it reads the whole prefix again (the read is the truth, the watch only the wake-up:
//! no deltas to reconcile after a compaction or a reconnection). It also reads every
//! [`RESYNC_INTERVAL`] (at most a quarter of the lease TTL) as a safety net, and every
//! [`POLL_INTERVAL`], as before watches, while no watch runs or after a failed read.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use glommio::channels::local_channel::{self, LocalSender};
use yutu_api::cluster::{BucketConfig, Member, NodeUsage};

use super::etcd::{Etcd, EtcdError};
use super::{Cluster, ClusterMetrics, View};
use crate::node::Shard;

/// How often the agent reads the membership and bucket configuration while no watch of
/// them runs (etcd refused it, or it broke and is being set up again), and how often it
/// looks after its lease and usage record.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);
/// Longest between two reads while the watch runs: the safety net for a change a watch
/// missed without breaking. Also bounded by a quarter of the lease TTL (see [`run`]).
pub const RESYNC_INTERVAL: Duration = Duration::from_secs(5);
/// Longest one watch stream is kept open before it is opened again (from the revision after
/// the last read): the deadline of a watch on an etcd that froze with the stream open.
pub const WATCH_SESSION: Duration = Duration::from_secs(60);
/// First and longest pause before setting up a watch again after it failed.
const WATCH_BACKOFF: (Duration, Duration) = (Duration::from_millis(200), Duration::from_secs(5));

/// What this node registers (its URLs are known once it listens).
pub fn member(
    shard: &Shard,
    cluster: &Cluster,
    url: String,
    transfer: Option<String>,
    zone: Option<String>,
) -> Member {
    let s = &shard.settings;
    Member {
        name: s.node_name.clone(),
        url,
        transfer,
        zone,
        memory: s.memory,
        nvme: s.nvme_capacity,
        shards: s.shards,
        started_ms: s.epoch,
        draining: false,
        instance: cluster.instance.clone(),
    }
}

fn etcd_failed(cluster: &Cluster, what: &str, e: &EtcdError) {
    ClusterMetrics::inc(&cluster.metrics.etcd_errors);
    tracing::warn!(error = %e, "etcd: cannot {what}");
}

/// How long a stopping node keeps trying to revoke its lease (etcd out of reach as it stops);
/// past it, the others drop the node when the lease runs out.
pub const LEAVE_DEADLINE: Duration = Duration::from_secs(5);
/// Pause between two tries to revoke.
const LEAVE_RETRY: Duration = Duration::from_millis(100);

/// Revokes the node's lease as it stops, trying again until [`LEAVE_DEADLINE`]: a node that
/// cannot tell etcd it left stays listed (and routed to) for a whole lease.
async fn leave(etcd: &mut Etcd, cluster: &Cluster, id: i64) {
    let until = Instant::now() + LEAVE_DEADLINE;
    let mut logged = false;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        let tried = futures_lite::future::or(async { Some(etcd.revoke(id).await) }, async {
            glommio::timer::sleep(left).await;
            None
        })
        .await;
        match tried {
            Some(Ok(())) => {
                tracing::info!("left the cluster (lease revoked)");
                return;
            }
            Some(Err(e)) if Instant::now() + LEAVE_RETRY < until => {
                if !logged {
                    tracing::info!(error = %e, "cannot revoke the lease yet; retrying while stopping");
                    logged = true;
                }
                glommio::timer::sleep(LEAVE_RETRY).await;
            }
            Some(Err(e)) => {
                etcd_failed(cluster, "revoke the lease", &e);
                return;
            }
            None => {
                tracing::warn!("etcd did not answer the lease revoke in time; the others drop this node when its lease runs out");
                return;
            }
        }
    }
}

/// Runs until the node stops; then revokes the lease, so the others stop routing here at
/// once instead of after the TTL.
pub async fn run(shard: Rc<Shard>, cluster: Arc<Cluster>, me: Member) {
    let ttl = cluster.settings.lease_ttl;
    // A hung call must not outlast a third of the lease.
    let mut etcd = Etcd::with_timeout(
        &cluster.settings.etcd,
        (ttl / 3).min(super::etcd::CALL_TIMEOUT),
    );
    glommio::spawn_local(watch_etcd_reach(shard.clone(), cluster.clone())).detach();
    let watch = Rc::new(ViewWatch::default());
    // One pending wake-up at most: a read answers every change before it.
    let (wake, wakes) = local_channel::new_bounded(1);
    glommio::spawn_local(watch_view(
        shard.clone(),
        cluster.clone(),
        watch.clone(),
        wake,
    ))
    .detach();
    let resync = RESYNC_INTERVAL.min(ttl / 4).max(POLL_INTERVAL);
    let mut next_read = Instant::now();
    let member_key = yutu_api::cluster::member_key(&cluster.settings.name, &me.name);
    let me_json = serde_json::to_vec(&me).unwrap_or_default();
    let mut lease: Option<i64> = None;
    let mut next_keep_alive = Instant::now();
    let mut last_revision = -1;
    let mut conflict_logged = false;
    let usage_key = yutu_api::cluster::usage_key(&cluster.settings.name, &me.name);
    // What this node last published of its bytes per bucket (under the current lease), and
    // when it may publish again.
    let mut published: Option<NodeUsage> = None;
    let mut next_usage = Instant::now();
    loop {
        if shard.stop.is_stopped() {
            if let Some(id) = lease {
                leave(&mut etcd, &cluster, id).await;
            }
            return;
        }
        let now = Instant::now();
        match lease {
            None => {
                let sent = Instant::now();
                match etcd.grant(ttl.as_secs()).await {
                    Ok(id) => match register(&mut etcd, &member_key, &me_json, &me, id).await {
                        Ok(false) => {
                            // Logged before the metric moves, so whoever watches the
                            // counter finds the reason already in the log.
                            if !conflict_logged {
                                tracing::error!(
                                    node = %me.name,
                                    "another node (another data directory) runs under this \
                                     node's name; not joining until it is gone: give each \
                                     node its own --node-name"
                                );
                                conflict_logged = true;
                            }
                            ClusterMetrics::inc(&cluster.name_conflicts);
                            let _ = etcd.revoke(id).await;
                        }
                        Ok(true) => {
                            conflict_logged = false;
                            published = None;
                            lease = Some(id);
                            cluster.with_lease(|l| {
                                l.id = Some(id);
                                l.alive_until = Some(sent + ttl);
                                l.etcd_ok = Some(Instant::now());
                                l.epoch += 1;
                            });
                            next_keep_alive = sent + ttl / 3;
                            cluster.set_outage(false);
                            tracing::info!(
                                node = %me.name, cluster = %cluster.settings.name,
                                lease = id, "joined the cluster"
                            );
                        }
                        Err(e) => etcd_failed(&cluster, "register the node", &e),
                    },
                    Err(e) => etcd_failed(&cluster, "grant a lease", &e),
                }
            }
            Some(id) if now >= next_keep_alive => {
                let sent = Instant::now();
                match etcd.keep_alive(id).await {
                    Ok(Some(granted)) => {
                        cluster.with_lease(|l| {
                            l.alive_until = Some(sent + Duration::from_secs(granted));
                            l.etcd_ok = Some(Instant::now());
                        });
                        // The lease is alive again: the outage rule is not needed any more.
                        cluster.set_outage(false);
                        next_keep_alive = sent + ttl / 3;
                    }
                    Ok(None) => {
                        // etcd forgot the lease: the others have dropped this node.
                        ClusterMetrics::inc(&cluster.metrics.lease_expired);
                        tracing::warn!(
                            "the node's etcd lease expired (etcd was out of reach longer than \
                             the lease TTL); registering again"
                        );
                        cluster.with_lease(|l| {
                            l.id = None;
                            l.alive_until = None;
                            l.etcd_ok = Some(Instant::now());
                        });
                        lease = None;
                        published = None;
                        continue;
                    }
                    Err(e) => {
                        etcd_failed(&cluster, "keep the lease alive", &e);
                        // Retry soon, not after another third of the TTL.
                        next_keep_alive = Instant::now() + POLL_INTERVAL;
                    }
                }
            }
            Some(_) => {}
        }
        if let Some(id) = lease {
            if now >= next_usage {
                let mine = NodeUsage {
                    buckets: shard.usage.on_node(),
                };
                if published.as_ref() != Some(&mine) {
                    let json = serde_json::to_vec(&mine).unwrap_or_default();
                    match etcd.put(&usage_key, &json, Some(id)).await {
                        Ok(()) => published = Some(mine),
                        Err(e) => etcd_failed(&cluster, "publish the bucket usage", &e),
                    }
                    next_usage = Instant::now() + USAGE_INTERVAL;
                }
            }
        }
        if Instant::now() >= next_read || !watch.running.get() {
            next_read = match refresh_view(&shard, &cluster, &mut etcd, &mut last_revision).await {
                Some(revision) => {
                    watch.from.set(watch.from.get().max(revision + 1));
                    Instant::now() + resync
                }
                // A failed read is tried again at the old pace.
                None => Instant::now(),
            };
        }
        // Woken early by a change the watch reported: read at once.
        let woken = futures_lite::future::or(
            async {
                shard.stop.sleep(POLL_INTERVAL).await;
                false
            },
            async {
                if wakes.recv().await.is_some() {
                    return true;
                }
                // The watch task is gone (the node stops): the pace is the timer's.
                shard.stop.sleep(POLL_INTERVAL).await;
                false
            },
        )
        .await;
        if woken {
            ClusterMetrics::inc(&cluster.metrics.watch_wakeups);
            next_read = Instant::now();
        }
    }
}

/// Reads members and buckets and, when etcd's revision moved, applies them to the node;
/// the revision read, `None` when the read failed.
async fn refresh_view(
    shard: &Rc<Shard>,
    cluster: &Arc<Cluster>,
    etcd: &mut Etcd,
    last_revision: &mut i64,
) -> Option<i64> {
    let view = match read_view(etcd, &cluster.settings.name).await {
        Ok(view) => view,
        Err(e) => {
            etcd_failed(cluster, "read the membership", &e);
            return None;
        }
    };
    let revision = view.revision;
    cluster.with_lease(|l| l.etcd_ok = Some(Instant::now()));
    if view.revision != *last_revision {
        *last_revision = view.revision;
        super::buckets::apply(shard, cluster, &view.buckets).await;
        let before = cluster.view();
        if before.members != view.members {
            let names: Vec<&str> = view.members.iter().map(|m| m.name.as_str()).collect();
            tracing::info!(members = ?names, revision = view.revision, "membership changed");
        }
        // With fewer members than a bucket's replica count, each object has only as many
        // copies as there are members.
        let most = u32::try_from(view.members.len().max(1)).unwrap_or(u32::MAX);
        for (bucket, config) in &view.buckets {
            let elsewhere = view.held_elsewhere(&cluster.node, bucket);
            let copies = config.replicas.min(most);
            shard.usage.set_elsewhere(bucket, elsewhere, copies);
        }
        cluster.set_view(view);
    }
    Some(revision)
}

/// What the agent and its watch task share.
#[derive(Default)]
struct ViewWatch {
    /// The watch is set up and reporting: the agent reads every resync interval only.
    running: Cell<bool>,
    /// The revision the next watch starts from: the one after the last read (0: no read yet).
    from: Cell<i64>,
}

/// Keeps a watch of the cluster's prefix open while the node runs: each session starts from
/// the revision after the agent's last read, and any event wakes the agent to read the whole
/// prefix again (the read, not the event, is applied). Opened again at once after a session
/// that ran, with backoff after a failure, which is logged once per change of state.
async fn watch_view(
    shard: Rc<Shard>,
    cluster: Arc<Cluster>,
    watch: Rc<ViewWatch>,
    wakes: LocalSender<()>,
) {
    let prefix = yutu_api::cluster::prefix(&cluster.settings.name);
    let mut etcd = Etcd::new(&cluster.settings.etcd);
    let mut backoff = WATCH_BACKOFF.0;
    let mut failing = false;
    while !shard.stop.is_stopped() {
        let from = watch.from.get();
        if from == 0 {
            // No read yet: a watch "from now" could start after a change the read missed.
            shard.stop.sleep(POLL_INTERVAL).await;
            continue;
        }
        let mut created = false;
        let ended = etcd
            .watch_prefix(
                &prefix,
                from,
                WATCH_SESSION,
                || shard.stop.is_stopped(),
                |doc| {
                    if doc.created && !created {
                        created = true;
                        watch.running.set(true);
                        ClusterMetrics::inc(&cluster.metrics.watch_starts);
                    }
                    if doc.canceled {
                        // Compacted away (or ended by etcd): read everything again, and
                        // start the next watch no earlier than what is left.
                        watch.from.set(watch.from.get().max(doc.compact_revision));
                    }
                    if doc.canceled || !doc.events.is_empty() {
                        // Full: a wake-up is pending already, and one read answers both.
                        let _ = wakes.try_send(());
                    }
                    !doc.canceled
                },
            )
            .await;
        watch.running.set(false);
        let pause = match ended {
            Ok(()) if created => {
                if failing {
                    tracing::info!("watching the cluster in etcd again");
                    failing = false;
                }
                backoff = WATCH_BACKOFF.0;
                // A short pause, so that an etcd ending every stream at once cannot spin.
                WATCH_BACKOFF.0 / 4
            }
            other => {
                if !failing {
                    let error = match other {
                        Err(e) => e.to_string(),
                        Ok(()) => "the stream ended before etcd set the watch up".into(),
                    };
                    tracing::warn!(
                        %error,
                        "cannot watch the cluster in etcd; reading it every {} ms and trying \
                         the watch again",
                        POLL_INTERVAL.as_millis()
                    );
                    failing = true;
                }
                let pause = backoff;
                backoff = (backoff * 2).min(WATCH_BACKOFF.1);
                pause
            }
        };
        shard.stop.sleep(pause).await;
    }
}

/// While etcd does not answer this node, asks the peers every [`PROBE_INTERVAL`] whether they
/// reach it, and sets the outage rule from their answers. A task of its own, so that calls to
/// a frozen etcd hanging in the agent do not delay the verdict past the lease.
async fn watch_etcd_reach(shard: Rc<Shard>, cluster: Arc<Cluster>) {
    let mut verdict_logged = None;
    while !shard.stop.is_stopped() {
        if cluster.etcd_reachable() {
            // The agent clears the outage rule once the lease is renewed (not before: until
            // then the lease may have run out).
            verdict_logged = None;
        } else if cluster.with_lease(|l| l.id.is_some()) {
            let verdict = probe_peers(&cluster).await;
            if verdict_logged.as_ref() != Some(&verdict) {
                match verdict {
                    Verdict::Partitioned => tracing::warn!(
                        "cut off from etcd while peers reach it: once this node's lease runs \
                         out it stops acknowledging writes as an owner"
                    ),
                    Verdict::Alone => tracing::warn!(
                        "cut off from etcd and from every peer: once this node's lease runs out \
                         it stops acknowledging writes as an owner"
                    ),
                    Verdict::Outage => {}
                }
                verdict_logged = Some(verdict);
            }
            cluster.set_outage(verdict_logged == Some(Verdict::Outage));
        }
        shard.stop.sleep(PROBE_INTERVAL).await;
    }
}

/// Registers `me` under `key` with `lease`: written if the name is free, or taken over if the
/// record there is this node's own (the same instance, from before a restart); `false` when
/// another node holds the name.
async fn register(
    etcd: &mut Etcd,
    key: &str,
    json: &[u8],
    me: &Member,
    lease: i64,
) -> Result<bool, EtcdError> {
    if etcd.create_leased(key, json, lease).await? {
        return Ok(true);
    }
    let existing = etcd
        .get(key)
        .await?
        .and_then(|v| serde_json::from_slice::<Member>(&v).ok());
    match existing {
        Some(m) if !m.instance.is_empty() && m.instance != me.instance => Ok(false),
        // Our own record (or one from a node too old to say): take it over.
        _ => etcd.put(key, json, Some(lease)).await.map(|()| true),
    }
}

/// Least time between two publications of a node's bytes per bucket (each is an etcd write,
/// and a new revision every node reads).
const USAGE_INTERVAL: Duration = Duration::from_secs(1);

/// How often a node cut off from etcd asks its peers whether they reach it.
const PROBE_INTERVAL: Duration = Duration::from_millis(500);

#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// A peer reaches etcd: this node is the one cut off.
    Partitioned,
    /// Peers answered and none reaches etcd: etcd is down.
    Outage,
    /// No peer answered: this node is cut off from everything.
    Alone,
}

async fn probe_peers(cluster: &Cluster) -> Verdict {
    let view = cluster.view();
    let mut answered = 0;
    for m in view.members.iter().filter(|m| m.name != cluster.node) {
        let Ok(client) = crate::net::client::Client::new(&m.url, PROBE_INTERVAL) else {
            continue;
        };
        let mut client = match cluster.node_token() {
            Some(t) => match client.with_bearer(&t) {
                Ok(c) => c,
                Err(_) => continue,
            },
            None => client,
        };
        let Ok(reply) = client
            .send(http::Method::GET, yutu_api::cluster::MEMBERSHIP_PATH, None)
            .await
        else {
            continue;
        };
        let Ok(doc) = serde_json::from_slice::<yutu_api::cluster::Membership>(&reply.body) else {
            continue;
        };
        answered += 1;
        if doc.etcd_reachable {
            return Verdict::Partitioned;
        }
    }
    if answered > 0 {
        Verdict::Outage
    } else {
        Verdict::Alone
    }
}

/// Members and buckets under the cluster's prefix, in one read.
pub async fn read_view(etcd: &mut Etcd, cluster: &str) -> Result<View, EtcdError> {
    let prefix = yutu_api::cluster::prefix(cluster);
    let (revision, kvs) = etcd.range_prefix(&prefix).await?;
    Ok(build_view(&prefix, revision, kvs))
}

/// The view the keys under `prefix` describe (records that cannot be read are skipped and
/// logged). Public for the fuzz target.
pub fn build_view(prefix: &str, revision: i64, kvs: Vec<super::etcd::KeyValue>) -> View {
    let mut view = View {
        revision,
        ..View::default()
    };
    let mut draining = Vec::new();
    for kv in kvs {
        // Yutu writes UTF-8 keys only: another key under the prefix is not Yutu's.
        let Ok(key) = std::str::from_utf8(&kv.key) else {
            tracing::warn!(key = %String::from_utf8_lossy(&kv.key), "ignoring a key that is not UTF-8");
            continue;
        };
        let Some(rest) = key.strip_prefix(prefix) else {
            continue;
        };
        if let Some(name) = rest.strip_prefix("drain/") {
            draining.push(name.to_string());
            continue;
        }
        if let Some(name) = rest.strip_prefix("usage/") {
            match serde_json::from_slice::<NodeUsage>(&kv.value) {
                Ok(u) => {
                    view.usage.insert(name.to_string(), u);
                }
                Err(_) => tracing::warn!(%key, "ignoring an unreadable usage record"),
            }
            continue;
        }
        if let Some(name) = rest.strip_prefix("members/") {
            match serde_json::from_slice::<Member>(&kv.value) {
                Ok(m) if m.name == name => view.members.push(m),
                _ => tracing::warn!(%key, "ignoring an unreadable member record"),
            }
        } else if let Some(bucket) = rest.strip_prefix("buckets/") {
            match serde_json::from_slice::<BucketConfig>(&kv.value) {
                Ok(c) => {
                    view.buckets.insert(bucket.to_string(), c);
                }
                Err(_) => tracing::warn!(%key, "ignoring an unreadable bucket record"),
            }
        }
    }
    view.members.sort_by(|a, b| a.name.cmp(&b.name));
    for m in &mut view.members {
        m.draining = draining.contains(&m.name);
    }
    view
}
