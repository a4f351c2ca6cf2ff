//! Per-shard metrics and their Prometheus text rendering.
//!
//! Each shard writes only its own `ShardMetrics`, so the relaxed atomics are uncontended and
//! cost about as much as plain integers; any shard can still read all of them to answer
//! `/metrics` without a message round trip. The exposition format is a few lines of text per
//! series, simpler to write here than to route per-shard, lock-free counters through a
//! registry crate built around shared, locked families.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

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
    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// The S3 (and ops) operations requests are counted by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    ListBuckets,
    CreateBucket,
    DeleteBucket,
    HeadBucket,
    ListObjects,
    PutObject,
    GetObject,
    HeadObject,
    DeleteObject,
    CopyObject,
    DeleteObjects,
    ListObjectVersions,
    GetBucketLocation,
    CreateMultipartUpload,
    UploadPart,
    UploadPartCopy,
    CompleteMultipartUpload,
    AbortMultipartUpload,
    ListParts,
    ListMultipartUploads,
    Admin,
    Kv,
    Ops,
    Unsupported,
}

impl Op {
    pub const ALL: [Op; 24] = [
        Op::ListBuckets,
        Op::CreateBucket,
        Op::DeleteBucket,
        Op::HeadBucket,
        Op::ListObjects,
        Op::PutObject,
        Op::GetObject,
        Op::HeadObject,
        Op::DeleteObject,
        Op::CopyObject,
        Op::DeleteObjects,
        Op::ListObjectVersions,
        Op::GetBucketLocation,
        Op::CreateMultipartUpload,
        Op::UploadPart,
        Op::UploadPartCopy,
        Op::CompleteMultipartUpload,
        Op::AbortMultipartUpload,
        Op::ListParts,
        Op::ListMultipartUploads,
        Op::Admin,
        Op::Kv,
        Op::Ops,
        Op::Unsupported,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Op::ListBuckets => "ListBuckets",
            Op::CreateBucket => "CreateBucket",
            Op::DeleteBucket => "DeleteBucket",
            Op::HeadBucket => "HeadBucket",
            Op::ListObjects => "ListObjects",
            Op::PutObject => "PutObject",
            Op::GetObject => "GetObject",
            Op::HeadObject => "HeadObject",
            Op::DeleteObject => "DeleteObject",
            Op::CopyObject => "CopyObject",
            Op::DeleteObjects => "DeleteObjects",
            Op::ListObjectVersions => "ListObjectVersions",
            Op::GetBucketLocation => "GetBucketLocation",
            Op::CreateMultipartUpload => "CreateMultipartUpload",
            Op::UploadPart => "UploadPart",
            Op::UploadPartCopy => "UploadPartCopy",
            Op::CompleteMultipartUpload => "CompleteMultipartUpload",
            Op::AbortMultipartUpload => "AbortMultipartUpload",
            Op::ListParts => "ListParts",
            Op::ListMultipartUploads => "ListMultipartUploads",
            Op::Admin => "Admin",
            Op::Kv => "Kv",
            Op::Ops => "Ops",
            Op::Unsupported => "Unsupported",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

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
    pub durable_dropped: Counter,
    pub nvme_objects: Gauge,
    pub nvme_reclaimed_regions: Gauge,
    pub nvme_corrupt_records: Gauge,
    pub dram_used: Gauge,
    pub dram_capacity: Gauge,
    pub objects: Gauge,
}

impl Default for ShardMetrics {
    fn default() -> Self {
        ShardMetrics {
            requests: (0..Op::ALL.len() * STATUS_SLOTS)
                .map(|_| Counter::default())
                .collect(),
            latency: (0..Op::ALL.len()).map(|_| Histogram::default()).collect(),
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
            durable_dropped: Counter::default(),
            nvme_objects: Gauge::default(),
            nvme_reclaimed_regions: Gauge::default(),
            nvme_corrupt_records: Gauge::default(),
            dram_used: Gauge::default(),
            dram_capacity: Gauge::default(),
            objects: Gauge::default(),
        }
    }
}

impl ShardMetrics {
    pub fn record(&self, op: Op, status: u16, elapsed: Duration) {
        let slot =
            (status.clamp(STATUS_MIN, STATUS_MIN + STATUS_SLOTS as u16 - 1) - STATUS_MIN) as usize;
        self.requests[op.index() * STATUS_SLOTS + slot].inc();
        self.latency[op.index()].observe(elapsed);
    }

