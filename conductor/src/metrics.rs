//! Counters, and their rendering as Prometheus text (`GET /metrics`).
//!
//! The counters live inside the conductor's state, next to what they count, and are updated
//! under the same lock; rendering reads them and the index's and instances' gauges at once,
//! so one scrape is a consistent picture.

use std::fmt::Write as _;

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

const RESYNC_REASONS: [&str; 5] = [
    "first_contact",
    "gap",
    "restart",
    "sequence_reset",
    "snapshot_behind",
];

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
    resyncs: [u64; 5],
    pub snapshots_applied: u64,
    pub snapshot_failures: u64,
    latency_buckets: [u64; 9],
    latency_sum_s: f64,
    latency_count: u64,
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

/// Escapes a label value (names are validated, but a metric line must never break).
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The whole `/metrics` page.
pub fn render(c: &Conductor, now_ms: f64) -> String {
    let s = &c.stats;
    let mut o = String::with_capacity(4096);
    let mut counter = |name: &str, help: &str, lines: &[(String, f64)]| {
        let _ = writeln!(o, "# HELP yutu_conductor_{name} {help}");
        let kind = if name.ends_with("_total") {
            "counter"
        } else {
            "gauge"
        };
        let _ = writeln!(o, "# TYPE yutu_conductor_{name} {kind}");
        for (labels, v) in lines {
            let _ = writeln!(o, "yutu_conductor_{name}{labels} {v}");
        }
    };
    let one = |v: u64| vec![(String::new(), v as f64)];
    counter(
        "routed_total",
        "Requests placed.",
        &[(format!("{{policy=\"{}\"}}", c.cfg.policy), s.routed as f64)],
    );
    counter(
        "rejected_total",
        "Requests refused, by reason.",
        &REJECT_REASONS
            .iter()
            .enumerate()
            .map(|(i, r)| {
                (
                    format!("{{reason=\"{}\"}}", r.as_str()),
                    s.rejected[i] as f64,
                )
            })
            .collect::<Vec<_>>(),
    );
    counter(
        "pulls_total",
        "Decisions that pull a prefix from another node.",
        &one(s.pulls),
    );
    counter(
        "pulled_blocks_total",
        "Blocks those pulls move.",
        &one(s.pulled_blocks),
    );
    counter(
        "prompt_blocks_total",
        "Full blocks of placed prompts.",
        &one(s.prompt_blocks),
    );
    counter(
        "cached_blocks_total",
        "Of those, blocks cached on (or pulled to) the chosen prefill node.",
        &one(s.cached_blocks),
    );
    counter(
        "replication_hints_total",
        "Replication hints given.",
        &one(s.hints),
    );
    counter(
        "event_batches_total",
        "Event batches received.",
        &one(s.event_batches),
    );
    counter(
        "events_applied_total",
        "Events applied to the index.",
        &one(s.events_applied),
    );
    counter(
        "event_duplicates_total",
        "Events skipped as already applied (retried pushes).",
        &one(s.event_duplicates),
    );
    counter(
        "events_buffered_total",
        "Events held back during a resync.",
        &one(s.events_buffered),
    );
    counter(
        "stale_batches_total",
        "Batches from an older epoch, ignored.",
        &one(s.stale_batches),
    );
    counter(
        "invalid_batches_total",
        "Batches refused as malformed.",
        &one(s.invalid_batches),
    );
    counter(
        "resyncs_total",
        "Resyncs started, by reason.",
        &RESYNC_REASONS
            .iter()
            .enumerate()
            .map(|(i, r)| (format!("{{reason=\"{r}\"}}"), s.resyncs[i] as f64))
            .collect::<Vec<_>>(),
    );
    counter(
        "snapshots_applied_total",
        "Snapshots applied.",
        &one(s.snapshots_applied),
    );
    counter(
        "snapshot_failures_total",
        "Snapshot fetches that failed (retried).",
        &one(s.snapshot_failures),
    );
    counter(
        "index_blocks",
        "Distinct blocks in the index.",
        &one(c.index.len() as u64),
    );
    counter(
        "index_predicted_entries",
        "Predicted (block, node) entries.",
        &one(c.index.predicted_total()),
    );
    counter(
        "node_blocks",
        "Confirmed blocks per storage node.",
        &c.nodes
            .iter()
            .map(|(id, n)| {
                (
                    format!("{{node=\"{}\"}}", label(&n.name)),
                    c.index.confirmed_on(id) as f64,
                )
            })
            .collect::<Vec<_>>(),
    );
    counter(
        "node_resyncing",
        "1 while a node's snapshot is awaited.",
        &c.nodes
            .iter()
            .map(|(_, n)| {
                (
                    format!("{{node=\"{}\"}}", label(&n.name)),
                    f64::from(u8::from(n.feed.resyncing().is_some())),
                )
            })
            .collect::<Vec<_>>(),
    );
    let ttl = c.cfg.instance_ttl_ms;
    let mut queue = Vec::new();
    let mut batch = Vec::new();
    let mut alive = Vec::new();
    for (_, inst) in c.registry.iter().filter(|(_, i)| i.registered) {
        let l = format!("{{instance=\"{}\"}}", label(&inst.id));
        alive.push((
            l.clone(),
            f64::from(u8::from(Registry::is_alive(inst, now_ms, ttl))),
        ));
        match inst.role {
            Role::Prefill => queue.push((l, inst.prefill.queue_ms(now_ms) / 1e3)),
            Role::Decode => {
                let (r, _) = inst.decode.predicted(now_ms, now_ms, c.cfg.report_ttl_ms);
                batch.push((l, r));
            }
        }
    }
    counter("instance_alive", "1 if the instance is routed to.", &alive);
    counter(
        "prefill_queue_seconds",
        "Predicted prefill queue per instance.",
        &queue,
    );
    counter(
        "decode_batch_requests",
        "Predicted running decode requests per instance.",
        &batch,
    );
    let _ = writeln!(
        o,
        "# HELP yutu_conductor_route_seconds Time to make one routing decision."
    );
    let _ = writeln!(o, "# TYPE yutu_conductor_route_seconds histogram");
    for (i, bound) in LATENCY_BOUNDS_S.iter().enumerate() {
        let _ = writeln!(
            o,
            "yutu_conductor_route_seconds_bucket{{le=\"{bound}\"}} {}",
            s.latency_buckets[i]
        );
    }
    let _ = writeln!(
        o,
        "yutu_conductor_route_seconds_bucket{{le=\"+Inf\"}} {}",
        s.latency_count
    );
    let _ = writeln!(o, "yutu_conductor_route_seconds_sum {}", s.latency_sum_s);
    let _ = writeln!(o, "yutu_conductor_route_seconds_count {}", s.latency_count);
    o
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
    fn labels_are_escaped() {
        assert_eq!(label("a\"b\\"), "a\\\"b\\\\");
    }
}
