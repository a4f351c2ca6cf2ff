//! The `s3` suite: GET and PUT of 4 KiB and 1 MiB objects over the S3-like HTTP API, against
//! nginx moving the same bytes from tmpfs (static files for GET, WebDAV for PUT).
//!
//! Both servers get the same objects at the same URLs (`/bench/obj-4k-N`, `/bench/obj-1m-N`),
//! the same client, concurrency and durations, and run one after the other, never at once: on
//! two cores a second server (glommio executors poll) would steal the CPU the first is measured
//! on. Before measuring, every object is read back once and compared byte for byte, so a server
//! that answers fast with the wrong bytes fails the run instead of winning it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::Args;

use crate::http::Conn;
use crate::load::{self, LoadConfig, LoadResult, Workload};
use crate::nginx::{self, Nginx};
use crate::report::{BenchResult, Machine, Reference, Report};
use crate::yutu::{self, YutuServer};

/// The bucket every object lives in; for nginx, a directory under the docroot.
const BUCKET: &str = "bench";

/// Options of `yutu-bench s3`.
#[derive(Debug, Args)]
pub struct S3Args {
    /// Seconds measured per case (after the warm-up).
    #[arg(long, default_value_t = 5)]
    pub duration_secs: u64,
    /// Seconds of unmeasured load before each case, to fill caches and settle connections.
    #[arg(long, default_value_t = 1)]
    pub warmup_secs: u64,
    /// Concurrent keep-alive connections.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Objects of each size written before the GET cases; requests cycle through them.
    #[arg(long, default_value_t = 64)]
    pub objects: usize,
    /// DRAM given to yutu-server (`--memory`).
    #[arg(long, default_value = "1GiB")]
    pub yutu_memory: String,
    /// Seconds after which one request counts as failed.
    #[arg(long, default_value_t = 10)]
    pub request_timeout_secs: u64,
    /// Measure only nginx (e.g. while yutu-server is not built yet); Yutu's values are null.
    #[arg(long)]
    pub reference_only: bool,
}

/// A set of same-sized objects: their URL paths and contents.
struct ObjectSet {
    /// As it appears in case names: `4KiB`, `1MiB`.
    label: &'static str,
    size: usize,
    /// Key names relative to the bucket (`obj-4k-0`, ...).
    keys: Vec<String>,
    /// `/bench/<key>`, what goes on the request line.
    paths: Arc<Vec<String>>,
    bodies: Arc<Vec<Vec<u8>>>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Get,
    Put,
}

/// One row of the report: an operation on one object set.
struct Case<'a> {
    name: String,
    op: Op,
    set: &'a ObjectSet,
}

/// The numbers one side measured for one case.
struct Measurement {
    ops_per_s: f64,
    mb_per_s: f64,
    p50_us: Option<f64>,
    p99_us: Option<f64>,
    errors: u64,
}

