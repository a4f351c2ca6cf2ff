//! The door to a shard's KV block state in DRAM (`store::kv`, `store::pinning`): read
//! leases, two-phase puts, pins, and reading a block in place. Publishing a put is
//! [`TieredStore::publish_staged`], which writes `disk` buckets through.

use std::time::{Duration, Instant};

use yutu_transfer::GrantId;

use super::TieredStore;
use crate::model::{ObjectMeta, StoreError};
use crate::store::kv::BlockRef;
use crate::store::pinning::AdminPin;
use crate::store::shard::Staged;

impl TieredStore {
    /// Leases `keys` of `bucket` for `holder` under `lease_id` (`None`: not in DRAM).
    pub fn lease(
        &self,
        lease_id: u64,
        holder: &str,
        bucket: &str,
        keys: &[String],
        ttl: Duration,
    ) -> Result<Vec<Option<BlockRef>>, StoreError> {
        self.store
            .borrow_mut()
            .lease(lease_id, holder, bucket, keys, ttl)
    }

    /// Gives back `holder`'s lease; whether it was still held.
    pub fn release_lease(&self, lease_id: u64, holder: &str) -> bool {
        self.store.borrow_mut().release_lease_by(lease_id, holder)
    }

    /// Reserves `len` bytes for `holder`'s put of `bucket/key`: the offset and its grant.
    #[allow(clippy::too_many_arguments)]
    pub fn put_start(
        &self,
        put_id: u64,
        holder: &str,
        bucket: &str,
        key: &str,
        len: u64,
        ttl: Duration,
    ) -> Result<(u64, GrantId), StoreError> {
        self.store
            .borrow_mut()
            .put_start(put_id, holder, bucket, key, len, ttl)
    }

    /// Ends `holder`'s put into `bucket`, under `key` when given (a room's, which this shard
    /// owns): its bucket, key and staged object, to publish.
    pub fn put_end(
        &self,
        put_id: u64,
        holder: &str,
        bucket: &str,
        key: Option<&str>,
    ) -> Result<(String, String, Staged), StoreError> {
        self.store
            .borrow_mut()
            .put_end_by(put_id, holder, bucket, key)
    }

    /// Revokes `holder`'s put into `bucket`; whether it was pending.
    pub fn put_revoke_by(&self, put_id: u64, holder: &str, bucket: &str) -> bool {
        self.store
            .borrow_mut()
            .put_revoke_by(put_id, holder, bucket)
    }

    /// Revokes puts, whoever holds them (a batch abandoned by the node itself).
    pub fn put_revoke_all(&self, put_ids: impl IntoIterator<Item = u64>) {
        let mut store = self.store.borrow_mut();
        for id in put_ids {
            store.put_revoke(id);
        }
    }

    /// Whether put `put_id` is still between its start and its end.
    pub fn put_pending(&self, put_id: u64) -> bool {
        self.store.borrow().put_pending(put_id)
    }

    /// Ends the leases and puts past their deadline: how many of each.
    pub fn expire_kv(&self, now: Instant) -> (usize, usize) {
        self.store.borrow_mut().expire(now)
    }

    /// Reads `bucket/key` in place if DRAM holds it.
    pub fn read_with<R>(
        &self,
        bucket: &str,
        key: &str,
        read: impl FnOnce(&ObjectMeta, &[u8]) -> R,
    ) -> Result<Option<R>, StoreError> {
        self.store.borrow_mut().read_with(bucket, key, read)
    }

    /// Reads several keys of `bucket` in place at once (`None` for those DRAM lacks).
    pub fn read_many_with<R>(
        &self,
        bucket: &str,
        keys: &[&str],
        read: impl FnOnce(&[Option<&[u8]>]) -> R,
    ) -> Result<R, StoreError> {
        self.store.borrow_mut().read_many_with(bucket, keys, read)
    }

    /// Pins `keys` of `bucket` by name; how many pins are new.
    pub fn pin_keys(
        &self,
        bucket: &str,
        keys: &[String],
        pin: AdminPin,
    ) -> Result<u64, StoreError> {
        self.store.borrow_mut().pin_keys(bucket, keys, pin)
    }

    /// Pins, or unpins, the keys named (`key`) or under `prefix` (at most `limit` when
    /// pinning, from DRAM); how many changed.
    pub fn pin_or_unpin(
        &self,
        bucket: &str,
        key: Option<&str>,
        prefix: Option<&str>,
        pin: Option<AdminPin>,
        limit: usize,
    ) -> Result<u64, StoreError> {
        let mut store = self.store.borrow_mut();
        let keys = match (key, prefix) {
            (Some(k), _) => vec![k.to_string()],
            (None, Some(p)) if pin.is_some() => store.dram_keys_with_prefix(bucket, p, limit),
            (None, Some(p)) => store.pinned_with_prefix(bucket, p),
            (None, None) => Vec::new(),
        };
        match pin {
            Some(kind) => store.pin_keys(bucket, &keys, kind),
            None => Ok(store.unpin_keys(bucket, &keys)),
        }
    }

    /// Whether `bucket/key` is pinned with no end.
    pub fn hard_pinned(&self, bucket: &str, key: &str) -> bool {
        self.store.borrow().hard_pinned(bucket, key)
    }

    /// Live pins (soft ones past their end are dropped first).
    pub fn pin_count(&self) -> u64 {
        self.store.borrow_mut().pin_count()
    }

    /// Evicts until `bytes` are free: (bytes freed, objects evicted).
    pub fn free_bytes(&self, bytes: u64) -> (u64, u64) {
        self.store.borrow_mut().free_bytes(bytes)
    }
}
