//! Bucket quotas on one node: set at creation (`x-yutu-quota`, `yutu mb --quota`), reported by
//! HeadBucket, enforced on every write path (PUT, CopyObject, CompleteMultipartUpload, KV
//! put-start and put-from), each object counted once over DRAM and NVMe, and freed by deletes
//! and by evictions that drop an object.

use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use yutu_tests::kv::{client_engine, register};
use yutu_tests::server::wait_until;
use yutu_tests::{bin_path, pattern, xml, Client, Reply, Server};
use yutu_transfer::NodeAddress;

const KIB: usize = 1024;
const MIB: usize = 1 << 20;

fn usage(c: &Client, bucket: &str) -> u64 {
    let r = c.head(&format!("/{bucket}"));
    assert_eq!(r.status, 200, "HEAD /{bucket}");
    r.header("x-yutu-usage")
        .and_then(|v| v.parse().ok())
        .expect("x-yutu-usage")
}

fn mb_quota(c: &Client, bucket: &str, quota: &str, extra: &[(&str, &str)]) {
    let mut headers = vec![("x-yutu-quota", quota)];
    headers.extend_from_slice(extra);
    let r = c.send("PUT", &format!("/{bucket}"), &headers, Some(b""));
    assert_eq!(r.status, 200, "create {bucket}: {}", r.text());
}

fn refused(r: &Reply) -> bool {
    r.status == 403 && r.code().as_deref() == Some("QuotaExceeded")
}

