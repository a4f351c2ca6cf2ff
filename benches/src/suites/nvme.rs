//! The `nvme` suite: spill bandwidth of the NVMe tier's region store (`yutu-blockstore`) against fio
//! doing plain O_DIRECT io_uring I/O on the same file system, in the same run.
//!
//! For each record size (1 MiB and 4 MiB) and each repetition, the two sides run one after the
//! other, never at once, on fresh files in the same directory:
//!
//! - **fio**: a sequential write of `--total-mib` with `bs` = record size, `iodepth` =
//!   `--iodepth`, `direct=1`, `ioengine=io_uring`, `fixedbufs=1` (registered buffers, as the
//!   store gets from glommio's buffer pool), `end_fsync=1` (so its time, like the store's,
//!   includes making the data durable), then a sequential read of the same file.
//! - **store**: `append` of the same number of records on a preallocated file opened with
//!   O_DIRECT, then one `flush`; then `read` of every record with `--iodepth` reads in flight.
//!   Every value is checksummed on write, verified on read and copied out, which fio does not
//!   do; the ratio shows what that costs. The store is then reopened, and the time its
//!   recovery scan takes is printed (it is not part of either bandwidth).
//!
//! Each side's median over the repetitions is reported, as MB/s (10^6 bytes per second), with
//! fio as the reference; the design's target is 0.8 of fio for both directions. Interleaving the
//! sides, instead of running all fio repetitions first, spreads the drift of a shared disk over
//! both.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context as _};
use clap::Args;
use yutu_blockstore::measure::{run_spill, SpillConfig};

use crate::report::{BenchResult, Machine, Reference, Report};
use crate::tempdir::TempDir;

/// Ratio of fio's bandwidth the store should reach (docs/benchmarks.md, "Measuring").
const TARGET: f64 = 0.8;

/// Options of `yutu-bench nvme`.
#[derive(Debug, Args)]
pub struct NvmeArgs {
    /// Directory for the test files: on a disk-backed file system that supports O_DIRECT
    /// (not tmpfs). Each side gets a fresh file, removed afterwards.
    #[arg(long, default_value = "/var/tmp")]
    pub dir: PathBuf,
    /// MiB written and read per case and repetition.
    #[arg(long, default_value_t = 1024)]
    pub total_mib: u64,
    /// I/Os in flight: the store's write queue depth and concurrent reads; fio's iodepth.
    #[arg(long, default_value_t = 8)]
    pub iodepth: usize,
    /// The store's region size in MiB.
    #[arg(long, default_value_t = 64)]
    pub region_mib: u64,
    /// The store's write I/O size in KiB (one chunk of the region buffer).
    #[arg(long, default_value_t = 1024)]
    pub chunk_kib: u64,
    /// glommio's buffer pool for the store's executor, in MiB [default: enough for every
    /// write chunk and concurrent read, as a server shard should be configured].
    #[arg(long)]
    pub io_memory_mib: Option<usize>,
    /// Repetitions of each case; the median of each side is reported.
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Measure only fio; the store's values are null.
    #[arg(long)]
    pub reference_only: bool,
}

/// Medians of one side for one record size, in MB/s.
#[derive(Debug, Clone, Copy)]
struct Bandwidth {
    write: f64,
    read: f64,
}

/// Runs the suite.
pub async fn run(args: &NvmeArgs) -> anyhow::Result<Report> {
    if args.total_mib == 0 || args.iodepth == 0 || args.repeat == 0 || args.region_mib == 0 {
        bail!("--total-mib, --iodepth, --repeat and --region-mib must be at least 1");
    }
    let fio = fio_version().context(
        "fio is needed as the reference (apt-get install fio, or scripts/install-bench-deps.sh)",
    )?;
    eprintln!("reference: {fio}");
    let dir = TempDir::new_in(&args.dir, "yutu-nvme-")?;
    eprintln!(
        "files in {}; {} MiB per case, iodepth {}, regions {} MiB, chunks {} KiB, {} repetitions",
        dir.path().display(),
        args.total_mib,
        args.iodepth,
        args.region_mib,
        args.chunk_kib,
        args.repeat
    );

    let mut results = Vec::new();
    for (label, record) in [("1MiB", 1usize << 20), ("4MiB", 4usize << 20)] {
        let mut fio_runs = Vec::new();
        let mut store_runs = Vec::new();
        for rep in 0..args.repeat {
            let fio_bw = tokio::task::block_in_place(|| fio_pair(args, dir.path(), record))?;
            eprintln!(
                "{label} #{rep}: fio write {:.0} MB/s, read {:.0} MB/s",
                fio_bw.write, fio_bw.read
            );
            fio_runs.push(fio_bw);
            if !args.reference_only {
                let bw = tokio::task::block_in_place(|| store_pair(args, dir.path(), record))?;
                eprintln!(
                    "{label} #{rep}: store write {:.0} MB/s, read {:.0} MB/s",
                    bw.write, bw.read
                );
                store_runs.push(bw);
            }
        }
        let fio_med = median_bw(&fio_runs);
        let store_med = (!store_runs.is_empty()).then(|| median_bw(&store_runs));
        for (op, pick) in [
            ("write", (|b: Bandwidth| b.write) as fn(Bandwidth) -> f64),
            ("read", |b: Bandwidth| b.read),
        ] {
            let value = store_med.map(pick);
            results.push(
                BenchResult {
                    name: format!("spill_{op}_{label}"),
                    value,
                    unit: "MB/s".to_owned(),
                    p50_us: None,
                    p99_us: None,
                    mb_per_s: value,
                    errors: None,
                    reference: Some(Reference {
                        name: format!("fio_{op}_{label}"),
                        value: pick(fio_med),
                        p50_us: None,
                        p99_us: None,
                        mb_per_s: Some(pick(fio_med)),
                        errors: None,
                    }),
                    ratio: None,
                    target: Some(TARGET),
                }
                .with_ratio(),
            );
        }
    }
    Ok(Report {
        suite: "nvme".to_owned(),
        notes: Default::default(),
        skipped: None,
        machine: Machine::detect(),
        results,
    })
}

