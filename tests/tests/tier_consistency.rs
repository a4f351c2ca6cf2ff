//! Correctness across tiers and over time, through the real binary: conditions see every
//! tier, deletes are not undone, failed writes keep the old version, conditional durable
//! writes cannot both win, a re-created bucket never receives an old request's object, and
//! acknowledged durable writes survive a full NVMe tier.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use yutu_tests::server::wait_until;
use yutu_tests::users::{alice, bob, node_with_users, send_as, signed};
use yutu_tests::{pattern, xml, Client, Reply, Server};

const MIB: usize = 1 << 20;

/// One shard with 16 MiB of DRAM: objects up to 1 MiB are promoted back from NVMe.
fn small_node() -> Server {
    Server::start(&[
        // The one (anonymous) user may reserve all of DRAM: some tests fill it that way.
        "--kv-user-reserved",
        "16MiB",
        "--memory",
        "16MiB",
        "--shards",
        "1",
        "--nvme-capacity",
        "256MiB",
    ])
}

/// Writes `mib` MiB of other objects so that everything older is evicted to NVMe, and waits
/// for the demotions to land.
fn push_to_nvme(server: &Server, bucket: &str, mib: usize) {
    let c = server.client();
    for i in 0..mib {
        let r = c.put(
            &format!("/{bucket}/filler-{i}"),
            &pattern(MIB, 1000 + i as u64),
        );
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert!(
        wait_until(Duration::from_secs(30), || {
            server.metric_sum("yutu_demotions_total")
                + server.metric_sum("yutu_demotions_dropped_total")
                + server.metric_sum("yutu_objects")
                >= mib as f64
        }),
        "demotions did not drain"
    );
}

/// Whether a HEAD of `path` was answered from NVMe (HEAD never promotes).
fn head_from_nvme(server: &Server, path: &str) -> Option<String> {
    let before = server.metric_sum("yutu_tier_hits_total{tier=\"nvme\"");
    let h = server.client().head(path);
    let after = server.metric_sum("yutu_tier_hits_total{tier=\"nvme\"");
    (h.status == 200 && after > before).then(|| h.header("etag").unwrap_or_default().to_string())
}

/// `If-None-Match: *` and `If-Match` on an object that lives only on NVMe, for PUT,
/// CopyObject and CompleteMultipartUpload. They used to see DRAM only: `If-None-Match: *`
/// overwrote the object and `If-Match` answered NoSuchKey.
#[test]
fn write_conditions_see_objects_only_on_nvme() {
    let server = small_node();
    let c = server.client();
    c.mb("cond");
    // 2 MiB: above the promotion limit, so reads leave it on NVMe.
    let old = pattern(2 * MIB, 1);
    assert_eq!(c.put("/cond/target", &old).status, 200);
    assert_eq!(c.put("/cond/src", b"copy source").status, 200);
    push_to_nvme(&server, "cond", 24);
    let etag = head_from_nvme(&server, "/cond/target").expect("the target is only on NVMe");

    let create_only = [("if-none-match", "*")];
    let r = c.send("PUT", "/cond/target", &create_only, Some(b"new"));
    assert_eq!(
        (r.status, r.code().as_deref()),
        (412, Some("PreconditionFailed")),
        "PUT"
    );
    let copy = [("if-none-match", "*"), ("x-amz-copy-source", "/cond/src")];
    let r = c.send("PUT", "/cond/target", &copy, Some(b""));
    assert_eq!(r.status, 412, "CopyObject: {}", r.text());
    let init = c.send("POST", "/cond/target?uploads", &[], Some(b""));
    let id = xml::values(&init.text(), "UploadId").remove(0);
    let part = c.put(&format!("/cond/target?partNumber=1&uploadId={id}"), b"part");
    let done = format!(
        "<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>{}</ETag></Part></CompleteMultipartUpload>",
        part.header("etag").unwrap_or_default()
    );
    let r = c.send(
        "POST",
        &format!("/cond/target?uploadId={id}"),
        &create_only,
        Some(done.as_bytes()),
    );
    assert_eq!(r.status, 412, "CompleteMultipartUpload: {}", r.text());
    let got = c.get("/cond/target");
    assert!(
        got.body == old,
        "a refused conditional write changed the object"
    );

    let r = c.send(
        "PUT",
        "/cond/target",
        &[("if-match", etag.as_str())],
        Some(b"swapped"),
    );
    assert_eq!(
        r.status,
        200,
        "If-Match with the NVMe version's ETag: {}",
        r.text()
    );
    assert_eq!(c.get("/cond/target").body, b"swapped");
    let r = c.send(
        "PUT",
        "/cond/target",
        &[("if-match", etag.as_str())],
        Some(b"again"),
    );
    assert_eq!(r.status, 412, "the old ETag no longer matches");
}

/// A DELETE racing a GET that reads the object from NVMe: the GET used to promote the
/// record after the DRAM copy was dropped and before the tombstone landed, and the deleted
/// object was readable again.
#[test]
fn a_delete_is_not_undone_by_a_read_in_flight() {
    let server = small_node();
    let c = server.client();
    c.mb("race");
    let keys: Vec<String> = (0..48).map(|i| format!("/race/k{i:02}")).collect();
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(c.put(k, &pattern(256 * 1024, i as u64)).status, 200);
    }
    push_to_nvme(&server, "race", 24);
    for k in &keys {
        let barrier = Arc::new(Barrier::new(3));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (c, k, barrier) = (c.clone(), k.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    c.get(&k).status
                })
            })
            .collect();
        barrier.wait();
        assert_eq!(c.delete(k).status, 204);
        for r in readers {
            let status = r.join().expect("reader");
            assert!(status == 200 || status == 404, "{k}: {status}");
        }
        let after = c.get(k);
        assert_eq!(after.status, 404, "{k} was deleted but is readable again");
    }
}

