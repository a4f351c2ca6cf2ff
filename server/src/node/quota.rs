//! Bucket quotas: how many bytes each bucket holds, over the node's shards and (in a cluster)
//! the other nodes, and the check every client write passes before it is stored.
//!
//! Each shard counts its own bytes per bucket exactly ([`TieredStore::bucket_bytes`]: DRAM
//! and NVMe, each object once) and publishes the figure here: after each write it admitted,
//! and every [`PUBLISH_EVERY`] for everything else (evictions, reclaims, deletes). Other
//! nodes' figures arrive through etcd from the cluster agent ([`BucketUsage::set_elsewhere`]).
//! A bucket's usage is then `(this node + other nodes) / replicas`: each object counted once
//! whatever its replica count, since every owner holds a copy.
//!
//! A write is admitted when the usage, plus the writes admitted and not yet stored, plus its
//! own size fits the quota. The in-flight sum is taken atomically before the check, so two
//! writes racing on different shards of one node cannot both take the last bytes. Between
//! nodes the figures are a moment old (the agent's poll), so a cluster can overshoot by what
//! other nodes stored in that moment. Replica copies and re-replication are never checked:
//! their coordinator was.
//!
//! Only writes are refused. Deletes and evictions free quota; a quota never evicts anything.

use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::model::StoreError;
use crate::tier::TieredStore;

/// How often each shard republishes every bucket's bytes.
pub const PUBLISH_EVERY: Duration = Duration::from_millis(500);

/// One bucket's counters.
struct Usage {
    /// Each shard's bytes of the bucket; written by that shard only.
    shards: Box<[AtomicU64]>,
    /// Bytes of writes admitted and not stored yet (counted once).
    in_flight: AtomicU64,
    /// Bytes other nodes hold, every copy counted.
    elsewhere: AtomicU64,
    /// Copies of every object (1 on a single node).
    replicas: AtomicU32,
}

impl Usage {
    fn new(nshards: usize) -> Usage {
        Usage {
            shards: (0..nshards).map(|_| AtomicU64::new(0)).collect(),
            in_flight: AtomicU64::new(0),
            elsewhere: AtomicU64::new(0),
            replicas: AtomicU32::new(1),
        }
    }

    fn on_node(&self) -> u64 {
        self.shards.iter().map(|s| s.load(Ordering::Acquire)).sum()
    }

    /// Stored bytes, each object once.
    fn stored(&self) -> u64 {
        let copies = self.on_node() + self.elsewhere.load(Ordering::Acquire);
        copies / u64::from(self.replicas.load(Ordering::Acquire).max(1))
    }
}

/// Every bucket's usage on this node, shared by its shards.
pub struct BucketUsage {
    nshards: usize,
    buckets: RwLock<HashMap<String, Arc<Usage>>>,
}

impl BucketUsage {
    pub fn new(nshards: usize) -> BucketUsage {
        BucketUsage {
            nshards: nshards.max(1),
            buckets: RwLock::default(),
        }
    }

    fn get(&self, bucket: &str) -> Option<Arc<Usage>> {
        self.buckets.read().ok()?.get(bucket).cloned()
    }

    /// The bucket's counters, created on first use. Callers name only buckets that exist,
    /// and [`BucketUsage::retain`] drops deleted ones, so the map is bounded by the buckets.
    fn entry(&self, bucket: &str) -> Arc<Usage> {
        if let Some(u) = self.get(bucket) {
            return u;
        }
        let mut map = self.buckets.write().unwrap_or_else(|p| p.into_inner());
        map.entry(bucket.to_string())
            .or_insert_with(|| Arc::new(Usage::new(self.nshards)))
            .clone()
    }

    /// Records what shard `shard` holds of `bucket`.
    pub fn set_shard(&self, bucket: &str, shard: usize, bytes: u64) {
        let u = match (bytes, self.get(bucket)) {
            (_, Some(u)) => u,
            // Nothing held and nothing known: no entry needed.
            (0, None) => return,
            (_, None) => self.entry(bucket),
        };
        if let Some(slot) = u.shards.get(shard) {
            slot.store(bytes, Ordering::Release);
        }
    }

    /// Records what the other nodes of the cluster hold of `bucket` (every copy), and its
    /// replica count.
    pub fn set_elsewhere(&self, bucket: &str, bytes: u64, replicas: u32) {
        let u = self.entry(bucket);
        u.elsewhere.store(bytes, Ordering::Release);
        u.replicas.store(replicas.max(1), Ordering::Release);
    }

