//! DRAM and NVMe as one store: a shard's [`TieredStore`].
//!
//! The DRAM tier is the synchronous [`ShardStore`]; the NVMe tier is the shard's
//! [`RegionStore`](yutu_blockstore::RegionStore). Everything here that waits for the device runs on
//! the shard's own executor, so both tiers are still owned by one thread, and an operation
//! that needs no device answers at once ([`Step::Done`]) without spawning a task:
//!
//! - a GET that misses DRAM (and the demotion queue) reads the record from NVMe, verifying its
//!   checksum (a corrupt record is an error, never wrong bytes), and may promote it;
//! - a PUT into a `memory` bucket publishes in DRAM and tombstones an older NVMe version
//!   before it answers, so a restart cannot resurrect the older bytes; a PUT into a `disk`
//!   bucket appends to NVMe and syncs before publishing and answering, and is refused when
//!   the durable bytes would exceed what the tier can keep ([`durable`]); the durable writes
//!   of one key take turns, so both tiers apply them in one order (`order.rs`);
//! - a DELETE removes the key from both tiers (tombstone synced for `disk` buckets), and no
//!   promotion already reading the key may bring it back;
//! - conditions (`If-Match`, `If-None-Match`) are decided against the newest version in any
//!   tier, and a conditional write to a key whose durable write is still in flight is refused
//!   as a conflict rather than decided on a state about to change;
//! - the demoter writes evicted objects to NVMe in eviction order, and writes a tombstone when
//!   the object was replaced or deleted while its append was in flight.

mod blocks;
mod buckets;
pub mod durable;
pub mod nvme;
mod order;
pub mod record;
mod uploads;
mod versions;

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use yutu_api::block_hash::BlockHash;
use yutu_api::events::Tier;
use yutu_api::RangeSpec;

use crate::metrics::ShardMetrics;
use crate::model::conditions::{ReadConditions, WriteConditions};
use crate::model::listing::{merge, shard_page, ListItem, ListQuery};
use crate::model::object::block_id;
use crate::model::{serve, Durability, GetResult, ListedMeta, ObjectMeta, StoreError};
use crate::store::multipart::CompletePart;
use crate::store::presence::{Grant, PresenceRefusal, PresenceStats, FLAG_DRAM, FLAG_NVME};
use crate::store::shard::Staged;
use crate::store::ShardStore;
pub use durable::DurableBudget;
pub use nvme::{nvme_error, Nvme};
use record::{decode_meta, encode_meta, is_kv};

/// NVMe hits no larger than this share of a shard's DRAM are promoted back into DRAM.
const PROMOTE_SHARE: u64 = 16;
/// Most tombstones a shard keeps (about 100 bytes each).
const TOMBSTONES_PER_SHARD: usize = 1 << 20;

/// The result of a write: the stored version's metadata.
pub type PutResult = Result<Arc<ObjectMeta>, StoreError>;

/// An answer that is ready now, or a future to run on the shard's executor for it.
pub enum Step<T> {
    Done(T),
    Wait(Pin<Box<dyn Future<Output = T>>>),
}

impl<T: 'static> Step<T> {
    fn wait(f: impl Future<Output = T> + 'static) -> Step<T> {
        Step::Wait(Box::pin(f))
    }

    /// The same step, keeping `guard` alive until it has its answer.
    pub fn holding<G: 'static>(self, guard: G) -> Step<T> {
        match self {
            Step::Done(v) => {
                drop(guard);
                Step::Done(v)
            }
            Step::Wait(f) => Step::wait(async move {
                let v = f.await;
                drop(guard);
                v
            }),
        }
    }

    /// The answer, waiting for it if needed (for callers that are async anyway).
    pub async fn get(self) -> T {
        match self {
            Step::Done(v) => v,
            Step::Wait(f) => f.await,
        }
    }
}

/// `(bucket, key)`, as the in-flight maps name a key.
pub type KeyName = (String, String);

/// Keys with an operation in flight, and how many.
type Flights = Rc<RefCell<HashMap<KeyName, u32>>>;

/// A shard's objects in DRAM and on NVMe.
pub struct TieredStore {
    store: RefCell<ShardStore>,
    pub nvme: Option<Rc<Nvme>>,
    metrics: Arc<ShardMetrics>,
    /// Keys with an NVMe tombstone in flight: a read that started before it must not promote
    /// the version being deleted.
    deleting: Flights,
    /// Keys with a durable (write-through) write in flight.
    writing: Flights,
    /// Turns of the durable writes of each key: they are checked, appended, synced and
    /// published one after the other (`order.rs`).
    order: order::KeyOrder,
    /// Bytes of live `disk` records on this shard's NVMe, and their limit.
    pub durable: DurableBudget,
    /// Deletes remembered, so that an older copy of a deleted key is not taken back.
    tombstones: RefCell<crate::store::tombstones::Tombstones>,
    /// Told a bucket's bytes on this shard after a delete changed them (the node's quota
    /// accounting, which this layer does not know).
    usage_sink: RefCell<Option<UsageSink>>,
}

