//! Device (GPU) buffers through the real node, on the host-memory device: `batch_put_from`
//! and `batch_get_into` take a `DeviceBuffer` exactly like a host `Buffer`, the blocks are
//! staged through pinned buffers, and a failing device copy fails its block only. The same
//! calls on a real GPU are in `gpu.rs` (skipped where there is none).

use std::sync::Arc;

use yutu_client::kv::{
    BlockError, Device, DeviceBuffer, DeviceMemory, HostDevice, KvClient, KvError, KvOptions,
};
use yutu_tests::{pattern, Server};
use yutu_transfer::device::{CopyDirection, CopyEvent};

fn node() -> Server {
    let server = Server::start(&["--memory", "768MiB", "--max-object-size", "128MiB"]);
    assert_eq!(server.client().put("/gpu", b"").status, 200);
    server
}

/// Device memory of `len` bytes on `dev`, registered with `kv`.
fn device_buffer(kv: &KvClient, dev: &Arc<HostDevice>, len: u64) -> DeviceBuffer {
    let mem = dev.alloc(len).expect("device memory");
    // SAFETY: `mem` is an allocation of `dev`, which the test keeps alive (and never frees)
    // for as long as the buffer is used.
    unsafe { kv.register_device(dev.clone(), mem) }.expect("register device memory")
}

fn layout(lens: &[u64]) -> Vec<u64> {
    let mut at = 0;
    lens.iter()
        .map(|&l| {
            let o = at;
            at += l.next_multiple_of(4096);
            o
        })
        .collect()
}

/// Puts blocks of `lens` from device memory, reads them back through S3 and into a second
/// device buffer, and from a host buffer into device memory; every byte is checked.
fn round_trip(kv: &KvClient, dev: &Arc<HostDevice>, lens: &[u64], tag: &str) {
    let offsets = layout(lens);
    let total = offsets.last().unwrap() + lens.last().unwrap();
    let src = device_buffer(kv, dev, total);
    let keys: Vec<String> = (0..lens.len()).map(|i| format!("{tag}-{i}")).collect();
    let data: Vec<Vec<u8>> = lens
        .iter()
        .enumerate()
        .map(|(i, &l)| pattern(l as usize, i as u64 + 77))
        .collect();
    for (i, d) in data.iter().enumerate() {
        dev.upload(src.memory(), offsets[i], d).unwrap();
    }
    let etags = kv
        .batch_put_from("gpu", &keys, &src, &offsets, lens)
        .expect("put from device memory");
    assert_eq!(etags.len(), keys.len());
    assert!(etags.iter().all(|e| !e.is_empty()));
    // The node holds the bytes (read through S3, not through the staging path).
    for (i, k) in keys.iter().enumerate().step_by(lens.len().div_ceil(8)) {
        let got = kv.get_bytes("gpu", k).unwrap().expect("stored");
        assert!(got == data[i], "{k}: stored bytes differ");
    }
    // Into another device buffer.
    let dst = device_buffer(kv, dev, total);
    let copied = kv
        .batch_get_into("gpu", &keys, &dst, &offsets)
        .expect("get into device memory");
    for (i, d) in data.iter().enumerate() {
        assert_eq!(copied[i], Some(lens[i]), "block {i}");
        let mut back = vec![0u8; d.len()];
        dev.download(dst.memory(), offsets[i], &mut back).unwrap();
        assert!(
            back == *d,
            "block {i} ({} bytes) differs on the device",
            d.len()
        );
    }
    // From a host buffer into device memory, and from device memory into a host buffer.
    let host = kv.register(total).expect("host buffer");
    for (i, d) in data.iter().enumerate() {
        host.write_at(offsets[i], d).unwrap();
    }
    let rekeys: Vec<String> = keys.iter().map(|k| format!("{k}-h")).collect();
    kv.batch_put_from("gpu", &rekeys, &host, &offsets, lens)
        .expect("put from host");
    let dst2 = device_buffer(kv, dev, total);
    let copied = kv
        .batch_get_into("gpu", &rekeys, &dst2, &offsets)
        .expect("get into device");
    let host2 = kv.register(total).expect("host buffer");
    let copied_h = kv
        .batch_get_into("gpu", &keys, &host2, &offsets)
        .expect("get into host");
    for (i, d) in data.iter().enumerate() {
        assert_eq!(copied[i], Some(lens[i]));
        assert_eq!(copied_h[i], Some(lens[i]));
        let mut back = vec![0u8; d.len()];
        dev.download(dst2.memory(), offsets[i], &mut back).unwrap();
        assert!(back == *d, "host→device block {i} differs");
        host2.read_at(offsets[i], &mut back).unwrap();
        assert!(back == *d, "device→host block {i} differs");
    }
}

