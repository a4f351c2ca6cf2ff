//! `yutu-conductor`: the routing service (`serve`, the default) and the trace simulator
//! (`simulate`).

use std::path::PathBuf;

use anyhow::{bail, Context as _};
use clap::{Args, Parser, Subcommand, ValueEnum};
use tracing_subscriber::EnvFilter;
use yutu_conductor::config::ConductorConfig;
use yutu_conductor::cost::{decode_poly, prefill_poly};
use yutu_conductor::service::{self, MembershipWatch, ServiceAuth, ServiceLimits, Shared};
use yutu_conductor::sim::{self, Eviction, SimConfig, Trace};
use yutu_conductor::{Conductor, Policy};

#[derive(Debug, Parser)]
#[command(
    name = "yutu-conductor",
    version,
    about = "KV-cache-centric request routing for disaggregated LLM serving",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the routing API (the default).
    Serve(ServeArgs),
    /// Replay a trace through the routing code against simulated instances.
    Simulate(SimulateArgs),
}

/// Settings shared by the service and the simulator.
#[derive(Debug, Args)]
struct RoutingArgs {
    /// TOML file with any of the conductor's settings (see the crate docs of `config`).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Tokens per KV block.
    #[arg(long)]
    block_tokens: Option<u32>,
    /// Default time-to-first-token objective, ms.
    #[arg(long)]
    ttft_slo_ms: Option<f64>,
    /// Default time-between-tokens objective, ms.
    #[arg(long)]
    tbt_slo_ms: Option<f64>,
    /// Admit every request, even when it is predicted to miss its objectives.
    #[arg(long)]
    no_early_rejection: bool,
    /// Prefill time in ms as a polynomial in n (prompt tokens) and c (cached tokens).
    #[arg(long, value_name = "POLY")]
    prefill_model: Option<String>,
    /// Decode step time in ms as a polynomial in b (batch size) and t (context tokens).
    #[arg(long, value_name = "POLY")]
    decode_model: Option<String>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// HTTP address; port 0 picks a free port (logged as `listening on ADDR`).
    #[arg(long, default_value = "127.0.0.1:9100")]
    listen: String,
    /// Routing policy.
    #[arg(long)]
    policy: Option<Policy>,
    /// Log format on stderr; the level comes from `YUTU_LOG`.
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
    /// Serve every caller without authentication (experiments only). Without it the
    /// conductor needs `[[auth.token_keys]]` in --config and callers need bearer tokens.
    #[arg(long)]
    no_auth: bool,
    /// File holding the bearer token sent to nodes when fetching their snapshots (overrides
    /// `[auth] node_token_file`).
    #[arg(long, value_name = "FILE")]
    node_token_file: Option<PathBuf>,
    /// PEM file of the certificates trusted for nodes serving HTTPS (overrides
    /// `[auth] node_ca_file`).
    #[arg(long, value_name = "FILE")]
    node_ca_file: Option<PathBuf>,
    /// etcd client URLs (comma-separated, tried in turn) of the storage nodes' cluster: the
    /// conductor then learns the nodes from its membership instead of waiting for each to
    /// register, stops routing to a node whose lease is gone and resyncs one that comes back
    /// (overrides `[cluster] etcd`).
    #[arg(long, value_name = "URL[,URL]", value_delimiter = ',')]
    etcd: Vec<String>,
    /// The cluster's name, as given to the nodes (overrides `[cluster] name`; default `yutu`).
    #[arg(long, value_name = "NAME")]
    cluster: Option<String>,
    #[command(flatten)]
    routing: RoutingArgs,
}