#[test]
fn writes_past_the_quota_are_refused_and_deletes_free_room() {
    let server = Server::start(&["--memory", "64MiB", "--shards", "2"]);
    let c = server.client();

    // Bad quotas are refused clearly, and no bucket is made.
    for bad in ["lots", "0", "-5", "1.5.5GiB"] {
        let r = c.send("PUT", "/bad", &[("x-yutu-quota", bad)], Some(b""));
        assert_eq!(
            (r.status, r.code().as_deref()),
            (400, Some("InvalidArgument")),
            "{bad}"
        );
        assert!(r.text().contains("x-yutu-quota"), "{}", r.text());
    }
    assert_eq!(c.head("/bad").status, 404);

    mb_quota(&c, "quo", "1MiB", &[]);
    let head = c.head("/quo");
    assert_eq!(head.header("x-yutu-quota"), Some("1048576"));
    assert_eq!(head.header("x-yutu-durability"), Some("memory"));
    assert_eq!(usage(&c, "quo"), 0);
    // A bucket without a quota says so by not naming one.
    c.mb("free");
    assert_eq!(c.head("/free").header("x-yutu-quota"), None);

    // Ten 100 KiB objects fit in 1 MiB (keys spread over both shards); the eleventh does not.
    let body = pattern(100 * KIB, 1);
    for i in 0..10 {
        let r = c.put(&format!("/quo/k{i}"), &body);
        assert_eq!(r.status, 200, "k{i}: {}", r.text());
    }
    assert_eq!(usage(&c, "quo"), 10 * 100 * KIB as u64);
    let r = c.put("/quo/k10", &body);
    assert!(refused(&r), "{} {}", r.status, r.text());
    assert!(r.text().contains("quota"), "{}", r.text());
    assert_eq!(
        c.get("/quo/k10").status,
        404,
        "a refused write stores nothing"
    );
    assert_eq!(server.metric_sum("yutu_quota_refused_total"), 1.0);
    // Rewriting a key nets out what it replaces: the bucket is full, and this still fits.
    let r = c.put("/quo/k3", &pattern(100 * KIB, 2));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(c.get("/quo/k3").body, pattern(100 * KIB, 2));
    // A copy into the bucket is a write like any other.
    assert_eq!(c.put("/free/src", &body).status, 200);
    let r = c.send(
        "PUT",
        "/quo/copied",
        &[("x-amz-copy-source", "/free/src")],
        None,
    );
    assert!(refused(&r), "{} {}", r.status, r.text());
    // Other buckets are not limited by it.
    assert_eq!(c.put("/free/big", &pattern(2 * MIB, 3)).status, 200);

    // A delete frees room at once.
    assert_eq!(c.delete("/quo/k0").status, 204);
    assert_eq!(usage(&c, "quo"), 9 * 100 * KIB as u64);
    assert_eq!(c.put("/quo/k10", &body).status, 200);
    let r = c.send(
        "PUT",
        "/quo/copied",
        &[("x-amz-copy-source", "/free/src")],
        None,
    );
    assert!(refused(&r), "still full: {} {}", r.status, r.text());
    for k in ["k1", "k2"] {
        assert_eq!(c.delete(&format!("/quo/{k}")).status, 204);
    }
    let r = c.send(
        "PUT",
        "/quo/copied",
        &[("x-amz-copy-source", "/free/src")],
        None,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // Every acknowledged object reads back whole.
    for i in (3..=10).filter(|i| *i != 3) {
        assert_eq!(c.get(&format!("/quo/k{i}")).body, body, "k{i}");
    }
}

#[test]
fn a_multipart_upload_past_the_quota_is_refused_at_completion_and_kept() {
    let server = Server::start(&["--memory", "64MiB"]);
    let c = server.client();
    mb_quota(&c, "mpq", "6MiB", &[]);
    let upload = |sizes: &[usize]| -> (String, String) {
        let r = c.send("POST", "/mpq/big?uploads", &[], Some(b""));
        assert_eq!(r.status, 200, "{}", r.text());
        let id = xml::values(&r.text(), "UploadId").remove(0);
        let mut doc = String::from("<CompleteMultipartUpload>");
        for (i, s) in sizes.iter().enumerate() {
            let n = i + 1;
            let r = c.put(
                &format!("/mpq/big?partNumber={n}&uploadId={id}"),
                &pattern(*s, n as u64),
            );
            assert_eq!(r.status, 200, "{}", r.text());
            let etag = r.header("etag").expect("etag").to_string();
            doc += &format!("<Part><PartNumber>{n}</PartNumber><ETag>{etag}</ETag></Part>");
        }
        doc += "</CompleteMultipartUpload>";
        (id, doc)
    };
    let (id, doc) = upload(&[5 * MIB, 2 * MIB]);
    let r = c.send(
        "POST",
        &format!("/mpq/big?uploadId={id}"),
        &[],
        Some(doc.as_bytes()),
    );
    assert!(refused(&r), "{} {}", r.status, r.text());
    assert_eq!(c.head("/mpq/big").status, 404);
    // The upload is still there, to abort (or to complete once there is room).
    assert_eq!(
        xml::values(&c.get("/mpq?uploads").text(), "UploadId"),
        std::slice::from_ref(&id)
    );
    assert_eq!(
        c.delete(&format!("/mpq/big?uploadId={id}")).status,
        204,
        "abort"
    );
    // Exactly the quota fits.
    let (id, doc) = upload(&[5 * MIB, MIB]);
    let r = c.send(
        "POST",
        &format!("/mpq/big?uploadId={id}"),
        &[],
        Some(doc.as_bytes()),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(usage(&c, "mpq"), 6 * MIB as u64);
}

#[test]
fn usage_counts_both_tiers_once_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--memory",
        "8MiB",
        "--shards",
        "1",
        "--nvme-capacity",
        "64MiB",
    ];
    let server = Server::start_on(dir.path(), &args);
    let c = server.client();
    // A disk bucket: every object is in DRAM and on NVMe, and counts once.
    mb_quota(&c, "disk", "4MiB", &[("x-yutu-durability", "disk")]);
    for i in 0..3 {
        assert_eq!(c.put(&format!("/disk/k{i}"), &pattern(MIB, i)).status, 200);
    }
    assert_eq!(usage(&c, "disk"), 3 * MIB as u64);
    // A memory bucket larger than DRAM: evicted objects are demoted to NVMe and still count.
    mb_quota(&c, "mem", "12MiB", &[]);
    for i in 0..12 {
        let r = c.put(&format!("/mem/k{i}"), &pattern(MIB, 100 + i));
        assert_eq!(r.status, 200, "mem/k{i}: {}", r.text());
    }
    assert!(refused(&c.put("/mem/more", &pattern(MIB, 7))));
    assert!(
        wait_until(Duration::from_secs(10), || server
            .metric_sum("yutu_demotions_total")
            >= 1.0),
        "nothing was demoted"
    );
    assert_eq!(usage(&c, "mem"), 12 * MIB as u64);
    assert!(refused(&c.put("/mem/more", &pattern(MIB, 7))));
    drop(server);

    // After a restart the NVMe records count again.
    let server = Server::start_on(dir.path(), &args);
    let c = server.client();
    assert_eq!(c.head("/disk").header("x-yutu-quota"), Some("4194304"));
    assert!(
        wait_until(Duration::from_secs(10), || usage(&c, "disk")
            == 3 * MIB as u64),
        "usage after restart: {}",
        usage(&c, "disk")
    );
    assert!(refused(&c.put("/disk/k9", &pattern(2 * MIB, 9))));
    assert_eq!(c.put("/disk/k9", &pattern(MIB, 9)).status, 200);
    assert!(refused(&c.put("/disk/k10", &pattern(1, 9))));
}

