//! Helpers shared by the integration tests: engines on loopback, byte patterns, and waiting
//! on conditions with a deadline (never sleeping to synchronise).

#![allow(dead_code)]

use std::path::Path;
use std::time::{Duration, Instant};

use yutu_transfer::{EngineConfig, HugePages, LocalSegment, MemoryRegion, NodeId, TransferEngine};

/// Sizes the tests move: 1 KiB to 16 MiB, plus sizes that are not multiples of a slice.
pub const SIZES: [u64; 7] = [
    1 << 10,
    4 << 10,
    64 << 10,
    (1 << 20) + 7,
    2 << 20,
    3 << 20,
    16 << 20,
];

/// An engine on 127.0.0.1 with its shm socket in `dir`. `host` overrides the host id (a
/// different one makes the engines look remote, so they use tcp).
pub fn engine(node: u64, dir: &Path, host: Option<&str>) -> TransferEngine {
    let mut config = EngineConfig::new(NodeId(node));
    config.shm_dir = Some(dir.to_path_buf());
    config.host = host.map(str::to_owned);
    config.io_timeout = Duration::from_secs(20);
    TransferEngine::start(config).expect("engine starts")
}

/// Two engines that know each other.
pub fn pair(dir: &Path, same_host: bool) -> (TransferEngine, TransferEngine) {
    let a = engine(1, dir, if same_host { None } else { Some("host-a") });
    let b = engine(2, dir, if same_host { None } else { Some("host-b") });
    a.add_peer(b.address());
    b.add_peer(a.address());
    (a, b)
}

pub fn segment(engine: &TransferEngine, len: u64) -> LocalSegment {
    let region = MemoryRegion::allocate("test", len as usize, HugePages::Never).expect("allocate");
    engine.register(region).expect("register")
}

/// Deterministic bytes that differ for every seed and offset (a xorshift stream).
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

pub fn read(seg: &LocalSegment, offset: u64, len: u64) -> Vec<u8> {
    let mut buf = vec![0u8; len as usize];
    seg.region().read_at(offset, &mut buf).expect("in bounds");
    buf
}

/// Polls `cond` until it holds or `limit` passes; panics with `what` on timeout.
pub fn wait_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::yield_now();
    }
}

/// Lays `sizes` out back to back, each at a 4 KiB-aligned offset; returns offsets and total.
pub fn layout(sizes: &[u64]) -> (Vec<u64>, u64) {
    let mut offsets = Vec::new();
    let mut at = 0;
    for &s in sizes {
        offsets.push(at);
        at += s.div_ceil(4096) * 4096;
    }
    (offsets, at)
}
