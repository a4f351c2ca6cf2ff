//! The `cluster` suite: three real `yutu-server` nodes on a real etcd, on this machine,
//! against one node of the same size measured in the same run.
//!
//! - `kv_put_64KiB` / `kv_get_64KiB`: `KvClient` (which routes each key to its owner) putting
//!   and reading batches of 64 KiB blocks for `--duration-secs`; blocks per second. Reference:
//!   the same client on one node (no cluster). On a machine with fewer cores than nodes the
//!   nodes share the cores, so the ratio says what routing costs, not what more machines buy.
//! - `s3_get_4KiB_forwarded`: p50 of S3 GETs of a 4 KiB object sent to a node that does not
//!   own it (one forwarding hop); reference: the same GETs sent to the owner. The ratio is
//!   the forwarding cost.
//! - `failover_first_read_ms`: SIGKILL of a node, then the time until the first successful
//!   read (through a survivor) of a key the dead node owned first (2 replicas); reference: the
//!   lease TTL, which is what waiting for the membership to notice would cost.
//! - `rereplication_MBps`: after that kill, bytes copied to new owners over the time from the
//!   membership change until every object is on two survivors again; reference:
//!   `--rereplicate-rate`.
//! - `rejoin_repair_MBps` (and `rejoin_repair_s`): two nodes with an NVMe tier and a `disk`
//!   bucket of 2 replicas holding `--repair-mib` MiB (1 MiB objects); one node stops, every
//!   object is overwritten through the other, and the stopped node restarts on its data
//!   directory with all of it stale. Measured: from its restart until anti-entropy has it
//!   caught up (`yutu_cluster_caught_up 1`), checked by reading every object's version from
//!   it; reference: `--rereplicate-rate`, the most repair may send.
//!
//! Needs Debian's `etcd` on the PATH (`scripts/install-bench-deps.sh`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Args;
use yutu_api::admin::StatusResponse;
use yutu_api::cluster::Membership;

use crate::child::ChildGuard;
use crate::report::{BenchResult, Machine, Reference, Report};
use crate::tempdir::TempDir;

const BUCKET: &str = "clusterbench";
const HA_BUCKET: &str = "clusterha";
const START_TIMEOUT: Duration = Duration::from_secs(30);
const LEASE_TTL_SECS: u64 = 3;
const REREPLICATE_RATE: u64 = 256 << 20;

#[derive(Debug, Clone, Args)]
pub struct ClusterArgs {
    /// Seconds measured per side of the throughput cases.
    #[arg(long, default_value_t = 4)]
    pub duration_secs: u64,
    /// Nodes in the cluster.
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// DRAM of each node (and of the reference node).
    #[arg(long, default_value = "512MiB")]
    pub memory: String,
    /// Keys per KV batch.
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Distinct 64 KiB keys the throughput cases cycle over.
    #[arg(long, default_value_t = 1024)]
    pub keys: usize,
    /// MiB written (in 256 KiB objects, 2 replicas) before the failover case.
    #[arg(long, default_value_t = 192)]
    pub failover_mib: usize,
    /// S3 GETs per side of the forwarding case.
    #[arg(long, default_value_t = 2000)]
    pub gets: usize,
    /// MiB of stale data a node rejoins with in the repair case (0: skip the case).
    #[arg(long, default_value_t = 1024)]
    pub repair_mib: usize,
}

