//! Shard lanes: every answer names the shard that served it, and a KV client keeps one
//! connection per shard, on which it sends the calls whose keys that shard owns. Frames have
//! a socket per shard and are sent to the owner too (the last test); the lane tests turn
//! frames off, since the lanes are what carries the calls over HTTP.

use yutu_api::kv::{parse_shard_header, SHARD_HEADER};
use yutu_api::placement::shard_for;
use yutu_client::kv::{FramesMode, FramesPath, KvClient, KvOptions};
use yutu_tests::{pattern, Server};

/// A client that sends every call over HTTP.
fn http_only() -> KvOptions {
    KvOptions {
        frames: FramesMode::Off,
        ..KvOptions::default()
    }
}

#[test]
fn every_answer_names_its_shard() {
    let server = Server::start(&["--shards", "3"]);
    let c = server.client();
    for path in ["/", "/no-such-bucket", "/v1/kv/engine", "/metrics"] {
        let r = c.get(path);
        let value = r
            .header(SHARD_HEADER)
            .unwrap_or_else(|| panic!("{path}: no shard"));
        let (shard, shards) = parse_shard_header(value).expect("shard/shards");
        assert_eq!(shards, 3, "{path}");
        assert!(shard < 3, "{path}");
    }
}

#[test]
fn single_shard_calls_take_the_owners_lane_and_answer_the_same() {
    let server = Server::start(&["--shards", "2"]);
    assert_eq!(server.client().put("/lanes", b"").status, 200);
    let kv = KvClient::new(&server.url, http_only()).expect("client");
    assert_eq!(kv.shard_lanes(), 0, "no lane before a call needs one");
    // Keys of both shards, one call each: each call looks for its shard's lane.
    let keys: Vec<String> = (0..64).map(|i| format!("k{i}")).collect();
    let owned = |s: usize| keys.iter().filter(move |k| shard_for("lanes", k, 2) == s);
    assert!(owned(0).count() > 0 && owned(1).count() > 0);
    let buf = kv.register(1 << 20).expect("buffer");
    for (i, key) in keys.iter().enumerate() {
        let data = pattern(1000 + i, i as u64);
        buf.write_at(0, &data).expect("stage");
        let one = [key.clone()];
        kv.batch_put_from("lanes", &one, &buf, &[0], &[data.len() as u64])
            .expect("put");
        assert_eq!(kv.batch_exists("lanes", &one).expect("exists"), vec![true]);
        assert_eq!(
            kv.get_bytes("lanes", key).expect("get"),
            Some(data),
            "{key}"
        );
    }
    // The kernel spreads connections over the shards: a few tries find both.
    assert_eq!(kv.shard_lanes(), 2, "a lane per shard");
    // Calls that span the shards take the ordinary connection, and answer the same.
    assert_eq!(
        kv.batch_exists("lanes", &keys).expect("exists"),
        vec![true; 64]
    );
    assert_eq!(kv.get_bytes("lanes", "absent").expect("get"), None);
    let removed = kv.remove("lanes", &keys[..1]).expect("remove");
    assert_eq!(removed, vec![true]);
    assert_eq!(
        kv.batch_exists("lanes", &keys[..1]).expect("exists"),
        vec![false]
    );
}

/// `yutu_requests_total` of KV calls answered 200 by each of `shards` shards.
fn kv_calls_per_shard(server: &Server, shards: usize) -> Vec<u64> {
    let text = server.client().get("/metrics").text();
    (0..shards)
        .map(|s| {
            let prefix = format!("yutu_requests_total{{shard=\"{s}\",op=\"Kv\",status=\"200\"}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .map_or(0, |v| v.trim().parse().expect("a count"))
        })
        .collect()
}

#[test]
fn a_single_key_call_is_served_by_the_shard_that_owns_the_key() {
    let server = Server::start(&["--shards", "2"]);
    assert_eq!(server.client().put("/owned", b"").status, 200);
    let kv = KvClient::new(&server.url, http_only()).expect("client");
    let key_of = |shard: usize| {
        (0..)
            .map(|i| format!("key{i}"))
            .find(|k| shard_for("owned", k, 2) == shard)
            .expect("a key")
    };
    let (k0, k1) = ([key_of(0)], [key_of(1)]);
    // Find both lanes first (each call may open connections in search of its lane).
    for _ in 0..16 {
        kv.batch_exists("owned", &k0).expect("exists");
        kv.batch_exists("owned", &k1).expect("exists");
        if kv.shard_lanes() == 2 {
            break;
        }
    }
    assert_eq!(kv.shard_lanes(), 2, "both lanes found");
    // Uneven counts, so that calls sent to the wrong shard could not add up right.
    let before = kv_calls_per_shard(&server, 2);
    for _ in 0..30 {
        kv.batch_exists("owned", &k0).expect("exists");
    }
    for _ in 0..10 {
        kv.batch_exists("owned", &k1).expect("exists");
    }
    let after = kv_calls_per_shard(&server, 2);
    assert_eq!(
        (after[0] - before[0], after[1] - before[1]),
        (30, 10),
        "calls per shard: before {before:?}, after {after:?}"
    );
}

#[test]
fn a_single_key_frame_is_served_by_the_shard_that_owns_the_key() {
    let server = Server::start(&["--shards", "2"]);
    assert_eq!(server.client().put("/owned", b"").status, 200);
    // Presence tables off: `exists` is the call counted here, not a lookup in a table.
    let kv = KvClient::new(
        &server.url,
        KvOptions {
            presence: false,
            ..KvOptions::default()
        },
    )
    .expect("client");
    assert_eq!(
        kv.frames_path(),
        Some(&FramesPath::Unix),
        "same host: Unix frames"
    );
    let key_of = |shard: usize| {
        (0..)
            .map(|i| format!("key{i}"))
            .find(|k| shard_for("owned", k, 2) == shard)
            .expect("a key")
    };
    let (k0, k1) = ([key_of(0)], [key_of(1)]);
    let before = kv_calls_per_shard(&server, 2);
    for _ in 0..30 {
        assert_eq!(kv.batch_exists("owned", &k0).expect("exists"), [false]);
    }
    for _ in 0..10 {
        assert_eq!(kv.batch_exists("owned", &k1).expect("exists"), [false]);
    }
    let after = kv_calls_per_shard(&server, 2);
    assert_eq!(
        (after[0] - before[0], after[1] - before[1]),
        (30, 10),
        "calls per shard: before {before:?}, after {after:?}"
    );
    assert_eq!(kv.shard_lanes(), 0, "no HTTP lane was needed");
}
