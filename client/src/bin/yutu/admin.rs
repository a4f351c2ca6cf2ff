//! `yutu admin ...`: the storage admin API through `yutu_client::AdminClient`.
//!
//! Every subcommand prints a short human report by default (tables for `nodes`, `stats` and
//! `status`) and, with `--json`, the answer document of `yutu_api::admin` and nothing else, so
//! that scripts read exactly what the node sent. `drain --wait` and `status --wait` poll
//! `status` until the work is done or `--timeout` passes (then fail), with a progress bar on a
//! terminal only.

use std::io::Write;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{ArgGroup, Args, Subcommand};
use serde::Serialize;
use yutu_api::admin::{
    DrainResponse, EvictRequest, EvictResponse, NodeState, NodeStats, NodesResponse, PinRequest,
    PinResponse, ReplicateRequest, ReplicateResponse, ShardStats, StatusResponse, Usage,
};
use yutu_client::{AdminClient, AdminError, ClientError};

use crate::format::{human_bytes, table};
use crate::progress;
use crate::sink::Stdout;
use crate::target::Target;

/// How often `--wait` asks for the status: often enough that a finished drain is reported
/// at once, rarely enough that the fan-out to every member costs nothing.
const POLL_INTERVAL: Duration = Duration::from_millis(500);

#[derive(Debug, Args)]
pub struct AdminArgs {
    /// Print the answer document as JSON instead of the human report.
    #[arg(long, global = true)]
    json: bool,

    #[command(subcommand)]
    command: AdminCommand,
}

#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Every member: state, zone, DRAM and NVMe used/capacity, objects in DRAM, hit ratio.
    Nodes,
    /// Per node and per shard: usage, objects, hits and misses, evictions, pins.
    Stats,
    /// Remove objects from every node and tier (hard-pinned ones stay): one key
    /// (BUCKET/KEY), every key under a prefix (BUCKET --prefix P) or a whole bucket (BUCKET);
    /// or free DRAM on one node (--node NAME --free 512MiB), least recently used first.
    #[command(group(ArgGroup::new("what").required(true).args(["target", "free"])))]
    Evict {
        /// BUCKET or BUCKET/KEY.
        target: Option<String>,
        /// Every key of BUCKET under this prefix.
        #[arg(long, requires = "target")]
        prefix: Option<String>,
        /// The node whose DRAM --free frees.
        #[arg(long, conflicts_with = "target")]
        node: Option<String>,
        /// Bytes of DRAM to free on --node (512MiB, 1GiB, 1000000...).
        #[arg(long, value_name = "BYTES", requires = "node")]
        free: Option<String>,
    },
    /// Keep BUCKET/KEY (or every key of BUCKET under --prefix) in DRAM: never evicted until
    /// unpinned, or with --soft-ttl evicted only when nothing else can be, for SECS seconds.
    Pin {
        /// BUCKET/KEY, or BUCKET with --prefix.
        target: String,
        #[arg(long)]
        prefix: Option<String>,
        /// A soft pin lasting this many seconds.
        #[arg(long, value_name = "SECS")]
        soft_ttl: Option<u64>,
    },
    /// Clear the pins (hard and soft) of BUCKET/KEY or of BUCKET --prefix P.
    Unpin {
        /// BUCKET/KEY, or BUCKET with --prefix.
        target: String,
        #[arg(long)]
        prefix: Option<String>,
    },
    /// Put extra copies of BUCKET/KEY (or of every key under --prefix) on N nodes in all
    /// (--replicas N) or on one named node (--node NAME). They last until the next
    /// membership change.
    #[command(group(ArgGroup::new("placement").required(true).args(["replicas", "node"])))]
    Replicate {
        /// BUCKET/KEY, or BUCKET with --prefix.
        target: String,
        #[arg(long)]
        prefix: Option<String>,
        /// Nodes to hold a copy, the owners included.
        #[arg(long, value_name = "N")]
        replicas: Option<u32>,
        /// The node to copy to.
        #[arg(long, value_name = "NAME")]
        node: Option<String>,
    },
    /// Move every key off NODE (it owns nothing new), or with --cancel let it own keys again.
    Drain {
        node: String,
        /// Stop draining NODE.
        #[arg(long, conflicts_with = "wait")]
        cancel: bool,
        /// Wait until NODE is drained (a progress bar of the objects moved on a terminal).
        #[arg(long)]
        wait: bool,
        /// How long --wait waits before failing.
        #[arg(long, value_name = "SECS", default_value_t = 600)]
        timeout: u64,
    },
    /// What is in motion: members, nodes rebalancing, under-replicated and re-replicated
    /// keys, drains and the objects they still have to move.
    Status {
        /// Wait until nothing rebalances and no key is under-replicated.
        #[arg(long)]
        wait: bool,
        /// How long --wait waits before failing.
        #[arg(long, value_name = "SECS", default_value_t = 600)]
        timeout: u64,
    },
}

