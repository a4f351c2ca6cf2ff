//! A cluster of three real nodes on a real etcd: membership, cluster-wide buckets, placement
//! with replicas, forwarding, failover when an owner is SIGKILLed, and no acknowledged write
//! on a node cut off from etcd.

use std::time::{Duration, Instant};

use yutu_tests::cluster::TestCluster;
use yutu_tests::server::wait_until;

fn names(ids: &[usize]) -> Vec<String> {
    ids.iter().map(|i| format!("node{i}")).collect()
}

#[test]
fn membership_appears_and_disappears() {
    let mut c = TestCluster::start(3, &[]);
    let m = c.membership(0).expect("membership");
    assert_eq!(m.cluster, "yutu");
    assert!(m.revision > 0);
    assert!(m.etcd_reachable);
    for member in &m.members {
        assert!(member.url.starts_with("http://127.0.0.1:"), "{member:?}");
        assert!(member.transfer.is_some(), "{member:?}");
        assert_eq!(member.memory, 64 << 20);
    }
    assert_eq!(c.node(1).metric_sum("yutu_cluster_members"), 3.0);
    assert_eq!(c.node(1).metric_sum("yutu_cluster_writable"), 1.0);

    // A node stopped with SIGTERM revokes its lease: the others drop it at once.
    let started = Instant::now();
    c.stop(2);
    c.wait_members(0, &names(&[0, 1]));
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "a graceful leave is seen before the lease TTL ({:?})",
        started.elapsed()
    );

    // A SIGKILLed node disappears when its lease (3 s here) expires.
    c.kill(1);
    c.wait_members(0, &names(&[0]));

    // And a node that comes back (same name, same data directory) joins again.
    c.restart(1, &[]);
    c.wait_members(0, &names(&[0, 1]));
    c.wait_members(1, &names(&[0, 1]));
}

#[test]
fn buckets_are_cluster_wide() {
    let c = TestCluster::start(3, &[]);
    let r = c.alice(0, "PUT", "/shared", b"");
    assert_eq!(r.status, 200, "{}", r.text());
    // Every node knows it at once (a node that has not read etcd yet looks it up).
    for i in 0..3 {
        assert_eq!(c.alice(i, "HEAD", "/shared", b"").status, 200, "node{i}");
    }
    // The name is taken cluster-wide, through any node.
    let r = c.bob(2, "PUT", "/shared", b"");
    assert_eq!(r.status, 409, "{}", r.text());
    assert_eq!(r.code().as_deref(), Some("BucketAlreadyExists"));
    let r = c.alice(1, "PUT", "/shared", b"");
    assert_eq!(
        r.code().as_deref(),
        Some("BucketAlreadyOwnedByYou"),
        "{}",
        r.text()
    );
    // The replica count is part of the bucket's configuration, visible in the membership.
    let r = c.alice(1, "PUT", "/twice", b"");
    assert_eq!(r.status, 200);
    let m = c.membership(2).expect("membership");
    let replicas = |b: &str| m.buckets.iter().find(|x| x.bucket == b).map(|x| x.replicas);
    assert_eq!(replicas("shared"), Some(1), "the cluster default is 1");

    // A bucket holding an object on any node cannot be deleted; once empty it goes
    // everywhere.
    assert_eq!(c.alice(2, "PUT", "/shared/k", b"v").status, 200);
    let r = c.alice(0, "DELETE", "/shared", b"");
    assert_eq!(r.code().as_deref(), Some("BucketNotEmpty"), "{}", r.text());
    assert_eq!(c.alice(1, "DELETE", "/shared/k", b"").status, 204);
    let r = c.alice(0, "DELETE", "/shared", b"");
    assert_eq!(r.status, 204, "{}", r.text());
    for i in 0..3 {
        assert!(
            wait_until(Duration::from_secs(10), || c
                .alice(i, "HEAD", "/shared", b"")
                .status
                == 404),
            "node{i} still has the deleted bucket; log:\n{}",
            c.node(i).log()
        );
    }
}

#[test]
fn replica_count_is_checked() {
    let c = TestCluster::start(1, &[]);
    let auth = format!("Bearer {}", TestCluster::admin_token());
    for bad in ["0", "8", "two", "-1"] {
        let r = c.node(0).client().send(
            "PUT",
            "/badreplicas",
            &[("authorization", &auth), ("x-yutu-replicas", bad)],
            Some(b""),
        );
        assert_eq!(r.status, 400, "x-yutu-replicas: {bad}: {}", r.text());
        assert_eq!(r.code().as_deref(), Some("InvalidArgument"));
    }
    // On a single node, more than one replica is refused too.
    let single = yutu_tests::Server::start(&[]);
    let r = single
        .client()
        .send("PUT", "/onenode", &[("x-yutu-replicas", "2")], Some(b""));
    assert_eq!(r.status, 400, "{}", r.text());
}

