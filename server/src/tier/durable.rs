//! How many bytes of `disk` objects a shard's NVMe tier can keep, and how many it keeps.
//!
//! A `disk` write is acknowledged only once it is on NVMe, so it must never be reclaimed
//! later: region reclamation rewrites durable records forward instead of dropping them. That
//! needs room. When live durable records fill the tier, a rewrite finds none, and the only
//! way forward would be to drop acknowledged data. So the budget is checked *before* the
//! write: live durable records (plus the writes in flight) must fit in the tier's regions
//! less two (the one being filled and the one being reclaimed), and a write past that is
//! refused with `InsufficientStorage`. Cached copies of `memory` objects never count: they
//! are dropped whenever room is needed.
//!
//! "Fit" is counted in whole regions, not in bytes: a record never spans two regions, so a
//! region is sealed with the room its next record did not fit in left empty. Records of at
//! most `m` bytes fill every region they seal to more than `region - m` (a 4 MiB region
//! holds three 1 MiB objects, not four), and in any case to more than the region less the
//! next record, so their bytes never take more than `region / max(region - m, region / 2)`
//! times their size in regions. The limit in bytes is scaled down by that factor for the
//! largest durable record held or being written. Counting bytes alone let a node with 4 MiB
//! regions acknowledge more 1 MiB objects than its regions could hold; the reclamations that
//! followed dropped acknowledged ones.
//!
//! This bounds the regions the durable records need once packed one after another, as
//! writes and reclamation rewrites place them. It relies on reclamation never dropping a
//! record it was told to rewrite: `yutu-blockstore` rewrites a kept record even when that leaves
//! no room for the record that triggered the reclamation (which waits for the next region).

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use super::nvme::Nvme;
use super::record::is_durable;
use super::KeyName;
use crate::model::StoreError;

/// Regions kept free of durable data: the active one and the one being reclaimed.
const SPARE_REGIONS: u64 = 2;

/// How many records have each length (a multiset: its largest key is the largest record).
#[derive(Default)]
struct Lengths(BTreeMap<u64, u32>);

impl Lengths {
    fn add(&mut self, len: u64) {
        *self.0.entry(len).or_insert(0) += 1;
    }

    fn remove(&mut self, len: u64) {
        if let Some(n) = self.0.get_mut(&len) {
            *n -= 1;
            if *n == 0 {
                self.0.remove(&len);
            }
        }
    }

    fn largest(&self) -> u64 {
        self.0.last_key_value().map_or(0, |(len, _)| *len)
    }
}

/// Durable writes between their check and their append: their bytes and record lengths.
#[derive(Default)]
struct Pending {
    bytes: Cell<u64>,
    lengths: RefCell<Lengths>,
}

/// Live durable bytes per key, their sum, and the limit.
#[derive(Default)]
pub struct DurableBudget {
    sizes: RefCell<HashMap<KeyName, u64>>,
    /// The lengths of the live durable records: the largest decides how full the regions
    /// holding them can be (see the module docs).
    lengths: RefCell<Lengths>,
    used: Cell<u64>,
    pending: Rc<Pending>,
    /// Record bytes of the regions durable records may take, were every region full.
    limit: u64,
    /// Record bytes of one region.
    region: u64,
}

