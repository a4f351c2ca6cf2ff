//! Clients that try to take the node down with request bodies: many large PUTs at once, and
//! uploads that stop half-way. The node holds at most its body budget of bodies, drops stalled
//! ones after the body timeout, and a well-behaved client gets right answers throughout.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use yutu_tests::server::{rss_of, wait_until};
use yutu_tests::{pattern, Server, DRAM_NODE};

const MIB: usize = 1 << 20;
/// `--memory` of the node under attack.
const MEMORY: u64 = 256 << 20;
/// Its body budget: the default, half of the memory.
const BUDGET: u64 = 128 << 20;
/// What the process holds besides its DRAM and the bodies in flight (binary, libraries,
/// glommio's rings, connection buffers); docs/architecture.md states the same bound.
const OVERHEAD: u64 = 64 << 20;

/// A DRAM-only node of `MEMORY` (default body budget) with this body timeout.
fn node(body_timeout_secs: &str) -> Server {
    let mut args = DRAM_NODE.to_vec();
    args.extend(["--body-timeout-secs", body_timeout_secs]);
    Server::start(&args)
}

/// Sends a PUT with a `len`-byte Content-Length and the first `send` bytes of `body`; returns
/// the connection (for the caller to wait on) or `None` if the node closed it while sending.
fn start_put(addr: SocketAddr, path: &str, len: usize, body: &[u8]) -> Option<TcpStream> {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_write_timeout(Some(Duration::from_secs(60))).unwrap();
    let head = format!("PUT {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {len}\r\n\r\n");
    s.write_all(head.as_bytes()).ok()?;
    s.write_all(body).ok()?;
    Some(s)
}

/// The status of the response on `s`, or `None` when the node closed the connection without
/// one; waits at most `timeout`.
fn status_of(s: &mut TcpStream, timeout: Duration) -> Option<u16> {
    s.set_read_timeout(Some(timeout)).unwrap();
    let mut head = [0u8; 64];
    let n = s.read(&mut head).ok()?;
    std::str::from_utf8(&head[..n])
        .ok()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// A well-behaved client: 4 KiB PUT then GET, every answer checked, until `stop`.
fn good_client(server: &Server, stop: &AtomicBool) -> usize {
    let c = server.client();
    let mut i = 0;
    while !stop.load(Ordering::Relaxed) {
        let body = pattern(4096, i as u64);
        let r = c.put(&format!("/good/k{}", i % 64), &body);
        assert_eq!(r.status, 200, "good PUT {i}: {}", r.text());
        let r = c.get(&format!("/good/k{}", i % 64));
        assert_eq!(r.status, 200, "good GET {i}");
        assert!(r.body == body, "good GET {i}: wrong bytes");
        i += 1;
    }
    i
}

/// Samples the node's RSS until `stop`; the largest seen.
fn rss_sampler(pid: u32, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut max = 0;
        while !stop.load(Ordering::Relaxed) {
            max = max.max(rss_of(pid));
            std::thread::sleep(Duration::from_millis(5));
        }
        max
    })
}

