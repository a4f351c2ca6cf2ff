//! Power loss, simulated by a RAM device with a volatile write cache: whatever was not
//! covered by a flush is lost. These pin down what "durable" means for the server's
//! `durability=disk` buckets.

mod common;

use common::{run, value};
use yutu_blockstore::{RamBdev, ReclaimAction, ReclaimCandidate, RegionStore, StoreConfig};

fn config() -> StoreConfig {
    StoreConfig {
        region_size: 64 << 10,
        write_chunk: 16 << 10,
        max_inflight_writes: 4,
        ..StoreConfig::default()
    }
}

fn device() -> RamBdev {
    RamBdev::with_volatile_cache(512, (512 << 10) / 512)
}

/// What a crash looks like: in-flight writes finish, the buffer is lost, the cache is lost.
async fn power_loss(store: RegionStore<RamBdev>, dev: &RamBdev) {
    store.wait_writes().await;
    drop(store);
    dev.crash();
}

#[test]
fn only_synced_records_survive_power_loss() {
    run(|| async {
        let dev = device();
        let store = RegionStore::open(dev.clone(), config())
            .await
            .expect("open");
        let mut last = None;
        for i in 0..12u64 {
            let put = store
                .append("b", &format!("synced/{i}"), &value(i, 7000))
                .await
                .expect("append");
            last = Some(put.location);
        }
        store.sync(&last.expect("appended")).await.expect("sync");
        for i in 0..12u64 {
            store
                .append("b", &format!("unsynced/{i}"), &value(100 + i, 7000))
                .await
                .expect("append");
        }
        power_loss(store, &dev).await;

        let store = RegionStore::open(dev.clone(), config())
            .await
            .expect("reopen");
        for i in 0..12u64 {
            assert_eq!(
                store
                    .read_key("b", &format!("synced/{i}"))
                    .await
                    .expect("read")
                    .as_deref(),
                Some(&value(i, 7000)[..]),
                "synced/{i}"
            );
            assert!(store.get("b", &format!("unsynced/{i}")).is_none());
        }
        assert_eq!(store.recovery_report().corrupt_records, 0);
    });
}

#[test]
fn deletes_survive_power_loss_once_synced() {
    run(|| async {
        let dev = device();
        let store = RegionStore::open(dev.clone(), config())
            .await
            .expect("open");
        store.append("b", "gone", b"v1").await.expect("append");
        let kept = store.append("b", "kept", b"v2").await.expect("append");
        store.sync(&kept.location).await.expect("sync");
        let del = store.delete("b", "gone").await.expect("delete");
        store
            .sync_seq(del.seq.expect("tombstone written"))
            .await
            .expect("sync");
        // Deleted but not synced: the delete may be lost, the value must not be damaged.
        store.delete("b", "kept").await.expect("delete");
        power_loss(store, &dev).await;

        let store = RegionStore::open(dev.clone(), config())
            .await
            .expect("reopen");
        assert!(store.get("b", "gone").is_none(), "synced delete lost");
        assert_eq!(
            store.read_key("b", "kept").await.expect("read").as_deref(),
            Some(&b"v2"[..])
        );
    });
}

#[test]
fn rewritten_entries_survive_power_loss_after_reclaim() {
    run(|| async {
        let dev = device();
        let policy = |c: &ReclaimCandidate<'_>| {
            if c.key.starts_with("keep/") {
                ReclaimAction::Rewrite
            } else {
                ReclaimAction::Drop
            }
        };
        let store = RegionStore::open_with_policy(dev.clone(), config(), Box::new(policy))
            .await
            .expect("open");
        for i in 0..10u64 {
            store
                .append("b", &format!("keep/{i}"), &value(i, 2000))
                .await
                .expect("append");
        }
        store.flush().await.expect("flush");
        // Unsynced filler pushes the kept entries' region out: they are rewritten forward,
        // then their old region is invalidated. Power fails right after that reclamation,
        // before anything else could flush the rewritten copies by accident.
        let mut rewritten = 0;
        for i in 0..60u64 {
            let put = store
                .append("b", &format!("filler/{i}"), &value(i, 9000))
                .await
                .expect("append");
            rewritten = put.reclaimed.iter().map(|r| r.rewritten.len()).sum();
            if rewritten > 0 {
                break;
            }
        }
        assert_eq!(rewritten, 10, "all kept entries were rewritten at once");
        power_loss(store, &dev).await;

        let store = RegionStore::open(dev.clone(), config())
            .await
            .expect("reopen");
        for i in 0..10u64 {
            assert_eq!(
                store
                    .read_key("b", &format!("keep/{i}"))
                    .await
                    .expect("read")
                    .as_deref(),
                Some(&value(i, 2000)[..]),
                "keep/{i}"
            );
        }
    });
}
