//! Broken peers and broken paths: a peer that dies or stalls mid-transfer leaves the listeners
//! serving others; a transfer that fails on one path is retried on the next; and what happens
//! when no path is left.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::{engine, pair, pattern, read, segment, wait_until};
use yutu_transfer::transport::tcp::wire::RequestHeader;
use yutu_transfer::{
    EngineConfig, MemoryRegion, NodeId, RdmaError, RdmaMode, TransferEngine, TransferError,
    TransferOp, TransferRequest, TransportKind,
};

const LIMIT: Duration = Duration::from_secs(30);

#[test]
fn a_peer_that_dies_or_stalls_mid_write_does_not_stop_the_tcp_listener() {
    let dir = tempfile::tempdir().unwrap();
    let (client, server) = pair(dir.path(), false);
    let srv = segment(&server, 4 << 20);
    let cli = segment(&client, 4 << 20);
    let d = srv.descriptor(0, 4 << 20).unwrap();
    let tcp = server.address().tcp.unwrap();
    let header = RequestHeader {
        op: TransferOp::Write,
        seq: 1,
        desc: d,
        offset: 0,
        len: 4 << 20,
    };

    // One peer stalls in the middle of a frame and keeps its connection open...
    let mut stalled = TcpStream::connect(tcp).unwrap();
    stalled.write_all(&header.encode()).unwrap();
    stalled.write_all(&pattern(1, 100_000)).unwrap();
    // ...another dies after half a header, another after part of a payload.
    let mut dead = TcpStream::connect(tcp).unwrap();
    dead.write_all(&header.encode()[..30]).unwrap();
    drop(dead);
    let mut dead = TcpStream::connect(tcp).unwrap();
    dead.write_all(&header.encode()).unwrap();
    dead.write_all(&pattern(2, 1 << 20)).unwrap();
    drop(dead);
    // Garbage is a protocol error for that connection only.
    let mut garbage = TcpStream::connect(tcp).unwrap();
    garbage.write_all(&[0xAB; 200]).unwrap();
    drop(garbage);

    wait_until("the dead connections to close", LIMIT, || {
        let s = server.stats().tcp_listener;
        s.accepted >= 4 && s.active == 1
    });
    // The stalled peer is still connected while a healthy one is served in full.
    cli.region().write_at(0, &pattern(3, 4 << 20)).unwrap();
    let done = client
        .transfer([TransferRequest::write(&cli, 0, &d)])
        .unwrap();
    assert_eq!(done[0].transport, TransportKind::Tcp);
    assert!(read(&srv, 0, 4 << 20) == pattern(3, 4 << 20));
    // The client keeps its connections pooled; only the stalled one goes away.
    let pooled = server.stats().tcp_listener.active - 1;
    assert!(pooled >= 1);
    drop(stalled);
    wait_until("the stalled connection to close", LIMIT, || {
        server.stats().tcp_listener.active == pooled
    });
}

#[test]
fn a_peer_that_breaks_the_shm_protocol_does_not_stop_the_shm_listener() {
    let dir = tempfile::tempdir().unwrap();
    let (client, server) = pair(dir.path(), true);
    let path = server.address().shm.unwrap();
    let mut bad = UnixStream::connect(&path).unwrap();
    bad.write_all(b"YTC1\xff\xff\0\0garbage").unwrap();
    let mut half = UnixStream::connect(&path).unwrap();
    half.write_all(b"YTC1").unwrap();
    drop(half);
    wait_until("the broken connections to close", LIMIT, || {
        let s = server.stats().shm_listener;
        s.accepted >= 2 && s.active == 0
    });
    drop(bad);
    let srv = segment(&server, 8192);
    let cli = segment(&client, 8192);
    srv.region().write_at(0, &pattern(4, 8192)).unwrap();
    let d = srv.descriptor(0, 8192).unwrap();
    let done = client
        .transfer([TransferRequest::read(&cli, 0, &d)])
        .unwrap();
    assert_eq!(done[0].transport, TransportKind::Shm);
    assert!(read(&cli, 0, 8192) == pattern(4, 8192));
}