#[test]
fn sixty_four_concurrent_64mib_puts_stay_within_memory_and_the_body_budget() {
    let server = node("5");
    let c = server.client();
    c.mb("big");
    c.mb("good");
    let body = Arc::new(pattern(64 * MIB, 64));
    let stop = Arc::new(AtomicBool::new(false));
    let rss = rss_sampler(server.pid(), stop.clone());
    let good_stop = AtomicBool::new(false);
    let statuses = std::thread::scope(|scope| {
        let good = scope.spawn(|| good_client(&server, &good_stop));
        let puts: Vec<_> = (0..64)
            .map(|i| {
                let body = body.clone();
                let addr = server.addr;
                scope.spawn(move || {
                    let mut s = start_put(addr, &format!("/big/o{i}"), body.len(), &body)?;
                    status_of(&mut s, Duration::from_secs(60))
                })
            })
            .collect();
        let statuses: Vec<Option<u16>> = puts.into_iter().map(|p| p.join().unwrap()).collect();
        good_stop.store(true, Ordering::Relaxed);
        let rounds = good.join().expect("the good client saw a wrong answer");
        assert!(rounds > 0);
        statuses
    });
    stop.store(true, Ordering::Relaxed);
    let max_rss = rss.join().unwrap();
    let stored = statuses.iter().filter(|s| **s == Some(200)).count();
    eprintln!(
        "max RSS {} MiB; statuses: {stored} stored, others {:?}",
        max_rss >> 20,
        statuses
            .iter()
            .filter(|s| **s != Some(200))
            .collect::<Vec<_>>()
    );
    assert!(
        max_rss <= MEMORY + BUDGET + OVERHEAD,
        "RSS reached {} MiB, over memory + body budget + overhead ({} MiB)",
        max_rss >> 20,
        (MEMORY + BUDGET + OVERHEAD) >> 20
    );
    assert!(stored > 0, "no large PUT was stored: {statuses:?}");
    // Every refusal is the budget's: 503 SlowDown, or the connection closed after it.
    assert!(
        statuses
            .iter()
            .all(|s| matches!(s, Some(200) | Some(503) | None)),
        "{statuses:?}"
    );
    assert!(server.metric_sum("yutu_body_refused_total") >= (64 - stored) as f64 - 0.5);
    // What was acknowledged reads back whole (unless evicted by the later ones).
    for (i, s) in statuses.iter().enumerate() {
        if *s == Some(200) {
            let r = c.get(&format!("/big/o{i}"));
            assert!(
                r.status == 404 || r.body == *body,
                "o{i}: {} and wrong bytes",
                r.status
            );
        }
    }
    assert!(wait_until(Duration::from_secs(10), || server
        .metric_sum("yutu_body_reserved_bytes")
        == 0.0));
}

#[test]
fn stalled_uploads_are_dropped_after_the_body_timeout() {
    let server = node("2");
    let c = server.client();
    c.mb("stall");
    c.mb("good");
    // Eight uploads announce 32 MiB, send 24 MiB and stop, keeping their connections open.
    let part = pattern(24 * MIB, 8);
    let mut stalled: Vec<TcpStream> = (0..8)
        .filter_map(|i| start_put(server.addr, &format!("/stall/s{i}"), 32 * MIB, &part))
        .collect();
    let good_stop = AtomicBool::new(false);
    let started = Instant::now();
    let ended = std::thread::scope(|scope| {
        let good = scope.spawn(|| good_client(&server, &good_stop));
        // Each stalled upload is answered (400 RequestTimeout, or 503 SlowDown for those that
        // waited for budget the stalled ones held) or closed, well before the test gives up.
        let give_up = started + Duration::from_secs(30);
        let ended: Vec<Option<u16>> = stalled
            .iter_mut()
            .map(|s| {
                let left = give_up.saturating_duration_since(Instant::now());
                status_of(s, left.max(Duration::from_millis(1)))
            })
            .collect();
        good_stop.store(true, Ordering::Relaxed);
        assert!(good.join().expect("the good client saw a wrong answer") > 0);
        ended
    });
    eprintln!(
        "stalled uploads ended after {:?}: {ended:?}",
        started.elapsed()
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the stalled uploads were kept for {:?}",
        started.elapsed()
    );
    assert!(
        ended
            .iter()
            .all(|s| matches!(s, Some(400) | Some(503) | None)),
        "{ended:?}"
    );
    assert!(ended.contains(&Some(400)), "{ended:?}");
    assert!(server.metric_sum("yutu_body_refused_total") >= 1.0);
    // Their budget came back: nothing is reserved and a 32 MiB upload goes through.
    assert!(wait_until(Duration::from_secs(10), || server
        .metric_sum("yutu_body_reserved_bytes")
        == 0.0));
    let whole = pattern(32 * MIB, 9);
    assert_eq!(c.put("/stall/whole", &whole).status, 200);
    assert!(c.get("/stall/whole").body == whole);
    // Nothing of the stalled uploads was stored.
    for i in 0..8 {
        assert_eq!(c.get(&format!("/stall/s{i}")).status, 404);
    }
}
