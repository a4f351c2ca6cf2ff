//! Crash recovery on both backends: damaged bytes and a torn last region are skipped and
//! counted; every intact record comes back, none of the damaged ones do.

mod common;

use std::collections::BTreeMap;

use common::{value, Backend};
use yutu_blockstore::{Location, RegionStore, StoreConfig};

fn config() -> StoreConfig {
    StoreConfig {
        region_size: 128 << 10,
        write_chunk: 32 << 10,
        max_inflight_writes: 4,
        ..StoreConfig::default()
    }
}

async fn open<B: Backend>(b: &B) -> RegionStore<B::Dev> {
    RegionStore::open(b.open().await, config())
        .await
        .expect("store opens")
}

fn len_of(i: u64) -> usize {
    1000 + (i as usize * 733) % 12_000
}

/// Device byte offset of `loc` plus `delta`.
fn at(loc: &Location, delta: u64) -> u64 {
    u64::from(loc.region()) * config().region_size + u64::from(loc.offset()) + delta
}

fn flip<B: Backend>(dev: &B, offset: u64) {
    let mut b = dev.peek(offset, 1);
    b[0] ^= 0x5A;
    dev.poke(offset, &b);
}

async fn damaged_records_are_skipped_and_intact_ones_found<B: Backend>() {
    let dev = B::create(1 << 20); // 8 regions of 128 KiB
    let store = open(&dev).await;
    let mut written: BTreeMap<String, (u64, Location)> = BTreeMap::new();
    let mut order = Vec::new();
    for i in 0..80u64 {
        let key = format!("rec/{i:03}");
        let put = store
            .append("b", &key, &value(i, len_of(i)))
            .await
            .expect("append");
        assert!(put.reclaimed.is_empty());
        written.insert(key.clone(), (i, put.location));
        order.push(key);
    }
    store.close().await.expect("close");

    // Records per region, in write order.
    let mut by_region: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for key in &order {
        by_region
            .entry(written[key].1.generation())
            .or_default()
            .push(key.clone());
    }
    let regions: Vec<&Vec<String>> = by_region.values().collect();
    assert!(regions.len() >= 4, "records span several regions");
    // A: payload damage in the oldest region (its header still checks out).
    let a = regions[0][1].clone();
    flip(&dev, at(&written[&a].1, 72 + 1 + 7 + 500));
    // B: header damage (the sequence number) in the middle of the second region.
    let b = regions[1][1].clone();
    flip(&dev, at(&written[&b].1, 25));
    // C: the last region is torn in the middle of its last record, as if the device lost
    // everything after that point.
    let c = order.last().expect("records").clone();
    let c_loc = written[&c].1;
    let cut = at(&c_loc, c_loc.record_len() / 2);
    let region_end = (u64::from(c_loc.region()) + 1) * config().region_size;
    dev.poke(cut, &vec![0u8; (region_end - cut) as usize]);
    let damaged = [a.clone(), b.clone(), c.clone()];

    let store = open(&dev).await;
    let report = store.recovery_report();
    assert_eq!(report.corrupt_records, 3, "{report:?}");
    assert_eq!(report.resumed_region, Some(c_loc.region()));
    assert_eq!(store.stats().corrupt_records, 3);
    assert_eq!(store.len(), written.len() - damaged.len());
    for (key, (i, _)) in &written {
        let got = store.read_key("b", key).await.expect("read");
        if damaged.contains(key) {
            assert!(got.is_none(), "damaged record {key} served");
        } else {
            assert_eq!(got.as_deref(), Some(&value(*i, len_of(*i))[..]), "{key}");
        }
    }

    // Appends continue in the torn region, over the torn bytes, and everything survives
    // another restart.
    for i in 100..110u64 {
        store
            .append("b", &format!("new/{i}"), &value(i, len_of(i)))
            .await
            .expect("append after recovery");
    }
    store.close().await.expect("close");
    let store = open(&dev).await;
    // The torn record was overwritten; A's and B's damage is still there.
    assert_eq!(store.recovery_report().corrupt_records, 2);
    for i in 100..110u64 {
        assert_eq!(
            store
                .read_key("b", &format!("new/{i}"))
                .await
                .expect("read")
                .as_deref(),
            Some(&value(i, len_of(i))[..])
        );
    }
    for key in &damaged {
        assert!(store.get("b", key).is_none());
    }
    assert_eq!(store.len(), written.len() - damaged.len() + 10);
}

async fn damaged_region_header_loses_only_that_region<B: Backend>() {
    let dev = B::create(1 << 20);
    let store = open(&dev).await;
    let mut locs = Vec::new();
    for i in 0..40u64 {
        let put = store
            .append("b", &format!("k{i:03}"), &value(i, 8000))
            .await
            .expect("append");
        locs.push(put.location);
    }
    store.close().await.expect("close");
    let victim = locs[0].region();
    flip(&dev, u64::from(victim) * config().region_size + 44);

    let store = open(&dev).await;
    let report = store.recovery_report();
    assert_eq!(report.corrupt_regions, 1);
    for (i, loc) in locs.iter().enumerate() {
        let got = store
            .read_key("b", &format!("k{i:03}"))
            .await
            .expect("read");
        if loc.region() == victim {
            assert!(got.is_none());
        } else {
            assert_eq!(got.as_deref(), Some(&value(i as u64, 8000)[..]));
        }
    }
    // The region is reused: the store keeps working past its old capacity.
    for i in 0..120u64 {
        store
            .append("b", &format!("more{i:03}"), &value(i, 8000))
            .await
            .expect("append");
    }
    assert!(store.stats().regions_reclaimed > 0);
}

async fn other_layouts_are_refused_or_discarded<B: Backend>() {
    let dev = B::create(1 << 20);
    let store = open(&dev).await;
    store.append("b", "k", b"v").await.expect("append");
    store.close().await.expect("close");
    // Same device opened as shard 0 of 2: region 0 says "shard 0 of 1".
    let cfg = StoreConfig {
        nshards: 2,
        ..config()
    };
    match RegionStore::open(dev.open().await, cfg.clone()).await {
        Err(yutu_blockstore::StoreError::ForeignRegion { nshards: 1, .. }) => {}
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("foreign layout accepted"),
    }
    let store = RegionStore::open(
        dev.open().await,
        StoreConfig {
            discard_foreign: true,
            ..cfg
        },
    )
    .await
    .expect("discarding opens");
    assert!(store.is_empty());
    assert!(store.recovery_report().foreign_regions >= 1);
}

both_backends!(
    damaged_records_are_skipped_and_intact_ones_found,
    damaged_region_header_loses_only_that_region,
    other_layouts_are_refused_or_discarded,
);
