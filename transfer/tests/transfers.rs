//! Byte-exact batch reads and writes between two engines in one process, over shm (same host)
//! and over tcp (engines that look remote to each other), 1 KiB to 16 MiB.

mod common;

use common::{layout, pair, pattern, read, segment, SIZES};
use yutu_transfer::{TransferEngine, TransferRequest, TransportKind};

/// Reads every size from `server` into `client` in one batch, then writes new bytes back in
/// another, checking every byte and that the bytes around the ranges are untouched.
fn round_trip(client: &TransferEngine, server: &TransferEngine, expect: TransportKind) {
    let (offsets, total) = layout(&SIZES);
    let srv = segment(server, total);
    let cli = segment(client, total);
    for (i, (&off, &len)) in offsets.iter().zip(&SIZES).enumerate() {
        srv.region()
            .write_at(off, &pattern(i as u64, len as usize))
            .unwrap();
    }
    let descs: Vec<_> = offsets
        .iter()
        .zip(&SIZES)
        .map(|(&off, &len)| srv.descriptor(off, len).unwrap())
        .collect();

    let reads = descs
        .iter()
        .zip(&offsets)
        .map(|(d, &off)| TransferRequest::read(&cli, off, d));
    let done = client.transfer(reads).expect("batch read");
    assert_eq!(done.len(), SIZES.len());
    for (c, &len) in done.iter().zip(&SIZES) {
        assert_eq!(c.transport, expect);
        assert_eq!(c.bytes, len);
        assert!(!c.retried);
    }
    for (i, (&off, &len)) in offsets.iter().zip(&SIZES).enumerate() {
        assert!(
            read(&cli, off, len) == pattern(i as u64, len as usize),
            "read of {len} bytes differs"
        );
    }

    for (i, (&off, &len)) in offsets.iter().zip(&SIZES).enumerate() {
        cli.region()
            .write_at(off, &pattern(100 + i as u64, len as usize))
            .unwrap();
    }
    let writes = descs
        .iter()
        .zip(&offsets)
        .map(|(d, &off)| TransferRequest::write(&cli, off, d));
    let done = client.transfer(writes).expect("batch write");
    assert!(done.iter().all(|c| c.transport == expect));
    let mut end = 0;
    for (i, (&off, &len)) in offsets.iter().zip(&SIZES).enumerate() {
        assert!(
            read(&srv, off, len) == pattern(100 + i as u64, len as usize),
            "write of {len} bytes differs"
        );
        // The padding before this range was never granted and must still be zero.
        assert!(read(&srv, end, off - end).iter().all(|b| *b == 0));
        end = off + len;
    }
}

#[test]
fn batches_over_shm_are_byte_exact() {
    let dir = tempfile::tempdir().unwrap();
    let (client, server) = pair(dir.path(), true);
    round_trip(&client, &server, TransportKind::Shm);
    // shm moved the bytes without the tcp listener, and mapped the server's segment once.
    assert_eq!(server.stats().tcp_listener.requests, 0);
    assert_eq!(client.shm_mappings(), 1);
    assert!(server.stats().shm_listener.requests >= SIZES.len() as u64);
}

#[test]
fn batches_over_tcp_are_byte_exact_and_sliced_over_connections() {
    let dir = tempfile::tempdir().unwrap();
    let (client, server) = pair(dir.path(), false);
    round_trip(&client, &server, TransportKind::Tcp);
    let stats = server.stats();
    assert_eq!(stats.shm_listener.requests, 0);
    // 16 MiB in 1 MiB slices dealt over 4 workers: each worker used its own connection.
    assert!(stats.tcp_listener.accepted >= 2, "{stats:?}");
    let moved: u64 = SIZES.iter().sum();
    assert_eq!(stats.tcp_listener.bytes_out, moved);
    assert_eq!(stats.tcp_listener.bytes_in, moved);
    assert_eq!(client.stats().tcp.bytes, 2 * moved);
}

#[test]
fn a_path_can_be_forced_and_parts_of_a_descriptor_moved() {
    let dir = tempfile::tempdir().unwrap();
    let (client, server) = pair(dir.path(), true);
    let srv = segment(&server, 1 << 20);
    let cli = segment(&client, 1 << 20);
    let data = pattern(7, 1 << 20);
    srv.region().write_at(0, &data).unwrap();
    let whole = srv.descriptor(0, 1 << 20).unwrap();
    // Two halves of one descriptor, in reverse order, over tcp although shm is possible.
    let half = 1 << 19;
    let reqs = [
        TransferRequest::read(&cli, 0, &whole).range(half, half),
        TransferRequest::read(&cli, half, &whole).range(0, half),
    ];
    let done = client
        .submit_via(reqs, &[TransportKind::Tcp])
        .unwrap()
        .wait()
        .into_result()
        .unwrap();
    assert!(done.iter().all(|c| c.transport == TransportKind::Tcp));
    assert!(read(&cli, 0, half) == data[half as usize..]);
    assert!(read(&cli, half, half) == data[..half as usize]);
}

#[test]
fn many_small_requests_pipeline_on_both_paths() {
    let dir = tempfile::tempdir().unwrap();
    let (client, server) = pair(dir.path(), true);
    let n = 600u64;
    let block = 1024u64;
    let srv = segment(&server, n * block);
    let cli = segment(&client, n * block);
    let data = pattern(3, (n * block) as usize);
    srv.region().write_at(0, &data).unwrap();
    for kind in [TransportKind::Tcp, TransportKind::Shm] {
        cli.region()
            .write_at(0, &vec![0u8; (n * block) as usize])
            .unwrap();
        // One descriptor per block, as a KV get returns them; read in reverse order.
        let reqs: Vec<_> = (0..n)
            .map(|i| {
                let d = srv.descriptor(i * block, block).unwrap();
                TransferRequest::read(&cli, (n - 1 - i) * block, &d)
            })
            .collect();
        let done = client.submit_via(reqs, &[kind]).unwrap().wait();
        assert!(
            done.is_ok(),
            "{kind}: {:?}",
            done.outcomes.iter().find(|o| o.is_err())
        );
        for i in 0..n {
            let got = read(&cli, (n - 1 - i) * block, block);
            assert!(
                got == data[(i * block) as usize..((i + 1) * block) as usize],
                "{kind} block {i}"
            );
        }
    }
}

#[test]
fn zero_length_and_empty_batches_complete_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (client, server) = pair(dir.path(), true);
    let srv = segment(&server, 4096);
    let cli = segment(&client, 4096);
    let d = srv.descriptor(0, 0).unwrap();
    let done = client
        .transfer([TransferRequest::read(&cli, 0, &d)])
        .unwrap();
    assert_eq!(done[0].bytes, 0);
    assert!(client.submit(Vec::new()).unwrap().is_done());
}

/// A transfer between two segments of the same engine goes through its own listeners.
#[test]
fn an_engine_reaches_its_own_segments() {
    let dir = tempfile::tempdir().unwrap();
    let engine = common::engine(9, dir.path(), None);
    let a = segment(&engine, 8192);
    let b = segment(&engine, 8192);
    a.region().write_at(0, &pattern(1, 8192)).unwrap();
    let d = a.descriptor(0, 8192).unwrap();
    let done = engine.transfer([TransferRequest::read(&b, 0, &d)]).unwrap();
    assert_eq!(done[0].transport, TransportKind::Shm);
    assert!(read(&b, 0, 8192) == pattern(1, 8192));
}