/// Starts a KV request (JSON) and returns the reply.
fn kv(c: &Client, bucket: &str, op: &str, body: serde_json::Value) -> Reply {
    let body = body.to_string();
    c.send(
        "POST",
        &format!("/v1/kv/{bucket}/{op}"),
        &[("content-type", "application/json")],
        Some(body.as_bytes()),
    )
}

/// A PUT that fails for lack of room (503) used to remove the previous version first.
#[test]
fn a_put_that_finds_no_room_keeps_the_old_version() {
    let server = small_node();
    let c = server.client();
    c.mb("full");
    let key = format!("{:064x}", 1);
    let old = pattern(MIB, 5);
    assert_eq!(c.put(&format!("/full/{key}"), &old).status, 200);
    // A read lease pins the old version; put reservations take the rest of DRAM.
    let lease = kv(
        &c,
        "full",
        "get",
        serde_json::json!({ "keys": [key], "ttl_ms": 60_000 }),
    );
    assert_eq!(lease.status, 200, "{}", lease.text());
    let mut reserved = 0;
    for i in 0..64u64 {
        let k = format!("{:064x}", 100 + i);
        let r = kv(
            &c,
            "full",
            "put-start",
            serde_json::json!({
                "blocks": [{ "key": k, "len": MIB }], "ttl_ms": 60_000
            }),
        );
        if r.status != 200 {
            break;
        }
        reserved += 1;
    }
    assert!(
        reserved > 8,
        "DRAM was filled with reservations ({reserved})"
    );
    let r = c.put(&format!("/full/{key}"), &pattern(2 * MIB, 6));
    assert_eq!(r.status, 503, "{}", r.text());
    let got = c.get(&format!("/full/{key}"));
    assert_eq!(
        got.status, 200,
        "the failed PUT removed the previous version"
    );
    assert!(got.body == old);
}

/// Two `If-None-Match: *` PUTs into a `disk` bucket used to both succeed: the condition was
/// checked before the NVMe write and not again when publishing.
#[test]
fn racing_create_only_puts_into_a_disk_bucket_have_one_winner() {
    let server = Server::start(&["--memory", "64MiB", "--shards", "2"]);
    let c = server.client();
    let r = c.send(
        "PUT",
        "/durable",
        &[("x-yutu-durability", "disk")],
        Some(b""),
    );
    assert_eq!(r.status, 200);
    let mut contested = 0;
    for round in 0..40 {
        let barrier = Arc::new(Barrier::new(4));
        let writers: Vec<_> = (0..4u64)
            .map(|w| {
                let (c, barrier) = (c.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    let body = pattern(64 * 1024, round * 10 + w);
                    c.send(
                        "PUT",
                        &format!("/durable/k{round}"),
                        &[("if-none-match", "*")],
                        Some(&body),
                    )
                    .status
                })
            })
            .collect();
        let statuses: Vec<u16> = writers
            .into_iter()
            .map(|w| w.join().expect("writer"))
            .collect();
        let winners = statuses.iter().filter(|s| **s == 200).count();
        assert_eq!(winners, 1, "round {round}: {statuses:?}");
        assert!(
            statuses.iter().all(|s| [200, 409, 412].contains(s)),
            "{statuses:?}"
        );
        contested += statuses.iter().filter(|s| **s == 409).count();
    }
    eprintln!("conflicts answered 409: {contested}");
}

