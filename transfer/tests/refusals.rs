//! Requests outside what a descriptor grants are refused with typed errors, on every path, and
//! nothing is written.

mod common;

use common::{pair, pattern, read, segment};
use yutu_transfer::{
    Refusal, SegmentDescriptor, SegmentId, Side, TransferError, TransferRequest, TransportKind,
};

fn refusal(err: &TransferError) -> Refusal {
    match err {
        TransferError::Refused { reason, .. } => *reason,
        other => panic!("expected a refusal, got {other}"),
    }
}

#[test]
fn forged_widened_and_stale_descriptors_are_refused_on_shm_and_tcp() {
    let dir = tempfile::tempdir().unwrap();
    let (client, server) = pair(dir.path(), true);
    let srv = segment(&server, 64 << 10);
    let cli = segment(&client, 64 << 10);
    cli.region().write_at(0, &pattern(1, 64 << 10)).unwrap();
    let granted = srv.descriptor(4096, 4096).unwrap();

    let mut forged = granted;
    forged.token.0[0] ^= 1;
    // Same token, larger range: the token covers exactly the granted range.
    let widened = SegmentDescriptor {
        len: 8192,
        ..granted
    };
    let moved = SegmentDescriptor {
        offset: 0,
        ..granted
    };
    let unknown = SegmentDescriptor {
        segment: SegmentId(999),
        ..granted
    };
    for kind in [TransportKind::Shm, TransportKind::Tcp] {
        for (desc, expected) in [
            (forged, Refusal::BadToken),
            (widened, Refusal::BadToken),
            (moved, Refusal::BadToken),
            (unknown, Refusal::UnknownSegment),
        ] {
            for req in [
                TransferRequest::write(&cli, 0, &desc),
                TransferRequest::read(&cli, 0, &desc),
            ] {
                let result = client.submit_via([req], &[kind]).unwrap().wait();
                let err = result.outcomes[0].as_ref().unwrap_err();
                assert_eq!(refusal(err), expected, "{kind}: {err}");
                // A refusal is the target's verdict, not the path's: it is not retried.
                assert!(!err.is_retryable());
            }
        }
    }
    // Nothing was written anywhere in the server's segment.
    assert!(read(&srv, 0, 64 << 10).iter().all(|b| *b == 0));
    assert!(server.stats().tcp_listener.refused >= 8);
    assert!(server.stats().shm_listener.refused >= 8);

    // The connections survived the refusals: a valid request goes through on both paths.
    for kind in [TransportKind::Shm, TransportKind::Tcp] {
        let done = client
            .submit_via([TransferRequest::write(&cli, 0, &granted)], &[kind])
            .unwrap()
            .wait()
            .into_result()
            .unwrap();
        assert_eq!(done[0].transport, kind);
    }
    assert!(read(&srv, 4096, 4096) == pattern(1, 4096));
}

#[test]
fn unregistered_segments_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (client, server) = pair(dir.path(), true);
    let srv = segment(&server, 8192);
    let cli = segment(&client, 8192);
    let d = srv.descriptor(0, 8192).unwrap();
    // Map it over shm first, so the refusal cannot come from a missing mapping.
    client
        .transfer([TransferRequest::read(&cli, 0, &d)])
        .unwrap();
    assert!(server.unregister(&srv));
    assert!(!server.unregister(&srv));
    for kind in [TransportKind::Shm, TransportKind::Tcp] {
        let result = client
            .submit_via([TransferRequest::write(&cli, 0, &d)], &[kind])
            .unwrap()
            .wait();
        assert_eq!(
            refusal(result.outcomes[0].as_ref().unwrap_err()),
            Refusal::UnknownSegment,
            "{kind}"
        );
    }
}

#[test]
fn requests_that_do_not_fit_are_rejected_at_submit() {
    let dir = tempfile::tempdir().unwrap();
    let (client, server) = pair(dir.path(), true);
    let srv = segment(&server, 8192);
    let cli = segment(&client, 4096);
    let d = srv.descriptor(0, 8192).unwrap();

    // Local side too small for the remote range.
    let err = client
        .submit([TransferRequest::read(&cli, 0, &d)])
        .err()
        .unwrap();
    assert!(matches!(
        err,
        TransferError::OutOfBounds {
            index: 0,
            side: Side::Local,
            ..
        }
    ));
    // A part beyond the descriptor, in the second request of a batch: nothing is queued.
    let small = srv.descriptor(0, 100).unwrap();
    let reqs = [
        TransferRequest::read(&cli, 0, &small),
        TransferRequest::read(&cli, 0, &small).range(50, 51),
    ];
    let err = client.submit(reqs).err().unwrap();
    assert!(matches!(
        err,
        TransferError::OutOfBounds {
            index: 1,
            side: Side::Remote,
            offset: 50,
            len: 51,
            limit: 100
        }
    ));
    let overflow = TransferRequest::read(&cli, 0, &small).range(u64::MAX, 2);
    assert!(matches!(
        client.submit([overflow]).err().unwrap(),
        TransferError::OutOfBounds { .. }
    ));
    // Minting a descriptor outside the segment is refused too.
    assert!(srv.descriptor(8000, 200).is_err());
    // A node nobody added.
    let stranger = SegmentDescriptor {
        node: yutu_transfer::NodeId(77),
        ..small
    };
    assert!(matches!(
        client
            .submit([TransferRequest::read(&cli, 0, &stranger)])
            .err()
            .unwrap(),
        TransferError::UnknownPeer { index: 0, .. }
    ));
    // A local segment registered with another engine.
    let foreign = segment(&server, 4096);
    assert!(matches!(
        client
            .submit([TransferRequest::read(&foreign, 0, &small)])
            .err()
            .unwrap(),
        TransferError::ForeignSegment { index: 0, .. }
    ));
}
