//! The staging pipeline on the host-memory device: byte-exact round trips, the order in
//! which halves are reused, overlap of device copies with node calls, per-block failures and
//! cancellation. The "node" here is a map from block index to bytes, written into and read
//! out of the staging buffer the way the real node's one-sided copies do (the real node is
//! in `tests/tests/kv_device.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use yutu_transfer::device::staging::{
    get_into, plan, put_from, BlockError, ChunkRequest, DeviceBlock, StagingSlot,
};
use yutu_transfer::device::{
    CancelToken, CopyDirection, CopyEvent, Device, DeviceMemory, HostDevice,
};

const MAX_KEYS: usize = 1024;

fn pattern(i: usize, len: u64) -> Vec<u8> {
    (0..len)
        .map(|j| (j as usize).wrapping_mul(31).wrapping_add(i * 7 + 1) as u8)
        .collect()
}

/// Device memory laid out as consecutive blocks of `lens`.
fn layout(dev: &HostDevice, lens: &[u64]) -> (DeviceMemory, Vec<DeviceBlock>) {
    let total: u64 = lens.iter().sum::<u64>().max(1);
    let mem = dev.alloc(total).unwrap();
    let mut at = 0;
    let blocks = lens
        .iter()
        .map(|&len| {
            let b = DeviceBlock {
                addr: mem.ptr + at,
                len,
            };
            at += len;
            b
        })
        .collect();
    (mem, blocks)
}

/// A fake node's store: what `put_from` handed it, by block index.
type Stored = Arc<Mutex<HashMap<usize, Vec<u8>>>>;

fn store_into(
    slot_region: yutu_transfer::MemoryRegion,
    stored: Stored,
) -> impl FnMut(&ChunkRequest<'_>) -> Result<Vec<String>, String> {
    move |c| {
        let mut out = Vec::new();
        for ((&i, &off), &len) in c.blocks.iter().zip(c.offsets).zip(c.lens) {
            let mut bytes = vec![0u8; len as usize];
            slot_region.read_at(off, &mut bytes).unwrap();
            stored.lock().unwrap().insert(i, bytes);
            out.push(format!("etag-{i}"));
        }
        Ok(out)
    }
}

fn fetch_from(
    slot_region: yutu_transfer::MemoryRegion,
    stored: Stored,
) -> impl FnMut(&ChunkRequest<'_>) -> Result<Vec<Option<u64>>, String> {
    move |c| {
        let stored = stored.lock().unwrap();
        let mut out = Vec::new();
        for ((&i, &off), &room) in c.blocks.iter().zip(c.offsets).zip(c.lens) {
            match stored.get(&i) {
                Some(bytes) => {
                    assert!(bytes.len() as u64 <= room, "block {i} larger than its room");
                    slot_region.write_at(off, bytes).unwrap();
                    out.push(Some(bytes.len() as u64));
                }
                None => out.push(None),
            }
        }
        Ok(out)
    }
}

/// Puts `lens` blocks of patterned bytes through the pipeline, gets them back into fresh
/// device memory, and checks every byte.
fn round_trip(lens: &[u64], half: u64) {
    let dev = HostDevice::new(0);
    let mut slot = StagingSlot::new(dev.as_ref(), half).unwrap();
    let region = slot.pinned().region().clone();
    let (src, blocks) = layout(&dev, lens);
    let mut at = 0;
    for (i, &len) in lens.iter().enumerate() {
        dev.upload(&src, at, &pattern(i, len)).unwrap();
        at += len;
    }
    let stored: Stored = Arc::default();
    // SAFETY: the blocks are inside `src`, an allocation of `dev`, alive for the call.
    let put = unsafe {
        put_from(
            &mut slot,
            &blocks,
            MAX_KEYS,
            None,
            store_into(region.clone(), stored.clone()),
        )
    };
    for (i, r) in put.iter().enumerate() {
        assert_eq!(r.as_ref().unwrap(), &format!("etag-{i}"));
        assert_eq!(
            stored.lock().unwrap()[&i],
            pattern(i, lens[i]),
            "stored block {i}"
        );
    }
    let (dst, blocks) = layout(&dev, lens);
    // SAFETY: as above, for `dst`.
    let got = unsafe {
        get_into(
            &mut slot,
            &blocks,
            MAX_KEYS,
            None,
            fetch_from(region, stored),
        )
    };
    let mut at = 0;
    for (i, &len) in lens.iter().enumerate() {
        assert_eq!(got[i].as_ref().unwrap(), &Some(len), "block {i}");
        let mut back = vec![0u8; len as usize];
        dev.download(&dst, at, &mut back).unwrap();
        assert!(back == pattern(i, len), "block {i} ({len} bytes) differs");
        at += len;
    }
}

