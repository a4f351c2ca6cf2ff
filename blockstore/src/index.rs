//! The in-DRAM index: `(bucket, key) -> Location` of the newest version of every key, with
//! the record's metadata blob (so listing and HEAD are answered without I/O).
//!
//! It is rebuilt from the device at open and lives only in memory. It is ordered (a B-tree per
//! bucket) because the server lists objects by bucket and prefix, in key order, with S3's
//! `start-after`/continuation semantics. Names are reference-counted so that the per-region
//! member lists the reclaimer walks share the index's strings instead of copying them.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::rc::Rc;

use bytes::Bytes;

use crate::location::Location;

/// One listed entry: a key of the bucket, where its record is, and its metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub key: String,
    pub location: Location,
    pub meta: Bytes,
}

#[derive(Debug, Clone)]
struct Entry {
    loc: Location,
    meta: Bytes,
}

/// One bucket's keys, and the sum of their values' lengths (what the bucket holds here, for
/// quotas), kept as keys come and go so that asking costs nothing.
#[derive(Default)]
struct BucketKeys {
    keys: BTreeMap<Rc<str>, Entry>,
    value_bytes: u64,
}

#[derive(Default)]
pub(crate) struct Index {
    buckets: BTreeMap<Rc<str>, BucketKeys>,
    len: usize,
}

impl Index {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn get(&self, bucket: &str, key: &str) -> Option<Location> {
        Some(self.buckets.get(bucket)?.keys.get(key)?.loc)
    }

    pub fn meta(&self, bucket: &str, key: &str) -> Option<Bytes> {
        Some(self.buckets.get(bucket)?.keys.get(key)?.meta.clone())
    }

    /// Calls `f` with every key of `bucket`.
    pub fn for_each_key(&self, bucket: &str, mut f: impl FnMut(&str)) {
        if let Some(part) = self.buckets.get(bucket) {
            part.keys.keys().for_each(|k| f(k));
        }
    }

    /// The sum of the value lengths of `bucket`'s live keys.
    pub fn value_bytes(&self, bucket: &str) -> u64 {
        self.buckets.get(bucket).map_or(0, |b| b.value_bytes)
    }

    /// Points `bucket/key` at `loc`; returns the shared names (for the region's member list)
    /// and the location it replaced.
    pub fn insert(
        &mut self,
        bucket: &str,
        key: &str,
        loc: Location,
        meta: Bytes,
    ) -> (Rc<str>, Rc<str>, Option<Location>) {
        let entry = Entry { loc, meta };
        let b = match self.buckets.get_key_value(bucket) {
            Some((b, _)) => b.clone(),
            None => {
                let b: Rc<str> = Rc::from(bucket);
                self.buckets.insert(b.clone(), BucketKeys::default());
                b
            }
        };
        let part = self
            .buckets
            .get_mut(bucket)
            .expect("bucket map just ensured");
        part.value_bytes += u64::from(loc.value_len);
        match part.keys.get_key_value(key) {
            Some((k, _)) => {
                let k = k.clone();
                let old = part.keys.insert(k.clone(), entry).map(|e| e.loc);
                if let Some(old) = &old {
                    part.value_bytes = part.value_bytes.saturating_sub(u64::from(old.value_len));
                }
                (b, k, old)
            }
            None => {
                let k: Rc<str> = Rc::from(key);
                part.keys.insert(k.clone(), entry);
                self.len += 1;
                (b, k, None)
            }
        }
    }

    /// Removes `bucket/key`; returns where it was.
    pub fn remove(&mut self, bucket: &str, key: &str) -> Option<Location> {
        let part = self.buckets.get_mut(bucket)?;
        let old = part.keys.remove(key)?.loc;
        part.value_bytes = part.value_bytes.saturating_sub(u64::from(old.value_len));
        self.len -= 1;
        if part.keys.is_empty() {
            self.buckets.remove(bucket);
        }
        Some(old)
    }

