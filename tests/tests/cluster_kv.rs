//! The KV API over a cluster: `KvClient` learns the membership, sends each block to its
//! owners and reads it from them, fails over when an owner dies, and pools the nodes' DRAM.

use std::time::Duration;

use yutu_client::kv::{KvClient, KvOptions};
use yutu_tests::cluster::TestCluster;
use yutu_tests::server::wait_until;

fn admin() -> String {
    TestCluster::admin_token()
}

fn create_bucket(c: &TestCluster, bucket: &str, replicas: u32) {
    let auth = format!("Bearer {}", admin());
    let r = c.node(0).client().send(
        "PUT",
        &format!("/{bucket}"),
        &[
            ("authorization", &auth),
            ("x-yutu-replicas", &replicas.to_string()),
        ],
        Some(b""),
    );
    assert_eq!(r.status, 200, "{}", r.text());
}

fn kv(c: &TestCluster, node: usize) -> KvClient {
    KvClient::new(
        &c.node(node).url,
        KvOptions {
            token: Some(admin()),
            ..KvOptions::default()
        },
    )
    .expect("KV client")
}

#[test]
fn kv_client_routes_each_block_to_its_owners() {
    let c = TestCluster::start(3, &[]);
    create_bucket(&c, "kvpair", 2);
    let client = kv(&c, 1);
    assert_eq!(client.cluster_nodes(), 3);
    let n = 48;
    let block = 8192u64;
    let buf = client.register(2 * n * block).expect("buffer");
    let keys: Vec<String> = (0..n).map(|i| format!("blk-{i}")).collect();
    let offsets: Vec<u64> = (0..n).map(|i| i * block).collect();
    let lengths = vec![block; n as usize];
    for i in 0..n {
        buf.write_at(i * block, &yutu_tests::pattern(block as usize, i))
            .expect("fill");
    }
    let etags = client
        .batch_put_from("kvpair", &keys, &buf, &offsets, &lengths)
        .expect("put");
    assert!(etags.iter().all(|e| !e.is_empty()));
    let mut per_node = [0; 3];
    for (i, k) in keys.iter().enumerate() {
        let holders = c.holders(&format!("/kvpair/{k}"));
        assert_eq!(holders.len(), 2, "{k} is on {holders:?}");
        for h in holders {
            per_node[h] += 1;
            let local = c.local_get(h, &format!("/kvpair/{k}"));
            assert_eq!(local.body, yutu_tests::pattern(block as usize, i as u64));
        }
    }
    assert!(per_node.iter().all(|&x| x > 0), "{per_node:?}");
    // Read back into the second half of the buffer.
    let back: Vec<u64> = (0..n).map(|i| (n + i) * block).collect();
    let got = client
        .batch_get_into("kvpair", &keys, &buf, &back)
        .expect("get");
    assert!(got.iter().all(|g| *g == Some(block)), "{got:?}");
    for i in 0..n {
        let mut out = vec![0u8; block as usize];
        buf.read_at((n + i) * block, &mut out).expect("read");
        assert_eq!(out, yutu_tests::pattern(block as usize, i));
    }
    let mut probe = keys[..4].to_vec();
    probe.push("absent".into());
    assert_eq!(
        client.batch_exists("kvpair", &probe).expect("exists"),
        vec![true, true, true, true, false]
    );
    assert_eq!(client.prefix("kvpair", &probe).expect("prefix"), 4);
    assert_eq!(
        client.get_bytes("kvpair", "blk-3").expect("get bytes"),
        Some(yutu_tests::pattern(block as usize, 3))
    );
    let removed = client.remove("kvpair", &keys[..8]).expect("remove");
    assert!(removed.iter().all(|r| *r));
    for k in &keys[..8] {
        assert!(c.holders(&format!("/kvpair/{k}")).is_empty(), "{k}");
    }
}