fn median_bw(runs: &[Bandwidth]) -> Bandwidth {
    Bandwidth {
        write: median(runs.iter().map(|b| b.write).collect()),
        read: median(runs.iter().map(|b| b.read).collect()),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn fio_version() -> anyhow::Result<String> {
    let out = Command::new("fio").arg("--version").output()?;
    if !out.status.success() {
        bail!("fio --version failed");
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// fio's sequential write (durable at the end) then read of a fresh file.
fn fio_pair(args: &NvmeArgs, dir: &Path, record: usize) -> anyhow::Result<Bandwidth> {
    let file = dir.join("fio.img");
    let _ = std::fs::remove_file(&file);
    let write = fio_job(args, &file, record, "write")?;
    let read = fio_job(args, &file, record, "read")?;
    std::fs::remove_file(&file).with_context(|| format!("removing {}", file.display()))?;
    Ok(Bandwidth { write, read })
}

/// Runs one fio job and returns its bandwidth in MB/s.
fn fio_job(args: &NvmeArgs, file: &Path, record: usize, rw: &str) -> anyhow::Result<f64> {
    let out = Command::new("fio")
        .arg("--name=yutu-nvme-reference")
        .arg(format!("--filename={}", file.display()))
        .arg(format!("--size={}", args.total_mib << 20))
        .arg(format!("--bs={record}"))
        .arg(format!("--rw={rw}"))
        .arg("--direct=1")
        .arg("--ioengine=io_uring")
        .arg(format!("--iodepth={}", args.iodepth))
        .arg("--fixedbufs=1")
        .arg(format!("--end_fsync={}", u8::from(rw == "write")))
        .arg("--output-format=json")
        .output()
        .context("running fio")?;
    if !out.status.success() {
        bail!(
            "fio {rw} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let json: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("parsing fio's JSON output")?;
    let job = &json["jobs"][0];
    if job["error"].as_i64().unwrap_or(0) != 0 {
        bail!("fio {rw} reported error {}", job["error"]);
    }
    let bw = job[rw]["bw_bytes"]
        .as_f64()
        .with_context(|| format!("no {rw}.bw_bytes in fio's output"))?;
    Ok(bw / 1e6)
}

/// The store's spill write then (after reopening) read of a fresh file.
fn store_pair(args: &NvmeArgs, dir: &Path, record: usize) -> anyhow::Result<Bandwidth> {
    let region = args.region_mib << 20;
    let total = args.total_mib << 20;
    let mut cfg = SpillConfig {
        path: dir.join("store.img"),
        // Room for the data plus the active region and the one kept free.
        file_size: total + 4 * region,
        record_size: record,
        total_bytes: total,
        region_size: region,
        write_chunk: (args.chunk_kib << 10) as usize,
        max_inflight_writes: args.iodepth,
        read_concurrency: args.iodepth,
        io_memory: 0,
    };
    cfg.io_memory = match args.io_memory_mib {
        Some(mib) => mib << 20,
        None => cfg.suggested_io_memory(),
    };
    let _ = std::fs::remove_file(&cfg.path);
    let res = run_spill(&cfg);
    std::fs::remove_file(&cfg.path).with_context(|| format!("removing {}", cfg.path.display()))?;
    let res = res.context("measuring the region store")?;
    eprintln!(
        "  {} records of {record} bytes, io_memory {} MiB, reopen (recovery scan) took {:?}",
        res.records,
        cfg.io_memory >> 20,
        res.reopen_time
    );
    Ok(Bandwidth {
        write: res.write_mb_per_s(),
        read: res.read_mb_per_s(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_picks_the_middle() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![5.0]), 5.0);
    }
}
