//! Blocks stored under engine-chosen keys through the KV API (SGLang `"{hash}_{tp_rank}_k"`,
//! LMCache `"{model}@{world}@{worker}@{chunk_hash}@{dtype}"`) reach the real conductor under
//! their opaque ids (`BlockHash::of_key`): a route request naming the engine's own keys, in
//! chain order, goes to the node holding the longest prefix of them, and stops going there once
//! the blocks are removed or evicted. Objects written through S3 under such keys are not KV
//! blocks and are never indexed.

use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use yutu_api::block_hash::BlockHash;
use yutu_client::kv::{KvClient, KvOptions};
use yutu_tests::server::wait_until;
use yutu_tests::{bin_path, Client, Server};

const BLOCK: u64 = 4096;

/// The prefill instance a request naming `keys` would go to, and how many of its blocks are
/// cached there.
fn route(c: &Client, keys: &[String]) -> (String, u64) {
    let (status, d) = c.post_json(
        "/v1/route",
        &json!({"bucket": "llama", "block_keys": keys, "output_length": 50, "dry_run": true}),
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

fn node_blocks(c: &Client, name: &str) -> Option<u64> {
    let nodes: Value = serde_json::from_slice(&c.get("/v1/nodes").body).unwrap_or(Value::Null);
    nodes.as_array()?.iter().find(|n| n["node"] == name)?["blocks"].as_u64()
}

/// Stores `keys` through the KV API (put-from out of a registered buffer), as an engine does.
fn put_from(kv: &KvClient, keys: &[String]) {
    let buf = kv.register(keys.len() as u64 * BLOCK).expect("buffer");
    let offsets: Vec<u64> = (0..keys.len() as u64).map(|i| i * BLOCK).collect();
    for (i, off) in offsets.iter().enumerate() {
        buf.write_at(*off, &vec![i as u8 + 1; BLOCK as usize])
            .expect("stage");
    }
    kv.batch_put_from("llama", keys, &buf, &offsets, &vec![BLOCK; keys.len()])
        .expect("put-from");
}

fn conductor_with_instances() -> Server {
    let mut cmd = Command::new(bin_path("yutu-conductor"));
    cmd.args(["serve", "--no-auth", "--listen", "127.0.0.1:0"]);
    let conductor = Server::spawn(cmd, tempfile::tempdir().unwrap());
    let cc = conductor.client();
    // pB registers first, so it wins ties: only a cached prefix draws requests to pA.
    for reg in [
        json!({"id": "pB", "role": "prefill", "node": "node-b"}),
        json!({"id": "pA", "role": "prefill", "node": "node-a"}),
        json!({"id": "d0", "role": "decode"}),
    ] {
        let (status, body) = cc.post_json("/v1/instances", &reg);
        assert_eq!(status, 200, "{body}");
    }
    conductor
}

#[test]
fn engine_keyed_blocks_are_routed_by_their_keys() {
    let conductor = conductor_with_instances();
    let cc = conductor.client();
    let node_a = Server::start(&[
        "--conductor",
        &conductor.url,
        "--node-name",
        "node-a",
        "--memory",
        "64MiB",
    ]);
    let s3 = node_a.client();
    s3.mb("llama");
    let kv = KvClient::new(&node_a.url, KvOptions::default()).expect("kv client");

    // SGLang pages: one key per page, tensor-parallel rank and K/V (and the MLA form).
    let pages: Vec<String> = (0..6).map(|i| BlockHash::from_id(i).to_string()).collect();
    let sglang = |rank: &str, kind: &str| -> Vec<String> {
        pages.iter().map(|h| format!("{h}_{rank}_{kind}")).collect()
    };
    let chain = sglang("0", "k");
    assert_eq!(route(&cc, &chain), ("pB".to_string(), 0));

    // An S3 PUT under an engine-shaped key is an ordinary object: written first, so that
    // once the KV blocks below are routed its event would have arrived too, had it made one.
    assert_eq!(s3.put("/llama/s3-object_0_k", b"plain").status, 200);
    assert_eq!(
        s3.put(&format!("/llama/{}", chain[5]), b"plain").status,
        200
    );

    // Pages 0 to 3 of every rank and kind, through the KV API. Page 4 is missing, and page
    // 5's rank-0 K key above is an S3 object: the cached prefix stops at 4 blocks.
    let mut stored: Vec<String> = Vec::new();
    for rank in ["0", "1"] {
        for kind in ["k", "v"] {
            let keys = sglang(rank, kind);
            stored.extend(keys[..4].iter().cloned());
        }
    }
    stored.extend(pages[..4].iter().map(|h| format!("{h}__k")));
    put_from(&kv, &stored);
    assert!(
        wait_until(Duration::from_secs(30), || route(&cc, &chain)
            == ("pA".to_string(), 4)),
        "engine keys never routed to pA: {:?}",
        route(&cc, &chain)
    );
    // The MLA form and another rank are blocks of their own, routed the same way.
    let mla: Vec<String> = pages[..4].iter().map(|h| format!("{h}__k")).collect();
    assert_eq!(route(&cc, &mla), ("pA".to_string(), 4));
    assert_eq!(route(&cc, &sglang("1", "v")), ("pA".to_string(), 4));
    // Chain order matters: a request whose first block is not cached has no cached prefix.
    let mut reversed = chain[..4].to_vec();
    reversed.reverse();
    reversed.insert(0, chain[4].clone());
    assert_eq!(route(&cc, &reversed).1, 0);
    // The S3 objects made no event: the node holds exactly the KV blocks.
    assert_eq!(node_blocks(&cc, "node-a"), Some(stored.len() as u64));
    assert_eq!(route(&cc, &["s3-object_0_k".to_string()]).1, 0);

    // LMCache chunks.
    let chunks: Vec<String> = (0..3)
        .map(|i| format!("llama@1@0@{:x}@bfloat16", 0x5eed_0000u64 + i))
        .collect();
    put_from(&kv, &chunks);
    assert!(
        wait_until(Duration::from_secs(30), || route(&cc, &chunks)
            == ("pA".to_string(), 3)),
        "LMCache keys never routed to pA: {:?}",
        route(&cc, &chunks)
    );

    // The node's snapshot names the same ids the events did.
    let snap: Value =
        serde_json::from_slice(&s3.get("/admin/v1/kv/snapshot").body).expect("snapshot");
    let held: std::collections::HashSet<String> = snap["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["blocks"].as_array().cloned().unwrap_or_default())
        .map(|b| b.as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(held.len(), stored.len() + chunks.len(), "{snap}");
    for key in stored.iter().chain(&chunks) {
        assert!(held.contains(&BlockHash::of_key(key).to_string()), "{key}");
    }

    // Removing the third page (all its keys) shortens the cached prefix to two blocks; then
    // removing the LMCache chunks drops them from routing.
    let third: Vec<String> = stored
        .iter()
        .filter(|k| k.starts_with(&pages[2]))
        .cloned()
        .collect();
    assert_eq!(third.len(), 5);
    assert!(kv
        .remove("llama", &third)
        .expect("remove")
        .iter()
        .all(|r| *r));
    assert!(
        wait_until(Duration::from_secs(30), || route(&cc, &chain)
            == ("pA".to_string(), 2)),
        "removed page still routed: {:?}",
        route(&cc, &chain)
    );
    assert!(kv
        .remove("llama", &chunks)
        .expect("remove")
        .iter()
        .all(|r| *r));
    assert!(
        wait_until(Duration::from_secs(30), || route(&cc, &chunks)
            == ("pB".to_string(), 0)),
        "removed chunks still routed: {:?}",
        route(&cc, &chunks)
    );
}

/// Engine-keyed blocks evicted from a DRAM-only node stop drawing requests to it.
#[test]
fn evicted_engine_keyed_blocks_stop_drawing_requests() {
    let conductor = conductor_with_instances();
    let cc = conductor.client();
    let node_a = Server::start(&[
        "--conductor",
        &conductor.url,
        "--node-name",
        "node-a",
        "--memory",
        "8MiB",
        "--shards",
        "1",
        "--nvme-capacity",
        "0",
    ]);
    let s3 = node_a.client();
    s3.mb("llama");
    let kv = KvClient::new(&node_a.url, KvOptions::default()).expect("kv client");
    let chunks: Vec<String> = (0..8)
        .map(|i| format!("llama@1@0@{:x}@bfloat16", 0xc0ffee00u64 + i))
        .collect();
    put_from(&kv, &chunks);
    assert!(
        wait_until(Duration::from_secs(30), || route(&cc, &chunks)
            == ("pA".to_string(), 8)),
        "never routed to pA: {:?}",
        route(&cc, &chunks)
    );
    // Three times the node's DRAM in S3 objects (no events of their own): the blocks go.
    for i in 0..24 {
        assert_eq!(
            s3.put(&format!("/llama/filler-{i}"), &vec![0u8; 1 << 20])
                .status,
            200
        );
    }
    assert!(node_a.metric_sum("yutu_evictions_total") >= 8.0);
    assert!(
        wait_until(Duration::from_secs(30), || route(&cc, &chunks).1 == 0),
        "evicted blocks still draw requests: {:?}",
        route(&cc, &chunks)
    );
    assert_eq!(node_blocks(&cc, "node-a"), Some(0));
}

/// Engine-keyed blocks in a `disk` bucket survive a restart on NVMe; the new epoch makes the
/// conductor resync from the snapshot, which lists them under the same ids (the NVMe record
/// remembers that they came through the KV API).
#[test]
fn engine_keyed_blocks_recovered_from_nvme_are_resynced() {
    let conductor = conductor_with_instances();
    let cc = conductor.client();
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--conductor",
        conductor.url.as_str(),
        "--node-name",
        "node-a",
        "--memory",
        "64MiB",
    ];
    let node_a = Server::start_on(dir.path(), &args);
    let s3 = node_a.client();
    let r = s3.send("PUT", "/llama", &[("x-yutu-durability", "disk")], Some(b""));
    assert_eq!(r.status, 200, "{}", r.text());
    // An S3 object under an engine-shaped key is on NVMe too, and must stay out of the index.
    assert_eq!(s3.put("/llama/s3-object_0_k", b"plain").status, 200);
    let chain: Vec<String> = (10..14)
        .map(|i| format!("{}_0_k", BlockHash::from_id(i)))
        .collect();
    {
        let kv = KvClient::new(&node_a.url, KvOptions::default()).expect("kv client");
        put_from(&kv, &chain);
    }
    assert!(
        wait_until(Duration::from_secs(30), || route(&cc, &chain)
            == ("pA".to_string(), 4)),
        "never routed to pA: {:?}",
        route(&cc, &chain)
    );
    let node = |c: &Client| -> Value {
        let nodes: Value = serde_json::from_slice(&c.get("/v1/nodes").body).unwrap_or_default();
        nodes
            .as_array()
            .and_then(|n| n.iter().find(|n| n["node"] == "node-a"))
            .cloned()
            .unwrap_or_default()
    };
    let old_epoch = node(&cc)["epoch"].as_u64().expect("epoch");
    node_a.kill();
    let node_a = Server::start_on(dir.path(), &args);
    assert!(
        wait_until(Duration::from_secs(30), || {
            let n = node(&cc);
            n["epoch"].as_u64().is_some_and(|e| e > old_epoch)
                && n["resyncing"] == false
                && n["blocks"] == 4
        }),
        "node-a was not resynced with its 4 blocks: {}",
        node(&cc)
    );
    assert_eq!(node(&cc)["url"], node_a.url.as_str());
    // Read from NVMe now: prefill on pA, or elsewhere pulling the prefix from node A.
    let (status, d) = cc.post_json(
        "/v1/route",
        &json!({"bucket": "llama", "block_keys": chain, "output_length": 50, "dry_run": true}),
    );
    assert_eq!(status, 200, "{d}");
    let local = d["prefill"]["instance"] == "pA" && d["cached_blocks"] == 4;
    let pulled = d["pull"]["from_node"] == "node-a" && d["pull"]["blocks"] == 4;
    assert!(local || pulled, "the resynced blocks are not used: {d}");
}