/// Runs the suite. Dropping the future (Ctrl-C in `main`) stops the servers it started.
pub async fn run(args: &S3Args) -> anyhow::Result<Report> {
    if args.objects == 0 || args.concurrency == 0 || args.duration_secs == 0 {
        bail!("--objects, --concurrency and --duration-secs must be at least 1");
    }
    let info = nginx::probe()?;
    eprintln!(
        "reference: nginx {} ({}){}",
        info.version,
        info.bin.display(),
        if info.has_dav {
            ""
        } else {
            ", no http_dav_module: PUT cases get no reference"
        }
    );
    let yutu_bin = if args.reference_only {
        None
    } else {
        let bin = tokio::task::block_in_place(yutu::locate_binary)?;
        eprintln!("under test: {}", bin.display());
        Some(bin)
    };

    let sets = [
        object_set("4k", "4KiB", 4 << 10, args.objects),
        object_set("1m", "1MiB", 1 << 20, args.objects),
    ];
    let cases: Vec<Case<'_>> = [Op::Get, Op::Put]
        .into_iter()
        .flat_map(|op| sets.iter().map(move |set| (op, set)))
        .map(|(op, set)| Case {
            name: format!(
                "{}_{}",
                if op == Op::Get { "get" } else { "put" },
                set.label
            ),
            op,
            set,
        })
        .collect();
    let cfg = LoadConfig {
        concurrency: args.concurrency,
        warmup: Duration::from_secs(args.warmup_secs),
        duration: Duration::from_secs(args.duration_secs),
        request_timeout: Duration::from_secs(args.request_timeout_secs.max(1)),
    };
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());

    // The reference first: if nginx is broken, we learn it before the longer Yutu setup.
    let reference = {
        let mut server =
            tokio::task::block_in_place(|| Nginx::start(&info, workers, info.has_dav))?;
        seed_files(server.docroot(), &sets)?;
        verify(server.addr(), &sets)
            .await
            .context("nginx serves wrong bytes")?;
        let mut out = Vec::new();
        for case in &cases {
            if case.op == Op::Put && !info.has_dav {
                out.push(None);
                continue;
            }
            out.push(Some(measure("nginx", server.addr(), case, cfg).await));
            server.check_running()?;
        }
        out
    };

    let under_test = match &yutu_bin {
        None => cases.iter().map(|_| None).collect(),
        Some(bin) => {
            let mut server =
                tokio::task::block_in_place(|| YutuServer::start(bin, &args.yutu_memory))?;
            eprintln!("yutu-server listening on {}", server.addr());
            seed_bucket(server.addr(), &sets).await?;
            verify(server.addr(), &sets)
                .await
                .context("yutu-server serves wrong bytes")?;
            let mut out = Vec::new();
            for case in &cases {
                out.push(Some(measure("yutu", server.addr(), case, cfg).await));
                server.check_running()?;
            }
            out
        }
    };

    let results = cases
        .iter()
        .zip(under_test)
        .zip(reference)
        .map(|((case, yutu), nginx)| result(case, yutu, nginx))
        .collect();
    Ok(Report {
        suite: "s3".to_owned(),
        notes: Default::default(),
        skipped: None,
        machine: Machine::detect(),
        results,
    })
}

/// Builds `count` objects of `size` bytes. Contents are pseudo-random and differ per object, so
/// no layer can compress them or answer one key with another key's bytes undetected.
fn object_set(tag: &str, label: &'static str, size: usize, count: usize) -> ObjectSet {
    let keys: Vec<String> = (0..count).map(|i| format!("obj-{tag}-{i}")).collect();
    let paths = keys.iter().map(|k| format!("/{BUCKET}/{k}")).collect();
    let bodies = (0..count)
        .map(|i| pseudo_random(size, (size as u64) << 20 | i as u64))
        .collect();
    ObjectSet {
        label,
        size,
        keys,
        paths: Arc::new(paths),
        bodies: Arc::new(bodies),
    }
}

