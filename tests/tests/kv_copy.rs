//! put-from and get-into end to end: the node moves the bytes between its arena and the
//! client's registered buffer, straight through a mapping for a same-host client and through
//! its transfer engine (tcp) for a client on another host.

use std::time::Duration;

use serde_json::{json, Value};
use yutu_tests::kv::{client_engine, register, spawn_self};
use yutu_tests::server::wait_until;
use yutu_tests::{pattern, Client, Reply, Server};
use yutu_transfer::{LocalSegment, NodeAddress, SegmentDescriptor, TransferEngine};

fn send(c: &Client, path: &str, body: &Value) -> Reply {
    c.send(
        "POST",
        path,
        &[("content-type", "application/json")],
        Some(body.to_string().as_bytes()),
    )
}

fn post(c: &Client, path: &str, body: &Value) -> Value {
    let r = send(c, path, body);
    assert_eq!(r.status, 200, "POST {path}: {}", r.text());
    serde_json::from_slice(&r.body).expect("json")
}

/// A client engine with a registered buffer. `remote`: the engine claims another host, so the
/// node cannot map its buffer and must go through its engine over tcp.
struct Peer {
    engine: TransferEngine,
    buf: LocalSegment,
    session: String,
    _dir: tempfile::TempDir,
}

impl Peer {
    fn new(server: &Server, id: u64, len: usize, remote: bool) -> Peer {
        let dir = tempfile::tempdir().unwrap();
        let host = remote.then_some("another-host");
        let (engine, buf) = client_engine(id, dir.path(), host, len);
        let addr: NodeAddress =
            serde_json::from_slice(&server.client().get("/v1/kv/engine").body).unwrap();
        engine.add_peer(addr);
        let session = register(&server.client(), &engine);
        Peer {
            engine,
            buf,
            session,
            _dir: dir,
        }
    }

    fn whole(&self) -> SegmentDescriptor {
        self.buf.descriptor(0, self.buf.len()).unwrap()
    }

    fn read(&self, at: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        self.buf.region().read_at(at, &mut out).unwrap();
        out
    }

    fn put_from(&self, c: &Client, bucket: &str, blocks: &[(String, u64, u64)]) -> Reply {
        let blocks: Vec<Value> = blocks
            .iter()
            .map(|(k, off, len)| json!({"key": k, "offset": off, "len": len}))
            .collect();
        send(
            c,
            &format!("/v1/kv/{bucket}/put-from"),
            &json!({"blocks": blocks, "buffer": self.whole(), "session": self.session}),
        )
    }

    fn get_into(&self, c: &Client, bucket: &str, keys: &[String], ranges: &[(u64, u64)]) -> Reply {
        send(
            c,
            &format!("/v1/kv/{bucket}/get-into"),
            &json!({"keys": keys, "buffer": self.whole(), "ranges": ranges, "session": self.session}),
        )
    }
}

