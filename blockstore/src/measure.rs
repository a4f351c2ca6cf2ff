//! Spill throughput of the region store on a real file: what `yutu-bench nvme` reports.
//!
//! It lives here, not in the bench crate, so that the bench needs no glommio of its own: the
//! measurement starts a glommio executor on a thread of its own (as a server shard would be),
//! opens a [`UringBdev`] on a preallocated file, and times
//!
//! - **write**: appending `total_bytes` of `record_size`-byte values, then one `flush`, so the
//!   time covers every byte reaching the device (O_DIRECT) and the final fdatasync;
//! - **read**: reading every record back through [`RegionStore::read`] (checksum verified,
//!   copied into `Bytes`) with `read_concurrency` reads in flight, in write order, checking
//!   each value's length and tag. After the flush every full chunk has left the region
//!   buffer, so the reads come from the device (all but the last partial chunk).
//!
//! Then the store is reopened and the time recovery takes to rebuild the index is reported
//! separately; it is not part of either bandwidth.
//!
//! `io_memory` is glommio's per-executor buffer pool. The store's chunk buffers and glommio's
//! read buffers come from it when it is large enough; otherwise every read allocates (and
//! page-faults) fresh memory, which on a fast device costs more CPU than the checksum. Size it
//! like a server shard should: `(max_inflight_writes + 2) * write_chunk` plus
//! `read_concurrency * record size`.

use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use glommio::{LocalExecutorBuilder, Placement};

use crate::bdev::uring::UringBdev;
use crate::config::StoreConfig;
use crate::error::StoreError;
use crate::store::RegionStore;

/// What to measure.
#[derive(Debug, Clone)]
pub struct SpillConfig {
    /// The file to create (or reuse) and write; on a disk-backed file system.
    pub path: PathBuf,
    /// Size of the file; must hold `total_bytes` plus two regions.
    pub file_size: u64,
    pub record_size: usize,
    pub total_bytes: u64,
    pub region_size: u64,
    pub write_chunk: usize,
    pub max_inflight_writes: usize,
    pub read_concurrency: usize,
    /// glommio's `io_memory` for the measuring executor; see the module docs.
    pub io_memory: usize,
}

impl SpillConfig {
    /// The buffer pool a shard needs to keep every write chunk and concurrent read in it.
    pub fn suggested_io_memory(&self) -> usize {
        let need = (self.max_inflight_writes + 2) * self.write_chunk
            + self.read_concurrency * (self.record_size + (64 << 10));
        need.next_power_of_two()
    }
}

/// What was measured.
#[derive(Debug, Clone)]
pub struct SpillResult {
    pub records: u64,
    /// Value bytes written and read.
    pub bytes: u64,
    pub write_time: Duration,
    pub read_time: Duration,
    /// Opening the store on the written file (the recovery scan of every region).
    pub reopen_time: Duration,
}

impl SpillResult {
    pub fn write_mb_per_s(&self) -> f64 {
        self.bytes as f64 / self.write_time.as_secs_f64() / 1e6
    }

    pub fn read_mb_per_s(&self) -> f64 {
        self.bytes as f64 / self.read_time.as_secs_f64() / 1e6
    }
}

/// Why a measurement failed.
#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("bad measurement settings: {0}")]
    Settings(String),
    #[error("cannot start the executor: {0}")]
    Executor(String),
    #[error("read back wrong data: {0}")]
    Verify(String),
}

/// Runs the measurement on a fresh glommio executor thread and waits for it.
pub fn run_spill(cfg: &SpillConfig) -> Result<SpillResult, MeasureError> {
    if cfg.record_size == 0 || cfg.read_concurrency == 0 || cfg.total_bytes == 0 {
        return Err(MeasureError::Settings(
            "record size, total bytes and read concurrency must be positive".into(),
        ));
    }
    raise_memlock_limit();
    let cfg = cfg.clone();
    let handle = LocalExecutorBuilder::new(Placement::Unbound)
        .name("yutu-spill")
        .io_memory(cfg.io_memory)
        .spawn(move || async move { spill(cfg).await })
        .map_err(|e| MeasureError::Executor(e.to_string()))?;
    handle
        .join()
        .map_err(|e| MeasureError::Executor(e.to_string()))?
}

fn store_config(cfg: &SpillConfig) -> StoreConfig {
    StoreConfig {
        region_size: cfg.region_size,
        write_chunk: cfg.write_chunk,
        max_inflight_writes: cfg.max_inflight_writes,
        discard_foreign: true,
        ..StoreConfig::default()
    }
}

async fn spill(cfg: SpillConfig) -> Result<SpillResult, MeasureError> {
    let n = cfg.total_bytes / cfg.record_size as u64;
    let bdev = UringBdev::open_file(&cfg.path, cfg.file_size)
        .await
        .map_err(StoreError::from)?;
    let store = RegionStore::open(bdev, store_config(&cfg)).await?;
    let capacity = store.stats().capacity_bytes;
    if cfg.total_bytes + 2 * cfg.region_size > capacity {
        return Err(MeasureError::Settings(format!(
            "{} bytes do not fit a {capacity}-byte store with two regions to spare",
            cfg.total_bytes
        )));
    }
    let mut value = vec![0u8; cfg.record_size];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for b in value.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }

    let started = Instant::now();
    for i in 0..n {
        value[..8].copy_from_slice(&i.to_le_bytes());
        let put = store.append("bench", &key(i), &value).await?;
        if !put.reclaimed.is_empty() {
            return Err(MeasureError::Settings("the store had to reclaim".into()));
        }
    }
    store.flush().await?;
    let write_time = started.elapsed();

    let store = Rc::new(store);
    let started = Instant::now();
    let q = cfg.read_concurrency as u64;
    let readers: Vec<_> = (0..q)
        .map(|t| {
            let store = store.clone();
            let size = cfg.record_size;
            glommio::spawn_local(async move {
                let mut i = t;
                while i < n {
                    let loc = store
                        .get("bench", &key(i))
                        .ok_or_else(|| MeasureError::Verify(format!("record {i} missing")))?;
                    let v = store.read(loc).await?;
                    if v.len() != size || v[..8] != i.to_le_bytes() {
                        return Err(MeasureError::Verify(format!("record {i} has other bytes")));
                    }
                    i += q;
                }
                Ok::<(), MeasureError>(())
            })
        })
        .collect();
    for r in readers {
        r.await?;
    }
    let read_time = started.elapsed();
    drop(store);

    let reopened = Instant::now();
    let bdev = UringBdev::open(&cfg.path).await.map_err(StoreError::from)?;
    let store = RegionStore::open(bdev, store_config(&cfg)).await?;
    let reopen_time = reopened.elapsed();
    if store.len() as u64 != n {
        return Err(MeasureError::Verify(format!(
            "{} of {n} records after reopening",
            store.len()
        )));
    }
    Ok(SpillResult {
        records: n,
        bytes: n * cfg.record_size as u64,
        write_time,
        read_time,
        reopen_time,
    })
}

fn key(i: u64) -> String {
    format!("spill/{i:08}")
}

/// io_uring locks memory for its rings; lift the soft limit to the hard one.
fn raise_memlock_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed by pointer.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim);
        }
    }
}
