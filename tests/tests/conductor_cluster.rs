//! The conductor following a real cluster in a real etcd (`--etcd`): three real storage nodes
//! register under their leases, two of them publish KV events to a real conductor.
//!
//! What it shows:
//! - every node appears in the conductor with its URL from etcd alone (node2 never registers
//!   with the conductor nor publishes to it);
//! - a SIGKILLed node is dropped once its lease (3 s here) expires: its blocks are no longer
//!   routed to, and nothing it held is offered as a pull source;
//! - the node started again (same name, new run) is resynced from its snapshot, and blocks it
//!   holds after the restart are routed to it again;
//! - a node restarted so fast that its key never leaves etcd (only `started_ms` changes) is
//!   resynced on etcd's word alone when it publishes nothing, and either way when it does;
//! - while etcd is down, the conductor keeps the last membership and keeps routing on it.
//!
//! - a change in etcd reaches the conductor through its watch, long before the next periodic
//!   read (resync and poll intervals of a minute here: without the watch, nothing would move
//!   within the test's deadline).
//!
//! No sleeps: every wait is on a condition with a deadline.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use yutu_api::block_hash::{BlockHash, BlockHasher};
use yutu_api::cluster::{member_key, Member};
use yutu_api::token::{issue, Claims, ConductorScope, SigningKey};
use yutu_tests::cluster::TestCluster;
use yutu_tests::etcd::Etcd;
use yutu_tests::server::wait_until;
use yutu_tests::{bin_path, Server};

/// The conductor's own token key (callers' tokens: the nodes' and the test's).
const SECRET: &str = "conductor-secret-of-this-test-0123456789";
/// Blocks in the test's prefix, all owned by node0.
const BLOCKS: usize = 3;
const WAIT: Duration = Duration::from_secs(30);

fn token(sub: &str, scopes: &[ConductorScope]) -> String {
    let claims = Claims {
        conductor: scopes.to_vec(),
        ..Claims::new(sub, Duration::from_secs(3600))
    };
    issue(
        &claims,
        "conductor",
        &SigningKey::Secret(SECRET.as_bytes().to_vec()),
    )
    .expect("sign a token")
}

/// The conductor, following the cluster in `etcd`, fetching snapshots with an admin token of
/// the nodes.
fn start_conductor(dir: &Path, etcd: &str) -> Server {
    start_conductor_with(dir, etcd, "")
}

/// The same, with `cluster` as the config's `[cluster]` table.
fn start_conductor_with(dir: &Path, etcd: &str, cluster: &str) -> Server {
    let config = dir.join("conductor.toml");
    std::fs::write(
        &config,
        format!(
            "[[auth.token_keys]]\nkid = \"conductor\"\nsecret = \"{SECRET}\"\n[cluster]\n{cluster}\n"
        ),
    )
    .expect("write the conductor config");
    let node_admin = dir.join("node-admin.token");
    std::fs::write(&node_admin, TestCluster::admin_token()).expect("write the token");
    let mut cmd = Command::new(bin_path("yutu-conductor"));
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--etcd", etcd])
        .args(["--cluster", "yutu", "--config"])
        .arg(&config)
        .arg("--node-token-file")
        .arg(&node_admin)
        .env("YUTU_LOG", "info");
    Server::spawn(cmd, tempfile::tempdir().expect("temp dir"))
}

struct Conductor {
    server: Server,
    /// Route and events scopes: everything the test calls.
    auth: String,
}

