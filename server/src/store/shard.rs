//! One shard's objects: the index, the DRAM arena and the eviction policy together.
//!
//! Everything here runs on the owning shard's thread and never awaits, so each operation is
//! atomic with respect to every other: a reader sees the old object or the whole new one,
//! never a mix, without a lock.
//!
//! Capacity accounting charges each object its arena reservation plus an estimate of its
//! index footprint (key, metadata and a fixed overhead), so that `used <= capacity` bounds the
//! memory the shard really holds, not just the payload bytes.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::rc::Rc;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use yutu_api::RangeSpec;

use super::arena::{Arena, Extent};
use super::bucket_settings::BucketSettings;
use super::events::EventLog;
use super::eviction::{EntryId, EvictionPolicy};
use super::kv::{Lease, PendingPut, Pin};
use super::multipart::Upload;
use super::presence::{Presence, FLAG_DRAM};
use crate::config::KvLimits;
use crate::metrics::ShardMetrics;
use crate::model::listing::{merge, shard_page, ListItem, ListQuery, Listable};
use crate::model::{serve, BucketInfo, Durability, GetResult, ListedMeta, ObjectMeta, StoreError};

use crate::model::conditions::{ReadConditions, WriteConditions};
use yutu_api::block_hash::BlockHash;
use yutu_api::events::{KvEventKind, Tier};

/// The shard's in-memory maps: a per-process-seeded foldhash instead of SipHash, whose
/// hashing was several percent of a 4 KiB put's time on the node. Ids are the shard's own numbers, and
/// bucket names are few and made by their owners, so SipHash's stronger keying buys
/// nothing here; the per-process seed still keeps collisions unpredictable.
pub(crate) type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// Index bytes charged per object beyond its key and metadata: the B-tree slot, the entry,
/// the reverse id map and the policy's node, rounded up.
pub const ENTRY_OVERHEAD: u64 = 256;

/// An object assembled in the arena but not visible yet: a `disk` bucket's completed upload
/// or ended KV put waits in this form until it is durable on NVMe, so that a write the NVMe
/// tier refuses never replaces the version readers see. Hand it back to the store with
/// [`ShardStore::publish_staged`] or [`ShardStore::discard_staged`]; dropping it leaks its
/// reservation, hence `must_use`.
#[must_use]
pub struct Staged {
    extent: Extent,
    meta: ObjectMeta,
    charge: u64,
}

impl Staged {
    pub(crate) fn new(extent: Extent, meta: ObjectMeta, charge: u64) -> Staged {
        Staged {
            extent,
            meta,
            charge,
        }
    }

    pub fn meta(&self) -> &ObjectMeta {
        &self.meta
    }

    /// Gives the staged object the version its write-through was stamped with.
    pub fn set_version(&mut self, version: crate::model::Version) {
        self.meta.version = version;
    }
}

/// The ETag a published version gets ([`ShardStore::publish_as`]).
#[derive(Clone, Copy)]
pub(crate) enum NewEtag {
    /// The one in its metadata.
    Given,
    /// A KV block's, in [`ShardStore::next_kv_etag`]'s form (`meta.etag` is ignored): an
    /// overwrite renders it into the old version's ETag buffer, so the block's metadata costs
    /// no allocation.
    Kv,
}

/// Writes the ETag of KV write `seq` of a store salted `salt` into `out`, replacing what it
/// held (its buffer is kept): [`ShardStore::next_kv_etag`] tells the form.
pub(crate) fn render_kv_etag(salt: u64, seq: u64, out: &mut String) {
    let mut raw = [0u8; 16];
    raw[..8].copy_from_slice(&salt.to_be_bytes());
    raw[8..].copy_from_slice(&seq.to_be_bytes());
    let mut text = [0u8; 32];
    out.clear();
    out.push('"');
    if hex::encode_to_slice(raw, &mut text).is_ok() {
        out.push_str(std::str::from_utf8(&text).unwrap_or_default());
    }
    out.push_str("-1\"");
}

pub(crate) struct Entry {
    pub(crate) id: EntryId,
    pub(crate) extent: Extent,
    pub(crate) meta: Arc<ObjectMeta>,
    pub(crate) charge: u64,
    /// The same version is also on NVMe (written through, or promoted from there): evicting
    /// it needs no demotion.
    pub(crate) on_nvme: bool,
}

impl Listable for Entry {
    fn size(&self) -> u64 {
        self.meta.size
    }
    fn etag(&self) -> &str {
        &self.meta.etag
    }
    fn last_modified(&self) -> SystemTime {
        self.meta.last_modified
    }
}

pub(crate) struct BucketPart {
    incarnation: u64,
    pub(crate) durability: Durability,
    closing: bool,
    pub(crate) objects: BTreeMap<String, Entry>,
    /// Who owns the bucket and what it allows: not the objects' business, kept beside them.
    settings: BucketSettings,
    /// Bytes of the bucket's objects that only DRAM holds: entries not also on NVMe, and
    /// evicted ones waiting for demotion. With the NVMe tier's count of the bucket's
    /// records, the bytes the bucket holds on this shard, each object counted once.
    held: u64,
}

impl BucketPart {
    fn info(&self, name: &str) -> BucketInfo {
        let s = &self.settings;
        BucketInfo {
            name: name.to_string(),
            created: s.created,
            owner: s.owner.clone(),
            durability: self.durability,
            incarnation: self.incarnation,
            quota: s.quota,
            acl: s.acl.clone(),
            cors: s.cors.clone(),
            policy: s.policy.clone(),
            public_access_block: s.public_access_block,
            ownership: s.ownership,
        }
    }
}

