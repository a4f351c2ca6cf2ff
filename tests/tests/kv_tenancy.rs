//! The KV data path between tenants: a descriptor is a capability bound to one lease or put,
//! one direction and one range, and dies with its grant. Each test plays the hostile tenant
//! through the real binary and a raw transfer client.

use serde_json::{json, Value};
use yutu_api::kv::GetResponse;
use yutu_client::Credentials;
use yutu_tests::kv::engine_of as engine;
use yutu_tests::users::{alice, bob, node_with_users, send_as};
use yutu_tests::{pattern, Server};
use yutu_transfer::{
    NodeAddress, Refusal, SegmentDescriptor, TransferEngine, TransferError, TransferRequest,
};

/// A KV call as `who`; asserts 200 and returns the JSON answer.
fn kv(server: &Server, who: &Credentials, path: &str, body: Value) -> Value {
    let r = send_as(server, who, "POST", path, body.to_string().as_bytes());
    assert_eq!(r.status, 200, "POST {path}: {}", r.text());
    serde_json::from_slice(&r.body).expect("json")
}

fn desc(v: &Value) -> SegmentDescriptor {
    serde_json::from_value(v.clone()).expect("a descriptor")
}

fn refusal(err: TransferError) -> Option<Refusal> {
    match err {
        TransferError::Refused { reason, .. } => Some(reason),
        _ => None,
    }
}

/// One shard, so a freed offset is reused at once; no NVMe tier.
const ONE_SHARD: &[&str] = &["--memory", "64MiB", "--shards", "1", "--nvme-capacity", "0"];

const BLOCK: usize = 64 << 10;
const N: usize = 8;

