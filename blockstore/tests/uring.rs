//! The io_uring backend on real files (and, when run as root with `--ignored`, a loop block
//! device): O_DIRECT is really in use, bad I/O is refused, shards share one device.

mod common;

use std::rc::Rc;

use common::{run, value, Backend, File, TempDir};
use yutu_blockstore::{Bdev, BdevError, RegionStore, StoreConfig, UringBdev};

fn config(shard: u32, nshards: u32) -> StoreConfig {
    StoreConfig {
        region_size: 128 << 10,
        write_chunk: 32 << 10,
        max_inflight_writes: 4,
        ..StoreConfig::for_shard(shard, nshards)
    }
}

#[test]
fn blocks_round_trip_with_o_direct() {
    run(|| async {
        let dir = TempDir::new("blocks");
        let path = dir.path().join("dev.img");
        let dev = UringBdev::open_file(&path, 1 << 20).await.expect("open");
        // The file really is open with O_DIRECT, at the device's logical block size.
        let flags = std::fs::read_to_string(format!(
            "/proc/self/fdinfo/{}",
            std::fs::read_dir("/proc/self/fd")
                .expect("fds")
                .filter_map(|e| e.ok())
                .find(|e| std::fs::read_link(e.path()).is_ok_and(|p| p == path))
                .expect("device fd")
                .file_name()
                .to_string_lossy()
        ))
        .expect("fdinfo");
        let octal = flags
            .lines()
            .find_map(|l| l.strip_prefix("flags:"))
            .expect("flags line")
            .trim();
        let flags = i32::from_str_radix(octal, 8).expect("octal flags");
        assert_ne!(flags & libc::O_DIRECT, 0, "O_DIRECT not set");
        assert_eq!(dev.block_count() * dev.block_size() as u64, 1 << 20);

        let bs = dev.block_size();
        let mut buf = dev.alloc_buf(4 * bs);
        buf.as_bytes_mut().copy_from_slice(&value(3, 4 * bs));
        dev.write_blocks(8, Rc::new(buf)).await.expect("write");
        dev.flush().await.expect("flush");
        let back = dev.read_blocks(8, 4).await.expect("read");
        assert_eq!(back.as_ref(), &value(3, 4 * bs)[..]);
        // And it is in the file where it should be.
        let mut raw = vec![0u8; 4 * bs];
        std::os::unix::fs::FileExt::read_exact_at(
            &std::fs::File::open(&path).expect("open"),
            &mut raw,
            8 * bs as u64,
        )
        .expect("read the file");
        assert_eq!(raw, value(3, 4 * bs));

        let odd = dev.alloc_buf(bs);
        assert!(matches!(
            dev.write_blocks(dev.block_count(), Rc::new(odd)).await,
            Err(BdevError::OutOfRange { .. })
        ));
        assert!(matches!(
            dev.read_blocks(dev.block_count() - 1, 2).await,
            Err(BdevError::OutOfRange { .. })
        ));
    });
}

#[test]
fn tmpfs_is_refused() {
    run(|| async {
        let shm = std::path::Path::new("/dev/shm");
        if !shm.is_dir() {
            eprintln!("no /dev/shm; nothing to check");
            return;
        }
        let path = shm.join(format!("yutu-blockstore-tmpfs-{}", std::process::id()));
        let res = UringBdev::open_file(&path, 1 << 20).await;
        let _ = std::fs::remove_file(&path);
        match res {
            Err(BdevError::NoDirectIo { .. }) => {}
            Err(e) => panic!("unexpected error: {e}"),
            Ok(_) => panic!("a tmpfs file was accepted as an O_DIRECT device"),
        }
    });
}

