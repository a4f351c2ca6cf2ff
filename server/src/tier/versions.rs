//! Versions in the tiers: which version of a key this shard holds (object or tombstone), the
//! "newer wins" rule every write goes through, and deletes as tombstones.
//!
//! See [`crate::model::version`] for what a version is. A write that arrives without one (a
//! client's write on its coordinator) is stamped from the node's clock when it is applied; a
//! write that carries one (a replica copy, an anti-entropy pull) is applied only when it is
//! newer than both the object and the tombstone held here, and is otherwise answered as done
//! (a newer write replaced it, as it would have had it arrived in order).

use std::rc::Rc;
use std::sync::Arc;

use super::{nvme_meta, Step, TieredStore};
use crate::model::version::CLOCK;
use crate::model::{ObjectMeta, StoreError, Version};

impl TieredStore {
    /// The version of `bucket/key` this shard holds: of the newest object in any tier, or of
    /// its delete (`true`) when only a tombstone is left.
    pub fn version_of(&self, bucket: &str, key: &str) -> Option<(Version, bool)> {
        let object = self.object_version(bucket, key);
        let tomb = self.tombstones.borrow().get(bucket, key);
        match (object, tomb) {
            (Some(o), Some(t)) if t > o => Some((t, true)),
            (Some(o), _) => Some((o, false)),
            (None, Some(t)) => Some((t, true)),
            (None, None) => None,
        }
    }

    /// Whether the object held of `bucket/key` is a KV block written through the KV API:
    /// a cache entry its clients replicate themselves, which anti-entropy leaves alone.
    pub fn is_kv_block(&self, bucket: &str, key: &str) -> bool {
        self.object_meta(bucket, key).is_some_and(|m| m.kv)
    }

    /// The version of the object held (DRAM first, then NVMe), without its tombstone.
    fn object_version(&self, bucket: &str, key: &str) -> Option<Version> {
        self.object_meta(bucket, key).map(|m| m.version)
    }

    /// The metadata of the object held (DRAM first, then NVMe).
    fn object_meta(&self, bucket: &str, key: &str) -> Option<Arc<ObjectMeta>> {
        if let Some(meta) = self.store.borrow().dram_meta(bucket, key) {
            return Some(meta);
        }
        let nvme = self.nvme.as_ref()?;
        nvme_meta(nvme, bucket, key).map(|(_, m)| m)
    }

    /// Gives a write its version: a new one from the clock for a write made here (newer than
    /// what is held of the key, whatever the clock: a clock stepped back, or one behind the
    /// node that wrote the held version), or the clock moved past the version a write brings
    /// from another node.
    pub(super) fn stamp(&self, bucket: &str, key: &str, meta: &mut ObjectMeta) {
        if meta.version.is_zero() {
            if let Some((held, _)) = self.version_of(bucket, key) {
                observe(held);
            }
            meta.version = CLOCK.now();
        } else {
            observe(meta.version);
        }
    }

    /// Whether a write of `version` is older than (or the same as) what this shard holds of
    /// the key: then it is not applied.
    pub(super) fn superseded(&self, bucket: &str, key: &str, version: Version) -> bool {
        self.deleted_since(bucket, key, version)
            || self
                .object_version(bucket, key)
                .is_some_and(|held| !held.is_zero() && held >= version)
    }

    /// Whether a durable write of `version`, on NVMe now, must not be published: a delete
    /// newer than it was applied meanwhile, or DRAM holds a version as new.
    pub(super) fn superseded_in_dram(&self, bucket: &str, key: &str, version: Version) -> bool {
        self.deleted_since(bucket, key, version)
            || self
                .store
                .borrow()
                .dram_meta(bucket, key)
                .is_some_and(|m| !m.version.is_zero() && m.version >= version)
    }

    /// Whether a delete as new as `version` or newer is remembered.
    pub(super) fn deleted_since(&self, bucket: &str, key: &str, version: Version) -> bool {
        self.tombstones
            .borrow()
            .get(bucket, key)
            .is_some_and(|t| t >= version)
    }

    /// A write of `version` was applied: a tombstone older than it is forgotten.
    pub(super) fn applied(&self, bucket: &str, key: &str, version: Version) {
        self.tombstones
            .borrow_mut()
            .clear_older(bucket, key, version);
    }

