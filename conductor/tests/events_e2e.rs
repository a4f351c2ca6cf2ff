//! End to end: the real `yutu-conductor` binary, fed KV events over HTTP, with a fake storage
//! node (a small HTTP server in this test) serving the snapshot endpoint.
//!
//! What it shows: blocks stored on node A attract a request with that prefix to A; once A
//! removes them they no longer do; a gap in A's sequence numbers, a restart (new epoch) and a
//! sequence that starts over each make the conductor fetch A's snapshot and rebuild A's
//! entries from it, replaying the events that followed.
//!
//! No sleeps to synchronise: the conductor's background resync is awaited by polling
//! `GET /v1/nodes` for the expected state, with a deadline.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use yutu_api::block_hash::{BlockHash, BlockHasher};
use yutu_api::events::{
    KvEvent, KvEventBatch, KvEventKind, KvSnapshot, SnapshotGroup, Tier, SNAPSHOT_PATH,
};

const BUCKET: &str = "llama";

/// A running conductor, killed when dropped.
struct ConductorProcess {
    child: Child,
    url: String,
}

impl ConductorProcess {
    fn start() -> ConductorProcess {
        let mut child = Command::new(env!("CARGO_BIN_EXE_yutu-conductor"))
            .args(["serve", "--no-auth", "--listen", "127.0.0.1:0"])
            .env("YUTU_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn yutu-conductor");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("listening on ").nth(1) {
                    let addr: String = rest
                        .chars()
                        .take_while(|c| c.is_ascii_hexdigit() || ".:[]".contains(*c))
                        .collect();
                    let _ = tx.send(addr);
                }
            }
        });
        let addr: SocketAddr = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(a) => a.parse().expect("a socket address"),
            Err(_) => {
                let _ = child.kill();
                panic!("yutu-conductor did not announce its address");
            }
        };
        ConductorProcess {
            child,
            url: format!("http://{addr}"),
        }
    }
}

impl Drop for ConductorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A storage node that only serves its KV snapshot, and counts how often it was asked.
struct FakeNode {
    addr: SocketAddr,
    snapshot: Arc<Mutex<String>>,
    served: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl FakeNode {
    fn start(initial: &KvSnapshot) -> FakeNode {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let snapshot = Arc::new(Mutex::new(
            serde_json::to_string(initial).expect("serializes"),
        ));
        let served = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (snap, count, halt) = (snapshot.clone(), served.clone(), stop.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if halt.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(s) = stream {
                    serve_one(s, &snap, &count);
                }
            }
        });
        FakeNode {
            addr,
            snapshot,
            served,
            stop,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn set(&self, s: &KvSnapshot) {
        *self.snapshot.lock().expect("lock") = serde_json::to_string(s).expect("serializes");
    }

    fn served(&self) -> usize {
        self.served.load(Ordering::SeqCst)
    }
}

impl Drop for FakeNode {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so the thread sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

/// Answers one HTTP/1.1 request on `stream` and closes it.
fn serve_one(mut stream: TcpStream, snapshot: &Mutex<String>, served: &AtomicUsize) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 65_536 {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&head);
    let request_line = text.lines().next().unwrap_or_default().to_owned();
    let (status, body) = if request_line.starts_with(&format!("GET {SNAPSHOT_PATH} ")) {
        served.fetch_add(1, Ordering::SeqCst);
        (
            "200 OK",
            snapshot.lock().map(|s| s.clone()).unwrap_or_default(),
        )
    } else {
        ("404 Not Found", String::new())
    };
    let _ = write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// A blocking JSON client that never turns a status into an error.
struct Http {
    base: String,
    agent: ureq::Agent,
}

impl Http {
    fn new(base: &str) -> Http {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(30)))
            .build()
            .into();
        Http {
            base: base.to_owned(),
            agent,
        }
    }

    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let mut resp = self
            .agent
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .send(body.to_string())
            .expect("request sent");
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    fn get_text(&self, path: &str) -> (u16, String) {
        let mut resp = self
            .agent
            .get(format!("{}{path}", self.base))
            .call()
            .expect("request sent");
        let status = resp.status().as_u16();
        (status, resp.body_mut().read_to_string().unwrap_or_default())
    }

    fn get(&self, path: &str) -> Value {
        let (status, text) = self.get_text(path);
        assert_eq!(status, 200, "GET {path}: {text}");
        serde_json::from_str(&text).expect("json")
    }
}

/// Token ids of a prompt of `blocks` full blocks, distinct per `salt`.
fn prompt(blocks: usize, salt: u32) -> Vec<u32> {
    (0..(blocks * 512) as u32)
        .map(|i| i ^ (salt << 24))
        .collect()
}

fn hashes(tokens: &[u32]) -> Vec<BlockHash> {
    BlockHasher::new(512).hash_tokens(tokens)
}