fn round_trip(remote: bool) {
    let server = Server::start(&["--memory", "256MiB", "--shards", "2"]);
    let c = server.client();
    c.mb("copy");
    let p = Peer::new(&server, 0x0c0 + remote as u64, 64 << 20, remote);
    let sizes = [1024u64, 4096, (1 << 20) + 7, 16 << 20];
    let mut blocks = Vec::new();
    let mut at = 0u64;
    for (i, s) in sizes.iter().enumerate() {
        p.buf
            .region()
            .write_at(at, &pattern(*s as usize, i as u64 + 40))
            .unwrap();
        blocks.push((format!("blk-{i}"), at, *s));
        at += s;
    }
    let r = p.put_from(&c, "copy", &blocks);
    assert_eq!(r.status, 200, "{}", r.text());
    let etags: Value = serde_json::from_slice(&r.body).unwrap();
    let etags = etags["etags"].as_array().unwrap();
    assert_eq!(etags.len(), sizes.len());
    // Visible through S3, byte for byte, with the ETag put-from answered.
    for (i, (k, _, s)) in blocks.iter().enumerate() {
        let r = c.get(&format!("/copy/{k}"));
        assert_eq!(r.status, 200);
        assert!(r.body == pattern(*s as usize, i as u64 + 40), "{k} via S3");
        assert_eq!(Some(etags[i].as_str().unwrap()), r.header("etag"));
    }
    // get-into a clean half of the buffer, plus a key that is absent.
    let mut keys: Vec<String> = blocks.iter().map(|b| b.0.clone()).collect();
    keys.push("absent".into());
    let mut ranges = Vec::new();
    let mut at = 32u64 << 20;
    for s in sizes {
        ranges.push((at, s));
        at += s;
    }
    ranges.push((at, 4096));
    let r = p.get_into(&c, "copy", &keys, &ranges);
    assert_eq!(r.status, 200, "{}", r.text());
    let copied: Value = serde_json::from_slice(&r.body).unwrap();
    let mut want: Vec<Value> = sizes.iter().map(|s| json!(s)).collect();
    want.push(Value::Null);
    assert_eq!(copied["copied"], Value::Array(want));
    for (i, ((off, s), _)) in ranges.iter().zip(&sizes).enumerate() {
        assert!(
            p.read(*off, *s as usize) == pattern(*s as usize, i as u64 + 40),
            "block {i} via get-into"
        );
    }
    // The per-key descriptor form does the same.
    let target = p.buf.descriptor(48 << 20, 4096).unwrap();
    let r = post(
        &c,
        "/v1/kv/copy/get-into",
        &json!({"keys": ["blk-1"], "targets": [target], "session": p.session}),
    );
    assert_eq!(r["copied"], json!([4096]));
    assert!(p.read(48 << 20, 4096) == pattern(4096, 41));

    // Which path moved the bytes: the client's tcp listener served the node only when the
    // client was remote; a same-host client's buffer was mapped once and checked once.
    let stats = p.engine.stats();
    if remote {
        assert!(stats.tcp_listener.requests > 0, "{stats:?}");
    } else {
        assert_eq!(stats.tcp_listener.requests, 0, "{stats:?}");
        assert!(stats.shm_listener.requests <= 2, "{stats:?}");
    }
}

#[test]
fn same_host_clients_are_served_through_a_mapping() {
    round_trip(false);
}

/// A put-from batch longer than one run (runs of 256 keys are reserved and filled together)
/// that names keys several times, within a run and across runs, and replaces blocks already
/// stored: every block lands whole, the last of a key's blocks wins, and its ETag is the
/// one a GET then shows.
#[test]
fn a_long_put_from_batch_stores_every_block_and_a_repeated_key_keeps_the_later() {
    let server = Server::start(&["--memory", "256MiB", "--shards", "2"]);
    let c = server.client();
    c.mb("runs");
    let p = Peer::new(&server, 0x0c7, 4 << 20, false);
    let n = 600usize;
    let mut blocks = Vec::new();
    for i in 0..n {
        let len = 1000 + (i % 7) * 300;
        let at = (i * 4096) as u64;
        p.buf
            .region()
            .write_at(at, &pattern(len, i as u64))
            .unwrap();
        // 200 keys three times over, so that some repeat within one run of 256.
        blocks.push((format!("k{}", i % 200), at, len as u64));
    }
    for round in 0..2 {
        let r = p.put_from(&c, "runs", &blocks);
        assert_eq!(r.status, 200, "round {round}: {}", r.text());
        let etags: Value = serde_json::from_slice(&r.body).unwrap();
        let etags = etags["etags"].as_array().unwrap().clone();
        assert_eq!(etags.len(), n);
        for i in 400..n {
            let (key, _, len) = &blocks[i];
            let r = c.get(&format!("/runs/{key}"));
            assert_eq!(r.status, 200, "{key}");
            assert!(
                r.body == pattern(*len as usize, i as u64),
                "{key} round {round}"
            );
            assert_eq!(r.header("etag"), etags[i].as_str(), "{key}");
        }
    }
}

#[test]
fn remote_clients_are_served_through_the_engine() {
    round_trip(true);
}

