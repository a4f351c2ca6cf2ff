//! Deletes remembered as tombstones: the version of the delete of each key, kept for a while
//! after the object is gone.
//!
//! A replica that missed a delete (it was down, or the delete and a replica copy of an older
//! write crossed on the wire) would otherwise bring the object back when it sends its copy to
//! the other owners. With the delete's version kept here, every owner refuses writes older
//! than the delete, and anti-entropy hands the tombstone to an owner that missed it.
//!
//! Tombstones are kept for `ttl` after the delete was made, by the delete's version (the same
//! age on every node, so one owner pulling a tombstone from another never makes it young
//! again), and at most `limit` at once per shard: past it the oldest go first, and are
//! counted, so the structure stays bounded whatever a client deletes. An owner away longer
//! than `ttl` may bring back keys deleted meanwhile (see the cluster notes in docs/operations.md).

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use crate::model::Version;

#[derive(Debug, Clone, Copy)]
struct Tomb {
    version: Version,
    at: Instant,
}

/// One shard's tombstones.
#[derive(Debug)]
pub struct Tombstones {
    by_key: BTreeMap<(String, String), Tomb>,
    /// Insertion order, for expiry and for dropping the oldest past `limit`. An entry whose
    /// tombstone was replaced or cleared since is skipped when it comes up.
    order: VecDeque<(Instant, String, String)>,
    ttl: Duration,
    limit: usize,
    /// Tombstones dropped before their time because `limit` was reached.
    pub dropped: u64,
}