/// Receives `(bucket, bytes the bucket holds on this shard)`.
pub type UsageSink = Box<dyn Fn(&str, u64)>;

/// Counts a key in an in-flight map for as long as it lives. Taken before the first await of
/// an operation, so nothing can run between deciding and marking.
struct InFlight {
    map: Flights,
    name: KeyName,
}

impl InFlight {
    fn enter(map: &Flights, bucket: &str, key: &str) -> Self {
        let name = (bucket.to_string(), key.to_string());
        *map.borrow_mut().entry(name.clone()).or_insert(0) += 1;
        InFlight {
            map: map.clone(),
            name,
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut map = self.map.borrow_mut();
        if let Some(n) = map.get_mut(&self.name) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.name);
            }
        }
    }
}

fn in_flight(map: &Flights, bucket: &str, key: &str) -> bool {
    let map = map.borrow();
    // Most of the time nothing is in flight: no owned key is built then.
    !map.is_empty() && map.contains_key(&(bucket.to_string(), key.to_string()))
}

/// The NVMe version of `bucket/key` with its metadata, from the index in DRAM.
fn nvme_meta(
    nvme: &Nvme,
    bucket: &str,
    key: &str,
) -> Option<(yutu_blockstore::Location, Arc<ObjectMeta>)> {
    let loc = nvme.get(bucket, key)?;
    let blob = nvme.meta(bucket, key)?;
    let meta = decode_meta(&blob, loc.value_len())?;
    Some((loc, Arc::new(meta)))
}

impl TieredStore {
    pub fn new(
        store: ShardStore,
        nvme: Option<Rc<Nvme>>,
        metrics: Arc<ShardMetrics>,
    ) -> TieredStore {
        if let Some(nvme) = &nvme {
            let presence = store.presence.clone();
            nvme.on_index_change(Box::new(move |bucket, key, on| {
                presence.borrow_mut().changed(bucket, key, FLAG_NVME, on)
            }));
        }
        let durable = DurableBudget::scan(nvme.as_deref());
        metrics.durable_used.set(durable.used());
        metrics.durable_limit.set(durable.limit());
        TieredStore {
            store: RefCell::new(store),
            nvme,
            metrics,
            deleting: Flights::default(),
            writing: Flights::default(),
            order: order::KeyOrder::default(),
            durable,
            usage_sink: RefCell::new(None),
            tombstones: RefCell::new(crate::store::tombstones::Tombstones::new(
                Duration::from_secs(86_400),
                TOMBSTONES_PER_SHARD,
            )),
        }
    }

    /// The bucket's presence table on this shard, for a caller whose access ends at
    /// `valid_until_ms`: built from the keys both tiers hold when there is none.
    pub fn presence_grant(
        &self,
        bucket: &str,
        valid_until_ms: Option<u64>,
    ) -> Result<Result<Grant, PresenceRefusal>, StoreError> {
        let store = self.store.borrow();
        if !store.bucket_exists(bucket) {
            return Err(StoreError::NoSuchBucket);
        }
        let presence = store.presence.clone();
        let mut presence = presence.borrow_mut();
        Ok(presence.grant(bucket, valid_until_ms, &|each| {
            store.for_each_key(bucket, |k| each(k, FLAG_DRAM));
            if let Some(nvme) = &self.nvme {
                nvme.for_each_key(bucket, |k| each(k, FLAG_NVME));
            }
        }))
    }

    /// Copies `bucket/key` into its bucket's value mirror if it is a small KV block in DRAM
    /// (a node-served read of one key: the next read of it need not be a call).
    pub fn mirror_current(&self, bucket: &str, key: &str) {
        self.store.borrow().mirror_current(bucket, key);
    }

    /// Bytes of value mirrors the shard may keep (`--value-mirror-bytes`).
    pub fn set_mirror_budget(&self, bytes: u64) {
        self.store
            .borrow()
            .presence
            .borrow_mut()
            .set_mirror_budget(bytes);
    }

    /// Turns presence tables on or off (`--no-presence-tables`).
    pub fn set_presence_tables(&self, enabled: bool) {
        self.store
            .borrow()
            .presence
            .borrow_mut()
            .set_enabled(enabled);
    }

    /// What the presence tables did, how many are live and their bytes.
    pub fn presence_stats(&self) -> (PresenceStats, usize, u64) {
        let store = self.store.borrow();
        let p = store.presence.borrow();
        let (tables, bytes) = p.usage();
        (p.stats, tables, bytes)
    }

