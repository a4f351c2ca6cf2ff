//! Turning simulation runs into the numbers people compare: a table, and a JSON object.

use std::fmt::Write as _;

use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;

use super::engine::{PolicyRun, SimConfig};
use super::trace::Trace;

/// One policy's figures (the `policies.<name>` object of the JSON report).
#[derive(Debug, Clone, Serialize)]
pub struct PolicySummary {
    /// Blocks reused (local or pulled) over blocks of the requests served.
    pub hit_ratio: f64,
    pub ttft_mean_ms: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    pub tbt_mean_ms: f64,
    pub tbt_p99_ms: f64,
    /// Share of *all* requests served within both objectives.
    pub effective_capacity: f64,
    pub rejected: usize,
    pub served: usize,
    /// The busiest prefill instance's share of all prefill work (1/N is perfectly even).
    pub max_load_share: f64,
    /// Every prefill instance's share of the prefill work.
    pub load_share: Vec<f64>,
    pub pulls: u64,
    pub replication_hints: u64,
    /// Mean absolute error of the conductor's TTFT prediction, served requests.
    pub ttft_prediction_error_ms: f64,
    /// Wall-clock time the simulation took.
    pub sim_wall_ms: f64,
}

/// The settings a report was made with.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    pub prefill: usize,
    pub decode: usize,
    pub cache_tokens: u64,
    pub eviction: String,
    pub speed: f64,
    pub ttft_slo_ms: Option<f64>,
    pub tbt_slo_ms: Option<f64>,
    pub event_delay_ms: f64,
    pub block_tokens: u32,
    pub prefill_model_ms: String,
    pub decode_step_model_ms: String,
}

/// The whole report; `--json` writes it.
#[derive(Debug, Clone, Serialize)]
pub struct SimReport {
    pub trace: String,
    pub requests: usize,
    pub upper_bound_hit_ratio: f64,
    pub settings: Settings,
    /// In the order run (baselines first), as a JSON object keyed by policy name.
    #[serde(serialize_with = "in_order")]
    pub policies: Vec<(String, PolicySummary)>,
    /// Load over time per policy, for the chart (not in the JSON).
    #[serde(skip)]
    pub backlog: Vec<(String, Vec<(f64, f64)>)>,
}

fn in_order<S: Serializer>(v: &[(String, PolicySummary)], s: S) -> Result<S::Ok, S::Error> {
    let mut m = s.serialize_map(Some(v.len()))?;
    for (k, p) in v {
        m.serialize_entry(k, p)?;
    }
    m.end()
}

/// The `q` quantile (0..=1) of `sorted`, nearest rank; 0 when empty.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// Summarises one run.
pub fn summarize(run: &PolicyRun) -> PolicySummary {
    let mut ttft = run.ttft_ms.clone();
    ttft.sort_by(f64::total_cmp);
    let mut tbt = run.tbt_ms.clone();
    tbt.sort_by(f64::total_cmp);
    let busy: f64 = run.busy_ms.iter().sum();
    let load_share: Vec<f64> = run
        .busy_ms
        .iter()
        .map(|b| if busy > 0.0 { b / busy } else { 0.0 })
        .collect();
    PolicySummary {
        hit_ratio: run.hit_blocks as f64 / run.served_blocks.max(1) as f64,
        ttft_mean_ms: mean(&ttft),
        ttft_p50_ms: quantile(&ttft, 0.5),
        ttft_p99_ms: quantile(&ttft, 0.99),
        tbt_mean_ms: mean(&tbt),
        tbt_p99_ms: quantile(&tbt, 0.99),
        effective_capacity: run.met_slo as f64 / run.requests.max(1) as f64,
        rejected: run.rejected,
        served: run.served,
        max_load_share: load_share.iter().copied().fold(0.0, f64::max),
        load_share,
        pulls: run.pulls,
        replication_hints: run.hints,
        ttft_prediction_error_ms: run.ttft_prediction_error_ms,
        sim_wall_ms: run.wall_ms,
    }
}

