//! Rooms against a real node: ranges a user reserves with `publish` before the key is known,
//! writes one-sidedly, and publishes under a key in the same call that asks for the next
//! room. A room is its user's (another user cannot publish it), is published only under a
//! key its shard owns, counts against the user's unfinished puts, ends at its ttl, and takes
//! no more writes once published; bad requests are refused with 400 and leave it usable. The
//! client library keeps a few and makes a put of one block in one call.

use std::time::Duration;

use serde_json::{json, Value};
use yutu_api::kv::{parse_shard_header, SHARD_HEADER};
use yutu_client::kv::{KvClient, KvOptions};
use yutu_client::Credentials;
use yutu_tests::kv::engine_of as engine;
use yutu_tests::server::wait_until;
use yutu_tests::users::{
    alice, bob, node_with_users, send_as, token_node_with_bucket, token_signed,
};
use yutu_tests::{pattern, Reply, Server};
use yutu_transfer::{SegmentDescriptor, TransferRequest};

const BLOCK: usize = 1 << 20;

fn post(server: &Server, who: &Credentials, path: &str, body: &Value) -> Reply {
    send_as(server, who, "POST", path, body.to_string().as_bytes())
}

/// A KV call as `who`; asserts 200 and returns the JSON answer and the shard that served it.
fn ok(server: &Server, who: &Credentials, path: &str, body: Value) -> (Value, usize) {
    let r = post(server, who, path, &body);
    assert_eq!(r.status, 200, "POST {path} {body}: {}", r.text());
    let shard = r
        .headers
        .get(SHARD_HEADER)
        .and_then(|v| parse_shard_header(v.to_str().ok()?))
        .map(|(s, _)| s)
        .expect("the shard header");
    (serde_json::from_slice(&r.body).expect("json"), shard)
}

/// A refused call: its status, and its S3 code with the message for an assertion's text.
fn refused(server: &Server, who: &Credentials, path: &str, body: Value) -> (u16, String) {
    let r = post(server, who, path, &body);
    let answer: Value = serde_json::from_slice(&r.body).unwrap_or_default();
    let code = answer["code"].as_str().unwrap_or_default();
    (r.status, format!("{code}: {}", r.text()))
}

fn desc(v: &Value) -> SegmentDescriptor {
    serde_json::from_value(v.clone()).expect("a descriptor")
}

/// The first key `PREFIX-i` of `bucket` that shard `shard` of `shards` owns, or does not.
fn key_on(bucket: &str, prefix: &str, shard: usize, shards: usize, owned: bool) -> String {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .find(|k| (yutu_api::placement::shard_for(bucket, k, shards) == shard) == owned)
        .expect("a key")
}

