//! Eviction policies of the DRAM tier.
//!
//! The store tells the policy what happens to entries (insert, access, remove) and asks it for
//! a victim when space is short. The policy only orders entry ids; the store does the freeing,
//! so a policy can be swapped without touching the allocator or the index. Entries that must
//! not be evicted (pinned, leased, half-written; later work) are simply not handed to the
//! policy until they become evictable.

use lru::LruCache;

/// A store-assigned id of an entry, unique within a shard for the life of the process.
pub type EntryId = u64;

pub trait EvictionPolicy {
    fn name(&self) -> &'static str;
    /// A new entry of `size` bytes became evictable.
    fn on_insert(&mut self, id: EntryId, size: u64);
    /// An entry was read.
    fn on_access(&mut self, id: EntryId);
    /// An entry left the store by any path other than `pick_victim`.
    fn on_remove(&mut self, id: EntryId);
    /// An evictable entry was overwritten by a new version of `size` bytes that keeps its id
    /// (the store's overwrite in place): what a removal then an insertion would do, which
    /// is the default; a policy may do it in one step.
    fn on_rewrite(&mut self, id: EntryId, size: u64) {
        self.on_remove(id);
        self.on_insert(id, size);
    }
    /// Chooses and forgets the next entry to evict; `None` when nothing is evictable.
    fn pick_victim(&mut self) -> Option<EntryId>;
}

/// Least recently used, on the `lru` crate's O(1) linked hash map.
pub struct Lru {
    order: LruCache<EntryId, ()>,
}

impl Lru {
    pub fn new() -> Lru {
        Lru {
            order: LruCache::unbounded(),
        }
    }
}

impl Default for Lru {
    fn default() -> Self {
        Self::new()
    }
}

impl EvictionPolicy for Lru {
    fn name(&self) -> &'static str {
        "lru"
    }

    fn on_insert(&mut self, id: EntryId, _size: u64) {
        self.order.put(id, ());
    }

    fn on_access(&mut self, id: EntryId) {
        self.order.promote(&id);
    }

    fn on_remove(&mut self, id: EntryId) {
        self.order.pop(&id);
    }

    /// The most recently used, in place: `put` of a present key moves its node to the
    /// front, where `pop` then `put` would free a node and allocate another.
    fn on_rewrite(&mut self, id: EntryId, _size: u64) {
        self.order.put(id, ());
    }

    fn pick_victim(&mut self) -> Option<EntryId> {
        self.order.pop_lru().map(|(id, ())| id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_evicts_least_recent() {
        let mut p = Lru::new();
        for id in 1..=3 {
            p.on_insert(id, 10);
        }
        p.on_access(1);
        p.on_remove(2);
        assert_eq!(p.pick_victim(), Some(3));
        assert_eq!(p.pick_victim(), Some(1));
        assert_eq!(p.pick_victim(), None);
    }
}
