//! Per-shard metrics and their Prometheus text rendering.
//!
//! Each shard writes only its own `ShardMetrics`, so the relaxed atomics are uncontended and
//! cost about as much as plain integers; any shard can still read all of them to answer
//! `/metrics` without a message round trip. Only a scrape touches the `prometheus` crate: it
//! reads the atomics of every shard into that crate's data model (metric families) and lets
//! its encoder write the text format, rather than routing per-shard, lock-free counters
//! through the crate's registry, which is built around shared, locked families.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use prometheus::proto::{self, Bucket, LabelPair, Metric, MetricFamily, MetricType};
use prometheus::TextEncoder;

/// A monotonically increasing count.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.add(1);
    }
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// A value that goes up and down.
#[derive(Debug, Default)]
pub struct Gauge(AtomicU64);

impl Gauge {
    pub fn set(&self, v: u64) {
        self.0.store(v, Relaxed);
    }
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Relaxed);
    }
    pub fn sub(&self, n: u64) {
        self.0.fetch_sub(n, Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// Most operations requests are counted by. Which operations there are is the request
/// layer's (`http::endpoint::Op`, whose count is checked against this at compile time):
/// here they are only indices, and names given when the metrics are rendered.
pub const MAX_OPS: usize = 96;

/// Upper bounds of the latency histogram buckets, in seconds.
pub const LATENCY_BUCKETS: [f64; 16] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [Counter; LATENCY_BUCKETS.len()],
    count: Counter,
    sum_us: Counter,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = LATENCY_BUCKETS.iter().position(|b| secs <= *b) {
            self.buckets[i].inc();
        }
        self.count.inc();
        self.sum_us.add(d.as_micros() as u64);
    }
}

const STATUS_MIN: u16 = 100;
const STATUS_SLOTS: usize = 500;

/// Everything one shard counts.
#[derive(Debug)]
pub struct ShardMetrics {
    requests: Vec<Counter>,
    latency: Vec<Histogram>,
    pub bytes_in: Counter,
    pub bytes_out: Counter,
    pub evictions: Counter,
    pub forwarded: Counter,
    pub events_published: Counter,
    pub dram_hits: Counter,
    pub nvme_hits: Counter,
    pub misses: Counter,
    pub demotions: Counter,
    pub demotions_dropped: Counter,
    pub promotions: Counter,
    pub nvme_used: Gauge,
    pub nvme_capacity: Gauge,
    pub durable_used: Gauge,
    pub durable_limit: Gauge,
    pub durable_refused: Counter,
    /// Writes not applied because the shard held a newer version of the key.
    pub superseded_writes: Counter,
    pub durable_dropped: Counter,
    /// Writes refused by a bucket quota.
    pub quota_refused: Counter,
    /// Permission checks of object requests (one per request served here).
    pub object_checks: Counter,
    /// KV calls refused by a per-user limit, by limit.
    pub kv_limit_leased: Counter,
    pub kv_limit_reserved: Counter,
    pub kv_limit_leases: Counter,
    /// KV rooms (puts started without a key) reserved, and published under a key.
    pub kv_rooms_reserved: Counter,
    pub kv_rooms_published: Counter,
    /// Request bodies refused by the body limits, by reason.
    pub body_too_large: Counter,
    pub body_budget_wait: Counter,
    pub body_timeout: Counter,
    /// Bytes of request bodies this shard's requests hold reserved.
    pub body_reserved: Gauge,
    /// Connections closed at once because the shard served --max-connections.
    pub connections_refused: Counter,
    /// Connections being served.
    pub connections: Gauge,
    pub nvme_objects: Gauge,
    pub nvme_reclaimed_regions: Gauge,
    pub nvme_corrupt_records: Gauge,
    pub dram_used: Gauge,
    pub dram_capacity: Gauge,
    pub objects: Gauge,
    /// Presence tables live, their bytes, grants given and tables retired (`store::presence`).
    pub presence_tables: Gauge,
    pub presence_bytes: Gauge,
    pub presence_grants: Gauge,
    /// Arena views handed to proven same-host clients, and answers that proved nothing.
    pub arena_views: Counter,
    pub arena_views_refused: Counter,
    pub presence_retired: Gauge,
    /// Bytes of value mirrors and values copied into them (`store::presence`).
    pub mirror_bytes: Gauge,
    pub mirrored_values: Gauge,
    /// Large KV blocks noted in located slots of the mirrors.
    pub located_blocks: Gauge,
}