#[test]
fn a_room_is_written_then_published_under_a_key_of_its_shard_by_its_user_alone() {
    let server = node_with_users(&["--memory", "64MiB", "--shards", "2", "--nvme-capacity", "0"]);
    let (alice, bob) = (alice(), bob());
    assert_eq!(send_as(&server, &alice, "PUT", "/alice", b"").status, 200);
    assert_eq!(send_as(&server, &bob, "PUT", "/bob", b"").status, 200);
    let (eng, buf) = engine(&server, &alice, 0xa11);

    // A room, asked for alone; the shard that answered holds it.
    let (got, shard) = ok(
        &server,
        &alice,
        "/v1/kv/alice/publish",
        json!({"rooms": [BLOCK]}),
    );
    assert_eq!(got["etags"], json!([]));
    let rooms = got["rooms"].as_array().expect("rooms");
    assert_eq!(rooms.len(), 1, "{got}");
    assert!(got["ttl_ms"].as_u64().unwrap() > 0);
    let (id, room) = (rooms[0]["put_id"].clone(), desc(&rooms[0]["descriptor"]));
    assert_eq!(room.len, BLOCK as u64);
    buf.region().write_at(0, &pattern(BLOCK, 7)).expect("stage");
    eng.transfer([TransferRequest::write(&buf, 0, &room)])
        .expect("a one-sided write into the room");

    // Under a key another shard owns: refused, and the room stays as it was.
    let elsewhere = key_on("alice", "k", shard, 2, false);
    let (status, why) = refused(
        &server,
        &alice,
        "/v1/kv/alice/publish",
        json!({"puts": [{"put_id": id, "key": elsewhere}]}),
    );
    assert_eq!(status, 400, "{why}");
    assert!(
        why.starts_with("InvalidArgument") && why.contains("belongs to shard"),
        "{why}"
    );
    // Bob cannot publish it: in his own bucket it is unknown, in alice's he may not write.
    let here = key_on("alice", "k", shard, 2, true);
    let bobs = key_on("bob", "k", shard, 2, true);
    let (status, why) = refused(
        &server,
        &bob,
        "/v1/kv/bob/publish",
        json!({"puts": [{"put_id": id, "key": bobs}]}),
    );
    assert!(status == 400 && why.contains("unknown"), "{status} {why}");
    let (status, _) = refused(
        &server,
        &bob,
        "/v1/kv/alice/publish",
        json!({"puts": [{"put_id": id, "key": here}]}),
    );
    assert_eq!(status, 403);
    let (status, _) = refused(&server, &bob, "/v1/kv/bob/revoke", json!({"put_ids": [id]}));
    assert_eq!(status, 200, "revoke answers per id");

    // Alice publishes it and asks for the next room in the same call.
    let (got, _) = ok(
        &server,
        &alice,
        "/v1/kv/alice/publish",
        json!({"puts": [{"put_id": id, "key": here}], "rooms": [4096]}),
    );
    assert_eq!(got["etags"].as_array().map(Vec::len), Some(1), "{got}");
    assert_eq!(got["rooms"].as_array().map(Vec::len), Some(1), "{got}");
    let r = send_as(&server, &alice, "GET", &format!("/alice/{here}"), b"");
    assert!(
        r.status == 200 && r.body == pattern(BLOCK, 7),
        "the room's bytes, stored"
    );
    // Published: the room takes no more writes, and is not published twice.
    buf.region().write_at(0, &pattern(BLOCK, 8)).expect("stage");
    assert!(
        eng.transfer([TransferRequest::write(&buf, 0, &room)])
            .is_err(),
        "a published room's descriptor still writes"
    );
    let r = send_as(&server, &alice, "GET", &format!("/alice/{here}"), b"");
    assert!(r.body == pattern(BLOCK, 7), "the stored block was changed");
    let (status, why) = refused(
        &server,
        &alice,
        "/v1/kv/alice/publish",
        json!({"puts": [{"put_id": id, "key": here}]}),
    );
    assert!(status == 400 && why.contains("unknown"), "{why}");
    assert_eq!(
        server.metric_sum("yutu_kv_rooms_total{event=\"published\""),
        1.0
    );
    assert_eq!(
        server.metric_sum("yutu_kv_rooms_total{event=\"reserved\""),
        2.0
    );
}

#[test]
fn a_started_put_is_published_under_its_own_key_only_and_bad_requests_are_refused() {
    let server = node_with_users(&["--memory", "64MiB", "--shards", "1", "--nvme-capacity", "0"]);
    let alice = alice();
    assert_eq!(send_as(&server, &alice, "PUT", "/alice", b"").status, 200);
    let (started, _) = ok(
        &server,
        &alice,
        "/v1/kv/alice/put-start",
        json!({"blocks": [{"key": "mine", "len": 4}]}),
    );
    let id = started["puts"][0]["put_id"].clone();
    let path = "/v1/kv/alice/publish";
    let bad = [
        json!({}),
        json!({"puts": []}),
        json!({"rooms": vec![4096; yutu_api::kv::MAX_ROOMS + 1]}),
        json!({"rooms": [4096], "ttl_ms": 0}),
        json!({"rooms": [4096], "size": 1}),
        json!({"puts": [{"put_id": id, "key": ""}]}),
        json!({"puts": [{"put_id": id}]}),
        json!({"puts": [{"put_id": id, "key": "other"}]}),
        json!({"puts": [{"put_id": 12345, "key": "mine"}]}),
    ];
    for body in bad {
        let (status, why) = refused(&server, &alice, path, body.clone());
        assert_eq!(status, 400, "{body}: {why}");
    }
    let (status, why) = refused(&server, &alice, path, json!({"rooms": [1u64 << 40]}));
    assert!(
        (400..500).contains(&status),
        "a room past the object limit: {why}"
    );
    // Nothing above took the put: it ends under its own key.
    let (got, _) = ok(
        &server,
        &alice,
        path,
        json!({"puts": [{"put_id": id, "key": "mine"}]}),
    );
    assert_eq!(got["etags"].as_array().map(Vec::len), Some(1));
    assert_eq!(got["rooms"], json!([]));
    assert_eq!(
        server.metric_sum("yutu_kv_rooms_total{event=\"reserved\""),
        0.0
    );
}