#[test]
fn objects_evicted_from_a_cache_bucket_free_its_quota() {
    // No NVMe tier: an evicted object leaves the node, and its bytes leave the quota.
    let server = Server::start(&["--memory", "8MiB", "--shards", "1", "--nvme-capacity", "0"]);
    let c = server.client();
    mb_quota(&c, "cache", "6MiB", &[]);
    let mut written = 0;
    for i in 0..20 {
        let r = c.put(&format!("/cache/k{i}"), &pattern(MIB, i));
        if r.status == 200 {
            written += 1;
        } else {
            assert!(refused(&r), "{} {}", r.status, r.text());
            // Only once the bucket holds its quota: then fill another bucket to evict.
            assert!(usage(&c, "cache") + MIB as u64 > 6 * MIB as u64);
            break;
        }
    }
    assert_eq!(written, 6);
    c.mb("other");
    for i in 0..8 {
        assert_eq!(
            c.put(&format!("/other/k{i}"), &pattern(MIB, 50 + i)).status,
            200
        );
    }
    assert!(server.metric_sum("yutu_evictions_total") >= 1.0);
    assert!(
        wait_until(Duration::from_secs(10), || usage(&c, "cache")
            < 6 * MIB as u64),
        "evictions did not free the quota: {}",
        usage(&c, "cache")
    );
    assert_eq!(c.put("/cache/after", &pattern(MIB, 99)).status, 200);
}

/// The put ids of a put-start's `puts` or a publish's `rooms`.
fn put_ids(list: &Value) -> Vec<Value> {
    list.as_array()
        .expect("a list")
        .iter()
        .map(|p| p["put_id"].clone())
        .collect()
}

