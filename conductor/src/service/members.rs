//! Following the cluster's membership in etcd (`--etcd`): a task that reads the members and
//! applies each read to the conductor ([`Conductor::apply_membership`]), so that nodes are
//! known (with their URLs, for snapshots) without registering, a node whose lease is gone is
//! no longer routed to, and a node that comes back is resynced.
//!
//! When to read: etcd's watch of the members' prefix is the wake-up, the full read the truth.
//! A thread holds a watch open from the revision after the last read; any event wakes the
//! task, which reads the whole prefix again at once, so a node's departure reaches routing in
//! the time etcd takes to report it rather than a poll interval later. The events themselves
//! are not applied: a read is a complete, consistent picture, while a stream of deltas would
//! need its own bookkeeping for compaction, reconnections and missed events. The periodic
//! read stays, slower (`resync_ms`), as the safety net for a watch that stops reporting
//! without breaking. While no watch runs (etcd refuses it, or it broke and is being set up
//! again with backoff), or after a failed read, the task reads every `poll_ms` as it did
//! before watches. Every wait has a deadline: a read gives up after its deadline, and a
//! watch stream lives at most [`WATCH_SESSION`] before it is opened again, so a frozen etcd
//! holds nothing.
//!
//! A read that fails (etcd down, frozen, or answering garbage) is counted and logged and
//! changes nothing: the conductor keeps routing on the last membership it read, because an
//! etcd outage says nothing about the nodes themselves.
//!
//! [`Conductor::apply_membership`]: crate::Conductor::apply_membership

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use super::{resync, Shared};
use crate::config::ClusterConfig;
use crate::etcd::{EtcdClient, EtcdError, RangeAnswer};
use crate::membership::{members_prefix, parse_members};

/// Consecutive failed reads between two warnings while etcd stays unreachable (the first
/// failure is always logged; at 500 ms per read this is one line every 10 s).
const WARN_EVERY: u64 = 20;

/// Longest one watch stream is kept open before it is opened again (from the revision after
/// the last read): the deadline of a watch on an etcd that froze with the stream open.
pub const WATCH_SESSION: Duration = Duration::from_secs(60);
/// First and longest pause before setting up a watch again after it failed.
const WATCH_BACKOFF: (Duration, Duration) = (Duration::from_millis(200), Duration::from_secs(5));

/// Reads the membership of one cluster from etcd.
pub struct MembershipWatch {
    etcd: Arc<EtcdClient>,
    cluster: String,
    prefix: String,
    poll: Duration,
    /// Reads while the watch runs; `None`: no watch.
    resync: Option<Duration>,
    /// The most members one read returns: the conductor cannot hold more nodes anyway.
    limit: u64,
    /// Longest a whole read may take (every endpoint in turn, plus slack).
    deadline: Duration,
}

/// What the task and the watch thread share.
#[derive(Debug, Default)]
struct WatchState {
    /// Woken on each batch of events (permits do not pile up: one read answers them all).
    changed: Notify,
    /// The watch is set up and reporting.
    running: AtomicBool,
    /// The revision the next watch starts from: the one after the last read.
    from: AtomicI64,
    /// The task is gone: the thread ends.
    stop: AtomicBool,
}

/// Stops the watch thread when the task ends (or is dropped).
struct StopOnDrop(Arc<WatchState>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.stop.store(true, Ordering::Relaxed);
    }
}

impl MembershipWatch {
    /// A watch of `cfg`'s cluster, reading at most `max_nodes` members at a time.
    pub fn new(cfg: &ClusterConfig, max_nodes: usize) -> Result<MembershipWatch, EtcdError> {
        let timeout = Duration::from_millis(cfg.call_timeout_ms.max(1));
        let etcd = EtcdClient::new(&cfg.etcd, timeout, cfg.max_answer_bytes)?;
        let deadline = timeout * etcd.endpoints().len() as u32 + Duration::from_secs(1);
        let poll = Duration::from_millis(cfg.poll_ms.max(10));
        Ok(MembershipWatch {
            etcd: Arc::new(etcd),
            cluster: cfg.name.clone(),
            prefix: members_prefix(&cfg.name),
            poll,
            resync: cfg
                .watch
                .then(|| Duration::from_millis(cfg.resync_ms).max(poll)),
            limit: max_nodes.max(1) as u64,
            deadline,
        })
    }