impl Conductor {
    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let r = self.server.client().send(
            "POST",
            path,
            &[
                ("content-type", "application/json"),
                ("authorization", &self.auth),
            ],
            Some(body.to_string().as_bytes()),
        );
        (
            r.status,
            serde_json::from_slice(&r.body).unwrap_or(Value::Null),
        )
    }

    fn nodes(&self) -> Vec<Value> {
        let r =
            self.server
                .client()
                .send("GET", "/v1/nodes", &[("authorization", &self.auth)], None);
        serde_json::from_slice::<Value>(&r.body)
            .ok()
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default()
    }

    fn node(&self, name: &str) -> Value {
        self.nodes()
            .into_iter()
            .find(|n| n["node"] == name)
            .unwrap_or(Value::Null)
    }

    /// A dry-run decision for `tokens`.
    fn route(&self, tokens: &[u32]) -> Value {
        let (status, d) = self.post(
            "/v1/route",
            &json!({"bucket": "llama", "token_ids": tokens, "output_length": 10, "dry_run": true}),
        );
        assert_eq!(status, 200, "{d}");
        d
    }

    /// Whether `tokens` go to p0 with the whole prefix cached there.
    fn routed_to_p0(&self, tokens: &[u32]) -> bool {
        let d = self.route(tokens);
        d["prefill"]["instance"] == "p0" && d["cached_blocks"] == BLOCKS as u64
    }

    /// Whether nothing of `tokens` is cached anywhere or offered from anywhere.
    fn cached_nowhere(&self, tokens: &[u32]) -> bool {
        let d = self.route(tokens);
        d["cached_blocks"] == 0 && d["pull"].is_null()
    }

    /// One series of the metrics page (`name` or `name{labels}`), 0 if absent.
    fn metric(&self, series: &str) -> f64 {
        let text = self.server.client().get("/metrics").text();
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0.0)
    }

    fn epoch(&self, name: &str) -> u64 {
        self.node(name)["epoch"].as_u64().unwrap_or(0)
    }

    /// Waits until `name` is a member again in a run newer than `after`, resynced.
    fn wait_resynced(&self, name: &str, after: u64) {
        assert!(
            wait_until(WAIT, || {
                let n = self.node(name);
                n["departed"] == false
                    && n["resyncing"] == false
                    && n["epoch"].as_u64().is_some_and(|e| e > after)
            }),
            "{name} was not resynced: {}\nconductor log:\n{}",
            self.node(name),
            self.server.log()
        );
    }
}

/// A prompt whose first [`BLOCKS`] blocks are all owned by `owner` among `members` (one
/// replica): found by trying prompts, about 3^BLOCKS of them.
fn prompt_owned_by(
    owner: &str,
    members: &[yutu_api::cluster::Member],
) -> (Vec<u32>, Vec<BlockHash>) {
    let hasher = BlockHasher::new(512);
    for seed in 0..100_000u32 {
        let tokens: Vec<u32> = (0..BLOCKS as u32 * 512)
            .map(|i| i.wrapping_mul(31).wrapping_add(seed.wrapping_mul(7919)) + 1)
            .collect();
        let blocks = hasher.hash_tokens(&tokens);
        let all_there = blocks.iter().all(|b| {
            yutu_api::cluster::owners("llama", &b.to_key(), members, 1)
                .first()
                .is_some_and(|&i| members[i].name == owner)
        });
        if all_there {
            return (tokens, blocks);
        }
    }
    panic!("no prompt whose blocks are all owned by {owner}");
}

/// Stores `blocks` through node `via` (which forwards them to their owner).
fn put_blocks(c: &TestCluster, via: usize, blocks: &[BlockHash]) {
    for (i, b) in blocks.iter().enumerate() {
        let r = c.alice(
            via,
            "PUT",
            &format!("/llama/{}", b.to_key()),
            &[i as u8; 4096],
        );
        assert_eq!(r.status, 200, "{}", r.text());
    }
}

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("node{i}")).collect()
}

/// Waits until every node lists all three members, node `i` at its current URL (after a
/// restart within the lease, the others may still list its previous run for a moment).
fn wait_all_see(c: &TestCluster, i: usize) {
    let url = c.node(i).url.clone();
    for j in 0..3 {
        c.wait_members(j, &names(3));
        assert!(
            wait_until(WAIT, || c.membership(j).is_some_and(|m| m
                .members
                .iter()
                .any(|m| m.name == format!("node{i}") && m.url == url))),
            "node{j} does not see node{i} at {url}"
        );
    }
}

