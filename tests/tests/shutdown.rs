//! Graceful shutdown: SIGTERM lets the request in progress finish, refuses new connections,
//! and the process exits 0 with what it acknowledged on disk.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use yutu_tests::server::wait_until;
use yutu_tests::{pattern, Server};

/// Sends a PUT's head, waits until the node is reading its body (its `100 Continue`: the
/// request is in progress, not just bytes in a socket buffer), and sends the first half of
/// the body; the rest is sent by the caller.
fn start_put(server: &Server, path: &str, body: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(server.addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("read timeout");
    write!(
        s,
        "PUT {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        server.addr,
        body.len()
    )
    .expect("head");
    s.flush().expect("flush");
    let mut interim = [0u8; 25];
    s.read_exact(&mut interim).expect("100 Continue");
    assert!(
        interim.starts_with(b"HTTP/1.1 100"),
        "{}",
        String::from_utf8_lossy(&interim)
    );
    s.write_all(&body[..body.len() / 2]).expect("first half");
    s.flush().expect("flush");
    s
}

#[test]
fn sigterm_drains_the_request_in_progress_and_exits_zero() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut server = Server::start_on(dir.path(), &["--memory", "64MiB"]);
    let c = server.client();
    let r = c.send(
        "PUT",
        "/durable",
        &[("x-yutu-durability", "disk")],
        Some(b""),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let body = pattern(1 << 20, 7);
    let mut slow = start_put(&server, "/durable/slow", &body);

    server.terminate();
    // The listener closes: new connections are refused once the stop is seen.
    assert!(
        wait_until(Duration::from_secs(10), || TcpStream::connect(server.addr)
            .is_err()),
        "the node kept accepting connections after SIGTERM; log:\n{}",
        server.log()
    );
    assert!(
        server.is_running(),
        "the node must wait for the request in progress"
    );

    slow.write_all(&body[body.len() / 2..])
        .expect("second half");
    let mut answer = String::new();
    slow.read_to_string(&mut answer).expect("read the answer");
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "the request in progress was not completed: {answer}"
    );
    let status = server
        .exit_within(Duration::from_secs(20))
        .expect("the node did not stop within 20 s of SIGTERM");
    assert_eq!(status.code(), Some(0), "log:\n{}", server.log());

    let server = Server::start_on(dir.path(), &["--memory", "64MiB"]);
    let got = server.client().get("/durable/slow");
    assert_eq!(got.status, 200);
    assert!(
        got.body == body,
        "the drained PUT did not survive the restart"
    );
}
