//! The block table under the prefix index: an open-addressing hash table with one cache line
//! per block.
//!
//! Why not `std::collections::HashMap`: the index is touched for every block of every event
//! and every request, it is far larger than the CPU caches (a million blocks is ~128 MiB),
//! so each access is a miss to DRAM. A SwissTable lookup costs two dependent misses (control
//! bytes, then the entry, which at ~80 bytes often spans two lines), and its slot addresses
//! are hidden, so lookups cannot be overlapped. Here a slot is exactly one 64-byte line
//! holding the key and up to three holders inline, found by linear probing from its home
//! slot; callers compute the homes of a batch of blocks first and touch them all
//! ([`BlockTable::prefetch`]) so that the misses are in flight together, then do the
//! lookups, which hit the cache. Large tables live in an anonymous mapping advised to use
//! transparent huge pages, which removes most TLB misses (expensive under virtualisation).
//!
//! Deletion is by backward shift (no tombstones), so probe sequences stay short under the
//! constant churn of stored/removed events. Blocks with more than three holders keep the
//! rest in a side list. The hash is foldhash with a random seed: block hashes are chosen by
//! clients and nodes, so the table must not let anyone pick colliding slots.

use std::hash::BuildHasher;

use bytemuck::{Pod, Zeroable};
use memmap2::{Advice, MmapMut};

/// One holder as stored in a slot. All-zero is "no holder".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct RawHolder {
    /// Node id + 1 (0: empty).
    pub node1: u16,
    /// 0 DRAM, 1 NVMe.
    pub tier: u8,
    pub pad: u8,
    /// 0: confirmed; otherwise the 16 ms tick at which a prediction lapses.
    pub expires: u32,
}

/// One block: exactly one cache line. All-zero is an empty slot.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C, align(64))]
struct Slot {
    /// Bucket id + 1 (0: empty slot).
    bucket1: u32,
    /// Index + 1 of the side list with holders beyond the inline three (0: none).
    overflow1: u32,
    hash: [u8; 32],
    holders: [RawHolder; 3],
}

const SLOT_BYTES: usize = std::mem::size_of::<Slot>();
const MIN_SLOTS: usize = 1024;
/// Tables at least this large are mapped (and advised to use huge pages).
const MAP_AT_BYTES: usize = 4 << 20;

/// Where the slots live: a mapping for large tables, a vector otherwise (or when mapping
/// fails).
enum Store {
    Vec(Vec<Slot>),
    Map(MmapMut),
}

impl Store {
    fn new(slots: usize) -> Store {
        let bytes = slots * SLOT_BYTES;
        if bytes >= MAP_AT_BYTES {
            if let Ok(map) = MmapMut::map_anon(bytes) {
                // Best effort: without huge pages the table still works, with more TLB
                // misses.
                let _ = map.advise(Advice::HugePage);
                return Store::Map(map);
            }
        }
        Store::Vec(vec![Slot::zeroed(); slots])
    }

    fn slots(&self) -> &[Slot] {
        match self {
            Store::Vec(v) => v,
            // A fresh anonymous mapping is page-aligned and zero-filled, and its length is a
            // multiple of the slot size, so the cast cannot fail.
            Store::Map(m) => bytemuck::cast_slice(&m[..]),
        }
    }

    fn slots_mut(&mut self) -> &mut [Slot] {
        match self {
            Store::Vec(v) => v,
            Store::Map(m) => bytemuck::cast_slice_mut(&mut m[..]),
        }
    }
}

/// Block key (bucket, hash) -> holders.
pub struct BlockTable {
    store: Store,
    mask: usize,
    len: usize,
    hasher: foldhash::fast::FixedState,
    overflow: Vec<Vec<RawHolder>>,
    free_overflow: Vec<u32>,
}

impl Default for BlockTable {
    fn default() -> Self {
        BlockTable::with_capacity(0)
    }
}