/// Bytes held for a durable write until its record is appended (or it fails).
pub struct Reservation {
    pending: Rc<Pending>,
    bytes: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.pending
            .bytes
            .set(self.pending.bytes.get() - self.bytes);
        self.pending.lengths.borrow_mut().remove(self.bytes);
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
    /// The budget of a tier as recovered: every live durable record counts, so a restarted
    /// node refuses what the one before it would have refused.
    pub fn scan(nvme: Option<&Nvme>) -> DurableBudget {
        let Some(nvme) = nvme else {
            return DurableBudget::default();
        };
        let stats = nvme.stats();
        let regions = u64::from(stats.regions_total);
        let region = usable_per_region(nvme);
        let mut sizes = HashMap::new();
        let mut lengths = Lengths::default();
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
                    lengths.add(size);
                    sizes.insert((bucket.clone(), l.key.clone()), size);
                }
            }
        }
        DurableBudget {
            sizes: RefCell::new(sizes),
            lengths: RefCell::new(lengths),
            used: Cell::new(used),
            pending: Rc::default(),
            limit: region * regions.saturating_sub(SPARE_REGIONS),
            region,
        }
    }

    pub fn used(&self) -> u64 {
        self.used.get()
    }

    /// The most live durable bytes the tier can keep with the records it keeps now.
    pub fn limit(&self) -> u64 {
        self.limit_for(self.largest())
    }

    fn largest(&self) -> u64 {
        let held = self.lengths.borrow().largest();
        held.max(self.pending.lengths.borrow().largest())
    }

    /// The limit when no record is larger than `largest` bytes: the bytes that fill, at
    /// worst, as many regions as the limit counts (see the module docs).
    fn limit_for(&self, largest: u64) -> u64 {
        if self.region == 0 {
            return 0;
        }
        let per_region = self.region.saturating_sub(largest).max(self.region / 2);
        let scaled = u128::from(self.limit) * u128::from(per_region) / u128::from(self.region);
        u64::try_from(scaled).unwrap_or(u64::MAX)
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
        let in_flight = self.pending.bytes.get();
        let after = (self.used.get() - replaced)
            .saturating_add(in_flight)
            .saturating_add(bytes);
        let limit = self.limit_for(self.largest().max(bytes));
        if after > limit {
            return Err(StoreError::InsufficientStorage(format!(
                "The NVMe tier cannot keep {bytes} more bytes of durable objects: \
                 {} of the {limit} durable bytes it can keep are in use on this shard. \
                 Delete objects of `disk` buckets or give the node a larger --nvme-capacity.",
                self.used.get() + in_flight,
            )));
        }
        self.pending.bytes.set(in_flight + bytes);
        self.pending.lengths.borrow_mut().add(bytes);
        Ok(Reservation {
            pending: self.pending.clone(),
            bytes,
        })
    }

    /// A durable record of `size` bytes is now the live version of `bucket/key`.
    pub fn stored(&self, bucket: &str, key: &str, size: u64) {
        let old = self
            .sizes
            .borrow_mut()
            .insert((bucket.to_string(), key.to_string()), size);
        let mut lengths = self.lengths.borrow_mut();
        if let Some(old) = old {
            lengths.remove(old);
        }
        lengths.add(size);
        self.used.set(self.used.get() - old.unwrap_or(0) + size);
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
                self.lengths.borrow_mut().remove(size);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A budget of `regions` regions of `region` record bytes each.
    fn budget(regions: u64, region: u64) -> DurableBudget {
        DurableBudget {
            limit: region * regions.saturating_sub(SPARE_REGIONS),
            region,
            ..DurableBudget::default()
        }
    }

    #[test]
    fn refuses_past_the_limit_and_counts_replacements_once() {
        // One region of 100 000 bytes for durable records, records of a few percent of it.
        let b = budget(3, 100_000);
        let r = b.reserve("b", "k", 6_000).unwrap();
        assert!(matches!(
            b.reserve("b", "j", 90_000),
            Err(StoreError::InsufficientStorage(_))
        ));
        b.stored("b", "k", 6_000);
        drop(r);
        assert_eq!(b.used(), 6_000);
        // Replacing k frees its old record: only the difference counts.
        assert!(b.reserve("b", "j", 89_000).is_err());
        let r = b.reserve("b", "k", 9_000).unwrap();
        b.stored("b", "k", 9_000);
        drop(r);
        assert_eq!(b.used(), 9_000);
        assert!(b.forget("b", "k"));
        assert!(!b.forget("b", "k"));
        assert_eq!(b.used(), 0);
        assert_eq!(b.limit(), 100_000);
    }

    /// The regions `records` take when appended one after the other, a record never
    /// spanning two regions.
    fn regions_for(records: &[u64], region: u64) -> u64 {
        let (mut regions, mut fill) = (0, region);
        for &r in records {
            if fill + r > region {
                regions += 1;
                fill = 0;
            }
            fill += r;
        }
        regions
    }

    #[test]
    fn what_it_accepts_fits_in_the_regions_it_counts() {
        // 8 regions of 4096 bytes: durable records may take 6 of them, whatever their size.
        let region = 4096;
        for size in (1..=region)
            .step_by(37)
            .chain([1366, 1367, 2048, 2049, region])
        {
            let b = budget(8, region);
            let mut records = Vec::new();
            while b.reserve("b", &format!("k{}", records.len()), size).is_ok() {
                b.stored("b", &format!("k{}", records.len()), size);
                records.push(size);
            }
            let used = regions_for(&records, region);
            assert!(
                used <= 6,
                "{} records of {size} take {used} regions",
                records.len()
            );
            // And not needlessly few: at least half of what the regions hold.
            assert!(
                records.len() as u64 >= 6 * (region / size) / 2,
                "only {} records of {size}",
                records.len()
            );
        }
    }

    #[test]
    fn a_large_record_lowers_the_limit_until_it_goes() {
        let b = budget(8, 4000);
        assert_eq!(b.limit(), 24_000);
        b.stored("b", "small", 100);
        assert_eq!(b.limit(), 24_000 * 3900 / 4000);
        // A record of more than half a region fills one alone: the limit is halved.
        let r = b.reserve("b", "big", 3000).unwrap();
        assert_eq!(b.limit(), 12_000, "a write in flight counts too");
        drop(r);
        b.stored("b", "big", 3000);
        assert_eq!(b.limit(), 12_000);
        assert!(b.reserve("b", "more", 9000).is_err());
        assert!(b.forget("b", "big"));
        assert_eq!(b.limit(), 24_000 * 3900 / 4000);
        assert!(b.reserve("b", "more", 9000).is_ok());
    }
}