#[test]
fn shards_share_one_file_and_keep_to_their_regions() {
    run(|| async {
        let dev = File::create(2 << 20);
        let s0 = RegionStore::open(dev.open().await, config(0, 2))
            .await
            .expect("shard 0");
        let s1 = RegionStore::open(dev.open().await, config(1, 2))
            .await
            .expect("shard 1");
        for i in 0..20u64 {
            let a = s0
                .append("b", &format!("zero/{i}"), &value(i, 9000))
                .await
                .expect("append");
            let b = s1
                .append("b", &format!("one/{i}"), &value(i + 50, 9000))
                .await
                .expect("append");
            assert_eq!(a.location.region() % 2, 0);
            assert_eq!(b.location.region() % 2, 1);
        }
        s0.close().await.expect("close");
        s1.close().await.expect("close");

        let s0 = RegionStore::open(dev.open().await, config(0, 2))
            .await
            .expect("shard 0");
        let s1 = RegionStore::open(dev.open().await, config(1, 2))
            .await
            .expect("shard 1");
        assert_eq!(s0.len(), 20);
        assert_eq!(s1.len(), 20);
        assert!(s0.list("b", "one/", None, 100).is_empty());
        assert!(s1.list("b", "zero/", None, 100).is_empty());
        for i in 0..20u64 {
            assert_eq!(
                s1.read_key("b", &format!("one/{i}"))
                    .await
                    .expect("read")
                    .as_deref(),
                Some(&value(i + 50, 9000)[..])
            );
        }
    });
}

#[test]
fn a_truncated_file_loses_only_its_cut_regions() {
    run(|| async {
        let dev = File::create(1 << 20); // 8 regions
        let store = RegionStore::open(dev.open().await, config(0, 1))
            .await
            .expect("open");
        let mut locs = Vec::new();
        for i in 0..60u64 {
            let put = store
                .append("b", &format!("k{i:03}"), &value(i, 8000))
                .await
                .expect("append");
            locs.push(put.location);
        }
        store.close().await.expect("close");
        let regions_used = locs.iter().map(|l| l.region()).max().expect("some") + 1;
        assert!(regions_used >= 4);
        // Cut the file in the middle of the last region written.
        let keep = (u64::from(regions_used) - 1) * (128 << 10) + (64 << 10);
        dev.truncate(keep);

        let bdev = UringBdev::open(&dev.path)
            .await
            .expect("reopen shorter file");
        let store = RegionStore::open(bdev, config(0, 1))
            .await
            .expect("open on the shorter device");
        assert_eq!(store.stats().regions_total, regions_used - 1);
        for (i, loc) in locs.iter().enumerate() {
            let got = store
                .read_key("b", &format!("k{i:03}"))
                .await
                .expect("read");
            if loc.region() + 1 == regions_used {
                assert!(got.is_none(), "record of the cut region served");
            } else {
                assert_eq!(got.as_deref(), Some(&value(i as u64, 8000)[..]));
            }
        }
    });
}

/// Needs root and loop devices: `cargo test -p yutu-blockstore --test uring -- --ignored`.
#[test]
#[ignore = "needs root and a free loop device"]
fn raw_block_device() {
    let dir = TempDir::new("loop");
    let img = dir.path().join("loop.img");
    std::fs::File::create(&img)
        .and_then(|f| f.set_len(4 << 20))
        .expect("image");
    let out = std::process::Command::new("losetup")
        .args(["--find", "--show", "--direct-io=on"])
        .arg(&img)
        .output()
        .expect("losetup runs");
    assert!(
        out.status.success(),
        "losetup: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let loopdev = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    struct Detach(String);
    impl Drop for Detach {
        fn drop(&mut self) {
            let _ = std::process::Command::new("losetup")
                .args(["-d", &self.0])
                .status();
        }
    }
    let _detach = Detach(loopdev.clone());
    let path = loopdev.clone();
    run(move || async move {
        let bdev = UringBdev::open(&path).await.expect("open the block device");
        assert_eq!(bdev.block_count() * bdev.block_size() as u64, 4 << 20);
        let store = RegionStore::open(bdev, config(0, 1)).await.expect("store");
        for i in 0..20u64 {
            store
                .append("b", &format!("k{i}"), &value(i, 20_000))
                .await
                .expect("append");
        }
        store.close().await.expect("close");
        let store = RegionStore::open(UringBdev::open(&path).await.expect("open"), config(0, 1))
            .await
            .expect("reopen");
        for i in 0..20u64 {
            assert_eq!(
                store
                    .read_key("b", &format!("k{i}"))
                    .await
                    .expect("read")
                    .as_deref(),
                Some(&value(i, 20_000)[..])
            );
        }
    });
}