fn random_seed() -> u64 {
    // RandomState is seeded from the OS once per process and varies per instance.
    std::collections::hash_map::RandomState::new().hash_one(0x5eed_u64)
}

impl BlockTable {
    /// A table that holds `blocks` without growing.
    pub fn with_capacity(blocks: usize) -> BlockTable {
        let slots = Self::slots_for(blocks);
        BlockTable {
            store: Store::new(slots),
            mask: slots - 1,
            len: 0,
            hasher: foldhash::fast::FixedState::with_seed(random_seed()),
            overflow: Vec::new(),
            free_overflow: Vec::new(),
        }
    }

    /// Slots for `blocks` at a load factor of at most 3/4.
    fn slots_for(blocks: usize) -> usize {
        (blocks.saturating_mul(4) / 3 + 1)
            .next_power_of_two()
            .max(MIN_SLOTS)
    }

    /// Blocks in the table.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The home slot of a key.
    #[inline]
    pub fn home(&self, bucket: u32, hash: &[u8; 32]) -> usize {
        self.hasher.hash_one((bucket, hash)) as usize & self.mask
    }

    /// Starts loading a home slot into the cache: the load's value is not needed yet, so the
    /// CPU keeps going and several of these overlap.
    #[inline]
    pub fn prefetch(&self, home: usize) {
        if let Some(s) = self.store.slots().get(home) {
            std::hint::black_box(s.bucket1);
        }
    }

    /// The slot of a key, probing from `home` (from [`BlockTable::home`] since the last
    /// growth).
    #[inline]
    pub fn find_from(&self, home: usize, bucket: u32, hash: &[u8; 32]) -> Option<usize> {
        let slots = self.store.slots();
        let mut i = home & self.mask;
        loop {
            let s = &slots[i];
            if s.bucket1 == 0 {
                return None;
            }
            if s.bucket1 == bucket.wrapping_add(1) && s.hash == *hash {
                return Some(i);
            }
            i = (i + 1) & self.mask;
        }
    }

    pub fn find(&self, bucket: u32, hash: &[u8; 32]) -> Option<usize> {
        self.find_from(self.home(bucket, hash), bucket, hash)
    }

    /// Makes room for `more` blocks, growing now so that homes computed afterwards stay
    /// valid for the inserts that follow.
    pub fn reserve(&mut self, more: usize) {
        let need = self.len.saturating_add(more);
        if need.saturating_mul(4) > (self.mask + 1) * 3 {
            self.rebuild(Self::slots_for(need.max(self.len * 2)));
        }
    }

    /// The slot of a key, inserting it (without holders) if absent. The caller must have
    /// reserved room ([`BlockTable::reserve`]).
    pub fn find_or_insert_from(&mut self, home: usize, bucket: u32, hash: &[u8; 32]) -> usize {
        if (self.len + 1) * 4 > (self.mask + 1) * 3 {
            self.reserve(1);
            return self.find_or_insert_from(self.home(bucket, hash), bucket, hash);
        }
        let mask = self.mask;
        let slots = self.store.slots_mut();
        let mut i = home & mask;
        loop {
            let s = &mut slots[i];
            if s.bucket1 == 0 {
                s.bucket1 = bucket.wrapping_add(1);
                s.hash = *hash;
                self.len += 1;
                return i;
            }
            if s.bucket1 == bucket.wrapping_add(1) && s.hash == *hash {
                return i;
            }
            i = (i + 1) & mask;
        }
    }

    /// The bucket of an occupied slot.
    pub fn bucket_of(&self, i: usize) -> u32 {
        self.store.slots()[i].bucket1.wrapping_sub(1)
    }