#[test]
fn blocks_of_4_kib_to_64_mib_round_trip_byte_exact() {
    round_trip(
        &[
            4 << 10,
            64 << 10,
            1 << 20,
            2 << 20,
            16 << 20,
            64 << 20,
            4 << 10,
        ],
        64 << 20,
    );
}

#[test]
fn many_blocks_per_batch_round_trip_over_many_chunks() {
    // 300 blocks of mixed sizes through 1 MiB halves: dozens of chunks, both halves reused.
    let lens: Vec<u64> = (0..300)
        .map(|i| [4096, 10_000, 65_536, 300_000][i % 4])
        .collect();
    round_trip(&lens, 1 << 20);
    // And chunks cut by the key limit rather than bytes.
    let lens = vec![4096u64; 2500];
    round_trip(&lens, 64 << 20);
}

#[test]
fn plan_cuts_by_bytes_and_by_keys() {
    assert_eq!(plan(&[10, 10, 10], 20, 100), vec![0..2, 2..3]);
    assert_eq!(plan(&[30, 10], 20, 100), vec![0..1, 1..2]);
    assert_eq!(plan(&[1, 1, 1, 1, 1], 100, 2), vec![0..2, 2..4, 4..5]);
    assert!(plan(&[], 100, 2).is_empty());
}

/// Waits, up to ten seconds, until `flag` says `want`; the hooks use this to hold one copy
/// back until the pipeline has done something else.
fn wait_for(flag: &(Mutex<Vec<String>>, Condvar), want: &str) -> Result<(), String> {
    wait_up_to(flag, want, Duration::from_secs(10))
}

fn wait_up_to(
    flag: &(Mutex<Vec<String>>, Condvar),
    want: &str,
    limit: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    let mut log = flag.0.lock().unwrap();
    while !log.iter().any(|e| e == want) {
        let now = Instant::now();
        if now >= deadline {
            return Err(format!(
                "{want:?} never happened while a copy waited for it"
            ));
        }
        log = flag.1.wait_timeout(log, deadline - now).unwrap().0;
    }
    Ok(())
}

fn note(flag: &(Mutex<Vec<String>>, Condvar), what: String) {
    flag.0.lock().unwrap().push(what);
    flag.1.notify_all();
}

#[test]
fn the_device_copy_of_a_chunk_overlaps_the_node_call_for_the_next() {
    // Get: the copy of block 0 (chunk 0) is held until the node call for chunk 1 has
    // started. A pipeline that waited for the copies before calling the node again would
    // never get there, and the copy would fail after ten seconds.
    let dev = HostDevice::new(0);
    let events: Arc<(Mutex<Vec<String>>, Condvar)> = Arc::default();
    let e = events.clone();
    dev.set_hook(Some(Arc::new(move |c: &CopyEvent| {
        if c.tag == 0 && c.direction == CopyDirection::ToDevice {
            wait_for(&e, "fetch 1")?;
        }
        note(&e, format!("copied {}", c.tag));
        Ok(())
    })));
    let mut slot = StagingSlot::new(dev.as_ref(), 8192).unwrap();
    let region = slot.pinned().region().clone();
    let (dst, blocks) = layout(&dev, &[8192; 4]);
    let stored: Stored = Arc::new(Mutex::new((0..4).map(|i| (i, pattern(i, 8192))).collect()));
    let mut fetch = fetch_from(region.clone(), stored.clone());
    let e = events.clone();
    let mut k = 0;
    // SAFETY: the blocks are inside `dst`, an allocation of `dev`.
    let got = unsafe {
        get_into(
            &mut slot,
            &blocks,
            MAX_KEYS,
            None,
            |c: &ChunkRequest<'_>| {
                note(&e, format!("fetch {k}"));
                k += 1;
                fetch(c)
            },
        )
    };
    for (i, r) in got.iter().enumerate() {
        assert_eq!(r.as_ref().unwrap(), &Some(8192), "block {i}: {r:?}");
        let mut back = vec![0u8; 8192];
        dev.download(&dst, i as u64 * 8192, &mut back).unwrap();
        assert_eq!(back, pattern(i, 8192));
    }
    // Put: the device-to-host copy of chunk 1 is held until the node reads chunk 0.
    let dev = HostDevice::new(0);
    let events: Arc<(Mutex<Vec<String>>, Condvar)> = Arc::default();
    let e = events.clone();
    dev.set_hook(Some(Arc::new(move |c: &CopyEvent| {
        if c.tag == 1 && c.direction == CopyDirection::ToHost {
            wait_for(&e, "store 0")?;
        }
        Ok(())
    })));
    let mut slot = StagingSlot::new(dev.as_ref(), 8192).unwrap();
    let region = slot.pinned().region().clone();
    let (src, blocks) = layout(&dev, &[8192; 4]);
    for i in 0..4 {
        dev.upload(&src, i as u64 * 8192, &pattern(i, 8192))
            .unwrap();
    }
    let stored: Stored = Arc::default();
    let mut store = store_into(region, stored.clone());
    let e = events.clone();
    let mut k = 0;
    // SAFETY: the blocks are inside `src`, an allocation of `dev`.
    let put = unsafe {
        put_from(
            &mut slot,
            &blocks,
            MAX_KEYS,
            None,
            |c: &ChunkRequest<'_>| {
                note(&e, format!("store {k}"));
                k += 1;
                store(c)
            },
        )
    };
    assert!(put.iter().all(Result::is_ok), "{put:?}");
    for i in 0..4 {
        assert_eq!(stored.lock().unwrap()[&i], pattern(i, 8192));
    }
}