impl Default for ShardMetrics {
    fn default() -> Self {
        ShardMetrics {
            requests: (0..MAX_OPS * STATUS_SLOTS)
                .map(|_| Counter::default())
                .collect(),
            latency: (0..MAX_OPS).map(|_| Histogram::default()).collect(),
            bytes_in: Counter::default(),
            bytes_out: Counter::default(),
            evictions: Counter::default(),
            forwarded: Counter::default(),
            events_published: Counter::default(),
            dram_hits: Counter::default(),
            nvme_hits: Counter::default(),
            misses: Counter::default(),
            demotions: Counter::default(),
            demotions_dropped: Counter::default(),
            promotions: Counter::default(),
            nvme_used: Gauge::default(),
            nvme_capacity: Gauge::default(),
            durable_used: Gauge::default(),
            durable_limit: Gauge::default(),
            durable_refused: Counter::default(),
            superseded_writes: Counter::default(),
            durable_dropped: Counter::default(),
            quota_refused: Counter::default(),
            object_checks: Counter::default(),
            kv_limit_leased: Counter::default(),
            kv_limit_reserved: Counter::default(),
            kv_rooms_reserved: Counter::default(),
            kv_rooms_published: Counter::default(),
            kv_limit_leases: Counter::default(),
            body_too_large: Counter::default(),
            body_budget_wait: Counter::default(),
            body_timeout: Counter::default(),
            body_reserved: Gauge::default(),
            connections_refused: Counter::default(),
            connections: Gauge::default(),
            nvme_objects: Gauge::default(),
            nvme_reclaimed_regions: Gauge::default(),
            nvme_corrupt_records: Gauge::default(),
            dram_used: Gauge::default(),
            dram_capacity: Gauge::default(),
            objects: Gauge::default(),
            presence_tables: Gauge::default(),
            presence_bytes: Gauge::default(),
            presence_grants: Gauge::default(),
            arena_views: Counter::default(),
            arena_views_refused: Counter::default(),
            presence_retired: Gauge::default(),
            mirror_bytes: Gauge::default(),
            mirrored_values: Gauge::default(),
            located_blocks: Gauge::default(),
        }
    }
}

impl ShardMetrics {
    /// Counts a request of operation number `op` (below [`MAX_OPS`]; another is not
    /// counted) answered with `status` after `elapsed`.
    pub fn record(&self, op: usize, status: u16, elapsed: Duration) {
        if op >= MAX_OPS {
            return;
        }
        let slot =
            (status.clamp(STATUS_MIN, STATUS_MIN + STATUS_SLOTS as u16 - 1) - STATUS_MIN) as usize;
        self.requests[op * STATUS_SLOTS + slot].inc();
        self.latency[op].observe(elapsed);
    }

    pub fn set_dram(&self, used: u64, capacity: u64, objects: u64) {
        self.dram_used.set(used);
        self.dram_capacity.set(capacity);
        self.objects.set(objects);
    }
}

/// Renders all shards in the Prometheus text exposition format (version 0.0.4); `ops` names
/// the operations by number (their `op` label).
///
/// The values are read once, here, into the data model of the `prometheus` crate, whose
/// encoder writes the text; recording stays on the shards' own atomics above.
pub fn render(shards: &[Arc<ShardMetrics>], ops: &[&str]) -> String {
    let ops = &ops[..ops.len().min(MAX_OPS)];
    let mut families = vec![requests(shards, ops), latency(shards, ops)];
    families.extend(per_shard(shards));
    // The encoder refuses a family without series (no request yet): leave those out.
    families.retain(|f| !f.get_metric().is_empty());
    encode(&families)
}

/// `families` in the text format; what the encoder refuses is logged and left out.
fn encode(families: &[MetricFamily]) -> String {
    let mut out = String::with_capacity(16 * 1024);
    if let Err(e) = TextEncoder::new().encode_utf8(families, &mut out) {
        tracing::error!(error = %e, "cannot render the metrics");
    }
    out
}