    pub fn set_dram(&self, used: u64, capacity: u64, objects: u64) {
        self.dram_used.set(used);
        self.dram_capacity.set(capacity);
        self.objects.set(objects);
    }
}

/// Renders all shards in the Prometheus text exposition format (version 0.0.4).
pub fn render(shards: &[std::sync::Arc<ShardMetrics>]) -> String {
    let mut out = String::with_capacity(16 * 1024);
    header(
        &mut out,
        "yutu_requests_total",
        "counter",
        "Requests by operation and HTTP status.",
    );
    for (s, m) in shards.iter().enumerate() {
        for op in Op::ALL {
            for slot in 0..STATUS_SLOTS {
                let n = m.requests[op.index() * STATUS_SLOTS + slot].get();
                if n > 0 {
                    let status = STATUS_MIN as usize + slot;
                    let _ = writeln!(
                        out,
                        "yutu_requests_total{{shard=\"{s}\",op=\"{}\",status=\"{status}\"}} {n}",
                        op.name()
                    );
                }
            }
        }
    }
    header(
        &mut out,
        "yutu_request_duration_seconds",
        "histogram",
        "Request latency by operation, from the parsed request to the response head.",
    );
    for (s, m) in shards.iter().enumerate() {
        for op in Op::ALL {
            let h = &m.latency[op.index()];
            if h.count.get() == 0 {
                continue;
            }
            let mut cumulative = 0;
            for (i, le) in LATENCY_BUCKETS.iter().enumerate() {
                cumulative += h.buckets[i].get();
                let _ = writeln!(
                    out,
                    "yutu_request_duration_seconds_bucket{{shard=\"{s}\",op=\"{}\",le=\"{le}\"}} {cumulative}",
                    op.name()
                );
            }
            let labels = format!("shard=\"{s}\",op=\"{}\"", op.name());
            let _ = writeln!(
                out,
                "yutu_request_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {}",
                h.count.get()
            );
            let _ = writeln!(
                out,
                "yutu_request_duration_seconds_sum{{{labels}}} {}",
                h.sum_us.get() as f64 / 1e6
            );
            let _ = writeln!(
                out,
                "yutu_request_duration_seconds_count{{{labels}}} {}",
                h.count.get()
            );
        }
    }
    type Series = (
        &'static str,
        &'static str,
        &'static str,
        fn(&ShardMetrics) -> u64,
    );
    let simple: [Series; 23] = [
        (
            "yutu_tier_hits_total{tier=\"dram\"}",
            "counter",
            "GETs served from DRAM (also objects on their way to NVMe).",
            |m| m.dram_hits.get(),
        ),
        (
            "yutu_tier_hits_total{tier=\"nvme\"}",
            "counter",
            "GETs served from NVMe.",
            |m| m.nvme_hits.get(),
        ),
        (
            "yutu_tier_misses_total",
            "counter",
            "GETs of keys in neither tier.",
            |m| m.misses.get(),
        ),
        (
            "yutu_demotions_total",
            "counter",
            "Objects evicted from DRAM and written to NVMe.",
            |m| m.demotions.get(),
        ),
        (
            "yutu_demotions_dropped_total",
            "counter",
            "Objects evicted from DRAM without demotion (back-pressure or too large).",
            |m| m.demotions_dropped.get(),
        ),
        (
            "yutu_promotions_total",
            "counter",
            "NVMe hits copied back into DRAM.",
            |m| m.promotions.get(),
        ),
        (
            "yutu_nvme_used_bytes",
            "gauge",
            "NVMe bytes in non-free regions.",
            |m| m.nvme_used.get(),
        ),
        (
            "yutu_nvme_capacity_bytes",
            "gauge",
            "NVMe record space of the shard.",
            |m| m.nvme_capacity.get(),
        ),
        (
            "yutu_durable_used_bytes",
            "gauge",
            "NVMe bytes of live records of `disk` buckets.",
            |m| m.durable_used.get(),
        ),
        (
            "yutu_durable_limit_bytes",
            "gauge",
            "Most NVMe bytes `disk` buckets may hold (capacity less two regions per shard).",
            |m| m.durable_limit.get(),
        ),
        (
            "yutu_durable_refused_total",
            "counter",
            "Durable writes refused because the NVMe tier could not keep them (507).",
            |m| m.durable_refused.get(),
        ),
        (
            "yutu_durable_dropped_total",
            "counter",
            "Durable records an NVMe reclamation dropped (expected to stay 0).",
            |m| m.durable_dropped.get(),
        ),
        (
            "yutu_nvme_objects",
            "gauge",
            "Objects in the NVMe index.",
            |m| m.nvme_objects.get(),
        ),
        (
            "yutu_nvme_reclaimed_regions_total",
            "counter",
            "NVMe regions reclaimed (oldest first).",
            |m| m.nvme_reclaimed_regions.get(),
        ),
        (
            "yutu_nvme_corrupt_records_total",
            "counter",
            "NVMe records skipped because their checksum failed.",
            |m| m.nvme_corrupt_records.get(),
        ),
        (
            "yutu_bytes_in_total",
            "counter",
            "Object payload bytes received.",
            |m| m.bytes_in.get(),
        ),
        (
            "yutu_bytes_out_total",
            "counter",
            "Object payload bytes sent.",
            |m| m.bytes_out.get(),
        ),
        (
            "yutu_evictions_total",
            "counter",
            "Objects evicted from DRAM to make room.",
            |m| m.evictions.get(),
        ),
        (
            "yutu_forwarded_total",
            "counter",
            "Requests handed to the owning shard over a channel.",
            |m| m.forwarded.get(),
        ),
        (
            "yutu_kv_events_published_total",
            "counter",
            "KV events accepted by the conductor (shard 0 publishes for the node).",
            |m| m.events_published.get(),
        ),
        (
            "yutu_dram_used_bytes",
            "gauge",
            "DRAM charged to stored objects (payload and index).",
            |m| m.dram_used.get(),
        ),
        (
            "yutu_dram_capacity_bytes",
            "gauge",
            "DRAM capacity of the shard.",
            |m| m.dram_capacity.get(),
        ),
        ("yutu_objects", "gauge", "Objects stored in DRAM.", |m| {
            m.objects.get()
        }),
    ];
    // A name may carry labels (`name{tier="dram"}`); series of one name share a header.
    let mut last_base = "";
    for (name, kind, help, get) in simple {
        let (base, labels) = match name.split_once('{') {
            Some((b, l)) => (b, format!("{},", l.trim_end_matches('}'))),
            None => (name, String::new()),
        };
        if base != last_base {
            header(&mut out, base, kind, help);
            last_base = base;
        }
        for (s, m) in shards.iter().enumerate() {
            let _ = writeln!(out, "{base}{{{labels}shard=\"{s}\"}} {}", get(m));
        }
    }
    out
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn renders_counters_and_histograms() {
        let m = Arc::new(ShardMetrics::default());
        m.record(Op::GetObject, 200, Duration::from_micros(300));
        m.record(Op::GetObject, 404, Duration::from_millis(2));
        m.set_dram(10, 100, 1);
        let text = render(&[m]);
        assert!(text.contains("yutu_requests_total{shard=\"0\",op=\"GetObject\",status=\"200\"} 1"));
        assert!(text.contains("yutu_requests_total{shard=\"0\",op=\"GetObject\",status=\"404\"} 1"));
        assert!(text.contains(
            "yutu_request_duration_seconds_bucket{shard=\"0\",op=\"GetObject\",le=\"0.0005\"} 1"
        ));
        assert!(text.contains(
            "yutu_request_duration_seconds_bucket{shard=\"0\",op=\"GetObject\",le=\"+Inf\"} 2"
        ));
        assert!(text.contains("yutu_dram_capacity_bytes{shard=\"0\"} 100"));
    }
}