pub struct ShardStore {
    pub(crate) arena: Arena,
    /// The presence tables clients map (`presence.rs`), told of every key DRAM gains or
    /// loses; shared with the NVMe tier, which tells them of its keys.
    pub(crate) presence: Rc<RefCell<Presence>>,
    pub(crate) buckets: FastMap<String, BucketPart>,
    /// Multipart uploads in progress whose key this shard owns, by upload id.
    pub(crate) uploads: HashMap<String, Upload>,
    /// Entries under at least one read lease: never evicted, never freed while pinned.
    pub(crate) pins: FastMap<EntryId, Pin>,
    /// Read leases handed out with descriptors, by lease id.
    pub(crate) leases: HashMap<u64, Lease>,
    /// Two-phase puts between put-start and put-end, by put id.
    pub(crate) pending_puts: HashMap<u64, PendingPut>,
    /// The ranges leases and puts granted, shared with the transfer engine's guard.
    pub(crate) grants: Option<Arc<super::kv::Grants>>,
    /// This shard's share of the per-user KV limits, and what each user holds.
    pub(crate) kv_limits: KvLimits,
    pub(crate) kv_usage: HashMap<String, super::kv::KvUsage>,
    /// Every lease's and pending put's deadline, in order, so expiry visits only what is due.
    pub(crate) kv_deadlines: BTreeSet<(std::time::Instant, super::kv::Held, u64)>,
    /// Reverse index for the eviction policy, which deals in ids only.
    pub(crate) ids: FastMap<EntryId, (String, String)>,
    pub(crate) policy: Box<dyn EvictionPolicy>,
    pub(crate) next_id: EntryId,
    pub(crate) used: u64,
    capacity: u64,
    pub(crate) metrics: Arc<ShardMetrics>,
    /// KV events for the conductor; `None` when no conductor is configured.
    events: Option<EventLog>,
    /// Evicted objects on their way to NVMe, readable until their append completes.
    pub(crate) demoting: HashMap<(String, String), (Arc<ObjectMeta>, Bytes)>,
    demote_queue: VecDeque<(String, String)>,
    demote_bytes: u64,
    /// Most bytes waiting for demotion; 0 when there is no NVMe tier. Past it, evicted
    /// objects are dropped instead of demoted (the admission policy under back-pressure).
    demote_budget: u64,
    /// Random per store instance: with `next_id`, makes KV ETags unique across shards and
    /// restarts (see `kv::ShardStore::next_kv_etag`).
    pub(crate) etag_salt: u64,
    /// Keys pinned by the admin API (`pinning`), by name: a pin outlives overwrites.
    pub(crate) admin_pins: HashMap<(String, String), super::pinning::AdminPin>,
    /// Entries the policy offered as victims while hard-pinned: out of its order until
    /// unpinned (then given back), so a pinned entry costs nothing per eviction.
    pub(crate) pinned_out: std::collections::HashSet<EntryId, foldhash::fast::RandomState>,
}

impl ShardStore {
    pub fn new(arena: Arena, policy: Box<dyn EvictionPolicy>, metrics: Arc<ShardMetrics>) -> Self {
        let capacity = arena.capacity();
        metrics.set_dram(0, capacity, 0);
        ShardStore {
            arena,
            presence: Rc::new(RefCell::new(Presence::new(true, metrics.clone()))),
            buckets: FastMap::default(),
            uploads: HashMap::new(),
            pins: FastMap::default(),
            leases: HashMap::new(),
            pending_puts: HashMap::new(),
            grants: None,
            kv_limits: KvLimits::NONE,
            kv_usage: HashMap::new(),
            kv_deadlines: BTreeSet::new(),
            ids: FastMap::default(),
            policy,
            next_id: 1,
            used: 0,
            capacity,
            metrics,
            events: None,
            demoting: HashMap::new(),
            demote_queue: VecDeque::new(),
            demote_bytes: 0,
            demote_budget: 0,
            etag_salt: random_salt(),
            admin_pins: HashMap::new(),
            pinned_out: Default::default(),
        }
    }

    /// Evicted objects of `memory` buckets go to NVMe, with at most `budget` bytes in flight.
    pub fn enable_demotion(&mut self, budget: u64) {
        self.demote_budget = budget;
    }

    /// The next object waiting for demotion, if any.
    pub fn next_demotion(&mut self) -> Option<(String, String, Arc<ObjectMeta>, Bytes)> {
        while let Some((b, k)) = self.demote_queue.pop_front() {
            if let Some((meta, data)) = self.demoting.get(&(b.clone(), k.clone())) {
                return Some((b, k, meta.clone(), data.clone()));
            }
        }
        None
    }

    /// The demoter finished with `bucket/key`: drops it from the in-flight map if it is still
    /// the version that was written (`true`), else reports that it was replaced or deleted.
    pub fn finish_demotion(&mut self, bucket: &str, key: &str, meta: &Arc<ObjectMeta>) -> bool {
        let k = (bucket.to_string(), key.to_string());
        match self.demoting.get(&k) {
            Some((m, _)) if Arc::ptr_eq(m, meta) => {
                if let Some((m, _)) = self.demoting.remove(&k) {
                    self.demote_bytes -= m.size;
                    self.count_held(bucket, 0, m.size);
                }
                self.presence
                    .borrow_mut()
                    .changed(bucket, key, FLAG_DRAM, false);
                true
            }
            _ => false,
        }
    }

    /// Whether DRAM (or the demotion queue) holds `bucket/key` in a version not on NVMe.
    pub fn newer_than_nvme(&self, bucket: &str, key: &str) -> bool {
        let in_dram = self
            .buckets
            .get(bucket)
            .and_then(|b| b.objects.get(key))
            .is_some_and(|e| !e.on_nvme);
        in_dram
            || self
                .demoting
                .contains_key(&(bucket.to_string(), key.to_string()))
    }

    /// Records that the DRAM version of `bucket/key` is also on NVMe.
    pub fn mark_on_nvme(&mut self, bucket: &str, key: &str) {
        self.set_on_nvme(bucket, key, true);
    }

    /// Records that NVMe dropped its copy of `bucket/key` (a reclaimed cache record): the DRAM
    /// version is the only one again, and is demoted rather than dropped when evicted.
    pub fn mark_off_nvme(&mut self, bucket: &str, key: &str) {
        self.set_on_nvme(bucket, key, false);
    }

    fn set_on_nvme(&mut self, bucket: &str, key: &str, on: bool) {
        let Some(part) = self.buckets.get_mut(bucket) else {
            return;
        };
        if let Some(e) = part.objects.get_mut(key) {
            if e.on_nvme != on {
                e.on_nvme = on;
                let size = e.meta.size;
                if on {
                    part.held = part.held.saturating_sub(size);
                } else {
                    part.held += size;
                }
            }
        }
    }

    pub fn has_key(&self, bucket: &str, key: &str) -> bool {
        self.buckets
            .get(bucket)
            .is_some_and(|b| b.objects.contains_key(key))
            || self
                .demoting
                .contains_key(&(bucket.to_string(), key.to_string()))
    }

    pub fn durability(&self, bucket: &str) -> Option<Durability> {
        self.buckets.get(bucket).map(|b| b.durability)
    }

    /// Records a KV event for a block that moved between tiers or left NVMe; `kv`: it was
    /// written through the KV API ([`ObjectMeta::kv`]).
    pub fn record_tier_event(&mut self, bucket: &str, key: &str, kv: bool, tier: Option<Tier>) {
        if let Some(ev) = self.events.as_mut() {
            match tier {
                Some(t) => ev.stored(bucket, key, kv, t),
                None => ev.removed(bucket, key, kv),
            }
        }
    }

    /// Whether events are recorded (a conductor is configured): callers skip the work of
    /// finding out whether an object is a KV block otherwise.
    pub fn records_events(&self) -> bool {
        self.events.is_some()
    }

