//! The region store's behaviour on both backends: write, read, delete, list, durability,
//! reclamation and restart.

mod common;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use common::{value, Backend};
use yutu_blockstore::{ReclaimAction, ReclaimCandidate, RegionStore, StoreConfig, StoreError};

fn config(region_size: u64, write_chunk: usize) -> StoreConfig {
    StoreConfig {
        region_size,
        write_chunk,
        max_inflight_writes: 4,
        ..StoreConfig::default()
    }
}

async fn open<B: Backend>(b: &B, cfg: &StoreConfig) -> RegionStore<B::Dev> {
    RegionStore::open(b.open().await, cfg.clone())
        .await
        .expect("store opens")
}

async fn write_read_across_chunks_and_regions<B: Backend>() {
    let dev = B::create(4 << 20);
    let cfg = config(256 << 10, 64 << 10);
    let store = open(&dev, &cfg).await;
    let sizes = [
        0usize,
        1,
        7,
        100,
        4096,
        5000,
        70 << 10,
        200 << 10,
        3,
        64 << 10,
    ];
    let mut expect = BTreeMap::new();
    for round in 0..3u64 {
        for (i, &len) in sizes.iter().enumerate() {
            let key = format!("obj/{round}/{i:02}");
            let v = value(round * 100 + i as u64, len);
            let put = store
                .append_with_meta("bkt", &key, meta_of(&key).as_bytes(), &v)
                .await
                .expect("append");
            assert!(put.reclaimed.is_empty(), "nothing to reclaim yet");
            assert_eq!(put.location.value_len(), len as u64);
            // Readable at once, from the region buffer.
            assert_eq!(store.read(put.location).await.expect("read fresh"), v);
            expect.insert(key, v);
        }
    }
    store.flush().await.expect("flush");
    // After the flush most chunks are on disk only; read everything back.
    for (key, v) in &expect {
        let loc = store.get("bkt", key).expect("indexed");
        assert_eq!(&store.read(loc).await.expect("read"), v, "{key}");
        assert_eq!(
            store
                .read_key("bkt", key)
                .await
                .expect("read_key")
                .as_deref(),
            Some(&v[..])
        );
    }
    let listed: Vec<String> = store
        .list("bkt", "obj/1/", None, 100)
        .into_iter()
        .map(|l| {
            assert_eq!(
                l.meta,
                meta_of(&l.key).as_bytes(),
                "listing carries metadata"
            );
            l.key
        })
        .collect();
    let want: Vec<String> = expect
        .keys()
        .filter(|k| k.starts_with("obj/1/"))
        .cloned()
        .collect();
    assert_eq!(listed, want);
    assert_eq!(store.buckets(), ["bkt"]);
    let st = store.stats();
    assert_eq!(st.records, expect.len() as u64);
    assert!(st.live_bytes >= expect.values().map(|v| v.len() as u64).sum::<u64>());
    assert!(st.used_bytes >= st.live_bytes);
    assert!(
        st.regions_sealed >= 3,
        "records spilled over several regions"
    );
    assert_eq!(st.corrupt_records, 0);
    assert_eq!(st.writes_in_flight, 0);
    store.close().await.expect("close");

    let store = open(&dev, &cfg).await;
    assert_eq!(store.len(), expect.len());
    for (key, v) in &expect {
        // Metadata is back in DRAM without reading the record.
        assert_eq!(
            store.meta("bkt", key).as_deref(),
            Some(meta_of(key).as_bytes())
        );
        let rec = store
            .read_key_record("bkt", key)
            .await
            .expect("read")
            .expect("present after restart");
        assert_eq!(rec.value, v[..], "{key} after restart");
        assert_eq!(rec.meta, meta_of(key).as_bytes());
    }
}

fn meta_of(key: &str) -> String {
    format!("etag=\"{}\";type=application/octet-stream", key.len())
}