/// Keeps a server's refusal reachable by `describe` (which looks for a `ClientError` in the
/// chain), as `kv` does.
fn admin_err(e: AdminError) -> anyhow::Error {
    match e {
        AdminError::Client(c) => c.into(),
        other => other.into(),
    }
}

/// Runs an admin subcommand. `anonymous`: no token and no access keys were given, so a
/// refusal says what is missing rather than only that access is denied.
pub fn run(admin: &AdminClient, args: AdminArgs, anonymous: bool) -> Result<()> {
    run_command(admin, args).map_err(|e| if anonymous { hint_anonymous(e) } else { e })
}

/// An `AccessDenied` of a request sent without credentials, with what to give instead.
fn hint_anonymous(e: anyhow::Error) -> anyhow::Error {
    let denied = e
        .chain()
        .find_map(|c| match c.downcast_ref::<ClientError>() {
            Some(ClientError::S3 { code, message, .. }) if code == "AccessDenied" => {
                Some(format!("{code}: {message}"))
            }
            _ => None,
        });
    match denied {
        Some(line) => anyhow::anyhow!(
            "{line} (no credentials were given: pass an admin token with --token or \
             YUTU_TOKEN, or an admin user's access keys)"
        ),
        None => e,
    }
}

fn run_command(admin: &AdminClient, args: AdminArgs) -> Result<()> {
    let json = args.json;
    match args.command {
        AdminCommand::Nodes => {
            let nodes = admin.nodes().map_err(admin_err)?;
            emit(json, &nodes, || nodes_table(&nodes))
        }
        AdminCommand::Stats => {
            let stats = admin.stats().map_err(admin_err)?;
            emit(json, &stats, || stats_table(&stats))
        }
        AdminCommand::Evict {
            target,
            prefix,
            node,
            free,
        } => {
            let req = evict_request(target.as_deref(), prefix, node, free.as_deref())?;
            let answer = admin.evict(&req).map_err(admin_err)?;
            emit(json, &answer, || vec![evict_line(&answer)])
        }
        AdminCommand::Pin {
            target,
            prefix,
            soft_ttl,
        } => {
            let (bucket, key, prefix) = keys(&target, prefix)?;
            let req = PinRequest {
                bucket,
                key,
                prefix,
                ttl_secs: soft_ttl,
            };
            let answer = admin.pin(&req).map_err(admin_err)?;
            emit(json, &answer, || vec![pin_line(&answer, true, soft_ttl)])
        }
        AdminCommand::Unpin { target, prefix } => {
            let (bucket, key, prefix) = keys(&target, prefix)?;
            let req = PinRequest {
                bucket,
                key,
                prefix,
                ttl_secs: None,
            };
            let answer = admin.unpin(&req).map_err(admin_err)?;
            emit(json, &answer, || vec![pin_line(&answer, false, None)])
        }
        AdminCommand::Replicate {
            target,
            prefix,
            replicas,
            node,
        } => {
            let (bucket, key, prefix) = keys(&target, prefix)?;
            let req = ReplicateRequest {
                bucket,
                key,
                prefix,
                replicas,
                node,
            };
            let answer = admin.replicate(&req).map_err(admin_err)?;
            emit(json, &answer, || vec![replicate_line(&answer)])
        }
        AdminCommand::Drain {
            node,
            cancel,
            wait,
            timeout,
        } => {
            let answer = if cancel {
                admin.cancel_drain(&node)
            } else {
                admin.drain(&node)
            }
            .map_err(admin_err)?;
            if !wait {
                return emit(json, &answer, || vec![drain_line(&answer, None)]);
            }
            let moved = wait_drained(admin, &node, Duration::from_secs(timeout))?;
            let done = DrainResponse {
                node,
                state: NodeState::Drained,
            };
            emit(json, &done, || vec![drain_line(&done, Some(moved))])
        }
        AdminCommand::Status { wait, timeout } => {
            let status = if wait {
                wait_settled(admin, Duration::from_secs(timeout))?
            } else {
                admin.status().map_err(admin_err)?
            };
            emit(json, &status, || status_report(&status))
        }
    }
}

