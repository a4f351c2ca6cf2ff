//! S3 details SDKs and tools rely on (issue #15): GetObjectAttributes (also through a node
//! that does not own the key), `Expect: 100-continue`, replaced parts, copy-source ranges,
//! SigV2 clock skew, expired presigned URLs, `If-None-Match` on writes, and an `aws-chunked`
//! upload that lists another content encoding.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Digest;
use yutu_api::sigv4::{CanonicalHeaders, CanonicalRequest, Scope, UNSIGNED_PAYLOAD};
use yutu_tests::cluster::TestCluster;
use yutu_tests::users::{alice, node_with_users, send_as, signed};
use yutu_tests::xml::values;
use yutu_tests::{pattern, Reply, Server};

const MIB: usize = 1 << 20;

fn first(doc: &str, tag: &str) -> Option<String> {
    values(doc, tag).into_iter().next()
}

fn attributes(c: &yutu_tests::Client, path: &str, names: &str) -> Reply {
    c.send(
        "GET",
        &format!("{path}?attributes"),
        &[("x-amz-object-attributes", names)],
        None,
    )
}

const ALL: &str = "ETag,Checksum,ObjectParts,StorageClass,ObjectSize";

/// Starts a multipart upload and returns its id.
fn start_upload(c: &yutu_tests::Client, path: &str) -> String {
    let r = c.send("POST", &format!("{path}?uploads"), &[], Some(b""));
    assert_eq!(r.status, 200, "{}", r.text());
    first(&r.text(), "UploadId").expect("UploadId")
}