    /// Sets how long deletes are remembered (`--tombstone-ttl-secs`).
    pub fn set_tombstone_ttl(&self, ttl: Duration) {
        *self.tombstones.borrow_mut() =
            crate::store::tombstones::Tombstones::new(ttl, TOMBSTONES_PER_SHARD);
    }

    /// Sets who is told a bucket's bytes on this shard when a delete changes them.
    pub fn on_usage_change(&self, sink: UsageSink) {
        *self.usage_sink.borrow_mut() = Some(sink);
    }

    fn usage_changed(&self, bucket: &str) {
        if let Some(sink) = self.usage_sink.borrow().as_ref() {
            sink(bucket, self.bucket_bytes(bucket));
        }
    }

    fn is_disk(&self, bucket: &str) -> bool {
        self.nvme.is_some() && self.store.borrow().durability(bucket) == Some(Durability::Disk)
    }

    /// The ETag of the newest version of `bucket/key` in any tier.
    fn current_etag(&self, bucket: &str, key: &str) -> Option<String> {
        let store = self.store.borrow();
        if let Some(etag) = store.dram_etag(bucket, key) {
            return Some(etag.to_string());
        }
        let nvme = self.nvme.as_ref()?;
        nvme_meta(nvme, bucket, key).map(|(_, m)| m.etag.clone())
    }

    /// Decides a write's conditions against every tier; the engine is then left with only the
    /// bucket check (see [`WriteConditions::decided`]). Call without yielding before the write.
    fn check_write(
        &self,
        bucket: &str,
        key: &str,
        cond: &WriteConditions,
    ) -> Result<WriteConditions, StoreError> {
        if !cond.is_conditional() {
            return Ok(cond.clone());
        }
        if in_flight(&self.writing, bucket, key) {
            return Err(StoreError::Conflict);
        }
        self.store.borrow().check_bucket(bucket, cond.incarnation)?;
        let current = self.current_etag(bucket, key);
        cond.check(current.as_deref()).map_err(|missing| {
            if missing {
                StoreError::NoSuchKey
            } else {
                StoreError::PreconditionFailed
            }
        })?;
        Ok(cond.decided())
    }

    // ---- reads ----------------------------------------------------------------------------

    /// GetObject/HeadObject: DRAM, then the demotion queue, then NVMe.
    pub fn get(
        self: &Rc<Self>,
        bucket: String,
        key: String,
        range: Option<RangeSpec>,
        head_only: bool,
        cond: ReadConditions,
    ) -> Step<GetResult> {
        let r = self
            .store
            .borrow_mut()
            .get(&bucket, &key, range, head_only, &cond);
        let Some(nvme) = self.nvme.clone() else {
            self.count_read(&r);
            return Step::Done(r);
        };
        if !matches!(r, Err(StoreError::NoSuchKey)) {
            self.count_read(&r);
            return Step::Done(r);
        }
        let Some((loc, meta)) = nvme_meta(&nvme, &bucket, &key) else {
            self.metrics.misses.inc();
            return Step::Done(r);
        };
        if head_only {
            self.metrics.nvme_hits.inc();
            return Step::Done(serve(&meta, &[], range, true, &cond));
        }
        let this = self.clone();
        Step::wait(async move {
            match nvme.read(loc).await {
                Ok(value) => {
                    this.metrics.nvme_hits.inc();
                    let r = serve(&meta, &value, range, false, &cond);
                    this.maybe_promote(&bucket, &key, &meta, &value, loc);
                    r
                }
                Err(e) => Err(nvme_error(e)),
            }
        })
    }

    fn count_read(&self, r: &GetResult) {
        match r {
            Ok(_) | Err(StoreError::NotModified(_)) | Err(StoreError::PreconditionFailed) => {
                self.metrics.dram_hits.inc()
            }
            Err(StoreError::NoSuchKey) => self.metrics.misses.inc(),
            _ => {}
        }
    }

    /// Copies a small NVMe hit back into DRAM, unless a newer version arrived or a delete
    /// started meanwhile.
    fn maybe_promote(
        &self,
        bucket: &str,
        key: &str,
        meta: &Arc<ObjectMeta>,
        value: &[u8],
        loc: yutu_blockstore::Location,
    ) {
        if in_flight(&self.deleting, bucket, key) || in_flight(&self.writing, bucket, key) {
            return;
        }
        let mut store = self.store.borrow_mut();
        if meta.size > store.capacity() / PROMOTE_SHARE || store.has_key(bucket, key) {
            return;
        }
        let still_current = self.nvme.as_ref().and_then(|n| n.get(bucket, key)) == Some(loc);
        if !still_current {
            return;
        }
        if store
            .put(
                bucket,
                key,
                value,
                (**meta).clone(),
                &WriteConditions::default(),
            )
            .is_ok()
        {
            store.mark_on_nvme(bucket, key);
            self.metrics.promotions.inc();
        }
    }