/// Prints `doc` as JSON, or the human report `lines`. A closed stdout (`| head`) is the
/// reader being done, not a failure.
fn emit<T: Serialize>(json: bool, doc: &T, lines: impl FnOnce() -> Vec<String>) -> Result<()> {
    let lines = if json {
        vec![serde_json::to_string_pretty(doc).context("encoding the answer as JSON")?]
    } else {
        lines()
    };
    let mut out = Stdout::new();
    for line in lines {
        if writeln!(out, "{line}").is_err() && out.closed() {
            return Ok(());
        }
    }
    out.finish().context("writing to stdout")
}

/// The bucket and the key or prefix that `pin`, `unpin` and `replicate` act on: `BUCKET/KEY`,
/// or `BUCKET` with `--prefix P`.
fn keys(target: &str, prefix: Option<String>) -> Result<(String, Option<String>, Option<String>)> {
    let t = Target::parse(target)?;
    match (t.key.is_empty(), prefix) {
        (true, Some(p)) => Ok((t.bucket, None, Some(p))),
        (false, None) => Ok((t.bucket, Some(t.key), None)),
        (false, Some(_)) => bail!("give BUCKET/KEY or BUCKET --prefix P, not both"),
        (true, None) => bail!("{target:?} names no key: give BUCKET/KEY, or BUCKET --prefix P"),
    }
}

/// The request of `evict`: objects of a bucket (`BUCKET`, `BUCKET/KEY`, `BUCKET --prefix P`),
/// or `--free BYTES` of DRAM on `--node` (clap makes sure one of the two is given, whole).
fn evict_request(
    target: Option<&str>,
    prefix: Option<String>,
    node: Option<String>,
    free: Option<&str>,
) -> Result<EvictRequest> {
    if let Some(free) = free {
        let bytes = free.parse::<yutu_api::ByteSize>()?.0;
        if bytes == 0 {
            bail!("--free must be more than 0 bytes");
        }
        return Ok(EvictRequest {
            node,
            free_bytes: Some(bytes),
            ..EvictRequest::default()
        });
    }
    let Some(target) = target else {
        bail!("give BUCKET[/KEY], BUCKET --prefix P, or --node NAME --free BYTES");
    };
    let t = Target::parse(target)?;
    let key = (!t.key.is_empty()).then_some(t.key);
    if key.is_some() && prefix.is_some() {
        bail!("give BUCKET/KEY or BUCKET --prefix P, not both");
    }
    Ok(EvictRequest {
        bucket: Some(t.bucket),
        key,
        prefix,
        ..EvictRequest::default()
    })
}