impl Tombstones {
    pub fn new(ttl: Duration, limit: usize) -> Tombstones {
        Tombstones {
            by_key: BTreeMap::new(),
            order: VecDeque::new(),
            ttl,
            limit: limit.max(1),
            dropped: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// The version of the delete of `bucket/key`, if one is remembered.
    pub fn get(&self, bucket: &str, key: &str) -> Option<Version> {
        if self.by_key.is_empty() {
            return None;
        }
        // A tuple key cannot be looked up by borrowed parts without allocating; deletes and
        // replica writes are rare enough for this to be fine.
        self.by_key
            .get(&(bucket.to_string(), key.to_string()))
            .map(|t| t.version)
            .filter(|v| self.fresh(*v))
    }

    /// Whether a delete of `version` is younger than the ttl (by the clock it was made with).
    fn fresh(&self, version: Version) -> bool {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        version.millis().saturating_add(self.ttl.as_millis() as u64) > now_ms
    }

    /// Remembers a delete (the newer of two deletes of a key wins).
    pub fn record(&mut self, bucket: &str, key: &str, version: Version) {
        self.record_at(bucket, key, version, Instant::now());
    }

    fn record_at(&mut self, bucket: &str, key: &str, version: Version, now: Instant) {
        self.expire(now);
        if !self.fresh(version) {
            return;
        }
        let id = (bucket.to_string(), key.to_string());
        match self.by_key.get_mut(&id) {
            Some(t) if t.version >= version => return,
            Some(t) => {
                *t = Tomb { version, at: now };
            }
            None => {
                while self.by_key.len() >= self.limit {
                    match self.drop_oldest() {
                        None => break,
                        Some(true) => self.dropped += 1,
                        Some(false) => {}
                    }
                }
                self.by_key.insert(id, Tomb { version, at: now });
            }
        }
        self.order
            .push_back((now, bucket.to_string(), key.to_string()));
        if self.order.len() > 2 * self.limit {
            // Entries of replaced tombstones pile up when one key is deleted over and over:
            // keep only those still current.
            let by_key = &self.by_key;
            self.order.retain(|(at, b, k)| {
                by_key
                    .get(&(b.clone(), k.clone()))
                    .is_some_and(|t| t.at == *at)
            });
        }
    }

    /// Forgets the tombstone of `bucket/key` when a write newer than it was applied.
    pub fn clear_older(&mut self, bucket: &str, key: &str, newer: Version) {
        let id = (bucket.to_string(), key.to_string());
        if self.by_key.get(&id).is_some_and(|t| t.version < newer) {
            self.by_key.remove(&id);
        }
    }

    /// Forgets every tombstone of a bucket (deleted, or no longer here).
    pub fn forget_bucket(&mut self, bucket: &str) {
        self.by_key.retain(|(b, _), _| b != bucket);
    }

    /// Up to `limit` tombstones of `bucket` with keys after `after`, in key order.
    pub fn range(&self, bucket: &str, after: Option<&str>, limit: usize) -> Vec<(String, Version)> {
        use std::ops::Bound;
        let start = match after {
            Some(a) => Bound::Excluded((bucket.to_string(), a.to_string())),
            None => Bound::Included((bucket.to_string(), String::new())),
        };
        self.by_key
            .range((start, Bound::Unbounded))
            .take_while(|((b, _), _)| b == bucket)
            .filter(|(_, t)| self.fresh(t.version))
            .take(limit)
            .map(|((_, k), t)| (k.clone(), t.version))
            .collect()
    }

    /// Drops the tombstones older than the ttl.
    pub fn expire(&mut self, now: Instant) {
        while let Some((at, _, _)) = self.order.front() {
            if now.saturating_duration_since(*at) < self.ttl {
                break;
            }
            self.drop_oldest();
        }
    }

    /// Pops the oldest entry of `order` and removes its tombstone if it is still the one that
    /// entry recorded: `None` when there was no entry, else whether a tombstone went.
    fn drop_oldest(&mut self) -> Option<bool> {
        let (at, bucket, key) = self.order.pop_front()?;
        let id = (bucket, key);
        if self.by_key.get(&id).is_some_and(|t| t.at == at) {
            self.by_key.remove(&id);
            return Some(true);
        }
        Some(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A version made at the tests' start (plus `n` ticks), so they order by `n`.
    fn v(n: u64) -> Version {
        static BASE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
        let ms = *BASE.get_or_init(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as u64
        });
        Version {
            clock: (ms << 16) + n,
            node: 1,
        }
    }

    #[test]
    fn deletes_older_than_the_ttl_are_not_kept_or_shown() {
        let mut t = Tombstones::new(Duration::from_secs(60), 100);
        let old = Version {
            clock: 1 << 16,
            node: 1,
        };
        t.record("b", "k", old);
        assert_eq!(t.get("b", "k"), None);
        assert!(t.range("b", None, 10).is_empty());
    }

    #[test]
    fn the_newest_delete_is_kept_and_a_newer_write_clears_it() {
        let mut t = Tombstones::new(Duration::from_secs(60), 100);
        t.record("b", "k", v(5));
        t.record("b", "k", v(3));
        assert_eq!(t.get("b", "k"), Some(v(5)));
        t.clear_older("b", "k", v(4));
        assert_eq!(t.get("b", "k"), Some(v(5)), "an older write leaves it");
        t.clear_older("b", "k", v(6));
        assert_eq!(t.get("b", "k"), None);
        assert!(t.is_empty());
    }

    #[test]
    fn tombstones_expire_and_stay_within_the_limit() {
        let mut t = Tombstones::new(Duration::from_secs(10), 3);
        let start = Instant::now();
        for i in 0..5u64 {
            t.record_at("b", &format!("k{i}"), v(i + 1), start);
        }
        assert_eq!(t.len(), 3);
        assert_eq!(t.dropped, 2);
        assert_eq!(t.get("b", "k0"), None);
        assert_eq!(t.get("b", "k4"), Some(v(5)));
        // A replaced tombstone is not dropped by its old order entry.
        t.record_at("b", "k2", v(9), start + Duration::from_secs(5));
        t.expire(start + Duration::from_secs(11));
        assert_eq!(t.len(), 1);
        assert_eq!(t.get("b", "k2"), Some(v(9)));
        t.expire(start + Duration::from_secs(16));
        assert!(t.is_empty());
    }

    #[test]
    fn a_range_lists_one_buckets_tombstones_in_key_order() {
        let mut t = Tombstones::new(Duration::from_secs(60), 100);
        for (b, k) in [
            ("a", "z"),
            ("b", "k2"),
            ("b", "k1"),
            ("c", "k0"),
            ("b", "k3"),
        ] {
            t.record(b, k, v(1));
        }
        let keys = |r: Vec<(String, Version)>| r.into_iter().map(|(k, _)| k).collect::<Vec<_>>();
        assert_eq!(keys(t.range("b", None, 10)), ["k1", "k2", "k3"]);
        assert_eq!(keys(t.range("b", Some("k1"), 1)), ["k2"]);
        assert!(t.range("b", Some("k3"), 10).is_empty());
        t.forget_bucket("b");
        assert_eq!(t.len(), 2);
    }
}