/// Writing 2.5 times one node's DRAM into three nodes through one client evicts nothing: the
/// cluster's KV API is the pooled capacity of its nodes.
#[test]
fn kv_capacity_is_pooled_over_the_nodes() {
    let c = TestCluster::start(3, &["--shards", "1"]);
    create_bucket(&c, "pool", 1);
    let client = kv(&c, 0);
    let block: u64 = 64 << 10;
    let total: u64 = (64 << 20) * 5 / 2;
    let per_batch: u64 = 256;
    let buf = client.register(per_batch * block).expect("buffer");
    let mut written = Vec::new();
    let mut i = 0u64;
    while i * block < total {
        let keys: Vec<String> = (i..i + per_batch).map(|k| format!("p{k}")).collect();
        for (j, _) in keys.iter().enumerate() {
            buf.write_at(j as u64 * block, &(i + j as u64).to_le_bytes())
                .expect("fill");
        }
        let offsets: Vec<u64> = (0..per_batch).map(|j| j * block).collect();
        client
            .batch_put_from(
                "pool",
                &keys,
                &buf,
                &offsets,
                &vec![block; per_batch as usize],
            )
            .expect("put");
        written.extend(keys);
        i += per_batch;
    }
    for node in 0..3 {
        assert_eq!(
            c.node(node).metric_sum("yutu_evictions_total"),
            0.0,
            "node{node} evicted"
        );
    }
    for chunk in written.chunks(1024) {
        let found = client.batch_exists("pool", chunk).expect("exists");
        assert!(found.iter().all(|f| *f), "a block is missing");
    }
    let stored: f64 = (0..3).map(|n| c.node(n).metric_sum("yutu_objects")).sum();
    assert_eq!(stored as usize, written.len());
}

#[test]
fn kv_reads_fail_over_when_an_owner_dies() {
    let mut c = TestCluster::start(3, &["--lease-ttl-secs", "10"]);
    create_bucket(&c, "kvha", 2);
    let client = kv(&c, 0);
    let n = 32u64;
    let block = 4096u64;
    let buf = client.register(2 * n * block).expect("buffer");
    let keys: Vec<String> = (0..n).map(|i| format!("h{i}")).collect();
    for i in 0..n {
        buf.write_at(i * block, &yutu_tests::pattern(block as usize, i))
            .expect("fill");
    }
    let offsets: Vec<u64> = (0..n).map(|i| i * block).collect();
    client
        .batch_put_from("kvha", &keys, &buf, &offsets, &vec![block; n as usize])
        .expect("put");
    c.kill(2);
    // At once, while node2 is still a member: every block reads back from a surviving owner.
    let back: Vec<u64> = (0..n).map(|i| (n + i) * block).collect();
    let got = client
        .batch_get_into("kvha", &keys, &buf, &back)
        .expect("get after the kill");
    assert!(got.iter().all(|g| *g == Some(block)), "{got:?}");
    assert!(c.members(0).contains(&"node2".to_string()));
    assert!(client
        .batch_exists("kvha", &keys)
        .expect("exists")
        .iter()
        .all(|f| *f));
    // Once node2's lease expires, puts go to the survivors again.
    c.wait_members(0, &["node0".to_string(), "node1".to_string()]);
    assert!(wait_until(Duration::from_secs(20), || client
        .batch_put_from("kvha", &keys, &buf, &offsets, &vec![block; n as usize])
        .is_ok()));
    for k in &keys {
        assert_eq!(c.holders(&format!("/kvha/{k}")).len(), 2, "{k}");
    }
}