/// Asks for the status until `step` says done, at most `timeout`; the answer `step` made
/// of the last status. A transient failure (a member that did not answer, a connection
/// refused) is retried until the deadline; any other is returned at once.
fn poll_until<S, T>(
    timeout: Duration,
    interval: Duration,
    mut poll: impl FnMut() -> Result<S, AdminError>,
    mut step: impl FnMut(&S) -> Result<T, String>,
) -> Result<T> {
    let start = Instant::now();
    let deadline = start + timeout;
    loop {
        let why = match poll() {
            Ok(s) => match step(&s) {
                Ok(done) => return Ok(done),
                Err(pending) => pending,
            },
            Err(e) if e.is_transient() => format!("the last status call failed: {e}"),
            Err(e) => return Err(admin_err(e)),
        };
        let now = Instant::now();
        if now >= deadline {
            bail!("timed out after {}: {why}", seconds(timeout));
        }
        thread::sleep(interval.min(deadline - now));
    }
}

fn seconds(d: Duration) -> String {
    format!("{}s", d.as_secs_f64().round() as u64)
}

/// `drain --wait`: polls until `node` is `drained`; how many objects moved out of those it
/// held at the first look.
fn wait_drained(admin: &AdminClient, node: &str, timeout: Duration) -> Result<u64> {
    let bar = progress::for_count(0, format!("draining {node}"));
    let mut drain = DrainWatch::default();
    let result = poll_until(
        timeout,
        POLL_INTERVAL,
        || admin.status(),
        |s| {
            let r = drain.step(node, s);
            bar.set_length(drain.start.unwrap_or(0));
            bar.set_position(drain.moved());
            r
        },
    );
    bar.finish_and_clear();
    result
}

/// What `drain --wait` has seen: the objects the node held at the first look, and now.
#[derive(Debug, Default)]
struct DrainWatch {
    start: Option<u64>,
    remaining: u64,
}

impl DrainWatch {
    fn moved(&self) -> u64 {
        self.start.unwrap_or(0).saturating_sub(self.remaining)
    }

    /// Done (the objects moved) when `node` is drained, else why not yet.
    fn step(&mut self, node: &str, s: &StatusResponse) -> Result<u64, String> {
        let Some(d) = s.drains.iter().find(|d| d.node == node) else {
            if s.unreachable.iter().any(|n| n == node) {
                return Err(format!("{node} does not answer"));
            }
            // The node has not seen the drain yet (it reads it from etcd).
            return Err(format!("{node} has not started draining"));
        };
        // New writes may still land while the drain starts: the bar's length grows with them.
        let start = self.start.get_or_insert(d.remaining);
        *start = (*start).max(d.remaining);
        self.remaining = d.remaining;
        match d.state {
            NodeState::Drained => Ok(self.moved()),
            NodeState::Up => Err(format!("{node} is up: its drain was cancelled")),
            state => Err(format!(
                "{node} is {}, {} left",
                state_name(state),
                plural(d.remaining, "object", "objects")
            )),
        }
    }
}

/// `status --wait`: polls until nothing rebalances and no key is under-replicated.
fn wait_settled(admin: &AdminClient, timeout: Duration) -> Result<StatusResponse> {
    let bar = progress::spinner("waiting for the cluster to settle".into());
    let result = poll_until(
        timeout,
        POLL_INTERVAL,
        || admin.status(),
        |s| {
            let r = settled(s);
            if let Err(why) = &r {
                bar.set_message(why.clone());
            }
            r
        },
    );
    bar.finish_and_clear();
    result
}

/// The status when nothing is in motion, else what still is.
fn settled(s: &StatusResponse) -> Result<StatusResponse, String> {
    let mut busy = Vec::new();
    if !s.rebalancing.is_empty() {
        busy.push(format!("rebalancing on {}", s.rebalancing.join(", ")));
    }
    if s.under_replicated > 0 {
        busy.push(format!("{} keys under-replicated", s.under_replicated));
    }
    if busy.is_empty() {
        Ok(s.clone())
    } else {
        Err(busy.join("; "))
    }
}

fn state_name(s: NodeState) -> &'static str {
    match s {
        NodeState::Up => "up",
        NodeState::Draining => "draining",
        NodeState::Drained => "drained",
        NodeState::Unreachable => "unreachable",
    }
}