#[test]
fn rooms_count_against_the_users_unfinished_puts_and_end_at_their_ttl() {
    // 2 MiB of unfinished puts per user on the one shard.
    let server = node_with_users(&[
        "--memory",
        "64MiB",
        "--shards",
        "1",
        "--nvme-capacity",
        "0",
        "--kv-user-reserved",
        "2MiB",
    ]);
    let alice = alice();
    assert_eq!(send_as(&server, &alice, "PUT", "/alice", b"").status, 200);
    let path = "/v1/kv/alice/publish";
    // Three asked, two fit: the answer lists two, and the call still succeeds.
    let (got, _) = ok(
        &server,
        &alice,
        path,
        json!({"rooms": [BLOCK, BLOCK, BLOCK]}),
    );
    let ids: Vec<Value> = got["rooms"]
        .as_array()
        .expect("rooms")
        .iter()
        .map(|r| r["put_id"].clone())
        .collect();
    assert_eq!(ids.len(), 2, "{got}");
    assert!(server.metric_sum("yutu_kv_user_limit_refused_total{limit=\"reserved_bytes\"") >= 1.0);
    let (none, _) = ok(&server, &alice, path, json!({"rooms": [BLOCK]}));
    assert_eq!(none["rooms"], json!([]), "the limit is spent");
    // Revoked, they are given back at once.
    let (revoked, _) = ok(
        &server,
        &alice,
        "/v1/kv/alice/revoke",
        json!({"put_ids": ids}),
    );
    assert_eq!(revoked["revoked"], json!([true, true]));
    // Rooms of 50 ms: never published, they end by themselves and the limit is free again.
    let (got, _) = ok(
        &server,
        &alice,
        path,
        json!({"rooms": [BLOCK, BLOCK], "ttl_ms": 50}),
    );
    assert_eq!(got["rooms"].as_array().map(Vec::len), Some(2));
    let expired = wait_until(Duration::from_secs(10), || {
        let (again, _) = ok(
            &server,
            &alice,
            path,
            json!({"rooms": [BLOCK, BLOCK], "ttl_ms": 50}),
        );
        again["rooms"].as_array().map(Vec::len) == Some(2)
    });
    assert!(expired, "rooms past their ttl were not taken back");
    let first = got["rooms"][0]["put_id"].clone();
    let (status, why) = refused(
        &server,
        &alice,
        path,
        json!({"puts": [{"put_id": first, "key": "late"}]}),
    );
    assert!(status == 400 && why.contains("unknown"), "{why}");
}

// ---------------------------------------------------------------------------------------------
// The client library.

const KID: &str = "rooms1";
const SECRET: &str = "rooms-test-secret-0123456789abcdef-0123";

fn token() -> String {
    token_signed(KID, SECRET, &[], true, Duration::from_secs(600))
}

/// A two-shard node taking tokens signed with `SECRET`, bucket `rooms` created.
fn token_node(extra: &[&str]) -> Server {
    token_node_with_bucket(KID, SECRET, &token(), "rooms", extra)
}

fn kv_client(server: &Server) -> KvClient {
    KvClient::new(
        &server.url,
        KvOptions {
            token: Some(token()),
            ..KvOptions::default()
        },
    )
    .expect("kv client")
}

fn stored(server: &Server, key: &str) -> Vec<u8> {
    let auth = format!("Bearer {}", token());
    let r = server.client().send(
        "GET",
        &format!("/rooms/{key}"),
        &[("authorization", auth.as_str())],
        None,
    );
    assert_eq!(r.status, 200, "{key}: {}", r.text());
    r.body
}

