//! Counters, and their rendering as Prometheus text (`GET /metrics`) by the `prometheus` crate.
//!
//! The counters live inside the conductor's state, next to what they count, and are updated
//! under the same lock; rendering reads them and the index's and instances' gauges at once,
//! so one scrape is a consistent picture.

use prometheus::proto::{
    Bucket, Counter, Gauge, Histogram, LabelPair, Metric, MetricFamily, MetricType,
};
use prometheus::TextEncoder;
use yutu_api::route::{RejectReason, Role};

use crate::conductor::Conductor;
use crate::feed::ResyncReason;
use crate::registry::Registry;

/// Upper bounds (seconds) of the routing-latency histogram buckets.
const LATENCY_BOUNDS_S: [f64; 9] = [
    5e-6, 10e-6, 20e-6, 50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 5e-3,
];

const REJECT_REASONS: [RejectReason; 4] = [
    RejectReason::TtftSlo,
    RejectReason::TbtSlo,
    RejectReason::NoPrefillInstance,
    RejectReason::NoDecodeInstance,
];

const RESYNC_REASONS: [&str; 6] = [
    "first_contact",
    "gap",
    "restart",
    "sequence_reset",
    "snapshot_behind",
    "rejoin",
];

/// Why a read of the etcd membership failed or was not whole: no answer in time from any
/// endpoint, an error status, an answer that does not parse, a key that is not a usable
/// member (counted once per key), a read cut at its limit.
pub const ETCD_ERROR_KINDS: [&str; 5] = ["unreachable", "status", "answer", "member", "truncated"];

/// Everything the conductor counts.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub routed: u64,
    rejected: [u64; 4],
    pub pulls: u64,
    pub pulled_blocks: u64,
    pub prompt_blocks: u64,
    pub cached_blocks: u64,
    pub hints: u64,
    pub event_batches: u64,
    pub events_applied: u64,
    pub event_duplicates: u64,
    pub events_buffered: u64,
    pub stale_batches: u64,
    pub invalid_batches: u64,
    resyncs: [u64; 6],
    pub snapshots_applied: u64,
    pub snapshot_failures: u64,
    latency_buckets: [u64; 9],
    latency_sum_s: f64,
    latency_count: u64,
    /// Batches ignored because their node is out of the etcd membership.
    pub departed_batches: u64,
    /// Membership reads applied.
    pub etcd_reads: u64,
    etcd_errors: [u64; 5],
    /// Whether the last membership read succeeded; `None` before the first.
    pub etcd_reachable: Option<bool>,
    /// Watches of the membership prefix set up (etcd answered `created`): one at start, one
    /// more after each break or session end.
    pub watch_starts: u64,
    /// Membership reads woken by a watch event (rather than by the resync timer).
    pub watch_wakeups: u64,
    pub member_joined: u64,
    pub member_left: u64,
    pub member_restarted: u64,
}

impl Stats {
    pub fn reject(&mut self, reason: RejectReason) {
        if let Some(i) = REJECT_REASONS.iter().position(|r| *r == reason) {
            self.rejected[i] += 1;
        }
    }

    pub fn rejected(&self, reason: RejectReason) -> u64 {
        REJECT_REASONS
            .iter()
            .position(|r| *r == reason)
            .map_or(0, |i| self.rejected[i])
    }

    pub fn resync(&mut self, reason: ResyncReason) {
        if let Some(i) = RESYNC_REASONS.iter().position(|r| *r == reason.as_str()) {
            self.resyncs[i] += 1;
        }
    }

    /// Resyncs started, all reasons.
    pub fn resyncs(&self) -> u64 {
        self.resyncs.iter().sum()
    }

    /// Counts one etcd error of `kind` (one of [`ETCD_ERROR_KINDS`]).
    pub fn etcd_error(&mut self, kind: &str) {
        if let Some(i) = ETCD_ERROR_KINDS.iter().position(|k| *k == kind) {
            self.etcd_errors[i] += 1;
        }
    }

    /// etcd errors of `kind`.
    pub fn etcd_errors(&self, kind: &str) -> u64 {
        ETCD_ERROR_KINDS
            .iter()
            .position(|k| *k == kind)
            .map_or(0, |i| self.etcd_errors[i])
    }

    /// Records how long one routing decision took.
    pub fn observe_route(&mut self, seconds: f64) {
        self.latency_sum_s += seconds;
        self.latency_count += 1;
        for (i, bound) in LATENCY_BOUNDS_S.iter().enumerate() {
            if seconds <= *bound {
                self.latency_buckets[i] += 1;
            }
        }
    }
}

