//! Bad input gets S3's error, nothing is stored, and the server keeps serving.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use yutu_tests::{Client, Server};

fn assert_alive(c: &Client) {
    let r = c.get("/health");
    assert_eq!((r.status, r.text().as_str()), (200, "ok\n"));
}

/// Sends raw bytes on a fresh connection and returns the whole answer (until close or the
/// first response, whichever the server does).
fn raw(server: &Server, request: &[u8]) -> String {
    let mut s = TcpStream::connect(server.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(request);
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                if let Some(head_end) = find(&buf, b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
                    let len = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length: "))
                        .and_then(|v| v.trim().parse::<usize>().ok())
                        .unwrap_or(0);
                    if buf.len() >= head_end + 4 + len {
                        break;
                    }
                }
            }
        }
    }
    String::from_utf8_lossy(&buf).into_owned()
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[test]
fn oversized_headers() {
    let server = Server::start(&["--memory", "64MiB"]);
    let c = server.client();
    c.mb("hdr");
    // Over Yutu's limit but within hyper's buffer: an S3 error.
    let big = "x".repeat(20 * 1024);
    let r = c.send("PUT", "/hdr/k", &[("x-custom", &big)], Some(b"v"));
    assert_eq!(
        (r.status, r.code().as_deref()),
        (400, Some("RequestHeaderSectionTooLarge"))
    );
    // Its body was never read, so the connection ends with the answer, and says so: a client
    // that pooled it would send its next request into a closed socket.
    assert_eq!(
        r.headers.get("connection").and_then(|v| v.to_str().ok()),
        Some("close")
    );
    assert_eq!(c.get("/hdr/k").status, 404);
    // Far past any buffer: refused at the protocol level, the connection closes.
    let huge = format!(
        "GET /hdr/k HTTP/1.1\r\nHost: x\r\nx-huge: {}\r\n\r\n",
        "y".repeat(1 << 20)
    );
    let answer = raw(&server, huge.as_bytes());
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
        "{answer:.200}"
    );
    // Too many headers.
    let mut many = String::from("GET /hdr/k HTTP/1.1\r\nHost: x\r\n");
    for i in 0..200 {
        many.push_str(&format!("x-h{i}: v\r\n"));
    }
    many.push_str("\r\n");
    let answer = raw(&server, many.as_bytes());
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
        "{answer:.200}"
    );
    assert_alive(&c);
}

#[test]
fn key_too_long_and_invalid_keys() {
    let server = Server::start(&["--memory", "64MiB"]);
    let c = server.client();
    c.mb("keys");
    let ok = "k".repeat(1024);
    assert_eq!(c.put(&format!("/keys/{ok}"), b"v").status, 200);
    let long = "k".repeat(1025);
    for method in ["PUT", "GET", "HEAD", "DELETE"] {
        let body = (method == "PUT").then_some(&b"v"[..]);
        let r = c.send(method, &format!("/keys/{long}"), &[], body);
        assert_eq!(r.status, 400, "{method}");
        if method != "HEAD" {
            assert_eq!(r.code().as_deref(), Some("KeyTooLongError"), "{method}");
        }
    }
    // Invalid UTF-8 after percent-decoding.
    let r = c.put("/keys/%FF%FE", b"v");
    assert_eq!((r.status, r.code().as_deref()), (400, Some("InvalidURI")));
    // A control character that XML listings could not carry.
    let r = c.put("/keys/a%00b", b"v");
    assert_eq!(
        (r.status, r.code().as_deref()),
        (400, Some("InvalidArgument"))
    );
    let listed = yutu_tests::xml::values(&c.get("/keys?list-type=2").text(), "Key");
    assert_eq!(listed, [ok]);
    assert_alive(&c);
}

#[test]
fn bodies_over_the_limits() {
    let server = Server::start(&[
        "--memory",
        "8MiB",
        "--shards",
        "2",
        "--max-object-size",
        "1MiB",
    ]);
    let c = server.client();
    c.mb("big");
    // Exactly the limit is fine.
    let limit = vec![7u8; 1 << 20];
    assert_eq!(c.put("/big/limit", &limit).status, 200);
    // One byte over, announced by Content-Length: refused before the body is read.
    let over = vec![7u8; (1 << 20) + 1];
    let r = c.put("/big/over", &over);
    assert_eq!(
        (r.status, r.code().as_deref()),
        (400, Some("EntityTooLarge"))
    );
    let answer = raw(
        &server,
        b"PUT /big/over HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999999\r\n\r\n",
    );
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("<Code>EntityTooLarge</Code>"), "{answer}");
    // Chunked, no length: cut off once it passes the limit.
    let mut req =
        b"PUT /big/chunked HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..20 {
        req.extend_from_slice(format!("{:x}\r\n", 100_000).as_bytes());
        req.extend_from_slice(&vec![1u8; 100_000]);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"0\r\n\r\n");
    let answer = raw(&server, &req);
    assert!(
        answer.contains("<Code>EntityTooLarge</Code>"),
        "{answer:.300}"
    );
    // Neither over-limit object exists.
    assert_eq!(c.get("/big/over").status, 404);
    assert_eq!(c.get("/big/chunked").status, 404);
    // No length at all.
    let answer = raw(&server, b"PUT /big/nolen HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(answer.starts_with("HTTP/1.1 411"), "{answer}");
    assert!(answer.contains("MissingContentLength"), "{answer}");
    assert_alive(&c);
    assert!(c.get("/big/limit").body == limit);
}