fn upload_part(c: &yutu_tests::Client, path: &str, id: &str, n: u32, data: &[u8]) -> String {
    let r = c.send(
        "PUT",
        &format!("{path}?partNumber={n}&uploadId={id}"),
        &[],
        Some(data),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.header("etag").expect("part ETag").to_string()
}

fn complete(c: &yutu_tests::Client, path: &str, id: &str, parts: &[(u32, &str)]) -> Reply {
    let body: String = parts
        .iter()
        .map(|(n, e)| format!("<Part><PartNumber>{n}</PartNumber><ETag>{e}</ETag></Part>"))
        .collect();
    let doc = format!("<CompleteMultipartUpload>{body}</CompleteMultipartUpload>");
    c.send(
        "POST",
        &format!("{path}?uploadId={id}"),
        &[],
        Some(doc.as_bytes()),
    )
}

#[test]
fn get_object_attributes_answers_from_the_metadata() {
    let server = Server::start(&["--memory", "64MiB"]);
    let c = server.client();
    c.mb("attrs");
    let data = pattern(1000, 1);
    let sha = B64.encode(sha2::Sha256::digest(&data));
    let r = c.send(
        "PUT",
        "/attrs/one",
        &[("x-amz-checksum-sha256", &sha)],
        Some(&data),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let etag = r
        .header("etag")
        .expect("etag")
        .trim_matches('"')
        .to_string();

    let a = attributes(&c, "/attrs/one", ALL);
    assert_eq!(a.status, 200, "{}", a.text());
    let doc = a.text();
    assert!(doc.contains("<GetObjectAttributesResponse"), "{doc}");
    assert_eq!(first(&doc, "ETag"), Some(etag.clone()), "unquoted: {doc}");
    assert_eq!(first(&doc, "ChecksumSHA256"), Some(sha));
    assert_eq!(first(&doc, "ChecksumType").as_deref(), Some("FULL_OBJECT"));
    assert_eq!(first(&doc, "StorageClass").as_deref(), Some("STANDARD"));
    assert_eq!(first(&doc, "ObjectSize").as_deref(), Some("1000"));
    // A single-part object has no parts.
    assert!(!doc.contains("ObjectParts"), "{doc}");
    let head = c.head("/attrs/one");
    assert_eq!(a.header("last-modified"), head.header("last-modified"));
    assert!(a.header("last-modified").is_some());

    // Only what was asked for.
    let a = attributes(&c, "/attrs/one", "ObjectSize");
    let doc = a.text();
    assert_eq!(first(&doc, "ObjectSize").as_deref(), Some("1000"));
    assert!(!doc.contains("ETag") && !doc.contains("Checksum"), "{doc}");

    // A multipart object reports its part count.
    let id = start_upload(&c, "/attrs/multi");
    let e1 = upload_part(&c, "/attrs/multi", &id, 1, &pattern(5 * MIB, 2));
    let e2 = upload_part(&c, "/attrs/multi", &id, 2, &pattern(10, 3));
    let done = complete(&c, "/attrs/multi", &id, &[(1, &e1), (2, &e2)]);
    assert_eq!(done.status, 200, "{}", done.text());
    let doc = attributes(&c, "/attrs/multi", ALL).text();
    assert_eq!(first(&doc, "PartsCount").as_deref(), Some("2"), "{doc}");
    assert!(first(&doc, "ETag").is_some_and(|e| e.ends_with("-2") && !e.contains('"')));
    assert_eq!(first(&doc, "ObjectSize"), Some((5 * MIB + 10).to_string()));

    // Errors: a missing key, no or an unknown attribute name.
    let r = attributes(&c, "/attrs/none", ALL);
    assert_eq!((r.status, r.code().as_deref()), (404, Some("NoSuchKey")));
    let r = c.get("/attrs/one?attributes");
    assert_eq!(
        (r.status, r.code().as_deref()),
        (400, Some("InvalidArgument"))
    );
    let r = attributes(&c, "/attrs/one", "ETag,Colour");
    assert_eq!(
        (r.status, r.code().as_deref()),
        (400, Some("InvalidArgument"))
    );
    assert!(r.text().contains("Colour"), "{}", r.text());
    let r = attributes(&c, "/nobucket/one", ALL);
    assert_eq!((r.status, r.code().as_deref()), (404, Some("NoSuchBucket")));
}

#[test]
fn get_object_attributes_needs_read_permission() {
    let server = node_with_users(&["--memory", "64MiB"]);
    assert_eq!(
        send_as(&server, &alice(), "PUT", "/private", b"").status,
        200
    );
    assert_eq!(
        send_as(&server, &alice(), "PUT", "/private/k", b"abc").status,
        200
    );
    let ask = |who: &yutu_client::Credentials| {
        let mut h = signed(&server, who, "GET", "/private/k", "attributes", b"");
        h.push(("x-amz-object-attributes".into(), "ObjectSize".into()));
        let refs: Vec<(&str, &str)> = h.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        server
            .client()
            .send("GET", "/private/k?attributes", &refs, None)
    };
    let r = ask(&alice());
    assert_eq!(r.status, 200, "{}", r.text());
    let r = ask(&yutu_tests::users::bob());
    assert_eq!((r.status, r.code().as_deref()), (403, Some("AccessDenied")));
    // Unsigned.
    let r = attributes(&server.client(), "/private/k", "ObjectSize");
    assert_eq!((r.status, r.code().as_deref()), (403, Some("AccessDenied")));
}

#[test]
fn get_object_attributes_through_any_node_of_a_cluster() {
    let c = TestCluster::start(3, &[]);
    assert_eq!(c.alice(0, "PUT", "/cattrs", b"").status, 200);
    let keys: Vec<String> = (0..6).map(|i| format!("k{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        let r = c.alice(
            0,
            "PUT",
            &format!("/cattrs/{k}"),
            &pattern(100 + i, i as u64),
        );
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let mut served_by_non_owner = false;
    for (i, k) in keys.iter().enumerate() {
        let path = format!("/cattrs/{k}");
        let holders = c.holders(&path);
        for n in 0..c.len() {
            served_by_non_owner |= !holders.contains(&n);
            let node = c.node(n);
            let mut h = signed(node, &alice(), "GET", &path, "attributes", b"");
            h.push(("x-amz-object-attributes".into(), "ObjectSize,ETag".into()));
            let refs: Vec<(&str, &str)> = h.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let r = node
                .client()
                .send("GET", &format!("{path}?attributes"), &refs, None);
            assert_eq!(r.status, 200, "node{n} {path}: {}", r.text());
            assert_eq!(
                first(&r.text(), "ObjectSize"),
                Some((100 + i).to_string()),
                "node{n} {path}"
            );
        }
    }
    assert!(served_by_non_owner, "every key was on every node");
}

/// Reads one response head (and its body, by Content-Length) from a raw connection.
fn read_response(s: &mut TcpStream) -> (u16, String) {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        let n = s.read(&mut byte).expect("read the response head");
        assert_eq!(
            n,
            1,
            "connection closed after {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&buf).into_owned();
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let len: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).expect("read the response body");
    (status, head + &String::from_utf8_lossy(&body))
}

/// Sends a PUT's head with `Expect: 100-continue` and reads what comes back before any of
/// the body is sent.
fn put_expecting(server: &Server, path: &str, len: usize, extra: &str) -> (TcpStream, u16, String) {
    let mut s = TcpStream::connect(server.addr).expect("connect");
    // A deadline, not a sleep: a server waiting for the body would fail the read.
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let head = format!(
        "PUT {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: {len}\r\nExpect: 100-continue\r\n{extra}\r\n",
        server.addr
    );
    s.write_all(head.as_bytes()).expect("send the head");
    let (status, text) = read_response(&mut s);
    (s, status, text)
}

#[test]
fn expect_100_continue_answers_before_the_body() {
    let server = Server::start(&["--memory", "64MiB", "--max-object-size", "1MiB"]);
    server.client().mb("expect");
    // Accepted: 100 Continue, then the body, then 200.
    let body = pattern(70_000, 9);
    let (mut s, status, _) = put_expecting(&server, "/expect/ok", body.len(), "");
    assert_eq!(status, 100);
    s.write_all(&body).expect("send the body");
    let (status, text) = read_response(&mut s);
    assert_eq!(status, 200, "{text}");
    assert!(server.client().get("/expect/ok").body == body);
    // Refused before the body: a missing bucket, a body over --max-object-size.
    let (_, status, text) = put_expecting(&server, "/missing/k", 10, "");
    assert_eq!(status, 404, "{text}");
    assert!(text.contains("NoSuchBucket"), "{text}");
    let (_, status, text) = put_expecting(&server, "/expect/big", 2 * MIB, "");
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("EntityTooLarge"), "{text}");
    assert_eq!(server.client().head("/expect/big").status, 404);
}

#[test]
fn expect_100_continue_refuses_bad_auth_before_the_body() {
    let server = node_with_users(&["--memory", "64MiB"]);
    assert_eq!(send_as(&server, &alice(), "PUT", "/authx", b"").status, 200);
    let (_, status, text) = put_expecting(&server, "/authx/k", 10, "");
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("AccessDenied"), "{text}");
    let (_, status, text) = put_expecting(
        &server,
        "/authx/k",
        10,
        "Authorization: AWS ALICEKEY:bm9wZQ==\r\nDate: Thu, 01 Jan 2026 00:00:00 GMT\r\n",
    );
    assert_eq!(status, 403, "{text}");
}

#[test]
fn a_part_uploaded_again_replaces_the_first() {
    let server = Server::start(&["--memory", "128MiB"]);
    let c = server.client();
    c.mb("parts");
    let id = start_upload(&c, "/parts/obj");
    let first_try = pattern(5 * MIB, 10);
    let second_try = pattern(5 * MIB, 11);
    let stale = upload_part(&c, "/parts/obj", &id, 1, &first_try);
    let fresh = upload_part(&c, "/parts/obj", &id, 1, &second_try);
    assert_ne!(stale, fresh);
    let tail = upload_part(&c, "/parts/obj", &id, 2, b"tail");
    let list = c.get(&format!("/parts/obj?uploadId={id}")).text();
    assert_eq!(values(&list, "PartNumber"), ["1", "2"], "{list}");
    assert!(
        list.contains(&fresh.replace('"', "&quot;")) || list.contains(&fresh),
        "{list}"
    );
    // The ETag of the replaced part no longer names a part.
    let r = complete(&c, "/parts/obj", &id, &[(1, &stale), (2, &tail)]);
    assert_eq!((r.status, r.code().as_deref()), (400, Some("InvalidPart")));
    let r = complete(&c, "/parts/obj", &id, &[(1, &fresh), (2, &tail)]);
    assert_eq!(r.status, 200, "{}", r.text());
    let got = c.get("/parts/obj").body;
    assert_eq!(got.len(), 5 * MIB + 4);
    assert!(got[..5 * MIB] == second_try[..] && &got[5 * MIB..] == b"tail");
}

#[test]
fn upload_part_copy_refuses_a_range_outside_the_source() {
    let server = Server::start(&["--memory", "64MiB"]);
    let c = server.client();
    c.mb("pcopy");
    let src = pattern(100, 5);
    c.put("/pcopy/src", &src);
    let id = start_upload(&c, "/pcopy/dst");
    let copy = |range: &str| {
        c.send(
            "PUT",
            &format!("/pcopy/dst?partNumber=1&uploadId={id}"),
            &[
                ("x-amz-copy-source", "/pcopy/src"),
                ("x-amz-copy-source-range", range),
            ],
            Some(b""),
        )
    };
    for range in [
        "bytes=50-100",
        "bytes=0-1000",
        "bytes=100-120",
        "bytes=500-600",
    ] {
        let r = copy(range);
        assert_eq!(
            (r.status, r.code().as_deref()),
            (416, Some("InvalidRange")),
            "{range}: {}",
            r.text()
        );
        assert!(
            r.text()
                .contains("Range specified is not valid for source object of size: 100"),
            "{range}: {}",
            r.text()
        );
    }
    let r = copy("bytes=0-99");
    assert_eq!(r.status, 200, "{}", r.text());
    let r = copy("bytes=90-99");
    assert_eq!(r.status, 200, "{}", r.text());
    let etag = first(&r.text(), "ETag").expect("ETag");
    let etag = etag.replace("&quot;", "\"");
    let r = complete(&c, "/pcopy/dst", &id, &[(1, &etag)]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(c.get("/pcopy/dst").body, &src[90..]);
}

/// The SigV2 header signature of a request without Content-MD5, Content-Type or x-amz-*.
fn sigv2_headers(method: &str, resource: &str, date: &str) -> Vec<(String, String)> {
    let sts = format!("{method}\n\n\n{date}\n{resource}");
    let mut mac = <Hmac<sha1::Sha1> as KeyInit>::new_from_slice(b"alice-secret").unwrap();
    mac.update(sts.as_bytes());
    let sig = B64.encode(mac.finalize().into_bytes());
    vec![
        ("date".into(), date.into()),
        ("authorization".into(), format!("AWS ALICEKEY:{sig}")),
    ]
}

fn send_with(server: &Server, method: &str, path: &str, h: &[(String, String)]) -> Reply {
    let refs: Vec<(&str, &str)> = h.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    server.client().send(method, path, &refs, None)
}

#[test]
fn sigv2_with_a_skewed_date_is_refused() {
    let server = node_with_users(&["--memory", "64MiB"]);
    assert_eq!(send_as(&server, &alice(), "PUT", "/sigv2", b"").status, 200);
    assert_eq!(
        send_as(&server, &alice(), "PUT", "/sigv2/k", b"x").status,
        200
    );
    let now = SystemTime::now();
    let date = |t: SystemTime| httpdate::fmt_http_date(t);
    // Correctly signed and on time: served (so the refusals below are about the date).
    let r = send_with(
        &server,
        "GET",
        "/sigv2/k",
        &sigv2_headers("GET", "/sigv2/k", &date(now)),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r = send_with(
        &server,
        "GET",
        "/sigv2/k",
        &sigv2_headers("GET", "/sigv2/k", &date(now - Duration::from_secs(10 * 60))),
    );
    assert_eq!(
        r.status,
        200,
        "ten minutes off is within the window: {}",
        r.text()
    );
    for off in [
        now - Duration::from_secs(20 * 60),
        now + Duration::from_secs(20 * 60),
        now - Duration::from_secs(86_400),
    ] {
        let r = send_with(
            &server,
            "GET",
            "/sigv2/k",
            &sigv2_headers("GET", "/sigv2/k", &date(off)),
        );
        assert_eq!(
            (r.status, r.code().as_deref()),
            (403, Some("RequestTimeTooSkewed")),
            "{}",
            r.text()
        );
    }
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// A SigV4 presigned GET of `path` signed at `at`, valid `expires` seconds.
fn presign_v4(server: &Server, path: &str, at: SystemTime, expires: u64) -> String {
    let stamp = yutu_client::timestamp::format_amz_date(at);
    let scope = Scope::new(&stamp[..8], "us-east-1", "s3");
    let query = format!(
        "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=ALICEKEY%2F{}%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date={stamp}&X-Amz-Expires={expires}&X-Amz-SignedHeaders=host",
        &stamp[..8]
    );
    let host = server.addr.to_string();
    let headers = CanonicalHeaders::all([("host", host.as_str())]);
    let req = CanonicalRequest::new("GET", path, Some(&query), headers, UNSIGNED_PAYLOAD);
    let sig = req.sign("alice-secret", &scope, &stamp).signature;
    format!("{path}?{query}&X-Amz-Signature={sig}")
}

/// A SigV2 presigned GET of `path` valid until `expires`.
fn presign_v2(path: &str, expires: u64) -> String {
    let sts = format!("GET\n\n\n{expires}\n{path}");
    let mut mac = <Hmac<sha1::Sha1> as KeyInit>::new_from_slice(b"alice-secret").unwrap();
    mac.update(sts.as_bytes());
    let sig = B64.encode(mac.finalize().into_bytes());
    let sig: String = form_encode(&sig);
    format!("{path}?AWSAccessKeyId=ALICEKEY&Expires={expires}&Signature={sig}")
}

fn form_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[test]
fn expired_presigned_urls_are_access_denied() {
    let server = node_with_users(&["--memory", "64MiB"]);
    assert_eq!(send_as(&server, &alice(), "PUT", "/pre", b"").status, 200);
    assert_eq!(
        send_as(&server, &alice(), "PUT", "/pre/k", b"x").status,
        200
    );
    let c = server.client();
    let now = SystemTime::now();
    // Valid ones work, so the refusals are about time.
    let r = c.get(&presign_v4(&server, "/pre/k", now, 60));
    assert_eq!(r.status, 200, "{}", r.text());
    let r = c.get(&presign_v2("/pre/k", unix(now) + 60));
    assert_eq!(r.status, 200, "{}", r.text());
    // Expired: signed two minutes ago for one minute; SigV2 expired a minute ago.
    let r = c.get(&presign_v4(
        &server,
        "/pre/k",
        now - Duration::from_secs(120),
        60,
    ));
    assert_eq!(
        (r.status, r.code().as_deref()),
        (403, Some("AccessDenied")),
        "{}",
        r.text()
    );
    let r = c.get(&presign_v2("/pre/k", unix(now) - 60));
    assert_eq!(
        (r.status, r.code().as_deref()),
        (403, Some("AccessDenied")),
        "{}",
        r.text()
    );
    // A URL signed long ago but still within its validity works (no 15-minute skew rule).
    let r = c.get(&presign_v4(
        &server,
        "/pre/k",
        now - Duration::from_secs(3600),
        7200,
    ));
    assert_eq!(r.status, 200, "{}", r.text());
    // Signed in the future (past the 15 minutes of clock skew allowed): not valid yet, which
    // S3 answers as it answers an expired URL.
    let r = c.get(&presign_v4(
        &server,
        "/pre/k",
        now + Duration::from_secs(3600),
        60,
    ));
    assert_eq!(
        (r.status, r.code().as_deref()),
        (403, Some("AccessDenied")),
        "{}",
        r.text()
    );
    assert!(r.text().contains("not valid yet"), "{}", r.text());
}

#[test]
fn if_none_match_with_an_etag_on_a_write_is_not_implemented() {
    let server = Server::start(&["--memory", "64MiB"]);
    let c = server.client();
    c.mb("inm");
    let r = c.put("/inm/k", b"first");
    let etag = r.header("etag").expect("etag").to_string();
    // An ETag (matching or not) is refused, and the object stays as it was.
    for v in [etag.as_str(), "\"0123456789abcdef0123456789abcdef\""] {
        let r = c.send("PUT", "/inm/k", &[("if-none-match", v)], Some(b"second"));
        assert_eq!(
            (r.status, r.code().as_deref()),
            (501, Some("NotImplemented")),
            "{}",
            r.text()
        );
        assert_eq!(c.get("/inm/k").body, b"first");
    }
    // On a key that does not exist either: it is not silently an unconditional write.
    let r = c.send(
        "PUT",
        "/inm/new",
        &[("if-none-match", "\"abc\"")],
        Some(b"x"),
    );
    assert_eq!(r.status, 501);
    assert_eq!(c.head("/inm/new").status, 404);
    // `*` keeps its meaning.
    let r = c.send("PUT", "/inm/k", &[("if-none-match", "*")], Some(b"second"));
    assert_eq!(
        (r.status, r.code().as_deref()),
        (412, Some("PreconditionFailed"))
    );
    let r = c.send("PUT", "/inm/new", &[("if-none-match", "*")], Some(b"x"));
    assert_eq!(r.status, 200);
    // CopyObject and CompleteMultipartUpload take the same header the same way.
    let r = c.send(
        "PUT",
        "/inm/copy",
        &[
            ("x-amz-copy-source", "/inm/k"),
            ("if-none-match", etag.as_str()),
        ],
        Some(b""),
    );
    assert_eq!(r.status, 501, "{}", r.text());
}

/// Signs an `aws-chunked` PUT (STREAMING-AWS4-HMAC-SHA256-PAYLOAD) whose Content-Encoding is
/// `encoding`, and returns its headers and framed body.
fn streaming_put(
    server: &Server,
    path: &str,
    data: &[u8],
    encoding: &str,
) -> (Vec<(String, String)>, Vec<u8>) {
    const STREAMING: &str = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD";
    let chunk = 8192;
    let pieces: Vec<&[u8]> = data.chunks(chunk).chain([&[][..]]).collect();
    // Each frame: hex length, ";chunk-signature=" and 64 hex digits, CRLF, bytes, CRLF.
    let framed_len: usize = pieces
        .iter()
        .map(|p| format!("{:x}", p.len()).len() + 17 + 64 + 2 + p.len() + 2)
        .sum();
    let now = SystemTime::now();
    let stamp = yutu_client::timestamp::format_amz_date(now);
    let host = server.addr.to_string();
    let (len, decoded) = (framed_len.to_string(), data.len().to_string());
    let signed_headers = [
        ("content-encoding", encoding),
        ("content-length", len.as_str()),
        ("host", host.as_str()),
        ("x-amz-content-sha256", STREAMING),
        ("x-amz-date", stamp.as_str()),
        ("x-amz-decoded-content-length", decoded.as_str()),
    ];
    let canon = CanonicalHeaders::all(signed_headers);
    let req = CanonicalRequest::new("PUT", path, None, canon, STREAMING);
    let scope = Scope::new(&stamp[..8], "us-east-1", "s3");
    let seed = req.sign("alice-secret", &scope, &stamp);
    let key = scope.signing_key("alice-secret");
    let mut previous = seed.signature.clone();
    let mut body = Vec::new();
    for p in pieces {
        let sts = format!(
            "AWS4-HMAC-SHA256-PAYLOAD\n{stamp}\n{}\n{previous}\n{}\n{}",
            scope_text(&stamp),
            yutu_api::sigv4::EMPTY_SHA256,
            yutu_api::sigv4::sha256_hex(p)
        );
        let sig = yutu_api::sigv4::signature(&key, &sts);
        body.extend_from_slice(format!("{:x};chunk-signature={sig}\r\n", p.len()).as_bytes());
        body.extend_from_slice(p);
        body.extend_from_slice(b"\r\n");
        previous = sig;
    }
    assert_eq!(body.len(), framed_len);
    let mut headers: Vec<(String, String)> = signed_headers
        .iter()
        .filter(|(k, _)| *k != "host" && *k != "content-length")
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    headers.push((
        "authorization".into(),
        seed.authorization("ALICEKEY", &scope),
    ));
    (headers, body)
}

fn scope_text(stamp: &str) -> String {
    format!("{}/us-east-1/s3/aws4_request", &stamp[..8])
}

#[test]
fn aws_chunked_listed_with_gzip_stores_gzip() {
    let server = node_with_users(&["--memory", "64MiB"]);
    assert_eq!(send_as(&server, &alice(), "PUT", "/enc", b"").status, 200);
    // Not real gzip: the node stores the bytes as given, the encoding is the client's.
    let data = pattern(20_000, 7);
    for (key, encoding, stored) in [
        ("a", "aws-chunked,gzip", Some("gzip")),
        ("b", "gzip, aws-chunked", Some("gzip")),
        ("c", "aws-chunked", None),
    ] {
        let path = format!("/enc/{key}");
        let (h, body) = streaming_put(&server, &path, &data, encoding);
        let refs: Vec<(&str, &str)> = h.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let r = server.client().send("PUT", &path, &refs, Some(&body));
        assert_eq!(r.status, 200, "{encoding}: {}", r.text());
        let g = send_as(&server, &alice(), "GET", &path, b"");
        assert_eq!(g.status, 200);
        assert!(
            g.body == data,
            "{encoding}: the body is decoded from its chunks"
        );
        assert_eq!(g.header("content-encoding"), stored, "{encoding}");
    }
}