/// The whole `/metrics` page, in the Prometheus text format (version 0.0.4).
///
/// The values are read here, under the caller's lock, into the data model of the `prometheus`
/// crate, whose encoder writes the text (escaping label values: instance and node names).
pub fn render(c: &Conductor, now_ms: f64) -> String {
    let s = &c.stats;
    let mut families = Vec::new();
    let mut add = |name: &str, help: &str, kind: MetricType, series: Vec<Metric>| {
        // The encoder refuses a family without series (e.g. no prefill instance yet).
        if !series.is_empty() {
            families.push(family(name, help, kind, series));
        }
    };
    let counter = |v: u64| vec![value(&[], MetricType::COUNTER, v as f64)];
    let gauge = |v: u64| vec![value(&[], MetricType::GAUGE, v as f64)];
    add(
        "routed_total",
        "Requests placed.",
        MetricType::COUNTER,
        vec![value(
            &[("policy", &c.cfg.policy.to_string())],
            MetricType::COUNTER,
            s.routed as f64,
        )],
    );
    add(
        "rejected_total",
        "Requests refused, by reason.",
        MetricType::COUNTER,
        REJECT_REASONS
            .iter()
            .zip(s.rejected)
            .map(|(r, n)| value(&[("reason", r.as_str())], MetricType::COUNTER, n as f64))
            .collect(),
    );
    add(
        "pulls_total",
        "Decisions that pull a prefix from another node.",
        MetricType::COUNTER,
        counter(s.pulls),
    );
    add(
        "pulled_blocks_total",
        "Blocks those pulls move.",
        MetricType::COUNTER,
        counter(s.pulled_blocks),
    );
    add(
        "prompt_blocks_total",
        "Full blocks of placed prompts.",
        MetricType::COUNTER,
        counter(s.prompt_blocks),
    );
    add(
        "cached_blocks_total",
        "Of those, blocks cached on (or pulled to) the chosen prefill node.",
        MetricType::COUNTER,
        counter(s.cached_blocks),
    );
    add(
        "replication_hints_total",
        "Replication hints given.",
        MetricType::COUNTER,
        counter(s.hints),
    );
    add(
        "event_batches_total",
        "Event batches received.",
        MetricType::COUNTER,
        counter(s.event_batches),
    );
    add(
        "events_applied_total",
        "Events applied to the index.",
        MetricType::COUNTER,
        counter(s.events_applied),
    );
    add(
        "event_duplicates_total",
        "Events skipped as already applied (retried pushes).",
        MetricType::COUNTER,
        counter(s.event_duplicates),
    );
    add(
        "events_buffered_total",
        "Events held back during a resync.",
        MetricType::COUNTER,
        counter(s.events_buffered),
    );
    add(
        "stale_batches_total",
        "Batches from an older epoch, ignored.",
        MetricType::COUNTER,
        counter(s.stale_batches),
    );
    add(
        "invalid_batches_total",
        "Batches refused as malformed.",
        MetricType::COUNTER,
        counter(s.invalid_batches),
    );
    add(
        "resyncs_total",
        "Resyncs started, by reason.",
        MetricType::COUNTER,
        RESYNC_REASONS
            .iter()
            .zip(s.resyncs)
            .map(|(r, n)| value(&[("reason", r)], MetricType::COUNTER, n as f64))
            .collect(),
    );
    add(
        "snapshots_applied_total",
        "Snapshots applied.",
        MetricType::COUNTER,
        counter(s.snapshots_applied),
    );
    add(
        "snapshot_failures_total",
        "Snapshot fetches that failed (retried).",
        MetricType::COUNTER,
        counter(s.snapshot_failures),
    );
    if c.cfg.cluster.enabled() {
        add(
            "departed_batches_total",
            "Event batches ignored because their node is out of the etcd membership.",
            MetricType::COUNTER,
            counter(s.departed_batches),
        );
        add(
            "cluster_members",
            "Storage nodes in the etcd membership last read.",
            MetricType::GAUGE,
            gauge(c.roster.len() as u64),
        );
        add(
            "cluster_revision",
            "etcd revision of the membership last read.",
            MetricType::GAUGE,
            gauge(c.roster.revision().max(0) as u64),
        );
        add(
            "member_changes_total",
            "Membership changes seen in etcd, by kind.",
            MetricType::COUNTER,
            [
                ("joined", s.member_joined),
                ("left", s.member_left),
                ("restarted", s.member_restarted),
            ]
            .iter()
            .map(|(k, n)| value(&[("change", k)], MetricType::COUNTER, *n as f64))
            .collect(),
        );
        add(
            "etcd_reads_total",
            "Membership reads from etcd applied.",
            MetricType::COUNTER,
            counter(s.etcd_reads),
        );
        add(
            "etcd_errors_total",
            "Failed or partial membership reads, by kind (the last membership is kept).",
            MetricType::COUNTER,
            ETCD_ERROR_KINDS
                .iter()
                .zip(s.etcd_errors)
                .map(|(k, n)| value(&[("kind", k)], MetricType::COUNTER, n as f64))
                .collect(),
        );
        add(
            "etcd_watch_starts_total",
            "Watches of the membership set up in etcd (the first, then one per break).",
            MetricType::COUNTER,
            counter(s.watch_starts),
        );
        add(
            "etcd_watch_wakeups_total",
            "Membership reads woken by a change etcd's watch reported.",
            MetricType::COUNTER,
            counter(s.watch_wakeups),
        );
        add(
            "etcd_reachable",
            "1 if the last membership read succeeded.",
            MetricType::GAUGE,
            gauge(u64::from(s.etcd_reachable == Some(true))),
        );
    }
    add(
        "index_blocks",
        "Distinct blocks in the index.",
        MetricType::GAUGE,
        gauge(c.index.len() as u64),
    );
    add(
        "index_predicted_entries",
        "Predicted (block, node) entries.",
        MetricType::GAUGE,
        gauge(c.index.predicted_total()),
    );
    add(
        "node_blocks",
        "Confirmed blocks per storage node.",
        MetricType::GAUGE,
        c.nodes
            .iter()
            .map(|(id, n)| {
                value(
                    &[("node", &n.name)],
                    MetricType::GAUGE,
                    c.index.confirmed_on(id) as f64,
                )
            })
            .collect(),
    );
    add(
        "node_resyncing",
        "1 while a node's snapshot is awaited.",
        MetricType::GAUGE,
        c.nodes
            .iter()
            .map(|(_, n)| {
                value(
                    &[("node", &n.name)],
                    MetricType::GAUGE,
                    f64::from(u8::from(n.feed.resyncing().is_some())),
                )
            })
            .collect(),
    );
    let ttl = c.cfg.instance_ttl_ms;
    let mut queue = Vec::new();
    let mut batch = Vec::new();
    let mut alive = Vec::new();
    for (_, inst) in c.registry.iter().filter(|(_, i)| i.registered) {
        let l = [("instance", inst.id.as_str())];
        alive.push(value(
            &l,
            MetricType::GAUGE,
            f64::from(u8::from(Registry::is_alive(inst, now_ms, ttl))),
        ));
        match inst.role {
            Role::Prefill => queue.push(value(
                &l,
                MetricType::GAUGE,
                inst.prefill.queue_ms(now_ms) / 1e3,
            )),
            Role::Decode => {
                let (r, _) = inst.decode.predicted(now_ms, now_ms, c.cfg.report_ttl_ms);
                batch.push(value(&l, MetricType::GAUGE, r));
            }
        }
    }
    add(
        "instance_alive",
        "1 if the instance is routed to.",
        MetricType::GAUGE,
        alive,
    );
    add(
        "prefill_queue_seconds",
        "Predicted prefill queue per instance.",
        MetricType::GAUGE,
        queue,
    );
    add(
        "decode_batch_requests",
        "Predicted running decode requests per instance.",
        MetricType::GAUGE,
        batch,
    );
    add(
        "route_seconds",
        "Time to make one routing decision.",
        MetricType::HISTOGRAM,
        vec![route_latency(s)],
    );
    let mut o = String::with_capacity(4096);
    if let Err(e) = TextEncoder::new().encode_utf8(&families, &mut o) {
        tracing::error!(error = %e, "cannot render the metrics");
    }
    o
}