/// Bob leases his blocks, keeps the descriptors, releases and deletes them; alice then stores
/// her blocks, which land on the same (reused) offsets. Bob's old descriptors must read none
/// of alice's bytes and write none into them; his old put-start descriptors neither.
#[test]
fn an_old_descriptor_never_reaches_a_block_stored_later_at_the_same_offset() {
    let server = node_with_users(ONE_SHARD);
    let (alice, bob) = (alice(), bob());
    assert_eq!(send_as(&server, &alice, "PUT", "/alice", b"").status, 200);
    assert_eq!(send_as(&server, &bob, "PUT", "/bob", b"").status, 200);
    let (bob_engine, bob_buf) = engine(&server, &bob, 0xb0b);

    // Bob's blocks, written through two-phase puts whose descriptors he keeps.
    let keys: Vec<String> = (0..N).map(|i| format!("b{i}")).collect();
    let blocks: Vec<Value> = keys
        .iter()
        .map(|k| json!({"key": k, "len": BLOCK}))
        .collect();
    let started = kv(
        &server,
        &bob,
        "/v1/kv/bob/put-start",
        json!({ "blocks": blocks }),
    );
    let put_descs: Vec<SegmentDescriptor> = started["puts"]
        .as_array()
        .expect("puts")
        .iter()
        .map(|p| desc(&p["descriptor"]))
        .collect();
    bob_buf
        .region()
        .write_at(0, &pattern(BLOCK, 0xb))
        .expect("stage");
    bob_engine
        .transfer(
            put_descs
                .iter()
                .map(|d| TransferRequest::write(&bob_buf, 0, d)),
        )
        .expect("bob writes his own puts");
    let ids: Vec<Value> = started["puts"]
        .as_array()
        .expect("puts")
        .iter()
        .map(|p| p["put_id"].clone())
        .collect();
    kv(
        &server,
        &bob,
        "/v1/kv/bob/put-end",
        json!({ "put_ids": ids }),
    );
    let leased = kv(&server, &bob, "/v1/kv/bob/get", json!({ "keys": keys }));
    let lease_descs: Vec<SegmentDescriptor> = leased["blocks"]
        .as_array()
        .expect("blocks")
        .iter()
        .map(|b| desc(&b["descriptor"]))
        .collect();
    assert_eq!(lease_descs.len(), N);

    // A read lease is read-only.
    let write = bob_engine
        .transfer([TransferRequest::write(&bob_buf, 0, &lease_descs[0])])
        .expect_err("a write through a read lease");
    assert_eq!(refusal(write), Some(Refusal::WrongAccess));

    kv(
        &server,
        &bob,
        "/v1/kv/release",
        json!({ "leases": leased["leases"] }),
    );
    kv(&server, &bob, "/v1/kv/bob/remove", json!({ "keys": keys }));

    // Alice's blocks reuse the freed offsets (one shard, same size, first fit).
    let alice_data = pattern(BLOCK, 0xa);
    for i in 0..N {
        let r = send_as(&server, &alice, "PUT", &format!("/alice/a{i}"), &alice_data);
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let alice_keys: Vec<String> = (0..N).map(|i| format!("a{i}")).collect();
    let hers = kv(
        &server,
        &alice,
        "/v1/kv/alice/get",
        json!({ "keys": alice_keys }),
    );
    let reused = hers["blocks"]
        .as_array()
        .expect("blocks")
        .iter()
        .map(|b| desc(&b["descriptor"]))
        .filter(|d| lease_descs.iter().any(|o| o.offset == d.offset))
        .count();
    assert!(reused > 0, "no offset was reused: the test proves nothing");

    for (i, old) in lease_descs.iter().chain(&put_descs).enumerate() {
        bob_buf
            .region()
            .write_at(0, &vec![0u8; BLOCK])
            .expect("clear");
        let read = bob_engine.transfer([TransferRequest::read(&bob_buf, 0, old)]);
        let mut back = vec![0u8; BLOCK];
        bob_buf.region().read_at(0, &mut back).expect("read back");
        assert!(back != alice_data, "old descriptor {i} read alice's block");
        assert!(read.is_err(), "old descriptor {i} still reads");
        bob_buf
            .region()
            .write_at(0, &pattern(BLOCK, 0xb))
            .expect("stage");
        let wrote = bob_engine.transfer([TransferRequest::write(&bob_buf, 0, old)]);
        assert!(wrote.is_err(), "old descriptor {i} still writes");
    }
    for i in 0..N {
        let r = send_as(&server, &alice, "GET", &format!("/alice/a{i}"), b"");
        assert!(r.body == alice_data, "alice's block a{i} was changed");
    }
}

/// A key named many times in one `get` is one lease of one block, and its release is quick:
/// the call that froze a shard for seconds (each revoke scanned every grant) is answered.
#[test]
fn duplicate_keys_in_one_lease_are_one_grant() {
    let server = node_with_users(ONE_SHARD);
    let alice = alice();
    assert_eq!(send_as(&server, &alice, "PUT", "/alice", b"").status, 200);
    let r = send_as(&server, &alice, "PUT", "/alice/k", &pattern(4096, 1));
    assert_eq!(r.status, 200);
    let keys: Vec<&str> = vec!["k"; 1000];
    for _ in 0..20 {
        let leased = kv(&server, &alice, "/v1/kv/alice/get", json!({ "keys": keys }));
        let answer: GetResponse = serde_json::from_value(leased.clone()).expect("a get answer");
        assert_eq!(answer.blocks.len(), 1, "one key, one block in the answer");
        assert_eq!(answer.requested(), 1000);
        let first = answer.block(0).expect("first").descriptor;
        let last = answer.block(999).expect("last").descriptor;
        assert!(first.is_some() && first == last, "one key, one grant");
        kv(
            &server,
            &alice,
            "/v1/kv/release",
            json!({ "leases": leased["leases"] }),
        );
    }
    let text = server.client().get("/metrics").text();
    assert!(text.contains("yutu_"), "the node answers");
}

/// One tenant can neither reserve nor pin the DRAM the others need: past a quarter of the
/// node's memory (the default per-user limits) bob's put-starts and leases are refused with
/// 429 and a reason, counted in the metrics, and alice's objects stay and her calls succeed.
#[test]
fn one_user_cannot_reserve_or_pin_the_node() {
    let server = node_with_users(ONE_SHARD);
    let (alice, bob) = (alice(), bob());
    assert_eq!(send_as(&server, &alice, "PUT", "/alice", b"").status, 200);
    assert_eq!(send_as(&server, &bob, "PUT", "/bob", b"").status, 200);
    let mib = 1 << 20;
    for i in 0..12 {
        let r = send_as(
            &server,
            &alice,
            "PUT",
            &format!("/alice/o{i}"),
            &pattern(mib, i),
        );
        assert_eq!(r.status, 200, "{}", r.text());
    }

    // Reservations that are never ended: 16 MiB (a quarter of 64 MiB) and no more.
    let mut reserved = 0;
    let refused = loop {
        let body =
            json!({"blocks": [{"key": format!("r{reserved}"), "len": mib}], "ttl_ms": 60_000});
        let r = send_as(
            &server,
            &bob,
            "POST",
            "/v1/kv/bob/put-start",
            body.to_string().as_bytes(),
        );
        if r.status != 200 {
            break r;
        }
        reserved += 1;
        assert!(reserved <= 64, "bob reserved all of DRAM");
    };
    assert_eq!(reserved, 16, "{}", refused.text());
    assert_eq!(refused.status, 429);
    assert_eq!(refused.code().as_deref(), Some("TooManyRequests"));
    assert!(
        refused.text().contains("unfinished puts"),
        "{}",
        refused.text()
    );

    // Leases: bob stores 17 blocks of 1 MiB through S3 (his own), then tries to lease them all.
    for i in 0..17 {
        let r = send_as(
            &server,
            &bob,
            "PUT",
            &format!("/bob/l{i}"),
            &pattern(mib, 100 + i),
        );
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let keys: Vec<String> = (0..17).map(|i| format!("l{i}")).collect();
    let r = send_as(
        &server,
        &bob,
        "POST",
        "/v1/kv/bob/get",
        json!({ "keys": keys }).to_string().as_bytes(),
    );
    assert_eq!(r.status, 429, "{}", r.text());
    assert!(r.text().contains("leased bytes"), "{}", r.text());

    // Alice: every object still there, and her own lease and put-start work.
    for i in 0..12 {
        let got = send_as(&server, &alice, "GET", &format!("/alice/o{i}"), b"");
        assert!(
            got.status == 200 && got.body == pattern(mib, i),
            "alice's o{i}"
        );
    }
    kv(
        &server,
        &alice,
        "/v1/kv/alice/get",
        json!({ "keys": ["o1", "o2"] }),
    );
    kv(
        &server,
        &alice,
        "/v1/kv/alice/put-start",
        json!({"blocks": [{"key": "new", "len": mib}]}),
    );
    let metrics = server.client().get("/metrics").text();
    for limit in ["reserved_bytes", "leased_bytes"] {
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with("yutu_kv_user_limit_refused_total")
                    && l.contains(&format!("limit=\"{limit}\""))
                    && !l.ends_with(" 0")),
            "no refusal counted for {limit}"
        );
    }
}

