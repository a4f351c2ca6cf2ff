//! Real storage nodes publishing KV events to the real conductor: a request is routed to the
//! node holding its prefix, stops being routed there once the node drops the blocks, and a
//! restarted node (new epoch) is resynced from its snapshot.

use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use yutu_api::block_hash::BlockHasher;
use yutu_tests::server::wait_until;
use yutu_tests::{bin_path, Client, Server};

/// The prefill instance a request would go to, and how many of its blocks are cached there.
fn route(c: &Client, tokens: &[u32]) -> (String, u64) {
    let (status, d) = c.post_json(
        "/v1/route",
        &json!({"bucket": "llama", "token_ids": tokens, "output_length": 50, "dry_run": true}),
    );
    assert_eq!(status, 200, "{d}");
    (
        d["prefill"]["instance"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        d["cached_blocks"].as_u64().unwrap_or(0),
    )
}

fn node(c: &Client, name: &str) -> Value {
    let nodes: Value = serde_json::from_slice(&c.get("/v1/nodes").body).unwrap_or(Value::Null);
    nodes
        .as_array()
        .and_then(|n| n.iter().find(|n| n["node"] == name))
        .cloned()
        .unwrap_or(Value::Null)
}

/// Blocks evicted from a DRAM-only node stop drawing requests to it.
#[test]
fn evicted_blocks_stop_drawing_requests() {
    let mut cmd = Command::new(bin_path("yutu-conductor"));
    cmd.args(["serve", "--no-auth", "--listen", "127.0.0.1:0"]);
    let conductor = Server::spawn(cmd, tempfile::tempdir().unwrap());
    let cc = conductor.client();
    for reg in [
        json!({"id": "pB", "role": "prefill", "node": "node-b"}),
        json!({"id": "pC", "role": "prefill", "node": "node-c"}),
        json!({"id": "d0", "role": "decode"}),
    ] {
        assert_eq!(cc.post_json("/v1/instances", &reg).0, 200);
    }
    let node_c = Server::start(&[
        "--conductor",
        &conductor.url,
        "--node-name",
        "node-c",
        "--memory",
        "8MiB",
        "--shards",
        "1",
        "--nvme-capacity",
        "0",
    ]);
    let c = node_c.client();
    c.mb("llama");
    let tokens: Vec<u32> = (0..8 * 512).map(|i| i * 13 + 1).collect();
    let blocks = BlockHasher::new(512).hash_tokens(&tokens);
    for b in &blocks {
        assert_eq!(
            c.put(&format!("/llama/{}", b.to_key()), &[1u8; 4096])
                .status,
            200
        );
    }
    assert!(wait_until(Duration::from_secs(30), || route(&cc, &tokens)
        == ("pC".to_string(), 8)));
    // Three times the node's DRAM in other objects: the blocks are evicted.
    for i in 0..24 {
        assert_eq!(
            c.put(&format!("/llama/filler-{i}"), &vec![0u8; 1 << 20])
                .status,
            200
        );
    }
    assert!(node_c.metric_sum("yutu_evictions_total") >= 8.0);
    assert!(
        wait_until(Duration::from_secs(30), || route(&cc, &tokens).1 == 0),
        "evicted blocks still draw requests: {:?}",
        route(&cc, &tokens)
    );
}

#[test]
fn routing_follows_the_blocks_nodes_publish() {
    let mut cmd = Command::new(bin_path("yutu-conductor"));
    cmd.args(["serve", "--no-auth", "--listen", "127.0.0.1:0"]);
    let conductor = Server::spawn(cmd, tempfile::tempdir().unwrap());
    let cc = conductor.client();
    // pB registers first, so it wins ties: only the cached prefix draws requests to pA.
    for reg in [
        json!({"id": "pB", "role": "prefill", "node": "node-b"}),
        json!({"id": "pA", "role": "prefill", "node": "node-a"}),
        json!({"id": "d0", "role": "decode"}),
    ] {
        let (status, body) = cc.post_json("/v1/instances", &reg);
        assert_eq!(status, 200, "{body}");
    }
    let a_dir = tempfile::tempdir().unwrap();
    let a_args = [
        "--conductor",
        conductor.url.as_str(),
        "--node-name",
        "node-a",
        "--memory",
        "64MiB",
    ];
    let node_a = Server::start_on(a_dir.path(), &a_args);
    let node_b = Server::start(&[
        "--conductor",
        &conductor.url,
        "--node-name",
        "node-b",
        "--memory",
        "64MiB",
    ]);
    let a = node_a.client();
    // Blocks in a `disk` bucket are on NVMe and survive node A's restart.
    let r = a.send("PUT", "/llama", &[("x-yutu-durability", "disk")], Some(b""));
    assert_eq!(r.status, 200, "{}", r.text());
    node_b.client().mb("llama");

    let tokens: Vec<u32> = (0..16 * 512).map(|i| i * 7 + 3).collect();
    let blocks = BlockHasher::new(512).hash_tokens(&tokens);
    assert_eq!(blocks.len(), 16);
    assert_eq!(
        route(&cc, &tokens).0,
        "pB",
        "nothing cached yet: the tie goes to pB"
    );

    // Node A stores the prefix: requests with it go to pA.
    for (i, b) in blocks.iter().enumerate() {
        assert_eq!(
            a.put(&format!("/llama/{}", b.to_key()), &vec![i as u8; 4096])
                .status,
            200
        );
    }
    assert!(
        wait_until(Duration::from_secs(30), || route(&cc, &tokens)
            == ("pA".to_string(), 16)),
        "never routed to pA: {:?}",
        route(&cc, &tokens)
    );
    // Node A drops the blocks: requests stop going there.
    for b in &blocks {
        assert_eq!(a.delete(&format!("/llama/{}", b.to_key())).status, 204);
    }
    assert!(
        wait_until(Duration::from_secs(30), || route(&cc, &tokens).1 == 0),
        "still routed for a dropped prefix: {:?}",
        route(&cc, &tokens)
    );
    assert_eq!(route(&cc, &tokens).0, "pB");

    // Store them again, restart node A: its new epoch makes the conductor resync from the
    // snapshot, which is the only way it can learn that the blocks are still there (a
    // restarted node publishes no event for what it recovers from NVMe).
    for (i, b) in blocks.iter().enumerate() {
        assert_eq!(
            a.put(&format!("/llama/{}", b.to_key()), &vec![i as u8; 4096])
                .status,
            200
        );
    }
    assert!(wait_until(Duration::from_secs(30), || route(&cc, &tokens)
        == ("pA".to_string(), 16)));
    let old_epoch = node(&cc, "node-a")["epoch"].as_u64().unwrap();
    node_a.kill();
    let node_a = Server::start_on(a_dir.path(), &a_args);
    assert!(
        wait_until(Duration::from_secs(30), || {
            let n = node(&cc, "node-a");
            n["epoch"].as_u64().is_some_and(|e| e > old_epoch)
                && n["resyncing"] == false
                && n["blocks"] == 16
        }),
        "node-a was not resynced: {}",
        node(&cc, "node-a")
    );
    assert_eq!(node(&cc, "node-a")["url"], node_a.url.as_str());
    // The recovered blocks are on node A's NVMe tier now, and the decision uses them: either
    // prefill on pA, or prefill elsewhere pulling the prefix from node A.
    let (status, d) = cc.post_json(
        "/v1/route",
        &json!({"bucket": "llama", "token_ids": tokens, "output_length": 50, "dry_run": true}),
    );
    assert_eq!(status, 200, "{d}");
    let local = d["prefill"]["instance"] == "pA" && d["cached_blocks"] == 16;
    let pulled = d["pull"]["from_node"] == "node-a" && d["pull"]["blocks"] == 16;
    assert!(local || pulled, "the resynced blocks are not used: {d}");
    if pulled {
        assert_eq!(d["pull"]["tier"], "nvme", "{d}");
    }
}