    /// Bytes this node holds of each bucket (every copy it holds), for the other nodes.
    pub fn on_node(&self) -> BTreeMap<String, u64> {
        let map = self.buckets.read().unwrap_or_else(|p| p.into_inner());
        map.iter()
            .map(|(b, u)| (b.clone(), u.on_node()))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    /// The bucket's usage: each object counted once, writes in flight included.
    pub fn used(&self, bucket: &str) -> u64 {
        self.get(bucket)
            .map_or(0, |u| u.stored() + u.in_flight.load(Ordering::Acquire))
    }

    /// Forgets buckets `keep` says no longer exist.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        let mut map = self.buckets.write().unwrap_or_else(|p| p.into_inner());
        map.retain(|b, _| keep(b));
    }
}

/// A write admitted against its bucket's quota. Hold it until the write is stored (or has
/// failed): dropping it republishes the shard's figure, then releases the in-flight bytes,
/// in that order, so the bytes are never counted nowhere.
pub struct Admitted {
    held: Option<Held>,
}

struct Held {
    usage: Arc<Usage>,
    size: u64,
    shard: usize,
    bucket: String,
    tier: Rc<TieredStore>,
}

impl Admitted {
    /// A write no quota applies to (a replica copy, or a bucket without a quota).
    pub fn unchecked() -> Admitted {
        Admitted { held: None }
    }

    /// Whether this holds anything (a quota applied).
    pub fn holds(&self) -> bool {
        self.held.is_some()
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        if let Some(h) = self.held.take() {
            if let Some(slot) = h.usage.shards.get(h.shard) {
                slot.store(h.tier.bucket_bytes(&h.bucket), Ordering::Release);
            }
            h.usage.in_flight.fetch_sub(h.size, Ordering::AcqRel);
        }
    }
}

/// Admits writes of `(key, size)` into `bucket` on the shard that will store them, or refuses
/// them together with [`StoreError::QuotaExceeded`]. What a write replaces (the key's current
/// version) is netted out, so rewriting a key in a full bucket is not refused. Buckets
/// without a quota are admitted at no cost.
pub fn admit(
    usage: &BucketUsage,
    shard: usize,
    tier: &Rc<TieredStore>,
    bucket: &str,
    writes: &[(&str, u64)],
) -> Result<Admitted, StoreError> {
    let Some(quota) = tier.bucket_quota(bucket) else {
        return Ok(Admitted::unchecked());
    };
    let size: u64 = writes.iter().map(|(_, n)| *n).sum();
    let replaced: u64 = writes
        .iter()
        .map(|(key, _)| tier.stored_size(bucket, key))
        .sum();
    let need = size.saturating_sub(replaced);
    let u = usage.entry(bucket);
    // This shard's own figure is exact now; the others' are as last published.
    if let Some(slot) = u.shards.get(shard) {
        slot.store(tier.bucket_bytes(bucket), Ordering::Release);
    }
    let before = u.in_flight.fetch_add(need, Ordering::AcqRel);
    let used = u.stored() + before;
    if need > 0 && used.saturating_add(need) > quota {
        u.in_flight.fetch_sub(need, Ordering::AcqRel);
        return Err(StoreError::QuotaExceeded {
            bucket: bucket.to_string(),
            quota,
            used,
            size,
        });
    }
    Ok(Admitted {
        held: Some(Held {
            usage: u,
            size: need,
            shard,
            bucket: bucket.to_string(),
            tier: tier.clone(),
        }),
    })
}

/// Republishes every bucket's bytes on this shard.
pub fn publish_all(usage: &BucketUsage, shard: usize, tier: &TieredStore) {
    let names: Vec<String> = tier.buckets().into_iter().map(|b| b.name).collect();
    for name in names {
        usage.set_shard(&name, shard, tier.bucket_bytes(&name));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_counts_each_object_once_over_the_replicas() {
        let u = BucketUsage::new(2);
        u.set_shard("b", 0, 300);
        u.set_shard("b", 1, 100);
        assert_eq!(u.used("b"), 400);
        // Two other nodes hold 400 more copies; two copies of everything.
        u.set_elsewhere("b", 400, 2);
        assert_eq!(u.used("b"), 400);
        assert_eq!(u.on_node().get("b"), Some(&400));
        u.retain(|_| false);
        assert_eq!(u.used("b"), 0);
        // A bucket nothing is known of takes no entry.
        u.set_shard("c", 0, 0);
        assert!(u.on_node().is_empty());
    }
}
