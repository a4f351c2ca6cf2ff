//! Correctness holes that remain after the tier-consistency fixes (see `tier_consistency.rs`
//! for the ones already closed), each through the real binary:
//!
//! - a `disk` PUT that finds no DRAM room is acknowledged, but GET keeps serving the older
//!   version still in DRAM;
//! - a `disk` CompleteMultipartUpload refused by the durable budget has already replaced the
//!   object in DRAM;
//! - DeleteObjects is authorised before its body is read, by bucket name only, so a slow one
//!   deletes from a bucket that was deleted and created again by another user meanwhile.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use yutu_tests::users::{alice, bob, node_with_users, send_as, signed};
use yutu_tests::{etag_of, pattern, xml, Client, Reply, Server};

const MIB: usize = 1 << 20;

/// A node of one shard with `memory` of DRAM and `nvme` of NVMe tier; the one (anonymous)
/// user may reserve all of it, which is how these tests fill DRAM.
fn one_shard(memory: &str, nvme: &str) -> Server {
    Server::start(&[
        "--memory",
        memory,
        "--shards",
        "1",
        "--nvme-capacity",
        nvme,
        "--kv-user-reserved",
        memory,
    ])
}

/// Creates a bucket whose objects are written through to NVMe before a PUT is answered.
fn make_disk_bucket(c: &Client, bucket: &str) {
    let r = c.send(
        "PUT",
        &format!("/{bucket}"),
        &[("x-yutu-durability", "disk")],
        Some(b""),
    );
    assert_eq!(r.status, 200, "create disk bucket {bucket}: {}", r.text());
}

/// A KV API call (JSON body) on `bucket`.
fn kv(c: &Client, bucket: &str, op: &str, body: serde_json::Value) -> Reply {
    let body = body.to_string();
    c.send(
        "POST",
        &format!("/v1/kv/{bucket}/{op}"),
        &[("content-type", "application/json")],
        Some(body.as_bytes()),
    )
}

/// Leases `key` (so its DRAM copy stays put), then takes the rest of DRAM with put-start
/// reservations, which nothing can evict.
fn pin_and_fill_dram(c: &Client, bucket: &str, key: &str) {
    let lease = kv(
        c,
        bucket,
        "get",
        serde_json::json!({ "keys": [key], "ttl_ms": 60_000 }),
    );
    assert_eq!(lease.status, 200, "lease: {}", lease.text());
    let mut reserved = 0;
    for i in 0..64u64 {
        let r = kv(
            c,
            bucket,
            "put-start",
            serde_json::json!({
                "blocks": [{ "key": format!("{:064x}", 100 + i), "len": MIB }],
                "ttl_ms": 60_000
            }),
        );
        if r.status != 200 {
            break;
        }
        reserved += 1;
    }
    assert!(
        reserved > 8,
        "DRAM was not filled ({reserved} reservations)"
    );
}

/// A `disk` PUT over a key whose old version is pinned in a full DRAM: the new version is
/// written to NVMe and acknowledged, DRAM has no room for it, and the old DRAM copy is left
/// in place, so GET and HEAD keep answering the old version (until it is evicted, or the node
/// restarts). An acknowledged PUT must be what the next GET returns; a PUT that cannot be
/// made visible must be refused and leave the old version.
#[test]
fn an_acknowledged_disk_put_is_what_get_returns_when_dram_is_full() {
    let server = one_shard("16MiB", "256MiB");
    let c = server.client();
    make_disk_bucket(&c, "durable");
    let key = format!("{:064x}", 1);
    let path = format!("/durable/{key}");
    let old = pattern(MIB, 1);
    let r = c.put(&path, &old);
    assert_eq!(r.status, 200, "first version: {}", r.text());
    pin_and_fill_dram(&c, "durable", &key);

    let new = pattern(2 * MIB, 2);
    let put = c.put(&path, &new);
    let got = c.get(&path);
    assert_eq!(got.status, 200, "{}", got.text());
    if put.status == 200 {
        assert_eq!(
            got.header("etag"),
            Some(etag_of(&new).as_str()),
            "the PUT was acknowledged, but GET serves the version it replaced"
        );
        assert!(
            got.body == new,
            "GET returned other bytes than the acknowledged PUT"
        );
    } else {
        assert!(
            got.body == old,
            "the refused PUT ({}) changed the object",
            put.status
        );
    }
}

