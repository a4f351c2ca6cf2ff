//! The KV block API end to end: the real server, a client transfer engine in this process,
//! one-sided writes (put-start/put-end) and reads (get, get-into) over shm and over tcp.

use std::time::Duration;

use serde_json::{json, Value};
use yutu_tests::kv::{client_engine, register, spawn_self};
use yutu_tests::server::wait_until;
use yutu_tests::{pattern, Client, Server};
use yutu_transfer::transport::TransportKind;
use yutu_transfer::{
    EngineConfig, HugePages, LocalSegment, MemoryRegion, NodeAddress, NodeId, SegmentDescriptor,
    TransferEngine, TransferRequest,
};

fn post(c: &Client, path: &str, body: &Value) -> Value {
    let r = c.send(
        "POST",
        path,
        &[("content-type", "application/json")],
        Some(body.to_string().as_bytes()),
    );
    assert_eq!(r.status, 200, "POST {path}: {}", r.text());
    serde_json::from_slice(&r.body).expect("json")
}

struct Peer {
    engine: TransferEngine,
    buf: LocalSegment,
    _dir: tempfile::TempDir,
}

/// A client engine with a registered 64 MiB buffer, peered with the server's engine.
fn peer(server: &Server, id: u64) -> Peer {
    let dir = tempfile::tempdir().unwrap();
    let (engine, buf) = client_engine(id, dir.path(), None, 64 << 20);
    let addr: NodeAddress =
        serde_json::from_slice(&server.client().get("/v1/kv/engine").body).unwrap();
    engine.add_peer(addr);
    Peer {
        engine,
        buf,
        _dir: dir,
    }
}

fn desc(v: &Value) -> SegmentDescriptor {
    serde_json::from_value(v.clone()).expect("a descriptor")
}

fn roundtrip(server: &Server, path: TransportKind, bucket: &str) {
    let c = server.client();
    let p = peer(server, 0x5151 + path as u64);
    let sizes = [1024usize, 65_536, (1 << 20) + 7, 16 << 20];
    let keys: Vec<String> = (0..sizes.len())
        .map(|i| format!("blk-{path:?}-{i}"))
        .collect();
    // Stage the blocks in the client buffer and put them one-sidedly.
    let mut at = 0u64;
    let mut offsets = Vec::new();
    for (i, size) in sizes.iter().enumerate() {
        p.buf
            .region()
            .write_at(at, &pattern(*size, i as u64 + 11))
            .unwrap();
        offsets.push(at);
        at += *size as u64;
    }
    let blocks: Vec<Value> = keys
        .iter()
        .zip(sizes)
        .map(|(k, s)| json!({"key": k, "len": s}))
        .collect();
    let started = post(
        &c,
        &format!("/v1/kv/{bucket}/put-start"),
        &json!({"blocks": blocks}),
    );
    let puts = started["puts"].as_array().unwrap();
    let writes: Vec<TransferRequest> = puts
        .iter()
        .zip(&offsets)
        .map(|(p_, off)| TransferRequest::write(&p.buf, *off, &desc(&p_["descriptor"])))
        .collect();
    let done = p
        .engine
        .submit_via(writes, &[path])
        .unwrap()
        .wait()
        .into_result()
        .expect("one-sided writes");
    assert!(done.iter().all(|d| d.transport == path), "{done:?}");
    let ids: Vec<u64> = puts
        .iter()
        .map(|p_| p_["put_id"].as_u64().unwrap())
        .collect();
    let ended = post(
        &c,
        &format!("/v1/kv/{bucket}/put-end"),
        &json!({"put_ids": ids}),
    );
    assert_eq!(ended["etags"].as_array().unwrap().len(), sizes.len());
    // Visible through the S3 API too.
    for (i, (k, s)) in keys.iter().zip(sizes).enumerate() {
        let r = c.get(&format!("/{bucket}/{k}"));
        assert!(
            r.status == 200 && r.body == pattern(s, i as u64 + 11),
            "{k} via S3"
        );
    }
    // get: leases and descriptors, read one-sidedly into a clean part of the buffer.
    let got = post(&c, &format!("/v1/kv/{bucket}/get"), &json!({"keys": keys}));
    let base = 32u64 << 20;
    let mut reads = Vec::new();
    let mut at = base;
    let mut read_at = Vec::new();
    for b in got["blocks"].as_array().unwrap() {
        let d = desc(&b["descriptor"]);
        reads.push(TransferRequest::read(&p.buf, at, &d));
        read_at.push(at);
        at += d.len;
    }
    p.engine
        .submit_via(reads, &[path])
        .unwrap()
        .wait()
        .into_result()
        .expect("one-sided reads");
    for (i, (s, off)) in sizes.iter().zip(&read_at).enumerate() {
        let mut back = vec![0u8; *s];
        p.buf.region().read_at(*off, &mut back).unwrap();
        assert!(
            back == pattern(*s, i as u64 + 11),
            "block {i} read back over {path:?}"
        );
    }
    let released = post(&c, "/v1/kv/release", &json!({"leases": got["leases"]}));
    assert!(released["released"].as_u64().unwrap() >= 1);
    // get-into: the server writes into the client's buffer.
    p.buf.region().write_at(base, &vec![0u8; 20 << 20]).unwrap();
    let targets: Vec<Value> = read_at
        .iter()
        .zip(sizes)
        .map(|(off, s)| serde_json::to_value(p.buf.descriptor(*off, s as u64).unwrap()).unwrap())
        .collect();
    let into = post(
        &c,
        &format!("/v1/kv/{bucket}/get-into"),
        &json!({"keys": keys, "targets": targets, "session": register(&c, &p.engine)}),
    );
    assert_eq!(into["copied"].as_array().unwrap().len(), sizes.len());
    for (i, (s, off)) in sizes.iter().zip(&read_at).enumerate() {
        let mut back = vec![0u8; *s];
        p.buf.region().read_at(*off, &mut back).unwrap();
        assert!(back == pattern(*s, i as u64 + 11), "block {i} via get-into");
    }
    // exists, prefix, remove.
    let mut probe = keys.clone();
    probe.insert(2, "missing".into());
    let e = post(
        &c,
        &format!("/v1/kv/{bucket}/exists"),
        &json!({"keys": probe}),
    );
    assert_eq!(e["exists"], json!([true, true, false, true, true]));
    let pre = post(
        &c,
        &format!("/v1/kv/{bucket}/prefix"),
        &json!({"keys": probe}),
    );
    assert_eq!(pre["present"], 2);
    let rm = post(
        &c,
        &format!("/v1/kv/{bucket}/remove"),
        &json!({"keys": [keys[0].clone()]}),
    );
    assert_eq!(rm["removed"], json!([true]));
    assert_eq!(c.get(&format!("/{bucket}/{}", keys[0])).status, 404);
}