    /// The shard's DRAM capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.store.borrow().capacity()
    }

    /// For each key, whether any tier holds it.
    pub fn exists(&self, bucket: &str, keys: &[String]) -> Result<Vec<bool>, StoreError> {
        let found = self.store.borrow().exists(bucket, keys)?;
        Ok(found
            .into_iter()
            .zip(keys)
            .map(|(f, k)| {
                f || self
                    .nvme
                    .as_ref()
                    .is_some_and(|n| n.get(bucket, k).is_some())
            })
            .collect())
    }

    // ---- writes ---------------------------------------------------------------------------

    /// PutObject (and CopyObject's write).
    pub fn put(
        self: &Rc<Self>,
        bucket: String,
        key: String,
        data: Bytes,
        mut meta: ObjectMeta,
        cond: WriteConditions,
    ) -> Step<PutResult> {
        let decided = match self.check_write(&bucket, &key, &cond) {
            Ok(d) => d,
            Err(e) => return Step::Done(Err(e)),
        };
        self.stamp(bucket.as_str(), key.as_str(), &mut meta);
        if self.superseded(&bucket, &key, meta.version) {
            self.metrics.superseded_writes.inc();
            return Step::Done(
                self.store
                    .borrow()
                    .check_bucket(&bucket, decided.incarnation)
                    .map(|()| versions::as_written(meta)),
            );
        }
        if !self.is_disk(&bucket) {
            let version = meta.version;
            let r = self
                .store
                .borrow_mut()
                .put(&bucket, &key, &data, meta, &decided);
            if r.is_ok() {
                self.applied(&bucket, &key, version);
            }
            return self.after_memory_write(bucket, key, r);
        }
        let writing = InFlight::enter(&self.writing, &bucket, &key);
        let this = self.clone();
        Step::wait(async move {
            let r = this
                .write_through(&bucket, &key, data, meta, None, &decided)
                .await;
            drop(writing);
            r
        })
    }

    /// A `memory` write was published in DRAM: an older NVMe version is tombstoned before the
    /// answer, so a restart cannot bring it back.
    fn after_memory_write(
        self: &Rc<Self>,
        bucket: String,
        key: String,
        r: PutResult,
    ) -> Step<PutResult> {
        let Some(nvme) = self.nvme.clone() else {
            return Step::Done(r);
        };
        if r.is_err() || nvme.get(&bucket, &key).is_none() {
            return Step::Done(r);
        }
        let fence = InFlight::enter(&self.deleting, &bucket, &key);
        let this = self.clone();
        Step::wait(async move {
            let _fence = fence;
            match nvme.delete(&bucket, &key).await {
                Ok(d) => {
                    this.after_reclaim(&d.reclaimed);
                    this.durable.forget(&bucket, &key);
                    r
                }
                Err(e) => Err(nvme_error(e)),
            }
        })
    }

    /// Stores a block copied in by `fill` (put-from): DRAM for a `memory` bucket, written
    /// through for a `disk` one.
    pub async fn put_filled(
        self: &Rc<Self>,
        bucket: &str,
        key: &str,
        len: u64,
        fill: impl FnOnce(&mut [u8]) -> bool,
    ) -> PutResult {
        if !self.is_disk(bucket) {
            let r = self.store.borrow_mut().put_filled(
                bucket,
                key,
                len,
                ObjectMeta::for_block(len),
                &WriteConditions::default(),
                fill,
            );
            return self
                .after_memory_write(bucket.to_string(), key.to_string(), r)
                .get()
                .await;
        }
        let size = usize::try_from(len).map_err(|_| StoreError::TooLarge {
            size: len,
            capacity: self.store.borrow().capacity(),
        })?;
        let mut data = vec![0u8; size];
        if !fill(&mut data) {
            return Err(StoreError::InvalidRange { size: len });
        }
        let mut meta = ObjectMeta::for_block(len);
        meta.etag = self.store.borrow_mut().next_kv_etag();
        self.write_through(
            bucket,
            key,
            Bytes::from(data),
            meta,
            None,
            &WriteConditions::default(),
        )
        .await
    }

    /// [`TieredStore::put_filled`] for a batch of `(key, len)` blocks of a `memory` bucket,
    /// all filled by one `fill` ([`ShardStore::put_many_filled`]); `None` for a `disk`
    /// bucket, whose blocks are written through one by one.
    pub async fn put_many_filled(
        self: &Rc<Self>,
        bucket: &str,
        blocks: &[(&str, u64)],
        fill: impl FnOnce(&mut [Option<&mut [u8]>]) -> Vec<bool>,
    ) -> Option<Vec<PutResult>> {
        if self.is_disk(bucket) {
            return None;
        }
        let stored = self
            .store
            .borrow_mut()
            .put_many_filled(bucket, blocks, fill);
        let mut out = Vec::with_capacity(stored.len());
        for (&(key, _), r) in blocks.iter().zip(stored) {
            let r = match self.nvme {
                // No older NVMe version to tombstone.
                None => r,
                Some(_) => {
                    self.after_memory_write(bucket.to_string(), key.to_string(), r)
                        .get()
                        .await
                }
            };
            out.push(r);
        }
        Some(out)
    }

    /// Appends to NVMe and syncs, then publishes in DRAM: the `disk` durability path.
    /// `cond` has its ETag conditions decided already; a conditional write marked the key
    /// in flight before deciding them, so no other conditional write decides meanwhile.
    /// A `staged` object (already in the arena, not visible) is published or discarded here,
    /// whatever the outcome.
    async fn write_through(
        &self,
        bucket: &str,
        key: &str,
        data: Bytes,
        meta: ObjectMeta,
        mut staged: Option<Staged>,
        cond: &WriteConditions,
    ) -> PutResult {
        let r = self
            .append_and_publish(bucket, key, data, meta, &mut staged, cond)
            .await;
        if let Some(s) = staged.take() {
            self.store.borrow_mut().discard_staged(s);
        }
        r
    }

    async fn append_and_publish(
        &self,
        bucket: &str,
        key: &str,
        data: Bytes,
        meta: ObjectMeta,
        staged: &mut Option<Staged>,
        cond: &WriteConditions,
    ) -> PutResult {
        let _writing = InFlight::enter(&self.writing, bucket, key);
        let Some(nvme) = self.nvme.clone() else {
            return Err(StoreError::Device("no NVMe tier".into()));
        };
        // Held until this write is published or refused: the key's next durable write is
        // checked, placed and published after this one, in both tiers alike.
        let _turn = self.order.turn(bucket, key).await?;
        self.store.borrow().check_write(bucket, key, cond)?;
        let mut meta = meta;
        self.stamp(bucket, key, &mut meta);
        if let Some(s) = staged.as_mut() {
            s.set_version(meta.version);
        }
        // A newer version (or delete) was applied while this write waited for its turn:
        // this one is overwritten already. Appending it would leave NVMe's newest record
        // older than what DRAM serves, and a restart would bring the older one back.
        if self.superseded(bucket, key, meta.version) {
            self.metrics.superseded_writes.inc();
            return Ok(Arc::new(meta));
        }
        let blob = encode_meta(&meta, true)?;
        let max = nvme.max_value_len(bucket, key, blob.len());
        if data.len() as u64 > max {
            return Err(StoreError::TooLarge {
                size: data.len() as u64,
                capacity: max,
            });
        }
        let record = durable::record_size(&nvme, bucket, key, blob.len(), data.len() as u64);
        let _reserved = self.durable.reserve(bucket, key, record).inspect_err(|_| {
            self.metrics.durable_refused.inc();
        })?;
        let appended = nvme
            .append_with_meta(bucket, key, &blob, &data)
            .await
            .map_err(nvme_error)?;
        self.durable
            .stored(bucket, key, appended.location.record_len());
        self.after_reclaim(&appended.reclaimed);
        nvme.sync(&appended.location).await.map_err(nvme_error)?;
        self.publish_gauges();
        // No other write of the key was placed during this one's turn: the index points at
        // this record, at its copy when a reclamation rewrote it forward (a larger sequence
        // number, same bytes), or at nothing when a delete removed it meanwhile.
        match nvme.get(bucket, key) {
            Some(now) if now.seq() >= appended.location.seq() => {}
            _ => return Ok(Arc::new(meta)),
        }
        if self.superseded_in_dram(bucket, key, meta.version) {
            self.metrics.superseded_writes.inc();
            if self.deleted_since(bucket, key, meta.version) {
                // Deleted while it was being written: the record must not come back at
                // the next start.
                let d = nvme.delete(bucket, key).await.map_err(nvme_error)?;
                self.durable.forget(bucket, key);
                self.after_reclaim(&d.reclaimed);
                if let Some(seq) = d.seq {
                    nvme.sync_seq(seq).await.map_err(nvme_error)?;
                }
            }
            return Ok(Arc::new(meta));
        }
        self.applied(bucket, key, meta.version);
        let mut store = self.store.borrow_mut();
        let stored = match staged.take() {
            Some(s) => store.publish_staged(bucket, key, s),
            None => match store.put(
                bucket,
                key,
                &data,
                meta.clone(),
                &WriteConditions::default(),
            ) {
                Ok(m) => m,
                // Durable on NVMe, but DRAM has no room for it right now: an older DRAM copy
                // must not go on answering reads, so it goes, and reads come from NVMe.
                Err(StoreError::TooLarge { .. }) | Err(StoreError::NoSpace(_)) => {
                    store.remove_entry(bucket, key);
                    store.record_tier_event(bucket, key, meta.kv, Some(Tier::Nvme));
                    return Ok(Arc::new(meta));
                }
                Err(e) => return Err(e),
            },
        };
        store.mark_on_nvme(bucket, key);
        store.record_tier_event(bucket, key, stored.kv, Some(Tier::Dram));
        Ok(stored)
    }

    /// Publishes a staged object (a completed upload or an ended KV put): at once in a
    /// `memory` bucket, after it is durable on NVMe in a `disk` one. Until then readers see
    /// the old version, and a refused write-through leaves it in place.
    pub async fn publish_staged(
        self: &Rc<Self>,
        bucket: &str,
        key: &str,
        staged: Staged,
    ) -> PutResult {
        if !self.is_disk(bucket) {
            let r = {
                let mut store = self.store.borrow_mut();
                match store.check_bucket(bucket, None) {
                    Ok(()) => Ok(store.publish_staged(bucket, key, staged)),
                    Err(e) => {
                        store.discard_staged(staged);
                        Err(e)
                    }
                }
            };
            return self
                .after_memory_write(bucket.to_string(), key.to_string(), r)
                .get()
                .await;
        }
        let (data, meta) = {
            let store = self.store.borrow();
            (store.staged_bytes(&staged), staged.meta().clone())
        };
        self.write_through(
            bucket,
            key,
            data,
            meta,
            Some(staged),
            &WriteConditions::default(),
        )
        .await
    }

    /// CompleteMultipartUpload: conditions decided against every tier, the parts assembled in
    /// DRAM, and published (after the write-through, for a `disk` bucket).
    pub fn complete_upload(
        self: &Rc<Self>,
        id: String,
        bucket: String,
        key: String,
        parts: Vec<CompletePart>,
        cond: WriteConditions,
    ) -> Step<PutResult> {
        let decided = match self.check_write(&bucket, &key, &cond) {
            Ok(d) => d,
            Err(e) => return Step::Done(Err(e)),
        };
        if !self.is_disk(&bucket) {
            let r = self
                .store
                .borrow_mut()
                .complete_upload(&id, &bucket, &key, &parts, &decided);
            return self.after_memory_write(bucket, key, r);
        }
        let staged = match self
            .store
            .borrow_mut()
            .stage_upload(&id, &bucket, &key, &parts, &decided)
        {
            Ok(s) => s,
            Err(e) => return Step::Done(Err(e)),
        };
        let writing = InFlight::enter(&self.writing, &bucket, &key);
        let this = self.clone();
        Step::wait(async move {
            let r = this.publish_staged(&bucket, &key, staged).await;
            drop(writing);
            r
        })
    }

    /// DeleteObject / DeleteObjects: both tiers; per key, whether it existed.
    pub fn delete(
        self: &Rc<Self>,
        bucket: String,
        keys: Vec<String>,
    ) -> Step<Result<Vec<bool>, StoreError>> {
        self.delete_in(bucket, keys, None)
    }

    /// [`TieredStore::delete`] from the incarnation of the bucket that the permission check
    /// saw (when given): a bucket deleted and created again since is another bucket, and
    /// the delete answers NoSuchBucket instead of removing its objects.
    pub fn delete_in(
        self: &Rc<Self>,
        bucket: String,
        keys: Vec<String>,
        incarnation: Option<u64>,
    ) -> Step<Result<Vec<bool>, StoreError>> {
        if incarnation.is_some() {
            if let Err(e) = self.store.borrow().check_bucket(&bucket, incarnation) {
                return Step::Done(Err(e));
            }
        }
        let r = self.store.borrow_mut().delete_many(&bucket, &keys);
        self.usage_changed(&bucket);
        let Some(nvme) = self.nvme.clone() else {
            return Step::Done(r);
        };
        let Ok(mut existed) = r else {
            return Step::Done(r);
        };
        let on_nvme: Vec<usize> = (0..keys.len())
            .filter(|i| nvme.get(&bucket, &keys[*i]).is_some())
            .collect();
        if on_nvme.is_empty() {
            return Step::Done(Ok(existed));
        }
        // Fence every key now, before the first await: a read already under way must not
        // promote what this delete removes.
        let fences: Vec<InFlight> = on_nvme
            .iter()
            .map(|i| InFlight::enter(&self.deleting, &bucket, &keys[*i]))
            .collect();
        let disk = self.is_disk(&bucket);
        let this = self.clone();
        Step::wait(async move {
            let _fences = fences;
            let mut last_seq = None;
            for i in &on_nvme {
                let key = &keys[*i];
                // Whether the record is a KV block, read before the delete drops its metadata.
                let kv = this.store.borrow().records_events()
                    && BlockHash::from_key(key).is_none()
                    && nvme.meta(&bucket, key).is_some_and(|m| is_kv(&m));
                let d = nvme.delete(&bucket, key).await.map_err(nvme_error)?;
                existed[*i] = true;
                last_seq = d.seq.or(last_seq);
                this.durable.forget(&bucket, key);
                this.after_reclaim(&d.reclaimed);
                this.store
                    .borrow_mut()
                    .record_tier_event(&bucket, key, kv, None);
            }
            if disk {
                if let Some(seq) = last_seq {
                    nvme.sync_seq(seq).await.map_err(nvme_error)?;
                }
            }
            this.publish_gauges();
            this.usage_changed(&bucket);
            Ok(existed)
        })
    }

    // ---- listing and buckets --------------------------------------------------------------

    /// One shard's listing page over both tiers.
    pub fn list(&self, bucket: &str, q: &ListQuery) -> Result<Vec<ListItem>, StoreError> {
        let dram = self.store.borrow().list(bucket, q)?;
        let Some(nvme) = &self.nvme else {
            return Ok(dram);
        };
        let want = q.limit.saturating_add(1);
        // Read the NVMe index in chunks, rolling delimiters up as the DRAM page does, until
        // the page is full or the bucket's keys are exhausted.
        let mut items: Vec<ListItem> = Vec::new();
        let mut after = q.after.clone().filter(|a| a.as_str() >= q.prefix.as_str());
        loop {
            let chunk = nvme.list(bucket, &q.prefix, after.as_deref(), 1000);
            if chunk.is_empty() {
                break;
            }
            after = chunk.last().map(|l| l.key.clone());
            let map: std::collections::BTreeMap<String, ListedMeta> = chunk
                .into_iter()
                .filter_map(|l| {
                    let meta = decode_meta(&l.meta, l.location.value_len())?;
                    Some((l.key, ListedMeta(Arc::new(meta))))
                })
                .collect();
            let page = shard_page(&map, q);
            items = merge(vec![items, page], want).0;
            if items.len() >= want {
                break;
            }
        }
        Ok(merge(vec![dram, items], want).0)
    }

    /// First phase of a bucket delete on this shard: closed to writes; whether both tiers
    /// hold nothing of it. A durable write still in flight counts as an object: its record
    /// is (or is about to be) on NVMe, and would outlive the bucket.
    pub fn close_bucket(&self, bucket: &str) -> Result<bool, StoreError> {
        let empty = self.store.borrow_mut().close_bucket(bucket)?;
        if self.writing.borrow().keys().any(|(b, _)| b == bucket) {
            return Ok(false);
        }
        let on_nvme = self
            .nvme
            .as_ref()
            .is_some_and(|n| !n.list(bucket, "", None, 1).is_empty());
        Ok(empty && !on_nvme)
    }

    /// The KV events recorded since the last call (for the conductor's feed).
    pub fn take_events(&self) -> Vec<yutu_api::events::KvEventKind> {
        self.store.borrow_mut().take_events()
    }

    /// Every KV block this shard holds, by bucket and fastest tier.
    pub fn blocks(&self) -> Vec<(String, Tier, Vec<BlockHash>)> {
        let dram = self.store.borrow().blocks();
        let mut out: Vec<(String, Tier, Vec<BlockHash>)> = Vec::new();
        let mut in_dram = std::collections::HashSet::new();
        for (bucket, blocks) in dram {
            for b in &blocks {
                in_dram.insert((bucket.clone(), *b));
            }
            out.push((bucket, Tier::Dram, blocks));
        }
        let Some(nvme) = &self.nvme else {
            return out;
        };
        for bucket in nvme.buckets() {
            let mut blocks = Vec::new();
            let mut after: Option<String> = None;
            loop {
                let chunk = nvme.list(&bucket, "", after.as_deref(), 4096);
                let Some(last) = chunk.last() else { break };
                after = Some(last.key.clone());
                blocks.extend(
                    chunk
                        .iter()
                        .filter_map(|l| {
                            block_id(
                                BlockHash::from_key(&l.key).is_none() && is_kv(&l.meta),
                                &l.key,
                            )
                        })
                        .filter(|b| !in_dram.contains(&(bucket.clone(), *b))),
                );
            }
            if !blocks.is_empty() {
                out.push((bucket, Tier::Nvme, blocks));
            }
        }
        out
    }

    /// Bytes of `bucket`'s objects this shard holds, DRAM and NVMe together, each object
    /// counted once. An object replaced in DRAM counts twice until the older NVMe version's
    /// tombstone is written (moments), never less than once.
    pub fn bucket_bytes(&self, bucket: &str) -> u64 {
        let dram = self.store.borrow().held_in_dram(bucket);
        dram + self.nvme.as_ref().map_or(0, |n| n.bucket_bytes(bucket))
    }

    /// The size of the newest version of `bucket/key` in either tier, 0 when absent: the
    /// bytes a write of the key replaces.
    pub fn stored_size(&self, bucket: &str, key: &str) -> u64 {
        if let Some(n) = self.store.borrow().dram_size(bucket, key) {
            return n;
        }
        self.nvme
            .as_ref()
            .and_then(|n| n.get(bucket, key))
            .map_or(0, |l| l.value_len())
    }

    /// Objects a region reclamation dropped left the node unless DRAM still has them.
    fn after_reclaim(&self, reclaimed: &[yutu_blockstore::Reclaimed]) {
        let mut store = self.store.borrow_mut();
        for r in reclaimed {
            for o in &r.dropped {
                if self.durable.forget(&o.bucket, &o.key) {
                    // Never expected: the budget keeps room to rewrite every durable record.
                    tracing::error!(bucket = %o.bucket, key = %o.key, "NVMe reclamation dropped a durable object");
                    self.metrics.durable_dropped.inc();
                }
                if store.has_key(&o.bucket, &o.key) {
                    store.mark_off_nvme(&o.bucket, &o.key);
                } else {
                    // The dropped record's metadata is gone with it: whether it was a KV
                    // block is unknown, so any key is published as removed (a removal of an
                    // id the conductor never indexed changes nothing there).
                    store.record_tier_event(&o.bucket, &o.key, true, None);
                }
            }
        }
    }

    fn publish_gauges(&self) {
        self.metrics.durable_used.set(self.durable.used());
        // The limit follows the largest durable record held (see `durable`).
        self.metrics.durable_limit.set(self.durable.limit());
    }

    // ---- background work ------------------------------------------------------------------

    /// Starts the demoter and the NVMe gauge refresher on the current executor.
    pub fn spawn_background(self: &Rc<Self>) {
        if self.nvme.is_none() {
            return;
        }
        glommio::spawn_local(self.clone().demote_forever()).detach();
        glommio::spawn_local(self.clone().refresh_stats_forever()).detach();
    }

    /// Writes evicted objects to NVMe, in eviction order.
    async fn demote_forever(self: Rc<Self>) {
        let Some(nvme) = self.nvme.clone() else {
            return;
        };
        loop {
            let next = self.store.borrow_mut().next_demotion();
            let Some((bucket, key, meta, data)) = next else {
                glommio::timer::sleep(Duration::from_millis(2)).await;
                continue;
            };
            let blob = match encode_meta(&meta, false) {
                Ok(b) if data.len() as u64 <= nvme.max_value_len(&bucket, &key, b.len()) => b,
                _ => {
                    self.drop_demotion(&bucket, &key, &meta);
                    continue;
                }
            };
            match nvme.append_with_meta(&bucket, &key, &blob, &data).await {
                Ok(appended) => {
                    self.after_reclaim(&appended.reclaimed);
                    let current = self
                        .store
                        .borrow_mut()
                        .finish_demotion(&bucket, &key, &meta);
                    if current {
                        self.metrics.demotions.inc();
                    } else if !self.store.borrow().newer_than_nvme(&bucket, &key)
                        || nvme.get(&bucket, &key) == Some(appended.location)
                    {
                        // Replaced or deleted while the append was in flight: the record just
                        // written is stale, and must not outlive a restart.
                        if let Err(e) = nvme.delete(&bucket, &key).await {
                            tracing::error!(error = %e, bucket, key, "cannot tombstone a stale demotion");
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, bucket, key, "demotion failed; the object is dropped");
                    self.drop_demotion(&bucket, &key, &meta);
                }
            }
        }
    }

    fn drop_demotion(&self, bucket: &str, key: &str, meta: &Arc<ObjectMeta>) {
        let mut store = self.store.borrow_mut();
        store.finish_demotion(bucket, key, meta);
        store.record_tier_event(bucket, key, meta.kv, None);
        self.metrics.demotions_dropped.inc();
    }

    /// Refreshes the NVMe gauges every second.
    async fn refresh_stats_forever(self: Rc<Self>) {
        let Some(nvme) = self.nvme.clone() else {
            return;
        };
        loop {
            let s = nvme.stats();
            let m = &self.metrics;
            m.nvme_used.set(s.used_bytes);
            m.nvme_capacity.set(s.capacity_bytes);
            m.nvme_objects.set(s.records);
            m.nvme_reclaimed_regions.set(s.regions_reclaimed);
            m.nvme_corrupt_records.set(s.corrupt_records);
            self.publish_gauges();
            glommio::timer::sleep(Duration::from_secs(1)).await;
        }
    }
}
