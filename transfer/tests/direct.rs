//! Direct access (`map_direct`): a same-host peer's range mapped into this process, checked
//! by the peer, copied by the caller's thread; stable verdicts remembered, guarded ones not.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{pair, pattern, read, segment};
use yutu_transfer::{
    HugePages, MemoryRegion, RangeGuard, Refusal, SegmentDescriptor, TransferError,
};

#[test]
fn a_peer_range_is_copied_into_and_out_of_directly() {
    let dir = tempfile::tempdir().unwrap();
    let (client, server) = pair(dir.path(), true);
    let cli = segment(&client, 64 << 10);
    cli.region().write_at(0, &pattern(3, 64 << 10)).unwrap();
    let desc = cli.descriptor(8192, 16384).unwrap();

    let ranges = server.map_direct(&[desc]).unwrap();
    let range = ranges.into_iter().next().unwrap().unwrap();
    assert_eq!(range.len(), 16384);
    let mut got = vec![0u8; 4096];
    range.read_at(4096, &mut got).unwrap();
    assert_eq!(got, pattern(3, 64 << 10)[8192 + 4096..8192 + 8192]);
    range.write_at(0, &[0xab; 100]).unwrap();
    assert_eq!(read(&cli, 8192, 100), vec![0xab; 100]);
    // Nothing outside the granted range is reachable.
    assert!(matches!(
        range.write_at(16384 - 10, &[0; 11]),
        Err(TransferError::OutOfBounds { .. })
    ));
    assert!(range.sub(16000, 1000).is_err());
    assert_eq!(range.sub(1000, 24).unwrap().len(), 24);

    // An unguarded segment's verdict is remembered: the second call needs no round trip.
    let checks = client.stats().shm_listener.requests;
    assert!(server.map_direct_cached(&desc).is_some());
    server.map_direct(&[desc]).unwrap()[0].as_ref().unwrap();
    assert_eq!(client.stats().shm_listener.requests, checks);

    // A forged token is refused, and never answered from the cache.
    let mut forged = desc;
    forged.token.0[3] ^= 1;
    assert!(server.map_direct_cached(&forged).is_none());
    let err = server.map_direct(&[forged]).unwrap().remove(0).unwrap_err();
    assert!(matches!(
        err,
        TransferError::Refused {
            reason: Refusal::BadToken,
            ..
        }
    ));
}

struct Switch(AtomicBool);