#[test]
fn device_blocks_of_4_kib_to_64_mib_round_trip_through_the_node() {
    let server = node();
    let dev = HostDevice::new(0);
    for shm in [true, false] {
        let kv = KvClient::new(
            &server.url,
            KvOptions {
                shm,
                ..KvOptions::default()
            },
        )
        .expect("client");
        round_trip(
            &kv,
            &dev,
            &[4 << 10, 64 << 10, (1 << 20) + 3, 16 << 20, 64 << 20],
            &format!("sizes-{shm}"),
        );
    }
}

#[test]
fn many_device_blocks_per_batch_cross_several_chunks() {
    let server = node();
    let dev = HostDevice::new(0);
    let kv = KvClient::new(&server.url, KvOptions::default()).expect("client");
    // 1,500 blocks of 100 KiB: about 150 MiB, three chunks of a 64 MiB half.
    round_trip(&kv, &dev, &vec![100 << 10; 1500], "many");
    // Absent keys are None, as into host memory.
    let buf = device_buffer(&kv, &dev, 1 << 20);
    let keys = vec!["many-0".to_string(), "no-such".to_string()];
    assert_eq!(
        kv.batch_get_into("gpu", &keys, &buf, &[0, 512 << 10])
            .unwrap(),
        vec![Some(100 << 10), None]
    );
}

#[test]
fn a_failing_device_copy_fails_its_block_and_the_others_land() {
    let server = node();
    let dev = HostDevice::new(0);
    let kv = KvClient::new(&server.url, KvOptions::default()).expect("client");
    // 48 blocks of 4 MiB: three chunks of a 64 MiB half.
    let n = 48;
    let len = 4u64 << 20;
    let lens = vec![len; n];
    let offsets = layout(&lens);
    let keys: Vec<String> = (0..n).map(|i| format!("fail-{i}")).collect();
    let data: Vec<Vec<u8>> = (0..n).map(|i| pattern(len as usize, i as u64)).collect();
    let src = device_buffer(&kv, &dev, n as u64 * len);
    for (i, d) in data.iter().enumerate() {
        dev.upload(src.memory(), offsets[i], d).unwrap();
    }
    // Put: the device-to-host copy of block 5 fails (in the first chunk) and of block 40
    // (in the third).
    dev.set_hook(Some(Arc::new(|c: &CopyEvent| {
        if c.direction == CopyDirection::ToHost && (c.tag == 5 || c.tag == 40) {
            Err("injected device fault".into())
        } else {
            Ok(())
        }
    })));
    let err = kv
        .batch_put_from("gpu", &keys, &src, &offsets, &lens)
        .expect_err("two blocks fail");
    let KvError::Blocks(f) = err else {
        panic!("not a per-block failure: {err}")
    };
    assert_eq!(
        f.failed.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
        vec![5, 40]
    );
    assert!(matches!(f.failed[0].1, BlockError::Copy(_)));
    assert!(f.to_string().contains("2 of 48 blocks failed"), "{f}");
    assert!(f.etags[5].is_none() && f.etags[40].is_none());
    assert!(f.etags[4].as_ref().is_some_and(|e| !e.is_empty()));
    let exists = kv.batch_exists("gpu", &keys).unwrap();
    for (i, e) in exists.iter().enumerate() {
        assert_eq!(*e, i != 5 && i != 40, "block {i}");
    }
    // Get: the copy of block 7 into the device fails; the others are right.
    dev.set_hook(Some(Arc::new(|c: &CopyEvent| {
        if c.direction == CopyDirection::ToDevice && c.tag == 7 {
            Err("injected device fault".into())
        } else {
            Ok(())
        }
    })));
    let dst = device_buffer(&kv, &dev, n as u64 * len);
    let err = kv
        .batch_get_into("gpu", &keys, &dst, &offsets)
        .expect_err("block 7 fails");
    let KvError::Blocks(f) = err else {
        panic!("not a per-block failure: {err}")
    };
    let failed: Vec<usize> = f.failed.iter().map(|(i, _)| *i).collect();
    assert_eq!(failed, vec![7]);
    for i in 0..n {
        let mut back = vec![0u8; len as usize];
        dev.download(dst.memory(), offsets[i], &mut back).unwrap();
        match i {
            7 => assert!(back.iter().all(|&b| b == 0), "the failed block was written"),
            5 | 40 => assert_eq!(f.copied[i], None, "never stored"),
            _ => {
                assert_eq!(f.copied[i], Some(len), "block {i}");
                assert!(back == data[i], "block {i} differs");
            }
        }
    }
    dev.set_hook(None);
}