    /// Calls `f` with each holder of slot `i` until it returns false.
    #[inline]
    pub fn for_each_holder(&self, i: usize, mut f: impl FnMut(&RawHolder) -> bool) {
        let s = &self.store.slots()[i];
        for h in s.holders.iter().filter(|h| h.node1 != 0) {
            if !f(h) {
                return;
            }
        }
        if s.overflow1 != 0 {
            if let Some(list) = self.overflow.get(s.overflow1 as usize - 1) {
                for h in list {
                    if !f(h) {
                        return;
                    }
                }
            }
        }
    }

    /// The holder of slot `i` for node `node1` (id + 1).
    #[inline]
    pub fn holder(&self, i: usize, node1: u16) -> Option<RawHolder> {
        let mut found = None;
        self.for_each_holder(i, |h| {
            if h.node1 == node1 {
                found = Some(*h);
                false
            } else {
                true
            }
        });
        found
    }

    /// Mutable access to the holder of slot `i` for `node1`.
    pub fn holder_mut(&mut self, i: usize, node1: u16) -> Option<&mut RawHolder> {
        let s = &mut self.store.slots_mut()[i];
        let overflow1 = s.overflow1;
        if let Some(pos) = s.holders.iter().position(|h| h.node1 == node1) {
            return Some(&mut s.holders[pos]);
        }
        if overflow1 == 0 {
            return None;
        }
        self.overflow
            .get_mut(overflow1 as usize - 1)
            .and_then(|l| l.iter_mut().find(|h| h.node1 == node1))
    }

    /// Adds a holder to slot `i` (the caller checked it is not there).
    pub fn push_holder(&mut self, i: usize, h: RawHolder) {
        let s = &mut self.store.slots_mut()[i];
        if let Some(free) = s.holders.iter_mut().find(|x| x.node1 == 0) {
            *free = h;
            return;
        }
        if s.overflow1 == 0 {
            let idx = match self.free_overflow.pop() {
                Some(idx) => idx,
                None => {
                    self.overflow.push(Vec::new());
                    self.overflow.len() as u32 - 1
                }
            };
            s.overflow1 = idx + 1;
        }
        if let Some(list) = self.overflow.get_mut(s.overflow1 as usize - 1) {
            list.push(h);
        }
    }

    /// Removes the holder for `node1` from slot `i`; removes the slot when it was the last.
    pub fn remove_holder(&mut self, i: usize, node1: u16) -> Option<RawHolder> {
        let s = &mut self.store.slots_mut()[i];
        let overflow1 = s.overflow1;
        let removed = if let Some(pos) = s.holders.iter().position(|h| h.node1 == node1) {
            let old = s.holders[pos];
            s.holders[pos] = RawHolder::default();
            // Keep the inline holders full while the side list has some.
            if overflow1 != 0 {
                if let Some(list) = self.overflow.get_mut(overflow1 as usize - 1) {
                    if let Some(moved) = list.pop() {
                        s.holders[pos] = moved;
                    }
                }
            }
            Some(old)
        } else if overflow1 != 0 {
            self.overflow.get_mut(overflow1 as usize - 1).and_then(|l| {
                l.iter()
                    .position(|h| h.node1 == node1)
                    .map(|p| l.swap_remove(p))
            })
        } else {
            None
        };
        if overflow1 != 0
            && self
                .overflow
                .get(overflow1 as usize - 1)
                .is_none_or(Vec::is_empty)
        {
            self.store.slots_mut()[i].overflow1 = 0;
            self.free_overflow.push(overflow1 - 1);
        }
        if self.store.slots()[i].holders.iter().all(|h| h.node1 == 0) {
            self.remove_slot(i);
        }
        removed
    }