impl RangeGuard for Switch {
    fn allows(&self, _desc: &SegmentDescriptor) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// A guarded segment's ranges are granted one by one, so its memfd (which would give a peer
/// every range, granted or not, forever) is never handed out.
#[test]
fn guarded_segments_are_never_mapped_whole() {
    let dir = tempfile::tempdir().unwrap();
    let (client, server) = pair(dir.path(), true);
    let guard = Arc::new(Switch(AtomicBool::new(true)));
    let region = MemoryRegion::allocate("guarded", 64 << 10, HugePages::Never).unwrap();
    let seg = server.register_guarded(region, guard.clone()).unwrap();
    assert!(!seg.shm_shareable());
    let desc = seg.descriptor(0, 4096).unwrap();
    let err = client.map_direct(&[desc]).unwrap().remove(0).unwrap_err();
    assert!(matches!(err, TransferError::Unavailable { .. }), "{err}");
    assert!(err.to_string().contains("not shared over shm"), "{err}");
    assert!(client.map_direct_cached(&desc).is_none());
}

#[test]
fn peers_on_other_hosts_or_unknown_are_refused_up_front() {
    let dir = tempfile::tempdir().unwrap();
    let (client, server) = pair(dir.path(), false);
    let cli = segment(&client, 4096);
    let desc = cli.descriptor(0, 4096).unwrap();
    assert!(matches!(
        server.map_direct(&[desc]),
        Err(TransferError::Unavailable { .. })
    ));
    let stranger = SegmentDescriptor {
        node: yutu_transfer::NodeId(0xdead),
        ..desc
    };
    assert!(matches!(
        server.map_direct(&[stranger]),
        Err(TransferError::UnknownPeer { .. })
    ));
}

/// Memory the peer process already had (an engine's array), registered as process memory:
/// reached through the peer's memory file, copied straight into and out of, by direct
/// access and by the workers, and refused once it is unmapped instead of faulting here.
#[test]
fn a_peer_process_memory_is_reached_without_a_mapping() {
    let dir = tempfile::tempdir().unwrap();
    let (client, server) = pair(dir.path(), true);
    let len = 256 << 10;
    // Unmapped below only after the test is done with it through the region (and the region
    // is then only used to show the error).
    let (base, region) = anonymous(len);
    assert!(region.process() && region.fd().is_none());
    let cli = client.register(region).unwrap();
    assert!(cli.shm_shareable());
    cli.region().write_at(0, &pattern(5, len)).unwrap();
    let desc = cli.descriptor(4096, 128 << 10).unwrap();

    let range = server.map_direct(&[desc]).unwrap().remove(0).unwrap();
    assert!(range.is_process_memory());
    // The peer is this process: the same user, so cross-memory attach is allowed (unless
    // turned off).
    assert_eq!(
        range.is_cross_memory(),
        std::env::var_os("YUTU_CROSS_MEMORY").is_none_or(|v| v != "0")
    );
    let mut got = vec![0u8; 8192];
    range.read_at(100, &mut got).unwrap();
    assert_eq!(got, pattern(5, len)[4096 + 100..4096 + 100 + 8192]);
    range.write_at(10, &[0x5a; 1000]).unwrap();
    assert_eq!(read(&cli, 4096 + 10, 1000), vec![0x5a; 1000]);
    assert!(matches!(
        range.write_at((128 << 10) - 10, &[0; 11]),
        Err(TransferError::OutOfBounds { .. })
    ));

    // Scattered over and gathered from several parts (one per layer of a block), in one
    // cross-memory call where that is used: the bytes land at each part's place, in order.
    let parts: Vec<_> = [(0u64, 1000u64), (50_000, 3000), (9000, 5000)]
        .iter()
        .map(|&(at, n)| range.sub(at, n).unwrap())
        .collect();
    let block = pattern(13, 8000); // fills the first two parts and 4000 bytes of the third
    yutu_transfer::DirectRange::scatter(&parts, &block).unwrap();
    assert_eq!(read(&cli, 4096, 1000), block[..1000]);
    assert_eq!(read(&cli, 4096 + 50_000, 3000), block[1000..4000]);
    assert_eq!(read(&cli, 4096 + 9000, 4000), block[4000..]);
    let mut whole = vec![0u8; 9000];
    yutu_transfer::DirectRange::gather(&parts, &mut whole).unwrap();
    assert_eq!(whole[..8000], block[..]);
    assert!(yutu_transfer::DirectRange::scatter(&parts, &[0; 9001]).is_err());
    assert!(yutu_transfer::DirectRange::gather(&parts, &mut [0; 100]).is_err());

    // Several blocks at once (a run of a get-into batch), each over its own parts, in one
    // copy: each lands in place; a block too large for its parts fails alone.
    let a = [
        range.sub(20_000, 2000).unwrap(),
        range.sub(30_000, 500).unwrap(),
    ];
    let b = [range.sub(40_000, 4000).unwrap()];
    let c = [range.sub(60_000, 10).unwrap()];
    let (x, y, z) = (pattern(21, 2500), pattern(22, 4000), pattern(23, 11));
    let done = yutu_transfer::DirectRange::scatter_each(&[(&a, &x), (&b, &y)]);
    assert!(done.iter().all(Result::is_ok), "{done:?}");
    assert_eq!(read(&cli, 4096 + 20_000, 2000), x[..2000]);
    assert_eq!(read(&cli, 4096 + 30_000, 500), x[2000..]);
    assert_eq!(read(&cli, 4096 + 40_000, 4000), y);
    let w = pattern(24, 4000);
    let before = read(&cli, 4096 + 60_000, 10);
    let done = yutu_transfer::DirectRange::scatter_each(&[(&c, &z), (&b, &w)]);
    assert!(done[0].is_err() && done[1].is_ok(), "{done:?}");
    assert_eq!(read(&cli, 4096 + 40_000, 4000), w);
    assert_eq!(read(&cli, 4096 + 60_000, 10), before);

    // And gathered back at once (a run of a put-from batch): each item gets its own parts'
    // bytes; an item whose room is not its parts' size fails alone, the others still filled.
    let (mut p, mut q) = (vec![0u8; 2500], vec![0u8; 4000]);
    let done = yutu_transfer::DirectRange::gather_each(&mut [(&a, &mut p), (&b, &mut q)]);
    assert!(done.iter().all(Result::is_ok), "{done:?}");
    assert_eq!(p, x);
    assert_eq!(q, w);
    let (mut short, mut q2) = (vec![0u8; 9], vec![0u8; 4000]);
    let done = yutu_transfer::DirectRange::gather_each(&mut [(&c, &mut short), (&b, &mut q2)]);
    assert!(done[0].is_err() && done[1].is_ok(), "{done:?}");
    assert_eq!(q2, w);

    // The workers' shm lane reaches it too: one-sided write from the server's segment.
    let src = segment(&server, 64 << 10);
    src.region().write_at(0, &pattern(9, 64 << 10)).unwrap();
    server
        .transfer([yutu_transfer::TransferRequest::write(&src, 0, &desc).range(0, 64 << 10)])
        .unwrap();
    assert_eq!(read(&cli, 4096, 64 << 10), pattern(9, 64 << 10));

    // Gone from the peer's address space: the copy fails with an error, nothing faults.
    // SAFETY: our own mapping from above; nothing reads it through a Rust reference.
    assert_eq!(unsafe { libc::munmap(base, len) }, 0);
    let err = range.write_at(0, &[1; 64]).unwrap_err();
    assert!(matches!(err, TransferError::Io { .. }), "{err}");
    let done = yutu_transfer::DirectRange::scatter_each(&[(&a, &x), (&b, &y)]);
    assert!(done.iter().all(Result::is_err), "{done:?}");
    let done = yutu_transfer::DirectRange::gather_each(&mut [(&a, &mut p), (&b, &mut q)]);
    assert!(done.iter().all(Result::is_err), "{done:?}");
}

/// Large reads out of a peer's process memory (a put's blocks) go through the copying
/// thread's bounce buffer, half a MiB at a time: parts larger than the buffer, parts
/// split between two fills, more parts than one system call takes, reads at odd offsets,
/// all land exactly. A hole in the peer's
/// memory part way through fails only the block over it, with the address named; the bytes
/// before it and the other blocks are still copied.
#[test]
fn large_reads_out_of_peer_process_memory_land_exactly_and_a_hole_fails_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (client, server) = pair(dir.path(), true);
    let len = 24 << 20;
    // The hole is unmapped below while only the region refers to it (copies through it then
    // fail, they do not fault).
    let (base, region) = anonymous(len);
    let cli = client.register(region).unwrap();
    let bytes = pattern(31, len);
    cli.region().write_at(0, &bytes).unwrap();
    let desc = cli.descriptor(0, len as u64).unwrap();
    let range = server.map_direct(&[desc]).unwrap().remove(0).unwrap();
    let at = |o: usize, n: usize| range.sub(o as u64, n as u64).unwrap();

