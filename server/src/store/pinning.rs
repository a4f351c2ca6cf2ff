//! Pins and explicit eviction from the admin API.
//!
//! A pin is held by name (bucket, key), not by entry, so it survives overwrites of the key
//! and applies to a copy promoted back from NVMe. A hard pin keeps the key in DRAM until it
//! is unpinned: eviction passes it over (once: the entry leaves the policy's order until the
//! pin ends). A soft pin with a deadline lets the key be evicted only when nothing else can
//! be, and ends by itself. Read leases (`kv`) are a different thing: they pin bytes, not
//! names, for the life of a transfer.

use std::time::Instant;

use super::shard::ShardStore;
use crate::model::StoreError;

/// Most admin pins one shard keeps (each costs a key's worth of memory).
pub const MAX_PINS: usize = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminPin {
    Hard,
    /// Until this instant.
    Soft(Instant),
}

impl ShardStore {
    /// Keys of `bucket` in DRAM that start with `prefix`, in order, at most `limit`.
    pub fn dram_keys_with_prefix(&self, bucket: &str, prefix: &str, limit: usize) -> Vec<String> {
        let Some(b) = self.buckets.get(bucket) else {
            return Vec::new();
        };
        b.objects
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .take(limit)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Pins `keys` of `bucket`; how many of them are in DRAM here.
    pub fn pin_keys(
        &mut self,
        bucket: &str,
        keys: &[String],
        pin: AdminPin,
    ) -> Result<u64, StoreError> {
        let new = keys
            .iter()
            .filter(|k| {
                !self
                    .admin_pins
                    .contains_key(&(bucket.to_string(), (*k).clone()))
            })
            .count();
        if self.admin_pins.len() + new > MAX_PINS {
            return Err(StoreError::Device(format!(
                "a shard keeps at most {MAX_PINS} pins; unpin some first"
            )));
        }
        let mut present = 0;
        for k in keys {
            self.admin_pins.insert((bucket.to_string(), k.clone()), pin);
            if self
                .buckets
                .get(bucket)
                .is_some_and(|b| b.objects.contains_key(k))
            {
                present += 1;
            }
        }
        Ok(present)
    }

    /// Unpins `keys` of `bucket`; how many pinned copies held here it freed (as
    /// [`ShardStore::pin_keys`] counts). A hard-pinned entry the policy passed over is
    /// evictable again.
    pub fn unpin_keys(&mut self, bucket: &str, keys: &[String]) -> u64 {
        let mut ended = 0;
        for k in keys {
            if self
                .admin_pins
                .remove(&(bucket.to_string(), k.clone()))
                .is_none()
            {
                continue;
            }
            let id = self
                .buckets
                .get(bucket)
                .and_then(|b| b.objects.get(k))
                .map(|e| e.id);
            if let Some(id) = id {
                ended += 1;
                if self.pinned_out.remove(&id) {
                    self.policy.on_insert(id, 0);
                }
            }
        }
        ended
    }

    /// Pinned keys of `bucket` starting with `prefix` (to unpin by prefix).
    pub fn pinned_with_prefix(&self, bucket: &str, prefix: &str) -> Vec<String> {
        self.admin_pins
            .keys()
            .filter(|(b, k)| b == bucket && k.starts_with(prefix))
            .map(|(_, k)| k.clone())
            .collect()
    }

    /// Whether `bucket/key` is hard-pinned (explicit eviction leaves it alone).
    pub fn hard_pinned(&self, bucket: &str, key: &str) -> bool {
        matches!(
            self.admin_pins.get(&(bucket.to_string(), key.to_string())),
            Some(AdminPin::Hard)
        )
    }

    /// Live pins (soft pins past their deadline are dropped first).
    pub fn pin_count(&mut self) -> u64 {
        let now = Instant::now();
        self.admin_pins
            .retain(|_, p| !matches!(p, AdminPin::Soft(until) if *until <= now));
        self.admin_pins.len() as u64
    }

    /// Evicts from DRAM, in eviction order, until `bytes` are freed or nothing more can be:
    /// how many objects and bytes left.
    pub fn free_bytes(&mut self, bytes: u64) -> (u64, u64) {
        let start = self.used;
        let mut objects = 0;
        while start.saturating_sub(self.used) < bytes {
            if !self.evict_one() {
                break;
            }
            objects += 1;
        }
        self.publish_gauges();
        (objects, start.saturating_sub(self.used))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, SystemTime};

    use super::*;
    use crate::metrics::ShardMetrics;
    use crate::model::conditions::WriteConditions;
    use crate::model::{Durability, ObjectMeta};
    use crate::store::arena::Arena;
    use crate::store::eviction::Lru;

    fn store(capacity: u64) -> ShardStore {
        let arena = Arena::new("pins", capacity, 4096).expect("arena");
        let mut s = ShardStore::new(
            arena,
            Box::new(Lru::new()),
            Arc::new(ShardMetrics::default()),
        );
        s.add_bucket("b", SystemTime::now(), "o", Durability::Memory, 1);
        s
    }

    fn put(s: &mut ShardStore, key: &str, len: usize) {
        let meta = ObjectMeta::for_block(len as u64);
        s.put("b", key, &vec![7u8; len], meta, &WriteConditions::default())
            .expect("put");
    }

    #[test]
    fn hard_pins_are_never_evicted_and_soft_pins_last() {
        let mut s = store(1 << 20);
        for i in 0..8 {
            put(&mut s, &format!("k{i}"), 64 << 10);
        }
        s.pin_keys("b", &["k0".into()], AdminPin::Hard)
            .expect("pin");
        s.pin_keys(
            "b",
            &["k1".into()],
            AdminPin::Soft(Instant::now() + Duration::from_secs(60)),
        )
        .expect("pin");
        // Free everything: the soft pin goes last, the hard pin never.
        let (objects, _) = s.free_bytes(u64::MAX);
        assert_eq!(objects, 7);
        assert_eq!(s.dram_keys_with_prefix("b", "", 10), vec!["k0".to_string()]);
        // Unpinned, it is evictable again.
        assert_eq!(s.unpin_keys("b", &["k0".into()]), 1);
        assert_eq!(s.free_bytes(u64::MAX).0, 1);
        assert!(s.dram_keys_with_prefix("b", "", 10).is_empty());
    }

    #[test]
    fn a_soft_pin_yields_to_unpinned_keys_under_pressure() {
        let mut s = store(1 << 20);
        put(&mut s, "old", 256 << 10);
        s.pin_keys(
            "b",
            &["old".into()],
            AdminPin::Soft(Instant::now() + Duration::from_secs(60)),
        )
        .expect("pin");
        for i in 0..2 {
            put(&mut s, &format!("n{i}"), 256 << 10);
        }
        // One more object than fits: a newer, unpinned object goes, not the pinned older one.
        put(&mut s, "last", 256 << 10);
        assert!(s.dram_keys_with_prefix("b", "old", 1).len() == 1);
        assert_eq!(s.pin_count(), 1);
    }
}