    /// Up to `limit` tombstones of `bucket` after `after`, in key order.
    pub fn tombstones_after(
        &self,
        bucket: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Vec<(String, Version)> {
        self.tombstones.borrow().range(bucket, after, limit)
    }

    /// Tombstones this shard holds, and how many were dropped early to stay within the limit.
    pub fn tombstone_counts(&self) -> (usize, u64) {
        let t = self.tombstones.borrow();
        (t.len(), t.dropped)
    }

    /// Forgets the tombstones of a bucket that is gone.
    pub fn forget_tombstones(&self, bucket: &str) {
        self.tombstones.borrow_mut().forget_bucket(bucket);
    }

    /// Deletes `keys` of `bucket` as of `version` (a new version from the clock when `None`:
    /// a client's delete on its coordinator), keeping a tombstone of each. An object newer
    /// than the delete stays. Answers the delete's version and, per key, whether an object
    /// was removed. In a `disk` bucket each key is decided and deleted in its turn among the
    /// key's durable writes ([`super::order`]): a write still on its way to NVMe is decided
    /// against in its order, never removed under it.
    pub fn delete_versioned(
        self: &Rc<Self>,
        bucket: String,
        keys: Vec<String>,
        version: Option<Version>,
        incarnation: Option<u64>,
    ) -> Step<Result<(Version, Vec<bool>), StoreError>> {
        if let Err(e) = self.store.borrow().check_bucket(&bucket, incarnation) {
            return Step::Done(Err(e));
        }
        let version = match version {
            Some(v) => {
                observe(v);
                v
            }
            None => {
                for k in &keys {
                    if let Some((held, _)) = self.version_of(&bucket, k) {
                        observe(held);
                    }
                }
                CLOCK.now()
            }
        };
        if !self.is_disk(&bucket) {
            return self.delete_decided(bucket, keys, version, incarnation);
        }
        let this = self.clone();
        Step::wait(async move {
            let mut out = Vec::with_capacity(keys.len());
            for key in keys {
                let _turn = this.order.turn(&bucket, &key).await?;
                let r = match this.delete_decided(bucket.clone(), vec![key], version, incarnation) {
                    Step::Done(r) => r,
                    Step::Wait(f) => f.await,
                }?;
                out.push(r.1.first().copied().unwrap_or(false));
            }
            Ok((version, out))
        })
    }

    /// [`TieredStore::delete_versioned`] with the version decided.
    fn delete_decided(
        self: &Rc<Self>,
        bucket: String,
        keys: Vec<String>,
        version: Version,
        incarnation: Option<u64>,
    ) -> Step<Result<(Version, Vec<bool>), StoreError>> {
        let (older, newer): (Vec<usize>, Vec<usize>) = (0..keys.len()).partition(|&i| {
            self.object_version(&bucket, &keys[i])
                .is_none_or(|held| held <= version)
        });
        let mut superseded = newer.len() as u64;
        {
            let mut t = self.tombstones.borrow_mut();
            for &i in &older {
                if t.get(&bucket, &keys[i]).is_some_and(|held| held > version) {
                    superseded += 1;
                }
                t.record(&bucket, &keys[i], version);
            }
        }
        for _ in 0..superseded {
            self.metrics.superseded_writes.inc();
        }
        let n = keys.len();
        let doomed: Vec<String> = older.iter().map(|&i| keys[i].clone()).collect();
        let spread = move |removed: Vec<bool>| {
            let mut out = vec![false; n];
            for (i, r) in older.iter().zip(removed) {
                out[*i] = r;
            }
            (version, out)
        };
        if doomed.is_empty() {
            return Step::Done(Ok(spread(Vec::new())));
        }
        match self.delete_in(bucket, doomed, incarnation) {
            Step::Done(r) => Step::Done(r.map(spread)),
            Step::Wait(f) => Step::wait(async move { f.await.map(spread) }),
        }
    }

    /// Drops this node's copy of `bucket/key` (a hand-off: no tombstone, it is no delete)
    /// only if it is still `version`: a newer write that arrived meanwhile stays.
    pub fn drop_copy(
        self: &Rc<Self>,
        bucket: String,
        key: String,
        version: Version,
    ) -> Step<Result<bool, StoreError>> {
        if self.object_version(&bucket, &key) != Some(version) {
            return Step::Done(Ok(false));
        }
        match self.delete_in(bucket, vec![key], None) {
            Step::Done(r) => Step::Done(r.map(|e| e.first().copied().unwrap_or(false))),
            Step::Wait(f) => {
                Step::wait(async move { f.await.map(|e| e.first().copied().unwrap_or(false)) })
            }
        }
    }
}

/// Moves the clock past a version from elsewhere, unless it claims to be from more than a
/// day ahead of this node's wall clock: a version that far off would pin the key (every
/// later write older than it) and is taken as it is without moving the clock.
fn observe(v: Version) {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    if v.millis() <= now_ms.saturating_add(86_400_000) {
        CLOCK.observe(v);
    }
}

/// A written object's metadata as answered to the writer whose write a newer one replaced.
pub(super) fn as_written(meta: ObjectMeta) -> Arc<ObjectMeta> {
    Arc::new(meta)
}