/// Puts of one block each, all on shard 0, from registered process memory (a numpy array's
/// case): the first two start their puts (rooms are asked for a length once it repeats), and
/// the second is given a room; each later one takes the room the one before it left, so it
/// is one call. An overwrite goes the same way. Every byte is what was put.
#[test]
fn a_client_puts_a_block_in_one_call_through_the_room_the_last_put_left() {
    let server = token_node(&[]);
    let kv = kv_client(&server);
    let mut mem = vec![0u8; 2 * BLOCK];
    // SAFETY: `mem` outlives `buf` (dropped first below), read and written only between calls.
    let buf = unsafe { kv.register_host(mem.as_mut_ptr(), mem.len() as u64) }.expect("buffer");
    let keys: Vec<String> = (0..5)
        .map(|i| key_on("rooms", &format!("one{i}"), 0, 2, true))
        .collect();
    for (i, key) in keys.iter().enumerate() {
        mem[..BLOCK].copy_from_slice(&pattern(BLOCK, 40 + i as u64));
        kv.batch_put_from(
            "rooms",
            std::slice::from_ref(key),
            &buf,
            &[0],
            &[BLOCK as u64],
        )
        .expect("a put");
    }
    assert!(
        kv.view_bytes() >= (5 * BLOCK) as u64,
        "the puts went through views"
    );
    assert_eq!(kv.rooms().0, 3, "every put after the second took a room");
    mem[..BLOCK].copy_from_slice(&pattern(BLOCK, 99));
    kv.batch_put_from("rooms", &keys[..1], &buf, &[0], &[BLOCK as u64])
        .expect("an overwrite");
    assert_eq!(kv.rooms().0, 4);
    assert!(
        stored(&server, &keys[0]) == pattern(BLOCK, 99),
        "the overwrite"
    );
    for (i, key) in keys.iter().enumerate().skip(1) {
        assert!(
            stored(&server, key) == pattern(BLOCK, 40 + i as u64),
            "{key}"
        );
    }
    assert_eq!(
        server.metric_sum("yutu_kv_rooms_total{event=\"published\""),
        4.0
    );
    assert_eq!(kv.rooms().1, 1, "one room is held for the next put");
    // Lengths that do not repeat get no rooms: the pool would hold rooms no put fits.
    for (i, len) in [4096 * 300, 4096 * 301, 4096 * 302].into_iter().enumerate() {
        let key = key_on("rooms", &format!("odd{i}"), 0, 2, true);
        kv.batch_put_from("rooms", &[key], &buf, &[0], &[len])
            .expect("a put");
    }
    assert_eq!(kv.rooms(), (4, 1), "no room for a length seen once");
    drop(buf);
}

/// A room held counts against the user's unfinished puts, so a client gives its rooms back
/// when a reservation is refused, and when it goes. With room for 2 MiB of unfinished puts
/// per shard: a 1 MiB room held and a 2 MiB put refused a reservation, the room is revoked
/// and the node's own copy of the put (which reserves too) succeeds. With a room held again,
/// once the client is dropped another client's 2 MiB put reserves and goes through views.
#[test]
fn a_clients_rooms_are_given_back_when_a_reservation_is_refused_and_when_it_goes() {
    let server = token_node(&["--kv-user-reserved", "4MiB"]);
    let key = |p: &str| key_on("rooms", p, 0, 2, true);
    let first = kv_client(&server);
    let mut mem = vec![0u8; 2 * BLOCK];
    // SAFETY: `mem` outlives `buf` (dropped first below), read and written only between calls.
    let buf = unsafe { first.register_host(mem.as_mut_ptr(), mem.len() as u64) }.expect("buffer");
    let one = |first: &KvClient, k: &str| {
        first
            .batch_put_from("rooms", &[key(k)], &buf, &[0], &[BLOCK as u64])
            .expect("a put");
    };
    mem[..BLOCK].copy_from_slice(&pattern(BLOCK, 1));
    one(&first, "a");
    one(&first, "a2");
    assert_eq!(first.rooms().1, 1, "a room is held");
    mem.copy_from_slice(&pattern(2 * BLOCK, 2));
    let before = first.view_bytes();
    first
        .batch_put_from("rooms", &[key("b")], &buf, &[0], &[2 * BLOCK as u64])
        .expect("a put the node makes");
    assert_eq!(
        first.view_bytes(),
        before,
        "the 2 MiB put was refused a reservation"
    );
    assert_eq!(first.rooms().1, 0, "the room held was given back");
    assert!(stored(&server, &key("b")) == pattern(2 * BLOCK, 2));
    one(&first, "c");
    one(&first, "c2");
    assert_eq!(first.rooms().1, 1, "a room is held again");
    drop(buf);
    drop(first);

    let second = kv_client(&server);
    let mut mem = pattern(2 * BLOCK, 3);
    // SAFETY: as above.
    let buf = unsafe { second.register_host(mem.as_mut_ptr(), mem.len() as u64) }.expect("buffer");
    second
        .batch_put_from("rooms", &[key("d")], &buf, &[0], &[2 * BLOCK as u64])
        .expect("a put");
    assert_eq!(
        second.view_bytes(),
        2 * BLOCK as u64,
        "the first client's room was given back: the put reserved"
    );
    assert!(stored(&server, &key("d")) == pattern(2 * BLOCK, 3));
    drop(buf);
    mem.clear();
}