    // One block over four parts (a 28-byte header as LMCache writes one, 20 KiB, 700 KiB +
    // 77 bytes: more than a fill, 300 KiB) and one 2 MiB block in one part: six fills, some
    // parts split between two.
    let parts = [
        (5, 28),
        (100, 20 << 10),
        (1_000_003, (700 << 10) + 77),
        (2_500_000, 300 << 10),
    ];
    let a: Vec<_> = parts.iter().map(|&(o, n)| at(o, n)).collect();
    let b = [at(1 << 20, 2 << 20)];
    let alen: usize = parts.iter().map(|p| p.1).sum();
    let (mut p, mut q) = (vec![0u8; alen], vec![0u8; 2 << 20]);
    let done = yutu_transfer::DirectRange::gather_each(&mut [(&a, &mut p), (&b, &mut q)]);
    assert!(done.iter().all(Result::is_ok), "{done:?}");
    let want: Vec<u8> = parts
        .iter()
        .flat_map(|&(o, n)| bytes[o..o + n].iter().copied())
        .collect();
    assert!(p == want, "the three-part block came back wrong");
    assert!(
        q[..] == bytes[1 << 20..3 << 20],
        "the 2 MiB block came back wrong"
    );
    let mut one = vec![0u8; 600 << 10];
    range.read_at(333, &mut one).unwrap();
    assert!(one[..] == bytes[333..333 + (600 << 10)]);

