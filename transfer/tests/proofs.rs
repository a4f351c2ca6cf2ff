//! Proving an address (issue #11): a node keeps a path of an address a client names only when
//! the listener there proves it is the claimed engine and shares the client's secret, and it
//! sends nothing but the challenge to an address that has not proved itself.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{engine, pattern, read, segment};
use yutu_transfer::transport::tcp::wire::{ProveFrame, ResponseHeader, REQUEST_LEN};
use yutu_transfer::{
    NodeAddress, NodeId, RdmaEndpoint, Refusal, TransferEngine, TransferError, TransferRequest,
    TransportKind,
};

const SECRET: [u8; 32] = [0x42; 32];
/// For exchanges that should succeed.
const OK_TIMEOUT: Duration = Duration::from_secs(10);
/// For exchanges that should fail: short, the tests measure that it is kept.
const SHORT: Duration = Duration::from_millis(300);
/// What "about the timeout" allows on a loaded machine.
const SLACK: Duration = Duration::from_secs(3);
/// How long a fake peer waits for the challenger before giving up (never reached when the
/// challenger keeps its deadline).
const LONG: Duration = Duration::from_secs(30);

/// The attempts of a failed verification.
fn attempts(err: TransferError) -> Vec<(TransportKind, TransferError)> {
    match err {
        TransferError::AllPathsFailed { attempts, .. } => attempts,
        other => panic!("expected every path to fail, got {other}"),
    }
}

fn kinds(attempts: &[(TransportKind, TransferError)]) -> Vec<TransportKind> {
    attempts.iter().map(|(k, _)| *k).collect()
}

/// An address with only the given paths.
fn only(addr: &NodeAddress, tcp: Option<SocketAddr>, shm: Option<&Path>) -> NodeAddress {
    NodeAddress {
        tcp,
        shm: shm.map(Path::to_path_buf),
        rdma: None,
        ..addr.clone()
    }
}

#[test]
fn a_client_that_trusts_the_node_proves_tcp_and_shm() {
    let dir = tempfile::tempdir().unwrap();
    let server = engine(1, dir.path(), None);
    let client = engine(2, dir.path(), None);
    client.trust(server.node(), SECRET);

    // An rdma endpoint is never kept: its handshake proves nothing yet.
    let claimed = NodeAddress {
        rdma: Some(RdmaEndpoint {
            handshake: "127.0.0.1:9".parse().unwrap(),
            device: "mlx5_0".into(),
        }),
        ..client.address()
    };
    assert!(claimed.tcp.is_some() && claimed.shm.is_some());
    let proven = server.verify_peer(&claimed, &SECRET, OK_TIMEOUT).unwrap();
    assert_eq!(
        proven,
        NodeAddress {
            rdma: None,
            ..claimed
        }
    );

    // The proven address is a working peer on both paths, and the listeners that answered
    // the challenges serve transfers as before.
    server.add_peer(proven);
    let srv = segment(&server, 8192);
    let cli = segment(&client, 8192);
    let d = cli.descriptor(0, 8192).unwrap();
    for (seed, kind) in [(1, TransportKind::Tcp), (2, TransportKind::Shm)] {
        srv.region().write_at(0, &pattern(seed, 8192)).unwrap();
        let done = server
            .submit_via([TransferRequest::write(&srv, 0, &d)], &[kind])
            .unwrap()
            .wait()
            .into_result()
            .unwrap();
        assert_eq!(done[0].transport, kind);
        assert!(read(&cli, 0, 8192) == pattern(seed, 8192));
    }
}

#[test]
fn shm_is_not_challenged_on_another_host() {
    let dir = tempfile::tempdir().unwrap();
    let server = engine(1, dir.path(), Some("host-a"));
    let client = engine(2, dir.path(), Some("host-b"));
    client.trust(server.node(), SECRET);
    let proven = server
        .verify_peer(&client.address(), &SECRET, OK_TIMEOUT)
        .unwrap();
    assert_eq!(proven.tcp, client.address().tcp);
    assert_eq!(proven.shm, None);
    // With only shm offered there is nothing to challenge.
    let shm_only = only(&client.address(), None, client.address().shm.as_deref());
    let err = server.verify_peer(&shm_only, &SECRET, SHORT).unwrap_err();
    assert!(matches!(err, TransferError::NoPath { node } if node == client.node()));
}