#[test]
fn a_half_is_refilled_only_after_its_copies_finished() {
    // One block per chunk (halves of one block): chunk k + 2 reuses chunk k's half, so every
    // copy of chunk k must be done before the node call for chunk k + 2. The copy of block 0
    // gives a wrong pipeline a second to call the node for chunk 2 meanwhile; a right one
    // cannot, and the copy goes on after the second.
    let dev = HostDevice::new(0);
    let log: Arc<(Mutex<Vec<String>>, Condvar)> = Arc::default();
    let l = log.clone();
    dev.set_hook(Some(Arc::new(move |c: &CopyEvent| {
        if c.tag == 0 {
            let _ = wait_up_to(&l, "fetch 2", Duration::from_secs(1));
        }
        note(&l, format!("copy {}", c.tag));
        Ok(())
    })));
    let n = 12;
    let mut slot = StagingSlot::new(dev.as_ref(), 4096).unwrap();
    let region = slot.pinned().region().clone();
    let (_dst, blocks) = layout(&dev, &vec![4096; n]);
    let stored: Stored = Arc::new(Mutex::new((0..n).map(|i| (i, pattern(i, 4096))).collect()));
    let mut fetch = fetch_from(region, stored);
    let l = log.clone();
    // SAFETY: the blocks are inside `_dst`, an allocation of `dev`.
    let got = unsafe {
        get_into(
            &mut slot,
            &blocks,
            MAX_KEYS,
            None,
            |c: &ChunkRequest<'_>| {
                note(&l, format!("fetch {}", c.blocks[0]));
                fetch(c)
            },
        )
    };
    assert!(got.iter().all(Result::is_ok));
    let log = log.0.lock().unwrap();
    let at = |what: String| log.iter().position(|e| *e == what).unwrap();
    for k in 0..n - 2 {
        assert!(
            at(format!("copy {k}")) < at(format!("fetch {}", k + 2)),
            "chunk {k}'s half was refilled before its copy ran: {log:?}"
        );
    }
}