/// `yutu_requests_total{shard,op,status}`: only the (op, status) pairs that occurred.
fn requests(shards: &[Arc<ShardMetrics>], ops: &[&str]) -> MetricFamily {
    let mut series = Vec::new();
    for (s, m) in shards.iter().enumerate() {
        for (op, name) in ops.iter().enumerate() {
            for slot in 0..STATUS_SLOTS {
                let n = m.requests[op * STATUS_SLOTS + slot].get();
                if n > 0 {
                    let status = (STATUS_MIN as usize + slot).to_string();
                    let mut metric = Metric::from_label(labels(&[
                        ("shard", &s.to_string()),
                        ("op", name),
                        ("status", &status),
                    ]));
                    metric.set_counter(counter_value(n));
                    series.push(metric);
                }
            }
        }
    }
    family(
        "yutu_requests_total",
        "Requests by operation and HTTP status.",
        MetricType::COUNTER,
        series,
    )
}

/// `yutu_copy_helper_runs_total` and `yutu_copy_helper_bytes_total`: what the node's copy
/// helpers (`--copy-threads`) took from the shards' large same-host copies, in the same text
/// format as [`render`]. Both stay at 0 with `--copy-threads 1`, or while the shards never
/// left a core idle during a large copy.
pub fn render_copy_helpers(stats: yutu_transfer::split_copy::HelperStats) -> String {
    let one = |v: u64| {
        let mut m = Metric::default();
        m.set_counter(counter_value(v));
        vec![m]
    };
    let families = [
        family(
            "yutu_copy_helper_runs_total",
            "Pieces (about 256 KiB) of large same-host copies that copy helpers moved.",
            MetricType::COUNTER,
            one(stats.runs),
        ),
        family(
            "yutu_copy_helper_bytes_total",
            "Bytes of large same-host copies that copy helpers moved.",
            MetricType::COUNTER,
            one(stats.bytes),
        ),
    ];
    encode(&families)
}

/// `yutu_request_duration_seconds{shard,op}`: the operations that were requested.
fn latency(shards: &[Arc<ShardMetrics>], ops: &[&str]) -> MetricFamily {
    let mut series = Vec::new();
    for (s, m) in shards.iter().enumerate() {
        for (op, name) in ops.iter().enumerate() {
            let h = &m.latency[op];
            let count = h.count.get();
            if count == 0 {
                continue;
            }
            let mut cumulative = 0;
            let buckets = LATENCY_BUCKETS
                .iter()
                .zip(&h.buckets)
                .map(|(le, n)| {
                    cumulative += n.get();
                    let mut b = Bucket::default();
                    b.set_upper_bound(*le);
                    b.set_cumulative_count(cumulative);
                    b
                })
                .collect();
            let mut histogram = proto::Histogram::default();
            histogram.set_bucket(buckets);
            histogram.set_sample_count(count);
            histogram.set_sample_sum(h.sum_us.get() as f64 / 1e6);
            let mut metric = Metric::from_label(labels(&[("shard", &s.to_string()), ("op", name)]));
            metric.set_histogram(histogram);
            series.push(metric);
        }
    }
    family(
        "yutu_request_duration_seconds",
        "Request latency by operation, from the parsed request to the response head.",
        MetricType::HISTOGRAM,
        series,
    )
}

/// How one per-shard value is read, and the label that sets it apart from the other series
/// of its family (`tier`), if any.
type Reading = (
    Option<(&'static str, &'static str)>,
    fn(&ShardMetrics) -> u64,
);

