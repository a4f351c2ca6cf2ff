//! The one output format every suite shares (docs/benchmarks.md, "Measuring").
//!
//! Absolute numbers drift between runs and machines, so each result carries the reference it
//! was measured against in the same run and the ratio of the two; scripts compare ratios, people
//! read the table. The JSON shape is a contract with those scripts: fields are only ever added,
//! and optional ones are left out (not written as `null`) when a suite has nothing to say, except
//! `value`, `ratio` and `target`, which are always present.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context as _;
use serde::Serialize;

/// Everything one suite run produced: what `--json` writes and the table prints.
#[derive(Debug, Serialize)]
pub struct Report {
    pub suite: String,
    pub machine: Machine,
    /// Facts about the run that are not measurements (the `gpu` suite: the device, and how
    /// device memory travels).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub notes: BTreeMap<String, String>,
    /// Why the suite measured nothing (a `gpu` run on a host without a GPU).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
    pub results: Vec<BenchResult>,
}

/// The machine facts that explain most of the drift between two reports.
#[derive(Debug, Serialize)]
pub struct Machine {
    pub cores: usize,
    pub kernel: String,
}

/// One measured case, Yutu's side, with its reference.
#[derive(Debug, Serialize)]
pub struct BenchResult {
    pub name: String,
    /// Yutu's number; `None` when only the reference ran (`--reference-only`) or Yutu's side
    /// could not be measured.
    pub value: Option<f64>,
    pub unit: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p50_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p99_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mb_per_s: Option<f64>,
    /// Failed requests (wrong status, short body, I/O error, timeout); never counted in `value`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errors: Option<u64>,
    pub reference: Option<Reference>,
    /// `value / reference.value`; `None` when either side is missing or the reference is zero.
    pub ratio: Option<f64>,
    /// The ratio this case should reach, when the design sets one.
    pub target: Option<f64>,
}

/// The same case measured against the reference implementation.
#[derive(Debug, Serialize)]
pub struct Reference {
    pub name: String,
    pub value: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p50_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p99_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mb_per_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errors: Option<u64>,
}

impl Machine {
    /// Reads the core count the way the servers see it, and the running kernel's release.
    pub fn detect() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| "unknown".to_owned());
        Machine { cores, kernel }
    }
}

impl BenchResult {
    /// Fills `ratio` from `value` and the reference; call after both sides are set.
    pub fn with_ratio(mut self) -> Self {
        self.ratio = match (self.value, &self.reference) {
            (Some(v), Some(r)) if r.value > 0.0 => Some(v / r.value),
            _ => None,
        };
        self
    }
}

impl Report {
    /// Writes the JSON object scripts read; pretty-printed because people read it too.
    pub fn write_json(&self, path: &Path) -> anyhow::Result<()> {
        let mut text = serde_json::to_string_pretty(self)?;
        text.push('\n');
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
    }