    // More parts than one call takes (1,100 headers of 28 bytes, then 18 MiB): the fills
    // stop at the kernel's iovec limit too.
    let mut parts: Vec<(usize, usize)> = (0..1100).map(|i| ((4 << 20) + i * 64, 28)).collect();
    parts.push((5 << 20, 18 << 20));
    let many: Vec<_> = parts.iter().map(|&(o, n)| at(o, n)).collect();
    let mut got = vec![0u8; parts.iter().map(|p| p.1).sum()];
    let done = yutu_transfer::DirectRange::gather_each(&mut [(&many, &mut got)]);
    assert!(done.iter().all(Result::is_ok), "{done:?}");
    let want: Vec<u8> = parts
        .iter()
        .flat_map(|&(o, n)| bytes[o..o + n].iter().copied())
        .collect();
    assert!(got == want, "the block of 1,101 parts came back wrong");

    // A 64 KiB hole at 3 MiB: a block over it fails and names an address; a block before it
    // is filled in the same call.
    // SAFETY: page-aligned range inside our own mapping, no Rust reference into it.
    assert_eq!(
        unsafe { libc::munmap(base.cast::<u8>().add(3 << 20).cast(), 64 << 10) },
        0
    );
    let over = [at((3 << 20) - (100 << 10), 400 << 10)];
    let before = [at(0, 1 << 20)];
    let (mut o, mut f) = (vec![0u8; 400 << 10], vec![0u8; 1 << 20]);
    let done = yutu_transfer::DirectRange::gather_each(&mut [(&over, &mut o), (&before, &mut f)]);
    assert!(done[0].is_err() && done[1].is_ok(), "{done:?}");
    assert!(f[..] == bytes[..1 << 20]);
    let err = range
        .read_at((3 << 20) - 4096, &mut vec![0u8; 128 << 10])
        .unwrap_err();
    assert!(matches!(err, TransferError::Io { .. }), "{err}");
    // SAFETY: our own mapping from above (munmap of the hole again is harmless).
    assert_eq!(unsafe { libc::munmap(base, len) }, 0);
}

/// A fresh anonymous mapping of `len` bytes (an engine's array, as far as the engine can
/// tell) and a process-memory region over it. The test unmaps it; copies through the region
/// after that fail rather than fault (what the tests show).
fn anonymous(len: usize) -> (*mut libc::c_void, MemoryRegion) {
    // SAFETY: a new private mapping; nothing else refers to it.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(base, libc::MAP_FAILED);
    // SAFETY: the mapping above is this process's and readable and writable. The tests
    // touch it through the region in this process only while it is mapped; they unmap it
    // (or a hole in it) only to show that a peer's copies, which go through the kernel's
    // checks, then fail instead of faulting, and use the region for nothing else after that.
    let region = unsafe { MemoryRegion::process_memory(base.cast(), len) }.unwrap();
    (base, region)
}
