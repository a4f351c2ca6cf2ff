//! Helpers for the KV API tests: a client transfer engine with a registered buffer, the test
//! binary re-run as a child process (to be killed in the middle of its work), and the next
//! frame off a frame connection.

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use yutu_transfer::{EngineConfig, HugePages, LocalSegment, MemoryRegion, NodeId, TransferEngine};

/// An engine with node id `node` and its shm socket in `shm_dir` (`host` overrides the host
/// id, making it look remote), and a registered buffer of `len` bytes.
pub fn client_engine(
    node: u64,
    shm_dir: &Path,
    host: Option<&str>,
    len: usize,
) -> (TransferEngine, LocalSegment) {
    let mut cfg = EngineConfig::new(NodeId(node));
    cfg.shm_dir = Some(shm_dir.to_path_buf());
    cfg.host = host.map(str::to_owned);
    let engine = TransferEngine::start(cfg).expect("client engine");
    let region = MemoryRegion::allocate("kv-test-client", len, HugePages::Never).expect("buffer");
    let buf = engine.register(region).expect("register the buffer");
    (engine, buf)
}

/// A client engine (node id `id`, a registered 4 MiB buffer) peered with the node's engine,
/// whose address `who` asked the node for (`GET /v1/kv/engine`, signed).
pub fn engine_of(
    server: &crate::Server,
    who: &yutu_client::Credentials,
    id: u64,
) -> (TransferEngine, LocalSegment) {
    let dir = tempfile::tempdir().expect("dir");
    let (engine, buf) = client_engine(id, dir.path(), None, 4 << 20);
    let r = crate::users::send_as(server, who, "GET", "/v1/kv/engine", b"");
    let addr: yutu_transfer::NodeAddress =
        serde_json::from_slice(&r.body).unwrap_or_else(|_| panic!("{}", r.text()));
    engine.add_peer(addr);
    (engine, buf)
}

/// Re-runs this test binary for just the test `name`, with `env` set to `url` (the child test
/// does nothing unless it finds that variable).
pub fn spawn_self(name: &str, env: &str, url: &str) -> Child {
    Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--exact", name, "--nocapture"])
        .env(env, url)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the child test")
}

/// Registers `engine` as a peer of the node behind `c` (unsigned: a node with `--no-auth`)
/// the way a client library does: the engine trusts the node with a fresh secret, then
/// `POST /v1/kv/peers` names it; returns the session for get-into and put-from.
pub fn register(c: &crate::Client, engine: &TransferEngine) -> String {
    let node: yutu_transfer::NodeAddress =
        serde_json::from_slice(&c.get("/v1/kv/engine").body).expect("the node's engine address");
    let secret = crate::pattern(32, engine.node().0);
    let mut key = [0u8; 32];
    key.copy_from_slice(&secret);
    engine.trust(node.node, key);
    let body = serde_json::json!({"client": engine.address(), "secret": hex::encode(key)});
    let r = c.send(
        "POST",
        "/v1/kv/peers",
        &[("content-type", "application/json")],
        Some(body.to_string().as_bytes()),
    );
    assert_eq!(r.status, 200, "register the engine: {}", r.text());
    let answer: serde_json::Value = serde_json::from_slice(&r.body).expect("json");
    answer["session"]
        .as_str()
        .expect("a session id")
        .to_string()
}

/// The next frame on a KV frame connection (`yutu_api::kv_frame`): its header and body.
pub fn read_frame(s: &mut impl Read) -> (yutu_api::kv_frame::Header, Vec<u8>) {
    let mut head = [0u8; yutu_api::kv_frame::HEADER_LEN];
    s.read_exact(&mut head).expect("an answer");
    let h = yutu_api::kv_frame::Header::decode(&head).expect("a valid header");
    let mut body = vec![0u8; h.len as usize];
    s.read_exact(&mut body).expect("its body");
    (h, body)
}