/// A body refused from its announced length is answered before it is read; a client that
/// goes on writing it (as most do: they read the answer once the body is sent) must be able
/// to, and then read why it was refused. The node lingers, reading and dropping the rest
/// (bounded), instead of closing a socket with bytes unread, which resets the connection:
/// the client's write failed with a broken pipe, every time at 8 MiB.
#[test]
fn a_body_refused_before_it_is_read_can_still_be_sent() {
    let server = Server::start(&["--memory", "8MiB", "--max-object-size", "1MiB"]);
    let c = server.client();
    c.mb("linger");
    for len in [(1usize << 20) + 1, 8 << 20] {
        let mut s = TcpStream::connect(server.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
        let head = format!("PUT /linger/over HTTP/1.1\r\nHost: x\r\nContent-Length: {len}\r\n\r\n");
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(&vec![3u8; len])
            .unwrap_or_else(|e| panic!("writing a refused body of {len} bytes: {e}"));
        let mut answer = Vec::new();
        s.read_to_end(&mut answer)
            .unwrap_or_else(|e| panic!("reading the answer after {len} bytes: {e}"));
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
        assert!(answer.contains("<Code>EntityTooLarge</Code>"), "{answer}");
    }
    assert_eq!(c.get("/linger/over").status, 404);
    assert_alive(&c);
}

#[test]
fn object_larger_than_a_shard_is_refused_clearly() {
    // 8 MiB over 2 shards: each shard holds 4 MiB.
    let server = Server::start(&["--memory", "8MiB", "--shards", "2"]);
    let c = server.client();
    c.mb("cap");
    // The server answers from the headers, before the body: send only the headers.
    let answer = raw(
        &server,
        format!(
            "PUT /cap/huge HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
            5 << 20
        )
        .as_bytes(),
    );
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("<Code>EntityTooLarge</Code>"), "{answer}");
    let msg = yutu_tests::xml::values(&answer, "Message").remove(0);
    assert!(msg.contains("DRAM capacity"), "{msg}");
    assert_eq!(c.get("/cap/huge").status, 404);
    assert_alive(&c);
}

#[test]
fn unknown_methods_and_malformed_requests() {
    let server = Server::start(&["--memory", "64MiB"]);
    let c = server.client();
    c.mb("mmm");
    c.put("/mmm/k", b"v");
    for method in ["PATCH", "TRACE"] {
        let r = c.send(method, "/mmm/k", &[], None);
        assert_eq!(
            (r.status, r.code().as_deref()),
            (405, Some("MethodNotAllowed")),
            "{method}"
        );
    }
    // OPTIONS is a CORS preflight: without its headers it is a bad one.
    let r = c.send("OPTIONS", "/mmm/k", &[], None);
    assert_eq!(
        (r.status, r.code().as_deref()),
        (400, Some("InvalidRequest"))
    );
    assert!(r.text().contains("Origin"), "{}", r.text());
    // A method no HTTP library would send.
    let answer = raw(&server, b"FOO /mmm/k HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(answer.starts_with("HTTP/1.1 405"), "{answer}");
    assert!(answer.contains("<Code>MethodNotAllowed</Code>"), "{answer}");
    let r = c.send("POST", "/mmm/k", &[], Some(b""));
    assert_eq!(r.status, 501);
    // Garbage on the wire: a 400 from the HTTP layer, then the connection closes.
    let answer = raw(&server, b"NOT HTTP AT ALL\r\n\r\n");
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 400"),
        "{answer}"
    );
    let answer = raw(
        &server,
        b"PUT /mmm/k2 HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    );
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 400"),
        "{answer}"
    );
    // A body shorter than its Content-Length, then the client goes away: nothing stored.
    {
        let mut s = TcpStream::connect(server.addr).unwrap();
        s.write_all(b"PUT /mmm/short HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nonly-some")
            .unwrap();
    }
    assert_alive(&c);
    assert!(yutu_tests::server::wait_until(
        Duration::from_secs(10),
        || {
            server.metric_sum("yutu_requests_total{shard=\"0\",op=\"PutObject\",status=\"400\"}")
                + server
                    .metric_sum("yutu_requests_total{shard=\"1\",op=\"PutObject\",status=\"400\"}")
                >= 1.0
        }
    ));
    assert_eq!(c.get("/mmm/short").status, 404);
    assert_eq!(c.get("/mmm/k").body, b"v");
}