#[test]
fn without_the_right_secret_no_path_proves() {
    let dir = tempfile::tempdir().unwrap();
    let server = engine(1, dir.path(), None);
    let client = engine(2, dir.path(), None);

    // The client trusts nobody: both listeners refuse.
    let err = server
        .verify_peer(&client.address(), &SECRET, OK_TIMEOUT)
        .unwrap_err();
    let tried = attempts(err);
    assert_eq!(kinds(&tried), [TransportKind::Tcp, TransportKind::Shm]);
    for (kind, err) in &tried {
        assert!(
            matches!(err, TransferError::Unavailable { .. })
                && err.to_string().contains(&Refusal::Untrusted.to_string()),
            "{kind}: {err}"
        );
    }

    // It trusts another challenger: still refused.
    client.trust(NodeId(99), SECRET);
    let err = server
        .verify_peer(&client.address(), &SECRET, OK_TIMEOUT)
        .unwrap_err();
    assert_eq!(attempts(err).len(), 2);

    // It trusts the node, with another secret: the answers do not verify.
    client.trust(server.node(), [0x43; 32]);
    let err = server
        .verify_peer(&client.address(), &SECRET, OK_TIMEOUT)
        .unwrap_err();
    let tried = attempts(err);
    assert_eq!(kinds(&tried), [TransportKind::Tcp, TransportKind::Shm]);
    for (kind, err) in &tried {
        assert!(
            matches!(err, TransferError::Protocol { .. }),
            "{kind}: {err}"
        );
    }
}

#[test]
fn another_engine_cannot_prove_it_is_the_claimed_node() {
    let dir = tempfile::tempdir().unwrap();
    let server = engine(1, dir.path(), None);
    let impostor = engine(3, dir.path(), None);
    impostor.trust(server.node(), SECRET);
    // The impostor proves its own address...
    let own = impostor.address();
    assert!(server.verify_peer(&own, &SECRET, OK_TIMEOUT).is_ok());

    // ...but not one that names node 2 with its listeners, right secret or not.
    let claimed = NodeAddress {
        node: NodeId(2),
        ..own.clone()
    };
    let err = server
        .verify_peer(&claimed, &SECRET, OK_TIMEOUT)
        .unwrap_err();
    let tried = attempts(err);
    assert_eq!(kinds(&tried), [TransportKind::Tcp, TransportKind::Shm]);
    for (kind, err) in &tried {
        assert!(
            matches!(err, TransferError::Protocol { .. }),
            "{kind}: {err}"
        );
    }

    // Over shm the socket's hello also names the incarnation: a stale one keeps only tcp.
    let stale = NodeAddress {
        incarnation: own.incarnation ^ 1,
        ..own.clone()
    };
    let proven = server.verify_peer(&stale, &SECRET, OK_TIMEOUT).unwrap();
    assert_eq!(proven.tcp, own.tcp);
    assert_eq!(proven.shm, None);
}

#[test]
fn distrust_stops_the_answers() {
    let dir = tempfile::tempdir().unwrap();
    let server = engine(1, dir.path(), None);
    let client = engine(2, dir.path(), None);
    client.trust(server.node(), SECRET);
    assert!(server
        .verify_peer(&client.address(), &SECRET, OK_TIMEOUT)
        .is_ok());

    client.distrust(server.node());
    let err = server
        .verify_peer(&client.address(), &SECRET, OK_TIMEOUT)
        .unwrap_err();
    assert_eq!(attempts(err).len(), 2);

    // Trusting again with a new secret replaces the old one.
    client.trust(server.node(), [7; 32]);
    assert!(server
        .verify_peer(&client.address(), &SECRET, OK_TIMEOUT)
        .is_err());
    assert!(server
        .verify_peer(&client.address(), &[7; 32], OK_TIMEOUT)
        .is_ok());
}

