//! Presence tables: which keys of one bucket one shard holds, in memory the node shares
//! read-only with the clients on its host, so that `exists` is a lookup in the client's own
//! address space rather than a call.
//!
//! An engine asks `exists` (or `batch_is_exist`) before nearly every request, to find how much
//! of a prompt's prefix is cached. As a call, even a binary frame on a Unix socket, that costs
//! two wake-ups (the shard's and the client's), tens of microseconds on a VM and more at the
//! tail. A presence table answers it in well under a microsecond a key.
//!
//! # The table
//! A memfd of [`HEADER_WORDS`] header words and `capacity` two-word slots, all little-endian
//! `u64` read and written atomically. The node's shard is the only writer; clients map the
//! memfd read-only (it is sealed against writes through any other mapping, see the node's
//! `store::presence`).
//!
//! | word | field |
//! |---|---|
//! | 0 | [`MAGIC`] |
//! | 1 | sequence: odd while the shard changes a slot (a sequence lock) |
//! | 2 | state: [`LIVE`], or [`RETIRED`] once the shard stopped updating the table |
//! | 3 | capacity in slots, a power of two |
//! | 4 | keys in the table |
//! | 5..8 | where the bucket's value mirror lies, or zero ([`crate::mirror`]) |
//!
//! A key is present when a slot holds its [`Fingerprint`] with a tier flag set
//! ([`FLAG_DRAM`], [`FLAG_NVME`]): the same question `exists` asks, whether either tier holds
//! the key. Slots are found by linear probing from the fingerprint's home slot, at most
//! [`MAX_PROBE`] of them; deletion shifts later slots back (no tombstones), so a lookup stops
//! at the first empty slot. The fingerprint is 126 bits of a keyed BLAKE3 hash of the key,
//! under a hash key random per table (given with the grant,
//! [`crate::kv_frame::PresenceGrant`]), so a key absent from a table of `n` keys looks
//! present with probability about `n / 2^126`.
//!
//! A reader takes the sequence, reads the slots, and takes the sequence again: the answer
//! stands if it did not change and was even. Changes are a few stores long, so a reader
//! retries a few times at most; after [`READ_TRIES`] it gives up ([`Found::Busy`]) and the
//! client asks the node instead.

use std::sync::atomic::{fence, AtomicU64, Ordering};

/// Word 0 of every table: `YUTUPRS1`.
pub const MAGIC: u64 = u64::from_le_bytes(*b"YUTUPRS1");
/// Header words before the first slot.
pub const HEADER_WORDS: usize = 8;
/// The table is kept up to date by its shard.
pub const LIVE: u64 = 0;
/// The shard no longer updates the table: ask the node (and for a new table).
pub const RETIRED: u64 = 1;
/// The key is in the shard's DRAM tier.
pub const FLAG_DRAM: u64 = 1;
/// The key is in the shard's NVMe tier.
pub const FLAG_NVME: u64 = 2;
const FLAGS: u64 = FLAG_DRAM | FLAG_NVME;
/// Most slots a key may be from its home slot. A key that cannot be placed within them makes
/// the table full (the node builds a larger one with a new hash key).
pub const MAX_PROBE: usize = 32;
/// Smallest table, in slots.
pub const MIN_CAPACITY: usize = 1024;
/// Largest table, in slots (1 GiB of slots): the node's memory budget usually says less.
pub const MAX_CAPACITY: usize = 1 << 26;
/// Tries of a reader before it gives up on a table that keeps changing under it.
pub const READ_TRIES: usize = 64;

const W_MAGIC: usize = 0;
const W_SEQ: usize = 1;
const W_STATE: usize = 2;
const W_CAPACITY: usize = 3;
const W_COUNT: usize = 4;

/// A key's identity in a table: a keyed hash, `a` never 0 (0 marks an empty slot) and the
/// low two bits of `b` clear (they hold the tier flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint {
    pub(crate) a: u64,
    pub(crate) b: u64,
}

/// The fingerprint of `key` in a table hashed with `secret`.
pub fn fingerprint(secret: &[u8; 32], key: &str) -> Fingerprint {
    let digest = blake3::keyed_hash(secret, key.as_bytes());
    let d = digest.as_bytes();
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&d[i..i + 8]);
        u64::from_le_bytes(w)
    };
    Fingerprint {
        a: word(0).max(1),
        b: word(8) & !FLAGS,
    }
}

