//! `yutu admin` and `yutu mb --replicas` against a real cluster: the real `yutu` binary, three
//! real nodes on a real etcd, an admin token. What the CLI reports is checked against what the
//! nodes hold (`holders`, `local_get`), not only against its own output.

use std::process::{Command, Output};
use std::time::Duration;

use yutu_api::admin::{
    EvictResponse, NodeState, NodesResponse, PinResponse, ReplicateResponse, StatusResponse,
};
use yutu_tests::cluster::TestCluster;
use yutu_tests::server::wait_until;
use yutu_tests::Reply;

/// How `yutu` authenticates in a call.
enum As {
    Admin,
    Nobody,
    Alice,
}

/// Runs `yutu --url <node i> ...` with nothing from the caller's environment that could
/// authenticate it but what `who` says.
fn yutu_as(c: &TestCluster, i: usize, who: As, args: &[&str]) -> Output {
    let mut cmd = Command::new(yutu_tests::bin_path("yutu"));
    for var in [
        "YUTU_TOKEN",
        "YUTU_URL",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_PROFILE",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials");
    cmd.arg("--url").arg(&c.node(i).url);
    match who {
        As::Admin => {
            cmd.arg("--token").arg(TestCluster::admin_token());
        }
        As::Nobody => {}
        As::Alice => {
            cmd.args(["--access-key", "ALICEKEY", "--secret-key", "alice-secret"]);
        }
    }
    cmd.args(args).output().expect("run yutu")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `yutu` as the admin through node `i`; must succeed with nothing on stderr. Its stdout.
fn ok(c: &TestCluster, i: usize, args: &[&str]) -> String {
    let out = yutu_as(c, i, As::Admin, args);
    assert!(
        out.status.success(),
        "yutu {args:?} failed: {}",
        text(&out.stderr)
    );
    assert!(out.stderr.is_empty(), "stderr: {}", text(&out.stderr));
    text(&out.stdout)
}

/// `yutu ... --json` as the admin: its stdout is exactly one JSON document.
fn json<T: serde::de::DeserializeOwned>(c: &TestCluster, i: usize, args: &[&str]) -> T {
    let mut all = args.to_vec();
    all.push("--json");
    let out = ok(c, i, &all);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("yutu {args:?}: {e}: {out:?}"))
}

/// A failing `yutu`: exit status 1, nothing on stdout, one line on stderr. That line.
fn fails(out: Output, args: &str) -> String {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "yutu {args}: {err}");
    assert!(out.stdout.is_empty(), "yutu {args}: {}", text(&out.stdout));
    assert_eq!(err.lines().count(), 1, "yutu {args}: {err:?}");
    assert!(err.starts_with("yutu: "), "{err}");
    err
}

fn put(c: &TestCluster, i: usize, path: &str, body: &[u8]) -> Reply {
    let auth = format!("Bearer {}", TestCluster::admin_token());
    c.node(i)
        .client()
        .send("PUT", path, &[("authorization", &auth)], Some(body))
}

fn get(c: &TestCluster, i: usize, path: &str) -> Reply {
    let auth = format!("Bearer {}", TestCluster::admin_token());
    c.node(i)
        .client()
        .send("GET", path, &[("authorization", &auth)], None)
}