/// Mooncake's `ReplicateConfig` through `KvClient`: more copies than the bucket's, a
/// preferred node, and a hard pin that survives a flood of the node's DRAM.
#[test]
fn kv_put_options_replicas_preferred_node_and_pin() {
    use yutu_api::kv::BlockPin;
    use yutu_client::kv::PutOptions;
    let c = TestCluster::start(3, &["--memory", "8MiB", "--shards", "1"]);
    create_bucket(&c, "opts", 1);
    // Extra replicas last until the next rebalancing pass: one still to run for the nodes'
    // own joins would drop them under the assertions below.
    c.wait_settled();
    let client = kv(&c, 0);
    let block = 64u64 << 10;
    let buf = client.register(64 * block).expect("buffer");
    buf.write_at(0, &yutu_tests::pattern(block as usize, 1))
        .expect("fill");
    let put = |key: &str, options: &PutOptions| {
        client
            .batch_put_from_opts("opts", &[key.to_string()], &buf, &[0], &[block], options)
            .expect("put")
    };
    put(
        "three",
        &PutOptions {
            replicas: Some(3),
            ..PutOptions::default()
        },
    );
    assert_eq!(c.holders("/opts/three"), vec![0, 1, 2]);
    put(
        "preferred",
        &PutOptions {
            preferred_node: Some("node2".into()),
            ..PutOptions::default()
        },
    );
    let holders = c.holders("/opts/preferred");
    assert!(holders.contains(&2), "{holders:?}");
    put(
        "pinned",
        &PutOptions {
            pin: Some(BlockPin {
                soft_ttl_secs: None,
            }),
            ..PutOptions::default()
        },
    );
    let pinned_on = c.holders("/opts/pinned");
    assert_eq!(pinned_on.len(), 1);
    // Flood the bucket: 8 MiB per node, 3 nodes, 40 MiB of unpinned blocks.
    let keys: Vec<String> = (0..64).map(|i| format!("flood{i}")).collect();
    let offsets: Vec<u64> = (0..64).map(|i| i * block).collect();
    for round in 0..10 {
        let ks: Vec<String> = keys.iter().map(|k| format!("{k}-{round}")).collect();
        client
            .batch_put_from("opts", &ks, &buf, &offsets, &vec![block; 64])
            .expect("flood");
    }
    assert!(c.node(pinned_on[0]).metric_sum("yutu_evictions_total") > 0.0);
    assert_eq!(
        c.holders("/opts/pinned"),
        pinned_on,
        "the pinned block stayed"
    );
    // Bad options are refused before anything is sent.
    let err = client
        .batch_put_from_opts(
            "opts",
            &["x".to_string()],
            &buf,
            &[0],
            &[block],
            &PutOptions {
                replicas: Some(0),
                ..PutOptions::default()
            },
        )
        .expect_err("0 replicas");
    assert!(err.to_string().contains("replicas"), "{err}");
    let err = client
        .batch_put_from_opts(
            "opts",
            &["x".to_string()],
            &buf,
            &[0],
            &[block],
            &PutOptions {
                preferred_node: Some("nowhere".into()),
                ..PutOptions::default()
            },
        )
        .expect_err("unknown node");
    assert!(err.to_string().contains("nowhere"), "{err}");
}

/// A client signing with access keys (SigV4) routes a bucket created a moment ago through
/// another node: the membership call that looks the bucket up (`?bucket=`) is signed with its
/// query, and the blocks land on their owners.
#[test]
fn kv_client_with_access_keys_routes_a_new_bucket() {
    let c = TestCluster::start(3, &[]);
    let client = KvClient::new(
        &c.node(2).url,
        KvOptions {
            credentials: Some(yutu_tests::users::alice()),
            ..KvOptions::default()
        },
    )
    .expect("KV client");
    assert_eq!(client.cluster_nodes(), 3);
    // Created after the client read the membership, through another node.
    let r = c.alice(0, "PUT", "/alicekv", b"");
    assert_eq!(r.status, 200, "{}", r.text());
    let n = 24u64;
    let block = 4096u64;
    let buf = client.register(n * block).expect("buffer");
    let keys: Vec<String> = (0..n).map(|i| format!("a{i}")).collect();
    let offsets: Vec<u64> = (0..n).map(|i| i * block).collect();
    client
        .batch_put_from("alicekv", &keys, &buf, &offsets, &vec![block; n as usize])
        .expect("put");
    let mut spread = std::collections::BTreeSet::new();
    for k in &keys {
        let holders = c.holders(&format!("/alicekv/{k}"));
        assert_eq!(holders.len(), 1, "{k} on {holders:?}");
        spread.extend(holders);
    }
    assert!(
        spread.len() > 1,
        "routed, not all on the node asked: {spread:?}"
    );
    assert!(client
        .batch_exists("alicekv", &keys)
        .expect("exists")
        .iter()
        .all(|e| *e));
    // bob's client cannot read alice's blocks through any node.
    let bob = KvClient::new(
        &c.node(1).url,
        KvOptions {
            credentials: Some(yutu_tests::users::bob()),
            ..KvOptions::default()
        },
    )
    .expect("bob's client");
    let err = bob
        .batch_exists("alicekv", &keys)
        .expect_err("bob is refused");
    assert_eq!(err.code(), Some("AccessDenied"), "{err}");
}