    pub fn endpoints(&self) -> &[String] {
        self.etcd.endpoints()
    }

    /// Reads the membership whenever the watch reports a change, and every resync (or poll)
    /// interval, forever (drop the task to stop it).
    pub async fn run(self, shared: Arc<Shared>) {
        let state = Arc::new(WatchState::default());
        let _stop = StopOnDrop(state.clone());
        if self.resync.is_some() {
            let (etcd, prefix, st, sh) = (
                self.etcd.clone(),
                self.prefix.clone(),
                state.clone(),
                shared.clone(),
            );
            let spawned = std::thread::Builder::new()
                .name("etcd-watch".into())
                .spawn(move || watch_thread(&etcd, &prefix, &st, &sh));
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "cannot start the etcd watch; reading every poll_ms");
            }
        }
        let mut reporter = Reporter::default();
        loop {
            let read = self.read().await;
            let ok = read.as_ref().ok().map(|r| r.revision);
            apply(&shared, &self.cluster, read, &mut reporter);
            let wait = match (ok, self.resync) {
                (Some(revision), Some(resync)) => {
                    state.from.fetch_max(revision + 1, Ordering::Relaxed);
                    if state.running.load(Ordering::Relaxed) {
                        resync
                    } else {
                        self.poll
                    }
                }
                _ => self.poll,
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = state.changed.notified() => shared.core().stats.watch_wakeups += 1,
            }
        }
    }

    /// One read, on the blocking pool (the client is blocking), within the deadline.
    async fn read(&self) -> Result<RangeAnswer, EtcdError> {
        let (etcd, prefix, limit) = (self.etcd.clone(), self.prefix.clone(), self.limit);
        let call = tokio::task::spawn_blocking(move || etcd.range_prefix(&prefix, limit));
        match tokio::time::timeout(self.deadline, call).await {
            Ok(Ok(read)) => read,
            Ok(Err(e)) => Err(EtcdError::Unreachable(format!(
                "the read was cancelled: {e}"
            ))),
            Err(_) => Err(EtcdError::Unreachable(format!(
                "no answer within {} ms",
                self.deadline.as_millis()
            ))),
        }
    }
}

/// Keeps a watch of `prefix` open until the task stops: each session starts from the
/// revision after the last read, wakes the task on events, and is opened again when it ends
/// (at once after a session that ran; with backoff after a failure). A failure is logged
/// when the watch goes from running to failing, and once more when it runs again.
fn watch_thread(etcd: &EtcdClient, prefix: &str, state: &WatchState, shared: &Shared) {
    let mut backoff = WATCH_BACKOFF.0;
    let mut failing = false;
    while !state.stop.load(Ordering::Relaxed) {
        let mut created = false;
        let from = state.from.load(Ordering::Relaxed);
        if from == 0 {
            // No read yet: a watch "from now" could start after a change the read missed.
            std::thread::sleep(WATCH_BACKOFF.0);
            continue;
        }
        let ended = etcd.watch_prefix(prefix, from, WATCH_SESSION, |doc| {
            if doc.created && !created {
                created = true;
                state.running.store(true, Ordering::Relaxed);
                shared.core().stats.watch_starts += 1;
            }
            if doc.canceled {
                // Its start was compacted away (or etcd ended it): read everything again,
                // and start the next watch no earlier than what is left.
                state
                    .from
                    .fetch_max(doc.compact_revision, Ordering::Relaxed);
                state.changed.notify_one();
                return false;
            }
            if !doc.events.is_empty() {
                state.changed.notify_one();
            }
            !state.stop.load(Ordering::Relaxed)
        });
        state.running.store(false, Ordering::Relaxed);
        match ended {
            Ok(()) if created => {
                if failing {
                    tracing::info!("watching the cluster membership in etcd again");
                    failing = false;
                }
                backoff = WATCH_BACKOFF.0;
                // A session that ran: open the next one at once (a short pause so that an
                // etcd ending every stream at once cannot spin this thread).
                std::thread::sleep(WATCH_BACKOFF.0 / 4);
                continue;
            }
            Ok(()) if !failing => {
                tracing::warn!(
                    "etcd ended the watch of the cluster membership before setting it up; \
                     reading it every poll_ms and trying the watch again"
                );
                failing = true;
            }
            Ok(()) => {}
            Err(e) if !failing => {
                tracing::warn!(
                    error = %e,
                    "cannot watch the cluster membership in etcd; reading it every poll_ms \
                     and trying the watch again"
                );
                failing = true;
            }
            Err(_) => {}
        }
        std::thread::sleep(backoff);
        backoff = (backoff * 2).min(WATCH_BACKOFF.1);
    }
}