async fn overwrite_and_delete_survive_restart<B: Backend>() {
    let dev = B::create(2 << 20);
    let cfg = config(128 << 10, 32 << 10);
    let store = open(&dev, &cfg).await;
    store.append("b", "k1", b"first").await.expect("put");
    store.append("b", "k1", b"second").await.expect("put");
    store.append("b", "k2", b"doomed").await.expect("put");
    store.append("b", "k3", b"old").await.expect("put");
    let del = store.delete("b", "k2").await.expect("delete");
    assert!(del.existed);
    assert!(!store.delete("b", "nope").await.expect("delete").existed);
    store.delete("b", "k3").await.expect("delete");
    store.append("b", "k3", b"reborn").await.expect("put");
    assert!(store.get("b", "k2").is_none());
    store
        .sync_seq(del.seq.expect("tombstone seq"))
        .await
        .expect("sync");
    store.flush().await.expect("flush");
    drop(store);

    let store = open(&dev, &cfg).await;
    assert_eq!(
        store.read_key("b", "k1").await.expect("read").as_deref(),
        Some(&b"second"[..])
    );
    assert_eq!(store.read_key("b", "k2").await.expect("read"), None);
    assert_eq!(
        store.read_key("b", "k3").await.expect("read").as_deref(),
        Some(&b"reborn"[..])
    );
    assert_eq!(store.len(), 2);
    // Sequence numbers continue after the recovered ones.
    let put = store.append("b", "k4", b"new").await.expect("put");
    assert!(put.location.seq() > store.get("b", "k3").expect("k3").seq());
}

async fn sync_makes_records_durable<B: Backend>() {
    let dev = B::create(2 << 20);
    let cfg = config(128 << 10, 32 << 10);
    let store = open(&dev, &cfg).await;
    let a = store.append("b", "a", &value(1, 3000)).await.expect("put");
    assert!(!store.is_durable(&a.location));
    store.sync(&a.location).await.expect("sync");
    assert!(store.is_durable(&a.location));
    let b = store.append("b", "b", &value(2, 10)).await.expect("put");
    assert!(!store.is_durable(&b.location));
    // Concurrent syncs share flushes and all return.
    let store = Rc::new(store);
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let s = store.clone();
            glommio::spawn_local(async move {
                let put = s
                    .append("b", &format!("c{i}"), &value(i, 100))
                    .await
                    .expect("put");
                s.sync(&put.location).await.expect("sync");
                assert!(s.is_durable(&put.location));
            })
        })
        .collect();
    for t in tasks {
        t.await;
    }
    assert!(store.is_durable(&b.location));
    assert!(store.stats().durable_seq >= b.location.seq());
}

async fn unsynced_records_are_lost_whole_on_crash<B: Backend>() {
    let dev = B::create(2 << 20);
    let cfg = config(128 << 10, 16 << 10);
    let store = open(&dev, &cfg).await;
    for i in 0..10u64 {
        store
            .append("b", &format!("synced{i}"), &value(i, 5000))
            .await
            .expect("put");
    }
    store.flush().await.expect("flush");
    for i in 0..10u64 {
        store
            .append("b", &format!("unsynced{i}"), &value(100 + i, 5000))
            .await
            .expect("put");
    }
    // Full chunks reached the device; the partly filled one only lived in memory.
    store.wait_writes().await;
    drop(store);

    let store = open(&dev, &cfg).await;
    for i in 0..10u64 {
        assert_eq!(
            store
                .read_key("b", &format!("synced{i}"))
                .await
                .expect("read")
                .as_deref(),
            Some(&value(i, 5000)[..])
        );
    }
    // Unsynced records are either absent or exact, never damaged.
    let mut survived = 0;
    for i in 0..10u64 {
        if let Some(v) = store
            .read_key("b", &format!("unsynced{i}"))
            .await
            .expect("read")
        {
            assert_eq!(v, value(100 + i, 5000));
            survived += 1;
        }
    }
    assert!(survived < 10, "the last chunk was never written");
}

async fn stale_and_corrupt_reads_are_errors<B: Backend>() {
    let dev = B::create(1 << 20);
    let cfg = config(128 << 10, 32 << 10);
    let store = open(&dev, &cfg).await;
    // A value larger than a chunk: its first chunks are on disk once written.
    let big = value(7, 100 << 10);
    let put = store.append("b", "big", &big).await.expect("put");
    store.append("b", "small", b"x").await.expect("put");
    store.flush().await.expect("flush");
    let loc = put.location;
    let at = u64::from(loc.region()) * cfg.region_size + u64::from(loc.offset()) + 200;
    let mut byte = dev.peek(at, 1);
    byte[0] ^= 0x40;
    dev.poke(at, &byte);
    match store.read(loc).await {
        Err(StoreError::Corrupt { .. }) => {}
        other => panic!("corrupt value served: {other:?}"),
    }
    assert!(store.get("b", "big").is_none(), "corrupt entry dropped");
    assert_eq!(store.stats().corrupt_records, 1);

    let too_big = vec![0u8; cfg.region_size as usize];
    assert!(matches!(
        store.append("b", "huge", &too_big).await,
        Err(StoreError::TooLarge { .. })
    ));
    let max = store.max_value_len("b", "huge", 0) as usize;
    store
        .append("b", "huge", &vec![1u8; max])
        .await
        .expect("largest value fits");
    assert!(matches!(
        store.append("b", &"k".repeat(70_000), b"v").await,
        Err(StoreError::TooLong { .. })
    ));
}