    /// This shard's share of the per-user KV limits.
    pub fn set_kv_limits(&mut self, limits: KvLimits) {
        self.kv_limits = limits;
    }

    /// Shares the lease and put grants with the transfer engine.
    pub fn set_grants(&mut self, grants: Arc<super::kv::Grants>) {
        self.grants = Some(grants);
    }

    /// Starts recording KV events (a conductor is configured).
    pub fn record_events(&mut self) {
        self.events = Some(EventLog::default());
    }

    pub fn take_events(&mut self) -> Vec<KvEventKind> {
        self.events.as_mut().map(EventLog::take).unwrap_or_default()
    }

    /// Every KV block this shard holds, by bucket.
    pub fn blocks(&self) -> Vec<(String, Vec<BlockHash>)> {
        self.buckets
            .iter()
            .map(|(name, b)| {
                let blocks: Vec<BlockHash> = b
                    .objects
                    .iter()
                    .filter_map(|(k, e)| e.meta.block_id(k))
                    .collect();
                (name.clone(), blocks)
            })
            .filter(|(_, blocks)| !blocks.is_empty())
            .collect()
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    pub fn used(&self) -> u64 {
        self.used
    }

    pub fn object_count(&self) -> usize {
        self.ids.len()
    }

    // ---- buckets -------------------------------------------------------------------------

    pub fn add_bucket(
        &mut self,
        name: &str,
        created: SystemTime,
        owner: &str,
        durability: Durability,
        incarnation: u64,
    ) {
        self.buckets
            .entry(name.to_string())
            .or_insert_with(|| BucketPart {
                incarnation,
                durability,
                closing: false,
                objects: BTreeMap::new(),
                settings: BucketSettings::new(created, owner),
                held: 0,
            });
    }

    /// A bucket's settings, `None` when it does not exist.
    pub fn bucket_settings(&self, name: &str) -> Option<&BucketSettings> {
        self.buckets.get(name).map(|b| &b.settings)
    }

    /// Each key of `bucket` in DRAM.
    pub fn for_each_key(&self, bucket: &str, mut f: impl FnMut(&str)) {
        if let Some(b) = self.buckets.get(bucket) {
            b.objects.keys().for_each(|k| f(k));
        }
    }

    /// Copies `bucket/key` into the bucket's value mirror when DRAM holds it as a small KV
    /// block and a mirror is live (`presence.rs`): the value as of now, on the shard's
    /// thread, so no later change can be missed (each drops it again).
    pub fn mirror_current(&self, bucket: &str, key: &str) {
        let Some(e) = self.buckets.get(bucket).and_then(|b| b.objects.get(key)) else {
            return;
        };
        if e.meta.kv && e.meta.size <= super::presence::MIRROR_VALUE_MAX as u64 {
            self.presence
                .borrow_mut()
                .stored(bucket, key, self.arena.bytes(&e.extent));
        }
    }

    /// A bucket's settings to change (`node::buckets` does, on every shard). Its presence
    /// table is retired first: who may read it may be about to change (`presence.rs`).
    pub fn bucket_settings_mut(&mut self, name: &str) -> Option<&mut BucketSettings> {
        self.presence.borrow_mut().retire(name);
        self.buckets.get_mut(name).map(|b| &mut b.settings)
    }

    /// What the permission check needs of a bucket: its settings and incarnation; `None`
    /// when it does not exist.
    pub fn bucket_access(&self, name: &str) -> Option<(&BucketSettings, u64)> {
        self.buckets.get(name).map(|b| (&b.settings, b.incarnation))
    }

    /// Bytes of the bucket's objects only DRAM holds on this shard (see `BucketPart::held`).
    pub fn held_in_dram(&self, name: &str) -> u64 {
        self.buckets.get(name).map_or(0, |b| b.held)
    }

    /// Moves a bucket's DRAM-only byte count; every change of an entry's `on_nvme`, of the
    /// index and of the demotion map goes through here.
    fn count_held(&mut self, bucket: &str, add: u64, sub: u64) {
        if let Some(b) = self.buckets.get_mut(bucket) {
            b.held = (b.held + add).saturating_sub(sub);
        }
    }

    /// The owner and incarnation of a bucket, `None` when it does not exist.
    pub fn bucket_identity(&self, name: &str) -> Option<(&str, u64)> {
        self.buckets
            .get(name)
            .map(|b| (b.settings.owner.as_str(), b.incarnation))
    }

    /// Whether the bucket exists at all, even while a delete of it is in progress.
    pub fn bucket_known(&self, name: &str) -> bool {
        self.buckets.contains_key(name)
    }

    pub fn bucket_exists(&self, name: &str) -> bool {
        self.buckets.get(name).is_some_and(|b| !b.closing)
    }

    pub fn buckets(&self) -> Vec<BucketInfo> {
        let mut out: Vec<BucketInfo> = self.buckets.iter().map(|(name, b)| b.info(name)).collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// One bucket's settings, `None` when it does not exist.
    pub fn bucket_info(&self, name: &str) -> Option<BucketInfo> {
        self.buckets.get(name).map(|b| b.info(name))
    }

    /// First phase of a bucket delete: stop accepting writes and say whether this shard
    /// holds any of the bucket's objects.
    pub fn close_bucket(&mut self, name: &str) -> Result<bool, StoreError> {
        let demoting = self.demoting.keys().any(|(b, _)| b == name);
        let b = self.buckets.get_mut(name).ok_or(StoreError::NoSuchBucket)?;
        b.closing = true;
        Ok(b.objects.is_empty() && !demoting)
    }

    /// Second phase: the bucket is gone (commit) or open again (abort).
    pub fn finish_close(&mut self, name: &str, commit: bool) {
        if commit {
            if self.buckets.get(name).is_some_and(|b| b.objects.is_empty()) {
                self.buckets.remove(name);
                self.presence.borrow_mut().retire(name);
                self.drop_uploads_of(name);
                if let Some(ev) = self.events.as_mut() {
                    ev.cleared(name);
                }
            }
        } else if let Some(b) = self.buckets.get_mut(name) {
            b.closing = false;
        }
    }

    // ---- objects -------------------------------------------------------------------------

    /// Stores `data` under `bucket/key`, replacing any previous object, evicting as needed.
    pub fn put(
        &mut self,
        bucket: &str,
        key: &str,
        data: &[u8],
        meta: ObjectMeta,
        cond: &WriteConditions,
    ) -> Result<Arc<ObjectMeta>, StoreError> {
        self.check_write(bucket, key, cond)?;
        let size = data.len() as u64;
        let charge = Self::charge_for(bucket, key, size, &meta);
        if charge > self.capacity {
            return Err(StoreError::TooLarge {
                size,
                capacity: self.capacity,
            });
        }
        let extent = self.reserve_replacing(bucket, key, size, charge)?;
        // Streaming stores: the object waits in the arena for a later read (`cold_copy`).
        yutu_transfer::cold_copy::copy_cold_slice(self.arena.bytes_mut(&extent), data);
        Ok(self.publish(bucket, key, extent, meta, charge))
    }

    /// Refuses a write into a missing or closing bucket, or into another incarnation of it.
    pub fn check_bucket(&self, bucket: &str, incarnation: Option<u64>) -> Result<(), StoreError> {
        match self.buckets.get(bucket) {
            None => Err(StoreError::NoSuchBucket),
            Some(b) if b.closing => Err(StoreError::BucketClosing),
            Some(b) if incarnation.is_some_and(|i| i != b.incarnation) => {
                Err(StoreError::NoSuchBucket)
            }
            Some(_) => Ok(()),
        }
    }

    /// The ETag of the DRAM (or in-flight demotion) version of `bucket/key`.
    /// The metadata of `bucket/key` in DRAM (or the demotion queue), without counting an
    /// access: version checks and anti-entropy must not reorder eviction.
    pub fn dram_meta(&self, bucket: &str, key: &str) -> Option<Arc<ObjectMeta>> {
        match self.buckets.get(bucket)?.objects.get(key) {
            Some(e) => Some(e.meta.clone()),
            None => self.demoting_get(bucket, key).map(|(m, _)| m.clone()),
        }
    }

    pub fn dram_etag(&self, bucket: &str, key: &str) -> Option<&str> {
        match self.buckets.get(bucket)?.objects.get(key) {
            Some(e) => Some(e.meta.etag.as_str()),
            None => self.demoting_get(bucket, key).map(|(m, _)| m.etag.as_str()),
        }
    }

    /// Refuses a write into a missing or closing bucket, or one whose preconditions fail.
    pub(crate) fn check_write(
        &self,
        bucket: &str,
        key: &str,
        cond: &WriteConditions,
    ) -> Result<(), StoreError> {
        // Authorised against an earlier bucket of this name: that bucket is gone.
        self.check_bucket(bucket, cond.incarnation)?;
        // An unconditional write (every KV put) passes whatever is there: no lookup.
        if !cond.if_none_match_any && cond.if_match.is_none() {
            return Ok(());
        }
        cond.check(self.dram_etag(bucket, key)).map_err(|missing| {
            if missing {
                StoreError::NoSuchKey
            } else {
                StoreError::PreconditionFailed
            }
        })
    }

    /// The charge of an object of `size` bytes under `bucket/key` with `meta`.
    pub(crate) fn charge_for(bucket: &str, key: &str, size: u64, meta: &ObjectMeta) -> u64 {
        Arena::reservation_for(size)
            + (bucket.len() + 2 * key.len()) as u64
            + meta.footprint()
            + ENTRY_OVERHEAD
    }

    /// Allocates `size` bytes charged `charge`, evicting objects until they fit.
    pub(crate) fn reserve(&mut self, size: u64, charge: u64) -> Result<Extent, StoreError> {
        if charge > self.capacity {
            return Err(StoreError::TooLarge {
                size,
                capacity: self.capacity,
            });
        }
        loop {
            if self.used + charge <= self.capacity {
                if let Some(extent) = self.arena.allocate(size) {
                    self.used += charge;
                    return Ok(extent);
                }
            }
            if !self.evict_one() {
                return Err(StoreError::NoSpace(size));
            }
        }
    }

    /// Reserves room for a new version of `bucket/key` while the old one stays readable: other
    /// objects are evicted first, and the old version's own room is used only when nothing
    /// else frees enough. On failure the old version is still there (S3: a failed PUT leaves
    /// the previous object intact).
    pub(crate) fn reserve_replacing(
        &mut self,
        bucket: &str,
        key: &str,
        size: u64,
        charge: u64,
    ) -> Result<Extent, StoreError> {
        // Room without evicting anything (the common case): the old version, if any, cannot
        // be touched, so it need not be looked up (a B-tree walk) nor taken out of the
        // policy's order first; `reserve` starts the same way.
        if self.used + charge <= self.capacity {
            if let Some(extent) = self.arena.allocate(size) {
                self.used += charge;
                return Ok(extent);
            }
        }
        let old = self
            .buckets
            .get(bucket)
            .and_then(|b| b.objects.get(key))
            .map(|e| (e.id, e.charge, e.extent.len));
        let Some((old_id, old_charge, old_len)) = old else {
            return self.reserve(size, charge);
        };
        // A leased old version is out of the policy already and keeps its bytes regardless.
        let evictable = !self.pins.contains_key(&old_id);
        if evictable {
            self.policy.on_remove(old_id);
        }
        let first = self.reserve(size, charge);
        if evictable {
            self.policy.on_insert(old_id, 0);
        }
        match first {
            Err(StoreError::NoSpace(_)) if evictable => {}
            other => return other,
        }
        // Only the old version's room is left: give it up only when the new one then fits.
        if self.used - old_charge + charge > self.capacity {
            return Err(StoreError::NoSpace(size));
        }
        if Arena::reservation_for(size) <= Arena::reservation_for(old_len) {
            // Reuse the old extent in place: nothing reads it while this step runs.
            let entry = self.detach_entry(bucket, key);
            if let Some(e) = entry {
                self.used = self.used - e.charge + charge;
                return Ok(e.extent);
            }
            return Err(StoreError::NoSpace(size));
        }
        // The new one is larger: the old must go first, and cannot come back if its room is
        // then taken, which fragmentation alone can cause; say so when it happens.
        self.remove_entry(bucket, key);
        match self.arena.allocate(size) {
            Some(extent) => {
                self.used += charge;
                Ok(extent)
            }
            None => {
                tracing::error!(
                    bucket,
                    key,
                    size,
                    "no arena room after dropping the old version; it is lost"
                );
                Err(StoreError::NoSpace(size))
            }
        }
    }

    /// What an entry taken out of the index (DRAM) changes elsewhere: the presence table no
    /// longer shows it in DRAM (and its mirror slot goes), its bytes no longer count as held
    /// (unless NVMe holds them too), and the eviction policy forgets it.
    fn left_index(&mut self, bucket: &str, key: &str, entry: &Entry) {
        self.left_version(bucket, key, entry.id, entry.meta.size, entry.on_nvme);
    }

    /// [`ShardStore::left_index`] of the version `id` of `size` bytes, by its parts.
    fn left_version(&mut self, bucket: &str, key: &str, id: EntryId, size: u64, on_nvme: bool) {
        self.presence
            .borrow_mut()
            .changed(bucket, key, FLAG_DRAM, false);
        if !on_nvme {
            self.count_held(bucket, 0, size);
        }
        self.policy.on_remove(id);
    }

    /// Takes an unpinned entry out of the index without freeing its bytes (the caller reuses
    /// its extent); events and the policy see it removed.
    fn detach_entry(&mut self, bucket: &str, key: &str) -> Option<Entry> {
        let entry = self.buckets.get_mut(bucket)?.objects.remove(key)?;
        self.left_index(bucket, key, &entry);
        self.ids.remove(&entry.id);
        if let Some(ev) = self.events.as_mut() {
            ev.removed(bucket, key, entry.meta.kv);
        }
        Some(entry)
    }

    /// Gives back a reservation that was never published (an aborted part, say).
    pub(crate) fn release(&mut self, extent: Extent, charge: u64) {
        self.used -= charge;
        self.arena.free(extent);
        self.publish_gauges();
    }

    /// The bytes of a staged object, copied out (to be written through to NVMe while the
    /// staged extent stays reserved).
    pub fn staged_bytes(&self, staged: &Staged) -> Bytes {
        Bytes::copy_from_slice(self.arena.bytes(&staged.extent))
    }

    /// Makes a staged object visible as `bucket/key`, replacing any previous version.
    pub fn publish_staged(&mut self, bucket: &str, key: &str, staged: Staged) -> Arc<ObjectMeta> {
        self.publish(bucket, key, staged.extent, staged.meta, staged.charge)
    }

    /// Gives a staged object's DRAM back without ever showing it.
    pub fn discard_staged(&mut self, staged: Staged) {
        self.release(staged.extent, staged.charge);
    }

    /// Makes written bytes visible as `bucket/key`, replacing any previous version.
    pub(crate) fn publish(
        &mut self,
        bucket: &str,
        key: &str,
        extent: Extent,
        meta: ObjectMeta,
        charge: u64,
    ) -> Arc<ObjectMeta> {
        self.publish_as(bucket, key, extent, meta, charge, NewEtag::Given)
    }

    /// [`ShardStore::publish`], the new version's ETag as `etag` says.
    pub(crate) fn publish_as(
        &mut self,
        bucket: &str,
        key: &str,
        extent: Extent,
        mut meta: ObjectMeta,
        charge: u64,
        etag: NewEtag,
    ) -> Arc<ObjectMeta> {
        // Every object has a version once it is visible: a write that did not get one on
        // its way here (a completed upload, a KV block) gets it now.
        if meta.version.is_zero() {
            meta.version = crate::model::version::CLOCK.now();
        }
        // The old version's removal and the new one's insertion are one change to readers
        // of the presence table: the key never looks absent in between.
        self.presence.borrow_mut().hold(bucket);
        let etag = match etag {
            NewEtag::Given => None,
            NewEtag::Kv => {
                self.next_id += 1;
                Some(self.next_id - 1)
            }
        };
        let id = self.next_id;
        self.next_id += 1;
        let (at, size, kv) = (extent.offset, extent.len, meta.kv);
        // An overwrite (most KV puts) takes the old entry's place in the index: one lookup,
        // and the key's strings are kept, where a removal and an insertion cost a B-tree
        // walk, a key allocation and the reverse map's two strings each. Only while nothing
        // is being demoted: an old version on its way to NVMe goes through `remove_entry`.
        let published = match self.replace_in_place(bucket, key, id, extent, meta, charge, etag) {
            Ok(meta) => meta,
            Err((extent, mut meta)) => {
                if let Some(seq) = etag {
                    render_kv_etag(self.etag_salt, seq, &mut meta.etag);
                }
                let size = meta.size;
                let meta = Arc::new(meta);
                let entry = Entry {
                    id,
                    extent,
                    meta: meta.clone(),
                    charge,
                    on_nvme: false,
                };
                // Refused with nothing in demotion only when the index lacks the key: then
                // there is nothing to remove (and a removal's B-tree walk is saved on every
                // new key).
                if !self.demoting.is_empty() {
                    self.remove_entry(bucket, key);
                }
                match self.buckets.get_mut(bucket) {
                    Some(part) => {
                        part.objects.insert(key.to_string(), entry);
                        self.entered_index(bucket, key, id, size, meta.kv, None);
                    }
                    // Callers check the bucket first and never yield in between; should that
                    // ever change, the bytes are released rather than leaked.
                    None => {
                        self.drop_entry(entry);
                    }
                }
                meta
            }
        };
        // A large KV block's place, for same-host clients with a view of the arena: noted
        // now that the version is published (its bytes were all written before), and only
        // if it is (a missing bucket dropped it above; an overwrite in place keeps the old
        // entry's id, so the extent tells).
        if kv && size >= super::presence::LOCATE_MIN {
            let live = self
                .buckets
                .get(bucket)
                .and_then(|b| b.objects.get(key))
                .is_some_and(|e| e.extent.offset == at && e.extent.len == size);
            if live {
                self.presence.borrow_mut().located(bucket, key, at, size);
            }
        }
        self.presence.borrow_mut().release(bucket);
        self.publish_gauges();
        published
    }

    /// [`ShardStore::publish`] of a new version (`id`, `extent`, `meta`, `charge`; `etag`: the
    /// sequence number its KV ETag is rendered from, `None` for `meta`'s own) over a DRAM
    /// version of `bucket/key`, in that version's place in the index; everything else
    /// exactly as its `remove_entry` and the insertion that follows do, in the same order.
    /// `Err` with the new version's extent and metadata, untouched, when there is no such
    /// version or a demotion is in flight (the caller then removes and inserts).
    ///
    /// When nothing holds the old version by its id (no lease pins it, no admin pin took it
    /// out of the policy's order), the new version takes that id: the reverse map keeps its
    /// names and the policy moves the id to the front, where a new id costs a removal and an
    /// insertion in each (hashing, a policy node freed and another allocated; about a tenth
    /// of a node's time on a stream of 4 KiB overwrites). Ids name entries only for the
    /// reverse map, the policy, pins and `pinned_out`, and the two that outlive a version
    /// (a pin, `pinned_out`) are exactly those that keep the new id from being reused.
    ///
    /// The old version's metadata allocation is reused too when nothing else holds it (no
    /// reader's or writer's answer still has it): its `Arc` is unique, so overwriting it in
    /// place is what dropping it and allocating the new one would leave, minus an allocation,
    /// a free and, for a KV block, the ETag string's pair of them.
    // The new version's metadata comes back unboxed when it is not placed here: boxing it
    // would cost the allocation this path exists to save.
    #[allow(clippy::too_many_arguments, clippy::result_large_err)]
    fn replace_in_place(
        &mut self,
        bucket: &str,
        key: &str,
        id: EntryId,
        extent: Extent,
        meta: ObjectMeta,
        charge: u64,
        etag: Option<u64>,
    ) -> Result<Arc<ObjectMeta>, (Extent, ObjectMeta)> {
        if !self.demoting.is_empty() {
            return Err((extent, meta));
        }
        let Some(part) = self.buckets.get_mut(bucket) else {
            return Err((extent, meta));
        };
        let Some(slot) = part.objects.get_mut(key) else {
            return Err((extent, meta));
        };
        let salt = self.etag_salt;
        let held_by_id = (!self.pins.is_empty() && self.pins.contains_key(&slot.id))
            || (!self.pinned_out.is_empty() && self.pinned_out.contains(&slot.id));
        let (old_size, old_kv) = (slot.meta.size, slot.meta.kv);
        let (size, kv) = (meta.size, meta.kv);
        let old_extent = std::mem::replace(&mut slot.extent, extent);
        let old_charge = std::mem::replace(&mut slot.charge, charge);
        let old_on_nvme = std::mem::replace(&mut slot.on_nvme, false);
        match Arc::get_mut(&mut slot.meta) {
            Some(reused) => {
                let mut text = std::mem::take(&mut reused.etag);
                *reused = meta;
                if let Some(seq) = etag {
                    render_kv_etag(salt, seq, &mut text);
                    reused.etag = text;
                }
            }
            None => {
                let mut meta = meta;
                if let Some(seq) = etag {
                    render_kv_etag(salt, seq, &mut meta.etag);
                }
                slot.meta = Arc::new(meta);
            }
        }
        let published = slot.meta.clone();
        if !held_by_id {
            // As `left_index` and `drop_entry`, but for the reverse map and the policy; and
            // as `count_held` twice, on the bucket in hand.
            if !old_on_nvme {
                part.held = part.held.saturating_sub(old_size);
            }
            part.held += size;
            let id = slot.id;
            // The presence table's two changes (out, then in) at once.
            self.presence.borrow_mut().rewritten(bucket, key);
            self.used -= old_charge;
            self.arena.free(old_extent);
            if let Some(ev) = self.events.as_mut() {
                ev.removed(bucket, key, old_kv);
            }
            // As `entered_index`, the reverse map already naming `id`.
            self.policy.on_rewrite(id, size);
            if let Some(ev) = self.events.as_mut() {
                ev.stored(bucket, key, kv, Tier::Dram);
            }
            return Ok(published);
        }
        let old_id = std::mem::replace(&mut slot.id, id);
        // The old version goes (as `remove_entry` does it)...
        self.left_version(bucket, key, old_id, old_size, old_on_nvme);
        let names = self.drop_version(old_id, old_extent, old_charge);
        if let Some(ev) = self.events.as_mut() {
            ev.removed(bucket, key, old_kv);
        }
        // ...and the new one is in.
        self.entered_index(bucket, key, id, size, kv, names);
        Ok(published)
    }

    /// What a new entry `id` of `size` bytes put into the index (DRAM) for `bucket/key`
    /// changes elsewhere, the converse of [`ShardStore::left_index`]: its bytes count as
    /// held, the presence table shows it in DRAM, the reverse map names it (with `names`
    /// when the caller has them to give), the policy and the conductor's events know it.
    fn entered_index(
        &mut self,
        bucket: &str,
        key: &str,
        id: EntryId,
        size: u64,
        kv: bool,
        names: Option<(String, String)>,
    ) {
        self.count_held(bucket, size, 0);
        self.presence
            .borrow_mut()
            .changed(bucket, key, FLAG_DRAM, true);
        let names = names.unwrap_or_else(|| (bucket.to_string(), key.to_string()));
        self.ids.insert(id, names);
        self.policy.on_insert(id, size);
        if let Some(ev) = self.events.as_mut() {
            ev.stored(bucket, key, kv, Tier::Dram);
        }
    }

    /// Metadata and, unless `head_only`, the bytes of the object (or of `range` of it).
    pub fn get(
        &mut self,
        bucket: &str,
        key: &str,
        range: Option<RangeSpec>,
        head_only: bool,
        cond: &ReadConditions,
    ) -> GetResult {
        let part = self.buckets.get(bucket).ok_or(StoreError::NoSuchBucket)?;
        let Some(entry) = part.objects.get(key) else {
            let demoting = self.demoting_get(bucket, key);
            return match demoting {
                Some((meta, data)) => serve(meta, data, range, head_only, cond),
                None => Err(StoreError::NoSuchKey),
            };
        };
        let result = serve(
            &entry.meta,
            self.arena.bytes(&entry.extent),
            range,
            head_only,
            cond,
        );
        if result.is_ok() {
            self.policy.on_access(entry.id);
        }
        result
    }

    /// Removes an object; `Ok(false)` when it did not exist (S3 answers 204 either way).
    pub fn delete(&mut self, bucket: &str, key: &str) -> Result<bool, StoreError> {
        if !self.buckets.contains_key(bucket) {
            return Err(StoreError::NoSuchBucket);
        }
        self.revoke_leases_of(bucket, key);
        let removed = self.remove_entry(bucket, key);
        self.publish_gauges();
        Ok(removed)
    }

    /// Removes many keys of one bucket; per key, whether it existed.
    pub fn delete_many(&mut self, bucket: &str, keys: &[String]) -> Result<Vec<bool>, StoreError> {
        if !self.buckets.contains_key(bucket) {
            return Err(StoreError::NoSuchBucket);
        }
        let out = keys
            .iter()
            .map(|k| {
                self.revoke_leases_of(bucket, k);
                self.remove_entry(bucket, k)
            })
            .collect();
        self.publish_gauges();
        Ok(out)
    }

    pub fn list(&self, bucket: &str, q: &ListQuery) -> Result<Vec<ListItem>, StoreError> {
        let part = self.buckets.get(bucket).ok_or(StoreError::NoSuchBucket)?;
        let dram = shard_page(&part.objects, q);
        let in_flight: BTreeMap<String, ListedMeta> = self
            .demoting
            .iter()
            .filter(|((b, k), _)| b == bucket && k.starts_with(&q.prefix))
            .map(|((_, k), (m, _))| (k.clone(), ListedMeta(m.clone())))
            .collect();
        if in_flight.is_empty() {
            return Ok(dram);
        }
        let flying = shard_page(&in_flight, q);
        Ok(merge(vec![dram, flying], q.limit.saturating_add(1)).0)
    }

    /// An object on its way to NVMe (no allocation when nothing is being demoted).
    /// The size of the newest version of `bucket/key` in DRAM or the demotion queue.
    pub fn dram_size(&self, bucket: &str, key: &str) -> Option<u64> {
        if let Some(e) = self.buckets.get(bucket).and_then(|b| b.objects.get(key)) {
            return Some(e.meta.size);
        }
        self.demoting_get(bucket, key).map(|(m, _)| m.size)
    }

    pub(crate) fn demoting_get(
        &self,
        bucket: &str,
        key: &str,
    ) -> Option<&(Arc<ObjectMeta>, Bytes)> {
        if self.demoting.is_empty() {
            return None;
        }
        self.demoting.get(&(bucket.to_string(), key.to_string()))
    }

    /// A deleted block is unreachable at once: the descriptors of the leases that pin it stop
    /// working now, not when the leases end (its bytes stay reserved until then, since a
    /// transfer that passed its check may still be copying). A block *replaced* by a newer
    /// version keeps its leases: a reader finishes reading the version it leased.
    fn revoke_leases_of(&mut self, bucket: &str, key: &str) {
        let Some(g) = &self.grants else {
            return;
        };
        let Some(e) = self.buckets.get(bucket).and_then(|b| b.objects.get(key)) else {
            return;
        };
        if let Some(pin) = self.pins.get_mut(&e.id) {
            for grant in pin.grants.drain(..) {
                g.revoke(grant, [e.extent.offset]);
            }
        }
    }

    pub(crate) fn remove_entry(&mut self, bucket: &str, key: &str) -> bool {
        // Most stores demote nothing: skip building the owned lookup key then.
        let demoted = if self.demoting.is_empty() {
            None
        } else {
            self.demoting.remove(&(bucket.to_string(), key.to_string()))
        };
        let was_demoting = match demoted {
            Some((m, _)) => {
                self.demote_bytes -= m.size;
                self.count_held(bucket, 0, m.size);
                Some(m.kv)
            }
            None => None,
        };
        let removed = self
            .buckets
            .get_mut(bucket)
            .and_then(|b| b.objects.remove(key));
        if removed.is_some() || was_demoting.is_some() {
            self.presence
                .borrow_mut()
                .changed(bucket, key, FLAG_DRAM, false);
        }
        let Some(entry) = removed else {
            // An evicted block on its way to NVMe was published there; it is gone now.
            if let (Some(kv), Some(ev)) = (was_demoting, self.events.as_mut()) {
                ev.removed(bucket, key, kv);
            }
            return was_demoting.is_some();
        };
        if !entry.on_nvme {
            self.count_held(bucket, 0, entry.meta.size);
        }
        self.policy.on_remove(entry.id);
        let kv = entry.meta.kv;
        self.drop_entry(entry);
        if let Some(ev) = self.events.as_mut() {
            ev.removed(bucket, key, kv);
        }
        true
    }

    pub(crate) fn drop_entry_charge(&mut self, charge: u64, extent: Extent) {
        self.used -= charge;
        self.arena.free(extent);
    }

    /// Frees an entry's bytes, unless a lease still pins them: then they stay reserved (and
    /// unreachable by key) until the last lease on them ends.
    /// The entry's bucket and key names from the reverse map, for a caller to reuse.
    fn drop_entry(&mut self, entry: Entry) -> Option<(String, String)> {
        self.drop_version(entry.id, entry.extent, entry.charge)
    }

    /// [`ShardStore::drop_entry`] of the version `id`, by its parts.
    fn drop_version(
        &mut self,
        id: EntryId,
        extent: Extent,
        charge: u64,
    ) -> Option<(String, String)> {
        let names = self.ids.remove(&id);
        // Both are empty but for leases and admin pins: skip hashing into them then.
        if !self.pinned_out.is_empty() {
            self.pinned_out.remove(&id);
        }
        let pin = match self.pins.is_empty() {
            true => None,
            false => self.pins.get_mut(&id),
        };
        match pin {
            Some(pin) => pin.orphan = Some((extent, charge)),
            None => {
                self.used -= charge;
                self.arena.free(extent);
            }
        }
        names
    }

    /// Evicts the policy's victim; `false` when nothing is evictable. Hard-pinned entries are
    /// never evicted; soft-pinned ones only when nothing else is left (the one whose pin ends
    /// first).
    pub(crate) fn evict_one(&mut self) -> bool {
        let now = std::time::Instant::now();
        let mut soft: Vec<(std::time::Instant, EntryId)> = Vec::new();
        let mut evicted = false;
        while let Some(id) = self.policy.pick_victim() {
            let Some((bucket, key)) = self.ids.get(&id).cloned() else {
                continue;
            };
            match self.admin_pins.get(&(bucket.clone(), key.clone())).copied() {
                Some(super::pinning::AdminPin::Hard) => {
                    self.pinned_out.insert(id);
                    continue;
                }
                Some(super::pinning::AdminPin::Soft(until)) if until > now => {
                    soft.push((until, id));
                    continue;
                }
                Some(super::pinning::AdminPin::Soft(_)) => {
                    self.admin_pins.remove(&(bucket.clone(), key.clone()));
                }
                None => {}
            }
            if self.evict_entry(bucket, key) {
                evicted = true;
                break;
            }
        }
        if !evicted {
            soft.sort_unstable();
            while !soft.is_empty() && !evicted {
                let (_, id) = soft.remove(0);
                if let Some((bucket, key)) = self.ids.get(&id).cloned() {
                    evicted = self.evict_entry(bucket, key);
                }
            }
        }
        // The soft-pinned entries passed over go back to the policy.
        for (_, id) in soft {
            self.policy.on_insert(id, 0);
        }
        evicted
    }

    /// Evicts `bucket/key` from DRAM (to NVMe when it goes there); whether it was there.
    fn evict_entry(&mut self, bucket: String, key: String) -> bool {
        let entry = self
            .buckets
            .get_mut(&bucket)
            .and_then(|b| b.objects.remove(&key));
        let Some(entry) = entry else {
            return false;
        };
        tracing::debug!(bucket, key, size = entry.meta.size, "evicted");
        let memory = self.durability(&bucket) == Some(Durability::Memory);
        let tier = if entry.on_nvme {
            Some(Tier::Nvme)
        } else if memory
            && self.demote_budget > 0
            && self.demote_bytes + entry.meta.size <= self.demote_budget
        {
            let data = Bytes::copy_from_slice(self.arena.bytes(&entry.extent));
            self.demote_bytes += entry.meta.size;
            self.demoting
                .insert((bucket.clone(), key.clone()), (entry.meta.clone(), data));
            self.demote_queue.push_back((bucket.clone(), key.clone()));
            // Still served (and so still present) from the demotion's copy until the
            // demoter is done with it (`finish_demotion`); but its arena bytes are freed
            // below, so a located slot naming them goes now (a value slot with them too:
            // the mirror is a cache).
            self.presence.borrow_mut().unmirror(&bucket, &key);
            Some(Tier::Nvme)
        } else {
            if self.demote_budget > 0 && memory {
                self.metrics.demotions_dropped.inc();
            }
            // Gone from the node: DRAM held its only copy. (A demoted entry's bytes stay
            // counted, now in the demotion map.)
            self.count_held(&bucket, 0, entry.meta.size);
            None
        };
        if !self.demoting.contains_key(&(bucket.clone(), key.clone())) {
            self.presence
                .borrow_mut()
                .changed(&bucket, &key, FLAG_DRAM, false);
        }
        let kv = entry.meta.kv;
        self.drop_entry(entry);
        self.record_tier_event(&bucket, &key, kv, tier);
        self.metrics.evictions.inc();
        true
    }

    pub(crate) fn publish_gauges(&self) {
        self.metrics
            .set_dram(self.used, self.capacity, self.ids.len() as u64);
    }
}

/// 64 random bits from the standard library's per-process hash seed and the clock.
fn random_salt() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    if let Ok(t) = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::eviction::Lru;

    fn meta(size: usize) -> ObjectMeta {
        ObjectMeta {
            size: size as u64,
            etag: "\"e\"".into(),
            last_modified: SystemTime::now(),
            content_type: None,
            headers: vec![],
            user_meta: vec![],
            checksum: None,
            parts: None,
            owner: String::new(),
            acl: Default::default(),
            kv: false,
            version: crate::model::Version::ZERO,
        }
    }

    const ANY: WriteConditions = WriteConditions {
        if_none_match_any: false,
        if_match: None,
        incarnation: None,
    };

    fn read() -> ReadConditions {
        ReadConditions::default()
    }

    fn store(cap: u64) -> ShardStore {
        let arena = Arena::new("test", cap, 4096).unwrap();
        ShardStore::new(
            arena,
            Box::new(Lru::new()),
            Arc::new(ShardMetrics::default()),
        )
    }

    #[test]
    fn put_get_replace_delete() {
        let mut s = store(1 << 20);
        s.add_bucket("b", SystemTime::now(), "", Durability::Memory, 1);
        s.put("b", "k", b"hello", meta(5), &ANY).unwrap();
        let (_, _, data) = s.get("b", "k", None, false, &read()).unwrap();
        assert_eq!(&data[..], b"hello");
        s.put("b", "k", b"bye", meta(3), &ANY).unwrap();
        let (m, r, data) = s
            .get("b", "k", Some(RangeSpec::Suffix(2)), false, &read())
            .unwrap();
        assert_eq!((&data[..], m.size, r.unwrap().start), (&b"ye"[..], 3, 1));
        assert_eq!(s.object_count(), 1);
        assert_eq!(s.delete("b", "k"), Ok(true));
        assert_eq!(s.delete("b", "k"), Ok(false));
        assert_eq!(s.used(), 0);
        assert_eq!(
            s.get("b", "k", None, false, &read()).unwrap_err(),
            StoreError::NoSuchKey
        );
        assert_eq!(
            s.put("nob", "k", b"", meta(0), &ANY).unwrap_err(),
            StoreError::NoSuchBucket
        );
    }

    #[test]
    fn evicts_lru_and_stays_within_capacity() {
        let cap = 64 * 1024;
        let mut s = store(cap);
        s.add_bucket("b", SystemTime::now(), "", Durability::Memory, 1);
        let block = vec![1u8; 8 * 1024];
        for i in 0..40 {
            s.put("b", &format!("k{i}"), &block, meta(block.len()), &ANY)
                .unwrap();
            assert!(s.used() <= cap);
            // Keep k0 hot: it must survive.
            s.get("b", "k0", None, true, &read()).unwrap();
        }
        assert!(s.get("b", "k0", None, true, &read()).is_ok());
        assert!(s.get("b", "k1", None, true, &read()).is_err());
        assert!(s.get("b", "k39", None, true, &read()).is_ok());
        assert!(s.metrics.evictions.get() > 0);
        let too_big = vec![0u8; cap as usize];
        assert!(matches!(
            s.put("b", "big", &too_big, meta(too_big.len()), &ANY),
            Err(StoreError::TooLarge { .. })
        ));
    }

    /// An evicted object on its way to NVMe is still read from the demotion's copy, so it
    /// still exists, for `exists` and for the presence table alike, until the demoter is done.
    #[test]
    fn an_object_being_demoted_still_exists() {
        use yutu_api::presence::{fingerprint, Found, Table};
        let cap = 64 * 1024;
        let mut s = store(cap);
        s.enable_demotion(cap);
        s.add_bucket("b", SystemTime::now(), "", Durability::Memory, 1);
        let grant = s.presence.borrow_mut().grant("b", None, &|_| {}).unwrap();
        let file = std::fs::File::from(grant.fd);
        // SAFETY: a read-only test mapping of the sealed table.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        // SAFETY: page-aligned, read only through atomics.
        let words = unsafe {
            std::slice::from_raw_parts(
                map.as_ptr().cast::<std::sync::atomic::AtomicU64>(),
                map.len() / 8,
            )
        };
        let table = Table::open(words).unwrap();
        let in_table = |k: &str| table.lookup(fingerprint(&grant.secret, k)) == Found::Present;
        let block = vec![1u8; 8 * 1024];
        for i in 0..12 {
            s.put("b", &format!("k{i}"), &block, meta(block.len()), &ANY)
                .unwrap();
        }
        let (b, k, m, _) = s.next_demotion().expect("k0 was evicted for demotion");
        assert_eq!(k, "k0");
        assert_eq!(s.exists("b", std::slice::from_ref(&k)).unwrap(), [true]);
        assert!(in_table(&k), "present while it is demoted");
        assert!(s.finish_demotion(&b, &k, &m));
        assert_eq!(
            s.exists("b", std::slice::from_ref(&k)).unwrap(),
            [false],
            "not in DRAM any more"
        );
        assert!(!in_table(&k));
        // A demoting key that is deleted is gone at once.
        let (b, k, _, _) = s.next_demotion().expect("k1 too");
        assert!(in_table(&k));
        assert_eq!(s.delete(&b, &k), Ok(true));
        assert_eq!(s.exists("b", std::slice::from_ref(&k)).unwrap(), [false]);
        assert!(!in_table(&k));
        assert!(in_table("k11"));
    }

    #[test]
    fn bucket_close_protocol() {
        let mut s = store(1 << 20);
        s.add_bucket("b", SystemTime::now(), "", Durability::Memory, 1);
        s.put("b", "k", b"x", meta(1), &ANY).unwrap();
        assert_eq!(s.close_bucket("b"), Ok(false));
        assert_eq!(
            s.put("b", "k2", b"x", meta(1), &ANY).unwrap_err(),
            StoreError::BucketClosing
        );
        s.finish_close("b", false);
        s.delete("b", "k").unwrap();
        assert_eq!(s.close_bucket("b"), Ok(true));
        s.finish_close("b", true);
        assert!(!s.bucket_exists("b"));
    }
}