/// The service's authentication, from the config's `[auth]` and the flags.
fn service_auth(args: &ServeArgs, cfg: &ConductorConfig) -> anyhow::Result<ServiceAuth> {
    let node_token = match args
        .node_token_file
        .as_ref()
        .or(cfg.auth.node_token_file.as_ref())
    {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("reading the node token {}", path.display()))?
                .trim()
                .to_string(),
        ),
        None => None,
    };
    let node_ca_pem = match args
        .node_ca_file
        .as_ref()
        .or(cfg.auth.node_ca_file.as_ref())
    {
        Some(path) => {
            let pem = std::fs::read(path)
                .with_context(|| format!("reading the node CA file {}", path.display()))?;
            let certs = ureq::tls::parse_pem(&pem)
                .filter(|i| matches!(i, Ok(ureq::tls::PemItem::Certificate(_))))
                .count();
            if certs == 0 {
                bail!("{} holds no PEM certificate", path.display());
            }
            Some(pem)
        }
        None => None,
    };
    if args.no_auth {
        tracing::warn!(
            "--no-auth: every caller may route, register and publish events (experiments only)"
        );
        return Ok(ServiceAuth {
            keyring: None,
            node_token,
            node_ca_pem,
        });
    }
    if cfg.auth.token_keys.is_empty() {
        bail!(
            "no token keys: add [[auth.token_keys]] (kid, secret or public key) to the --config \
             file so callers can be authenticated, or start with --no-auth"
        );
    }
    let mut keyring = yutu_api::token::Keyring::default();
    for key in &cfg.auth.token_keys {
        key.add_to(&mut keyring, |p| std::fs::read(p))
            .context("[[auth.token_keys]]")?;
    }
    Ok(ServiceAuth {
        keyring: Some(keyring),
        node_token,
        node_ca_pem,
    })
}

#[derive(Debug, Args)]
struct SimulateArgs {
    /// Trace in Mooncake's format (JSON lines).
    #[arg(long, value_name = "FILE")]
    trace: PathBuf,
    /// Prefill instances (each with its own storage node and cache).
    #[arg(long, default_value_t = 8)]
    prefill: usize,
    /// Decode instances.
    #[arg(long, default_value_t = 8)]
    decode: usize,
    /// Cache capacity of each prefill instance's node, in tokens (`3M`, `500K`, `3000000`).
    #[arg(long, default_value = "3M", value_parser = parse_count)]
    cache_tokens: u64,
    /// Divide arrival times by this, to create overload.
    #[arg(long, default_value_t = 1.0)]
    speed: f64,
    /// `all`, or a comma-separated list of policies.
    #[arg(long, default_value = "all")]
    policy: String,
    /// Eviction policy of the simulated caches: lru or fifo.
    #[arg(long, default_value = "lru")]
    eviction: Eviction,
    /// Delay between a node storing blocks and the conductor hearing of it.
    #[arg(long, default_value_t = 100.0)]
    event_delay_ms: f64,
    /// KV tokens one decode instance can hold.
    #[arg(long, default_value = "1.5M", value_parser = parse_count)]
    decode_max_tokens: u64,
    /// Only the first N requests of the trace.
    #[arg(long)]
    limit: Option<usize>,
    /// Write the report as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write an SVG chart (hit ratio and TTFT per policy, load over time).
    #[arg(long, value_name = "FILE")]
    chart: Option<PathBuf>,
    #[command(flatten)]
    routing: RoutingArgs,
}

/// `3M`, `1.5M`, `500K`, `2G` (decimal) or a plain count.
fn parse_count(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1e3),
        Some((i, 'm' | 'M')) => (&t[..i], 1e6),
        Some((i, 'g' | 'G')) => (&t[..i], 1e9),
        _ => (t, 1.0),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a count like 3M, 500K or 3000000"))?;
    if !(v.is_finite() && v >= 0.0) || v * mult > u64::MAX as f64 {
        return Err(format!("{s:?} is out of range"));
    }
    Ok((v * mult).round() as u64)
}

/// The config file, then the flags over it.
fn resolve_config(args: &RoutingArgs) -> anyhow::Result<ConductorConfig> {
    let mut cfg = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?
        }
        None => ConductorConfig::default(),
    };
    if let Some(b) = args.block_tokens {
        if b == 0 {
            bail!("--block-tokens must be at least 1");
        }
        cfg.block_tokens = b;
    }
    if let Some(v) = args.ttft_slo_ms {
        cfg.ttft_slo_ms = Some(v);
    }
    if let Some(v) = args.tbt_slo_ms {
        cfg.tbt_slo_ms = Some(v);
    }
    if args.no_early_rejection {
        cfg.early_rejection = Some(false);
    }
    if let Some(p) = &args.prefill_model {
        cfg.cost.prefill = prefill_poly(p).context("--prefill-model")?;
    }
    if let Some(p) = &args.decode_model {
        cfg.cost.decode_step = decode_poly(p).context("--decode-model")?;
    }
    Ok(cfg)
}

fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_env("YUTU_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    init_logging(args.log_format);
    let mut cfg = resolve_config(&args.routing)?;
    if let Some(p) = args.policy {
        cfg.policy = p;
    }
    if !args.etcd.is_empty() {
        cfg.cluster.etcd = args.etcd.clone();
    }
    if let Some(name) = &args.cluster {
        cfg.cluster.name = name.clone();
    }
    if cfg.cluster.name.is_empty() || cfg.cluster.name.contains('/') {
        bail!("the cluster name must be non-empty and without '/'");
    }
    let watch = if cfg.cluster.enabled() {
        Some(MembershipWatch::new(&cfg.cluster, cfg.max_nodes).context("--etcd")?)
    } else {
        None
    };
    let auth = service_auth(&args, &cfg)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&args.listen)
            .await
            .with_context(|| format!("binding {}", args.listen))?;
        let addr = listener.local_addr()?;
        tracing::info!(policy = %cfg.policy, "starting yutu-conductor {}", env!("CARGO_PKG_VERSION"));
        let cluster = cfg.cluster.name.clone();
        let shared = Shared::with_auth(Conductor::new(cfg), ServiceLimits::default(), auth);
        if let Some(watch) = watch {
            tracing::info!(etcd = ?watch.endpoints(), %cluster, "following the cluster membership in etcd");
            tokio::spawn(watch.run(shared.clone()));
        }
        tracing::info!(%addr, "listening on {addr}");
        tokio::select! {
            _ = service::serve(listener, shared) => {}
            r = tokio::signal::ctrl_c() => {
                r.context("waiting for Ctrl-C")?;
                tracing::info!("shutting down");
            }
        }
        Ok(())
    })
}

fn simulate(args: SimulateArgs) -> anyhow::Result<()> {
    let conductor = resolve_config(&args.routing)?;
    let policies: Vec<Policy> = if args.policy == "all" {
        Policy::ALL.to_vec()
    } else {
        args.policy
            .split(',')
            .map(|p| p.trim().parse::<Policy>())
            .collect::<Result<_, _>>()?
    };
    if !(args.speed.is_finite() && args.speed > 0.0) {
        bail!("--speed must be a positive number");
    }
    let trace = Trace::load(&args.trace, args.limit)?;
    let cfg = SimConfig {
        prefill: args.prefill.max(1),
        decode: args.decode.max(1),
        cache_tokens: args.cache_tokens,
        eviction: args.eviction,
        speed: args.speed,
        event_delay_ms: args.event_delay_ms,
        decode_max_tokens: args.decode_max_tokens,
        conductor,
        ..SimConfig::default()
    };
    let started = std::time::Instant::now();
    let report = sim::simulate(&trace, &cfg, &policies);
    print!("{}", report.table());
    eprintln!(
        "simulated {} policies in {:.2} s",
        policies.len(),
        started.elapsed().as_secs_f64()
    );
    if let Some(path) = &args.json {
        let mut text = serde_json::to_string_pretty(&report)?;
        text.push('\n');
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(path) = &args.chart {
        std::fs::write(path, sim::chart::render(&report))
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Simulate(args)) => simulate(args),
        Some(Command::Serve(args)) => serve(args),
        None => serve(cli.serve),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_endpoints_are_comma_separated() {
        let cli = Cli::try_parse_from([
            "yutu-conductor",
            "serve",
            "--etcd",
            "http://e1:2379,http://e2:2379",
            "--cluster",
            "prod",
        ])
        .expect("parses");
        let Some(Command::Serve(args)) = cli.command else {
            panic!("serve");
        };
        assert_eq!(args.etcd, ["http://e1:2379", "http://e2:2379"]);
        assert_eq!(args.cluster.as_deref(), Some("prod"));
        let cli = Cli::try_parse_from(["yutu-conductor"]).expect("parses");
        assert!(cli.serve.etcd.is_empty(), "no etcd unless asked");
    }

    #[test]
    fn counts_accept_suffixes() {
        assert_eq!(parse_count("3M"), Ok(3_000_000));
        assert_eq!(parse_count("1.5M"), Ok(1_500_000));
        assert_eq!(parse_count("500K"), Ok(500_000));
        assert_eq!(parse_count("42"), Ok(42));
        assert!(parse_count("lots").is_err());
        assert!(parse_count("-1").is_err());
    }
}