/// The families with one series per shard (and per reading).
fn per_shard(shards: &[Arc<ShardMetrics>]) -> Vec<MetricFamily> {
    use MetricType::{COUNTER, GAUGE};
    let table: [(&str, MetricType, &str, &[Reading]); 39] = [
        (
            "yutu_tier_hits_total",
            COUNTER,
            "GETs served from DRAM (also objects on their way to NVMe).",
            &[
                (Some(("tier", "dram")), |m| m.dram_hits.get()),
                (Some(("tier", "nvme")), |m| m.nvme_hits.get()),
            ],
        ),
        (
            "yutu_tier_misses_total",
            COUNTER,
            "GETs of keys in neither tier.",
            &[(None, |m| m.misses.get())],
        ),
        (
            "yutu_demotions_total",
            COUNTER,
            "Objects evicted from DRAM and written to NVMe.",
            &[(None, |m| m.demotions.get())],
        ),
        (
            "yutu_demotions_dropped_total",
            COUNTER,
            "Objects evicted from DRAM without demotion (back-pressure or too large).",
            &[(None, |m| m.demotions_dropped.get())],
        ),
        (
            "yutu_promotions_total",
            COUNTER,
            "NVMe hits copied back into DRAM.",
            &[(None, |m| m.promotions.get())],
        ),
        (
            "yutu_nvme_used_bytes",
            GAUGE,
            "NVMe bytes in non-free regions.",
            &[(None, |m| m.nvme_used.get())],
        ),
        (
            "yutu_nvme_capacity_bytes",
            GAUGE,
            "NVMe record space of the shard.",
            &[(None, |m| m.nvme_capacity.get())],
        ),
        (
            "yutu_durable_used_bytes",
            GAUGE,
            "NVMe bytes of live records of `disk` buckets.",
            &[(None, |m| m.durable_used.get())],
        ),
        (
            "yutu_durable_limit_bytes",
            GAUGE,
            "Most NVMe bytes `disk` buckets may hold (their records counted in whole regions, less two regions per shard).",
            &[(None, |m| m.durable_limit.get())],
        ),
        (
            "yutu_durable_refused_total",
            COUNTER,
            "Durable writes refused because the NVMe tier could not keep them (507).",
            &[(None, |m| m.durable_refused.get())],
        ),
        (
            "yutu_superseded_writes_total",
            COUNTER,
            "Writes not applied because the shard held a newer version of the key (last writer wins).",
            &[(None, |m| m.superseded_writes.get())],
        ),
        (
            "yutu_quota_refused_total",
            COUNTER,
            "Writes refused because they would take a bucket past its quota (403).",
            &[(None, |m| m.quota_refused.get())],
        ),
        (
            "yutu_object_permission_checks_total",
            COUNTER,
            "Permission checks of object requests: one per object request served on this node.",
            &[(None, |m| m.object_checks.get())],
        ),
        (
            "yutu_kv_user_limit_refused_total",
            COUNTER,
            "KV calls refused (429) because the user reached a limit: leased bytes, reserved bytes or leases.",
            &[
                (Some(("limit", "leased_bytes")), |m| m.kv_limit_leased.get()),
                (Some(("limit", "reserved_bytes")), |m| m.kv_limit_reserved.get()),
                (Some(("limit", "leases")), |m| m.kv_limit_leases.get()),
            ],
        ),
        (
            "yutu_kv_rooms_total",
            COUNTER,
            "KV rooms: ranges reserved for a client's next puts before their keys are known (publish), and those published under a key (each a put made in one call).",
            &[
                (Some(("event", "reserved")), |m| m.kv_rooms_reserved.get()),
                (Some(("event", "published")), |m| m.kv_rooms_published.get()),
            ],
        ),
        (
            "yutu_body_refused_total",
            COUNTER,
            "Request bodies refused by the body limits: larger than the node holds for one body, no budget within the body timeout, or too slow.",
            &[
                (Some(("reason", "too_large")), |m| m.body_too_large.get()),
                (Some(("reason", "budget_wait")), |m| m.body_budget_wait.get()),
                (Some(("reason", "timeout")), |m| m.body_timeout.get()),
            ],
        ),
        (
            "yutu_body_reserved_bytes",
            GAUGE,
            "Request-body bytes reserved by the requests this shard is receiving (the node's budget is --body-budget).",
            &[(None, |m| m.body_reserved.get())],
        ),
        (
            "yutu_connections_refused_total",
            COUNTER,
            "Connections answered 503 and closed because the shard served --max-connections.",
            &[(None, |m| m.connections_refused.get())],
        ),
        (
            "yutu_connections",
            GAUGE,
            "HTTP connections being served.",
            &[(None, |m| m.connections.get())],
        ),
        (
            "yutu_durable_dropped_total",
            COUNTER,
            "Durable records an NVMe reclamation dropped (expected to stay 0).",
            &[(None, |m| m.durable_dropped.get())],
        ),
        (
            "yutu_presence_tables",
            GAUGE,
            "Presence tables the shards share with same-host clients.",
            &[(None, |m| m.presence_tables.get())],
        ),
        (
            "yutu_presence_table_bytes",
            GAUGE,
            "Bytes of the presence tables.",
            &[(None, |m| m.presence_bytes.get())],
        ),
        (
            "yutu_presence_grants_total",
            COUNTER,
            "Presence tables handed to clients.",
            &[(None, |m| m.presence_grants.get())],
        ),
        (
            "yutu_arena_views_total",
            COUNTER,
            "Arena views handed to same-host clients that proved they can read the node's memory (given), and challenge answers that proved nothing (refused).",
            &[
                (Some(("outcome", "given")), |m| m.arena_views.get()),
                (Some(("outcome", "refused")), |m| m.arena_views_refused.get()),
            ],
        ),
        (
            "yutu_presence_retired_total",
            COUNTER,
            "Presence tables retired (bucket settings changed, bucket deleted, a holder's token expired, or full).",
            &[(None, |m| m.presence_retired.get())],
        ),
        (
            "yutu_value_mirror_bytes",
            GAUGE,
            "Bytes of the value mirrors the shards share with same-host clients.",
            &[(None, |m| m.mirror_bytes.get())],
        ),
        (
            "yutu_value_mirror_stores_total",
            COUNTER,
            "Small KV values copied into value mirrors.",
            &[(None, |m| m.mirrored_values.get())],
        ),
        (
            "yutu_value_mirror_locations_total",
            COUNTER,
            "Large KV blocks noted in value mirrors as where they lie in the arena (read by same-host clients with an arena view, without a call).",
            &[(None, |m| m.located_blocks.get())],
        ),
        (
            "yutu_nvme_objects",
            GAUGE,
            "Objects in the NVMe index.",
            &[(None, |m| m.nvme_objects.get())],
        ),
        (
            "yutu_nvme_reclaimed_regions_total",
            COUNTER,
            "NVMe regions reclaimed (oldest first).",
            &[(None, |m| m.nvme_reclaimed_regions.get())],
        ),
        (
            "yutu_nvme_corrupt_records_total",
            COUNTER,
            "NVMe records skipped because their checksum failed.",
            &[(None, |m| m.nvme_corrupt_records.get())],
        ),
        (
            "yutu_bytes_in_total",
            COUNTER,
            "Object payload bytes received.",
            &[(None, |m| m.bytes_in.get())],
        ),
        (
            "yutu_bytes_out_total",
            COUNTER,
            "Object payload bytes sent.",
            &[(None, |m| m.bytes_out.get())],
        ),
        (
            "yutu_evictions_total",
            COUNTER,
            "Objects evicted from DRAM to make room.",
            &[(None, |m| m.evictions.get())],
        ),
        (
            "yutu_forwarded_total",
            COUNTER,
            "Requests handed to the owning shard over a channel.",
            &[(None, |m| m.forwarded.get())],
        ),
        (
            "yutu_kv_events_published_total",
            COUNTER,
            "KV events accepted by the conductor (shard 0 publishes for the node).",
            &[(None, |m| m.events_published.get())],
        ),
        (
            "yutu_dram_used_bytes",
            GAUGE,
            "DRAM charged to stored objects (payload and index).",
            &[(None, |m| m.dram_used.get())],
        ),
        (
            "yutu_dram_capacity_bytes",
            GAUGE,
            "DRAM capacity of the shard.",
            &[(None, |m| m.dram_capacity.get())],
        ),
        (
            "yutu_objects",
            GAUGE,
            "Objects stored in DRAM.",
            &[(None, |m| m.objects.get())],
        ),
    ];
    table
        .into_iter()
        .map(|(name, kind, help, readings)| {
            let mut series = Vec::new();
            for (extra, get) in readings {
                for (s, m) in shards.iter().enumerate() {
                    let shard = s.to_string();
                    let mut metric = Metric::from_label(match extra {
                        Some(l) => labels(&[*l, ("shard", &shard)]),
                        None => labels(&[("shard", &shard)]),
                    });
                    let v = get(m);
                    match kind {
                        MetricType::GAUGE => metric.set_gauge(gauge_value(v)),
                        _ => metric.set_counter(counter_value(v)),
                    }
                    series.push(metric);
                }
            }
            family(name, help, kind, series)
        })
        .collect()
}