#[test]
fn the_conductor_follows_the_cluster_membership_in_etcd() {
    // etcd first (no node yet): the conductor needs its URL, the nodes the conductor's.
    let mut c = TestCluster::start(0, &[]);
    let etcd = c.etcd.url.clone();
    let dir = tempfile::tempdir().expect("temp dir");
    let conductor = Conductor {
        server: start_conductor(dir.path(), &etcd),
        auth: format!(
            "Bearer {}",
            token("test", &[ConductorScope::Route, ConductorScope::Events])
        ),
    };
    let publisher = dir.path().join("events.token");
    std::fs::write(&publisher, token("nodes", &[ConductorScope::Events])).expect("token file");
    let publisher = publisher.to_string_lossy().into_owned();
    let publish = [
        "--conductor",
        conductor.server.url.as_str(),
        "--conductor-token-file",
        publisher.as_str(),
    ];
    // node0 and node1 publish KV events; node2 only joins the cluster.
    for i in 0..3 {
        let args: &[&str] = if i < 2 { &publish } else { &[] };
        let node = c.spawn_with_etcd(i, &etcd, args);
        c.push_node(node);
    }
    for i in 0..3 {
        c.wait_members(i, &names(3));
    }

    // Every node is known with its URL, node2 from etcd alone.
    assert!(
        wait_until(WAIT, || (0..3).all(|i| {
            let n = conductor.node(&format!("node{i}"));
            n["url"] == c.node(i).url.as_str() && n["departed"] == false
        })),
        "the conductor does not list the members: {:?}\nlog:\n{}",
        conductor.nodes(),
        conductor.server.log()
    );
    assert_eq!(conductor.metric("yutu_conductor_cluster_members"), 3.0);

    for reg in [
        json!({"id": "p0", "role": "prefill", "node": "node0"}),
        json!({"id": "p1", "role": "prefill", "node": "node1"}),
        json!({"id": "p2", "role": "prefill", "node": "node2"}),
        json!({"id": "d0", "role": "decode"}),
    ] {
        let (status, body) = conductor.post("/v1/instances", &reg);
        assert_eq!(status, 200, "{body}");
    }
    let r = c.alice(0, "PUT", "/llama", b"");
    assert_eq!(r.status, 200, "{}", r.text());
    let members = c.membership(1).expect("membership").members;
    let (tokens, blocks) = prompt_owned_by("node0", &members);

    // node0 holds the prefix (written through node1, forwarded to its owner).
    put_blocks(&c, 1, &blocks);
    assert_eq!(c.holders(&format!("/llama/{}", blocks[0].to_key())), [0]);
    assert!(
        wait_until(WAIT, || conductor.routed_to_p0(&tokens)),
        "never routed to node0's prefix: {}",
        conductor.route(&tokens)
    );

    // SIGKILL: the key stays until the lease expires, then node0 is dropped.
    let first_epoch = conductor.epoch("node0");
    assert!(first_epoch > 0);
    c.kill(0);
    assert!(
        wait_until(WAIT, || conductor.node("node0")["departed"] == true),
        "node0 never left: {}\nlog:\n{}",
        conductor.node("node0"),
        conductor.server.log()
    );
    assert_eq!(conductor.node("node0")["blocks"], 0);
    assert!(
        conductor.cached_nowhere(&tokens),
        "a departed node's blocks still draw requests: {}",
        conductor.route(&tokens)
    );
    assert_eq!(
        conductor.metric("yutu_conductor_member_changes_total{change=\"left\"}"),
        1.0
    );
    assert_eq!(conductor.metric("yutu_conductor_cluster_members"), 2.0);
    // The log is read from the child's stderr by a thread, so it can trail the API.
    assert!(wait_until(WAIT, || conductor
        .server
        .log()
        .contains("node left the cluster")));

    // node0 starts again (DRAM only: empty). Its own pushes are ignored while it is out of
    // the membership; its return to etcd is what resyncs it.
    c.restart(0, &publish);
    conductor.wait_resynced("node0", first_epoch);
    assert!(conductor.metric("yutu_conductor_resyncs_total{reason=\"rejoin\"}") >= 1.0);
    wait_all_see(&c, 0);
    put_blocks(&c, 2, &blocks);
    assert!(
        wait_until(WAIT, || conductor.routed_to_p0(&tokens)),
        "the rejoined node0's blocks are not routed to: {}\nnodes: {:?}\nlog:\n{}",
        conductor.route(&tokens),
        conductor.nodes(),
        conductor.server.log()
    );

    // A restart so fast that node0's key never leaves etcd, and this time without publishing
    // events: the new run in etcd is all the conductor hears of it. The old run's blocks are
    // dropped and the new run is resynced from its snapshot.
    let rejoins = "yutu_conductor_resyncs_total{reason=\"rejoin\"}";
    let (second_epoch, before) = (conductor.epoch("node0"), conductor.metric(rejoins));
    c.restart(0, &[]);
    conductor.wait_resynced("node0", second_epoch);
    assert!(
        conductor.cached_nowhere(&tokens),
        "the blocks of node0's previous run still draw requests: {}",
        conductor.route(&tokens)
    );
    assert!(conductor.metric(rejoins) > before);

    // Once more, publishing: whichever the conductor sees first, the new run in etcd or the
    // node's first push, the new run is resynced and what it stores is routed to it.
    let third_epoch = conductor.epoch("node0");
    c.restart(0, &publish);
    conductor.wait_resynced("node0", third_epoch);
    wait_all_see(&c, 0);
    put_blocks(&c, 1, &blocks);
    assert!(
        wait_until(WAIT, || conductor.routed_to_p0(&tokens)),
        "the restarted node0's blocks are not routed to: {}",
        conductor.route(&tokens)
    );

    // etcd goes down: reads fail, the membership and the routing stay.
    let errors = "yutu_conductor_etcd_errors_total{kind=\"unreachable\"}";
    let before = conductor.metric(errors);
    c.etcd.kill();
    assert!(
        wait_until(WAIT, || conductor.metric(errors) >= before + 4.0),
        "etcd errors are not counted"
    );
    assert_eq!(conductor.metric("yutu_conductor_etcd_reachable"), 0.0);
    assert_eq!(conductor.metric("yutu_conductor_cluster_members"), 3.0);
    assert!(conductor.nodes().iter().all(|n| n["departed"] == false));
    assert!(
        conductor.routed_to_p0(&tokens),
        "{}",
        conductor.route(&tokens)
    );
    assert!(conductor
        .server
        .log()
        .contains("cannot read the cluster membership from etcd"));
    c.etcd.restart();
    assert!(
        wait_until(WAIT, || conductor.metric("yutu_conductor_etcd_reachable")
            == 1.0
            && conductor.metric("yutu_conductor_cluster_members") == 3.0),
        "the conductor does not read etcd again\nlog:\n{}",
        conductor.server.log()
    );
}

