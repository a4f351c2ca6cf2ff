//! The region store: one shard's log-structured key-value store on its regions of a device.
//!
//! What the server sees: `append` a value under a bucket and key (it is in the index and
//! readable at once; durable after `flush`/`sync`), `read` it back verified, `delete` it
//! durably with a tombstone, `list` a bucket, and `stats`. What happens underneath: records go
//! into the active region through the region buffer (`append.rs`, `writer.rs`), full chunks
//! are written with several I/Os in flight, regions are sealed when full and reclaimed oldest
//! first when the free ones run out (`reclaim.rs`), reads are verified (`read.rs`), flushes
//! are group commits (`durability.rs`), and on open the index is rebuilt by scanning
//! (`recovery.rs`). This file holds the state they share (what is kept per region is
//! `region_info.rs`), opening, and the index queries.
//!
//! Concurrency: all methods take `&self` and may be called by many tasks of the shard at once.
//! State sits in a `RefCell` that is never held across an `.await`; two async locks serialise
//! the only multi-step operations (making room, which may reclaim; and flushing, which doubles
//! as group commit: callers that queue behind a flush usually find their record already
//! durable when they get the lock).

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::rc::Rc;

use bytes::Bytes;
use glommio::sync::Semaphore;

use crate::bdev::Bdev;
use crate::config::StoreConfig;
use crate::error::StoreError;
use crate::index::{Index, Listed};
use crate::location::Location;
use crate::reclaim_policy::{DropAll, ReclaimPolicy, Reclaimed};
use crate::record::{record_len, SumKey, MAX_META_LEN, MAX_NAME_LEN};
use crate::recovery::RecoveryReport;
use crate::region::Geometry;
use crate::region_info::{Member, RegionInfo, RegionState};
use crate::signal::Signal;
use crate::stats::StoreStats;
use crate::writer::Writer;

/// One shard's store; see the module docs. Cheap to share within the shard through `Rc`.
pub struct RegionStore<B: Bdev + 'static> {
    pub(crate) shared: Rc<Shared<B>>,
}

pub(crate) struct Shared<B: Bdev> {
    pub bdev: B,
    pub geo: Geometry,
    pub cfg: StoreConfig,
    pub state: RefCell<State<B::Buf>>,
    pub signal: Signal,
    /// Held while sealing, activating and reclaiming regions.
    pub space_lock: Semaphore,
    /// Held while flushing.
    pub flush_lock: Semaphore,
    pub policy: RefCell<Box<dyn ReclaimPolicy>>,
}

pub(crate) struct State<Buf> {
    pub regions: BTreeMap<u32, RegionInfo>,
    pub free: VecDeque<u32>,
    /// Sealed regions, oldest generation first.
    pub sealed: VecDeque<u32>,
    pub writer: Writer<Buf>,
    pub index: Index,
    pub next_seq: u64,
    pub next_gen: u64,
    pub durable_seq: u64,
    pub poisoned: Option<String>,
    pub counters: StoreStats,
    pub recovery: RecoveryReport,
    /// Told `(bucket, key, present)` whenever a key comes into or leaves the index
    /// ([`RegionStore::on_index_change`]).
    pub on_index: Option<IndexHook>,
}

/// Told `(bucket, key, present)` when a key comes into (`true`) or leaves (`false`) the index.
pub type IndexHook = Box<dyn Fn(&str, &str, bool)>;

impl<Buf> State<Buf> {
    /// Points the index at a new record and keeps the per-region accounting in step.
    pub fn index_put(&mut self, bucket: &str, key: &str, loc: Location, meta: Bytes) {
        let (b, k, old) = self.index.insert(bucket, key, loc, meta);
        match old {
            Some(old) => self.unaccount(&old),
            None => {
                if let Some(hook) = &self.on_index {
                    hook(bucket, key, true);
                }
            }
        }
        if let Some(info) = self.regions.get_mut(&loc.region) {
            info.live_bytes += loc.record_len();
            info.members.push(Member {
                bucket: b,
                key: k,
                loc,
            });
        }
    }

    pub fn index_remove(&mut self, bucket: &str, key: &str) -> Option<Location> {
        let old = self.index.remove(bucket, key)?;
        self.unaccount(&old);
        if let Some(hook) = &self.on_index {
            hook(bucket, key, false);
        }
        Some(old)
    }

    pub fn index_remove_if(&mut self, bucket: &str, key: &str, loc: &Location) -> bool {
        if self.index.remove_if(bucket, key, loc) {
            self.unaccount(loc);
            if let Some(hook) = &self.on_index {
                hook(bucket, key, false);
            }
            true
        } else {
            false
        }
    }