/// `used/capacity`, or `-` for a tier the node does not have.
fn usage(u: Usage) -> String {
    if u.capacity == 0 && u.used == 0 {
        "-".into()
    } else {
        format!("{}/{}", human_bytes(u.used), human_bytes(u.capacity))
    }
}

/// Hits over GETs as a percentage, `-` before the first GET.
fn hit_ratio(shards: &[ShardStats]) -> String {
    let hits: u64 = shards.iter().map(|s| s.dram_hits + s.nvme_hits).sum();
    let misses: u64 = shards.iter().map(|s| s.misses).sum();
    if hits + misses == 0 {
        "-".into()
    } else {
        format!("{:.1}%", 100.0 * hits as f64 / (hits + misses) as f64)
    }
}

fn zone(n: &NodeStats) -> String {
    n.zone
        .clone()
        .filter(|z| !z.is_empty())
        .unwrap_or("-".into())
}

/// `nodes`: one row per member.
fn nodes_table(r: &NodesResponse) -> Vec<String> {
    let rows: Vec<Vec<String>> = r
        .nodes
        .iter()
        .map(|n| {
            vec![
                n.name.clone(),
                state_name(n.state).into(),
                zone(n),
                usage(n.dram()),
                usage(n.nvme()),
                n.objects().to_string(),
                hit_ratio(&n.shards),
            ]
        })
        .collect();
    table(
        &["NAME", "STATE", "ZONE", "DRAM", "NVME", "OBJECTS", "HIT"],
        &rows,
        &[5, 6],
    )
}

/// `stats`: a row per node (its shards summed, SHARD `all`), then one per shard.
fn stats_table(r: &NodesResponse) -> Vec<String> {
    let counts = |shards: &[ShardStats]| -> [u64; 7] {
        shards.iter().fold([0; 7], |a, s| {
            [
                a[0] + s.objects,
                a[1] + s.dram_hits,
                a[2] + s.nvme_hits,
                a[3] + s.misses,
                a[4] + s.evictions,
                a[5] + s.demotions,
                a[6] + s.pinned,
            ]
        })
    };
    let mut rows = Vec::new();
    for n in &r.nodes {
        let row = |shard: String, state: &str, dram, nvme, shards: &[ShardStats]| {
            let mut row = vec![n.name.clone(), shard, state.to_string(), usage(dram)];
            row.push(usage(nvme));
            row.extend(counts(shards).iter().map(u64::to_string));
            row.push(hit_ratio(shards));
            row
        };
        rows.push(row(
            "all".into(),
            state_name(n.state),
            n.dram(),
            n.nvme(),
            &n.shards,
        ));
        for s in &n.shards {
            rows.push(row(
                s.shard.to_string(),
                "-",
                s.dram,
                s.nvme,
                std::slice::from_ref(s),
            ));
        }
    }
    table(
        &[
            "NODE",
            "SHARD",
            "STATE",
            "DRAM",
            "NVME",
            "OBJECTS",
            "DRAM-HITS",
            "NVME-HITS",
            "MISSES",
            "EVICTIONS",
            "DEMOTIONS",
            "PINNED",
            "HIT",
        ],
        &rows,
        &[1, 5, 6, 7, 8, 9, 10, 11, 12],
    )
}

