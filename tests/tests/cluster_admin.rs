//! Keys move when the membership changes (re-replication after a node dies, hand-off when it
//! comes back, drain), and the storage admin API evicts, pins and replicates across the
//! cluster. Three real nodes on a real etcd.

use std::time::Duration;

use yutu_api::admin::{
    DrainRequest, EvictRequest, EvictResponse, NodeState, NodesResponse, PinRequest, PinResponse,
    ReplicateRequest, ReplicateResponse, StatusResponse,
};
use yutu_tests::cluster::TestCluster;
use yutu_tests::server::wait_until;
use yutu_tests::Reply;

fn auth() -> String {
    format!("Bearer {}", TestCluster::admin_token())
}

fn admin_put(c: &TestCluster, i: usize, path: &str, body: &[u8]) -> Reply {
    c.node(i)
        .client()
        .send("PUT", path, &[("authorization", &auth())], Some(body))
}

fn admin_get(c: &TestCluster, i: usize, path: &str) -> Reply {
    c.node(i)
        .client()
        .send("GET", path, &[("authorization", &auth())], None)
}

fn create(c: &TestCluster, bucket: &str, replicas: u32) {
    let r = c.node(0).client().send(
        "PUT",
        &format!("/{bucket}"),
        &[
            ("authorization", &auth()),
            ("x-yutu-replicas", &replicas.to_string()),
        ],
        Some(b""),
    );
    assert_eq!(r.status, 200, "{}", r.text());
}

fn call<T: serde::de::DeserializeOwned>(
    c: &TestCluster,
    i: usize,
    method: &str,
    path: &str,
    body: Option<&impl serde::Serialize>,
) -> T {
    let raw = body.map(|b| serde_json::to_vec(b).expect("encode"));
    let r = c.node(i).client().send(
        method,
        path,
        &[
            ("authorization", &auth()),
            ("content-type", "application/json"),
        ],
        raw.as_deref(),
    );
    assert_eq!(r.status, 200, "{method} {path}: {}", r.text());
    serde_json::from_slice(&r.body).unwrap_or_else(|e| panic!("{path}: {e}: {}", r.text()))
}

fn names(ids: &[usize]) -> Vec<String> {
    ids.iter().map(|i| format!("node{i}")).collect()
}

fn write_keys(c: &TestCluster, bucket: &str, n: u64) -> Vec<(String, Vec<u8>)> {
    (0..n)
        .map(|k| {
            let path = format!("/{bucket}/k{k}");
            let body = yutu_tests::pattern(3000, k);
            let r = admin_put(c, (k % 3) as usize, &path, &body);
            assert_eq!(r.status, 200, "{}", r.text());
            (path, body)
        })
        .collect()
}

/// With 2 replicas, a SIGKILLed node's keys get their second copy back on the survivors; the
/// node restarted on its data rejoins and ends with only the keys it owns.
#[test]
fn rereplication_restores_copies_and_a_rejoined_node_keeps_only_its_own() {
    let mut c = TestCluster::start(3, &["--nvme-capacity", "16MiB", "--durability", "disk"]);
    create(&c, "heal", 2);
    let keys = write_keys(&c, "heal", 60);
    c.kill(2);
    c.wait_members(0, &names(&[0, 1]));
    // Every key ends on both survivors.
    let healed = wait_until(Duration::from_secs(30), || {
        keys.iter().all(|(p, _)| c.holders(p) == vec![0, 1])
    });
    assert!(
        healed,
        "not every key is on both survivors; node0 log:\n{}",
        c.node(0).log()
    );
    let status: StatusResponse = call(&c, 1, "GET", "/admin/v1/status", None::<&()>);
    assert!(status.rereplicated_keys > 0, "{status:?}");
    assert!(
        c.node(0)
            .metric_sum("yutu_cluster_rereplicated_bytes_total")
            > 0.0
    );
    for (p, b) in &keys {
        assert_eq!(&admin_get(&c, 0, p).body, b);
    }

    // node2 comes back with its disk data: it owns a share again, and keeps only that share.
    c.restart(2, &[]);
    c.wait_members(0, &names(&[0, 1, 2]));
    let settled = wait_until(Duration::from_secs(30), || {
        keys.iter().all(|(p, _)| c.holders(p).len() == 2)
    });
    assert!(
        settled,
        "keys not on exactly two nodes; node2 log:\n{}",
        c.node(2).log()
    );
    let on2 = keys
        .iter()
        .filter(|(p, _)| c.holders(p).contains(&2))
        .count();
    assert!(on2 > 0, "node2 owns some keys again");
    for (p, b) in &keys {
        for i in 0..3 {
            assert_eq!(&admin_get(&c, i, p).body, b, "{p} through node{i}");
        }
    }
}