fn push(http: &Http, epoch: u64, events: Vec<KvEvent>) -> Value {
    let batch = KvEventBatch {
        node: "node-a".into(),
        epoch,
        events,
    };
    let (status, body) = http.post(
        "/v1/events",
        &serde_json::to_value(&batch).expect("serializes"),
    );
    assert_eq!(status, 200, "{body}");
    body
}

fn stored(seq: u64, blocks: &[BlockHash]) -> KvEvent {
    KvEvent {
        seq,
        kind: KvEventKind::Stored {
            bucket: BUCKET.into(),
            tier: Tier::Dram,
            blocks: blocks.to_vec(),
        },
    }
}

fn removed(seq: u64, blocks: &[BlockHash]) -> KvEvent {
    KvEvent {
        seq,
        kind: KvEventKind::Removed {
            bucket: BUCKET.into(),
            blocks: blocks.to_vec(),
        },
    }
}

fn snapshot(epoch: u64, seq: u64, groups: Vec<(Tier, &[BlockHash])>) -> KvSnapshot {
    KvSnapshot {
        node: "node-a".into(),
        epoch,
        seq,
        groups: groups
            .into_iter()
            .map(|(tier, blocks)| SnapshotGroup {
                bucket: BUCKET.into(),
                tier,
                blocks: blocks.to_vec(),
            })
            .collect(),
    }
}

