//! Two well-behaved clients of one user move blocks with get-into and put-from (one through
//! the same-host mapping, one through the node's engine over tcp) while another user hammers
//! the node with leases of one key named thousands of times, put-starts never ended, bogus
//! engine registrations and the first user's session. The good clients see no wrong byte and
//! no failure. Bounded in rounds and time; the attacker stops when they are done.
//!
//! The good clients' rate with and without the attack is printed (`rate unloaded`/`rate
//! under attack`), not asserted: speed is the benchmarks' business.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use yutu_client::kv::{KvClient, KvOptions};
use yutu_tests::users::{alice, bob, node_with_users, send_as};
use yutu_tests::{pattern, Server};

const BLOCK: usize = 16 << 10;
const BATCH: usize = 64;
const ROUNDS: usize = 30;

/// One good client's work: `ROUNDS` rounds of put-from then get-into of `BATCH` fresh blocks,
/// every byte checked. Returns the seconds it took.
fn good_client(server: &Server, shm: bool, tag: u64) -> f64 {
    let kv = KvClient::new(
        &server.url,
        KvOptions {
            shm,
            credentials: Some(alice()),
            ..KvOptions::default()
        },
    )
    .expect("alice's client");
    let buf = kv.register((2 * BATCH * BLOCK) as u64).expect("buffer");
    let started = Instant::now();
    for round in 0..ROUNDS {
        let keys: Vec<String> = (0..BATCH).map(|i| format!("{tag}-{round}-{i}")).collect();
        let offsets: Vec<u64> = (0..BATCH).map(|i| (i * BLOCK) as u64).collect();
        for (i, off) in offsets.iter().enumerate() {
            let seed = tag * 1_000_000 + (round * BATCH + i) as u64;
            buf.write_at(*off, &pattern(BLOCK, seed)).expect("stage");
        }
        kv.batch_put_from("alice", &keys, &buf, &offsets, &vec![BLOCK as u64; BATCH])
            .unwrap_or_else(|e| panic!("client {tag} round {round}: put-from failed: {e}"));
        let back: Vec<u64> = offsets.iter().map(|o| o + (BATCH * BLOCK) as u64).collect();
        let copied = kv
            .batch_get_into("alice", &keys, &buf, &back)
            .unwrap_or_else(|e| panic!("client {tag} round {round}: get-into failed: {e}"));
        assert!(
            copied.iter().all(|c| *c == Some(BLOCK as u64)),
            "{copied:?}"
        );
        for (i, off) in back.iter().enumerate() {
            let seed = tag * 1_000_000 + (round * BATCH + i) as u64;
            let mut got = vec![0u8; BLOCK];
            buf.read_at(*off, &mut got).expect("read back");
            assert!(
                got == pattern(BLOCK, seed),
                "client {tag} round {round}: block {i} has wrong bytes"
            );
        }
    }
    started.elapsed().as_secs_f64()
}

/// Both good clients at once; their combined blocks per second.
fn good_clients(server: &Arc<Server>, tag: u64) -> f64 {
    let threads: Vec<_> = [(true, tag), (false, tag + 1)]
        .into_iter()
        .map(|(shm, t)| {
            let server = Arc::clone(server);
            std::thread::spawn(move || good_client(&server, shm, t))
        })
        .collect();
    let secs = threads
        .into_iter()
        .map(|t| t.join().expect("a good client failed"))
        .fold(0.0f64, f64::max);
    (2 * ROUNDS * BATCH * 2) as f64 / secs
}

/// Bob: everything a hostile tenant can do from the control plane, until `stop`.
fn attacker(server: &Server, stop: &AtomicBool, refused: &AtomicU64) {
    let bob = bob();
    let mut i = 0u64;
    let deadline = Instant::now() + Duration::from_secs(120);
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        i += 1;
        let calls: [(&str, serde_json::Value); 4] = [
            // One key named 4,000 times in one lease (his own block).
            (
                "/v1/kv/bob/get",
                json!({"keys": vec!["mine"; 4000], "ttl_ms": 60_000}),
            ),
            // Reservations never ended.
            (
                "/v1/kv/bob/put-start",
                json!({"blocks": [{"key": format!("r{i}"), "len": 1 << 20}], "ttl_ms": 60_000}),
            ),
            // An engine at a port that is not his (nothing listens there).
            (
                "/v1/kv/peers",
                json!({"client": {"node": format!("{:016x}", 0xbad0 + i), "incarnation": "0000000000000001",
                    "host": "h", "tcp": "127.0.0.1:9"}, "secret": "00".repeat(32)}),
            ),
            // Alice's bucket with a made-up session.
            (
                "/v1/kv/alice/get-into",
                json!({"keys": ["x"], "targets": [], "session": format!("{i:032x}")}),
            ),
        ];
        for (path, body) in calls {
            let r = send_as(server, &bob, "POST", path, body.to_string().as_bytes());
            if r.status != 200 {
                refused.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

#[test]
fn good_clients_see_no_wrong_byte_while_another_tenant_attacks() {
    let server = Arc::new(node_with_users(&[
        "--memory",
        "128MiB",
        "--shards",
        "2",
        "--nvme-capacity",
        "0",
    ]));
    for (who, bucket) in [(alice(), "/alice"), (bob(), "/bob")] {
        assert_eq!(send_as(&server, &who, "PUT", bucket, b"").status, 200);
    }
    assert_eq!(
        send_as(&server, &bob(), "PUT", "/bob/mine", &pattern(BLOCK, 1)).status,
        200
    );

    let unloaded = good_clients(&server, 10);
    let stop = Arc::new(AtomicBool::new(false));
    let refused = Arc::new(AtomicU64::new(0));
    let hostile = {
        let (server, stop, refused) = (Arc::clone(&server), stop.clone(), refused.clone());
        std::thread::spawn(move || attacker(&server, &stop, &refused))
    };
    let loaded = good_clients(&server, 20);
    stop.store(true, Ordering::Relaxed);
    hostile.join().expect("the attacker thread");
    eprintln!(
        "rate unloaded: {unloaded:.0} blocks/s; rate under attack: {loaded:.0} blocks/s ({:.2}); attacker refused {} times",
        loaded / unloaded,
        refused.load(Ordering::Relaxed)
    );
    assert!(
        refused.load(Ordering::Relaxed) > 0,
        "the attacker was never refused: the test proves nothing"
    );
}