    fn unaccount(&mut self, loc: &Location) {
        if let Some(info) = self.regions.get_mut(&loc.region) {
            if info.generation == loc.generation {
                info.live_bytes = info.live_bytes.saturating_sub(loc.record_len());
            }
        }
    }

    /// The checksum key of the incarnation `loc` was written into, if it is still current.
    pub(crate) fn current_key(&self, loc: &Location) -> Result<SumKey, StoreError> {
        match self.regions.get(&loc.region) {
            Some(info) if info.generation == loc.generation => Ok(info.key),
            Some(info) => Err(StoreError::Stale {
                region: loc.region,
                expected: loc.generation,
                current: info.generation,
            }),
            None => Err(StoreError::Stale {
                region: loc.region,
                expected: loc.generation,
                current: 0,
            }),
        }
    }
}

/// The outcome of placing one record (see [`RegionStore::place`]).
pub(crate) enum Place {
    Done(Location),
    /// The active region cannot take it; room must be made first.
    NoRoom,
    /// Nothing to do: a tombstone for a key that is not there, or a rewrite of an entry that
    /// changed meanwhile.
    Absent,
}

/// What `append` did.
#[derive(Debug)]
pub struct Appended {
    /// Where the record is; readable now, durable once [`RegionStore::sync`] returns for it.
    pub location: Location,
    /// Regions reclaimed to make room, with the entries that left the tier.
    pub reclaimed: Vec<Reclaimed>,
}

/// A record to place: names as the caller gave them.
pub(crate) struct NewRecord<'a> {
    pub bucket: &'a str,
    pub key: &'a str,
    pub meta: &'a [u8],
    pub value: &'a [u8],
}

/// A record read back: its metadata and its value (both verified).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub meta: Bytes,
    pub value: Bytes,
}

/// What `delete` did.
#[derive(Debug)]
pub struct Deleted {
    /// Whether the key was in the store (and a tombstone was written).
    pub existed: bool,
    /// The tombstone's sequence number, to pass to [`RegionStore::sync_seq`].
    pub seq: Option<u64>,
    pub reclaimed: Vec<Reclaimed>,
}