pub async fn run(args: &ClusterArgs) -> anyhow::Result<Report> {
    tokio::task::block_in_place(|| run_blocking(args))
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A running etcd on free loopback ports.
struct Etcd {
    _child: ChildGuard,
    url: String,
}

fn start_etcd(dir: &Path) -> anyhow::Result<Etcd> {
    let (client, peer) = (free_port()?, free_port()?);
    let url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let mut cmd = Command::new("etcd");
    cmd.arg("--data-dir")
        .arg(dir.join("etcd"))
        .args(["--name", "bench", "--listen-client-urls", &url])
        .args([
            "--advertise-client-urls",
            &url,
            "--listen-peer-urls",
            &peer_url,
        ])
        .args(["--initial-advertise-peer-urls", &peer_url])
        .args(["--initial-cluster", &format!("bench={peer_url}")]);
    let (child, _lines) = ChildGuard::spawn("etcd", &mut cmd)
        .context("starting etcd (install it with scripts/install-bench-deps.sh)")?;
    let addr: SocketAddr = format!("127.0.0.1:{client}").parse()?;
    let deadline = Instant::now() + START_TIMEOUT;
    while http(addr, "GET", "/health", &[], b"").ok().map(|(s, _)| s) != Some(200) {
        if Instant::now() > deadline {
            bail!("etcd did not become healthy at {url}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(Etcd { _child: child, url })
}

/// A running node.
struct Node {
    child: ChildGuard,
    addr: SocketAddr,
    _dir: TempDir,
}

fn start_node(bin: &Path, etcd: Option<&str>, name: &str, memory: &str) -> anyhow::Result<Node> {
    let dir = TempDir::new_in(&std::env::temp_dir(), "yutu-bench-cluster-")?;
    start_node_in(bin, etcd, name, memory, dir, &["--nvme-capacity", "0"])
}

fn start_node_in(
    bin: &Path,
    etcd: Option<&str>,
    name: &str,
    memory: &str,
    dir: TempDir,
    extra: &[&str],
) -> anyhow::Result<Node> {
    let mut cmd = Command::new(bin);
    cmd.args(["--no-auth", "--listen", "127.0.0.1:0", "--memory", memory])
        .args(["--shards", "1", "--node-name", name])
        .args(["--lease-ttl-secs", &LEASE_TTL_SECS.to_string()])
        .args(extra)
        .arg("--data-dir")
        .arg(dir.path())
        .env("NO_COLOR", "1");
    if let Some(url) = etcd {
        cmd.args(["--etcd", url]);
    }
    let (mut child, lines) = ChildGuard::spawn("yutu-server", &mut cmd)?;
    let deadline = Instant::now() + START_TIMEOUT;
    let addr = loop {
        if Instant::now() > deadline {
            bail!("{name} did not start; output:\n{}", child.tail());
        }
        match lines.recv_timeout(Duration::from_millis(100)) {
            Ok(line) => {
                if let Some(a) = crate::yutu::parse_listening(&line) {
                    break a;
                }
            }
            Err(_) => child.check_running()?,
        }
    };
    Ok(Node {
        child,
        addr,
        _dir: dir,
    })
}

/// One HTTP/1.1 request on a fresh connection: (status, body).
fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> anyhow::Result<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes())?;
    s.write_all(body)?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let mut hs = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut hs);
    let head = match resp.parse(&raw)? {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial => bail!("a partial answer from {addr}"),
    };
    Ok((resp.code.unwrap_or(0), raw[head..].to_vec()))
}

fn membership(addr: SocketAddr) -> anyhow::Result<Membership> {
    let (status, body) = http(addr, "GET", "/v1/cluster", &[], b"")?;
    if status != 200 {
        bail!("GET /v1/cluster answered {status}");
    }
    Ok(serde_json::from_slice(&body)?)
}

fn wait_members(addr: SocketAddr, n: usize) -> anyhow::Result<Membership> {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Ok(m) = membership(addr) {
            if m.members.len() == n {
                return Ok(m);
            }
        }
        if Instant::now() > deadline {
            bail!("the cluster did not reach {n} members");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn create_bucket(addr: SocketAddr, bucket: &str, replicas: Option<u32>) -> anyhow::Result<()> {
    let r = replicas.map(|n| n.to_string());
    let headers: Vec<(&str, &str)> = r
        .as_deref()
        .map(|n| vec![("x-yutu-replicas", n)])
        .unwrap_or_default();
    let (status, body) = http(addr, "PUT", &format!("/{bucket}"), &headers, b"")?;
    if status != 200 {
        bail!(
            "creating {bucket}: {status} {}",
            String::from_utf8_lossy(&body)
        );
    }
    Ok(())
}

/// Blocks per second of puts, then of gets, through one `KvClient` on `url`.
fn kv_rates(url: &str, args: &ClusterArgs) -> anyhow::Result<(f64, f64)> {
    const BLOCK: u64 = 64 << 10;
    let kv = yutu_client::kv::KvClient::new(url, yutu_client::kv::KvOptions::default())?;
    let buf = kv.register(2 * args.batch as u64 * BLOCK)?;
    buf.write_at(0, &vec![7u8; 2 * args.batch * BLOCK as usize])?;
    let keys: Vec<String> = (0..args.keys).map(|i| format!("b{i}")).collect();
    let put_offsets: Vec<u64> = (0..args.batch as u64).map(|i| i * BLOCK).collect();
    let get_offsets: Vec<u64> = (0..args.batch as u64)
        .map(|i| (args.batch as u64 + i) * BLOCK)
        .collect();
    let lens = vec![BLOCK; args.batch];
    let batches: Vec<&[String]> = keys.chunks(args.batch).collect();
    // Every key once, unmeasured, so the gets find them all.
    for b in &batches {
        kv.batch_put_from(BUCKET, b, &buf, &put_offsets[..b.len()], &lens[..b.len()])?;
    }
    let duration = Duration::from_secs(args.duration_secs);
    let measure = |put: bool| -> anyhow::Result<f64> {
        let started = Instant::now();
        let mut blocks = 0usize;
        let mut i = 0;
        while started.elapsed() < duration {
            let b = batches[i % batches.len()];
            if put {
                kv.batch_put_from(BUCKET, b, &buf, &put_offsets[..b.len()], &lens[..b.len()])?;
            } else {
                let got = kv.batch_get_into(BUCKET, b, &buf, &get_offsets[..b.len()])?;
                if got.iter().any(Option::is_none) {
                    bail!("a block was missing");
                }
            }
            blocks += b.len();
            i += 1;
        }
        Ok(blocks as f64 / started.elapsed().as_secs_f64())
    };
    Ok((measure(true)?, measure(false)?))
}

fn p50(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn row(name: &str, value: f64, unit: &str, reference: &str, ref_value: f64) -> BenchResult {
    BenchResult {
        name: name.into(),
        value: Some(value),
        unit: unit.into(),
        p50_us: None,
        p99_us: None,
        mb_per_s: None,
        errors: None,
        reference: Some(Reference {
            name: reference.into(),
            value: ref_value,
            p50_us: None,
            p99_us: None,
            mb_per_s: None,
            errors: None,
        }),
        ratio: None,
        target: None,
    }
    .with_ratio()
}

fn run_blocking(args: &ClusterArgs) -> anyhow::Result<Report> {
    if args.nodes < 2 || args.batch == 0 || args.keys < args.batch || args.duration_secs == 0 {
        bail!("the cluster suite needs 2+ nodes, a batch of 1+ keys and keys >= batch");
    }
    let bin = crate::yutu::locate_binary()?;
    let dir = TempDir::new_in(&std::env::temp_dir(), "yutu-bench-cluster-")?;
    let mut results = Vec::new();

    eprintln!("reference: one node");
    let (solo_put, solo_get) = {
        let solo = start_node(&bin, None, "solo", &args.memory)?;
        create_bucket(solo.addr, BUCKET, None)?;
        kv_rates(&format!("http://{}", solo.addr), args)?
    };

    let etcd = start_etcd(dir.path())?;
    let mut nodes = Vec::new();
    for i in 0..args.nodes {
        nodes.push(Some(start_node(
            &bin,
            Some(&etcd.url),
            &format!("n{i}"),
            &args.memory,
        )?));
    }
    let addr = |nodes: &Vec<Option<Node>>, i: usize| nodes[i].as_ref().map(|n| n.addr);
    let first = addr(&nodes, 0).context("node 0")?;
    let view = wait_members(first, args.nodes)?;
    eprintln!("cluster of {} nodes up", view.members.len());
    create_bucket(first, BUCKET, Some(1))?;
    let (put, get) = kv_rates(&format!("http://{first}"), args)?;
    results.push(row("kv_put_64KiB", put, "blocks/s", "one node", solo_put));
    results.push(row("kv_get_64KiB", get, "blocks/s", "one node", solo_get));

    // Forwarding: one 4 KiB object, GETs to its owner and to a non-owner, alternating.
    let (status, _) = http(first, "PUT", &format!("/{BUCKET}/fwd"), &[], &[1u8; 4096])?;
    if status != 200 {
        bail!("PUT of the forwarding object answered {status}");
    }
    let view = membership(first)?;
    let owner = yutu_api::cluster::owners(BUCKET, "fwd", &view.members, 1)[0];
    let owner_name = view.members[owner].name.clone();
    let idx = |name: &str| name.trim_start_matches('n').parse::<usize>().unwrap_or(0);
    let owner_addr = addr(&nodes, idx(&owner_name)).context("owner")?;
    let other = (0..args.nodes)
        .find(|&i| i != idx(&owner_name))
        .context("a non-owner")?;
    let other_addr = addr(&nodes, other).context("non-owner")?;
    let mut direct = Vec::new();
    let mut forwarded = Vec::new();
    let one = |a: SocketAddr, out: &mut Vec<f64>| -> anyhow::Result<()> {
        let t = Instant::now();
        let (status, body) = http(a, "GET", &format!("/{BUCKET}/fwd"), &[], b"")?;
        if status != 200 || body.len() != 4096 {
            bail!("GET answered {status} with {} bytes", body.len());
        }
        out.push(t.elapsed().as_secs_f64() * 1e6);
        Ok(())
    };
    for _ in 0..args.gets {
        one(owner_addr, &mut direct)?;
        one(other_addr, &mut forwarded)?;
    }
    let mut r = row(
        "s3_get_4KiB_forwarded",
        p50(forwarded.clone()),
        "us p50",
        "to the owner",
        p50(direct.clone()),
    );
    r.p50_us = Some(p50(forwarded));
    if let Some(reference) = &mut r.reference {
        reference.p50_us = Some(p50(direct));
    }
    results.push(r);

    // Failover and re-replication: 2 replicas, then the node owning most keys first dies.
    create_bucket(first, HA_BUCKET, Some(2))?;
    let objects = (args.failover_mib * 4).max(8);
    let value = vec![3u8; 256 << 10];
    for k in 0..objects {
        let (status, _) = http(first, "PUT", &format!("/{HA_BUCKET}/o{k}"), &[], &value)?;
        if status != 200 {
            bail!("PUT of o{k} answered {status}");
        }
    }
    let victim = 1;
    let victim_name = format!("n{victim}");
    let affected = (0..objects)
        .map(|k| format!("o{k}"))
        .find(|k| {
            let o = yutu_api::cluster::owners(HA_BUCKET, k, &view.members, 2);
            view.members[o[0]].name == victim_name
        })
        .context("a key the victim owns first")?;
    let survivor = addr(&nodes, 0).context("survivor")?;
    let before: StatusResponse = {
        let (_, body) = http(survivor, "GET", "/admin/v1/status", &[], b"")?;
        serde_json::from_slice(&body)?
    };
    if let Some(mut n) = nodes[victim].take() {
        n.child.kill();
    }
    let killed = Instant::now();
    loop {
        let (status, _) = http(
            survivor,
            "GET",
            &format!("/{HA_BUCKET}/{affected}"),
            &[],
            b"",
        )?;
        if status == 200 {
            break;
        }
        if killed.elapsed() > Duration::from_secs(60) {
            bail!("no read of {affected} succeeded within a minute of the kill");
        }
    }
    let failover_ms = killed.elapsed().as_secs_f64() * 1e3;
    results.push(row(
        "failover_first_read_ms",
        failover_ms,
        "ms",
        "lease TTL",
        (LEASE_TTL_SECS * 1000) as f64,
    ));
    // The membership change, then until every object is on two survivors again (each
    // survivor asked for its own copy).
    wait_members(survivor, args.nodes - 1)?;
    let changed = Instant::now();
    let survivors: Vec<SocketAddr> = nodes.iter().flatten().map(|n| n.addr).collect();
    let mut pending: Vec<usize> = (0..objects).collect();
    while !pending.is_empty() {
        let mut still = Vec::new();
        for &k in &pending {
            let mut copies = 0;
            for a in &survivors {
                let (status, _) = http(
                    *a,
                    "HEAD",
                    &format!("/{HA_BUCKET}/o{k}"),
                    &[("x-yutu-forwarded", "bench")],
                    b"",
                )?;
                copies += usize::from(status == 200);
            }
            if copies < 2 {
                still.push(k);
            }
        }
        pending = still;
        if changed.elapsed() > Duration::from_secs(120) {
            bail!("re-replication did not finish within two minutes");
        }
    }
    let took = changed.elapsed();
    let after: StatusResponse = {
        let (_, body) = http(survivor, "GET", "/admin/v1/status", &[], b"")?;
        serde_json::from_slice(&body)?
    };
    let bytes = after.rereplicated_bytes - before.rereplicated_bytes;
    let mbps = bytes as f64 / (1 << 20) as f64 / took.as_secs_f64();
    let mut r = row(
        "rereplication_MBps",
        mbps,
        "MiB/s",
        "--rereplicate-rate",
        (REREPLICATE_RATE >> 20) as f64,
    );
    r.mb_per_s = Some(mbps);
    results.push(r);
    drop(nodes);
    if args.repair_mib > 0 {
        results.extend(rejoin_repair(&bin, &etcd.url, args)?);
    }
    Ok(Report {
        suite: "cluster".into(),
        notes: Default::default(),
        skipped: None,
        machine: Machine::detect(),
        results,
    })
}

/// A metric's value from a node's `/metrics` (0 when absent).
fn metric(addr: SocketAddr, name: &str) -> anyhow::Result<f64> {
    let (_, body) = http(addr, "GET", "/metrics", &[], b"")?;
    Ok(String::from_utf8_lossy(&body)
        .lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// The ETag a node holds itself for `path` (a HEAD it serves locally).
fn local_etag(addr: SocketAddr, path: &str) -> anyhow::Result<Option<String>> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(
        stream,
        "HEAD {path} HTTP/1.1\r\nHost: {addr}\r\nx-yutu-forwarded: bench\r\nConnection: close\r\n\r\n"
    )?;
    let mut head = String::new();
    stream.read_to_string(&mut head)?;
    if !head.starts_with("HTTP/1.1 200") {
        return Ok(None);
    }
    Ok(head.lines().find_map(|l| {
        l.to_ascii_lowercase()
            .strip_prefix("etag:")
            .map(|v| v.trim().to_string())
    }))
}

/// The rejoin case (see the module doc): a node comes back with `--repair-mib` of stale data.
fn rejoin_repair(bin: &Path, etcd: &str, args: &ClusterArgs) -> anyhow::Result<Vec<BenchResult>> {
    const REPAIR_BUCKET: &str = "repairha";
    let objects = args.repair_mib.max(1);
    let nvme = format!("{}MiB", objects * 2 + 512);
    let extra = ["--nvme-capacity", nvme.as_str(), "--cluster", "repairbench"];
    let dir_a = TempDir::new_in(&std::env::temp_dir(), "yutu-bench-repair-")?;
    let dir_b = TempDir::new_in(&std::env::temp_dir(), "yutu-bench-repair-")?;
    let a = start_node_in(bin, Some(etcd), "ra", "256MiB", dir_a, &extra)?;
    let mut b = Some(start_node_in(
        bin,
        Some(etcd),
        "rb",
        "256MiB",
        dir_b,
        &extra,
    )?);
    wait_members(a.addr, 2)?;
    let (status, body) = http(
        a.addr,
        "PUT",
        &format!("/{REPAIR_BUCKET}"),
        &[("x-yutu-replicas", "2"), ("x-yutu-durability", "disk")],
        b"",
    )?;
    if status != 200 {
        bail!(
            "creating {REPAIR_BUCKET} answered {status}: {}",
            String::from_utf8_lossy(&body)
        );
    }
    eprintln!("repair: writing {objects} MiB on two nodes");
    let old = vec![1u8; 1 << 20];
    for k in 0..objects {
        let (status, _) = http(a.addr, "PUT", &format!("/{REPAIR_BUCKET}/o{k}"), &[], &old)?;
        if status != 200 {
            bail!("PUT of o{k} answered {status}");
        }
    }
    // Stop rb gracefully (its data stays), overwrite everything through ra alone.
    let dir_b = match b.take() {
        Some(Node { child, _dir, .. }) => {
            // SIGTERM, and the wait for it to exit (the data directory stays).
            drop(child);
            _dir
        }
        None => bail!("rb is not running"),
    };
    wait_members(a.addr, 1)?;
    eprintln!("repair: overwriting {objects} MiB while rb is away");
    let new = vec![2u8; 1 << 20];
    let mut fresh = Vec::with_capacity(objects);
    for k in 0..objects {
        let path = format!("/{REPAIR_BUCKET}/o{k}");
        let (status, _) = http(a.addr, "PUT", &path, &[], &new)?;
        if status != 200 {
            bail!("overwrite of o{k} answered {status}");
        }
        fresh.push(local_etag(a.addr, &path)?.context("ra holds what it acknowledged")?);
    }
    let restarted = Instant::now();
    let b = start_node_in(bin, Some(etcd), "rb", "256MiB", dir_b, &extra)?;
    let deadline = Duration::from_secs(600);
    while metric(b.addr, "yutu_cluster_caught_up")? < 1.0 {
        if restarted.elapsed() > deadline {
            bail!("rb did not catch up within {deadline:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let took = restarted.elapsed();
    for (k, etag) in fresh.iter().enumerate() {
        let held = local_etag(b.addr, &format!("/{REPAIR_BUCKET}/o{k}"))?;
        if held.as_deref() != Some(etag.as_str()) {
            bail!("rb caught up but holds {held:?} of o{k}, not {etag}");
        }
    }
    let mib = objects as f64;
    let mbps = mib / took.as_secs_f64();
    let mut r = row(
        "rejoin_repair_MBps",
        mbps,
        "MiB/s",
        "--rereplicate-rate",
        (REREPLICATE_RATE >> 20) as f64,
    );
    r.mb_per_s = Some(mbps);
    let s = row(
        &format!("rejoin_repair_{objects}MiB_s"),
        took.as_secs_f64(),
        "s",
        "--rereplicate-rate",
        mib / (REREPLICATE_RATE >> 20) as f64,
    );
    Ok(vec![r, s])
}
