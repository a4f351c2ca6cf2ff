//! Transfers between engines in two processes: the test binary re-runs itself as a child
//! (`child_helper`, selected by an environment variable) that starts its own engine. Covers
//! byte-exact batches both ways over shm (memfds really cross a process boundary) and over tcp,
//! and a peer killed with SIGKILL in the middle of a write.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{engine, layout, pattern, read, segment, wait_until, SIZES};
use serde_json::{json, Value};
use yutu_transfer::transport::tcp::wire::RequestHeader;
use yutu_transfer::{
    NodeAddress, SegmentDescriptor, TransferEngine, TransferOp, TransferRequest, TransportKind,
};

const CHILD_ENV: &str = "YUTU_TRANSFER_CHILD";
const PARENT_ENV: &str = "YUTU_TRANSFER_PARENT";
const LIMIT: Duration = Duration::from_secs(120);

/// The child's entry point. In a normal test run (no environment variable) it does nothing.
#[test]
fn child_helper() {
    let Ok(mode) = std::env::var(CHILD_ENV) else {
        return;
    };
    let parent: Value = serde_json::from_str(&std::env::var(PARENT_ENV).unwrap()).unwrap();
    match mode.as_str() {
        "transfer" => child_transfer(&parent),
        "die" => child_die(&parent),
        other => panic!("unknown child mode {other}"),
    }
}

fn descs(v: &Value) -> Vec<SegmentDescriptor> {
    serde_json::from_value(v.clone()).unwrap()
}

fn expected_kind(v: &Value) -> TransportKind {
    serde_json::from_value(v["kind"].clone()).unwrap()
}

/// Reads the parent's blocks, writes blocks back, offers its own, and waits for the parent.
fn child_transfer(parent: &Value) {
    let dir = parent["dir"].as_str().unwrap();
    let kind = expected_kind(parent);
    // For tcp the child claims another host, so neither side may pick shm.
    let host = (kind == TransportKind::Tcp).then_some("child-host");
    let me = engine(100, Path::new(dir), host);
    let peer: NodeAddress = serde_json::from_value(parent["address"].clone()).unwrap();
    me.add_peer(peer);
    let (offsets, total) = layout(&SIZES);
    let local = segment(&me, total);

    let reads = descs(&parent["read"]);
    let done = me
        .transfer(
            reads
                .iter()
                .zip(&offsets)
                .map(|(d, &o)| TransferRequest::read(&local, o, d)),
        )
        .expect("child batch read");
    assert!(done.iter().all(|c| c.transport == kind && !c.retried));
    for (i, (&o, &len)) in offsets.iter().zip(&SIZES).enumerate() {
        assert!(
            read(&local, o, len) == pattern(i as u64, len as usize),
            "child read {len}"
        );
    }

    for (i, (&o, &len)) in offsets.iter().zip(&SIZES).enumerate() {
        local
            .region()
            .write_at(o, &pattern(200 + i as u64, len as usize))
            .unwrap();
    }
    let writes = descs(&parent["write"]);
    let done = me
        .transfer(
            writes
                .iter()
                .zip(&offsets)
                .map(|(d, &o)| TransferRequest::write(&local, o, d)),
        )
        .expect("child batch write");
    assert!(done.iter().all(|c| c.transport == kind));

    // Offer a segment of our own for the parent to read.
    let offered = segment(&me, total);
    let mut mine = Vec::new();
    for (i, (&o, &len)) in offsets.iter().zip(&SIZES).enumerate() {
        offered
            .region()
            .write_at(o, &pattern(300 + i as u64, len as usize))
            .unwrap();
        mine.push(offered.descriptor(o, len).unwrap());
    }
    let ready = json!({ "address": me.address(), "descs": mine });
    println!("CHILD-READY {ready}");
    std::io::stdout().flush().unwrap();
    // Stay alive (and serving) until the parent closes our stdin.
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
}

/// Starts a write and a shm check, sends part of each, and waits to be killed.
fn child_die(parent: &Value) {
    let address: NodeAddress = serde_json::from_value(parent["address"].clone()).unwrap();
    let desc: SegmentDescriptor = serde_json::from_value(parent["write"].clone()).unwrap();
    let header = RequestHeader {
        op: TransferOp::Write,
        seq: 1,
        desc,
        offset: 0,
        len: desc.len,
    };
    let mut tcp = std::net::TcpStream::connect(address.tcp.unwrap()).unwrap();
    tcp.write_all(&header.encode()).unwrap();
    tcp.write_all(&pattern(9, (desc.len / 4) as usize)).unwrap();
    let mut shm = std::os::unix::net::UnixStream::connect(address.shm.unwrap()).unwrap();
    shm.write_all(b"YTC1\x01\x00\x00\x00").unwrap();
    println!("CHILD-SENT");
    std::io::stdout().flush().unwrap();
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    unreachable!("the parent kills this process");
}

/// A running child and the lines it printed that start with `CHILD-`.
struct ChildProc {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl ChildProc {
    fn spawn(mode: &str, parent: &Value) -> ChildProc {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["child_helper", "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, mode)
            .env(PARENT_ENV, parent.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the child test process");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            // libtest prints "test child_helper ... " before the test runs, on the same line.
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(at) = line.find("CHILD-") {
                    if tx.send(line[at..].to_owned()).is_err() {
                        break;
                    }
                }
            }
        });
        ChildProc { child, lines }
    }

