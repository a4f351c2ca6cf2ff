//! This shard's part of the NVMe tier: opening the region store on the shared file.

use yutu_blockstore::{RegionStore, UringBdev};

use super::record::is_durable;
use crate::model::StoreError;

pub type Nvme = RegionStore<UringBdev>;

/// A device error, logged once here and reported as the request's error.
pub fn nvme_error(e: yutu_blockstore::StoreError) -> StoreError {
    tracing::error!(error = %e, "NVMe tier");
    StoreError::Device(e.to_string())
}

/// Opens (creating and preallocating it if needed) this shard's part of the NVMe file.
pub async fn open(
    path: &std::path::Path,
    capacity: u64,
    shard: u32,
    nshards: u32,
) -> Result<Nvme, String> {
    let bdev = UringBdev::open(path)
        .await
        .map_err(|e| format!("cannot open the NVMe tier {}: {e}", path.display()))?;
    let mut config = yutu_blockstore::StoreConfig::for_shard(shard, nshards);
    config.region_size = region_size(capacity, nshards);
    // Reclaiming a region drops the demoted copies of `memory` objects (the tier is a cache)
    // but rewrites `disk` objects forward: they were acknowledged as durable.
    let policy = |c: &yutu_blockstore::ReclaimCandidate<'_>| {
        if is_durable(c.meta) {
            yutu_blockstore::ReclaimAction::Rewrite
        } else {
            yutu_blockstore::ReclaimAction::Drop
        }
    };
    RegionStore::open_with_policy(bdev, config, Box::new(policy))
        .await
        .map_err(|e| format!("cannot open the NVMe tier {}: {e}", path.display()))
}

/// Regions of 1 to 64 MiB, at least 8 per shard: large enough for sequential writes, small
/// enough that reclaiming one frees a modest share of the tier.
pub fn region_size(capacity: u64, nshards: u32) -> u64 {
    let per_shard = capacity / nshards.max(1) as u64;
    let size = (per_shard / 8).clamp(1 << 20, 64 << 20);
    size & !((1 << 20) - 1)
}

/// Prepares the NVMe file before the shards open it: created and preallocated once, with its
/// first block written (glommio's poll-ring probe must read real data, see `yutu-blockstore`).
pub fn prepare_file(path: &std::path::Path, capacity: u64) -> Result<(), String> {
    UringBdev::prepare_file(path, capacity).map_err(|e| e.to_string())
}