/// Words a table of `capacity` slots takes.
pub fn words_for(capacity: usize) -> usize {
    HEADER_WORDS + 2 * capacity
}

/// Bytes a table of `capacity` slots takes.
pub fn bytes_for(capacity: usize) -> usize {
    words_for(capacity) * 8
}

/// The capacity a table for `keys` keys is built with: at most half full, and room to grow.
pub fn capacity_for(keys: usize) -> usize {
    keys.saturating_mul(4)
        .next_power_of_two()
        .clamp(MIN_CAPACITY, MAX_CAPACITY)
}

/// What a lookup found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    Present,
    Absent,
    /// The table is retired: ask the node.
    Retired,
    /// The table kept changing under the reader: ask the node.
    Busy,
}

/// Why words are not a table, or a key could not be placed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PresenceError {
    #[error("not a presence table (bad magic)")]
    Magic,
    #[error("a presence table's capacity must be a power of two from {MIN_CAPACITY} to {MAX_CAPACITY}, not {0}")]
    Capacity(u64),
    #[error("a presence table of {capacity} slots needs {needed} words; the mapping has {have}")]
    Short {
        capacity: u64,
        needed: usize,
        have: usize,
    },
    #[error("the presence table is full")]
    Full,
}

/// A table over mapped words: read by clients, written by its shard alone.
pub struct Table<'a> {
    words: &'a [AtomicU64],
    mask: usize,
}

