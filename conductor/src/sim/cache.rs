//! A simulated node's KV cache: a fixed number of blocks and an eviction policy.
//!
//! Blocks are the trace's dense ids, so the cache is three arrays indexed by id (an
//! intrusive doubly linked list plus a presence flag) and every operation is O(1) with no
//! hashing: the simulator touches every block of every request on every policy, and this is
//! where its time would otherwise go.

use std::str::FromStr;

const NIL: u32 = u32::MAX;

/// Which block leaves when the cache is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Eviction {
    /// Least recently used (a hit refreshes a block).
    Lru,
    /// First in, first out (a hit does not refresh).
    Fifo,
}

impl FromStr for Eviction {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "lru" => Ok(Eviction::Lru),
            "fifo" => Ok(Eviction::Fifo),
            other => Err(format!("unknown eviction policy {other:?} (lru, fifo)")),
        }
    }
}

/// A bounded set of block ids with an eviction order.
#[derive(Debug, Clone)]
pub struct BlockCache {
    capacity: usize,
    len: usize,
    /// Towards the most recently inserted/used.
    prev: Vec<u32>,
    /// Towards the next to evict.
    next: Vec<u32>,
    present: Vec<bool>,
    /// Most recent end.
    head: u32,
    /// Eviction end.
    tail: u32,
    policy: Eviction,
}

impl BlockCache {
    /// A cache of `capacity` blocks over ids `0..universe`.
    pub fn new(capacity: usize, universe: usize, policy: Eviction) -> BlockCache {
        BlockCache {
            capacity,
            len: 0,
            prev: vec![NIL; universe],
            next: vec![NIL; universe],
            present: vec![false; universe],
            head: NIL,
            tail: NIL,
            policy,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn contains(&self, id: u32) -> bool {
        self.present.get(id as usize).copied().unwrap_or(false)
    }

    /// How many leading ids of `ids` are cached.
    pub fn prefix_len(&self, ids: &[u32]) -> usize {
        ids.iter().take_while(|id| self.contains(**id)).count()
    }

    fn unlink(&mut self, id: u32) {
        let (p, n) = (self.prev[id as usize], self.next[id as usize]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
    }

    fn push_head(&mut self, id: u32) {
        self.prev[id as usize] = NIL;
        self.next[id as usize] = self.head;
        if self.head != NIL {
            self.prev[self.head as usize] = id;
        }
        self.head = id;
        if self.tail == NIL {
            self.tail = id;
        }
    }

    /// Records a hit on `id` (refreshes it under LRU).
    pub fn touch(&mut self, id: u32) {
        if self.policy == Eviction::Lru && self.contains(id) && self.head != id {
            self.unlink(id);
            self.push_head(id);
        }
    }

    /// Adds `id` (a hit if present), evicting into `evicted` as needed. Returns whether it
    /// was newly stored. A zero-capacity cache stores nothing.
    pub fn insert(&mut self, id: u32, evicted: &mut Vec<u32>) -> bool {
        if (id as usize) >= self.present.len() || self.capacity == 0 {
            return false;
        }
        if self.contains(id) {
            self.touch(id);
            return false;
        }
        while self.len >= self.capacity && self.tail != NIL {
            let victim = self.tail;
            self.unlink(victim);
            self.present[victim as usize] = false;
            self.len -= 1;
            evicted.push(victim);
        }
        self.push_head(id);
        self.present[id as usize] = true;
        self.len += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_evicts_the_least_recently_used() {
        let mut c = BlockCache::new(2, 10, Eviction::Lru);
        let mut ev = Vec::new();
        assert!(c.insert(1, &mut ev));
        assert!(c.insert(2, &mut ev));
        c.touch(1);
        assert!(c.insert(3, &mut ev));
        assert_eq!(ev, vec![2]);
        assert!(c.contains(1) && c.contains(3) && !c.contains(2));
        assert!(!c.insert(3, &mut ev), "already there");
        assert_eq!(c.prefix_len(&[1, 3, 2, 1]), 2);
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn fifo_ignores_hits_and_zero_capacity_holds_nothing() {
        let mut c = BlockCache::new(2, 10, Eviction::Fifo);
        let mut ev = Vec::new();
        c.insert(1, &mut ev);
        c.insert(2, &mut ev);
        c.touch(1);
        c.insert(3, &mut ev);
        assert_eq!(ev, vec![1]);
        let mut z = BlockCache::new(0, 10, Eviction::Lru);
        assert!(!z.insert(1, &mut ev));
        assert!(z.is_empty());
        assert!(
            !c.insert(99, &mut ev),
            "ids outside the universe are ignored"
        );
        assert_eq!("lru".parse::<Eviction>(), Ok(Eviction::Lru));
        assert!("arc".parse::<Eviction>().is_err());
    }
}
