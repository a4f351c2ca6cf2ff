//! Following the cluster's membership in etcd (`--etcd`): a task that reads the members every
//! `poll_ms` and applies each read to the conductor ([`Conductor::apply_membership`]), so that
//! nodes are known (with their URLs, for snapshots) without registering, a node whose lease is
//! gone is no longer routed to, and a node that comes back is resynced.
//!
//! Polling rather than etcd's watch: a watch is a long-lived stream that needs its own
//! reconnection and compaction handling, while a read of a few hundred small keys twice a
//! second costs etcd nothing and is always a complete, consistent picture. A read that fails
//! (etcd down, frozen, or answering garbage) is counted and logged and changes nothing: the
//! conductor keeps routing on the last membership it read, because an etcd outage says
//! nothing about the nodes themselves.
//!
//! [`Conductor::apply_membership`]: crate::Conductor::apply_membership

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use super::{resync, Shared};
use crate::config::ClusterConfig;
use crate::etcd::{EtcdClient, EtcdError, RangeAnswer};
use crate::membership::{members_prefix, parse_members};

/// Consecutive failed reads between two warnings while etcd stays unreachable (the first
/// failure is always logged; at 500 ms per read this is one line every 10 s).
const WARN_EVERY: u64 = 20;

/// Reads the membership of one cluster from etcd.
pub struct MembershipWatch {
    etcd: Arc<EtcdClient>,
    cluster: String,
    prefix: String,
    poll: Duration,
    /// The most members one read returns: the conductor cannot hold more nodes anyway.
    limit: u64,
    /// Longest a whole read may take (every endpoint in turn, plus slack).
    deadline: Duration,
}

impl MembershipWatch {
    /// A watch of `cfg`'s cluster, reading at most `max_nodes` members at a time.
    pub fn new(cfg: &ClusterConfig, max_nodes: usize) -> Result<MembershipWatch, EtcdError> {
        let timeout = Duration::from_millis(cfg.call_timeout_ms.max(1));
        let etcd = EtcdClient::new(&cfg.etcd, timeout, cfg.max_answer_bytes)?;
        let deadline = timeout * etcd.endpoints().len() as u32 + Duration::from_secs(1);
        Ok(MembershipWatch {
            etcd: Arc::new(etcd),
            cluster: cfg.name.clone(),
            prefix: members_prefix(&cfg.name),
            poll: Duration::from_millis(cfg.poll_ms.max(10)),
            limit: max_nodes.max(1) as u64,
            deadline,
        })
    }

    pub fn endpoints(&self) -> &[String] {
        self.etcd.endpoints()
    }

    /// Reads the membership every poll interval, forever (drop the task to stop it).
    pub async fn run(self, shared: Arc<Shared>) {
        let mut tick = tokio::time::interval(self.poll);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut reporter = Reporter::default();
        loop {
            tick.tick().await;
            let read = self.read().await;
            apply(&shared, &self.cluster, read, &mut reporter);
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