/// CompleteMultipartUpload into a `disk` bucket whose durable budget is spent: the parts are
/// assembled and published in DRAM first, then the write-through is refused (507), and the
/// refused object stays visible in place of the acknowledged version (which a restart would
/// bring back). A refused complete must leave the object as it was.
#[test]
fn a_refused_durable_complete_leaves_the_object_as_it_was() {
    let server = one_shard("32MiB", "64MiB");
    let c = server.client();
    make_disk_bucket(&c, "keep");
    let mut refused = false;
    for i in 0..100u64 {
        let r = c.put(&format!("/keep/o{i:03}"), &pattern(MIB, i));
        match r.status {
            200 => {}
            507 => {
                refused = true;
                break;
            }
            s => panic!("o{i:03}: unexpected {s}: {}", r.text()),
        }
    }
    assert!(refused, "100 MiB of durable writes fit a 64 MiB tier?");

    // Replace o000 (1 MiB) with a 3 MiB upload: 2 MiB more than the budget has left.
    let init = c.send("POST", "/keep/o000?uploads", &[], Some(b""));
    assert_eq!(init.status, 200, "create upload: {}", init.text());
    let id = xml::values(&init.text(), "UploadId")
        .pop()
        .expect("an UploadId");
    let part = c.put(
        &format!("/keep/o000?partNumber=1&uploadId={id}"),
        &pattern(3 * MIB, 7),
    );
    assert_eq!(part.status, 200, "upload part: {}", part.text());
    let doc = format!(
        "<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>{}</ETag></Part></CompleteMultipartUpload>",
        part.header("etag").expect("the part's ETag")
    );
    let done = c.send(
        "POST",
        &format!("/keep/o000?uploadId={id}"),
        &[],
        Some(doc.as_bytes()),
    );
    assert_eq!(
        (done.status, done.code().as_deref()),
        (507, Some("InsufficientStorage")),
        "the durable budget is spent: {}",
        done.text()
    );
    let got = c.get("/keep/o000");
    assert_eq!(got.status, 200, "{}", got.text());
    assert!(
        got.body == pattern(MIB, 0),
        "the refused complete replaced the object ({} bytes served)",
        got.body.len()
    );
}

/// DeleteObjects is authorised on the bucket name before its body is read, and deletes by
/// name once the body is in: alice's slow DeleteObjects on her bucket `shared` outlives the
/// bucket, bob creates `shared` again and stores `bob.txt`, and alice's request, finishing,
/// deletes bob's object. A request authorised against one bucket must never act on a later
/// bucket of the same name.
#[test]
fn a_slow_delete_objects_never_deletes_from_a_recreated_bucket() {
    let server = node_with_users(&[
        "--memory",
        "64MiB",
        "--shards",
        "2",
        "--nvme-capacity",
        "64MiB",
    ]);
    let (alice, bob) = (alice(), bob());
    assert_eq!(send_as(&server, &alice, "PUT", "/shared", b"").status, 200);

    let doc = b"<Delete><Object><Key>bob.txt</Key></Object></Delete>";
    let mut s = TcpStream::connect(server.addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("read timeout");
    let mut head = format!(
        "POST /shared?delete HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\nExpect: 100-continue\r\n",
        server.addr,
        doc.len()
    );
    for (k, v) in signed(&server, &alice, "POST", "/shared", "delete", doc) {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).expect("send the head");
    // `100 Continue` comes when the handler starts reading the body: it has authorised.
    let mut interim = [0u8; 25];
    s.read_exact(&mut interim).expect("100 Continue");
    assert!(
        interim.starts_with(b"HTTP/1.1 100"),
        "{}",
        String::from_utf8_lossy(&interim)
    );
    s.write_all(&doc[..8]).expect("first bytes of the body");

    assert_eq!(
        send_as(&server, &alice, "DELETE", "/shared", b"").status,
        204
    );
    assert_eq!(send_as(&server, &bob, "PUT", "/shared", b"").status, 200);
    let r = send_as(&server, &bob, "PUT", "/shared/bob.txt", b"bob's");
    assert_eq!(r.status, 200, "{}", r.text());

    s.write_all(&doc[8..]).expect("rest of the body");
    // The status line means the handler is done; the connection stays open (keep-alive).
    let mut answer = [0u8; 12];
    s.read_exact(&mut answer).expect("status line");
    let got = send_as(&server, &bob, "GET", "/shared/bob.txt", b"");
    assert_eq!(
        (got.status, got.text().as_str()),
        (200, "bob's"),
        "alice's DeleteObjects (answered {}) deleted from bob's new bucket",
        String::from_utf8_lossy(&answer)
    );
}