fn family(name: &str, help: &str, kind: MetricType, series: Vec<Metric>) -> MetricFamily {
    let mut f = MetricFamily::default();
    f.set_name(name.to_string());
    f.set_help(help.to_string());
    f.set_field_type(kind);
    f.set_metric(series);
    f
}

fn labels(pairs: &[(&str, &str)]) -> Vec<LabelPair> {
    pairs
        .iter()
        .map(|(name, value)| {
            let mut l = LabelPair::default();
            l.set_name(name.to_string());
            l.set_value(value.to_string());
            l
        })
        .collect()
}

fn counter_value(v: u64) -> proto::Counter {
    let mut c = proto::Counter::default();
    c.set_value(v as f64);
    c
}

fn gauge_value(v: u64) -> proto::Gauge {
    let mut g = proto::Gauge::default();
    g.set_value(v as f64);
    g
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_histograms() {
        let m = Arc::new(ShardMetrics::default());
        m.record(1, 200, Duration::from_micros(300));
        m.record(1, 404, Duration::from_millis(2));
        m.record(MAX_OPS, 200, Duration::from_millis(2));
        m.set_dram(10, 100, 1);
        m.nvme_hits.add(5);
        let ops = ["PutObject", "GetObject"];
        let text = render(&[m, Arc::new(ShardMetrics::default())], &ops);
        for line in [
            "# HELP yutu_requests_total Requests by operation and HTTP status.",
            "# TYPE yutu_requests_total counter",
            "yutu_requests_total{shard=\"0\",op=\"GetObject\",status=\"200\"} 1",
            "yutu_requests_total{shard=\"0\",op=\"GetObject\",status=\"404\"} 1",
            "# TYPE yutu_request_duration_seconds histogram",
            "yutu_request_duration_seconds_bucket{shard=\"0\",op=\"GetObject\",le=\"0.0001\"} 0",
            "yutu_request_duration_seconds_bucket{shard=\"0\",op=\"GetObject\",le=\"0.0005\"} 1",
            "yutu_request_duration_seconds_bucket{shard=\"0\",op=\"GetObject\",le=\"10\"} 2",
            "yutu_request_duration_seconds_bucket{shard=\"0\",op=\"GetObject\",le=\"+Inf\"} 2",
            "yutu_request_duration_seconds_sum{shard=\"0\",op=\"GetObject\"} 0.0023",
            "yutu_request_duration_seconds_count{shard=\"0\",op=\"GetObject\"} 2",
            "# TYPE yutu_tier_hits_total counter",
            "yutu_tier_hits_total{tier=\"nvme\",shard=\"0\"} 5",
            "yutu_tier_hits_total{tier=\"dram\",shard=\"1\"} 0",
            "# TYPE yutu_dram_capacity_bytes gauge",
            "yutu_dram_capacity_bytes{shard=\"0\"} 100",
            "yutu_dram_capacity_bytes{shard=\"1\"} 0",
            "# HELP yutu_objects Objects stored in DRAM.",
            "yutu_objects{shard=\"0\"} 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in:\n{text}"
            );
        }
        // One header per family, series of no other operation, and no doubled suffix.
        assert_eq!(text.matches("# TYPE yutu_tier_hits_total ").count(), 1);
        assert!(!text.contains("op=\"PutObject\""), "{text}");
        assert!(!text.contains("_total_total"), "{text}");
    }

    #[test]
    fn renders_no_empty_family() {
        let text = render(&[Arc::new(ShardMetrics::default())], &["GetObject"]);
        assert!(!text.contains("yutu_requests_total"), "{text}");
        assert!(
            text.contains("yutu_evictions_total{shard=\"0\"} 0\n"),
            "{text}"
        );
    }
}
