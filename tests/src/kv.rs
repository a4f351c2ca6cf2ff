//! Helpers for the KV API tests: a client transfer engine with a registered buffer, and the
//! test binary re-run as a child process (to be killed in the middle of its work).

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
