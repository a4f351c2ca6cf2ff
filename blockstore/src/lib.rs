//! `yutu-blockstore`: the NVMe tier of a Yutu storage node, a user-space block storage engine in
//! SPDK's shape.
//!
//! # Layers
//!
//! ```text
//!  RegionStore (store.rs)      append / read / delete / list / flush+sync / stats, one per shard
//!    ├─ Index (index.rs)       (bucket, key) -> Location, in DRAM, rebuilt at open
//!    ├─ Writer (writer.rs)     the aligned region buffer; full chunks become O_DIRECT writes
//!    ├─ region_info.rs         per-region state in DRAM: life cycle, incarnation, fill, members
//!    ├─ recovery.rs            scan regions in generation order, replay records, resume the tail
//!    └─ reclaim.rs             empty the oldest region, as its policy says
//!         reclaim_policy.rs    the policy (drop / re-admit / rewrite) and the Reclaimed report
//!  record.rs, region.rs        on-disk formats: checksummed records, region headers
//!  Bdev (bdev/)                blocks in, blocks out: io_uring O_DIRECT (uring.rs), RAM (ram.rs)
//! ```
//!
//! The device is cut into fixed regions (64 MiB by default). Each server shard opens its own
//! [`RegionStore`] on the same device and owns a disjoint set of regions (striped by default,
//! `r % nshards == shard`), so shards share nothing and take no locks. Within a shard, records
//! are appended to one active region; each carries a header (magic, version, bucket, key,
//! length, sequence number) and a blake3 checksum over header and payload, keyed per region
//! incarnation. When the free regions run out, the oldest region is reclaimed whole.
//!
//! # Using it from a shard
//!
//! ```no_run
//! use yutu_blockstore::{RegionStore, StoreConfig, UringBdev};
//!
//! # async fn shard(shard: u32, nshards: u32) -> Result<(), Box<dyn std::error::Error>> {
//! // Inside the shard's glommio executor. Every shard opens the same file or device.
//! let bdev = UringBdev::open_file("/var/lib/yutu/nvme.img", 64 << 30).await?;
//! let store = RegionStore::open(bdev, StoreConfig::for_shard(shard, nshards)).await?;
//! // The metadata blob (size, ETag, content type...) is stored with the record and kept in
//! // DRAM, so HEAD and listing need no I/O, also after a restart.
//! let put = store.append_with_meta("models", "block-00af", b"etag=..", b"kv bytes").await?;
//! for r in &put.reclaimed { /* evicted: r.dropped; back to DRAM: r.readmitted */ }
//! store.sync(&put.location).await?; // a durability=disk bucket acknowledges after this
//! let bytes = store.read(put.location).await?; // verified, or an error, never wrong bytes
//! let meta = store.meta("models", "block-00af"); // from DRAM
//! let page = store.list("models", "block-", None, 1000); // keys, locations, metadata
//! store.delete("models", "block-00af").await?; // tombstone; durable after the next sync
//! # Ok(()) }
//! ```
//!
//! Glommio needs locked memory for io_uring: raise `RLIMIT_MEMLOCK` before starting executors
//! (the server does). Give each shard's executor an `io_memory` pool large enough for the
//! store's write chunks and its concurrent reads, about
//! `(max_inflight_writes + 2) * write_chunk + concurrent reads * largest value` (32-64 MiB
//! for the defaults and MiB-sized KV blocks): buffers from the pool are reused (and registered
//! with io_uring when the memlock limit allows), while buffers beyond it are fresh allocations
//! whose page faults halved read bandwidth in `yutu-bench nvme`. The store works with any size.
//!
//! # Adding an SPDK NVMe backend
//!
//! The [`Bdev`] trait is SPDK's `spdk_bdev` API reduced to what the store needs, so an SPDK
//! backend is one more implementation of it, say `bdev/spdk.rs` behind a cargo feature
//! `spdk` (linking SPDK's C libraries through a `-sys` crate generated with bindgen):
//!
//! - **Environment.** `spdk_env_init` once per process before the shards start (hugepages,
//!   the PCIe device unbound from the kernel driver and bound to `vfio-pci`), then
//!   `spdk_nvme_probe`/`spdk_nvme_connect` to attach the controller and
//!   `spdk_nvme_ctrlr_get_ns` for the namespace. `block_size` is
//!   `spdk_nvme_ns_get_sector_size`, `block_count` is `spdk_nvme_ns_get_num_sectors`.
//! - **One queue pair per shard.** Each shard allocates its own I/O queue pair
//!   (`spdk_nvme_ctrlr_alloc_io_qpair`) on its own thread, exactly as each shard opens its own
//!   `DmaFile` today; queue pairs are not thread-safe and need no locks when kept per shard.
//! - **Buffers.** `type Buf` wraps memory from `spdk_dma_zmalloc` (pinned, physically
//!   contiguous or IOMMU-mapped), freed with `spdk_dma_free` on drop; `alloc_buf` returns one.
//!   `ReadBuf` is the same type. The store already pools its write buffers, so allocation is
//!   rare.
//! - **I/O.** `write_blocks` calls `spdk_nvme_ns_cmd_write(ns, qpair, buf, lba, n, cb, arg)`
//!   where `cb` completes a one-shot slot (an `Rc<Cell<Option<Result>>>` plus the task's
//!   `Waker`); the future keeps the `Rc<Buf>` alive until the callback ran. `read_blocks` and
//!   `flush` (`spdk_nvme_ns_cmd_flush`) work the same way.
//! - **Polled completions on the shard's thread.** Completions only arrive when someone calls
//!   `spdk_nvme_qpair_process_completions`. Spawn one long-lived glommio task per shard that
//!   calls it while I/O is outstanding and yields (`glommio::yield_if_needed`) in between, or
//!   hook it into the executor's idle loop; the callbacks then wake the awaiting tasks on the
//!   same thread. No interrupts, no syscalls, no cross-thread hand-off.
//! - **Nothing above changes.** The region store, recovery and reclamation only see the trait;
//!   the raw-device case of the io_uring backend (a namespace opened as `/dev/nvme0n1`) has
//!   the same geometry, so a store can move between the two backends without reformatting.

mod append;
pub mod bdev;
mod config;
mod durability;
mod error;
mod index;
mod location;
pub mod measure;
mod read;
mod reclaim;
mod reclaim_policy;
mod record;
mod recovery;
mod region;
mod region_info;
mod signal;
mod stats;
mod store;
mod writer;

pub use bdev::ram::RamBdev;
pub use bdev::uring::{UringBdev, UringRead};
pub use bdev::{Bdev, IoBuf};
pub use config::StoreConfig;
pub use error::{BdevError, CorruptKind, StoreError};
pub use index::Listed;
pub use location::Location;
pub use reclaim_policy::{
    DropAll, ObjectName, Readmitted, ReclaimAction, ReclaimCandidate, ReclaimPolicy, Reclaimed,
};
pub use recovery::RecoveryReport;
pub use stats::StoreStats;
pub use store::{Appended, Deleted, IndexHook, Record, RegionStore};

/// Record format facts a caller may need for sizing (e.g. the largest value for a region).
pub mod format {
    pub use crate::record::{HEADER_LEN, MAX_META_LEN, MAX_NAME_LEN, RECORD_ALIGN};
    pub use crate::region::REGION_HEADER_LEN;
}