#[test]
fn a_failing_copy_fails_its_block_and_leaves_the_others_right() {
    let n = 40;
    let len = 64 << 10;
    let dev = HostDevice::new(0);
    dev.set_hook(Some(Arc::new(|c: &CopyEvent| {
        if c.tag == 17 {
            Err("injected PCIe error".into())
        } else {
            Ok(())
        }
    })));
    let mut slot = StagingSlot::new(dev.as_ref(), 256 << 10).unwrap();
    let region = slot.pinned().region().clone();
    // Get: block 17's copy into the device fails.
    let stored: Stored = Arc::new(Mutex::new((0..n).map(|i| (i, pattern(i, len))).collect()));
    let (dst, blocks) = layout(&dev, &vec![len; n]);
    // SAFETY: the blocks are inside `dst`, an allocation of `dev`.
    let got = unsafe {
        get_into(
            &mut slot,
            &blocks,
            MAX_KEYS,
            None,
            fetch_from(region.clone(), stored),
        )
    };
    for (i, r) in got.iter().enumerate() {
        let mut back = vec![0u8; len as usize];
        dev.download(&dst, i as u64 * len, &mut back).unwrap();
        if i == 17 {
            match r {
                Err(BlockError::Copy(e)) => assert!(e.to_string().contains("injected"), "{e}"),
                other => panic!("block 17: {other:?}"),
            }
            assert!(back.iter().all(|&b| b == 0), "the failed block was written");
        } else {
            assert_eq!(r.as_ref().unwrap(), &Some(len), "block {i}");
            assert!(back == pattern(i, len), "block {i} differs");
        }
    }
    // Put: block 17's copy out of the device fails; it is never handed to the node.
    let (src, blocks) = layout(&dev, &vec![len; n]);
    for i in 0..n {
        dev.upload(&src, i as u64 * len, &pattern(i, len)).unwrap();
    }
    let stored: Stored = Arc::default();
    // SAFETY: the blocks are inside `src`, an allocation of `dev`.
    let put = unsafe {
        put_from(
            &mut slot,
            &blocks,
            MAX_KEYS,
            None,
            store_into(region, stored.clone()),
        )
    };
    let stored = stored.lock().unwrap();
    for (i, r) in put.iter().enumerate() {
        if i == 17 {
            assert!(matches!(r, Err(BlockError::Copy(_))), "block 17: {r:?}");
            assert!(
                !stored.contains_key(&17),
                "the failed block reached the node"
            );
        } else {
            assert!(r.is_ok(), "block {i}: {r:?}");
            assert_eq!(stored[&i], pattern(i, len), "block {i}");
        }
    }
}

#[test]
fn a_failed_node_call_fails_its_chunk_and_the_rest_only() {
    let dev = HostDevice::new(0);
    let mut slot = StagingSlot::new(dev.as_ref(), 8192).unwrap();
    let region = slot.pinned().region().clone();
    let stored: Stored = Arc::new(Mutex::new((0..6).map(|i| (i, pattern(i, 4096))).collect()));
    let (dst, blocks) = layout(&dev, &[4096; 6]);
    let mut fetch = fetch_from(region, stored);
    // SAFETY: the blocks are inside `dst`, an allocation of `dev`.
    let got = unsafe {
        get_into(
            &mut slot,
            &blocks,
            MAX_KEYS,
            None,
            |c: &ChunkRequest<'_>| {
                if c.blocks[0] == 2 {
                    Err("node unreachable".to_string())
                } else {
                    fetch(c)
                }
            },
        )
    };
    for (i, r) in got.iter().enumerate() {
        if i < 2 {
            assert_eq!(r.as_ref().unwrap(), &Some(4096));
            let mut back = vec![0u8; 4096];
            dev.download(&dst, i as u64 * 4096, &mut back).unwrap();
            assert_eq!(back, pattern(i, 4096));
        } else {
            assert!(
                matches!(r, Err(BlockError::Node(m)) if m == "node unreachable"),
                "block {i}: {r:?}"
            );
        }
    }
}

#[test]
fn absent_keys_copy_nothing_and_oversized_blocks_are_refused() {
    let dev = HostDevice::new(0);
    let copies: Arc<Mutex<Vec<usize>>> = Arc::default();
    let c2 = copies.clone();
    dev.set_hook(Some(Arc::new(move |c: &CopyEvent| {
        c2.lock().unwrap().push(c.tag);
        Ok(())
    })));
    let mut slot = StagingSlot::new(dev.as_ref(), 8192).unwrap();
    let region = slot.pinned().region().clone();
    let stored: Stored = Arc::new(Mutex::new([(1, pattern(1, 100))].into_iter().collect()));
    let (_dst, blocks) = layout(&dev, &[4096, 4096]);
    // SAFETY: the blocks are inside `_dst`, an allocation of `dev`.
    let got = unsafe {
        get_into(
            &mut slot,
            &blocks,
            MAX_KEYS,
            None,
            fetch_from(region.clone(), stored.clone()),
        )
    };
    assert!(matches!(got[0], Ok(None)));
    assert!(matches!(got[1], Ok(Some(100))));
    assert_eq!(*copies.lock().unwrap(), vec![1]);
    // A block larger than a half cannot be staged by this slot.
    let (_big, blocks) = layout(&dev, &[4096, 9000]);
    // SAFETY: as above.
    let got = unsafe {
        get_into(
            &mut slot,
            &blocks,
            MAX_KEYS,
            None,
            fetch_from(region, stored),
        )
    };
    assert!(got[0].is_ok());
    assert!(
        matches!(&got[1], Err(BlockError::Node(m)) if m.contains("does not fit")),
        "{:?}",
        got[1]
    );
}