    fn expect_line(&self, prefix: &str) -> String {
        let line = self
            .lines
            .recv_timeout(LIMIT)
            .unwrap_or_else(|_| panic!("the child never printed {prefix}"));
        line.strip_prefix(prefix)
            .unwrap_or_else(|| panic!("unexpected child line {line}"))
            .trim()
            .to_owned()
    }

    /// Closes the child's stdin and waits (bounded) for it to exit successfully.
    fn finish(mut self) {
        drop(self.child.stdin.take());
        let deadline = Instant::now() + LIMIT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "child failed: {status}");
                return;
            }
            assert!(Instant::now() < deadline, "child did not exit");
            std::thread::yield_now();
        }
    }
}

impl Drop for ChildProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn cross_process(kind: TransportKind) {
    let dir = tempfile::tempdir().unwrap();
    let parent = engine(1, dir.path(), None);
    let (offsets, total) = layout(&SIZES);
    let readable = segment(&parent, total);
    let writable = segment(&parent, total);
    let mut reads = Vec::new();
    let mut writes = Vec::new();
    for (i, (&o, &len)) in offsets.iter().zip(&SIZES).enumerate() {
        readable
            .region()
            .write_at(o, &pattern(i as u64, len as usize))
            .unwrap();
        reads.push(readable.descriptor(o, len).unwrap());
        writes.push(writable.descriptor(o, len).unwrap());
    }
    let info = json!({
        "dir": dir.path(),
        "kind": kind,
        "address": parent.address(),
        "read": reads,
        "write": writes,
    });
    let child = ChildProc::spawn("transfer", &info);
    let ready: Value = serde_json::from_str(&child.expect_line("CHILD-READY")).unwrap();

    // The child's writes landed, byte for byte.
    for (i, (&o, &len)) in offsets.iter().zip(&SIZES).enumerate() {
        assert!(
            read(&writable, o, len) == pattern(200 + i as u64, len as usize),
            "parent got {len}"
        );
    }
    // And the parent reads the child's segment over the same path.
    let child_addr: NodeAddress = serde_json::from_value(ready["address"].clone()).unwrap();
    assert_ne!(child_addr.incarnation, parent.address().incarnation);
    parent.add_peer(child_addr);
    let theirs = descs(&ready["descs"]);
    let into = segment(&parent, total);
    let done = parent
        .transfer(
            theirs
                .iter()
                .zip(&offsets)
                .map(|(d, &o)| TransferRequest::read(&into, o, d)),
        )
        .unwrap();
    assert!(done.iter().all(|c| c.transport == kind));
    for (i, (&o, &len)) in offsets.iter().zip(&SIZES).enumerate() {
        assert!(read(&into, o, len) == pattern(300 + i as u64, len as usize));
    }
    let stats = parent.stats();
    match kind {
        TransportKind::Shm => assert!(stats.shm_listener.requests >= 2 * SIZES.len() as u64),
        _ => assert!(stats.tcp_listener.requests >= 2 * SIZES.len() as u64),
    }
    child.finish();
}

#[test]
fn batches_across_processes_over_shm() {
    cross_process(TransportKind::Shm);
}

#[test]
fn batches_across_processes_over_tcp() {
    cross_process(TransportKind::Tcp);
}

#[test]
fn a_peer_killed_mid_write_leaves_the_listeners_serving_others() {
    let dir = tempfile::tempdir().unwrap();
    let server = engine(1, dir.path(), None);
    let target = segment(&server, 8 << 20);
    let info = json!({
        "address": server.address(),
        "write": target.descriptor(0, 8 << 20).unwrap(),
    });
    let child = ChildProc::spawn("die", &info);
    child.expect_line("CHILD-SENT");
    wait_until("the child's connections", LIMIT, || {
        let s = server.stats();
        s.tcp_listener.active == 1 && s.shm_listener.active == 1
    });

    // While the child is stuck mid-frame on both listeners, another peer is served in full.
    let other = engine(2, dir.path(), None);
    other.add_peer(server.address());
    server.add_peer(other.address());
    let src = segment(&other, 8 << 20);
    src.region().write_at(0, &pattern(5, 8 << 20)).unwrap();
    let d = target.descriptor(0, 8 << 20).unwrap();
    for kind in [TransportKind::Tcp, TransportKind::Shm] {
        let done = other
            .submit_via([TransferRequest::write(&src, 0, &d)], &[kind])
            .unwrap()
            .wait()
            .into_result()
            .unwrap();
        assert_eq!(done[0].transport, kind);
    }
    assert!(read(&target, 0, 8 << 20) == pattern(5, 8 << 20));

    // SIGKILL: the child's half-finished frames end with its sockets; the listeners go on.
    let tcp_before = server.stats().tcp_listener.active;
    let shm_before = server.stats().shm_listener.active;
    drop(child);
    wait_until("the dead child's connections to close", LIMIT, || {
        let s = server.stats();
        s.tcp_listener.active == tcp_before - 1 && s.shm_listener.active == shm_before - 1
    });
    src.region().write_at(0, &pattern(6, 8 << 20)).unwrap();
    let fresh = engine(3, dir.path(), None);
    fresh.add_peer(server.address());
    let src3 = segment(&fresh, 8 << 20);
    src3.region().write_at(0, &pattern(6, 8 << 20)).unwrap();
    let done = fresh
        .transfer([TransferRequest::write(&src3, 0, &d)])
        .unwrap();
    assert_eq!(done[0].transport, TransportKind::Shm);
    assert!(read(&target, 0, 8 << 20) == pattern(6, 8 << 20));
    let _: &TransferEngine = &other;
}
