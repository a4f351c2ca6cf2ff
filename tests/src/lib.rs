//! Harness for Yutu's end-to-end tests.
//!
//! Each test starts the real `yutu-server` binary on an ephemeral loopback port with its own
//! data directory, waits for the line announcing the bound address, and talks HTTP to it. No
//! test sleeps to synchronise: every wait is on a condition with a deadline.
//!
//! The binaries are looked up next to the test executable (`target/<profile>/`), or in
//! `$YUTU_BIN_DIR`; the test command builds them first (`cargo build --workspace --bins`).

pub mod cluster;
pub mod etcd;
pub mod faults;
pub mod history;
pub mod http;
pub mod imports;
pub mod kv;
pub mod pki;
pub mod proxy;
pub mod server;
pub mod users;
pub mod xml;

pub use self::http::{Client, Reply};
pub use server::{bin_path, Server};

use md5::{Digest, Md5};

/// The arguments of a two-shard node with 256 MiB of DRAM and no NVMe tier (the tenancy and
/// hostile-client tests' node).
pub const DRAM_NODE: [&str; 6] = [
    "--memory",
    "256MiB",
    "--shards",
    "2",
    "--nvme-capacity",
    "0",
];

/// The quoted MD5 ETag S3 gives a single-part object.
pub fn etag_of(data: &[u8]) -> String {
    format!("\"{}\"", hex::encode(Md5::digest(data)))
}

/// Deterministic pseudo-random bytes (xorshift), so failures reproduce.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
