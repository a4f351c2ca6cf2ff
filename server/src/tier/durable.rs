//! How many bytes of `disk` objects a shard's NVMe tier can keep, and how many it keeps.
//!
//! A `disk` write is acknowledged only once it is on NVMe, so it must never be reclaimed
//! later: region reclamation rewrites durable records forward instead of dropping them. That
//! needs room. When live durable records fill the tier, a rewrite finds none, and the only
//! way forward would be to drop acknowledged data. So the budget is checked *before* the
//! write: live durable bytes (plus the writes in flight) stay below the tier's capacity less
//! two regions (the one being filled and the one being reclaimed), and a write past it is
//! refused with `InsufficientStorage`. Cached copies of `memory` objects never count: they
//! are dropped whenever room is needed.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use super::nvme::Nvme;
use super::record::is_durable;
use super::KeyName;
use crate::model::StoreError;

/// Regions kept free of durable data: the active one and the one being reclaimed.
const SPARE_REGIONS: u64 = 2;

/// Live durable bytes per key, their sum, and the limit.
#[derive(Default)]
pub struct DurableBudget {
    sizes: RefCell<HashMap<KeyName, u64>>,
    used: Cell<u64>,
    /// Bytes of durable writes between their check and their append.
    reserved: Rc<Cell<u64>>,
    limit: u64,
}

/// Bytes held for a durable write until its record is appended (or it fails).
pub struct Reservation {
    reserved: Rc<Cell<u64>>,
    bytes: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.reserved.set(self.reserved.get() - self.bytes);
    }
}

/// The bytes a record of `value_len` bytes takes on the device.
pub fn record_size(nvme: &Nvme, bucket: &str, key: &str, meta_len: usize, value_len: u64) -> u64 {
    let usable = usable_per_region(nvme);
    let overhead = usable.saturating_sub(nvme.max_value_len(bucket, key, meta_len));
    value_len + overhead
}

fn usable_per_region(nvme: &Nvme) -> u64 {
    let s = nvme.stats();
    s.capacity_bytes / u64::from(s.regions_total.max(1))
}

impl DurableBudget {
    /// The budget of a tier as recovered: every live durable record counts.
    pub fn scan(nvme: Option<&Nvme>) -> DurableBudget {
        let Some(nvme) = nvme else {
            return DurableBudget::default();
        };
        let stats = nvme.stats();
        let regions = u64::from(stats.regions_total);
        let limit = usable_per_region(nvme) * regions.saturating_sub(SPARE_REGIONS);
        let mut sizes = HashMap::new();
        let mut used = 0;
        for bucket in nvme.buckets() {
            let mut after: Option<String> = None;
            loop {
                let chunk = nvme.list(&bucket, "", after.as_deref(), 4096);
                let Some(last) = chunk.last() else { break };
                after = Some(last.key.clone());
                for l in chunk.iter().filter(|l| is_durable(&l.meta)) {
                    let size = l.location.record_len();
                    used += size;
                    sizes.insert((bucket.clone(), l.key.clone()), size);
                }
            }
        }
        DurableBudget {
            sizes: RefCell::new(sizes),
            used: Cell::new(used),
            reserved: Rc::default(),
            limit,
        }
    }

    pub fn used(&self) -> u64 {
        self.used.get()
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Holds `bytes` for a new durable version of `bucket/key`, or refuses it: the version it
    /// replaces is freed by it, so only the difference counts.
    pub fn reserve(&self, bucket: &str, key: &str, bytes: u64) -> Result<Reservation, StoreError> {
        let replaced = self
            .sizes
            .borrow()
            .get(&(bucket.to_string(), key.to_string()))
            .copied()
            .unwrap_or(0);
        let after = self.used.get() - replaced + self.reserved.get() + bytes;
        if after > self.limit {
            return Err(StoreError::InsufficientStorage(format!(
                "The NVMe tier cannot keep {bytes} more bytes of durable objects: \
                 {} of its {} durable bytes are in use on this shard. Delete objects of \
                 `disk` buckets or give the node a larger --nvme-capacity.",
                self.used.get() + self.reserved.get(),
                self.limit
            )));
        }
        self.reserved.set(self.reserved.get() + bytes);
        Ok(Reservation {
            reserved: self.reserved.clone(),
            bytes,
        })
    }

    /// A durable record of `size` bytes is now the live version of `bucket/key`.
    pub fn stored(&self, bucket: &str, key: &str, size: u64) {
        let old = self
            .sizes
            .borrow_mut()
            .insert((bucket.to_string(), key.to_string()), size)
            .unwrap_or(0);
        self.used.set(self.used.get() - old + size);
    }

    /// `bucket/key` has no live durable record any more; whether it had one.
    pub fn forget(&self, bucket: &str, key: &str) -> bool {
        let mut sizes = self.sizes.borrow_mut();
        if sizes.is_empty() {
            return false;
        }
        match sizes.remove(&(bucket.to_string(), key.to_string())) {
            Some(size) => {
                self.used.set(self.used.get() - size);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(limit: u64) -> DurableBudget {
        DurableBudget {
            limit,
            ..DurableBudget::default()
        }
    }

    #[test]
    fn refuses_past_the_limit_and_counts_replacements_once() {
        let b = budget(100);
        let r = b.reserve("b", "k", 60).unwrap();
        assert!(matches!(
            b.reserve("b", "j", 50),
            Err(StoreError::InsufficientStorage(_))
        ));
        b.stored("b", "k", 60);
        drop(r);
        assert_eq!(b.used(), 60);
        // Replacing k with 90 bytes frees its 60.
        let r = b.reserve("b", "k", 90).unwrap();
        b.stored("b", "k", 90);
        drop(r);
        assert_eq!(b.used(), 90);
        assert!(b.forget("b", "k"));
        assert!(!b.forget("b", "k"));
        assert_eq!(b.used(), 0);
    }
}
