//! The conductor's state: index, nodes, instances, counters; and the operations that change
//! it other than routing (membership, load reports, events, snapshots).
//!
//! [`Conductor`] does no I/O and keeps no clock: every operation is given `now_ms`, the time
//! in milliseconds on any monotonic clock (the service uses time since it started; the
//! simulator its virtual time). That is what lets the simulator run the very code the
//! service runs, and tests check behaviour without sleeping.

use yutu_api::events::{validate_node_name, EventError, KvEventBatch, KvEventKind, KvSnapshot};
use yutu_api::route::{InstanceRegistration, InstanceStatus, LoadReport, Role};

use crate::config::ConductorConfig;
use crate::feed::{BatchOutcome, FeedSink, ResyncNeeded, SnapshotOutcome};
use crate::hot::HotTracker;
use crate::ids::{BucketId, Buckets, InstanceId, NodeId};
use crate::index::{PrefixIndex, PrefixMatch};
use crate::membership::{Change, Roster};
use crate::metrics::Stats;
use crate::nodes::NodeTable;
use crate::registry::{validate_node_url, Registry, RegistryError};

/// Why events or a snapshot were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IngestError {
    #[error("invalid events: {0}")]
    Invalid(#[from] EventError),
    #[error("too many storage nodes; {0:?} was not added")]
    TooManyNodes(String),
    #[error("snapshot is from node {got:?}, expected {expected:?}")]
    WrongNode { expected: String, got: String },
    #[error("unknown node id")]
    UnknownNode,
}

/// What one read of the etcd membership changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MembershipUpdate {
    /// Members not in the previous read (new, or back after leaving).
    pub joined: Vec<String>,
    /// Members listed with a new run (`started_ms`) without having left in between.
    pub restarted: Vec<String>,
    /// Members gone from the read: what they held is no longer routed to.
    pub left: Vec<String>,
    /// Resyncs to serve: (node, generation).
    pub resyncs: Vec<(NodeId, u64)>,
    /// Members that could not be added as nodes.
    pub refused: Vec<(String, RegistryError)>,
}

/// What one pushed batch did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IngestOutcome {
    pub node: NodeId,
    pub batch: BatchOutcome,
}

/// Work the routing code keeps between calls so it does not allocate per request.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    pub matches: PrefixMatch,
    pub prefill: Vec<InstanceId>,
    pub decode: Vec<InstanceId>,
    pub plans: Vec<crate::routing::PrefillPlan>,
    pub memo: Vec<crate::routing::ServiceKey>,
}

/// The conductor: everything routing needs, behind one `&mut`.
pub struct Conductor {
    pub(crate) cfg: ConductorConfig,
    pub(crate) nodes: NodeTable,
    pub(crate) buckets: Buckets,
    pub(crate) index: PrefixIndex,
    pub(crate) registry: Registry,
    pub(crate) hot: HotTracker,
    pub(crate) stats: Stats,
    pub(crate) rng: u64,
    pub(crate) rr_prefill: usize,
    pub(crate) rr_decode: usize,
    pub(crate) scratch: Scratch,
    /// The etcd membership last read (empty without etcd).
    pub(crate) roster: Roster,
}

/// Applies one node's feed decisions to the index.
struct IndexSink<'a> {
    index: &'a mut PrefixIndex,
    buckets: &'a mut Buckets,
    node: NodeId,
}

impl FeedSink for IndexSink<'_> {
    fn apply(&mut self, kind: &KvEventKind) {
        match kind {
            KvEventKind::Stored {
                bucket,
                tier,
                blocks,
            } => {
                if let Some(b) = self.buckets.intern(bucket) {
                    self.index.store(self.node, b, blocks, *tier);
                }
            }
            KvEventKind::Removed { bucket, blocks } => {
                if let Some(b) = self.buckets.get(bucket) {
                    self.index.remove(self.node, b, blocks);
                }
            }
            KvEventKind::Cleared { bucket: None } => self.index.clear(self.node, None),
            KvEventKind::Cleared { bucket: Some(name) } => {
                if let Some(b) = self.buckets.get(name) {
                    self.index.clear(self.node, Some(b));
                }
            }
        }
    }

    fn forget_node(&mut self) {
        self.index.clear(self.node, None);
    }

    fn load_snapshot(&mut self, snapshot: &KvSnapshot) {
        self.index.clear(self.node, None);
        for g in &snapshot.groups {
            if let Some(b) = self.buckets.intern(&g.bucket) {
                self.index.store(self.node, b, &g.blocks, g.tier);
            }
        }
    }
}