/// The routing-latency histogram (its buckets are kept cumulative).
fn route_latency(s: &Stats) -> Metric {
    let buckets = LATENCY_BOUNDS_S
        .iter()
        .zip(s.latency_buckets)
        .map(|(le, n)| {
            let mut b = Bucket::default();
            b.set_upper_bound(*le);
            b.set_cumulative_count(n);
            b
        })
        .collect();
    let mut h = Histogram::default();
    h.set_bucket(buckets);
    h.set_sample_count(s.latency_count);
    h.set_sample_sum(s.latency_sum_s);
    let mut m = Metric::default();
    m.set_histogram(h);
    m
}

/// A family named `yutu_conductor_{name}`.
fn family(name: &str, help: &str, kind: MetricType, series: Vec<Metric>) -> MetricFamily {
    let mut f = MetricFamily::default();
    f.set_name(format!("yutu_conductor_{name}"));
    f.set_help(help.to_string());
    f.set_field_type(kind);
    f.set_metric(series);
    f
}

/// One series of a counter or a gauge.
fn value(labels: &[(&str, &str)], kind: MetricType, v: f64) -> Metric {
    let mut m = Metric::from_label(
        labels
            .iter()
            .map(|(name, value)| {
                let mut l = LabelPair::default();
                l.set_name(name.to_string());
                l.set_value(value.to_string());
                l
            })
            .collect(),
    );
    if kind == MetricType::COUNTER {
        let mut c = Counter::default();
        c.set_value(v);
        m.set_counter(c);
    } else {
        let mut g = Gauge::default();
        g.set_value(v);
        m.set_gauge(g);
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_reason_and_latency_buckets() {
        let mut s = Stats::default();
        s.reject(RejectReason::TbtSlo);
        s.resync(ResyncReason::Restart);
        s.observe_route(7e-6);
        s.observe_route(1.0);
        assert_eq!(s.rejected(RejectReason::TbtSlo), 1);
        assert_eq!(s.rejected(RejectReason::TtftSlo), 0);
        assert_eq!(s.resyncs(), 1);
        assert_eq!(s.latency_buckets[0], 0);
        assert_eq!(s.latency_buckets[1], 1);
        assert_eq!(s.latency_count, 2);
    }

    #[test]
    fn renders_names_labels_and_types() {
        use yutu_api::route::InstanceRegistration;

        let mut c = Conductor::new(crate::config::ConductorConfig::default());
        for (id, role, node) in [
            ("p0", Role::Prefill, Some("node-a".to_string())),
            ("d0", Role::Decode, None),
        ] {
            let reg = InstanceRegistration {
                id: id.to_string(),
                role,
                node,
                node_url: None,
            };
            c.register_instance(&reg, 0.0).expect("registers");
        }
        c.stats.routed = 3;
        c.stats.reject(RejectReason::TtftSlo);
        c.stats.resync(ResyncReason::Restart);
        c.stats.snapshots_applied = 2;
        c.stats.observe_route(7e-6);
        let text = render(&c, 0.0);
        let policy = c.cfg.policy.to_string();
        for line in [
            "# HELP yutu_conductor_routed_total Requests placed.".to_string(),
            "# TYPE yutu_conductor_routed_total counter".to_string(),
            format!("yutu_conductor_routed_total{{policy=\"{policy}\"}} 3"),
            "yutu_conductor_rejected_total{reason=\"ttft_slo\"} 1".to_string(),
            "yutu_conductor_rejected_total{reason=\"tbt_slo\"} 0".to_string(),
            "yutu_conductor_resyncs_total{reason=\"restart\"} 1".to_string(),
            "yutu_conductor_snapshots_applied_total 2".to_string(),
            "# TYPE yutu_conductor_index_blocks gauge".to_string(),
            "yutu_conductor_node_blocks{node=\"node-a\"} 0".to_string(),
            "yutu_conductor_instance_alive{instance=\"p0\"} 1".to_string(),
            "yutu_conductor_prefill_queue_seconds{instance=\"p0\"} 0".to_string(),
            "yutu_conductor_decode_batch_requests{instance=\"d0\"} 0".to_string(),
            "# TYPE yutu_conductor_route_seconds histogram".to_string(),
            "yutu_conductor_route_seconds_bucket{le=\"0.000005\"} 0".to_string(),
            "yutu_conductor_route_seconds_bucket{le=\"0.00001\"} 1".to_string(),
            "yutu_conductor_route_seconds_bucket{le=\"+Inf\"} 1".to_string(),
            "yutu_conductor_route_seconds_sum 0.000007".to_string(),
            "yutu_conductor_route_seconds_count 1".to_string(),
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in:\n{text}"
            );
        }
        assert!(!text.contains("_total_total"), "{text}");
        assert!(!text.contains("etcd"), "no etcd metrics without etcd");
    }

    #[test]
    fn cluster_metrics_render_with_etcd() {
        let mut cfg = crate::config::ConductorConfig::default();
        cfg.cluster.etcd = vec!["http://127.0.0.1:2379".into()];
        let mut c = Conductor::new(cfg);
        let member = |name: &str| yutu_api::cluster::Member {
            name: name.into(),
            url: "http://127.0.0.1:1".into(),
            transfer: None,
            zone: None,
            memory: 0,
            nvme: 0,
            shards: 1,
            started_ms: 1,
            draining: false,
            instance: String::new(),
        };
        c.apply_membership(12, &[member("a"), member("b")], true);
        c.stats.etcd_error("unreachable");
        c.stats.etcd_error("unreachable");
        c.stats.etcd_error("no such kind");
        c.stats.etcd_reachable = Some(false);
        let text = render(&c, 0.0);
        for line in [
            "yutu_conductor_cluster_members 2",
            "yutu_conductor_cluster_revision 12",
            "yutu_conductor_member_changes_total{change=\"joined\"} 2",
            "yutu_conductor_member_changes_total{change=\"left\"} 0",
            "yutu_conductor_etcd_errors_total{kind=\"unreachable\"} 2",
            "yutu_conductor_etcd_errors_total{kind=\"status\"} 0",
            "yutu_conductor_etcd_reachable 0",
            "yutu_conductor_departed_batches_total 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in:\n{text}"
            );
        }
        assert_eq!(c.stats.etcd_errors("unreachable"), 2);
    }
}