/// With 2 replicas, every object is on exactly its two owners, whichever node took the write,
/// and a client's signature is checked by the owner as well as by the node it reached.
#[test]
fn objects_live_on_their_owners_and_any_node_serves_them() {
    let c = TestCluster::start(3, &[]);
    let auth = format!("Bearer {}", TestCluster::admin_token());
    let r = c.node(0).client().send(
        "PUT",
        "/pair",
        &[("authorization", &auth), ("x-yutu-replicas", "2")],
        Some(b""),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // alice may not write the admin's bucket through any node.
    assert_eq!(c.alice(1, "PUT", "/pair/x", b"no").status, 403);
    let mine = c.alice(2, "PUT", "/mine", b"");
    assert_eq!(mine.status, 200);
    let mut per_node = [0usize; 3];
    for k in 0..30 {
        let body = yutu_tests::pattern(1000 + k, k as u64);
        let path = format!("/pair/key-{k}");
        let r = c
            .node(k % 3)
            .client()
            .send("PUT", &path, &[("authorization", &auth)], Some(&body));
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("etag"), Some(yutu_tests::etag_of(&body).as_str()));
        let holders = c.holders(&path);
        assert_eq!(holders.len(), 2, "{path} is on {holders:?}");
        for h in &holders {
            per_node[*h] += 1;
            let local = c.local_get(*h, &path);
            assert_eq!(local.body, body);
            assert_eq!(
                local.header("etag"),
                r.header("etag"),
                "replicas keep the ETag"
            );
        }
        for i in 0..3 {
            let got = c
                .node(i)
                .client()
                .send("GET", &path, &[("authorization", &auth)], None);
            assert_eq!(got.status, 200);
            assert_eq!(got.body, body, "GET through node{i}");
        }
        // bob cannot read it through any node.
        assert_eq!(c.bob(k % 3, "GET", &path, b"").status, 403);
    }
    assert!(
        per_node.iter().all(|&n| n > 0),
        "every node owns some keys: {per_node:?}"
    );
    // A delete through any node removes every copy.
    let r = c
        .node(1)
        .client()
        .send("DELETE", "/pair/key-0", &[("authorization", &auth)], None);
    assert_eq!(r.status, 204);
    assert!(c.holders("/pair/key-0").is_empty());
    // A client cannot pose as a node: the header without a node token is ignored, so the
    // write is still replicated to both owners.
    let r = c.node(0).client().send(
        "PUT",
        "/pair/posed",
        &[
            ("authorization", &auth),
            (yutu_api::cluster::FORWARDED_HEADER, "node9"),
            (yutu_api::cluster::REPLICA_HEADER, "1"),
        ],
        Some(b"posed"),
    );
    assert_eq!(r.status, 200);
    assert_eq!(c.holders("/pair/posed").len(), 2);
    assert!(c.node(0).metric_sum("yutu_cluster_replicated_total") > 0.0);
}

/// The acceptance test of failover: with 2 replicas a client writes and reads continuously
/// through one node while another is SIGKILLed. Every acknowledged object stays readable,
/// and reads fail over before the dead node's lease expires.
#[test]
fn acknowledged_writes_survive_a_sigkilled_owner() {
    let mut c = TestCluster::start(3, &["--lease-ttl-secs", "10"]);
    let auth = format!("Bearer {}", TestCluster::admin_token());
    let h = [("authorization", auth.as_str())];
    let r = c.node(0).client().send(
        "PUT",
        "/failover",
        &[h[0], ("x-yutu-replicas", "2")],
        Some(b""),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let client = c.node(0).client();
    let mut acked: Vec<(String, Vec<u8>)> = Vec::new();
    for k in 0..60 {
        let body = yutu_tests::pattern(4096, k);
        let path = format!("/failover/k{k}");
        assert_eq!(client.send("PUT", &path, &h, Some(&body)).status, 200);
        acked.push((path, body));
    }
    let on_victim = acked
        .iter()
        .filter(|(p, _)| c.holders(p).contains(&1))
        .count();
    assert!(on_victim > 0);

    c.kill(1);
    // At once, before the lease (10 s) expires: every acknowledged object reads back through
    // node0, also those whose first owner is the dead node.
    let killed = Instant::now();
    for (path, body) in &acked {
        let r = client.send("GET", path, &h, None);
        assert_eq!(r.status, 200, "{path} after the kill: {}", r.text());
        assert_eq!(&r.body, body);
    }
    let read_all = killed.elapsed();
    assert!(
        c.members(0).contains(&"node1".to_string()),
        "the reads ran while node1 was still a member ({read_all:?})"
    );

    // Writes whose owners include the dead node fail (retryably) until its lease expires,
    // and none of them is acknowledged with one copy; then they succeed on the new owners.
    let mut refused = 0;
    for k in 60..120 {
        let body = yutu_tests::pattern(4096, k);
        let path = format!("/failover/k{k}");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let r = client.send("PUT", &path, &h, Some(&body));
            if r.status == 200 {
                break;
            }
            assert_eq!(r.status, 503, "{}", r.text());
            refused += 1;
            assert!(Instant::now() < deadline, "{path} never accepted");
            std::thread::sleep(Duration::from_millis(50));
        }
        acked.push((path, body));
        // Reads keep working meanwhile.
        let (p, b) = &acked[(k as usize * 7) % acked.len()];
        let r = client.send("GET", p, &h, None);
        assert_eq!(r.status, 200, "{p}: {}", r.text());
        assert_eq!(&r.body, b);
    }
    assert!(refused > 0, "some writes had the dead node as an owner");
    c.wait_members(0, &names(&[0, 2]));
    for (path, body) in &acked {
        for i in [0, 2] {
            let r = c.node(i).client().send("GET", path, &h, None);
            assert_eq!(r.status, 200, "{path} through node{i}");
            assert_eq!(&r.body, body);
        }
    }
    // Written after the membership change: on both survivors.
    for (path, _) in &acked[60..] {
        assert_eq!(c.holders(path), vec![0, 2], "{path}");
    }
}