/// Appends `n` values of `len` bytes named `{prefix}{i}`; returns every reclamation report.
async fn fill<D: yutu_blockstore::Bdev + 'static>(
    store: &RegionStore<D>,
    prefix: &str,
    n: u64,
    len: usize,
) -> Vec<yutu_blockstore::Reclaimed> {
    let mut reports = Vec::new();
    for i in 0..n {
        let put = store
            .append("b", &format!("{prefix}{i:03}"), &value(i, len))
            .await
            .expect("append");
        reports.extend(put.reclaimed);
    }
    reports
}

async fn reclaim_drops_oldest_regions_first<B: Backend>() {
    // 4 regions of 64 KiB: ~5 values of 10 KiB each per region.
    let dev = B::create(256 << 10);
    let cfg = config(64 << 10, 16 << 10);
    let store = open(&dev, &cfg).await;
    let first = store
        .append("b", "k000", &value(0, 10_000))
        .await
        .expect("put");
    let reports = fill(&store, "k", 40, 10_000).await;
    assert!(!reports.is_empty(), "the store had to reclaim");
    let dropped: Vec<String> = reports
        .iter()
        .flat_map(|r| r.dropped.iter().map(|o| o.key.clone()))
        .collect();
    assert!(dropped.contains(&"k000".to_owned()), "oldest went first");
    // Reclamation is oldest first: everything dropped is older than everything kept.
    let kept: Vec<String> = store
        .list("b", "", None, 1000)
        .into_iter()
        .map(|l| l.key)
        .collect();
    let newest_dropped = dropped.iter().max().expect("dropped some");
    assert!(
        kept.iter().all(|k| k > newest_dropped),
        "{kept:?} vs {dropped:?}"
    );
    assert!(kept.contains(&"k039".to_owned()));
    let st = store.stats();
    assert_eq!(st.regions_reclaimed, reports.len() as u64);
    assert_eq!(st.entries_dropped, dropped.len() as u64);
    assert!(st.regions_free >= 1, "a region is kept free");
    // The first version of k000 was overwritten by fill(); its location is long gone.
    assert!(matches!(
        store.read(first.location).await,
        Err(StoreError::Stale { .. })
    ));
    for k in &kept {
        let i: u64 = k[1..].parse().expect("numbered key");
        assert_eq!(
            store.read_key("b", k).await.expect("read").as_deref(),
            Some(&value(i, 10_000)[..])
        );
    }
    store.flush().await.expect("flush");
    drop(store);

    let store = open(&dev, &cfg).await;
    let after: Vec<String> = store
        .list("b", "", None, 1000)
        .into_iter()
        .map(|l| l.key)
        .collect();
    assert_eq!(after, kept, "restart sees exactly the surviving entries");
}

async fn reclaim_policy_readmits_and_rewrites<B: Backend>() {
    let dev = B::create(512 << 10);
    let cfg = config(64 << 10, 16 << 10);
    let asked = Rc::new(RefCell::new(0u32));
    let counter = asked.clone();
    let policy = move |c: &ReclaimCandidate<'_>| {
        *counter.borrow_mut() += 1;
        if c.key.starts_with("hot/") {
            ReclaimAction::Readmit
        } else if c.key.starts_with("keep/") {
            ReclaimAction::Rewrite
        } else {
            ReclaimAction::Drop
        }
    };
    let store = RegionStore::open_with_policy(dev.open().await, cfg.clone(), Box::new(policy))
        .await
        .expect("open");
    // Interleave the three kinds so each region holds some of each.
    let mut reports = Vec::new();
    for i in 0..12u64 {
        for prefix in ["hot/", "keep/", "cold/"] {
            let key = format!("{prefix}{i:03}");
            let put = store
                .append_with_meta("b", &key, key.as_bytes(), &value(i, 3000))
                .await
                .expect("put");
            reports.extend(put.reclaimed);
        }
    }
    // Push the first regions out.
    reports.extend(fill(&store, "filler/", 60, 9000).await);
    assert!(!reports.is_empty());
    assert!(*asked.borrow() > 0, "the policy was consulted");
    let readmitted: Vec<_> = reports.iter().flat_map(|r| r.readmitted.iter()).collect();
    let rewritten: Vec<_> = reports.iter().flat_map(|r| r.rewritten.iter()).collect();
    assert!(!readmitted.is_empty() && !rewritten.is_empty());
    for r in &readmitted {
        assert!(r.key.starts_with("hot/"));
        let i: u64 = r.key[4..].parse().expect("numbered");
        assert_eq!(
            r.value,
            value(i, 3000),
            "re-admitted bytes are the stored ones"
        );
        assert_eq!(r.meta, r.key.as_bytes());
        assert!(
            store.get("b", &r.key).is_none(),
            "re-admitted entries leave the tier"
        );
    }
    for o in &rewritten {
        assert!(o.key.starts_with("keep/"));
    }
    for r in &reports {
        assert!(r.dropped.iter().all(|o| !o.key.starts_with("keep/")));
    }
    // Every keep/ entry is still there, with its bytes, and survives a restart.
    store.flush().await.expect("flush");
    drop(store);
    let store = open(&dev, &cfg).await;
    for i in 0..12u64 {
        let key = format!("keep/{i:03}");
        let rec = store
            .read_key_record("b", &key)
            .await
            .expect("read")
            .expect("rewritten entries stay");
        assert_eq!(rec.value, value(i, 3000), "{key}");
        assert_eq!(rec.meta, key.as_bytes(), "metadata moves with the entry");
    }
    for r in &readmitted {
        assert!(store.get("b", &r.key).is_none(), "{} came back", r.key);
    }
}

