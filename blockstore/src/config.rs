//! How a store is laid out on its device and how hard it drives it.

use std::ops::Range;

use crate::error::StoreError;
use crate::region::Geometry;

/// Settings of one shard's [`crate::RegionStore`].
///
/// Every shard of a node opens the same device with the same `region_size` and `nshards`;
/// the region headers record both, and a mismatch at open is refused (see
/// [`StoreConfig::discard_foreign`]).
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Bytes per region: a multiple of the I/O alignment (4 KiB or the device block size) and
    /// of `write_chunk`, between 64 KiB and 256 MiB. 16-64 MiB suits NVMe: large enough for
    /// sequential writes and cheap reclamation bookkeeping, small enough that reclaiming one
    /// frees space without a long stall. Default 64 MiB.
    pub region_size: u64,
    /// This store's shard number, `< nshards`.
    pub shard: u32,
    /// Shards sharing the device.
    pub nshards: u32,
    /// The regions this shard owns. `None`: every region `r` with `r % nshards == shard`
    /// (striping spreads each shard over the whole device). `Some(range)`: exactly those
    /// region indices (clipped to the device), for layouts that give shards contiguous slices.
    pub regions: Option<Range<u32>>,
    /// Size of one write I/O: the in-memory region buffer is filled one chunk at a time and a
    /// chunk is written as soon as it is full. A multiple of the I/O alignment dividing
    /// `region_size`. Default 1 MiB.
    pub write_chunk: usize,
    /// Write I/Os allowed in flight before `append` waits for one to complete. Default 8.
    pub max_inflight_writes: usize,
    /// Treat regions written by another layout (different shard, shard count or region size)
    /// as free instead of refusing to open. Their records are lost.
    pub discard_foreign: bool,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            region_size: 64 << 20,
            shard: 0,
            nshards: 1,
            regions: None,
            write_chunk: 1 << 20,
            max_inflight_writes: 8,
            discard_foreign: false,
        }
    }
}

impl StoreConfig {
    /// The default settings for shard `shard` of `nshards`.
    pub fn for_shard(shard: u32, nshards: u32) -> Self {
        StoreConfig {
            shard,
            nshards,
            ..StoreConfig::default()
        }
    }

    /// Checks the settings against a device and works out its geometry and this shard's
    /// regions (in index order).
    pub(crate) fn layout(
        &self,
        block_size: usize,
        block_count: u64,
    ) -> Result<(Geometry, Vec<u32>), StoreError> {
        let bad = |m: String| Err(StoreError::Config(m));
        if !block_size.is_power_of_two() {
            return bad(format!(
                "device block size {block_size} is not a power of two"
            ));
        }
        let block_size = block_size as u64;
        let io_align = block_size.max(4096);
        let rs = self.region_size;
        if !(64 << 10..=256 << 20).contains(&rs) || rs % io_align != 0 {
            return bad(format!(
                "region_size {rs} must be a multiple of {io_align} between 64 KiB and 256 MiB"
            ));
        }
        let chunk = self.write_chunk as u64;
        if chunk < io_align || chunk % io_align != 0 || rs % chunk != 0 {
            return bad(format!(
                "write_chunk {chunk} must be a multiple of {io_align} that divides region_size {rs}"
            ));
        }
        if self.max_inflight_writes == 0 {
            return bad("max_inflight_writes must be at least 1".to_owned());
        }
        if self.nshards == 0 || self.shard >= self.nshards {
            return bad(format!(
                "shard {} is not one of {} shards",
                self.shard, self.nshards
            ));
        }
        let device_regions = block_count.saturating_mul(block_size) / rs;
        let device_regions = u32::try_from(device_regions).unwrap_or(u32::MAX);
        let owned: Vec<u32> = match &self.regions {
            Some(range) => (range.start..range.end.min(device_regions)).collect(),
            None => (0..device_regions)
                .filter(|r| r % self.nshards == self.shard)
                .collect(),
        };
        if owned.len() < 2 {
            return bad(format!(
                "shard {} owns {} region(s) of {rs} bytes on a device of {} regions; at least 2 \
                 are needed (one to write, one to reclaim into)",
                self.shard,
                owned.len(),
                device_regions
            ));
        }
        Ok((
            Geometry {
                block_size,
                io_align,
                region_size: rs,
            },
            owned,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stripes_regions_over_shards() {
        let cfg = StoreConfig {
            region_size: 1 << 20,
            write_chunk: 256 << 10,
            ..StoreConfig::for_shard(1, 3)
        };
        let (geo, owned) = cfg.layout(512, (10 << 20) / 512).expect("valid");
        assert_eq!(geo.io_align, 4096);
        assert_eq!(owned, vec![1, 4, 7]);
    }

    #[test]
    fn explicit_range_is_clipped_to_the_device() {
        let cfg = StoreConfig {
            region_size: 1 << 20,
            regions: Some(6..20),
            ..StoreConfig::default()
        };
        let (_, owned) = cfg.layout(4096, (8 << 20) / 4096).expect("valid");
        assert_eq!(owned, vec![6, 7]);
    }

    #[test]
    fn rejects_bad_settings() {
        let dev = (64u64 << 20) / 4096;
        let base = StoreConfig {
            region_size: 1 << 20,
            ..StoreConfig::default()
        };
        for cfg in [
            StoreConfig {
                region_size: 1000 * 1000,
                ..base.clone()
            },
            StoreConfig {
                write_chunk: 3 << 20,
                ..base.clone()
            },
            StoreConfig {
                max_inflight_writes: 0,
                ..base.clone()
            },
            StoreConfig {
                shard: 2,
                nshards: 2,
                ..base.clone()
            },
            StoreConfig {
                region_size: 64 << 20,
                ..base.clone()
            },
        ] {
            assert!(
                matches!(cfg.layout(4096, dev), Err(StoreError::Config(_))),
                "{cfg:?} accepted"
            );
        }
    }
}