impl<'a> Table<'a> {
    /// Starts a table in zeroed `words` (a new memfd): the header written, every slot empty.
    pub fn init(words: &'a [AtomicU64], capacity: usize) -> Result<Table<'a>, PresenceError> {
        check_capacity(capacity as u64)?;
        if words.len() < words_for(capacity) {
            return Err(PresenceError::Short {
                capacity: capacity as u64,
                needed: words_for(capacity),
                have: words.len(),
            });
        }
        words[W_CAPACITY].store(capacity as u64, Ordering::Relaxed);
        words[W_STATE].store(LIVE, Ordering::Relaxed);
        words[W_COUNT].store(0, Ordering::Relaxed);
        words[W_SEQ].store(0, Ordering::Relaxed);
        words[W_MAGIC].store(MAGIC, Ordering::Release);
        Ok(Table {
            words,
            mask: capacity - 1,
        })
    }

    /// The writer's view of the table it built over `words` with `capacity` slots; `None`
    /// when they do not make one.
    pub fn built(words: &'a [AtomicU64], capacity: usize) -> Option<Table<'a>> {
        (check_capacity(capacity as u64).is_ok() && words.len() >= words_for(capacity)).then_some(
            Table {
                words,
                mask: capacity - 1,
            },
        )
    }

    /// A table someone else wrote: its header checked against the mapping's length.
    pub fn open(words: &'a [AtomicU64]) -> Result<Table<'a>, PresenceError> {
        if words.len() < HEADER_WORDS || words[W_MAGIC].load(Ordering::Acquire) != MAGIC {
            return Err(PresenceError::Magic);
        }
        let capacity = words[W_CAPACITY].load(Ordering::Relaxed);
        check_capacity(capacity)?;
        let capacity = capacity as usize;
        if words.len() < words_for(capacity) {
            return Err(PresenceError::Short {
                capacity: capacity as u64,
                needed: words_for(capacity),
                have: words.len(),
            });
        }
        Ok(Table {
            words,
            mask: capacity - 1,
        })
    }

    pub fn capacity(&self) -> usize {
        self.mask + 1
    }

    /// Keys in the table.
    pub fn count(&self) -> u64 {
        self.words[W_COUNT].load(Ordering::Relaxed)
    }

    pub fn is_retired(&self) -> bool {
        self.words[W_STATE].load(Ordering::Acquire) != LIVE
    }

    fn slot(&self, i: usize) -> (&AtomicU64, &AtomicU64) {
        let at = HEADER_WORDS + 2 * (i & self.mask);
        (&self.words[at], &self.words[at + 1])
    }

    fn home(&self, fp: Fingerprint) -> usize {
        (fp.a as usize) & self.mask
    }

    /// Whether the key of `fp` is present, as of one moment while the table was live.
    pub fn lookup(&self, fp: Fingerprint) -> Found {
        let seq = &self.words[W_SEQ];
        for _ in 0..READ_TRIES {
            if self.is_retired() {
                return Found::Retired;
            }
            let before = seq.load(Ordering::Acquire);
            if before & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let found = self.probe(fp);
            fence(Ordering::Acquire);
            if seq.load(Ordering::Relaxed) == before {
                return if found.is_some() {
                    Found::Present
                } else {
                    Found::Absent
                };
            }
        }
        Found::Busy
    }

    /// The slot holding `fp` and its flags, if any: what a lookup reads.
    fn probe(&self, fp: Fingerprint) -> Option<(usize, u64)> {
        let home = self.home(fp);
        for d in 0..MAX_PROBE {
            let (a, b) = self.slot(home + d);
            let wa = a.load(Ordering::Relaxed);
            if wa == 0 {
                return None;
            }
            let wb = b.load(Ordering::Relaxed);
            if wa == fp.a && wb & !FLAGS == fp.b && wb & FLAGS != 0 {
                return Some(((home + d) & self.mask, wb & FLAGS));
            }
        }
        None
    }

    /// The shard's change: `flag` (a tier) set or cleared for the key of `fp`. Only the one
    /// writer may call this. [`PresenceError::Full`]: the key could not be placed, or the
    /// table would be more than half full; the table is unchanged and the node builds another.
    pub fn set(&self, fp: Fingerprint, flag: u64, on: bool) -> Result<(), PresenceError> {
        self.change(fp, flag, on, true)
    }

    /// [`Table::set`] inside a write the caller opened ([`Table::begin_write`]), or on a
    /// table no reader has yet.
    pub fn set_unlocked(&self, fp: Fingerprint, flag: u64, on: bool) -> Result<(), PresenceError> {
        self.change(fp, flag, on, false)
    }

    fn change(
        &self,
        fp: Fingerprint,
        flag: u64,
        on: bool,
        lock: bool,
    ) -> Result<(), PresenceError> {
        let flag = flag & FLAGS;
        let write = |f: &dyn Fn()| {
            if lock {
                self.begin_write();
                f();
                self.end_write();
            } else {
                f();
            }
        };
        let home = self.home(fp);
        for d in 0..MAX_PROBE {
            let i = (home + d) & self.mask;
            let (a, b) = self.slot(i);
            let wa = a.load(Ordering::Relaxed);
            if wa == 0 {
                if !on {
                    return Ok(());
                }
                let count = self.count();
                if (count + 1) * 2 > self.capacity() as u64 {
                    return Err(PresenceError::Full);
                }
                write(&|| {
                    b.store(fp.b | flag, Ordering::Relaxed);
                    a.store(fp.a, Ordering::Relaxed);
                    self.words[W_COUNT].store(count + 1, Ordering::Relaxed);
                });
                return Ok(());
            }
            let wb = b.load(Ordering::Relaxed);
            if wa == fp.a && wb & !FLAGS == fp.b {
                let flags = if on {
                    (wb & FLAGS) | flag
                } else {
                    (wb & FLAGS) & !flag
                };
                if flags == wb & FLAGS {
                    return Ok(());
                }
                if flags == 0 {
                    write(&|| self.delete(i));
                } else {
                    write(&|| b.store(fp.b | flags, Ordering::Relaxed));
                }
                return Ok(());
            }
        }
        if on {
            Err(PresenceError::Full)
        } else {
            Ok(())
        }
    }

    /// Opens a write: readers retry (or give up) until [`Table::end_write`]. Writes do not
    /// nest; the writer pairs each begin with one end.
    pub fn begin_write(&self) {
        let seq = &self.words[W_SEQ];
        let s = seq.load(Ordering::Relaxed);
        seq.store(s.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
    }

    pub fn end_write(&self) {
        let seq = &self.words[W_SEQ];
        let s = seq.load(Ordering::Relaxed);
        seq.store(s.wrapping_add(1), Ordering::Release);
    }

    /// Stops the table: readers see [`Found::Retired`] from now on.
    pub fn retire(&self) {
        self.words[W_STATE].store(RETIRED, Ordering::Release);
    }

    /// Empties slot `i`, moving back each later key of the run that may sit there (its home
    /// is not between the hole and itself), so that no lookup meets an empty slot before
    /// its key.
    fn delete(&self, mut hole: usize) {
        let mut j = hole;
        loop {
            j = (j + 1) & self.mask;
            let (a, b) = self.slot(j);
            let wa = a.load(Ordering::Relaxed);
            if wa == 0 {
                break;
            }
            let home = (wa as usize) & self.mask;
            // Distances from the key's home: the hole must not be farther than the key is.
            let key_dist = j.wrapping_sub(home) & self.mask;
            let hole_dist = hole.wrapping_sub(home) & self.mask;
            if hole_dist <= key_dist {
                let (ha, hb) = self.slot(hole);
                hb.store(b.load(Ordering::Relaxed), Ordering::Relaxed);
                ha.store(wa, Ordering::Relaxed);
                hole = j;
            }
        }
        let (a, b) = self.slot(hole);
        a.store(0, Ordering::Relaxed);
        b.store(0, Ordering::Relaxed);
        let count = self.count();
        self.words[W_COUNT].store(count.saturating_sub(1), Ordering::Relaxed);
    }
}

fn check_capacity(capacity: u64) -> Result<(), PresenceError> {
    let ok = capacity.is_power_of_two()
        && (MIN_CAPACITY as u64..=MAX_CAPACITY as u64).contains(&capacity);
    if ok {
        Ok(())
    } else {
        Err(PresenceError::Capacity(capacity))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn words(capacity: usize) -> Vec<AtomicU64> {
        (0..words_for(capacity))
            .map(|_| AtomicU64::new(0))
            .collect()
    }

    /// A fingerprint whose home slot is `home` (to force collisions).
    fn at(home: u64, id: u64) -> Fingerprint {
        Fingerprint {
            a: home | (id << 32),
            b: id << 2,
        }
    }

    #[test]
    fn keys_come_and_go_by_tier() {
        let w = words(MIN_CAPACITY);
        let t = Table::init(&w, MIN_CAPACITY).unwrap();
        let secret = [7u8; 32];
        let k = fingerprint(&secret, "k");
        assert_eq!(t.lookup(k), Found::Absent);
        t.set(k, FLAG_DRAM, true).unwrap();
        assert_eq!(t.lookup(k), Found::Present);
        t.set(k, FLAG_NVME, true).unwrap();
        t.set(k, FLAG_DRAM, false).unwrap();
        assert_eq!(t.lookup(k), Found::Present, "still on NVMe");
        assert_eq!(t.count(), 1);
        t.set(k, FLAG_NVME, false).unwrap();
        assert_eq!(t.lookup(k), Found::Absent);
        assert_eq!(t.count(), 0);
        // Clearing an absent key changes nothing.
        t.set(k, FLAG_DRAM, false).unwrap();
        assert_eq!(t.count(), 0);
        // Another hash key, another fingerprint.
        assert_ne!(fingerprint(&[8u8; 32], "k"), k);
        t.retire();
        assert_eq!(t.lookup(k), Found::Retired);
    }

    #[test]
    fn deleting_from_a_run_keeps_every_other_key_findable() {
        let cap = MIN_CAPACITY;
        let w = words(cap);
        let t = Table::init(&w, cap).unwrap();
        // A run that wraps around the end: homes at cap-2 and cap-1, spilling into 0 and 1,
        // then keys of home 0 and 1 pushed further.
        let keys: Vec<Fingerprint> = vec![
            at(cap as u64 - 2, 1),
            at(cap as u64 - 2, 2),
            at(cap as u64 - 1, 3),
            at(0, 4),
            at(1, 5),
            at(cap as u64 - 2, 6),
        ];
        for k in &keys {
            t.set(*k, FLAG_DRAM, true).unwrap();
        }
        for remove in 0..keys.len() {
            let w2 = words(cap);
            let t2 = Table::init(&w2, cap).unwrap();
            for k in &keys {
                t2.set(*k, FLAG_DRAM, true).unwrap();
            }
            t2.set(keys[remove], FLAG_DRAM, false).unwrap();
            for (i, k) in keys.iter().enumerate() {
                let want = if i == remove {
                    Found::Absent
                } else {
                    Found::Present
                };
                assert_eq!(t2.lookup(*k), want, "key {i} after removing {remove}");
            }
            assert_eq!(t2.count(), keys.len() as u64 - 1);
        }
    }

    #[test]
    fn random_changes_agree_with_a_map() {
        let cap = MIN_CAPACITY * 4;
        let w = words(cap);
        let t = Table::init(&w, cap).unwrap();
        let secret = [1u8; 32];
        let mut model: HashMap<u32, u64> = HashMap::new();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..50_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let key = (x % 1500) as u32;
            let flag = if x & (1 << 40) == 0 {
                FLAG_DRAM
            } else {
                FLAG_NVME
            };
            let on = x & (1 << 41) == 0;
            let fp = fingerprint(&secret, &format!("key-{key}"));
            t.set(fp, flag, on).unwrap();
            let e = model.entry(key).or_insert(0);
            if on {
                *e |= flag
            } else {
                *e &= !flag
            }
        }
        let present = model.values().filter(|f| **f != 0).count() as u64;
        assert_eq!(t.count(), present);
        for key in 0..1500u32 {
            let fp = fingerprint(&secret, &format!("key-{key}"));
            let want = if model.get(&key).copied().unwrap_or(0) != 0 {
                Found::Present
            } else {
                Found::Absent
            };
            assert_eq!(t.lookup(fp), want, "key-{key}");
        }
    }

    #[test]
    fn a_table_refuses_more_than_half_full_or_a_run_too_long() {
        let cap = MIN_CAPACITY;
        let w = words(cap);
        let t = Table::init(&w, cap).unwrap();
        for i in 0..MAX_PROBE as u64 {
            t.set(at(5, i + 1), FLAG_DRAM, true).unwrap();
        }
        assert_eq!(
            t.set(at(5, 1000), FLAG_DRAM, true),
            Err(PresenceError::Full)
        );
        assert_eq!(t.lookup(at(5, 1000)), Found::Absent);
        let w = words(cap);
        let t = Table::init(&w, cap).unwrap();
        let secret = [2u8; 32];
        let mut placed = 0;
        for i in 0..cap {
            match t.set(fingerprint(&secret, &i.to_string()), FLAG_DRAM, true) {
                Ok(()) => placed += 1,
                Err(PresenceError::Full) => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(placed, cap / 2);
    }

    #[test]
    fn a_reader_gives_up_on_a_write_left_open_and_sees_it_once_closed() {
        let w = words(MIN_CAPACITY);
        let t = Table::init(&w, MIN_CAPACITY).unwrap();
        let k = fingerprint(&[4u8; 32], "k");
        t.set(k, FLAG_DRAM, true).unwrap();
        t.begin_write();
        t.set_unlocked(k, FLAG_DRAM, false).unwrap();
        assert_eq!(t.lookup(k), Found::Busy, "a write in progress");
        t.set_unlocked(k, FLAG_DRAM, true).unwrap();
        t.end_write();
        assert_eq!(t.lookup(k), Found::Present);
    }

    #[test]
    fn only_well_formed_tables_open() {
        let w = words(MIN_CAPACITY);
        assert_eq!(Table::open(&w).err(), Some(PresenceError::Magic));
        Table::init(&w, MIN_CAPACITY).unwrap();
        assert!(Table::open(&w).is_ok());
        assert_eq!(
            Table::open(&w[..100]).err(),
            Some(PresenceError::Short {
                capacity: MIN_CAPACITY as u64,
                needed: words_for(MIN_CAPACITY),
                have: 100
            })
        );
        w[W_CAPACITY].store(1000, Ordering::Relaxed);
        assert_eq!(Table::open(&w).err(), Some(PresenceError::Capacity(1000)));
        assert!(Table::init(&w, 3).is_err());
        assert_eq!(capacity_for(0), MIN_CAPACITY);
        assert_eq!(capacity_for(1000), 4096);
    }

    #[test]
    fn a_reader_beside_the_writer_sees_every_stable_key() {
        let cap = MIN_CAPACITY * 8;
        let w = words(cap);
        let t = Table::init(&w, cap).unwrap();
        let secret = [3u8; 32];
        let stable: Vec<Fingerprint> = (0..500)
            .map(|i| fingerprint(&secret, &format!("stable-{i}")))
            .collect();
        for k in &stable {
            t.set(*k, FLAG_DRAM, true).unwrap();
        }
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                let t = Table::open(&w).unwrap();
                let mut rounds = 0;
                while !stop.load(Ordering::Relaxed) || rounds == 0 {
                    for k in &stable {
                        let f = t.lookup(*k);
                        assert!(matches!(f, Found::Present | Found::Busy), "{f:?}");
                    }
                    rounds += 1;
                }
            });
            // Churn around the stable keys: inserts and backward-shift deletes move them.
            for round in 0..200 {
                for i in 0..500 {
                    let k = fingerprint(&secret, &format!("churn-{i}"));
                    t.set(k, FLAG_DRAM, round % 2 == 0).unwrap();
                }
            }
            stop.store(true, Ordering::Relaxed);
        });
    }
}