/// What the watch remembers between reads, so that it logs changes of state rather than
/// every read.
#[derive(Debug, Default)]
pub(crate) struct Reporter {
    /// Consecutive failed reads.
    failures: u64,
    /// Keys reported as unusable members in the last read.
    bad_keys: BTreeSet<String>,
    /// Whether the last read was cut at its limit.
    truncated: bool,
}

/// Applies one read (or its failure) to the conductor and starts the resyncs it asks for.
pub(crate) fn apply(
    shared: &Arc<Shared>,
    cluster: &str,
    read: Result<RangeAnswer, EtcdError>,
    reporter: &mut Reporter,
) {
    let read = match read {
        Ok(read) => read,
        Err(e) => {
            {
                let mut core = shared.core();
                core.stats.etcd_error(e.kind());
                core.stats.etcd_reachable = Some(false);
            }
            reporter.failures += 1;
            if reporter.failures == 1 || reporter.failures % WARN_EVERY == 0 {
                tracing::warn!(
                    error = %e,
                    failures = reporter.failures,
                    "cannot read the cluster membership from etcd; routing on the last one read"
                );
            }
            return;
        }
    };
    if reporter.failures > 0 {
        tracing::info!(
            failures = reporter.failures,
            "etcd answers again; following the cluster membership"
        );
        reporter.failures = 0;
    }
    let (members, problems) = parse_members(cluster, &read.kvs);
    let bad_keys: BTreeSet<String> = problems.iter().map(|p| p.key().to_owned()).collect();
    let new_problems: Vec<_> = problems
        .iter()
        .filter(|p| !reporter.bad_keys.contains(p.key()))
        .collect();
    for p in &new_problems {
        tracing::warn!(error = %p, "skipping a membership key");
    }
    if read.more && !reporter.truncated {
        tracing::warn!(
            read = read.kvs.len(),
            "the cluster has more members than the conductor holds nodes (max_nodes); \
             the rest are ignored and none is taken to have left"
        );
    }
    let update = {
        let mut core = shared.core();
        core.stats.etcd_reads += 1;
        core.stats.etcd_reachable = Some(true);
        for _ in &new_problems {
            core.stats.etcd_error("member");
        }
        if read.more {
            core.stats.etcd_error("truncated");
        }
        core.apply_membership(read.revision, &members, !read.more)
    };
    reporter.bad_keys = bad_keys;
    reporter.truncated = read.more;
    for name in &update.joined {
        let url = members
            .iter()
            .find(|m| &m.name == name)
            .map_or("", |m| m.url.as_str());
        tracing::info!(node = %name, %url, revision = read.revision, "node joined the cluster");
    }
    for name in &update.restarted {
        tracing::info!(node = %name, revision = read.revision, "node restarted (new run in etcd)");
    }
    for name in &update.left {
        tracing::info!(
            node = %name,
            revision = read.revision,
            "node left the cluster (lease gone): what it held is no longer routed to"
        );
    }
    for (name, e) in &update.refused {
        tracing::warn!(node = %name, error = %e, "cannot add a cluster member as a node");
    }
    for (node, generation) in update.resyncs {
        tracing::info!(node = %shared.core().node_name(node), "node resync started (membership)");
        resync::spawn(shared.clone(), node, generation);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConductorConfig;
    use crate::etcd::KeyValue;
    use crate::service::ServiceLimits;
    use crate::Conductor;
    use yutu_api::block_hash::BlockHash;
    use yutu_api::cluster::{member_key, Member};
    use yutu_api::events::{KvEvent, KvEventBatch, KvEventKind, Tier};

    fn read(revision: i64, members: &[(&str, u64)]) -> Result<RangeAnswer, EtcdError> {
        Ok(RangeAnswer {
            revision,
            kvs: members
                .iter()
                .map(|(name, started_ms)| KeyValue {
                    key: member_key("c", name).into_bytes(),
                    value: serde_json::to_vec(&Member {
                        name: name.to_string(),
                        // Nothing listens there: resyncs stay pending, which is all this needs.
                        url: "http://127.0.0.1:9".into(),
                        transfer: None,
                        zone: None,
                        memory: 0,
                        nvme: 0,
                        shards: 1,
                        started_ms: *started_ms,
                        draining: false,
                        instance: String::new(),
                    })
                    .unwrap_or_default(),
                })
                .collect(),
            more: false,
        })
    }

    fn stored(node: &str, epoch: u64, seq: u64) -> KvEventBatch {
        KvEventBatch {
            node: node.into(),
            epoch,
            events: vec![KvEvent {
                seq,
                kind: KvEventKind::Stored {
                    bucket: "llama".into(),
                    tier: Tier::Dram,
                    blocks: (0..4).map(BlockHash::from_id).collect(),
                },
            }],
        }
    }

    #[tokio::test]
    async fn an_outage_keeps_the_membership_and_a_departure_drops_the_node() {
        let mut cfg = ConductorConfig::default();
        cfg.cluster.etcd = vec!["http://127.0.0.1:9".into()];
        let shared = Shared::new(Conductor::new(cfg), ServiceLimits::default());
        let mut rep = Reporter::default();
        apply(&shared, "c", read(3, &[("a", 10), ("b", 20)]), &mut rep);
        let a = {
            let mut core = shared.core();
            assert_eq!(core.roster().len(), 2);
            let a = core.node_id("a").expect("registered from etcd");
            assert_eq!(core.node_url(a), Some("http://127.0.0.1:9"));
            core.ingest(&stored("a", 10, 1)).expect("valid");
            assert_eq!(core.index().confirmed_on(a), 4);
            a
        };
        // etcd goes away: every failure is counted, nothing changes.
        for _ in 0..3 {
            apply(
                &shared,
                "c",
                Err(EtcdError::Unreachable("refused".into())),
                &mut rep,
            );
        }
        {
            let core = shared.core();
            assert_eq!(core.stats().etcd_errors("unreachable"), 3);
            assert_eq!(core.stats().etcd_reachable, Some(false));
            assert_eq!(core.roster().len(), 2);
            assert_eq!(core.index().confirmed_on(a), 4, "still routed to");
        }
        // A bad key is skipped (and counted once), and a's lease is gone.
        let mut r = read(4, &[("b", 20)]).expect("a read");
        r.kvs.push(KeyValue {
            key: member_key("c", "junk").into_bytes(),
            value: b"{".to_vec(),
        });
        apply(&shared, "c", Ok(r.clone()), &mut rep);
        apply(&shared, "c", Ok(r), &mut rep);
        let mut core = shared.core();
        assert_eq!(core.stats().etcd_errors("member"), 1);
        assert_eq!(core.stats().etcd_reachable, Some(true));
        assert_eq!(core.roster().len(), 1);
        assert_eq!(core.index().confirmed_on(a), 0, "a departed");
        assert!(core.node_status()[0].departed);
        assert!(
            core.ingest(&stored("a", 10, 2))
                .expect("valid")
                .batch
                .departed
        );
        assert_eq!(core.index().confirmed_on(a), 0);
    }

    #[tokio::test]
    async fn a_returning_member_is_resynced() {
        let mut cfg = ConductorConfig::default();
        cfg.cluster.etcd = vec!["http://127.0.0.1:9".into()];
        let shared = Shared::new(Conductor::new(cfg), ServiceLimits::default());
        let mut rep = Reporter::default();
        apply(&shared, "c", read(3, &[("a", 10)]), &mut rep);
        let a = shared.core().node_id("a").expect("registered");
        shared.core().ingest(&stored("a", 10, 1)).expect("valid");
        apply(&shared, "c", read(4, &[]), &mut rep);
        assert_eq!(
            shared.core().nodes.node(a).map(|n| n.feed.departed()),
            Some(true)
        );
        // Back with a new run: a resync is under way for it.
        apply(&shared, "c", read(9, &[("a", 11)]), &mut rep);
        let core = shared.core();
        let status = &core.node_status()[0];
        assert!(!status.departed && status.resyncing, "{status:?}");
        assert_eq!(core.stats().resyncs(), 1);
        assert_eq!(core.stats().member_joined, 2);
        assert_eq!(core.stats().member_left, 1);
    }
}
