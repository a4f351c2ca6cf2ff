//! `yutu-bench`: Yutu's benchmarks, each reported as a ratio against a reference measured in the
//! same run (docs/benchmarks.md, "Measuring"), because absolute numbers drift between runs and machines.
//!
//! Every suite prints a table to stdout (progress goes to stderr) and, with `--json FILE`,
//! writes one JSON object for scripts. Suites start and stop the servers they need themselves,
//! talk only to 127.0.0.1, and run for a bounded time.
//!
//! ```text
//! scripts/install-bench-deps.sh                      # nginx (with WebDAV), the s3 reference
//! cargo build --release -p yutu-server               # the binary under test
//! cargo run --release -p yutu-bench -- s3 --json s3.json [--duration-secs 5] [--concurrency 16]
//! ```
//!
//! `yutu-server` is taken from `$YUTU_SERVER_BIN`, else from next to this executable, else built
//! with cargo. `s3 --reference-only` measures nginx alone.

mod child;
mod http;
mod load;
mod nginx;
mod report;
mod suites;
mod tempdir;
mod yutu;

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "yutu-bench",
    about = "Benchmarks Yutu against reference implementations"
)]
struct Cli {
    #[command(flatten)]
    common: Common,
    #[command(subcommand)]
    suite: Suite,
}

/// Options every suite understands.
#[derive(Debug, Args)]
struct Common {
    /// Also write the report as one JSON object to this file.
    #[arg(long, global = true, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Threads of the load generator's runtime [default: one per core]. The client shares the
    /// cores with the server under test; with fewer threads than cores the client, not the
    /// server, becomes the bottleneck and every ratio drifts towards 1. Both sides of a ratio
    /// use the same count.
    #[arg(long, global = true)]
    client_threads: Option<usize>,
}

/// The suites. Later ones (`kv`, `nvme`, `conductor`) are added as variants here and modules in
/// `suites/`.
#[derive(Debug, Subcommand)]
enum Suite {
    /// GET/PUT of 4 KiB and 1 MiB objects over HTTP, against nginx serving the same bytes.
    S3(suites::s3::S3Args),
    /// One-sided 2 MiB reads over shm and tcp, against memcpy and a raw loopback TCP stream.
    Transfer(suites::transfer::TransferArgs),
    /// Spill write/read bandwidth of the NVMe tier's region store, against fio (O_DIRECT, io_uring).
    Nvme(suites::nvme::NvmeArgs),
    /// Prefix-index ingestion and routing decisions of the conductor, on one core.
    Conductor(suites::conductor::ConductorArgs),
    /// The KV block API end to end (2 MiB gets over shm and tcp, batched 4 KiB put/get), against
    /// memcpy, a raw loopback TCP stream, redis-benchmark and memcached.
    Kv(suites::kv::KvArgs),
    /// Two good clients' KV rate while another tenant attacks the control plane, against the
    /// same clients unloaded.
    Tenants(suites::tenants::TenantsArgs),
    /// Three nodes on etcd: KV throughput against one node, the cost of a forwarding hop,
    /// time from a SIGKILL to the first read of an affected key, re-replication MiB/s.
    Cluster(suites::cluster::ClusterArgs),
    /// 2 MiB and 16 MiB KV blocks fetched into GPU memory (`batch_get_into` a device buffer),
    /// against a pinned cuMemcpyHtoD of the same bytes; `--device host` runs a stand-in.
    Gpu(suites::gpu::GpuArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let client_threads = cli
        .common
        .client_threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(client_threads.max(1))
        .enable_all()
        .build()
        .context("starting the load generator's runtime")?;
    let report = runtime.block_on(async {
        let suite = async {
            match &cli.suite {
                Suite::S3(args) => suites::s3::run(args).await,
                Suite::Transfer(args) => suites::transfer::run(args).await,
                Suite::Nvme(args) => suites::nvme::run(args).await,
                Suite::Conductor(args) => suites::conductor::run(args).await,
                Suite::Kv(args) => suites::kv::run(args).await,
                Suite::Tenants(args) => suites::tenants::run(args).await,
                Suite::Cluster(args) => suites::cluster::run(args).await,
                Suite::Gpu(args) => suites::gpu::run(args).await,
            }
        };
        // Ctrl-C drops the suite's future, whose guards stop the servers and remove their files;
        // without this the default handler would kill the bench and leave them running.
        tokio::select! {
            biased;
            _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
            report = suite => report,
        }
    })?;
    print!("{}", report.table());
    if let Some(path) = &cli.common.json {
        report.write_json(path)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}