/// Assembles the report of several runs over one trace.
pub fn build(trace: &Trace, cfg: &SimConfig, runs: &[PolicyRun]) -> SimReport {
    let c = &cfg.conductor;
    SimReport {
        trace: trace.name.clone(),
        requests: trace.requests.len(),
        upper_bound_hit_ratio: trace.upper_bound_hit_ratio(),
        settings: Settings {
            prefill: cfg.prefill,
            decode: cfg.decode,
            cache_tokens: cfg.cache_tokens,
            eviction: format!("{:?}", cfg.eviction).to_lowercase(),
            speed: cfg.speed,
            ttft_slo_ms: c.ttft_slo_ms,
            tbt_slo_ms: c.tbt_slo_ms,
            event_delay_ms: cfg.event_delay_ms,
            block_tokens: c.block_tokens,
            prefill_model_ms: c.cost.prefill.text().to_owned(),
            decode_step_model_ms: c.cost.decode_step.text().to_owned(),
        },
        policies: runs
            .iter()
            .map(|r| (r.policy.name().to_owned(), summarize(r)))
            .collect(),
        backlog: runs
            .iter()
            .map(|r| (r.policy.name().to_owned(), r.backlog.clone()))
            .collect(),
    }
}

impl SimReport {
    /// The human-readable table (markdown, so it can be pasted into a README).
    pub fn table(&self) -> String {
        let s = &self.settings;
        let mut o = String::new();
        let _ = writeln!(
            o,
            "trace {} ({} requests), {} prefill + {} decode instances, {} tokens cached per instance ({}), speed {}x, SLO TTFT {} ms / TBT {} ms",
            self.trace,
            self.requests,
            s.prefill,
            s.decode,
            s.cache_tokens,
            s.eviction,
            s.speed,
            s.ttft_slo_ms.map_or("-".into(), |v| format!("{v}")),
            s.tbt_slo_ms.map_or("-".into(), |v| format!("{v}")),
        );
        let _ = writeln!(
            o,
            "infinite-cache upper bound hit ratio: {:.1}%\n",
            self.upper_bound_hit_ratio * 100.0
        );
        let _ = writeln!(
            o,
            "| policy | hit ratio | of bound | TTFT mean | TTFT p50 | TTFT p99 | TBT p99 | effective capacity | rejected | max load share |"
        );
        let _ = writeln!(o, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for (name, p) in &self.policies {
            let _ = writeln!(
                o,
                "| {name} | {:.1}% | {:.1}% | {} | {} | {} | {:.1} ms | {:.1}% | {} | {:.3} |",
                p.hit_ratio * 100.0,
                p.hit_ratio / self.upper_bound_hit_ratio.max(1e-12) * 100.0,
                ms(p.ttft_mean_ms),
                ms(p.ttft_p50_ms),
                ms(p.ttft_p99_ms),
                p.tbt_p99_ms,
                p.effective_capacity * 100.0,
                p.rejected,
                p.max_load_share,
            );
        }
        o.push('\n');
        for (name, p) in &self.policies {
            let shares: Vec<String> = p.load_share.iter().map(|x| format!("{x:.3}")).collect();
            let _ = writeln!(
                o,
                "{name}: prefill load share per instance [{}]; {} pulls, {} replication hints, TTFT prediction error {:.0} ms, simulated in {:.0} ms",
                shares.join(" "),
                p.pulls,
                p.replication_hints,
                p.ttft_prediction_error_ms,
                p.sim_wall_ms,
            );
        }
        o
    }
}

/// Milliseconds, in seconds once large.
fn ms(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.1} s", v / 1e3)
    } else {
        format!("{v:.0} ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_use_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 50.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert_eq!(quantile(&v, 1.0), 100.0);
        assert_eq!(quantile(&[7.0], 0.99), 7.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }
}