    /// Renders the human-readable table: one row per case, Yutu's columns then the reference's.
    pub fn table(&self) -> String {
        let header = [
            "case",
            "value",
            "unit",
            "MB/s",
            "p50 us",
            "p99 us",
            "errors",
            "reference",
            "value",
            "MB/s",
            "p50 us",
            "p99 us",
            "errors",
            "ratio",
        ];
        let mut rows: Vec<Vec<String>> = vec![header.iter().map(|s| s.to_string()).collect()];
        for r in &self.results {
            let reference = r.reference.as_ref();
            rows.push(vec![
                r.name.clone(),
                num(r.value),
                r.unit.clone(),
                num(r.mb_per_s),
                num(r.p50_us),
                num(r.p99_us),
                count(r.errors),
                reference.map_or_else(|| "-".to_owned(), |x| x.name.clone()),
                num(reference.map(|x| x.value)),
                num(reference.and_then(|x| x.mb_per_s)),
                num(reference.and_then(|x| x.p50_us)),
                num(reference.and_then(|x| x.p99_us)),
                count(reference.and_then(|x| x.errors)),
                r.ratio
                    .map_or_else(|| "-".to_owned(), |x| format!("{x:.3}")),
            ]);
        }
        let widths: Vec<usize> = (0..header.len())
            .map(|c| rows.iter().map(|row| row[c].len()).max().unwrap_or(0))
            .collect();
        let mut out = format!(
            "suite {} on {} cores, kernel {}\n",
            self.suite, self.machine.cores, self.machine.kernel
        );
        for (k, v) in &self.notes {
            let _ = writeln!(out, "{k}: {v}");
        }
        if let Some(why) = &self.skipped {
            let _ = writeln!(out, "skipped: {why}");
        }
        for row in &rows {
            let mut line = String::new();
            for (c, cell) in row.iter().enumerate() {
                // Names left-aligned, numbers right-aligned, as a reader scans them.
                if c == 0 || c == 2 || c == 7 {
                    let _ = write!(line, "{cell:<w$}  ", w = widths[c]);
                } else {
                    let _ = write!(line, "{cell:>w$}  ", w = widths[c]);
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// Formats a measurement with as many decimals as its size deserves.
fn num(v: Option<f64>) -> String {
    match v {
        None => "-".to_owned(),
        Some(x) if x >= 100.0 => format!("{x:.0}"),
        Some(x) => format!("{x:.1}"),
    }
}

fn count(v: Option<u64>) -> String {
    v.map_or_else(|| "-".to_owned(), |x| x.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(value: Option<f64>, reference: f64) -> BenchResult {
        BenchResult {
            name: "get_4KiB".into(),
            value,
            unit: "ops/s".into(),
            p50_us: Some(100.0),
            p99_us: Some(400.0),
            mb_per_s: Some(10.0),
            errors: Some(0),
            reference: Some(Reference {
                name: "nginx_get_4KiB".into(),
                value: reference,
                p50_us: Some(90.0),
                p99_us: Some(300.0),
                mb_per_s: Some(12.0),
                errors: Some(0),
            }),
            ratio: None,
            target: None,
        }
        .with_ratio()
    }

    #[test]
    fn ratio_is_value_over_reference() {
        assert_eq!(sample(Some(50.0), 100.0).ratio, Some(0.5));
        assert_eq!(sample(None, 100.0).ratio, None);
        assert_eq!(sample(Some(50.0), 0.0).ratio, None);
    }

    #[test]
    fn json_has_the_contract_shape() {
        let report = Report {
            suite: "s3".into(),
            notes: Default::default(),
            skipped: None,
            machine: Machine {
                cores: 2,
                kernel: "6.1".into(),
            },
            results: vec![sample(Some(50.0), 100.0)],
        };
        let v = serde_json::to_value(&report).expect("report serializes");
        assert_eq!(v["suite"], "s3");
        assert_eq!(v["machine"]["cores"], 2);
        let r = &v["results"][0];
        assert_eq!(r["name"], "get_4KiB");
        assert_eq!(r["value"], 50.0);
        assert_eq!(r["unit"], "ops/s");
        assert_eq!(r["reference"]["name"], "nginx_get_4KiB");
        assert_eq!(r["reference"]["value"], 100.0);
        assert_eq!(r["ratio"], 0.5);
        assert!(r["target"].is_null());
        assert!(r.get("p50_us").is_some() && r.get("mb_per_s").is_some());
    }

    #[test]
    fn table_has_a_row_per_case() {
        let report = Report {
            suite: "s3".into(),
            notes: Default::default(),
            skipped: None,
            machine: Machine {
                cores: 2,
                kernel: "6.1".into(),
            },
            results: vec![sample(Some(50.0), 100.0), sample(None, 100.0)],
        };
        let table = report.table();
        assert_eq!(table.lines().count(), 4);
        assert!(table.contains("0.500"));
    }
}