#[test]
fn cancel_stops_between_chunks_after_the_copies_in_flight() {
    let dev = HostDevice::new(0);
    let cancel = CancelToken::new();
    let mut slot = StagingSlot::new(dev.as_ref(), 4096).unwrap();
    let region = slot.pinned().region().clone();
    let stored: Stored = Arc::new(Mutex::new((0..8).map(|i| (i, pattern(i, 4096))).collect()));
    let (dst, blocks) = layout(&dev, &[4096; 8]);
    // The copies of chunk 2 are slow: the call must still wait for them before it returns.
    let gate: Arc<(Mutex<Vec<String>>, Condvar)> = Arc::default();
    let g = gate.clone();
    dev.set_hook(Some(Arc::new(move |c: &CopyEvent| {
        if c.tag == 2 {
            wait_for(&g, "cancelled")?;
        }
        Ok(())
    })));
    let mut fetch = fetch_from(region.clone(), stored.clone());
    let (c2, g2) = (cancel.clone(), gate.clone());
    // SAFETY: the blocks are inside `dst`, an allocation of `dev`.
    let got = unsafe {
        get_into(
            &mut slot,
            &blocks,
            MAX_KEYS,
            Some(&cancel),
            |c: &ChunkRequest<'_>| {
                let r = fetch(c);
                if c.blocks[0] == 2 {
                    c2.cancel();
                    note(&g2, "cancelled".into());
                }
                r
            },
        )
    };
    for (i, r) in got.iter().enumerate() {
        let mut back = vec![0u8; 4096];
        dev.download(&dst, i as u64 * 4096, &mut back).unwrap();
        if i <= 2 {
            assert_eq!(r.as_ref().unwrap(), &Some(4096), "block {i}");
            assert_eq!(
                back,
                pattern(i, 4096),
                "block {i} was not copied before the return"
            );
        } else {
            assert!(matches!(r, Err(BlockError::Cancelled)), "block {i}: {r:?}");
            assert!(back.iter().all(|&b| b == 0));
        }
    }
    // Put: cancelled from the node call of chunk 1; chunk 1 is stored, the rest is not.
    let cancel = CancelToken::new();
    let (_src, blocks) = layout(&dev, &[4096; 8]);
    let stored: Stored = Arc::default();
    let mut store = store_into(region, stored.clone());
    let c2 = cancel.clone();
    // SAFETY: the blocks are inside `src`, an allocation of `dev`.
    let put = unsafe {
        put_from(
            &mut slot,
            &blocks,
            MAX_KEYS,
            Some(&cancel),
            |c: &ChunkRequest<'_>| {
                if c.blocks[0] == 1 {
                    c2.cancel();
                }
                store(c)
            },
        )
    };
    assert!(put[0].is_ok() && put[1].is_ok(), "{put:?}");
    assert!(
        put[2..]
            .iter()
            .all(|r| matches!(r, Err(BlockError::Cancelled))),
        "{put:?}"
    );
    assert_eq!(stored.lock().unwrap().len(), 2);
}

#[test]
fn the_host_device_refuses_memory_it_does_not_own() {
    let dev = HostDevice::new(3);
    let mem = dev.alloc(4096).unwrap();
    assert!(dev.check(&mem).is_ok());
    assert!(dev.check(&mem.slice(4000, 96).unwrap()).is_ok());
    let past = DeviceMemory { len: 4097, ..mem };
    assert!(dev.check(&past).is_err());
    let other = DeviceMemory { ordinal: 1, ..mem };
    assert!(dev.check(&other).is_err());
    assert!(mem.slice(4000, 97).is_err());
    // A copy to an address outside every allocation fails, and says so at synchronize.
    let mut s = dev.stream().unwrap();
    let src = [1u8; 16];
    // SAFETY: `src` outlives the synchronize below; the device address is bogus on purpose,
    // and the host device checks it instead of writing.
    unsafe { s.copy_to_device(9, 0x1000, src.as_ptr(), 16).unwrap() };
    let failed = s.synchronize();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].0, 9);
    // SAFETY: no copy of `mem` is in flight.
    unsafe { dev.free(mem).unwrap() };
    assert!(dev.check(&mem).is_err());
}