/// The whole admin surface on one cluster (three nodes take a while to start): bucket
/// replicas, nodes, stats, status, pin, unpin, evict, replicate, and last (it changes the
/// placement) drain with --wait.
#[test]
fn admin_commands_act_on_the_whole_cluster() {
    let c = TestCluster::start(3, &[]);

    // mb --replicas: the membership carries the bucket's replica count.
    ok(&c, 0, &["mb", "bkt", "--replicas", "2"]);
    // Every node learns it from etcd.
    let replicas = |i: usize| {
        c.membership(i)
            .and_then(|m| m.buckets.into_iter().find(|b| b.bucket == "bkt"))
            .map(|b| b.replicas)
    };
    for i in 0..3 {
        let seen = wait_until(Duration::from_secs(10), || replicas(i) == Some(2));
        assert!(seen, "node{i} sees bkt with {:?} replicas", replicas(i));
    }
    ok(
        &c,
        0,
        &["mb", "mem", "--replicas", "1", "--durability", "memory"],
    );

    // nodes: three members, all up; the human table names them in aligned rows.
    let nodes: NodesResponse = json(&c, 1, &["admin", "nodes"]);
    let names: Vec<&str> = nodes.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["node0", "node1", "node2"]);
    assert!(nodes.nodes.iter().all(|n| n.state == NodeState::Up));
    let table = ok(&c, 1, &["admin", "nodes"]);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 4, "{table}");
    assert!(lines[0].starts_with("NAME"), "{table}");
    for (i, line) in lines[1..].iter().enumerate() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(fields[..2], [format!("node{i}").as_str(), "up"], "{table}");
        // The DRAM column: used/capacity, in binary units.
        assert!(fields[3].ends_with("/64.0MiB"), "{table}");
    }

    // Some objects, written through every node.
    let keys: Vec<(String, Vec<u8>)> = (0..40u64)
        .map(|k| {
            let path = format!("/bkt/k{k}");
            let body = yutu_tests::pattern(2000 + k as usize, k);
            let r = put(&c, (k % 3) as usize, &path, &body);
            assert_eq!(r.status, 200, "{}", r.text());
            (path, body)
        })
        .collect();
    for (p, _) in &keys {
        assert_eq!(c.holders(p).len(), 2, "{p}");
    }

    // stats: a row per node and one per shard (the harness starts nodes with 2 shards).
    let stats = ok(&c, 2, &["admin", "stats"]);
    let rows: Vec<Vec<&str>> = stats
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 3 * 3, "{stats}");
    let objects: u64 = rows
        .iter()
        .filter(|r| r[1] == "all")
        .map(|r| r[5].parse::<u64>().expect("OBJECTS is a number"))
        .sum();
    assert_eq!(objects, 2 * keys.len() as u64, "{stats}");
    let stats: NodesResponse = json(&c, 2, &["admin", "stats"]);
    assert!(stats.nodes.iter().all(|n| n.shards.len() == 2));

    // status: three members, nothing in motion.
    let status: StatusResponse = json(&c, 0, &["admin", "status", "--wait", "--timeout", "60"]);
    assert_eq!(status.members, 3);
    assert!(status.drains.is_empty() && status.rebalancing.is_empty());
    let report = ok(&c, 0, &["admin", "status"]);
    assert!(report.contains("Members:          3"), "{report}");
    assert!(report.contains("Drains:           none"), "{report}");

    // pin: both copies of a key; a pinned key is not evicted; unpinned it is.
    let pinned: PinResponse = json(&c, 0, &["admin", "pin", "bkt/k0"]);
    assert_eq!(pinned.keys, 2);
    assert_eq!(
        ok(&c, 0, &["admin", "pin", "bkt/k1"]).trim(),
        "pinned 2 copies"
    );
    let evicted: EvictResponse = json(&c, 1, &["admin", "evict", "bkt/k0"]);
    assert_eq!((evicted.objects, evicted.pinned_skipped), (0, 2));
    assert_eq!(c.holders("/bkt/k0").len(), 2);
    // Unpin counts the pins cleared: every node records a key's pin, holding a copy or not.
    let unpinned: PinResponse = json(&c, 2, &["admin", "unpin", "bkt/k0"]);
    assert!(unpinned.keys >= 2, "{unpinned:?}");
    let soft = ok(
        &c,
        0,
        &["admin", "pin", "bkt", "--prefix", "k3", "--soft-ttl", "60"],
    );
    assert!(soft.starts_with("soft-pinned "), "{soft}");
    ok(&c, 0, &["admin", "unpin", "bkt", "--prefix", "k3"]);
    ok(&c, 0, &["admin", "unpin", "bkt/k1"]);

    // evict BUCKET/KEY: gone from every node.
    let line = ok(&c, 1, &["admin", "evict", "bkt/k0"]);
    assert!(line.starts_with("evicted 2 objects"), "{line}");
    assert_eq!(c.holders("/bkt/k0"), Vec::<usize>::new());
    assert_eq!(get(&c, 0, "/bkt/k0").status, 404);
    let keys: Vec<(String, Vec<u8>)> = keys.into_iter().skip(1).collect();

    // replicate --replicas 3: the key on every node, the same bytes.
    let replicated: ReplicateResponse =
        json(&c, 2, &["admin", "replicate", "bkt/k5", "--replicas", "3"]);
    // Each owner of the key does its part, so both count it (the node adds the parts up).
    assert!(
        replicated.keys >= 1 && replicated.copies >= 1,
        "{replicated:?}"
    );
    assert_eq!(c.holders("/bkt/k5"), vec![0, 1, 2]);
    for i in 0..3 {
        assert_eq!(c.local_get(i, "/bkt/k5").body, yutu_tests::pattern(2005, 5));
    }
    // The extra copies go with the key. (Evicted here also because a drain leaves a copy that
    // `replicate` put on a node that never owned the key: see the drain below.)
    let line = ok(&c, 0, &["admin", "evict", "bkt/k5"]);
    assert!(line.starts_with("evicted 3 objects"), "{line}");
    assert_eq!(c.holders("/bkt/k5"), Vec::<usize>::new());
    let keys: Vec<(String, Vec<u8>)> = keys.into_iter().filter(|(p, _)| p != "/bkt/k5").collect();

    // drain --wait: returns once node2 is drained; every object is still there, on the others.
    let line = ok(
        &c,
        0,
        &["admin", "drain", "node2", "--wait", "--timeout", "120"],
    );
    // "node2: drained (N objects moved)", "1 object" when N is 1. N counts what moved while
    // the CLI watched: the drain may have moved some or all before its first look, so any N
    // is right; that nothing was lost is checked below.
    let moved = line
        .strip_prefix("node2: drained (")
        .and_then(|rest| rest.split_once(' '))
        .and_then(|(n, rest)| Some((n.parse::<u64>().ok()?, rest.trim_end())));
    assert!(
        matches!(moved, Some((n, rest))
            if rest == if n == 1 { "object moved)" } else { "objects moved)" }),
        "{line}"
    );
    let nodes: NodesResponse = json(&c, 1, &["admin", "nodes"]);
    let node2 = nodes
        .nodes
        .iter()
        .find(|n| n.name == "node2")
        .expect("node2");
    assert_eq!(node2.state, NodeState::Drained);
    for (p, body) in &keys {
        let holders = c.holders(p);
        assert!(!holders.contains(&2), "{p} still on node2");
        assert!(!holders.is_empty(), "{p} lost");
        for i in 0..3 {
            assert_eq!(&get(&c, i, p).body, body, "{p} through node{i}");
        }
    }
    let status: StatusResponse = json(&c, 0, &["admin", "status"]);
    assert_eq!(status.drains.len(), 1, "{status:?}");
    assert_eq!(
        (status.drains[0].state, status.drains[0].remaining),
        (NodeState::Drained, 0)
    );
    let report = ok(&c, 1, &["admin", "status"]);
    assert!(
        report
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["node2", "drained", "0"]),
        "{report}"
    );
    // Waiting on a node already drained returns at once; --json prints the drain document.
    let again: yutu_api::admin::DrainResponse = json(
        &c,
        1,
        &["admin", "drain", "node2", "--wait", "--timeout", "30"],
    );
    assert_eq!(again.state, NodeState::Drained);
    // --cancel: node2 owns keys again.
    assert_eq!(
        ok(&c, 0, &["admin", "drain", "node2", "--cancel"]).trim(),
        "node2: up"
    );
}