/// `status`: `Field: value` lines, then the drains as a table.
fn status_report(s: &StatusResponse) -> Vec<String> {
    let list = |names: &[String]| {
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    };
    let cluster = if s.cluster.is_empty() {
        "- (a single node)".to_string()
    } else {
        format!("{} (revision {})", s.cluster, s.revision)
    };
    let mut lines = vec![
        format!("Cluster:          {cluster}"),
        format!("Members:          {}", s.members),
        format!("Rebalancing:      {}", list(&s.rebalancing)),
        format!("Under-replicated: {} keys", s.under_replicated),
        format!(
            "Re-replicated:    {} keys, {}",
            s.rereplicated_keys,
            human_bytes(s.rereplicated_bytes)
        ),
        format!("Unreachable:      {}", list(&s.unreachable)),
    ];
    if s.drains.is_empty() {
        lines.push("Drains:           none".into());
    } else {
        lines.push("Drains:".into());
        let rows: Vec<Vec<String>> = s
            .drains
            .iter()
            .map(|d| {
                vec![
                    d.node.clone(),
                    state_name(d.state).into(),
                    d.remaining.to_string(),
                ]
            })
            .collect();
        lines.extend(
            table(&["NODE", "STATE", "REMAINING"], &rows, &[2])
                .into_iter()
                .map(|l| format!("  {l}")),
        );
    }
    lines
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn evict_line(r: &EvictResponse) -> String {
    let mut line = format!(
        "evicted {} ({})",
        plural(r.objects, "object", "objects"),
        human_bytes(r.bytes)
    );
    if r.pinned_skipped > 0 {
        line.push_str(&format!(
            "; {} hard-pinned left in place",
            plural(r.pinned_skipped, "object", "objects")
        ));
    }
    line
}

fn pin_line(r: &PinResponse, pinning: bool, soft_ttl: Option<u64>) -> String {
    let copies = plural(r.keys, "copy", "copies");
    match (pinning, soft_ttl) {
        (true, None) => format!("pinned {copies}"),
        (true, Some(ttl)) => format!("soft-pinned {copies} for {ttl}s"),
        (false, _) => format!("unpinned {copies}"),
    }
}

fn replicate_line(r: &ReplicateResponse) -> String {
    format!(
        "replicated {}: {} made ({})",
        plural(r.keys, "key", "keys"),
        plural(r.copies, "copy", "copies"),
        human_bytes(r.bytes)
    )
}

fn drain_line(r: &DrainResponse, moved: Option<u64>) -> String {
    match moved {
        Some(n) => format!(
            "{}: {} ({} moved)",
            r.node,
            state_name(r.state),
            plural(n, "object", "objects")
        ),
        None => format!("{}: {}", r.node, state_name(r.state)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use yutu_api::admin::DrainProgress;

    fn shard(shard: usize, used: u64, objects: u64, hits: u64, misses: u64) -> ShardStats {
        ShardStats {
            shard,
            dram: Usage {
                used,
                capacity: 32 << 20,
            },
            objects,
            dram_hits: hits,
            misses,
            ..ShardStats::default()
        }
    }

    fn node(name: &str, state: NodeState, shards: Vec<ShardStats>) -> NodeStats {
        NodeStats {
            name: name.into(),
            url: format!("http://{name}"),
            zone: None,
            state,
            shards,
            rebalancing: false,
            settled: true,
            rereplicated_keys: 0,
            rereplicated_bytes: 0,
            under_replicated: 0,
            handed_off: 0,
            reason: None,
        }
    }

    fn cluster() -> NodesResponse {
        NodesResponse {
            cluster: "c".into(),
            revision: 7,
            nodes: vec![
                node(
                    "node0",
                    NodeState::Up,
                    vec![shard(0, 1 << 20, 3, 9, 1), shard(1, 1 << 20, 2, 0, 0)],
                ),
                node("node12", NodeState::Unreachable, vec![]),
            ],
        }
    }

    #[test]
    fn nodes_table_is_aligned_and_human() {
        let lines = nodes_table(&cluster());
        assert_eq!(
            lines,
            vec![
                "NAME    STATE        ZONE  DRAM            NVME  OBJECTS    HIT",
                "node0   up           -     2.0MiB/64.0MiB  -           5  90.0%",
                "node12  unreachable  -     -               -           0      -",
            ]
        );
    }

    #[test]
    fn stats_table_has_node_and_shard_rows() {
        let lines = stats_table(&cluster());
        assert_eq!(lines.len(), 1 + 3 + 1, "{lines:#?}");
        assert!(lines[0].starts_with("NODE    SHARD  STATE"), "{}", lines[0]);
        let fields: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            &fields[..6],
            ["node0", "all", "up", "2.0MiB/64.0MiB", "-", "5"]
        );
        let fields: Vec<&str> = lines[3].split_whitespace().collect();
        assert_eq!(
            &fields[..6],
            ["node0", "1", "-", "1.0MiB/32.0MiB", "-", "2"]
        );
        let fields: Vec<&str> = lines[4].split_whitespace().collect();
        assert_eq!(&fields[..4], ["node12", "all", "unreachable", "-"]);
        // Every row as wide as the header: the columns line up.
        assert!(lines.iter().all(|l| l.len() == lines[0].len()));
    }

    #[test]
    fn status_report_lists_what_moves() {
        let s = StatusResponse {
            cluster: "prod".into(),
            revision: 42,
            members: 3,
            rebalancing: vec!["node0".into(), "node2".into()],
            under_replicated: 4,
            rereplicated_keys: 10,
            rereplicated_bytes: 3 << 20,
            drains: vec![DrainProgress {
                node: "node2".into(),
                state: NodeState::Draining,
                remaining: 12,
            }],
            unreachable: vec![],
        };
        let lines = status_report(&s);
        assert_eq!(
            lines,
            vec![
                "Cluster:          prod (revision 42)",
                "Members:          3",
                "Rebalancing:      node0, node2",
                "Under-replicated: 4 keys",
                "Re-replicated:    10 keys, 3.0MiB",
                "Unreachable:      none",
                "Drains:",
                "  NODE   STATE     REMAINING",
                "  node2  draining         12",
            ]
        );
        let quiet = status_report(&StatusResponse::default());
        assert!(quiet.contains(&"Drains:           none".to_string()));
        assert!(quiet[0].contains("single node"));
    }

    #[test]
    fn one_line_reports() {
        let e = EvictResponse {
            objects: 1,
            bytes: 4096,
            pinned_skipped: 2,
        };
        assert_eq!(
            evict_line(&e),
            "evicted 1 object (4.0KiB); 2 objects hard-pinned left in place"
        );
        let p = PinResponse { keys: 2 };
        assert_eq!(pin_line(&p, true, None), "pinned 2 copies");
        assert_eq!(pin_line(&p, true, Some(60)), "soft-pinned 2 copies for 60s");
        assert_eq!(pin_line(&p, false, None), "unpinned 2 copies");
        let r = ReplicateResponse {
            keys: 1,
            copies: 2,
            bytes: 18,
        };
        assert_eq!(replicate_line(&r), "replicated 1 key: 2 copies made (18B)");
        let d = DrainResponse {
            node: "node2".into(),
            state: NodeState::Drained,
        };
        assert_eq!(
            drain_line(&d, Some(90)),
            "node2: drained (90 objects moved)"
        );
    }

    #[test]
    fn key_or_prefix() {
        assert_eq!(
            keys("b/k/x", None).unwrap(),
            ("b".into(), Some("k/x".into()), None)
        );
        assert_eq!(
            keys("s3://b", Some("p/".into())).unwrap(),
            ("b".into(), None, Some("p/".into()))
        );
        assert!(keys("b/k", Some("p/".into())).is_err());
        assert!(keys("b", None).is_err());
    }

    #[test]
    fn evict_requests() {
        let r = evict_request(Some("b/k"), None, None, None).unwrap();
        assert_eq!(
            (r.bucket.as_deref(), r.key.as_deref()),
            (Some("b"), Some("k"))
        );
        let r = evict_request(Some("b"), Some("p/".into()), None, None).unwrap();
        assert_eq!((r.key, r.prefix.as_deref()), (None, Some("p/")));
        let r = evict_request(Some("b"), None, None, None).unwrap();
        assert_eq!((r.key, r.prefix), (None, None));
        let r = evict_request(None, None, Some("node1".into()), Some("512MiB")).unwrap();
        assert_eq!(r.free_bytes, Some(512 << 20));
        assert_eq!(r.node.as_deref(), Some("node1"));
        assert_eq!(r.bucket, None);
        let bad = evict_request(None, None, Some("n".into()), Some("12XB")).unwrap_err();
        assert!(bad.to_string().contains("invalid size \"12XB\""), "{bad}");
        assert!(evict_request(None, None, Some("n".into()), Some("0")).is_err());
        assert!(evict_request(Some("b/k"), Some("p".into()), None, None).is_err());
    }

    fn drains(state: NodeState, remaining: u64) -> StatusResponse {
        StatusResponse {
            drains: vec![DrainProgress {
                node: "node2".into(),
                state,
                remaining,
            }],
            ..StatusResponse::default()
        }
    }

    #[test]
    fn drain_watch_counts_objects_moved() {
        let mut w = DrainWatch::default();
        assert!(w
            .step("node2", &StatusResponse::default())
            .unwrap_err()
            .contains("not started"));
        let why = w
            .step("node2", &drains(NodeState::Draining, 90))
            .unwrap_err();
        assert_eq!(why, "node2 is draining, 90 objects left");
        assert_eq!(
            w.step("node2", &drains(NodeState::Draining, 30)),
            Err("node2 is draining, 30 objects left".into())
        );
        assert_eq!(w.moved(), 60);
        assert_eq!(w.step("node2", &drains(NodeState::Drained, 0)), Ok(90));
        let mut w = DrainWatch::default();
        assert!(w
            .step("node2", &drains(NodeState::Up, 3))
            .unwrap_err()
            .contains("cancelled"));
    }

    #[test]
    fn settled_means_nothing_moves() {
        assert!(settled(&StatusResponse::default()).is_ok());
        let busy = StatusResponse {
            rebalancing: vec!["node1".into()],
            under_replicated: 3,
            ..StatusResponse::default()
        };
        assert_eq!(
            settled(&busy).unwrap_err(),
            "rebalancing on node1; 3 keys under-replicated"
        );
    }

    fn refused(status: u16) -> AdminError {
        AdminError::Client(ClientError::S3 {
            status,
            code: "X".into(),
            message: "m".into(),
        })
    }

    #[test]
    fn anonymous_refusals_say_what_is_missing() {
        let denied = anyhow::Error::new(ClientError::S3 {
            status: 403,
            code: "AccessDenied".into(),
            message: "The admin API needs an admin user or an admin token.".into(),
        });
        let line = hint_anonymous(denied).to_string();
        assert!(
            line.starts_with("AccessDenied: The admin API needs"),
            "{line}"
        );
        assert!(line.contains("--token"), "{line}");
        let other = hint_anonymous(anyhow::Error::new(refused(400)));
        assert_eq!(other.to_string(), "X: m");
    }

    #[test]
    fn polling_retries_transient_failures_until_done() {
        let calls = Cell::new(0);
        let done = poll_until(
            Duration::from_secs(5),
            Duration::from_millis(1),
            || {
                calls.set(calls.get() + 1);
                match calls.get() {
                    1 => Err(refused(503)),
                    n => Ok(n),
                }
            },
            |&n| {
                if n >= 4 {
                    Ok(n * 10)
                } else {
                    Err("busy".into())
                }
            },
        )
        .unwrap();
        assert_eq!(done, 40);
    }

    #[test]
    fn polling_stops_at_a_refusal() {
        let e = poll_until(
            Duration::from_secs(5),
            Duration::from_millis(1),
            || Err::<(), _>(refused(403)),
            |_| Ok(()),
        )
        .unwrap_err();
        assert!(e.to_string().contains("X: m"), "{e}");
    }

    #[test]
    fn polling_times_out_with_the_reason() {
        let e = poll_until(
            Duration::from_millis(30),
            Duration::from_millis(5),
            || Ok(()),
            |_| Err::<(), _>("node2 is draining, 3 objects left".into()),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "timed out after 0s: node2 is draining, 3 objects left"
        );
    }
}