#[test]
fn a_whole_registered_cache_stages_only_what_a_call_needs() {
    // An engine registers its whole KV cache once and gets a few blocks at a time: the last
    // block's room runs to the end of the cache, and must not become a staging buffer that
    // size (pinned, and rebuilt on every call).
    let server = node();
    let dev = HostDevice::new(0);
    let kv = KvClient::new(&server.url, KvOptions::default()).expect("client");
    let cache = device_buffer(&kv, &dev, 2 << 30);
    let keys: Vec<String> = (0..8).map(|i| format!("cache-{i}")).collect();
    let offsets: Vec<u64> = (0..8).map(|i| i << 20).collect();
    let lens = vec![1u64 << 20; 8];
    for (i, &off) in offsets.iter().enumerate() {
        dev.upload(cache.memory(), off, &pattern(1 << 20, i as u64))
            .unwrap();
    }
    kv.batch_put_from("gpu", &keys, &cache, &offsets, &lens)
        .expect("put");
    let back: Vec<u64> = offsets.iter().map(|o| o + (1 << 30)).collect();
    for round in 0..3 {
        let copied = kv.batch_get_into("gpu", &keys, &cache, &back).expect("get");
        assert!(copied.iter().all(|c| *c == Some(1 << 20)), "round {round}");
    }
    for (i, &off) in back.iter().enumerate() {
        let mut got = vec![0u8; 1 << 20];
        dev.download(cache.memory(), off, &mut got).unwrap();
        assert!(got == pattern(1 << 20, i as u64), "block {i}");
    }
    let (count, largest) = dev.pinned_allocated();
    assert_eq!(count, 1, "one pooled staging buffer serves every call");
    assert_eq!(
        largest,
        2 * yutu_client::kv::STAGING_HALF,
        "of the pooled size"
    );
}

#[test]
fn bad_device_arguments_get_clear_errors() {
    let server = node();
    let dev = HostDevice::new(0);
    let kv = KvClient::new(&server.url, KvOptions::default()).expect("client");
    // Memory the device does not own, or another device's.
    let bogus = DeviceMemory {
        ordinal: 0,
        ptr: 0x1000,
        len: 4096,
    };
    // SAFETY: registration is refused before anything touches the memory.
    let err = unsafe { kv.register_device(dev.clone(), bogus) }.expect_err("refused");
    assert!(matches!(err, KvError::Device(_)), "{err}");
    let mem = dev.alloc(8192).unwrap();
    let other = DeviceMemory { ordinal: 1, ..mem };
    // SAFETY: as above.
    assert!(unsafe { kv.register_device(dev.clone(), other) }.is_err());
    // A range past the buffer's end.
    let buf = device_buffer(&kv, &dev, 8192);
    let keys = vec!["x".to_string()];
    let err = kv
        .batch_put_from("gpu", &keys, &buf, &[4096], &[8192])
        .expect_err("past the end");
    assert!(matches!(err, KvError::InvalidArgument(_)), "{err}");
    // A buffer of another client.
    let kv2 = KvClient::new(&server.url, KvOptions::default()).expect("client");
    let err = kv2
        .batch_get_into("gpu", &keys, &buf, &[0])
        .expect_err("another client's buffer");
    assert!(err.to_string().contains("another KvClient"), "{err}");
    // The node's own errors come back whole, code included.
    dev.upload(buf.memory(), 0, b"x").unwrap();
    let err = kv
        .batch_put_from("no-such-bucket", &keys, &buf, &[0], &[1])
        .expect_err("no bucket");
    assert_eq!(err.code(), Some("NoSuchBucket"), "{err}");
    let err = kv
        .batch_get_into("no-such-bucket", &keys, &buf, &[0])
        .expect_err("no bucket");
    assert_eq!(err.code(), Some("NoSuchBucket"), "{err}");
    // A staging buffer whose node call failed is never lent again: after a timeout the node
    // could still be writing it, or reading it for a put that would store the next call's
    // bytes. Each failed call above took a fresh one.
    assert_eq!(dev.pinned_allocated().0, 2);
    assert!(
        kv.device_path().starts_with("staged:"),
        "{}",
        kv.device_path()
    );
    // Without an RDMA device the buffer is not registered with a NIC, and says why.
    assert!(!buf.gpudirect());
    assert!(
        buf.path().starts_with("staged: no RDMA path"),
        "{}",
        buf.path()
    );
}
