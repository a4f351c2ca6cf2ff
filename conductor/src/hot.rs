//! Which prefixes are hot: an exponentially decayed request count per prefix.
//!
//! A prefix that many requests share, cached on few nodes, ties those requests to the same
//! few instances: they queue there, or pay a transfer each elsewhere. Copying the prefix to a
//! lightly loaded node spreads them. To know which prefixes deserve a copy, every routed
//! request counts one hit on the longest cached prefix it matched (named by the hash of its
//! last matched block: a chained hash names the whole prefix). Counts decay with a half-life,
//! so "hot" means "often, recently".

use std::collections::HashMap;

use crate::index::BlockKey;

/// Decayed request counts per prefix, bounded in size.
#[derive(Debug, Clone)]
pub struct HotTracker {
    counts: HashMap<BlockKey, (f64, f64), foldhash::fast::RandomState>,
    half_life_ms: f64,
    max_entries: usize,
}

impl HotTracker {
    pub fn new(half_life_ms: f64, max_entries: usize) -> HotTracker {
        HotTracker {
            counts: HashMap::default(),
            half_life_ms: half_life_ms.max(1.0),
            max_entries: max_entries.max(1),
        }
    }

    fn decayed(&self, count: f64, since_ms: f64, now_ms: f64) -> f64 {
        let dt = (now_ms - since_ms).max(0.0);
        count * (0.5f64).powf(dt / self.half_life_ms)
    }

    /// Counts one request on `prefix` at `now_ms`; returns its decayed count, this one
    /// included.
    pub fn touch(&mut self, prefix: BlockKey, now_ms: f64) -> f64 {
        if self.counts.len() >= self.max_entries && !self.counts.contains_key(&prefix) {
            self.shrink(now_ms);
        }
        let half_life = self.half_life_ms;
        let entry = self.counts.entry(prefix).or_insert((0.0, now_ms));
        let dt = (now_ms - entry.1).max(0.0);
        entry.0 = entry.0 * (0.5f64).powf(dt / half_life) + 1.0;
        entry.1 = now_ms;
        entry.0
    }

    /// The decayed count of `prefix` at `now_ms`, without counting.
    pub fn heat(&self, prefix: &BlockKey, now_ms: f64) -> f64 {
        self.counts
            .get(prefix)
            .map_or(0.0, |(c, t)| self.decayed(*c, *t, now_ms))
    }

    pub fn len(&self) -> usize {
        self.counts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// Drops the coldest half (amortised: runs once per `max_entries / 2` new prefixes).
    fn shrink(&mut self, now_ms: f64) {
        let mut heats: Vec<f64> = self
            .counts
            .values()
            .map(|(c, t)| self.decayed(*c, *t, now_ms))
            .collect();
        let mid = heats.len() / 2;
        heats.select_nth_unstable_by(mid, f64::total_cmp);
        let cut = heats[mid];
        let (half_life, mut dropped, target) = (self.half_life_ms, 0, self.counts.len() - mid);
        self.counts.retain(|_, (c, t)| {
            let h = *c * (0.5f64).powf((now_ms - *t).max(0.0) / half_life);
            if h <= cut && dropped < target {
                dropped += 1;
                false
            } else {
                true
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::BucketId;
    use yutu_api::block_hash::BlockHash;

    fn key(i: u64) -> BlockKey {
        BlockKey {
            bucket: BucketId(0),
            hash: BlockHash::from_id(i),
        }
    }

    #[test]
    fn counts_decay_by_half_life() {
        let mut h = HotTracker::new(1_000.0, 100);
        assert_eq!(h.touch(key(1), 0.0), 1.0);
        assert_eq!(h.touch(key(1), 0.0), 2.0);
        assert!((h.heat(&key(1), 1_000.0) - 1.0).abs() < 1e-9);
        assert!((h.touch(key(1), 2_000.0) - 1.5).abs() < 1e-9);
        assert_eq!(h.heat(&key(2), 0.0), 0.0);
    }

    #[test]
    fn size_stays_bounded_and_keeps_the_hot() {
        let mut h = HotTracker::new(1e9, 10);
        for _ in 0..5 {
            h.touch(key(0), 0.0);
        }
        for i in 1..100 {
            h.touch(key(i), 0.0);
        }
        assert!(h.len() <= 10, "{}", h.len());
        assert!(h.heat(&key(0), 0.0) >= 5.0);
    }
}