/// xorshift64* bytes: cheap, deterministic, incompressible enough for a benchmark.
fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        out.extend_from_slice(&state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Puts the objects where nginx serves them: `<docroot>/bench/<key>`.
fn seed_files(docroot: &std::path::Path, sets: &[ObjectSet]) -> anyhow::Result<()> {
    let dir = docroot.join(BUCKET);
    std::fs::create_dir_all(&dir)?;
    for set in sets {
        for (key, body) in set.keys.iter().zip(set.bodies.iter()) {
            std::fs::write(dir.join(key), body)?;
        }
    }
    Ok(())
}

/// Creates the bucket and stores every object through Yutu's S3 API.
async fn seed_bucket(addr: SocketAddr, sets: &[ObjectSet]) -> anyhow::Result<()> {
    let mut conn = Conn::new(addr);
    let bucket = format!("/{BUCKET}");
    let r = conn
        .request("PUT", &bucket, b"", false)
        .await
        .context("creating the bucket")?;
    if r.status != 200 {
        bail!("PUT {bucket} answered {}, expected 200", r.status);
    }
    for set in sets {
        for (path, body) in set.paths.iter().zip(set.bodies.iter()) {
            let r = conn
                .request("PUT", path, body, false)
                .await
                .with_context(|| format!("PUT {path}"))?;
            if r.status != 200 {
                bail!("PUT {path} answered {}, expected 200", r.status);
            }
        }
    }
    Ok(())
}

/// Reads every object back once and compares it with what was stored.
async fn verify(addr: SocketAddr, sets: &[ObjectSet]) -> anyhow::Result<()> {
    let mut conn = Conn::new(addr);
    for set in sets {
        for (path, body) in set.paths.iter().zip(set.bodies.iter()) {
            let r = conn
                .request("GET", path, b"", true)
                .await
                .with_context(|| format!("GET {path}"))?;
            if r.status != 200 {
                bail!("GET {path} answered {}, expected 200", r.status);
            }
            if r.body.as_deref() != Some(&body[..]) {
                bail!(
                    "GET {path} returned {} bytes that differ from the {} stored",
                    r.body_len,
                    body.len()
                );
            }
        }
    }
    Ok(())
}

/// Runs one case against one server and says how it went.
async fn measure(side: &str, addr: SocketAddr, case: &Case<'_>, cfg: LoadConfig) -> Measurement {
    let workload = match case.op {
        Op::Get => Workload {
            method: "GET",
            paths: Arc::clone(&case.set.paths),
            bodies: None,
            expect_body_len: Some(case.set.size as u64),
            ok_status: &[200],
            payload_bytes: case.set.size as u64,
        },
        Op::Put => Workload {
            method: "PUT",
            paths: Arc::clone(&case.set.paths),
            bodies: Some(Arc::clone(&case.set.bodies)),
            // Yutu answers 200; nginx's WebDAV 201 (new file) or 204 (replaced).
            expect_body_len: None,
            ok_status: &[200, 201, 204],
            payload_bytes: case.set.size as u64,
        },
    };
    eprint!("{side:>5} {:<10} ", case.name);
    let r: LoadResult = load::run(addr, Arc::new(workload), cfg).await;
    eprintln!(
        "{:>10.0} ops/s {:>9.1} MB/s  p50 {:>8.1} us  p99 {:>8.1} us  errors {}",
        r.ops_per_sec(),
        r.mb_per_sec(),
        r.percentile_us(50.0).unwrap_or(f64::NAN),
        r.percentile_us(99.0).unwrap_or(f64::NAN),
        r.errors
    );
    for e in &r.error_samples {
        eprintln!("      error: {e}");
    }
    Measurement {
        ops_per_s: r.ops_per_sec(),
        mb_per_s: r.mb_per_sec(),
        p50_us: r.percentile_us(50.0),
        p99_us: r.percentile_us(99.0),
        errors: r.errors,
    }
}

fn result(case: &Case<'_>, yutu: Option<Measurement>, nginx: Option<Measurement>) -> BenchResult {
    BenchResult {
        name: case.name.clone(),
        value: yutu.as_ref().map(|m| m.ops_per_s),
        unit: "ops/s".to_owned(),
        p50_us: yutu.as_ref().and_then(|m| m.p50_us),
        p99_us: yutu.as_ref().and_then(|m| m.p99_us),
        mb_per_s: yutu.as_ref().map(|m| m.mb_per_s),
        errors: yutu.as_ref().map(|m| m.errors),
        reference: nginx.map(|m| Reference {
            name: format!("nginx_{}", case.name),
            value: m.ops_per_s,
            p50_us: m.p50_us,
            p99_us: m.p99_us,
            mb_per_s: Some(m.mb_per_s),
            errors: Some(m.errors),
        }),
        ratio: None,
        target: None,
    }
    .with_ratio()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_distinct_and_sized() {
        let set = object_set("4k", "4KiB", 4096, 3);
        assert_eq!(set.paths[2], "/bench/obj-4k-2");
        assert!(set.bodies.iter().all(|b| b.len() == 4096));
        assert_ne!(set.bodies[0], set.bodies[1]);
        assert_eq!(pseudo_random(100, 7), pseudo_random(100, 7));
    }
}
