//! Device (GPU) buffers over a cluster: the staged blocks of one `batch_put_from` land on
//! each key's owners, and `batch_get_into` reads them back into device memory, through the
//! host-memory device (the staging buffer is what the routing sees).

use yutu_client::kv::{Device, HostDevice, KvClient, KvOptions};
use yutu_tests::cluster::TestCluster;
use yutu_tests::pattern;

#[test]
fn device_blocks_are_routed_to_their_owners_and_back() {
    let c = TestCluster::start(3, &[]);
    let admin = TestCluster::admin_token();
    let auth = format!("Bearer {admin}");
    let r = c.node(0).client().send(
        "PUT",
        "/gpupool",
        &[("authorization", &auth), ("x-yutu-replicas", "2")],
        Some(b""),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let kv = KvClient::new(
        &c.node(2).url,
        KvOptions {
            token: Some(admin),
            ..KvOptions::default()
        },
    )
    .expect("KV client");
    assert_eq!(kv.cluster_nodes(), 3);
    let dev = HostDevice::new(0);
    let n = 40u64;
    let block = 64u64 << 10;
    let mem = dev.alloc(2 * n * block).unwrap();
    // SAFETY: `mem` belongs to `dev`, which outlives the buffer, and is never freed.
    let buf = unsafe { kv.register_device(dev.clone(), mem) }.expect("register");
    let keys: Vec<String> = (0..n).map(|i| format!("g{i}")).collect();
    let offsets: Vec<u64> = (0..n).map(|i| i * block).collect();
    for i in 0..n {
        dev.upload(&mem, i * block, &pattern(block as usize, i))
            .unwrap();
    }
    let etags = kv
        .batch_put_from("gpupool", &keys, &buf, &offsets, &vec![block; n as usize])
        .expect("put from device memory");
    assert!(etags.iter().all(|e| !e.is_empty()));
    let mut per_node = [0; 3];
    for (i, k) in keys.iter().enumerate() {
        let holders = c.holders(&format!("/gpupool/{k}"));
        assert_eq!(holders.len(), 2, "{k} is on {holders:?}");
        for h in holders {
            per_node[h] += 1;
            let local = c.local_get(h, &format!("/gpupool/{k}"));
            assert_eq!(
                local.body,
                pattern(block as usize, i as u64),
                "{k} on node {h}"
            );
        }
    }
    assert!(per_node.iter().all(|&x| x > 0), "{per_node:?}");
    let back: Vec<u64> = offsets.iter().map(|o| o + n * block).collect();
    let got = kv
        .batch_get_into("gpupool", &keys, &buf, &back)
        .expect("get into device memory");
    assert!(got.iter().all(|g| *g == Some(block)), "{got:?}");
    for i in 0..n {
        let mut out = vec![0u8; block as usize];
        dev.download(&mem, (n + i) * block, &mut out).unwrap();
        assert_eq!(out, pattern(block as usize, i), "block {i}");
    }
}