#[test]
fn a_failed_shm_path_is_retried_on_tcp_and_then_demoted() {
    let dir = tempfile::tempdir().unwrap();
    let (client, server) = pair(dir.path(), true);
    // The peer's shm socket is unreachable (as from another mount namespace).
    let mut addr = server.address();
    addr.shm = Some(dir.path().join("nobody-listens-here.sock"));
    client.add_peer(addr);
    let srv = segment(&server, 3 << 20);
    let cli = segment(&client, 3 << 20);
    srv.region().write_at(0, &pattern(5, 3 << 20)).unwrap();
    let d = srv.descriptor(0, 3 << 20).unwrap();

    let done = client
        .transfer([TransferRequest::read(&cli, 0, &d)])
        .unwrap();
    assert_eq!(done[0].transport, TransportKind::Tcp);
    assert!(done[0].retried);
    assert!(read(&cli, 0, 3 << 20) == pattern(5, 3 << 20));
    let stats = client.stats();
    assert!(stats.shm.failures >= 1);
    assert_eq!(stats.tcp.retries_here, stats.shm.failures);

    // Within the cool-down shm is tried after tcp, so the next batch succeeds first time.
    let done = client
        .transfer([TransferRequest::read(&cli, 0, &d)])
        .unwrap();
    assert_eq!(done[0].transport, TransportKind::Tcp);
    assert!(!done[0].retried);
}

#[test]
fn a_socket_of_another_node_is_detected_and_tcp_used() {
    let dir = tempfile::tempdir().unwrap();
    let (client, server) = pair(dir.path(), true);
    let third = engine(3, dir.path(), None);
    let mut addr = server.address();
    addr.shm = third.address().shm;
    client.add_peer(addr);
    let srv = segment(&server, 4096);
    let cli = segment(&client, 4096);
    let d = srv.descriptor(0, 4096).unwrap();
    let done = client
        .transfer([TransferRequest::read(&cli, 0, &d)])
        .unwrap();
    assert_eq!(done[0].transport, TransportKind::Tcp);
    assert!(done[0].retried);
    assert_eq!(third.stats().shm_listener.requests, 0);
}

/// The storage node's arena today is a memfd without `MFD_ALLOW_SEALING`: registered, but not
/// handed out over shm. A same-host peer falls back to tcp for it.
#[test]
fn an_unsealed_segment_falls_back_to_tcp() {
    let dir = tempfile::tempdir().unwrap();
    let (client, server) = pair(dir.path(), true);
    let mfd = memfd::MemfdOptions::default().create("arena").unwrap();
    let file = mfd.into_file();
    file.set_len(1 << 20).unwrap();
    let region = MemoryRegion::map_memfd(std::os::fd::AsFd::as_fd(&file), 1 << 20).unwrap();
    assert!(!region.sealed());
    let srv = server.register(region).unwrap();
    assert!(!srv.shm_shareable());
    srv.region().write_at(0, &pattern(6, 1 << 20)).unwrap();
    let cli = segment(&client, 1 << 20);
    let d = srv.descriptor(0, 1 << 20).unwrap();
    let done = client
        .transfer([TransferRequest::read(&cli, 0, &d)])
        .unwrap();
    assert_eq!(done[0].transport, TransportKind::Tcp);
    assert!(done[0].retried);
    assert!(read(&cli, 0, 1 << 20) == pattern(6, 1 << 20));
}

#[test]
fn every_path_failing_is_reported_with_each_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let (client, server) = pair(dir.path(), true);
    let srv = segment(&server, 4096);
    let cli = segment(&client, 4096);
    let d = srv.descriptor(0, 4096).unwrap();
    // A closed port: bind, read the address, close.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut addr = server.address();
    addr.shm = Some(dir.path().join("gone.sock"));
    addr.tcp = Some(closed);
    client.add_peer(addr.clone());
    let result = client
        .submit([TransferRequest::read(&cli, 0, &d)])
        .unwrap()
        .wait();
    match result.outcomes[0].as_ref().unwrap_err() {
        TransferError::AllPathsFailed { node, attempts } => {
            assert_eq!(*node, server.node());
            let kinds: Vec<_> = attempts.iter().map(|(k, _)| *k).collect();
            assert_eq!(kinds, [TransportKind::Shm, TransportKind::Tcp]);
            assert!(attempts.iter().all(|(_, e)| e.is_retryable()));
        }
        other => panic!("expected AllPathsFailed, got {other}"),
    }
    // A peer with no path in common at all.
    addr.shm = None;
    addr.tcp = None;
    client.add_peer(addr);
    let result = client
        .submit([TransferRequest::read(&cli, 0, &d)])
        .unwrap()
        .wait();
    assert!(matches!(
        result.outcomes[0],
        Err(TransferError::NoPath { .. })
    ));
}