/// Registers `engine` as `who`'s peer with `secret` (the engine trusts the node with it
/// first); the reply.
fn register_as(
    server: &Server,
    who: &yutu_client::Credentials,
    engine: &TransferEngine,
    client: &NodeAddress,
    secret: [u8; 32],
) -> yutu_tests::Reply {
    let r = send_as(server, who, "GET", "/v1/kv/engine", b"");
    let node: NodeAddress =
        serde_json::from_slice(&r.body).unwrap_or_else(|_| panic!("{}", r.text()));
    engine.trust(node.node, secret);
    let body = json!({"client": client, "secret": hex::encode(secret)});
    send_as(
        server,
        who,
        "POST",
        "/v1/kv/peers",
        body.to_string().as_bytes(),
    )
}

/// Alice's engine is registered under her session. Bob can neither register his address
/// under her node id (which would route her blocks to him) nor use her session, and her
/// get-into still lands in her buffer.
#[test]
fn another_user_cannot_take_or_use_a_registered_engine() {
    let server = node_with_users(ONE_SHARD);
    let (alice, bob) = (alice(), bob());
    assert_eq!(send_as(&server, &alice, "PUT", "/alice", b"").status, 200);
    let r = send_as(&server, &alice, "PUT", "/alice/k", &pattern(4096, 3));
    assert_eq!(r.status, 200);
    let (alice_engine, alice_buf) = engine(&server, &alice, 0xa11ce);
    let r = register_as(
        &server,
        &alice,
        &alice_engine,
        &alice_engine.address(),
        [1; 32],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let session: Value = serde_json::from_slice(&r.body).expect("json");
    let session = session["session"].as_str().expect("session").to_string();

    // Bob: his own engine's address, under alice's node id.
    let (bob_engine, _) = engine(&server, &bob, 0xb0b);
    let mut forged = bob_engine.address();
    forged.node = alice_engine.node();
    let r = register_as(&server, &bob, &bob_engine, &forged, [2; 32]);
    assert_eq!(r.status, 409, "{}", r.text());
    assert_eq!(r.code().as_deref(), Some("OperationAborted"));
    // Bob naming alice's session.
    let target = alice_buf.descriptor(0, 4096).expect("descriptor");
    let body = json!({"keys": ["k"], "targets": [target], "session": session});
    let r = send_as(
        &server,
        &bob,
        "POST",
        "/v1/kv/alice/get-into",
        body.to_string().as_bytes(),
    );
    assert_ne!(r.status, 200, "bob used alice's session: {}", r.text());
    // Alice's own call works and her buffer holds her block.
    let copied = kv(&server, &alice, "/v1/kv/alice/get-into", body);
    assert_eq!(copied["copied"], json!([4096]));
    let mut back = vec![0u8; 4096];
    alice_buf.region().read_at(0, &mut back).expect("read");
    assert_eq!(back, pattern(4096, 3));
}

/// The node never dials an address a client names without proof: a registration naming a
/// port that is not the client's engine (here a listener that records what it gets, as a
/// Redis or any other service would) and a Unix socket that is not an engine is refused, the
/// port receives at most one fixed challenge frame (no payload, nothing the client chose),
/// and the socket receives nothing; get-into needs a registered session.
#[test]
fn the_node_never_sends_payload_to_an_unproven_address() {
    use std::io::Read;
    let server = node_with_users(ONE_SHARD);
    let bob = bob();
    assert_eq!(send_as(&server, &bob, "PUT", "/bob", b"").status, 200);
    let r = send_as(&server, &bob, "PUT", "/bob/k", &pattern(4096, 4));
    assert_eq!(r.status, 200);
    let (bob_engine, bob_buf) = engine(&server, &bob, 0xb0b);

    let victim = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let victim_addr = victim.local_addr().expect("addr");
    let received = std::thread::spawn(move || {
        let mut got = Vec::new();
        victim.set_nonblocking(false).expect("blocking listener");
        if let Ok((mut s, _)) = victim.accept() {
            let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(5)));
            let _ = s.read_to_end(&mut got);
        }
        got
    });
    let dir = tempfile::tempdir().expect("dir");
    let sock_path = dir.path().join("not-an-engine.sock");
    let sock = std::os::unix::net::UnixListener::bind(&sock_path).expect("unix bind");
    sock.set_nonblocking(true).expect("nonblocking");

    let mut claimed = bob_engine.address();
    claimed.tcp = Some(victim_addr);
    claimed.shm = Some(sock_path.clone());
    let r = register_as(&server, &bob, &bob_engine, &claimed, [3; 32]);
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(r.code().as_deref(), Some("AccessDenied"));
    let got = received.join().expect("victim thread");
    assert!(
        got.len() <= 128,
        "the unproven port received {} bytes: more than a challenge",
        got.len()
    );
    assert!(
        !got.windows(4).any(|w| w == &pattern(4096, 4)[..4]),
        "block bytes reached the unproven port"
    );
    let mut unix_got = Vec::new();
    if let Ok((mut s, _)) = sock.accept() {
        let _ = s.set_nonblocking(true);
        let _ = s.read_to_end(&mut unix_got);
    }
    assert!(unix_got.is_empty(), "the socket received {unix_got:?}");

    // No session, no get-into.
    let target = bob_buf.descriptor(0, 4096).expect("descriptor");
    let body = json!({"keys": ["k"], "targets": [target], "session": "not-registered"});
    let r = send_as(
        &server,
        &bob,
        "POST",
        "/v1/kv/bob/get-into",
        body.to_string().as_bytes(),
    );
    assert_eq!(r.status, 400, "{}", r.text());
}

