//! Object operations against the real server: bytes, ETags, metadata, ranges, deletes.

use yutu_tests::{etag_of, pattern, Server};

#[test]
fn put_get_head_delete_roundtrip() {
    let server = Server::start(&["--memory", "64MiB"]);
    let c = server.client();
    c.mb("objs");
    for (i, size) in [0usize, 1, 63, 64, 65, 4096, 100_000, 3 << 20]
        .into_iter()
        .enumerate()
    {
        let data = pattern(size, i as u64);
        let path = format!("/objs/size-{size}");
        let r = c.put(&path, &data);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("etag"), Some(etag_of(&data).as_str()));
        let g = c.get(&path);
        assert_eq!(g.status, 200);
        assert_eq!(g.body.len(), size);
        assert!(g.body == data, "bytes of {path} differ");
        assert_eq!(g.header("etag"), Some(etag_of(&data).as_str()));
        assert_eq!(g.header("content-length"), Some(size.to_string().as_str()));
        assert!(g
            .header("last-modified")
            .is_some_and(|v| v.ends_with("GMT")));
        let h = c.head(&path);
        assert_eq!(h.status, 200);
        assert!(h.body.is_empty());
        assert_eq!(h.header("content-length"), Some(size.to_string().as_str()));
        assert_eq!(h.header("etag"), Some(etag_of(&data).as_str()));
    }
    // Overwrite replaces bytes and ETag.
    c.put("/objs/k", b"first");
    c.put("/objs/k", b"second version");
    let g = c.get("/objs/k");
    assert_eq!(g.body, b"second version");
    assert_eq!(g.header("etag"), Some(etag_of(b"second version").as_str()));
    // Delete, twice (S3 answers 204 for a missing key too).
    assert_eq!(c.delete("/objs/k").status, 204);
    assert_eq!(c.delete("/objs/k").status, 204);
    let r = c.get("/objs/k");
    assert_eq!((r.status, r.code().as_deref()), (404, Some("NoSuchKey")));
    assert!(r.text().contains("<Key>k</Key>"), "{}", r.text());
    let r = c.head("/objs/k");
    assert_eq!(r.status, 404);
    assert!(r.body.is_empty());
}

#[test]
fn content_type_and_user_metadata_round_trip() {
    let server = Server::start(&["--memory", "64MiB"]);
    let c = server.client();
    c.mb("meta");
    let r = c.send(
        "PUT",
        "/meta/doc.json",
        &[
            ("content-type", "application/json"),
            ("x-amz-meta-owner", "team-a"),
            ("x-amz-meta-Build-Id", "42"),
        ],
        Some(b"{}"),
    );
    assert_eq!(r.status, 200);
    for r in [c.get("/meta/doc.json"), c.head("/meta/doc.json")] {
        assert_eq!(r.header("content-type"), Some("application/json"));
        assert_eq!(r.header("x-amz-meta-owner"), Some("team-a"));
        assert_eq!(r.header("x-amz-meta-build-id"), Some("42"));
    }
    // Default content type, as S3.
    c.put("/meta/raw", b"x");
    let ct = c.get("/meta/raw");
    assert!(ct.header("content-type").is_some());
    // Metadata over 2 KiB is refused and nothing is stored.
    let big = "v".repeat(2100);
    let r = c.send("PUT", "/meta/big", &[("x-amz-meta-big", &big)], Some(b"x"));
    assert_eq!(
        (r.status, r.code().as_deref()),
        (400, Some("MetadataTooLarge"))
    );
    assert_eq!(c.get("/meta/big").status, 404);
    // Content-MD5 is verified.
    let r = c.send(
        "PUT",
        "/meta/md5",
        &[("content-md5", "1B2M2Y8AsgTpgAmY7PhCfg==")],
        Some(b"x"),
    );
    assert_eq!((r.status, r.code().as_deref()), (400, Some("BadDigest")));
    assert_eq!(c.get("/meta/md5").status, 404);
    let r = c.send(
        "PUT",
        "/meta/md5",
        &[("content-md5", "not base64!")],
        Some(b"x"),
    );
    assert_eq!(
        (r.status, r.code().as_deref()),
        (400, Some("InvalidDigest"))
    );
    let r = c.send(
        "PUT",
        "/meta/md5",
        &[("content-md5", "1B2M2Y8AsgTpgAmY7PhCfg==")],
        Some(b""),
    );
    assert_eq!(
        r.status,
        200,
        "the MD5 of the empty string matches: {}",
        r.text()
    );
}