#[test]
fn bad_requests_are_refused_and_nothing_is_stored() {
    let server = Server::start(&["--memory", "64MiB"]);
    let c = server.client();
    c.mb("bad");
    let p = Peer::new(&server, 0xbad, 1 << 20, false);
    assert_eq!(c.put("/bad/seed", b"seed").status, 200);
    let whole = p.whole();
    let me = p.session.clone();
    let expect_400 = |path: &str, body: Value, why: &str| {
        let r = send(&c, path, &body);
        assert_eq!(r.status, 400, "{why}: {}", r.text());
        assert_eq!(r.code().as_deref(), Some("InvalidArgument"), "{why}");
    };
    // Ranges outside the buffer.
    expect_400(
        "/v1/kv/bad/put-from",
        json!({"blocks": [{"key": "k", "offset": (1u64 << 20) - 10, "len": 11}], "buffer": whole, "session": me}),
        "range past the buffer",
    );
    expect_400(
        "/v1/kv/bad/get-into",
        json!({"keys": ["k"], "buffer": whole, "ranges": [[u64::MAX, 2]], "session": me}),
        "overflowing range",
    );
    // A forged token: the client's engine refuses it, the node stores nothing.
    let mut forged = whole;
    forged.token.0[0] ^= 0xff;
    expect_400(
        "/v1/kv/bad/put-from",
        json!({"blocks": [{"key": "forged", "offset": 0, "len": 16}], "buffer": forged, "session": me}),
        "forged token",
    );
    assert_eq!(c.head("/bad/forged").status, 404);
    // Both target forms at once, or neither; a count that does not match the keys.
    expect_400(
        "/v1/kv/bad/get-into",
        json!({"keys": ["k"], "targets": [whole], "buffer": whole, "ranges": [[0, 1]], "session": me}),
        "two target forms",
    );
    expect_400(
        "/v1/kv/bad/get-into",
        json!({"keys": ["k"], "session": me}),
        "no targets",
    );
    expect_400(
        "/v1/kv/bad/get-into",
        json!({"keys": ["k", "l"], "buffer": whole, "ranges": [[0, 1]], "session": me}),
        "fewer ranges than keys",
    );
    // The node's own engine cannot be registered as a client.
    let server_addr: NodeAddress = serde_json::from_slice(&c.get("/v1/kv/engine").body).unwrap();
    expect_400(
        "/v1/kv/peers",
        json!({"client": server_addr, "secret": "00".repeat(32)}),
        "the server's own node id",
    );
    // A session that does not exist.
    expect_400(
        "/v1/kv/bad/put-from",
        json!({"blocks": [{"key": "k", "offset": 0, "len": 1}], "buffer": whole, "session": "0123"}),
        "an unknown session",
    );
    // A descriptor of memory that is not the caller's (here: the node's own arena, leased
    // for reading) cannot be made a get-into target or a put-from source.
    let leased = post(&c, "/v1/kv/bad/get", &json!({"keys": ["seed"]}));
    let arena = leased["blocks"][0]["descriptor"].clone();
    assert!(arena.is_object(), "{leased}");
    expect_400(
        "/v1/kv/bad/get-into",
        json!({"keys": ["seed"], "targets": [arena], "session": me}),
        "the node's arena as target",
    );
    expect_400(
        "/v1/kv/bad/put-from",
        json!({"blocks": [{"key": "copy", "offset": 0, "len": 4}], "buffer": arena, "session": me}),
        "the node's arena as source",
    );
    assert_eq!(c.get("/bad/seed").body, b"seed");
    // A block larger than the room given for it.
    p.buf.region().write_at(0, &[7u8; 8192]).unwrap();
    let r = p.put_from(&c, "bad", &[("big".into(), 0, 8192)]);
    assert_eq!(r.status, 200, "{}", r.text());
    let r = p.get_into(&c, "bad", &["big".into()], &[(65536, 100)]);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("8192"), "{}", r.text());
    assert!(p.read(65536, 100).iter().all(|b| *b == 0));
    // Unknown bucket; malformed JSON.
    let r = p.put_from(&c, "nobucket", &[("k".into(), 0, 1)]);
    assert_eq!(r.status, 404);
    let r = c.send("POST", "/v1/kv/bad/put-from", &[], Some(b"{\"blocks\": ["));
    assert_eq!(r.status, 400);
    // The node still serves.
    assert_eq!(c.get("/bad/big").body, vec![7u8; 8192]);
}