#[test]
fn kv_puts_are_held_to_the_quota() {
    let server = Server::start(&["--memory", "64MiB", "--shards", "2"]);
    let c = server.client();
    mb_quota(&c, "kvq", "64KiB", &[]);
    let post = |path: &str, body: &Value| {
        c.send(
            "POST",
            path,
            &[("content-type", "application/json")],
            Some(body.to_string().as_bytes()),
        )
    };
    // Two-phase put: refused at put-start, all or none.
    let blocks: Vec<Value> = (0..3)
        .map(|i| json!({"key": format!("b{i}"), "len": 30 * KIB}))
        .collect();
    let r = post("/v1/kv/kvq/put-start", &json!({ "blocks": blocks }));
    assert!(refused(&r), "{} {}", r.status, r.text());
    let r = post("/v1/kv/kvq/put-start", &json!({ "blocks": blocks[..2] }));
    assert_eq!(r.status, 200, "{}", r.text());
    let started: Value = serde_json::from_slice(&r.body).unwrap();
    let ids = put_ids(&started["puts"]);
    // Started puts hold their quota until they end: a third block does not fit meanwhile.
    let r = post("/v1/kv/kvq/put-start", &json!({ "blocks": blocks[2..] }));
    assert!(refused(&r), "{} {}", r.status, r.text());
    // Revoked, they give it back at once.
    let r = post("/v1/kv/kvq/revoke", &json!({ "put_ids": ids }));
    assert_eq!(r.status, 200, "{}", r.text());
    let r = post("/v1/kv/kvq/put-start", &json!({ "blocks": blocks[2..] }));
    assert_eq!(r.status, 200, "{}", r.text());
    let started: Value = serde_json::from_slice(&r.body).unwrap();
    let id = started["puts"][0]["put_id"].clone();
    let r = post("/v1/kv/kvq/put-end", &json!({ "put_ids": [id] }));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(usage(&c, "kvq"), 30 * KIB as u64);
    assert_eq!(c.delete("/kvq/b2").status, 204);
    assert_eq!(usage(&c, "kvq"), 0);

    // Rooms (puts started before their key is known) hold the quota as started puts do: of
    // three asked, two fit and are answered, and the call still succeeds; revoked, they give
    // it back.
    let r = post(
        "/v1/kv/kvq/publish",
        &json!({ "rooms": [30 * KIB, 30 * KIB, 30 * KIB] }),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let given: Value = serde_json::from_slice(&r.body).unwrap();
    let rooms = put_ids(&given["rooms"]);
    assert_eq!(rooms.len(), 2, "{given}");
    let r = post("/v1/kv/kvq/put-start", &json!({ "blocks": blocks[2..] }));
    assert!(
        refused(&r),
        "rooms hold the quota: {} {}",
        r.status,
        r.text()
    );
    let r = post("/v1/kv/kvq/revoke", &json!({ "put_ids": rooms }));
    assert_eq!(r.status, 200, "{}", r.text());
    let r = post("/v1/kv/kvq/put-start", &json!({ "blocks": blocks[..2] }));
    assert_eq!(r.status, 200, "{}", r.text());
    let started: Value = serde_json::from_slice(&r.body).unwrap();
    let ids = put_ids(&started["puts"]);
    let r = post("/v1/kv/kvq/revoke", &json!({ "put_ids": ids }));
    assert_eq!(r.status, 200, "{}", r.text());

    // put-from through a registered buffer: each block admitted on its own.
    let dir = tempfile::tempdir().unwrap();
    let (engine, buf) = client_engine(0x9a, dir.path(), None, 256 * KIB);
    let addr: NodeAddress = serde_json::from_slice(&c.get("/v1/kv/engine").body).unwrap();
    engine.add_peer(addr);
    let session = register(&c, &engine);
    buf.region().write_at(0, &pattern(40 * KIB, 5)).unwrap();
    let put_from = |key: &str| {
        post(
            "/v1/kv/kvq/put-from",
            &json!({
                "blocks": [{"key": key, "offset": 0, "len": 40 * KIB}],
                "buffer": buf.descriptor(0, buf.len()).unwrap(),
                "session": session,
            }),
        )
    };
    let r = put_from("p0");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(c.get("/kvq/p0").body, pattern(40 * KIB, 5));
    let r = put_from("p1");
    assert!(refused(&r), "{} {}", r.status, r.text());
    assert_eq!(c.get("/kvq/p1").status, 404);
    // Rewriting the same block fits.
    assert_eq!(put_from("p0").status, 200);
    assert_eq!(usage(&c, "kvq"), 40 * KIB as u64);
}

#[test]
fn the_cli_sets_and_shows_a_quota() {
    let server = Server::start(&["--memory", "64MiB"]);
    let yutu = |args: &[&str]| {
        Command::new(bin_path("yutu"))
            .arg("--url")
            .arg(&server.url)
            .args(args)
            .output()
            .expect("run yutu")
    };
    let out = yutu(&["mb", "cliq", "--quota", "2KiB"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), pattern(1500, 1)).unwrap();
    let path = file.path().to_str().unwrap();
    let out = yutu(&["put", path, "cliq/a"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = yutu(&["stat", "cliq"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("Quota:         2048 (2.0KiB)"), "{text}");
    assert!(text.contains("Usage:         1500"), "{text}");
    let out = yutu(&["put", path, "cliq/b"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("QuotaExceeded"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one clear line: {err}");
}