impl Conductor {
    pub fn new(cfg: ConductorConfig) -> Conductor {
        let hot = HotTracker::new(cfg.hot.half_life_ms, cfg.hot.max_tracked);
        let mut index = PrefixIndex::new();
        index.reserve(cfg.index_capacity_blocks);
        Conductor {
            nodes: NodeTable::new(cfg.max_nodes, cfg.resync_buffer_blocks),
            buckets: Buckets::new(cfg.max_buckets),
            index,
            registry: Registry::new(cfg.max_instances),
            hot,
            stats: Stats::default(),
            rng: cfg.seed | 1,
            rr_prefill: 0,
            rr_decode: 0,
            scratch: Scratch::default(),
            roster: Roster::default(),
            cfg,
        }
    }

    pub fn config(&self) -> &ConductorConfig {
        &self.cfg
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    pub fn index(&self) -> &PrefixIndex {
        &self.index
    }

    /// Mutable access for bulk loading (benchmarks, tests).
    pub fn index_mut(&mut self) -> &mut PrefixIndex {
        &mut self.index
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The id of bucket `name`, adding it if there is room.
    pub fn bucket(&mut self, name: &str) -> Option<BucketId> {
        self.buckets.intern(name)
    }

    pub fn node_id(&self, name: &str) -> Option<NodeId> {
        self.nodes.get(name)
    }

    pub fn node_name(&self, id: NodeId) -> &str {
        self.nodes.name(id)
    }

    pub fn node_url(&self, id: NodeId) -> Option<&str> {
        self.nodes.node(id).and_then(|n| n.url.as_deref())
    }

    pub fn instance_name(&self, id: InstanceId) -> &str {
        &self.registry.get(id).id
    }

    /// Registers a storage node (or updates its URL). Returns the node, and the generation of
    /// a resync that was waiting for the URL, which the caller should now serve.
    pub fn register_node(
        &mut self,
        name: &str,
        url: Option<&str>,
    ) -> Result<(NodeId, Option<u64>), RegistryError> {
        validate_node_name(name).map_err(|_| RegistryError::BadNodeName)?;
        if let Some(u) = url {
            validate_node_url(u)?;
        }
        let id = self.nodes.intern(name).ok_or(RegistryError::TooManyNodes)?;
        let node = self.nodes.node_mut(id).ok_or(RegistryError::TooManyNodes)?;
        let had_url = node.url.is_some();
        if let Some(u) = url {
            node.url = Some(u.trim_end_matches('/').to_owned());
        }
        // A resync that was stuck for want of a URL can go ahead now; one that already had a
        // URL has a task serving it (which reads the new URL on its next attempt).
        let pending = node
            .feed
            .resyncing()
            .filter(|_| !had_url && node.url.is_some());
        Ok((id, pending))
    }

    /// Registers an instance (and its storage node). Returns the instance, and a resync that
    /// was waiting for the node's URL, as [`Conductor::register_node`] does.
    pub fn register_instance(
        &mut self,
        reg: &InstanceRegistration,
        now_ms: f64,
    ) -> Result<(InstanceId, Option<(NodeId, u64)>), RegistryError> {
        let (node, pending) = match &reg.node {
            Some(name) => {
                let (id, pending) = self.register_node(name, reg.node_url.as_deref())?;
                (Some(id), pending.map(|g| (id, g)))
            }
            None => (None, None),
        };
        let iid = self.registry.register(&reg.id, reg.role, node, now_ms)?;
        Ok((iid, pending))
    }

    pub fn deregister_instance(&mut self, id: &str) -> bool {
        self.registry.deregister(id)
    }

    /// A heartbeat: the instance is alive.
    pub fn heartbeat(&mut self, id: &str, now_ms: f64) -> Result<(), RegistryError> {
        self.registry.touch(id, now_ms).map(|_| ())
    }

    /// A load report (also a heartbeat).
    pub fn report_load(
        &mut self,
        id: &str,
        report: &LoadReport,
        now_ms: f64,
    ) -> Result<(), RegistryError> {
        let iid = self.registry.touch(id, now_ms)?;
        self.report_load_by_id(iid, report, now_ms);
        Ok(())
    }

    /// [`Conductor::report_load`] by id (the simulator's path).
    pub fn report_load_by_id(&mut self, iid: InstanceId, report: &LoadReport, now_ms: f64) {
        let queued_ms = match (report.queued_prefill_ms, report.queued_prefill_tokens) {
            (Some(ms), _) if ms.is_finite() => Some(ms),
            // A token count alone is costed as one uncached prompt of that many tokens: an
            // over-estimate when it is several short prompts, which errs towards not
            // overloading the instance.
            (_, Some(tokens)) => Some(self.cfg.cost.prefill_ms(tokens, 0)),
            _ => None,
        };
        let inst = self.registry.get_mut(iid);
        inst.last_seen_ms = now_ms;
        if let Some(ms) = queued_ms {
            inst.prefill.report(now_ms, ms);
        }
        if report.running_requests.is_some() || report.running_tokens.is_some() {
            let (r, t) = inst
                .decode
                .predicted(now_ms, now_ms, self.cfg.report_ttl_ms);
            inst.decode.report(
                now_ms,
                report.running_requests.map_or(r, f64::from),
                report.running_tokens.map_or(t, |t| t as f64),
            );
        }
    }

    /// Every registered instance with its predicted load.
    pub fn instance_status(&self, now_ms: f64) -> Vec<InstanceStatus> {
        self.registry
            .iter()
            .filter(|(_, i)| i.registered)
            .map(|(_, i)| {
                let (requests, tokens) = i.decode.predicted(now_ms, now_ms, self.cfg.report_ttl_ms);
                let last_report = match i.role {
                    Role::Prefill => i.prefill.last_report_ms(),
                    Role::Decode => i.decode.last_report_ms(),
                };
                InstanceStatus {
                    id: i.id.clone(),
                    role: i.role,
                    node: i.node.map(|n| self.nodes.name(n).to_owned()),
                    alive: Registry::is_alive(i, now_ms, self.cfg.instance_ttl_ms),
                    queue_ms: i.prefill.queue_ms(now_ms),
                    decode_requests: requests,
                    decode_tokens: tokens,
                    routed: i.routed,
                    report_age_ms: last_report.map(|t| (now_ms - t).max(0.0)),
                }
            })
            .collect()
    }

    /// Applies a pushed batch. When the outcome asks for a resync, the caller fetches the
    /// node's snapshot and hands it to [`Conductor::apply_snapshot`].
    pub fn ingest(&mut self, batch: &KvEventBatch) -> Result<IngestOutcome, IngestError> {
        if let Err(e) = batch.validate() {
            self.stats.invalid_batches += 1;
            return Err(e.into());
        }
        let node = self
            .nodes
            .intern(&batch.node)
            .ok_or_else(|| IngestError::TooManyNodes(batch.node.clone()))?;
        let Conductor {
            nodes,
            index,
            buckets,
            stats,
            ..
        } = self;
        let entry = nodes.node_mut(node).ok_or(IngestError::UnknownNode)?;
        let mut sink = IndexSink {
            index,
            buckets,
            node,
        };
        let out = entry.feed.on_batch(batch, &mut sink);
        stats.event_batches += 1;
        stats.events_applied += out.applied as u64;
        stats.event_duplicates += out.duplicates as u64;
        stats.events_buffered += out.buffered as u64;
        stats.stale_batches += u64::from(out.stale);
        stats.departed_batches += u64::from(out.departed);
        if let Some(r) = out.resync {
            stats.resync(r.reason);
        }
        Ok(IngestOutcome { node, batch: out })
    }

    /// The URL to fetch `node`'s snapshot from, while resync `generation` is still the one
    /// wanted (`None` once it is done or superseded, or while the URL is unknown).
    pub fn resync_source(&self, node: NodeId, generation: u64) -> Option<String> {
        let n = self.nodes.node(node)?;
        if n.feed.resyncing() != Some(generation) {
            return None;
        }
        n.url.clone()
    }

    /// Whether resync `generation` of `node` is still wanted.
    pub fn resync_wanted(&self, node: NodeId, generation: u64) -> bool {
        self.nodes
            .node(node)
            .is_some_and(|n| n.feed.resyncing() == Some(generation))
    }

    /// Counts a failed snapshot fetch.
    pub fn snapshot_failed(&mut self) {
        self.stats.snapshot_failures += 1;
    }

    /// Applies a snapshot fetched for resync `generation` of `node`.
    pub fn apply_snapshot(
        &mut self,
        node: NodeId,
        generation: u64,
        snapshot: &KvSnapshot,
    ) -> Result<SnapshotOutcome, IngestError> {
        snapshot.validate()?;
        let Conductor {
            nodes,
            index,
            buckets,
            stats,
            ..
        } = self;
        let entry = nodes.node_mut(node).ok_or(IngestError::UnknownNode)?;
        if entry.name != snapshot.node {
            return Err(IngestError::WrongNode {
                expected: entry.name.clone(),
                got: snapshot.node.clone(),
            });
        }
        let mut sink = IndexSink {
            index,
            buckets,
            node,
        };
        let out = entry.feed.on_snapshot(generation, snapshot, &mut sink);
        match out {
            SnapshotOutcome::Synced { replayed } => {
                stats.snapshots_applied += 1;
                stats.events_applied += replayed as u64;
            }
            SnapshotOutcome::Again(ResyncNeeded { reason, .. }) => {
                stats.snapshots_applied += 1;
                stats.resync(reason);
            }
            SnapshotOutcome::Ignored => {}
        }
        Ok(out)
    }

    /// The etcd membership last read.
    pub fn roster(&self) -> &Roster {
        &self.roster
    }

    /// Applies one read of the etcd membership (`members` at `revision`; `complete` false
    /// when the read was cut at its limit, so that absence means nothing): members are
    /// registered with their URLs, a departed member is forgotten, and one that is back or
    /// runs anew is resynced (see [`crate::feed::Feed::on_member`]). The caller serves the
    /// resyncs returned. Not calling it (etcd unreachable) keeps the last membership.
    pub fn apply_membership(
        &mut self,
        revision: i64,
        members: &[yutu_api::cluster::Member],
        complete: bool,
    ) -> MembershipUpdate {
        let mut out = MembershipUpdate::default();
        for change in self.roster.update(revision, members, complete) {
            let (member, new_run) = match change {
                Change::Left(name) => {
                    self.depart(&name);
                    self.stats.member_left += 1;
                    out.left.push(name);
                    continue;
                }
                Change::Joined(m) => {
                    self.stats.member_joined += 1;
                    out.joined.push(m.name.clone());
                    (m, true)
                }
                Change::Restarted { member, .. } => {
                    self.stats.member_restarted += 1;
                    out.restarted.push(member.name.clone());
                    (member, true)
                }
                // Same run: only the URL, which the next snapshot fetch uses.
                Change::Moved(m) => (m, false),
            };
            let (id, pending) = match self.register_node(&member.name, Some(&member.url)) {
                Ok(r) => r,
                Err(e) => {
                    out.refused.push((member.name.clone(), e));
                    continue;
                }
            };
            let Conductor {
                nodes,
                index,
                buckets,
                stats,
                ..
            } = self;
            let Some(node) = nodes.node_mut(id) else {
                continue;
            };
            let mut sink = IndexSink {
                index,
                buckets,
                node: id,
            };
            let need = if new_run {
                node.feed.on_member(member.started_ms, &mut sink)
            } else {
                None
            };
            if let Some(r) = need {
                stats.resync(r.reason);
            }
            // A new resync supersedes one that was waiting for the URL.
            if let Some(generation) = need.map(|r| r.generation).or(pending) {
                out.resyncs.push((id, generation));
            }
        }
        out
    }

    /// A member left: drop what it held and ignore its events until it is back.
    fn depart(&mut self, name: &str) {
        let Some(id) = self.nodes.get(name) else {
            return;
        };
        let Conductor {
            nodes,
            index,
            buckets,
            ..
        } = self;
        if let Some(node) = nodes.node_mut(id) {
            let mut sink = IndexSink {
                index,
                buckets,
                node: id,
            };
            node.feed.depart(&mut sink);
        }
    }

    /// Storage nodes with their feed position, for `GET /v1/nodes`.
    pub fn node_status(&self) -> Vec<NodeStatus> {
        self.nodes
            .iter()
            .map(|(id, n)| NodeStatus {
                node: n.name.clone(),
                url: n.url.clone(),
                epoch: n.feed.epoch(),
                seq: n.feed.last_seq(),
                resyncing: n.feed.resyncing().is_some(),
                departed: n.feed.departed(),
                blocks: self.index.confirmed_on(id),
            })
            .collect()
    }
}

/// One row of `GET /v1/nodes`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeStatus {
    pub node: String,
    pub url: Option<String>,
    pub epoch: Option<u64>,
    /// The last event applied.
    pub seq: u64,
    pub resyncing: bool,
    /// Out of the etcd membership: nothing it held is routed to, its events are ignored until
    /// it is back.
    #[serde(default)]
    pub departed: bool,
    /// Confirmed blocks held.
    pub blocks: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use yutu_api::block_hash::BlockHash;
    use yutu_api::events::{KvEvent, SnapshotGroup, Tier};

    fn stored(seq: u64, ids: std::ops::Range<u64>) -> KvEvent {
        KvEvent {
            seq,
            kind: KvEventKind::Stored {
                bucket: "llama".into(),
                tier: Tier::Dram,
                blocks: ids.map(BlockHash::from_id).collect(),
            },
        }
    }

    fn batch(events: Vec<KvEvent>) -> KvEventBatch {
        KvEventBatch {
            node: "a".into(),
            epoch: 7,
            events,
        }
    }

    #[test]
    fn a_gap_waits_for_the_url_then_the_snapshot_replaces_the_node() {
        let mut c = Conductor::new(ConductorConfig::default());
        c.ingest(&batch(vec![stored(1, 0..4)])).expect("valid");
        let a = c.node_id("a").expect("known from its events");
        assert_eq!(c.index().confirmed_on(a), 4);
        let out = c.ingest(&batch(vec![stored(3, 10..12)])).expect("valid");
        let need = out.batch.resync.expect("gap");
        assert_eq!(c.stats().resyncs(), 1);
        // The node pushed before being registered: nothing to fetch from yet.
        assert_eq!(c.resync_source(a, need.generation), None);
        assert!(c.resync_wanted(a, need.generation));
        let (id, pending) = c
            .register_node("a", Some("http://127.0.0.1:1/"))
            .expect("valid");
        assert_eq!((id, pending), (a, Some(need.generation)));
        // Registering again does not start a second fetch.
        assert_eq!(
            c.register_node("a", Some("http://127.0.0.1:1"))
                .map(|r| r.1),
            Ok(None)
        );
        assert_eq!(
            c.resync_source(a, need.generation).as_deref(),
            Some("http://127.0.0.1:1")
        );
        let wrong = KvSnapshot {
            node: "b".into(),
            epoch: 7,
            seq: 2,
            groups: vec![],
        };
        assert!(matches!(
            c.apply_snapshot(a, need.generation, &wrong),
            Err(IngestError::WrongNode { .. })
        ));
        let snap = KvSnapshot {
            node: "a".into(),
            epoch: 7,
            seq: 2,
            groups: vec![SnapshotGroup {
                bucket: "llama".into(),
                tier: Tier::Nvme,
                blocks: (100..103).map(BlockHash::from_id).collect(),
            }],
        };
        let out = c.apply_snapshot(a, need.generation, &snap).expect("valid");
        assert_eq!(out, SnapshotOutcome::Synced { replayed: 1 });
        assert_eq!(c.index().confirmed_on(a), 3 + 2);
        assert!(!c.resync_wanted(a, need.generation));
        let status = c.node_status();
        assert_eq!(status[0].seq, 3);
        assert!(!status[0].resyncing);
        assert_eq!(c.stats().snapshots_applied, 1);
    }

    #[test]
    fn etcd_membership_registers_drops_and_resyncs_nodes() {
        let member = |started_ms: u64, port: u16| yutu_api::cluster::Member {
            name: "a".into(),
            url: format!("http://127.0.0.1:{port}/"),
            transfer: None,
            zone: None,
            memory: 0,
            nvme: 0,
            shards: 1,
            started_ms,
            draining: false,
            instance: String::new(),
        };
        let mut c = Conductor::new(ConductorConfig::default());
        let out = c.apply_membership(1, &[member(7, 1)], true);
        assert_eq!((out.joined.len(), out.resyncs.len()), (1, 0));
        let a = c.node_id("a").expect("registered from etcd");
        assert_eq!(c.node_url(a), Some("http://127.0.0.1:1"));
        c.ingest(&batch(vec![stored(1, 0..4)])).expect("valid");
        assert_eq!(c.index().confirmed_on(a), 4);
        // Same run on another port: the URL follows, nothing is dropped.
        let out = c.apply_membership(2, &[member(7, 2)], true);
        assert!(out.resyncs.is_empty() && out.joined.is_empty());
        assert_eq!(c.node_url(a), Some("http://127.0.0.1:2"));
        assert_eq!(c.index().confirmed_on(a), 4);
        // etcd lists run 8 before its events: run 7's blocks go at once, a resync is due.
        let out = c.apply_membership(3, &[member(8, 3)], true);
        assert_eq!(out.restarted, ["a"]);
        assert_eq!(c.index().confirmed_on(a), 0);
        let (node, generation) = out.resyncs[0];
        assert_eq!(node, a);
        let snap = KvSnapshot {
            node: "a".into(),
            epoch: 8,
            seq: 0,
            groups: vec![SnapshotGroup {
                bucket: "llama".into(),
                tier: Tier::Nvme,
                blocks: (0..2).map(BlockHash::from_id).collect(),
            }],
        };
        let synced = c.apply_snapshot(a, generation, &snap).expect("valid");
        assert_eq!(synced, SnapshotOutcome::Synced { replayed: 0 });
        assert_eq!(c.index().confirmed_on(a), 2);
        // It leaves: dropped, its pushes ignored.
        let out = c.apply_membership(4, &[], true);
        assert_eq!(out.left, ["a"]);
        assert_eq!(c.index().confirmed_on(a), 0);
        let mut late = batch(vec![stored(1, 0..4)]);
        late.epoch = 8;
        assert!(c.ingest(&late).expect("valid").batch.departed);
        assert_eq!(c.index().confirmed_on(a), 0);
        assert_eq!(c.stats().departed_batches, 1);
    }

    #[test]
    fn malformed_batches_are_refused_whole() {
        let mut c = Conductor::new(ConductorConfig::default());
        let bad = batch(vec![stored(1, 0..1), stored(3, 1..2)]);
        assert!(matches!(c.ingest(&bad), Err(IngestError::Invalid(_))));
        assert_eq!(c.stats().invalid_batches, 1);
        assert!(c.index().is_empty());
        assert!(c.register_node("a", Some("ftp://x")).is_err());
        assert!(c.register_node("bad name", None).is_err());
    }

    #[test]
    fn token_only_reports_are_costed_and_listed() {
        let mut c = Conductor::new(ConductorConfig::default());
        c.register_instance(
            &InstanceRegistration {
                id: "p0".into(),
                role: Role::Prefill,
                node: Some("n0".into()),
                node_url: None,
            },
            0.0,
        )
        .expect("valid");
        c.report_load(
            "p0",
            &LoadReport {
                queued_prefill_tokens: Some(4096),
                ..LoadReport::default()
            },
            0.0,
        )
        .expect("known");
        assert!(c.report_load("zz", &LoadReport::default(), 0.0).is_err());
        let rows = c.instance_status(0.0);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].queue_ms, c.config().cost.prefill_ms(4096, 0));
        assert_eq!(rows[0].node.as_deref(), Some("n0"));
        assert_eq!(rows[0].report_age_ms, Some(0.0));
        assert!(c.deregister_instance("p0"));
        assert!(c.instance_status(0.0).is_empty());
    }
}