#[test]
fn blocks_only_on_nvme_are_served_by_get_into() {
    // 64 MiB of DRAM over two shards; 160 MiB written: the first blocks end up on NVMe only.
    let server = Server::start(&[
        "--memory",
        "64MiB",
        "--shards",
        "2",
        "--nvme-capacity",
        "512MiB",
    ]);
    let c = server.client();
    c.mb("spill");
    let p = Peer::new(&server, 0x5b1, 8 << 20, false);
    let block = 1u64 << 20;
    for batch in 0..20u64 {
        let mut blocks = Vec::new();
        for slot in 0..8u64 {
            let n = batch * 8 + slot;
            p.buf
                .region()
                .write_at(slot * block, &pattern(block as usize, n))
                .unwrap();
            blocks.push((format!("b{n}"), slot * block, block));
        }
        let r = p.put_from(&c, "spill", &blocks);
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let evicted = wait_until(Duration::from_secs(30), || {
        server.metric_sum("yutu_demotions_total") >= 8.0
    });
    assert!(evicted, "nothing was demoted to NVMe");
    let keys: Vec<String> = (0..4).map(|n| format!("b{n}")).collect();
    let ranges: Vec<(u64, u64)> = (0..4).map(|i| (i * block, block)).collect();
    let hits = server.metric_sum("yutu_tier_hits_total{tier=\"nvme\"");
    let r = p.get_into(&c, "spill", &keys, &ranges);
    assert_eq!(r.status, 200, "{}", r.text());
    for n in 0..4u64 {
        assert!(
            p.read(n * block, block as usize) == pattern(block as usize, n),
            "b{n} from NVMe"
        );
    }
    assert!(server.metric_sum("yutu_tier_hits_total{tier=\"nvme\"") > hits);
}

#[test]
fn readers_never_see_a_mix_of_two_writes() {
    let server = Server::start(&["--memory", "128MiB", "--shards", "2"]);
    let c = server.client();
    c.mb("race");
    let len = 1usize << 20;
    let writer = Peer::new(&server, 0x71, 2 * len, false);
    writer.buf.region().write_at(0, &vec![b'a'; len]).unwrap();
    writer
        .buf
        .region()
        .write_at(len as u64, &vec![b'b'; len])
        .unwrap();
    let r = writer.put_from(&c, "race", &[("hot".into(), 0, len as u64)]);
    assert_eq!(r.status, 200);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let c = server.client();
            for round in 0..200u64 {
                let at = (round % 2) * len as u64;
                let r = writer.put_from(&c, "race", &[("hot".into(), at, len as u64)]);
                assert_eq!(r.status, 200, "{}", r.text());
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        for id in 0..2u64 {
            let (server, stop) = (&server, &stop);
            s.spawn(move || {
                let c = server.client();
                let reader = Peer::new(server, 0x80 + id, len, false);
                let mut reads = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) || reads < 10 {
                    let r = reader.get_into(&c, "race", &["hot".into()], &[(0, len as u64)]);
                    assert_eq!(r.status, 200, "{}", r.text());
                    let got = reader.read(0, len);
                    assert!(
                        got.iter().all(|b| *b == got[0]) && (got[0] == b'a' || got[0] == b'b'),
                        "a read saw a mix of two writes"
                    );
                    reads += 1;
                }
            });
        }
    });
}

/// A child process (this test binary re-run) that loops put-from of 8 MiB blocks until killed.
#[test]
fn put_from_child_writer() {
    let Ok(url) = std::env::var("YUTU_PUT_FROM_CHILD_URL") else {
        return;
    };
    let c = Client::new(&url);
    let dir = tempfile::tempdir().unwrap();
    let (engine, buf) = client_engine(0xc41d, dir.path(), None, 8 << 20);
    let whole = buf.descriptor(0, buf.len()).unwrap();
    let session = register(&c, &engine);
    loop {
        let body = json!({"blocks": [{"key": "victim", "offset": 0, "len": 8 << 20}],
            "buffer": whole, "session": session});
        let _ = send(&c, "/v1/kv/dying/put-from", &body);
    }
}

#[test]
fn a_client_killed_during_put_from_leaves_the_server_serving() {
    let server = Server::start(&["--memory", "128MiB", "--shards", "2"]);
    let c = server.client();
    c.mb("dying");
    let mut child = spawn_self(
        "put_from_child_writer",
        "YUTU_PUT_FROM_CHILD_URL",
        &server.url,
    );
    let stored = wait_until(Duration::from_secs(30), || {
        c.head("/dying/victim").status == 200
    });
    assert!(stored, "the child never stored its block");
    child.kill().unwrap();
    child.wait().unwrap();
    // Whatever the child was doing, the node serves the last whole block and takes new work.
    let r = c.get("/dying/victim");
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), 8 << 20);
    assert_eq!(c.put("/dying/after", b"still serving").status, 200);
    assert_eq!(c.get("/dying/after").body, b"still serving");
}