/// `drain` moves every key off a node without losing one; the node reports drained.
#[test]
fn drain_empties_a_node_without_losing_an_object() {
    let c = TestCluster::start(3, &[]);
    create(&c, "moving", 1);
    let keys = write_keys(&c, "moving", 90);
    assert!(keys.iter().any(|(p, _)| c.holders(p) == vec![1]));
    // An extra copy on node1 of a key it does not own (made by `replicate`) must not keep
    // the drain from finishing.
    let (extra, _) = keys
        .iter()
        .find(|(p, _)| !c.holders(p).contains(&1))
        .expect("a key node1 does not own");
    let key = extra.trim_start_matches("/moving/").to_string();
    let r: ReplicateResponse = call(
        &c,
        2,
        "POST",
        "/admin/v1/replicate",
        Some(&ReplicateRequest {
            bucket: "moving".into(),
            key: Some(key),
            node: Some("node1".into()),
            ..ReplicateRequest::default()
        }),
    );
    assert_eq!((r.keys, r.copies), (1, 1), "{r:?}");
    assert!(c.holders(extra).contains(&1));
    let r: yutu_api::admin::DrainResponse = call(
        &c,
        0,
        "POST",
        "/admin/v1/drain",
        Some(&DrainRequest {
            node: "node1".into(),
            cancel: false,
        }),
    );
    assert_eq!(r.state, NodeState::Draining);
    let drained = wait_until(Duration::from_secs(30), || {
        let nodes: NodesResponse = call(&c, 2, "GET", "/admin/v1/nodes", None::<&()>);
        nodes
            .nodes
            .iter()
            .any(|n| n.name == "node1" && n.state == NodeState::Drained)
    });
    assert!(drained, "node1 log:\n{}", c.node(1).log());
    for (p, b) in &keys {
        assert!(!c.holders(p).contains(&1), "{p} still on node1");
        assert_eq!(c.holders(p).len(), 1, "{p}");
        assert_eq!(&admin_get(&c, 1, p).body, b, "{p} through the drained node");
    }
    // New writes never land on it.
    for k in 0..20 {
        let p = format!("/moving/new{k}");
        assert_eq!(admin_put(&c, 1, &p, b"x").status, 200);
        assert!(!c.holders(&p).contains(&1));
    }
    let status: StatusResponse = call(&c, 0, "GET", "/admin/v1/status", None::<&()>);
    assert_eq!(status.drains.len(), 1, "{status:?}");
    assert_eq!(status.drains[0].remaining, 0);
}

