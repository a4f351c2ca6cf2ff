//! The NVMe tier's on-disk bytes: a region store written with known records is damaged
//! where the input says (offset, xor pairs) and opened again. Recovery never panics, and
//! every record it returns is byte for byte one that was written (damage is refused, never
//! served).
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use yutu_blockstore::{RamBdev, RegionStore, StoreConfig};

const DEVICE: usize = 512 << 10;

fn config() -> StoreConfig {
    StoreConfig {
        region_size: 64 << 10,
        write_chunk: 16 << 10,
        max_inflight_writes: 2,
        ..StoreConfig::default()
    }
}

fn value(i: usize) -> Vec<u8> {
    (0..(100 + i * 397 % 5000)).map(|j| (i * 31 + j) as u8).collect()
}

thread_local! {
    static EXECUTOR: glommio::LocalExecutor = glommio::LocalExecutorBuilder::default()
        .make()
        .expect("an executor");
    /// A device image holding 40 records, and the records.
    static GOLDEN: (Vec<u8>, BTreeMap<String, Vec<u8>>) = EXECUTOR.with(|ex| ex.run(async {
        let dev = RamBdev::new(4096, (DEVICE / 4096) as u64);
        let store = RegionStore::open(dev.clone(), config()).await.expect("open");
        let mut written = BTreeMap::new();
        for i in 0..40 {
            let key = format!("k{i:02}");
            store.append("b", &key, &value(i)).await.expect("append");
            written.insert(key, value(i));
        }
        store.close().await.expect("close");
        (dev.peek(0, DEVICE), written)
    }));
}

fuzz_target!(|data: &[u8]| {
    GOLDEN.with(|(image, written)| {
        EXECUTOR.with(|ex| {
            ex.run(async {
                let dev = RamBdev::new(4096, (DEVICE / 4096) as u64);
                dev.poke(0, image);
                for pair in data.chunks_exact(4) {
                    let at = u32::from_le_bytes([pair[0], pair[1], pair[2], 0]) as usize % DEVICE;
                    let mut b = dev.peek(at as u64, 1);
                    b[0] ^= pair[3] | 1;
                    dev.poke(at as u64, &b);
                }
                let Ok(store) = RegionStore::open(dev, config()).await else {
                    return;
                };
                assert!(store.len() <= written.len(), "recovery found records never written");
                for (key, want) in written {
                    if let Ok(Some(got)) = store.read_key("b", key).await {
                        assert!(&got[..] == &want[..], "{key}: damaged bytes were served");
                    }
                }
            })
        })
    });
});