    /// Empties slot `i` and shifts the probe sequence behind it back (no tombstones).
    fn remove_slot(&mut self, mut i: usize) {
        let overflow1 = self.store.slots()[i].overflow1;
        if overflow1 != 0 {
            if let Some(l) = self.overflow.get_mut(overflow1 as usize - 1) {
                l.clear();
            }
            self.free_overflow.push(overflow1 - 1);
        }
        let mask = self.mask;
        let hasher = &self.hasher;
        let slots = self.store.slots_mut();
        slots[i] = Slot::zeroed();
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            if slots[j].bucket1 == 0 {
                break;
            }
            let k =
                hasher.hash_one((slots[j].bucket1.wrapping_sub(1), &slots[j].hash)) as usize & mask;
            // Slot j may stay if its home lies cyclically in (i, j].
            let stays = if i <= j {
                i < k && k <= j
            } else {
                i < k || k <= j
            };
            if !stays {
                slots[i] = slots[j];
                slots[j] = Slot::zeroed();
                i = j;
            }
        }
        self.len -= 1;
    }

    /// Keeps the holders for which `keep(bucket, holder)` is true, in every slot, and drops
    /// slots left without holders. A full pass and a rebuild: for rare bulk operations.
    pub fn retain(&mut self, mut keep: impl FnMut(u32, &RawHolder) -> bool) {
        let mut lists = std::mem::take(&mut self.overflow);
        for s in self.store.slots_mut().iter_mut().filter(|s| s.bucket1 != 0) {
            let bucket = s.bucket1 - 1;
            let mut all: Vec<RawHolder> =
                s.holders.iter().copied().filter(|h| h.node1 != 0).collect();
            if s.overflow1 != 0 {
                if let Some(l) = lists.get_mut(s.overflow1 as usize - 1) {
                    all.append(l);
                }
            }
            all.retain(|h| keep(bucket, h));
            s.holders = [RawHolder::default(); 3];
            for (dst, h) in s.holders.iter_mut().zip(&all) {
                *dst = *h;
            }
            s.overflow1 = 0;
            if all.len() > 3 {
                // Reattached below, after the rebuild numbers the side lists afresh.
                lists.push(all.split_off(3));
                s.overflow1 = lists.len() as u32;
            }
            if all.is_empty() {
                s.bucket1 = 0;
            }
        }
        self.overflow = lists;
        self.rebuild(self.mask + 1);
    }

    /// Rehashes every occupied slot into a table of `slots` slots, compacting side lists.
    fn rebuild(&mut self, slots: usize) {
        let old = std::mem::replace(&mut self.store, Store::new(slots));
        let old_lists = std::mem::take(&mut self.overflow);
        self.free_overflow.clear();
        self.mask = slots - 1;
        self.len = 0;
        let mask = self.mask;
        let hasher = &self.hasher;
        let mut lists: Vec<Vec<RawHolder>> = Vec::new();
        let new = self.store.slots_mut();
        for s in old.slots().iter().filter(|s| s.bucket1 != 0) {
            let mut copy = *s;
            if s.overflow1 != 0 {
                match old_lists.get(s.overflow1 as usize - 1) {
                    Some(l) if !l.is_empty() => {
                        lists.push(l.clone());
                        copy.overflow1 = lists.len() as u32;
                    }
                    _ => copy.overflow1 = 0,
                }
            }
            let mut i = hasher.hash_one((s.bucket1 - 1, &s.hash)) as usize & mask;
            while new[i].bucket1 != 0 {
                i = (i + 1) & mask;
            }
            new[i] = copy;
            self.len += 1;
        }
        self.overflow = lists;
    }

    /// Every occupied slot index (for scans in tests).
    pub fn occupied(&self) -> impl Iterator<Item = usize> + '_ {
        self.store
            .slots()
            .iter()
            .enumerate()
            .filter(|(_, s)| s.bucket1 != 0)
            .map(|(i, _)| i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn key(i: u64) -> [u8; 32] {
        yutu_api::block_hash::BlockHash::from_id(i).0
    }

    fn holder(node: u16) -> RawHolder {
        RawHolder {
            node1: node + 1,
            ..RawHolder::default()
        }
    }

    fn holders(t: &BlockTable, i: usize) -> Vec<u16> {
        let mut v = Vec::new();
        t.for_each_holder(i, |h| {
            v.push(h.node1 - 1);
            true
        });
        v.sort_unstable();
        v
    }

    #[test]
    fn slots_are_one_cache_line() {
        assert_eq!(SLOT_BYTES, 64);
        assert_eq!(std::mem::align_of::<Slot>(), 64);
    }

    #[test]
    fn behaves_like_a_map_under_random_churn() {
        let mut t = BlockTable::with_capacity(0);
        let mut model: HashMap<(u32, [u8; 32]), Vec<u16>> = HashMap::new();
        let mut x = 0x1234_5678_9abc_def1_u64;
        for step in 0..60_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let k = key(x % 3000);
            let bucket = (x >> 40) as u32 % 2;
            let node = ((x >> 20) % 6) as u16;
            t.reserve(1);
            if x % 3 == 0 {
                if let Some(i) = t.find(bucket, &k) {
                    t.remove_holder(i, node + 1);
                }
                if let Some(v) = model.get_mut(&(bucket, k)) {
                    v.retain(|n| *n != node);
                    if v.is_empty() {
                        model.remove(&(bucket, k));
                    }
                }
            } else {
                let i = t.find_or_insert_from(t.home(bucket, &k), bucket, &k);
                if t.holder(i, node + 1).is_none() {
                    t.push_holder(i, holder(node));
                }
                let v = model.entry((bucket, k)).or_default();
                if !v.contains(&node) {
                    v.push(node);
                }
            }
            if step % 10_000 == 0 || step == 59_999 {
                assert_eq!(t.len(), model.len(), "step {step}");
                for ((b, k), v) in &model {
                    let i = t.find(*b, k).expect("present");
                    let mut want = v.clone();
                    want.sort_unstable();
                    assert_eq!(holders(&t, i), want);
                }
            }
        }
        // A bulk filter keeps exactly what it should.
        t.retain(|bucket, h| bucket == 0 && h.node1 != 1);
        model.retain(|(b, _), v| {
            v.retain(|n| *n != 0);
            *b == 0 && !v.is_empty()
        });
        assert_eq!(t.len(), model.len());
        for ((b, k), v) in &model {
            let i = t.find(*b, k).expect("present");
            let mut want = v.clone();
            want.sort_unstable();
            assert_eq!(holders(&t, i), want);
        }
        assert_eq!(t.occupied().count(), t.len());
    }

    #[test]
    fn many_holders_spill_over_and_come_back() {
        let mut t = BlockTable::with_capacity(10);
        let k = key(1);
        let i = t.find_or_insert_from(t.home(0, &k), 0, &k);
        for n in 0..10 {
            t.push_holder(i, holder(n));
        }
        assert_eq!(holders(&t, i), (0..10).collect::<Vec<_>>());
        for n in [0, 5, 9, 1] {
            assert_eq!(t.remove_holder(i, n + 1).map(|h| h.node1), Some(n + 1));
        }
        assert_eq!(holders(&t, i), vec![2, 3, 4, 6, 7, 8]);
        if let Some(h) = t.holder_mut(i, 8 + 1) {
            h.tier = 1;
        }
        assert_eq!(t.holder(i, 9).map(|h| h.tier), Some(1));
        for n in [2, 3, 4, 6, 7, 8] {
            t.remove_holder(i, n + 1);
        }
        assert!(t.is_empty());
        assert_eq!(t.find(0, &k), None);
    }

    #[test]
    fn large_tables_are_mapped_and_grow() {
        let mut t = BlockTable::with_capacity(100_000);
        assert!(matches!(t.store, Store::Map(_)));
        for n in 0..200_000u64 {
            let k = key(n);
            t.reserve(1);
            let i = t.find_or_insert_from(t.home(0, &k), 0, &k);
            t.push_holder(i, holder(1));
        }
        assert_eq!(t.len(), 200_000);
        assert!(t.find(0, &key(123_456)).is_some());
        assert!(t.find(0, &key(999_999)).is_none());
    }
}