/// A member record as a node writes it, for a node that is not running.
fn member(name: &str, started_ms: u64) -> Vec<u8> {
    serde_json::to_vec(&Member {
        name: name.into(),
        // Nothing listens there: the resync it asks for stays pending, which is all this needs.
        url: "http://127.0.0.1:9".into(),
        transfer: None,
        zone: None,
        memory: 1 << 30,
        nvme: 0,
        shards: 1,
        started_ms,
        draining: false,
        instance: "test".into(),
    })
    .expect("a member record")
}

#[test]
fn a_change_in_etcd_reaches_the_conductor_through_the_watch() {
    /// Well under the resync and poll intervals below.
    const FAST: Duration = Duration::from_secs(10);
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let conductor = Conductor {
        server: start_conductor_with(dir.path(), &etcd.url, "poll_ms = 60000\nresync_ms = 60000"),
        auth: format!(
            "Bearer {}",
            token("test", &[ConductorScope::Route, ConductorScope::Events])
        ),
    };
    let starts = "yutu_conductor_etcd_watch_starts_total";
    let wakeups = "yutu_conductor_etcd_watch_wakeups_total";
    assert!(
        wait_until(FAST, || conductor.metric(starts) >= 1.0),
        "the watch never started; log:\n{}",
        conductor.server.log()
    );
    let reads = conductor.metric("yutu_conductor_etcd_reads_total");
    assert_eq!(conductor.metric(wakeups), 0.0);

    // A node joins: known within the deadline, through one wake-up and one read.
    let key = member_key("yutu", "w1");
    etcd.put(&key, &member("w1", 7));
    assert!(
        wait_until(FAST, || conductor.node("w1")["departed"] == false),
        "the joined member never showed: {:?}\nlog:\n{}",
        conductor.nodes(),
        conductor.server.log()
    );
    assert!(conductor.metric(wakeups) >= 1.0);
    assert!(conductor.metric("yutu_conductor_etcd_reads_total") > reads);

    // Its key goes (a revoked lease): it departs as fast.
    etcd.delete(&key);
    assert!(
        wait_until(FAST, || conductor.node("w1")["departed"] == true),
        "the departed member is still listed: {}\nlog:\n{}",
        conductor.node("w1"),
        conductor.server.log()
    );
    assert!(conductor.metric(wakeups) >= 2.0);
    assert_eq!(conductor.metric(starts), 1.0, "one watch did it all");
}