#[test]
fn blocks_move_one_sidedly_over_tcp_and_the_arena_is_never_mapped() {
    let server = Server::start(&["--memory", "256MiB", "--shards", "2"]);
    let c = server.client();
    c.mb("kvblocks");
    roundtrip(&server, TransportKind::Tcp, "kvblocks");
    // The arena holds every tenant's blocks: a same-host client never gets its memfd (it
    // would reach every range, granted or not), so descriptors into it go over tcp.
    let p = peer(&server, 0x5252);
    let started = post(
        &c,
        "/v1/kv/kvblocks/put-start",
        &json!({"blocks": [{"key": "via-shm", "len": 4096}]}),
    );
    let d = desc(&started["puts"][0]["descriptor"]);
    let refused = match p.engine.submit_via(
        [TransferRequest::write(&p.buf, 0, &d)],
        &[TransportKind::Shm],
    ) {
        Err(e) => e.to_string(),
        Ok(batch) => format!("{:?}", batch.wait().into_result()),
    };
    assert!(
        refused.contains("not shared over shm"),
        "the arena was reachable over shm: {refused:?}"
    );
    p.engine
        .transfer([TransferRequest::write(&p.buf, 0, &d)])
        .expect("the same write over the engine's other path");
}

#[test]
fn leases_hold_under_eviction_and_abandoned_puts_are_reclaimed() {
    let server = Server::start(&["--memory", "16MiB", "--shards", "1", "--nvme-capacity", "0"]);
    let c = server.client();
    c.mb("lease");
    let data = pattern(1 << 20, 5);
    assert_eq!(c.put("/lease/held", &data).status, 200);
    let p = peer(&server, 0x77);
    let got = post(
        &c,
        "/v1/kv/lease/get",
        &json!({"keys": ["held"], "ttl_ms": 60000}),
    );
    let d = desc(&got["blocks"][0]["descriptor"]);
    // Three times the DRAM through S3, and the leased block replaced: its bytes stay put.
    assert_eq!(c.put("/lease/held", &pattern(1 << 20, 6)).status, 200);
    for i in 0..48 {
        assert_eq!(
            c.put(&format!("/lease/fill-{i}"), &vec![i as u8; 1 << 20])
                .status,
            200
        );
    }
    assert!(server.metric_sum("yutu_evictions_total") > 10.0);
    p.engine
        .transfer([TransferRequest::read(&p.buf, 0, &d)])
        .expect("leased read");
    let mut back = vec![0u8; 1 << 20];
    p.buf.region().read_at(0, &mut back).unwrap();
    assert!(back == data, "leased bytes changed under eviction");
    post(&c, "/v1/kv/release", &json!({"leases": got["leases"]}));
    // Released: the same descriptor is refused now, never served from reused memory.
    let after = p.engine.transfer([TransferRequest::read(&p.buf, 0, &d)]);
    assert!(after.is_err(), "a read after release was served");
    // An expired lease is refused the same way, without a release.
    assert_eq!(c.put("/lease/short", &data).status, 200);
    let got = post(
        &c,
        "/v1/kv/lease/get",
        &json!({"keys": ["short"], "ttl_ms": 300}),
    );
    let d = desc(&got["blocks"][0]["descriptor"]);
    p.engine
        .transfer([TransferRequest::read(&p.buf, 0, &d)])
        .expect("read within the lease");
    assert!(
        wait_until(Duration::from_secs(10), || p
            .engine
            .transfer([TransferRequest::read(&p.buf, 0, &d)])
            .is_err()),
        "a read after the lease expired was still served"
    );
    // A put-start never ended is reclaimed after its ttl; put-end then fails.
    for i in 0..48 {
        c.delete(&format!("/lease/fill-{i}"));
    }
    let before = server.metric_sum("yutu_dram_used_bytes");
    let started = post(
        &c,
        "/v1/kv/lease/put-start",
        &json!({"blocks": [{"key": "never", "len": 4 << 20}], "ttl_ms": 200}),
    );
    let id = started["puts"][0]["put_id"].as_u64().unwrap();
    assert!(server.metric_sum("yutu_dram_used_bytes") > before);
    assert!(wait_until(Duration::from_secs(10), || server
        .metric_sum("yutu_dram_used_bytes")
        <= before));
    let r = c.send(
        "POST",
        "/v1/kv/lease/put-end",
        &[],
        Some(json!({"put_ids": [id]}).to_string().as_bytes()),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(c.get("/lease/never").status, 404);
    // Bad requests are refused clearly.
    let r = c.send("POST", "/v1/kv/lease/get", &[], Some(b"{not json"));
    assert_eq!(
        (r.status, r.code().as_deref()),
        (400, Some("InvalidArgument"))
    );
    let r = c.send(
        "POST",
        "/v1/kv/nobucket/get",
        &[],
        Some(br#"{"keys":["a"]}"#),
    );
    assert_eq!((r.status, r.code().as_deref()), (404, Some("NoSuchBucket")));
}

/// Writes block versions of one key forever: every byte of a version is the same value,
/// and its length depends on it, so a mixed read is detectable.
fn version(v: u8) -> Vec<u8> {
    vec![v; 100_000 + v as usize * 1_000]
}

#[test]
fn concurrent_readers_and_a_writer_never_see_mixed_bytes() {
    let server = Server::start(&["--memory", "128MiB", "--shards", "2"]);
    let c = server.client();
    c.mb("race");
    let url = server.url.clone();
    let addr: NodeAddress = serde_json::from_slice(&c.get("/v1/kv/engine").body).unwrap();
    let writer = {
        let c = c.clone();
        let p = peer(&server, 0x900);
        std::thread::spawn(move || {
            for v in 1..=60u8 {
                let data = version(v);
                p.buf.region().write_at(0, &data).unwrap();
                let s = post(
                    &c,
                    "/v1/kv/race/put-start",
                    &json!({"blocks": [{"key": "hot", "len": data.len()}]}),
                );
                let d = desc(&s["puts"][0]["descriptor"]);
                p.engine
                    .transfer([TransferRequest::write(&p.buf, 0, &d)])
                    .unwrap();
                post(
                    &c,
                    "/v1/kv/race/put-end",
                    &json!({"put_ids": [s["puts"][0]["put_id"]]}),
                );
            }
        })
    };
    let readers: Vec<_> = (0..2u64)
        .map(|r| {
            let c = Client::new(&url);
            let addr = addr.clone();
            let dir = tempfile::tempdir().unwrap();
            std::thread::spawn(move || {
                let mut cfg = EngineConfig::new(NodeId(0xa00 + r));
                cfg.shm_dir = Some(dir.path().to_path_buf());
                let engine = TransferEngine::start(cfg).unwrap();
                let buf = engine
                    .register(MemoryRegion::allocate("reader", 1 << 20, HugePages::Never).unwrap())
                    .unwrap();
                engine.add_peer(addr);
                let mut seen = 0;
                for _ in 0..150 {
                    let g = post(&c, "/v1/kv/race/get", &json!({"keys": ["hot"]}));
                    let b = &g["blocks"][0];
                    if b["descriptor"].is_null() {
                        continue;
                    }
                    let d = desc(&b["descriptor"]);
                    engine
                        .transfer([TransferRequest::read(&buf, 0, &d)])
                        .unwrap();
                    let mut back = vec![0u8; d.len as usize];
                    buf.region().read_at(0, &mut back).unwrap();
                    assert!(
                        back == version(back[0]),
                        "mixed bytes: {} bytes starting with {}",
                        back.len(),
                        back[0]
                    );
                    post(&c, "/v1/kv/release", &json!({"leases": g["leases"]}));
                    seen += 1;
                }
                seen
            })
        })
        .collect();
    writer.join().expect("writer");
    let seen: u32 = readers.into_iter().map(|r| r.join().expect("reader")).sum();
    assert!(seen > 100, "readers saw {seen} versions");
    let last = c.get("/race/hot").body;
    assert!(last == version(60));
}

/// Run as a child process by `a_client_killed_mid_transfer_leaves_the_server_serving`:
/// starts puts and writes forever. A no-op when run directly.
#[test]
fn kv_child_writer() {
    let Ok(url) = std::env::var("YUTU_KV_CHILD_URL") else {
        return;
    };
    let c = Client::new(&url);
    let dir = tempfile::tempdir().unwrap();
    let (engine, buf) = client_engine(0xdead, dir.path(), None, 16 << 20);
    let addr: NodeAddress = serde_json::from_slice(&c.get("/v1/kv/engine").body).unwrap();
    engine.add_peer(addr);
    loop {
        // Reservations never ended pile up until their ttl: a refusal (503 when the shard is
        // full of them) is expected here, and the child just tries again.
        let body = json!({"blocks": [{"key": "victim", "len": 4 << 20}], "ttl_ms": 1000});
        let r = c.send(
            "POST",
            "/v1/kv/dying/put-start",
            &[],
            Some(body.to_string().as_bytes()),
        );
        if r.status != 200 {
            continue;
        }
        let s: Value = serde_json::from_slice(&r.body).unwrap();
        let d = desc(&s["puts"][0]["descriptor"]);
        let _ = engine.transfer([TransferRequest::write(&buf, 0, &d)]);
    }
}

#[test]
fn a_client_killed_mid_transfer_leaves_the_server_serving() {
    // The child's abandoned reservations pile up to all of DRAM (one anonymous user).
    let server = Server::start(&[
        "--memory",
        "128MiB",
        "--shards",
        "2",
        "--kv-user-reserved",
        "128MiB",
        "--kv-user-leased",
        "128MiB",
    ]);
    let c = server.client();
    c.mb("dying");
    assert_eq!(c.put("/dying/victim", b"the old version").status, 200);
    let mut child = spawn_self("kv_child_writer", "YUTU_KV_CHILD_URL", &server.url);
    let kv_ok = || {
        server.metric_sum("yutu_requests_total{shard=\"0\",op=\"Kv\",status=\"200\"}")
            + server.metric_sum("yutu_requests_total{shard=\"1\",op=\"Kv\",status=\"200\"}")
    };
    assert!(
        wait_until(Duration::from_secs(30), || kv_ok() >= 6.0),
        "the child never got going"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    // The server keeps serving; the old object is intact (no put-end ever came).
    assert_eq!(c.get("/health").status, 200);
    assert_eq!(c.get("/dying/victim").body, b"the old version");
    // The abandoned reservations are reclaimed after their ttl.
    assert!(wait_until(Duration::from_secs(15), || server
        .metric_sum("yutu_dram_used_bytes")
        < (1 << 20) as f64));
    roundtrip(&server, TransportKind::Tcp, "dying");
}