async fn concurrent_writers_and_readers<B: Backend>() {
    let dev = B::create(1 << 20);
    let cfg = config(64 << 10, 16 << 10);
    let store = Rc::new(open(&dev, &cfg).await);
    let tasks: Vec<_> = (0..4u64)
        .map(|t| {
            let s = store.clone();
            glommio::spawn_local(async move {
                for i in 0..60u64 {
                    let key = format!("t{t}/{i:03}");
                    let v = value(t * 1000 + i, 1000 + (i as usize * 97) % 9000);
                    let put = s.append("b", &key, &v).await.expect("append");
                    // Read something written a while ago: exact bytes or gone, never wrong.
                    if i >= 10 {
                        let old = format!("t{t}/{:03}", i - 10);
                        let want = value(t * 1000 + i - 10, 1000 + ((i - 10) as usize * 97) % 9000);
                        if let Some(got) = s.read_key("b", &old).await.expect("read") {
                            assert_eq!(got, want, "{old}");
                        }
                    }
                    if i % 7 == 0 {
                        s.sync(&put.location).await.expect("sync");
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await;
    }
    let st = store.stats();
    assert!(st.regions_reclaimed > 0);
    assert_eq!(st.corrupt_records, 0);
    assert_eq!(st.appended_records, 240);
}

/// Entries the policy keeps are never dropped, even when the region reclaimed is full of them
/// and the record that triggered the reclamation is large: it waits for the next region.
async fn rewrite_never_drops_a_full_region<B: Backend>() {
    // 8 regions of 64 KiB; records of 20 000 bytes: three fill a region.
    let dev = B::create(512 << 10);
    let cfg = config(64 << 10, 16 << 10);
    let policy = |_: &ReclaimCandidate<'_>| ReclaimAction::Rewrite;
    let store = RegionStore::open_with_policy(dev.open().await, cfg.clone(), Box::new(policy))
        .await
        .expect("open");
    let mut reports = Vec::new();
    // Six objects written once: two full regions of live records.
    for i in 0..6u64 {
        let put = store
            .append("b", &format!("keep/{i}"), &value(i, 20_000))
            .await
            .expect("put");
        reports.extend(put.reclaimed);
    }
    // Then one key overwritten until the log has wrapped around twice.
    for i in 0..60u64 {
        let put = store
            .append("b", "hot", &value(100 + i, 20_000))
            .await
            .expect("put");
        reports.extend(put.reclaimed);
    }
    assert!(store.stats().regions_reclaimed > 8);
    let dropped: Vec<_> = reports.iter().flat_map(|r| r.dropped.iter()).collect();
    assert!(dropped.is_empty(), "dropped {dropped:?}");
    for i in 0..6u64 {
        let got = store
            .read_key("b", &format!("keep/{i}"))
            .await
            .expect("read");
        assert_eq!(got.as_deref(), Some(&value(i, 20_000)[..]), "keep/{i}");
    }
}

both_backends!(
    write_read_across_chunks_and_regions,
    overwrite_and_delete_survive_restart,
    sync_makes_records_durable,
    unsynced_records_are_lost_whole_on_crash,
    stale_and_corrupt_reads_are_errors,
    reclaim_drops_oldest_regions_first,
    reclaim_policy_readmits_and_rewrites,
    concurrent_writers_and_readers,
    rewrite_never_drops_a_full_region,
);