/// Alice's bucket policy opens her bucket to bob and denies everyone one prefix of it. S3
/// reads are weighed per key: bob reads outside the prefix and not inside it. A KV call
/// names its keys in its body and stands for every key of the bucket, so a deny of any
/// prefix refuses it, over HTTP (bob, SigV4) and in frames (a token's inline read alike);
/// it used to be weighed as the literal key `*`, which the deny of the prefix did not match,
/// and read the denied blocks. An allow of every object admits KV calls again.
#[test]
fn a_bucket_policy_deny_of_a_prefix_refuses_kv_calls_on_the_bucket() {
    use yutu_client::kv::{KvClient, KvOptions};
    // Small enough for the value mirror (at most 4 KiB).
    const VALUE: usize = 1024;
    const KID: &str = "t1";
    const SECRET: &str = "tenancy-secret-0123456789abcdef-0123456789";
    let config = format!(
        "{}\n[[token_keys]]\nkid = \"{KID}\"\nsecret = \"{SECRET}\"\n",
        yutu_tests::users::USERS
    );
    let server = yutu_tests::users::node_with_config(&config, ONE_SHARD);
    let (alice, bob) = (alice(), bob());
    assert_eq!(send_as(&server, &alice, "PUT", "/shared", b"").status, 200);
    let token = |scope: &str| {
        let ttl = std::time::Duration::from_secs(600);
        yutu_tests::users::token_signed(KID, SECRET, &[scope], false, ttl)
    };
    let client_with = |token: String, presence: bool| {
        let options = KvOptions {
            token: Some(token),
            presence,
            ..KvOptions::default()
        };
        KvClient::new(&server.url, options).expect("kv client")
    };
    let client = |token: String| client_with(token, false);
    let keys = ["secret/b".to_string(), "public/b".to_string()];
    let writer = client(token("shared:rwl"));
    let buf = writer.register(2 * VALUE as u64).expect("buffer");
    for i in 0..2 {
        buf.write_at((i * VALUE) as u64, &pattern(VALUE, i as u64))
            .expect("stage");
    }
    let lens = [VALUE as u64; 2];
    writer
        .batch_put_from("shared", &keys, &buf, &[0, VALUE as u64], &lens)
        .expect("put-from");
    let secret = Some(pattern(VALUE, 0));
    let read = |kv: &KvClient| kv.get_bytes("shared", "secret/b");
    assert_eq!(read(&client(token("shared:rl"))).expect("read"), secret);
    // A reader that holds the bucket's value mirror, and reads the block from it.
    let early = client_with(token("shared:rl"), true);
    assert_eq!(read(&early).expect("read"), secret);
    assert_eq!(read(&early).expect("read"), secret);
    assert!(
        early.mirror_hits() > 0,
        "the second read came from the mirror"
    );

    let policy = |with_deny: bool| {
        let allow = r#"{"Effect": "Allow", "Principal": {"AWS": "bob"},
            "Action": ["s3:GetObject", "s3:ListBucket"],
            "Resource": ["arn:aws:s3:::shared", "arn:aws:s3:::shared/*"]}"#;
        let deny = match with_deny {
            true => {
                r#", {"Effect": "Deny", "Principal": "*", "Action": "s3:GetObject",
            "Resource": "arn:aws:s3:::shared/secret/*"}"#
            }
            false => "",
        };
        format!(r#"{{"Version": "2012-10-17", "Statement": [{allow}{deny}]}}"#)
    };
    let set_policy = |text: String| {
        let headers =
            yutu_tests::users::signed(&server, &alice, "PUT", "/shared", "policy", text.as_bytes());
        let refs: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let r = server
            .client()
            .send("PUT", "/shared?policy", &refs, Some(text.as_bytes()));
        assert!(
            r.status == 200 || r.status == 204,
            "PutBucketPolicy: {}",
            r.text()
        );
    };
    set_policy(policy(true));

    // S3: per key.
    let s3_get = |key: &str| send_as(&server, &bob, "GET", &format!("/shared/{key}"), b"").status;
    assert_eq!((s3_get("public/b"), s3_get("secret/b")), (200, 403));
    // KV over HTTP: every call on the bucket, whichever keys it names.
    let call = |op: &str, keys: &[&str]| {
        let body = json!({ "keys": keys }).to_string();
        let path = format!("/v1/kv/shared/{op}");
        send_as(&server, &bob, "POST", &path, body.as_bytes())
    };
    let exists = |keys: &[&str]| call("exists", keys);
    let get = call("get", &["secret/b"]);
    assert_eq!(get.status, 403, "a lease of a denied block: {}", get.text());
    assert_eq!(exists(&["public/b"]).status, 403);
    // KV in frames: a token's inline read of the denied block.
    let refused = read(&client(token("shared:rl"))).expect_err("the deny refuses the read");
    assert_eq!(refused.code(), Some("AccessDenied"), "{refused}");
    // The policy retired the mirror: its holder asks the node, which refuses.
    let hits = early.mirror_hits();
    let refused = read(&early).expect_err("the mirror holder is refused too");
    assert_eq!(refused.code(), Some("AccessDenied"), "{refused}");
    assert_eq!(early.mirror_hits(), hits);

    // A deny of listing the bucket (on the bucket, as ListBucket is written) refuses a
    // presence table (which tells of every key), not the reads.
    set_policy(
        r#"{"Version": "2012-10-17", "Statement": [{"Effect": "Deny", "Principal": "*",
            "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::shared"}]}"#
            .to_string(),
    );
    let lister = client_with(token("shared:rl"), true);
    assert_eq!(read(&lister).expect("read"), secret);
    assert_eq!(
        lister.batch_exists("shared", &keys).expect("exists"),
        [true, true]
    );
    assert_eq!(
        lister.presence_tables(),
        0,
        "no table for a caller denied listing"
    );
    assert_eq!(lister.mirror_hits(), 0);

    // Without the deny, the allow of every object admits bob's KV calls.
    set_policy(policy(false));
    let r = exists(&["secret/b", "public/b"]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(read(&client(token("shared:rl"))).expect("read"), secret);
}