/// The permission check ran on the accepting shard before the body, by bucket name only: a
/// bucket deleted and created again by another user during a slow upload received the old
/// user's object.
#[test]
fn a_recreated_bucket_never_receives_an_old_upload() {
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

    // Alice's upload: signed and authorised now, its body trickles in later.
    let body = pattern(512 * 1024, 9);
    let mut s = TcpStream::connect(server.addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut head = format!(
        "PUT /shared/alice.bin HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\nExpect: 100-continue\r\n",
        server.addr,
        body.len()
    );
    for (k, v) in signed(&server, &alice, "PUT", "/shared/alice.bin", "", &body) {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).expect("head");
    s.flush().expect("flush");
    // `100 Continue` comes when the handler starts reading the body: it has authorised.
    let mut interim = [0u8; 25];
    s.read_exact(&mut interim).expect("100 Continue");
    assert!(
        interim.starts_with(b"HTTP/1.1 100"),
        "{}",
        String::from_utf8_lossy(&interim)
    );
    s.write_all(&body[..1024]).expect("first bytes");

    assert_eq!(
        send_as(&server, &alice, "DELETE", "/shared", b"").status,
        204
    );
    assert_eq!(send_as(&server, &bob, "PUT", "/shared", b"").status, 200);

    s.write_all(&body[1024..]).expect("rest of the body");
    // The status line is enough; the connection stays open (keep-alive).
    let mut answer = [0u8; 12];
    s.read_exact(&mut answer).expect("status line");
    let answer = String::from_utf8_lossy(&answer).to_string();
    let status = answer.get(9..12).unwrap_or("");
    assert_ne!(
        status, "200",
        "alice's upload landed in bob's bucket: {answer}"
    );
    let listed = send_as(&server, &bob, "GET", "/shared", b"");
    assert_eq!(listed.status, 200);
    assert!(
        xml::values(&listed.text(), "Key").is_empty(),
        "bob's new bucket holds {:?}",
        xml::values(&listed.text(), "Key")
    );
}

/// Acknowledged `disk` writes were lost when live durable data exceeded the NVMe tier:
/// region reclamation dropped what it had no room to rewrite. Writes past the tier's
/// durable budget are now refused (507) and every acknowledged one survives SIGKILL.
#[test]
fn durable_writes_beyond_the_nvme_tier_are_refused_not_lost() {
    let dir = tempfile::tempdir().expect("temp dir");
    let args = [
        "--memory",
        "32MiB",
        "--shards",
        "1",
        "--nvme-capacity",
        "64MiB",
    ];
    let server = Server::start_on(dir.path(), &args);
    let c = server.client();
    let r = c.send("PUT", "/keep", &[("x-yutu-durability", "disk")], Some(b""));
    assert_eq!(r.status, 200);
    let mut acknowledged = Vec::new();
    let mut refused = 0;
    for i in 0..100u64 {
        let r = c.put(&format!("/keep/o{i:03}"), &pattern(MIB, i));
        match r.status {
            200 => acknowledged.push(i),
            507 => {
                assert_eq!(
                    r.code().as_deref(),
                    Some("InsufficientStorage"),
                    "{}",
                    r.text()
                );
                refused += 1;
            }
            s => panic!("o{i}: unexpected {s}: {}", r.text()),
        }
    }
    assert!(refused > 0, "100 MiB of durable writes fit a 64 MiB tier?");
    assert!(
        acknowledged.len() > 20,
        "only {} acknowledged",
        acknowledged.len()
    );
    assert!(server.metric_sum("yutu_durable_refused_total") >= refused as f64);
    server.kill();

    let server = Server::start_on(dir.path(), &args);
    let c = server.client();
    for i in &acknowledged {
        let r = c.get(&format!("/keep/o{i:03}"));
        assert_eq!(r.status, 200, "acknowledged o{i:03} was lost");
        assert!(r.body == pattern(MIB, *i), "o{i:03}: wrong bytes");
    }
    assert_eq!(server.metric_sum("yutu_durable_dropped_total"), 0.0);
}