/// A tcp listener that is not an engine: accepts one connection, hands it to `act` on a
/// thread, and returns what it read.
fn fake_tcp(
    act: impl FnOnce(TcpStream) -> Vec<u8> + Send + 'static,
) -> (SocketAddr, JoinHandle<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let handle = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        stream.set_read_timeout(Some(LONG)).unwrap();
        act(stream)
    });
    (addr, handle)
}

/// Reads until the challenger closes the connection.
fn read_all(mut s: impl Read) -> Vec<u8> {
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    got
}

/// Verifies `addr` with a short timeout; the error, and how long it took.
fn verify_fails(server: &TransferEngine, addr: &NodeAddress) -> (TransferError, Duration) {
    let started = Instant::now();
    let err = server.verify_peer(addr, &SECRET, SHORT).unwrap_err();
    (err, started.elapsed())
}

#[test]
fn a_plain_tcp_listener_receives_one_prove_frame_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let server = engine(1, dir.path(), None);
    let client = engine(2, dir.path(), None);
    client.trust(server.node(), SECRET);
    let (fake, received) = fake_tcp(read_all);

    let (err, took) = verify_fails(&server, &only(&client.address(), Some(fake), None));
    assert_eq!(kinds(&attempts(err)), [TransportKind::Tcp]);
    assert!(took < SHORT + SLACK, "took {took:?}");

    let got = received.join().unwrap();
    assert_eq!(got.len(), REQUEST_LEN, "exactly one frame, no payload");
    let frame = ProveFrame::decode(&got.try_into().unwrap()).unwrap();
    assert_eq!(frame.challenger, server.node());
}

#[test]
fn a_tcp_listener_that_never_answers_fails_within_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let server = engine(1, dir.path(), None);
    let client = engine(2, dir.path(), None);

    // Accepts and stays silent.
    let (fake, silent) = fake_tcp(read_all);
    let (err, took) = verify_fails(&server, &only(&client.address(), Some(fake), None));
    assert!(
        matches!(&attempts(err)[0].1, TransferError::Io { .. }),
        "a timeout is an I/O error"
    );
    assert!(took >= SHORT && took < SHORT + SLACK, "took {took:?}");
    silent.join().unwrap();

    // Never accepts (the kernel completes the connection in the backlog).
    let backlog = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = backlog.local_addr().unwrap();
    let (_, took) = verify_fails(&server, &only(&client.address(), Some(addr), None));
    assert!(took >= SHORT && took < SHORT + SLACK, "took {took:?}");
    drop(backlog);

    // Trickles a well-formed answer, one byte every 100 ms: the deadline covers the whole
    // exchange, not each read.
    let (fake, trickle) = fake_tcp(|mut s| {
        let mut frame = [0u8; REQUEST_LEN];
        s.read_exact(&mut frame).unwrap();
        let mut answer = ResponseHeader {
            status: 0,
            seq: 0,
            len: 32,
        }
        .encode()
        .to_vec();
        answer.extend_from_slice(&[0; 32]);
        for b in answer {
            if s.write_all(&[b]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Vec::new()
    });
    let (_, took) = verify_fails(&server, &only(&client.address(), Some(fake), None));
    assert!(took < SHORT + SLACK, "took {took:?}");
    trickle.join().unwrap();
}

#[test]
fn answers_that_are_not_proofs_do_not_prove() {
    let dir = tempfile::tempdir().unwrap();
    let server = engine(1, dir.path(), None);
    let client = engine(2, dir.path(), None);
    client.trust(server.node(), SECRET);

    let forged = |mac: [u8; 32]| {
        move |mut s: TcpStream| {
            let mut frame = [0u8; REQUEST_LEN];
            s.read_exact(&mut frame).unwrap();
            let header = ResponseHeader {
                status: 0,
                seq: 0,
                len: 32,
            };
            s.write_all(&header.encode()).unwrap();
            s.write_all(&mac).unwrap();
            read_all(s)
        }
    };
    // A made-up proof, and a copy of the nonce.
    for fake in [
        fake_tcp(forged([0x42; 32])),
        fake_tcp(|mut s: TcpStream| {
            let mut frame = [0u8; REQUEST_LEN];
            s.read_exact(&mut frame).unwrap();
            let nonce = ProveFrame::decode(&frame).unwrap().nonce;
            let header = ResponseHeader {
                status: 0,
                seq: 0,
                len: 32,
            };
            s.write_all(&header.encode()).unwrap();
            s.write_all(&nonce).unwrap();
            read_all(s)
        }),
        // An echo server sends the challenge back: not an answer.
        fake_tcp(|mut s: TcpStream| {
            let mut frame = [0u8; REQUEST_LEN];
            s.read_exact(&mut frame).unwrap();
            s.write_all(&frame).unwrap();
            read_all(s)
        }),
    ] {
        let (addr, handle) = fake;
        let (err, took) = verify_fails(&server, &only(&client.address(), Some(addr), None));
        let tried = attempts(err);
        assert!(
            matches!(&tried[0].1, TransferError::Protocol { .. }),
            "{}",
            tried[0].1
        );
        assert!(took < SHORT + SLACK, "took {took:?}");
        // Nothing after the challenge.
        assert!(handle.join().unwrap().is_empty());
    }
}

/// A Unix socket that is not an engine: accepts one connection, hands it to `act` on a thread,
/// and returns what it read.
fn fake_unix(
    path: &Path,
    act: impl FnOnce(UnixStream) -> Vec<u8> + Send + 'static,
) -> JoinHandle<Vec<u8>> {
    let listener = UnixListener::bind(path).unwrap();
    std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        stream.set_read_timeout(Some(LONG)).unwrap();
        act(stream)
    })
}