#[test]
fn without_rdma_the_engine_says_why_and_uses_the_next_path() {
    let dir = tempfile::tempdir().unwrap();
    let has_device =
        std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some());
    let mut config = EngineConfig::new(NodeId(11));
    config.shm_dir = Some(dir.path().to_path_buf());
    config.rdma = RdmaMode::Require;
    match TransferEngine::start(config.clone()) {
        Ok(engine) => assert!(has_device && engine.paths()[0] == TransportKind::Rdma),
        Err(TransferError::Rdma(err)) => {
            if cfg!(feature = "rdma") {
                assert!(has_device || err == RdmaError::NoDevice, "{err}");
            } else {
                assert_eq!(err, RdmaError::NotCompiled);
            }
        }
        Err(other) => panic!("unexpected error {other}"),
    }
    if has_device {
        return;
    }
    config.rdma = RdmaMode::Auto;
    let client = TransferEngine::start(config).unwrap();
    let expected = if cfg!(feature = "rdma") {
        RdmaError::NoDevice
    } else {
        RdmaError::NotCompiled
    };
    assert_eq!(client.rdma_unavailable(), Some(&expected));
    assert_eq!(client.paths(), [TransportKind::Shm, TransportKind::Tcp]);
    assert!(client.address().rdma.is_none());
    // A peer that advertises rdma is reached over the next shared path.
    let server = engine(12, dir.path(), None);
    let mut addr = server.address();
    addr.rdma = Some(yutu_transfer::RdmaEndpoint {
        handshake: "127.0.0.1:9".parse().unwrap(),
        device: "mlx5_0".into(),
    });
    client.add_peer(addr);
    let srv = segment(&server, 4096);
    let cli = segment(&client, 4096);
    let d = srv.descriptor(0, 4096).unwrap();
    let done = client
        .transfer([TransferRequest::read(&cli, 0, &d)])
        .unwrap();
    assert_eq!(done[0].transport, TransportKind::Shm);
    assert!(!done[0].retried);
}

#[test]
fn a_restarted_peer_gets_fresh_mappings() {
    let dir = tempfile::tempdir().unwrap();
    let client = engine(1, dir.path(), None);
    let cli = segment(&client, 4096);
    for round in 0..2u64 {
        // Same node id, new process (incarnation), segment ids start over.
        let server = engine(2, dir.path(), None);
        client.add_peer(server.address());
        let srv = segment(&server, 4096);
        srv.region().write_at(0, &pattern(round, 4096)).unwrap();
        let d = srv.descriptor(0, 4096).unwrap();
        let done = client
            .transfer([TransferRequest::read(&cli, 0, &d)])
            .unwrap();
        assert_eq!(done[0].transport, TransportKind::Shm);
        assert!(read(&cli, 0, 4096) == pattern(round, 4096), "round {round}");
        assert_eq!(client.shm_mappings(), 1);
    }
    assert!(client.remove_peer(NodeId(2)));
    assert_eq!(client.shm_mappings(), 0);
}

/// A peer that stops answering (here: a listener that accepts and reads, never replies) holds
/// at most its share of the workers: with a per-peer cap below the worker count, a healthy
/// peer's transfer completes while the stalled peer's batches are all still waiting on their
/// deadlines. Without the cap the healthy job queues behind a stalled one and finishes last.
#[test]
fn a_stalled_peer_holds_only_its_share_of_the_workers() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = EngineConfig::new(NodeId(1));
    config.host = Some("host-a".into());
    config.workers = 4;
    config.workers_per_peer = 2;
    config.io_timeout = Duration::from_secs(10);
    let node = TransferEngine::start(config).expect("engine starts");
    let healthy = engine(2, dir.path(), Some("host-b"));
    node.add_peer(healthy.address());
    healthy.add_peer(node.address());

    // The stalled peer: accepts every connection, reads everything, answers nothing.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let stalled_addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            std::thread::spawn(move || {
                let mut sink = [0u8; 65536];
                while matches!(std::io::Read::read(&mut conn, &mut sink), Ok(n) if n > 0) {}
            });
        }
    });
    let mut stalled = healthy.address();
    stalled.node = NodeId(3);
    stalled.incarnation = 3;
    stalled.shm = None;
    stalled.tcp = Some(stalled_addr);
    node.add_peer(stalled.clone());

    let local = segment(&node, 8 << 20);
    let far = segment(&healthy, 1 << 20);
    let mut fake = far.descriptor(0, 1 << 20).unwrap();
    fake.node = NodeId(3);
    // Many batches to the stalled peer, each a write that will never be answered.
    let stuck: Vec<_> = (0..8)
        .map(|i| {
            node.submit([TransferRequest::write(&local, i << 20, &fake)])
                .expect("submit")
        })
        .collect();
    // The healthy peer's transfer still goes through at once.
    local.region().write_at(0, &pattern(9, 1 << 20)).unwrap();
    let good = far.descriptor(0, 1 << 20).unwrap();
    node.transfer([TransferRequest::write(&local, 0, &good)])
        .expect("the healthy peer's transfer");
    assert!(read(&far, 0, 1 << 20) == pattern(9, 1 << 20));
    assert!(
        stuck.iter().all(|b| !b.is_done()),
        "the healthy transfer waited for the stalled peer's deadlines"
    );
}