    /// Removes `bucket/key` only if it still points at `loc` (a newer version may have
    /// replaced it while the caller was waiting for I/O).
    pub fn remove_if(&mut self, bucket: &str, key: &str, loc: &Location) -> bool {
        if self.get(bucket, key).as_ref() == Some(loc) {
            self.remove(bucket, key);
            true
        } else {
            false
        }
    }

    /// Keys of `bucket` that start with `prefix` and sort after `start_after`, in order, at
    /// most `limit` of them.
    pub fn list(
        &self,
        bucket: &str,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
    ) -> Vec<Listed> {
        let Some(part) = self.buckets.get(bucket) else {
            return Vec::new();
        };
        let keys = &part.keys;
        let lower: Bound<&str> = match start_after {
            Some(after) if after >= prefix => Bound::Excluded(after),
            _ => Bound::Included(prefix),
        };
        keys.range::<str, _>((lower, Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix))
            .take(limit)
            .map(|(k, e)| Listed {
                key: k.to_string(),
                location: e.loc,
                meta: e.meta.clone(),
            })
            .collect()
    }

    /// Every entry with its shared names (for rebuilding the region member lists).
    pub fn entries(&self) -> Vec<(Rc<str>, Rc<str>, Location)> {
        self.buckets
            .iter()
            .flat_map(|(b, part)| {
                part.keys
                    .iter()
                    .map(move |(k, e)| (b.clone(), k.clone(), e.loc))
            })
            .collect()
    }

    /// Buckets with at least one key, in order.
    pub fn buckets(&self) -> Vec<String> {
        self.buckets.keys().map(|b| b.to_string()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(seq: u64) -> Location {
        Location {
            region: 0,
            offset: 4096,
            record_len: 100,
            value_len: 10,
            generation: 1,
            seq,
        }
    }

    #[test]
    fn insert_replace_remove() {
        let mut ix = Index::default();
        assert_eq!(ix.insert("b", "k", loc(1), Bytes::new()).2, None);
        assert_eq!(
            ix.insert("b", "k", loc(2), Bytes::from_static(b"m")).2,
            Some(loc(1))
        );
        assert_eq!(ix.len(), 1);
        // A replaced value no longer counts; only the live one does.
        assert_eq!(ix.value_bytes("b"), 10);
        ix.insert("b", "k2", loc(3), Bytes::new());
        assert_eq!(ix.value_bytes("b"), 20);
        assert!(ix.remove_if("b", "k2", &loc(3)));
        assert_eq!(ix.value_bytes("b"), 10);
        assert_eq!(ix.meta("b", "k").as_deref(), Some(&b"m"[..]));
        assert!(!ix.remove_if("b", "k", &loc(1)));
        assert!(ix.remove_if("b", "k", &loc(2)));
        assert_eq!(ix.len(), 0);
        assert_eq!(ix.value_bytes("b"), 0);
        assert!(ix.buckets().is_empty());
    }

    #[test]
    fn lists_by_prefix_in_order() {
        let mut ix = Index::default();
        for (i, k) in ["a/2", "a/1", "b/1", "a/3", "c"].iter().enumerate() {
            ix.insert("bk", k, loc(i as u64), Bytes::new());
        }
        ix.insert("other", "a/0", loc(9), Bytes::new());
        let keys = |v: Vec<Listed>| v.into_iter().map(|l| l.key).collect::<Vec<_>>();
        assert_eq!(keys(ix.list("bk", "a/", None, 10)), ["a/1", "a/2", "a/3"]);
        assert_eq!(keys(ix.list("bk", "a/", Some("a/1"), 1)), ["a/2"]);
        assert_eq!(keys(ix.list("bk", "", Some("a/3"), 10)), ["b/1", "c"]);
        assert_eq!(keys(ix.list("bk", "b", Some("a"), 10)), ["b/1"]);
        assert!(ix.list("none", "", None, 10).is_empty());
    }
}