#[test]
fn a_unix_socket_that_is_not_an_engine_is_sent_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = engine(1, dir.path(), None);
    let client = engine(2, dir.path(), None);
    client.trust(server.node(), SECRET);
    let shm_only = |path: &Path| only(&client.address(), None, Some(path));

    // Silent: no hello, so no challenge either.
    let path = dir.path().join("silent.sock");
    let silent = fake_unix(&path, read_all);
    let (err, took) = verify_fails(&server, &shm_only(&path));
    assert_eq!(kinds(&attempts(err)), [TransportKind::Shm]);
    assert!(took >= SHORT && took < SHORT + SLACK, "took {took:?}");
    assert!(silent.join().unwrap().is_empty());

    // Greets with something that is not a yutu hello.
    let path = dir.path().join("chatty.sock");
    let chatty = fake_unix(&path, |mut s| {
        s.write_all(&[0xAB; 24]).unwrap();
        read_all(s)
    });
    let (err, took) = verify_fails(&server, &shm_only(&path));
    assert!(matches!(
        &attempts(err)[0].1,
        TransferError::Protocol { .. }
    ));
    assert!(took < SHORT + SLACK, "took {took:?}");
    assert!(chatty.join().unwrap().is_empty());

    // Replays the real engine's hello: it gets the challenge but cannot answer it.
    let mut hello = [0u8; 24];
    UnixStream::connect(client.address().shm.unwrap())
        .unwrap()
        .read_exact(&mut hello)
        .unwrap();
    let path = dir.path().join("replay.sock");
    let replay = fake_unix(&path, move |mut s| {
        s.write_all(&hello).unwrap();
        read_all(s)
    });
    let (_, took) = verify_fails(&server, &shm_only(&path));
    assert!(took >= SHORT && took < SHORT + SLACK, "took {took:?}");
    let got = replay.join().unwrap();
    assert_eq!(got.len(), 48, "exactly one prove message");
    assert_eq!(&got[..4], b"YTP1");

    // Never accepts.
    let path = dir.path().join("backlog.sock");
    let backlog = UnixListener::bind(&path).unwrap();
    let (_, took) = verify_fails(&server, &shm_only(&path));
    assert!(took >= SHORT && took < SHORT + SLACK, "took {took:?}");
    drop(backlog);

    // Nobody there.
    let (_, took) = verify_fails(&server, &shm_only(&dir.path().join("nobody.sock")));
    assert!(took < SLACK, "took {took:?}");
}