#[test]
fn ranges() {
    let server = Server::start(&["--memory", "64MiB"]);
    let c = server.client();
    c.mb("ranges");
    let data = pattern(1000, 7);
    c.put("/ranges/obj", &data);
    let get = |range: &str| c.send("GET", "/ranges/obj", &[("range", range)], None);

    let cases: [(&str, usize, usize); 6] = [
        ("bytes=0-9", 0, 10),
        ("bytes=990-", 990, 1000),
        ("bytes=-10", 990, 1000),
        ("bytes=500-500", 500, 501),
        ("bytes=900-5000", 900, 1000),
        ("bytes=-5000", 0, 1000),
    ];
    for (range, start, end) in cases {
        let r = get(range);
        assert_eq!(r.status, 206, "{range}");
        assert!(r.body == data[start..end], "{range}: wrong bytes");
        assert_eq!(
            r.header("content-range"),
            Some(format!("bytes {}-{}/1000", start, end - 1).as_str()),
            "{range}"
        );
        assert_eq!(r.header("etag"), Some(etag_of(&data).as_str()));
    }
    // Unsatisfiable: 416 InvalidRange with the size in Content-Range.
    for range in ["bytes=1000-", "bytes=5000-6000", "bytes=-0"] {
        let r = get(range);
        assert_eq!(
            (r.status, r.code().as_deref()),
            (416, Some("InvalidRange")),
            "{range}"
        );
        assert_eq!(r.header("content-range"), Some("bytes */1000"));
    }
    // Malformed: ignored, the whole object comes back (S3 and RFC 9110 §14.2).
    for range in [
        "bytes=abc",
        "bytes=5-2",
        "items=0-1",
        "bytes=0-1,5-6",
        "bytes=",
    ] {
        let r = get(range);
        assert_eq!(r.status, 200, "{range}");
        assert!(r.body == data, "{range}");
    }
    // HEAD with a range reports the range's length.
    let r = c.send("HEAD", "/ranges/obj", &[("range", "bytes=0-99")], None);
    assert_eq!(r.status, 206);
    assert_eq!(r.header("content-length"), Some("100"));
    // A range on an empty object is unsatisfiable.
    c.put("/ranges/empty", b"");
    let r = c.send("GET", "/ranges/empty", &[("range", "bytes=0-")], None);
    assert_eq!(r.status, 416);
}

#[test]
fn keys_with_special_characters() {
    let server = Server::start(&["--memory", "64MiB"]);
    let c = server.client();
    c.mb("keys");
    let keys = [
        ("a b", "a%20b"),
        ("a+b", "a+b"),
        ("100%", "100%25"),
        ("dir/sub/file.txt", "dir/sub/file.txt"),
        ("ünïcødé/键", "%C3%BCn%C3%AFc%C3%B8d%C3%A9/%E9%94%AE"),
        ("q?x=1&y", "q%3Fx%3D1%26y"),
        ("trailing/", "trailing/"),
        ("<xml>&'\"", "%3Cxml%3E%26%27%22"),
    ];
    for (i, (key, path)) in keys.iter().enumerate() {
        let body = format!("body-{i}");
        let r = c.put(&format!("/keys/{path}"), body.as_bytes());
        assert_eq!(r.status, 200, "{key}: {}", r.text());
        assert_eq!(c.get(&format!("/keys/{path}")).text(), body, "{key}");
    }
    let listed = yutu_tests::xml::values(&c.get("/keys?list-type=2").text(), "Key");
    let mut expected: Vec<&str> = keys.iter().map(|(k, _)| *k).collect();
    expected.sort();
    assert_eq!(listed, expected);
}