#[test]
fn evict_pin_soft_pin_and_replicate_across_the_cluster() {
    let c = TestCluster::start(3, &["--shards", "1", "--memory", "8MiB"]);
    create(&c, "cache", 1);
    // A hard-pinned and a soft-pinned key survive a flood that evicts everything else.
    assert_eq!(admin_put(&c, 0, "/cache/hard", &[1u8; 4096]).status, 200);
    assert_eq!(admin_put(&c, 0, "/cache/soft", &[2u8; 4096]).status, 200);
    let pinned: PinResponse = call(
        &c,
        1,
        "POST",
        "/admin/v1/pin",
        Some(&PinRequest {
            bucket: "cache".into(),
            key: Some("hard".into()),
            ..PinRequest::default()
        }),
    );
    assert_eq!(pinned.keys, 1);
    let soft: PinResponse = call(
        &c,
        1,
        "POST",
        "/admin/v1/pin",
        Some(&PinRequest {
            bucket: "cache".into(),
            key: Some("soft".into()),
            ttl_secs: Some(600),
            ..PinRequest::default()
        }),
    );
    assert_eq!(soft.keys, 1);
    // Flood every node's 8 MiB several times over (no NVMe: evicted means gone).
    for k in 0..120 {
        assert_eq!(
            admin_put(
                &c,
                k % 3,
                &format!("/cache/flood{k}"),
                &vec![9u8; 256 << 10]
            )
            .status,
            200
        );
    }
    assert!(
        (0..3)
            .map(|i| c.node(i).metric_sum("yutu_evictions_total"))
            .sum::<f64>()
            > 0.0
    );
    assert_eq!(admin_get(&c, 2, "/cache/hard").body, vec![1u8; 4096]);
    assert_eq!(admin_get(&c, 2, "/cache/soft").body, vec![2u8; 4096]);

    // Explicit eviction: by key, cluster-wide; a hard-pinned key is left in place.
    let e: EvictResponse = call(
        &c,
        0,
        "POST",
        "/admin/v1/evict",
        Some(&EvictRequest {
            bucket: Some("cache".into()),
            key: Some("soft".into()),
            ..EvictRequest::default()
        }),
    );
    assert_eq!((e.objects, e.bytes), (1, 4096));
    assert_eq!(admin_get(&c, 0, "/cache/soft").status, 404);
    let e: EvictResponse = call(
        &c,
        0,
        "POST",
        "/admin/v1/evict",
        Some(&EvictRequest {
            bucket: Some("cache".into()),
            key: Some("hard".into()),
            ..EvictRequest::default()
        }),
    );
    assert_eq!((e.objects, e.pinned_skipped), (0, 1));
    // Unpinned, it goes like any other.
    let _: PinResponse = call(
        &c,
        0,
        "POST",
        "/admin/v1/unpin",
        Some(&PinRequest {
            bucket: "cache".into(),
            key: Some("hard".into()),
            ..PinRequest::default()
        }),
    );
    let e: EvictResponse = call(
        &c,
        0,
        "POST",
        "/admin/v1/evict",
        Some(&EvictRequest {
            bucket: Some("cache".into()),
            prefix: Some("ha".into()),
            ..EvictRequest::default()
        }),
    );
    assert_eq!(e.objects, 1);

    // "Free N bytes on node X": only that node's DRAM shrinks.
    let before: NodesResponse = call(&c, 0, "GET", "/admin/v1/stats", None::<&()>);
    let used = |r: &NodesResponse, n: &str| {
        r.nodes
            .iter()
            .find(|x| x.name == n)
            .map(|x| x.dram().used)
            .unwrap_or(0)
    };
    let e: EvictResponse = call(
        &c,
        0,
        "POST",
        "/admin/v1/evict",
        Some(&EvictRequest {
            node: Some("node2".into()),
            free_bytes: Some(1 << 20),
            ..EvictRequest::default()
        }),
    );
    assert!(e.bytes >= 1 << 20, "{e:?}");
    let after: NodesResponse = call(&c, 0, "GET", "/admin/v1/stats", None::<&()>);
    assert!(used(&after, "node2") + (1 << 20) <= used(&before, "node2"));
    assert_eq!(used(&after, "node0"), used(&before, "node0"));

    // Replicate a key onto every node, then onto a named one.
    assert_eq!(admin_put(&c, 0, "/cache/hot", b"hot block").status, 200);
    let r: ReplicateResponse = call(
        &c,
        1,
        "POST",
        "/admin/v1/replicate",
        Some(&ReplicateRequest {
            bucket: "cache".into(),
            key: Some("hot".into()),
            replicas: Some(3),
            ..ReplicateRequest::default()
        }),
    );
    assert_eq!((r.keys, r.copies), (1, 2), "{r:?}");
    assert_eq!(c.holders("/cache/hot"), vec![0, 1, 2]);
    for i in 0..3 {
        assert_eq!(c.local_get(i, "/cache/hot").body, b"hot block");
    }
    // Bad requests get clear errors.
    let r = c.node(0).client().send(
        "POST",
        "/admin/v1/replicate",
        &[("authorization", &auth())],
        Some(br#"{"bucket":"cache","key":"hot","node":"nowhere"}"#),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("nowhere"));
    let r = c.node(0).client().send(
        "POST",
        "/admin/v1/evict",
        &[],
        Some(br#"{"bucket":"cache"}"#),
    );
    assert_eq!(r.status, 403, "{}", r.text());
}