/// Every failure is one `yutu: ...` line on stderr and exit status 1: refused requests (the
/// server's code and message), bad arguments caught before sending, no admin identity.
#[test]
fn admin_errors_are_one_clear_line() {
    let c = TestCluster::start(2, &[]);
    ok(&c, 0, &["mb", "err", "--replicas", "2"]);
    assert_eq!(put(&c, 0, "/err/k", b"x").status, 200);

    let run = |args: &[&str]| fails(yutu_as(&c, 0, As::Admin, args), &args.join(" "));

    let err = run(&["admin", "drain", "nowhere"]);
    assert!(
        err.contains("InvalidArgument") && err.contains("nowhere"),
        "{err}"
    );
    let err = run(&["admin", "replicate", "err/k", "--node", "nowhere"]);
    assert!(err.contains("nowhere"), "{err}");
    let err = run(&["admin", "evict", "--node", "node1", "--free", "12XB"]);
    assert!(err.contains("invalid size \"12XB\""), "{err}");
    let err = run(&["admin", "pin", "err"]);
    assert!(err.contains("BUCKET/KEY"), "{err}");
    let err = run(&["mb", "fff", "--replicas", "9"]);
    assert!(err.contains("replicas must be from 1 to 7"), "{err}");

    // No token (nor keys): refused, and the line says what is missing.
    let err = fails(
        yutu_as(&c, 0, As::Nobody, &["admin", "nodes"]),
        "admin nodes (no token)",
    );
    assert!(err.contains("AccessDenied"), "{err}");
    assert!(err.contains("--token"), "{err}");
    // A user who is not an admin: signed (SigV4) and still refused.
    let err = fails(
        yutu_as(&c, 1, As::Alice, &["admin", "status"]),
        "admin status (alice)",
    );
    assert!(err.contains("AccessDenied"), "{err}");
    assert!(!err.contains("SignatureDoesNotMatch"), "{err}");
    // The same for a POST with a JSON body (signed with an unsigned payload).
    let err = fails(
        yutu_as(&c, 0, As::Alice, &["admin", "evict", "err/k"]),
        "admin evict (alice)",
    );
    assert!(err.contains("AccessDenied"), "{err}");
    assert!(!err.contains("no credentials"), "{err}");
    // The object was never touched by the refused calls.
    assert_eq!(get(&c, 1, "/err/k").body, b"x");
}