impl<B: Bdev + 'static> RegionStore<B> {
    /// Opens the store on `bdev`, rebuilding the index from what is on the device, with the
    /// default reclamation policy ([`DropAll`]). Must run inside a glommio executor: writes
    /// are driven by tasks spawned on it.
    pub async fn open(bdev: B, config: StoreConfig) -> Result<Self, StoreError> {
        Self::open_with_policy(bdev, config, Box::new(DropAll)).await
    }

    /// Like [`RegionStore::open`], with a policy for live entries of reclaimed regions.
    pub async fn open_with_policy(
        bdev: B,
        config: StoreConfig,
        policy: Box<dyn ReclaimPolicy>,
    ) -> Result<Self, StoreError> {
        let (geo, owned) = config.layout(bdev.block_size(), bdev.block_count())?;
        let recovered = crate::recovery::recover(&bdev, geo, &config, &owned).await?;
        // What recovery read may still sit in the device's volatile cache (the previous
        // process died, the machine did not): make it durable before calling it durable.
        bdev.flush().await?;
        let mut writer = Writer::new(geo, config.write_chunk, config.max_inflight_writes);
        let mut regions = recovered.regions;
        if let Some(resume) = &recovered.resume {
            writer.resume(&bdev, &resume.header, resume.fill, &resume.chunk_prefix);
            if let Some(info) = regions.get_mut(&resume.header.region) {
                info.state = RegionState::Active;
            }
        }
        let counters = StoreStats {
            corrupt_records: recovered.report.corrupt_records,
            corrupt_regions: recovered.report.corrupt_regions,
            recovered_records: recovered.report.records,
            ..StoreStats::default()
        };
        tracing::info!(
            device = %bdev.name(), shard = config.shard, regions = owned.len(),
            entries = recovered.index.len(), corrupt = recovered.report.corrupt_records,
            "region store opened"
        );
        let state = State {
            regions,
            free: recovered.free,
            sealed: recovered.sealed,
            writer,
            index: recovered.index,
            next_seq: recovered.next_seq,
            next_gen: recovered.next_gen,
            durable_seq: recovered.next_seq - 1,
            poisoned: None,
            counters,
            recovery: recovered.report,
            on_index: None,
        };
        Ok(RegionStore {
            shared: Rc::new(Shared {
                bdev,
                geo,
                cfg: config,
                state: RefCell::new(state),
                signal: Signal::default(),
                space_lock: Semaphore::new(1),
                flush_lock: Semaphore::new(1),
                policy: RefCell::new(policy),
            }),
        })
    }

    /// Tells `hook` of every key that comes into or leaves the index from now on (the keys
    /// already there: [`RegionStore::for_each_key`]). The hook runs inside the store's
    /// bookkeeping and must not call the store.
    pub fn on_index_change(&self, hook: IndexHook) {
        self.shared.state.borrow_mut().on_index = Some(hook);
    }

    /// Calls `f` with every key of `bucket` in the index.
    pub fn for_each_key(&self, bucket: &str, f: impl FnMut(&str)) {
        self.shared.state.borrow().index.for_each_key(bucket, f)
    }

    /// Replaces the reclamation policy.
    pub fn set_policy(&self, policy: Box<dyn ReclaimPolicy>) {
        *self.shared.policy.borrow_mut() = policy;
    }

    /// The device the store runs on.
    pub fn bdev(&self) -> &B {
        &self.shared.bdev
    }

    /// The largest value that can be stored under `bucket`/`key` with `meta_len` bytes of
    /// metadata (a record must fit in one region).
    pub fn max_value_len(&self, bucket: &str, key: &str, meta_len: usize) -> u64 {
        self.shared.geo.max_record().saturating_sub(record_len(
            bucket.len(),
            key.len(),
            meta_len,
            0,
        )) & !(crate::record::RECORD_ALIGN - 1)
    }

    /// Where the newest version of `bucket`/`key` is, if the store has it.
    pub fn get(&self, bucket: &str, key: &str) -> Option<Location> {
        self.shared.state.borrow().index.get(bucket, key)
    }

    /// The metadata stored with the newest version of `bucket`/`key`, from DRAM.
    pub fn meta(&self, bucket: &str, key: &str) -> Option<Bytes> {
        self.shared.state.borrow().index.meta(bucket, key)
    }

    /// Keys of `bucket` starting with `prefix` and sorting after `start_after`, in order, at
    /// most `limit`.
    pub fn list(
        &self,
        bucket: &str,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
    ) -> Vec<Listed> {
        self.shared
            .state
            .borrow()
            .index
            .list(bucket, prefix, start_after, limit)
    }

    /// The sum of the value lengths of `bucket`'s live keys: what the bucket holds here.
    pub fn bucket_bytes(&self, bucket: &str) -> u64 {
        self.shared.state.borrow().index.value_bytes(bucket)
    }

    /// Buckets with at least one key in this store.
    pub fn buckets(&self) -> Vec<String> {
        self.shared.state.borrow().index.buckets()
    }

    /// Number of keys in the index.
    pub fn len(&self) -> usize {
        self.shared.state.borrow().index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What recovery found when the store opened.
    pub fn recovery_report(&self) -> RecoveryReport {
        self.shared.state.borrow().recovery.clone()
    }

    /// A snapshot of the store's state and counters.
    pub fn stats(&self) -> StoreStats {
        let sh = &self.shared;
        let st = sh.state.borrow();
        let mut s = st.counters.clone();
        let usable = sh.geo.max_record();
        s.capacity_bytes = usable * st.regions.len() as u64;
        let active = st.writer.active().map(|a| (a.region, a.fill));
        s.used_bytes = st
            .regions
            .iter()
            .map(|(r, info)| match (info.state, active) {
                (RegionState::Free, _) => 0,
                (_, Some((ar, fill))) if ar == *r => fill.saturating_sub(sh.geo.data_start()),
                _ => info.fill.saturating_sub(sh.geo.data_start()),
            })
            .sum();
        s.live_bytes = st.regions.values().map(|i| i.live_bytes).sum();
        s.records = st.index.len() as u64;
        s.regions_total = st.regions.len() as u32;
        s.regions_free = st.free.len() as u32;
        s.regions_sealed = st.sealed.len() as u32;
        s.writes_in_flight = st.writer.in_flight() as u64;
        s.durable_seq = st.durable_seq;
        s.next_seq = st.next_seq;
        s
    }

    // ----- internals shared with reclaim.rs -----

    pub(crate) fn poison(&self, why: &str) {
        self.shared
            .state
            .borrow_mut()
            .poisoned
            .get_or_insert_with(|| why.to_owned());
        self.shared.signal.notify_all();
    }
}

pub(crate) fn check_lengths(bucket: &str, key: &str, meta: &[u8]) -> Result<(), StoreError> {
    for (what, len, max) in [
        ("bucket name", bucket.len(), MAX_NAME_LEN),
        ("key", key.len(), MAX_NAME_LEN),
        ("metadata", meta.len(), MAX_META_LEN),
    ] {
        if len > max {
            return Err(StoreError::TooLong { what, len, max });
        }
    }
    Ok(())
}