/// Routes `tokens` without booking anything; returns (prefill instance, cached blocks).
fn route(http: &Http, tokens: &[u32]) -> (String, u64) {
    let (status, d) = http.post(
        "/v1/route",
        &json!({"bucket": BUCKET, "token_ids": tokens, "output_length": 50, "dry_run": true}),
    );
    assert_eq!(status, 200, "{d}");
    (
        d["prefill"]["instance"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        d["cached_blocks"].as_u64().unwrap_or(u64::MAX),
    )
}

/// Waits until node-a's feed is live at `epoch` and `seq`.
fn wait_synced(http: &Http, epoch: u64, seq: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let nodes = http.get("/v1/nodes");
        let a = nodes
            .as_array()
            .and_then(|n| n.iter().find(|n| n["node"] == "node-a"))
            .cloned()
            .unwrap_or(Value::Null);
        if a["epoch"] == epoch && a["seq"] == seq && a["resyncing"] == false {
            return a;
        }
        assert!(
            Instant::now() < deadline,
            "node-a never synced to epoch {epoch} seq {seq}: {a}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn events_steer_routing_and_gaps_and_restarts_resync_from_the_snapshot() {
    let node_a = FakeNode::start(&snapshot(1, 0, vec![]));
    let conductor = ConductorProcess::start();
    let http = Http::new(&conductor.url);
    assert_eq!(http.get_text("/health"), (200, "ok\n".to_owned()));

    // pB registers first, so it wins ties: the prefix is what draws requests to pA.
    for reg in [
        json!({"id": "pB", "role": "prefill", "node": "node-b"}),
        json!({"id": "pA", "role": "prefill", "node": "node-a", "node_url": node_a.url()}),
        json!({"id": "d0", "role": "decode"}),
    ] {
        let (status, body) = http.post("/v1/instances", &reg);
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(http.get("/v1/instances").as_array().map(Vec::len), Some(3));

    let p_tokens = prompt(16, 1);
    let p = hashes(&p_tokens);
    assert_eq!(route(&http, &p_tokens), ("pB".to_owned(), 0));

    // Stored on A: the prefix draws the request there.
    let out = push(&http, 1, vec![stored(1, &p)]);
    assert_eq!(out["applied"], 1, "{out}");
    assert_eq!(route(&http, &p_tokens), ("pA".to_owned(), 16));

    // Removed from A: no longer.
    push(&http, 1, vec![removed(2, &p)]);
    assert_eq!(route(&http, &p_tokens), ("pB".to_owned(), 0));

    // A retried push is skipped, not applied twice.
    assert_eq!(push(&http, 1, vec![removed(2, &p)])["duplicates"], 1);
    assert_eq!(node_a.served(), 0, "no resync while the stream is whole");

    // A gap: events 3 and 4 are lost (they stored P again); 5 stores Q. The snapshot holds
    // everything through 4, and 5 is replayed on top.
    let q_tokens = prompt(4, 2);
    let q = hashes(&q_tokens);
    node_a.set(&snapshot(1, 4, vec![(Tier::Dram, &p)]));
    let out = push(&http, 1, vec![stored(5, &q)]);
    assert_eq!(out["resync"], true);
    let a = wait_synced(&http, 1, 5);
    assert_eq!(a["blocks"], 16 + 4);
    assert_eq!(node_a.served(), 1);
    assert_eq!(route(&http, &p_tokens), ("pA".to_owned(), 16));
    assert_eq!(route(&http, &q_tokens), ("pA".to_owned(), 4));

    // A restart (epoch 2): A's DRAM is gone; its snapshot says only Q survived (on NVMe), and
    // the new run's first event stores R.
    let r_tokens = prompt(2, 3);
    let r = hashes(&r_tokens);
    node_a.set(&snapshot(2, 0, vec![(Tier::Nvme, &q)]));
    let out = push(&http, 2, vec![stored(1, &r)]);
    assert_eq!(out["resync"], true);
    let a = wait_synced(&http, 2, 1);
    assert_eq!(a["blocks"], 4 + 2);
    assert_eq!(node_a.served(), 2);
    assert_eq!(route(&http, &p_tokens), ("pB".to_owned(), 0));
    assert_eq!(route(&http, &r_tokens), ("pA".to_owned(), 2));

    // A late push from the old run is ignored.
    assert_eq!(push(&http, 1, vec![stored(6, &p)])["stale"], true);

    // The sequence starts over within the epoch: resync again.
    push(&http, 2, vec![removed(2, &r)]);
    node_a.set(&snapshot(2, 7, vec![(Tier::Dram, &p)]));
    let out = push(&http, 2, vec![stored(1, &q)]);
    assert_eq!(out["resync"], true);
    wait_synced(&http, 2, 7);
    assert_eq!(node_a.served(), 3);
    assert_eq!(route(&http, &p_tokens), ("pA".to_owned(), 16));
    assert_eq!(route(&http, &q_tokens), ("pB".to_owned(), 0));

    let (status, metrics) = http.get_text("/metrics");
    assert_eq!(status, 200);
    for line in [
        "yutu_conductor_resyncs_total{reason=\"gap\"} 1",
        "yutu_conductor_resyncs_total{reason=\"restart\"} 1",
        "yutu_conductor_resyncs_total{reason=\"sequence_reset\"} 1",
        "yutu_conductor_snapshots_applied_total 3",
        "yutu_conductor_node_blocks{node=\"node-a\"} 16",
    ] {
        assert!(metrics.contains(line), "missing {line:?} in\n{metrics}");
    }
}

#[test]
fn the_http_api_rejects_and_refuses_as_documented() {
    let conductor = ConductorProcess::start();
    let http = Http::new(&conductor.url);
    // Nothing registered: 503 with the reason.
    let (status, body) = http.post("/v1/route", &json!({"bucket": BUCKET, "input_length": 100}));
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["reason"], "no_prefill_instance");
    for reg in [
        json!({"id": "p0", "role": "prefill", "node": "n0"}),
        json!({"id": "d0", "role": "decode"}),
    ] {
        assert_eq!(http.post("/v1/instances", &reg).0, 200);
    }
    // Accepted, with its prediction; the load it books shows in the instance list.
    let (status, body) = http.post(
        "/v1/route",
        &json!({"request_id": "r1", "bucket": BUCKET, "input_length": 30000}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["request_id"], "r1");
    assert_eq!(body["decode"]["instance"], "d0");
    // Behind it, an objective that cannot be met: 429 with the prediction.
    let (status, body) = http.post(
        "/v1/route",
        &json!({"bucket": BUCKET, "input_length": 30000, "slo": {"ttft_ms": 5}}),
    );
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["reason"], "ttft_slo");
    assert!(body["predicted_ttft_ms"].as_f64().is_some_and(|t| t > 5.0));
    let rows = http.get("/v1/instances");
    let p0 = rows
        .as_array()
        .and_then(|r| r.iter().find(|r| r["id"] == "p0"))
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(p0["routed"], 1);
    // Malformed input is a 400, unknown instances a 404, unknown paths a 404.
    assert_eq!(http.post("/v1/route", &json!({"bucket": BUCKET})).0, 400);
    assert_eq!(http.post("/v1/events", &json!({"node": "x"})).0, 400);
    // Events from a node the conductor cannot resync from are refused until it registers.
    let batch = json!({"node": "node-z", "epoch": 1, "events": []});
    let (status, body) = http.post("/v1/events", &batch);
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"], "register_first");
    let reg = json!({"node": "node-z", "url": "http://127.0.0.1:9"});
    assert_eq!(http.post("/v1/nodes", &reg).0, 200);
    assert_eq!(http.post("/v1/events", &batch).0, 200);
    let (status, _) = http.post("/v1/instances/nope/load", &json!({}));
    assert_eq!(status, 404);
    let (status, _) = http.post(
        "/v1/instances/p0/load",
        &json!({"queued_prefill_ms": 1500.0}),
    );
    assert_eq!(status, 204);
    assert_eq!(http.get_text("/nope").0, 404);
    let (status, _) = http.post("/v1/instances", &json!({"id": "p9", "role": "prefill"}));
    assert_eq!(status, 400, "a prefill instance needs a node");
}
