//! Value mirrors: the small KV values of one bucket on one shard, copied by the shard into
//! the memfd of the bucket's presence table ([`crate::presence`]), so that a same-host client
//! reads them the way it looks up a key: from its own address space, without a call.
//!
//! A `get` of a 4 KiB value, even as a binary frame on a Unix socket, costs two thread
//! wake-ups (the shard's, then the client's). On a VM a wake-up across CPUs takes tens of
//! microseconds and more at the tail; a read from the mirror takes a hash and a 4 KiB copy.
//! It is the same-host form of what an RDMA client does with a holder's memory (a one-sided
//! read), with the bucket's own table as the unit of sharing.
//!
//! # Layout
//! The mirror follows the presence table in the same memfd, at the word named by the table's
//! header word [`W_MIRROR_AT`] (0: no mirror); word [`W_MIRROR_SLOTS`] holds its slot count
//! (a power of two, at least [`WAYS`]) and [`W_MIRROR_VALUE_MAX`] the most bytes a slot's
//! value may have (a multiple of 8). Slots come in sets of [`WAYS`]: a set is the
//! [`SLOT_HEADER_WORDS`]-word headers of its slots, one after the other, then their values,
//! each `value_max / 8` words, in the same order; all little-endian `u64`s read and written
//! atomically. A slot's header:
//!
//! | word | field |
//! |---|---|
//! | 0 | sequence: odd while the shard changes the slot (a sequence lock per slot) |
//! | 1 | the key's fingerprint, first word ([`crate::presence::fingerprint`]; 0: empty slot) |
//! | 2 | the fingerprint's second word |
//! | 3 | the value's length in bytes |
//!
//! and its value is zero-padded to a whole word. A key's set is a function of its
//! fingerprint, and a key is in at most one slot of it.
//!
//! # Located slots
//! A slot whose length word has its top bit ([`LOCATED`]) set holds no value but where a
//! larger KV block lies: the rest of the length word is the block's length, value word 0 its
//! offset in the shard's DRAM arena, word 1 the time the shard wrote the slot (milliseconds
//! since the Unix epoch). A client with a view of that arena (the `kv-api` docs' arena
//! views: proof that it could read the node's memory anyway) copies the block out of its
//! view and then checks that the slot's sequence did not move ([`Mirror::still`]). The shard
//! empties a located slot before the block's bytes can be reused (a put over the key, a
//! remove, an eviction), so a copy the check confirms read one whole version: the bytes the
//! node would have answered at some moment during the copy. Readers of values see a located
//! slot as a miss, so an older reader never mistakes one for a value. The mirror is a cache: a value that
//! finds no free slot takes the place of another key's (that key is then read from the
//! node), and a key that is not in the mirror says nothing about whether it exists (the
//! presence table says that).
//!
//! # What a reader may rely on
//! The shard copies into a slot only the value its DRAM holds at that moment (it does so
//! when it serves a read of the key's bytes), and empties the slot before a removal, eviction
//! or replacement of the key answers: a value read from a live mirror is the value the node
//! would have answered at some moment during the read. A reader takes the slot's sequence,
//! reads the slot, and takes the sequence again; the read stands if it did not change and
//! was even. The shard mirrors only KV blocks (not S3 objects, which may
//! carry their own ACLs), and only while the table is live: a retired table's mirror is
//! emptied slot by slot under the same locks.

use std::sync::atomic::{fence, AtomicU64, Ordering};

use crate::presence::Fingerprint;

/// Header word of the presence table holding the mirror's first word (0: no mirror).
pub const W_MIRROR_AT: usize = 5;
/// Header word holding the mirror's slot count.
pub const W_MIRROR_SLOTS: usize = 6;
/// Header word holding the most bytes a mirrored value may have.
pub const W_MIRROR_VALUE_MAX: usize = 7;
/// Words of a slot before its value.
pub const SLOT_HEADER_WORDS: usize = 4;
/// Slots a key may be in (one of them).
pub const WAYS: usize = 4;
/// Largest value a mirror may be built for (the node mirrors 4 KiB by default).
pub const MAX_VALUE_MAX: usize = 64 << 10;
/// Most slots of one mirror.
pub const MAX_SLOTS: usize = 1 << 20;
/// Tries of a reader on a slot that keeps changing under it.
pub const READ_TRIES: usize = 64;
/// The length word's flag of a located slot (see the module docs).
pub const LOCATED: u64 = 1 << 63;
/// How long after the shard wrote a located slot a client copies through it. Reads through
/// a slot are not calls, so the node does not see them: past this a client asks the node
/// again (which writes the slot afresh), and a block read only through slots still moves to
/// the front of the eviction order about once in this time.
pub const LOCATED_FRESH_MS: u64 = 1_000;

/// Words a mirror of `slots` slots of values up to `value_max` bytes takes.
pub fn words_for(slots: usize, value_max: usize) -> usize {
    slots * slot_words(value_max)
}

fn slot_words(value_max: usize) -> usize {
    SLOT_HEADER_WORDS + value_max.div_ceil(8)
}

/// What a store did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// In a slot written before.
    Reused,
    /// In a slot never written before (its pages are now the mirror's to keep).
    Fresh,
    /// Not stored: too large (any older value of the key dropped), or only a fresh slot was
    /// left and fresh slots were not allowed.
    No,
}

/// What a read found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// The value, this many bytes long, is in the output.
    Hit(usize),
    /// Not mirrored: ask the node.
    Miss,
    /// The slot kept changing under the reader: ask the node.
    Busy,
}

/// Where a located slot says a block lies, and the slot's sequence when that was read (for
/// [`Mirror::still`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Located {
    /// The block's offset in the shard's DRAM arena.
    pub offset: u64,
    /// The block's length in bytes.
    pub len: u64,
    /// When the shard wrote the slot, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The slot's sequence word (an index into the mirror's words) and its value then.
    word: usize,
    seq: u64,
}

/// Why words do not hold a mirror.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MirrorError {
    #[error("a value mirror's slots must be a power of two from {WAYS} to {MAX_SLOTS}, not {0}")]
    Slots(u64),
    #[error(
        "a value mirror's values must be a multiple of 8 bytes up to {MAX_VALUE_MAX}, not {0}"
    )]
    ValueMax(u64),
    #[error("a value mirror at word {at} of {needed} words passes the mapping's {have}")]
    Short { at: u64, needed: usize, have: usize },
}

/// A mirror over mapped words: read by clients, written by its shard alone.
pub struct Mirror<'a> {
    words: &'a [AtomicU64],
    sets: usize,
    value_max: usize,
}

impl<'a> Mirror<'a> {
    /// The mirror of `slots` slots of at most `value_max` bytes at word `at` of `words` (the
    /// whole mapping, presence table first), checked against the mapping.
    pub fn over(
        words: &'a [AtomicU64],
        at: u64,
        slots: u64,
        value_max: u64,
    ) -> Result<Mirror<'a>, MirrorError> {
        if !slots.is_power_of_two() || !(WAYS as u64..=MAX_SLOTS as u64).contains(&slots) {
            return Err(MirrorError::Slots(slots));
        }
        if value_max == 0 || value_max % 8 != 0 || value_max > MAX_VALUE_MAX as u64 {
            return Err(MirrorError::ValueMax(value_max));
        }
        let needed = words_for(slots as usize, value_max as usize);
        let fits = usize::try_from(at)
            .ok()
            .and_then(|a| a.checked_add(needed))
            .is_some_and(|end| end <= words.len());
        if !fits {
            return Err(MirrorError::Short {
                at,
                needed,
                have: words.len(),
            });
        }
        let at = at as usize;
        Ok(Mirror {
            words: &words[at..at + needed],
            sets: slots as usize / WAYS,
            value_max: value_max as usize,
        })
    }

    /// The mirror a table's header names in `words`: `None` when it names none.
    pub fn named(words: &'a [AtomicU64]) -> Result<Option<Mirror<'a>>, MirrorError> {
        let word = |i: usize| words.get(i).map_or(0, |w| w.load(Ordering::Relaxed));
        let at = word(W_MIRROR_AT);
        if at == 0 {
            return Ok(None);
        }
        Mirror::over(words, at, word(W_MIRROR_SLOTS), word(W_MIRROR_VALUE_MAX)).map(Some)
    }

    /// Writes the mirror's place and shape into the table's header words (`words` is the
    /// whole mapping, zeroed where the mirror lies).
    pub fn announce(&self, words: &[AtomicU64], at: u64) {
        words[W_MIRROR_SLOTS].store((self.sets * WAYS) as u64, Ordering::Relaxed);
        words[W_MIRROR_VALUE_MAX].store(self.value_max as u64, Ordering::Relaxed);
        words[W_MIRROR_AT].store(at, Ordering::Release);
    }

    /// The most bytes a mirrored value may have.
    pub fn value_max(&self) -> usize {
        self.value_max
    }

    /// Slot `way` of the set starting at word `base`: its header words together with its
    /// set's (one or two cache lines for a lookup of the whole set), its value after them.
    fn slot(&self, base: usize, way: usize) -> Slot<'_> {
        let head = base + way * SLOT_HEADER_WORDS;
        let vw = self.value_max / 8;
        let value = base + WAYS * SLOT_HEADER_WORDS + way * vw;
        Slot {
            head: &self.words[head..head + SLOT_HEADER_WORDS],
            value: &self.words[value..value + vw],
        }
    }

    /// The first word of `fp`'s set.
    fn base(&self, fp: Fingerprint) -> usize {
        // The second word picks the set, the presence table's home slot comes from the
        // first: keys crowded in one are spread in the other.
        let set = ((fp.b >> 2) as usize) & (self.sets - 1);
        set * WAYS * slot_words(self.value_max)
    }

    /// The slots of `fp`'s set.
    fn set(&self, fp: Fingerprint) -> impl Iterator<Item = Slot<'_>> {
        let base = self.base(fp);
        (0..WAYS).map(move |way| self.slot(base, way))
    }

    /// Where `fp`'s block lies, when a located slot of its set says so; `None` when no slot
    /// does (or the slot kept changing). The caller copies the block and then asks
    /// [`Mirror::still`] whether the copy stands.
    pub fn located(&self, fp: Fingerprint) -> Option<Located> {
        let base = self.base(fp);
        for way in 0..WAYS {
            let slot = self.slot(base, way);
            let seq = &slot.head[0];
            for _ in 0..READ_TRIES {
                let before = seq.load(Ordering::Acquire);
                if before & 1 == 1 {
                    std::hint::spin_loop();
                    continue;
                }
                let mine = slot.is(fp);
                let len = slot.head[3].load(Ordering::Relaxed);
                let offset = slot.value[0].load(Ordering::Relaxed);
                let at_ms = slot.value.get(1).map_or(0, |w| w.load(Ordering::Relaxed));
                fence(Ordering::Acquire);
                if seq.load(Ordering::Relaxed) != before {
                    continue;
                }
                if !mine {
                    break;
                }
                if len & LOCATED == 0 {
                    return None;
                }
                return Some(Located {
                    offset,
                    len: len & !LOCATED,
                    at_ms,
                    word: base + way * SLOT_HEADER_WORDS,
                    seq: before,
                });
            }
        }
        None
    }

    /// Whether the slot `at` was read from has not changed since: a copy made after
    /// [`Mirror::located`] and before this call read the block's bytes whole, from before
    /// any change to them.
    pub fn still(&self, at: &Located) -> bool {
        // Orders the caller's reads of the block before the sequence's (the reader's side
        // of the sequence lock: the shard moves the sequence before the bytes can change).
        fence(Ordering::Acquire);
        self.words
            .get(at.word)
            .is_some_and(|w| w.load(Ordering::Relaxed) == at.seq)
    }

    /// Reads the value of `fp` into `out` (cleared first).
    pub fn read(&self, fp: Fingerprint, out: &mut Vec<u8>) -> Read {
        for slot in self.set(fp) {
            match self.read_slot(&slot, fp, out) {
                Read::Miss => continue,
                found => return found,
            }
        }
        out.clear();
        Read::Miss
    }

    fn read_slot(&self, slot: &Slot<'_>, fp: Fingerprint, out: &mut Vec<u8>) -> Read {
        let seq = &slot.head[0];
        for _ in 0..READ_TRIES {
            let before = seq.load(Ordering::Acquire);
            if before & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let mine = slot.is(fp);
            let len = slot.head[3].load(Ordering::Relaxed) as usize;
            out.clear();
            if mine && len <= self.value_max {
                out.resize(len.next_multiple_of(8), 0);
                for (dst, w) in out.chunks_exact_mut(8).zip(slot.value) {
                    dst.copy_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
                }
                out.truncate(len);
            }
            fence(Ordering::Acquire);
            if seq.load(Ordering::Relaxed) != before {
                continue;
            }
            return if mine && len <= self.value_max {
                Read::Hit(len)
            } else {
                Read::Miss
            };
        }
        out.clear();
        Read::Busy
    }

    /// The shard's copy of `value` as `fp`'s (only the one writer may call this); `turn`
    /// picks the slot a full set gives up, and `fresh_ok` whether a slot never written may be
    /// taken (the shard's budget counts those: their pages stay the mirror's). A value too
    /// large for the mirror is not mirrored, and any older value of the key is dropped.
    pub fn store(&self, fp: Fingerprint, value: &[u8], turn: u64, fresh_ok: bool) -> Stored {
        if value.len() > self.value_max {
            self.remove(fp);
            return Stored::No;
        }
        let base = self.base(fp);
        let (mut mine, mut empty, mut fresh) = (None, None, None);
        for way in 0..WAYS {
            let slot = self.slot(base, way);
            if slot.is(fp) {
                mine = Some(way);
                break;
            }
            let written = slot.head[0].load(Ordering::Relaxed) != 0;
            if slot.head[1].load(Ordering::Relaxed) == 0 {
                if written {
                    empty = empty.or(Some(way));
                } else {
                    fresh = fresh.or(Some(way));
                }
            }
        }
        // The key's own slot, else an emptied one, else a never-written one (if allowed),
        // else another key's (only a written one, when fresh slots are not allowed).
        let way = match (mine.or(empty), fresh) {
            (Some(w), _) => w,
            (None, Some(w)) if fresh_ok => w,
            (None, Some(_)) => {
                let turn = turn as usize % WAYS;
                match (0..WAYS)
                    .map(|i| (turn + i) % WAYS)
                    .find(|&w| self.slot(base, w).head[0].load(Ordering::Relaxed) != 0)
                {
                    Some(w) => w,
                    None => return Stored::No,
                }
            }
            (None, None) => turn as usize % WAYS,
        };
        let slot = self.slot(base, way);
        let was_fresh = slot.head[0].load(Ordering::Relaxed) == 0;
        slot.write(|| {
            slot.head[1].store(fp.a, Ordering::Relaxed);
            slot.head[2].store(fp.b, Ordering::Relaxed);
            slot.head[3].store(value.len() as u64, Ordering::Relaxed);
            let whole = value.chunks_exact(8);
            let tail = whole.remainder();
            let mut at = 0;
            for (w, chunk) in slot.value.iter().zip(whole) {
                let mut b = [0u8; 8];
                b.copy_from_slice(chunk);
                w.store(u64::from_le_bytes(b), Ordering::Relaxed);
                at += 1;
            }
            if !tail.is_empty() {
                let mut b = [0u8; 8];
                b[..tail.len()].copy_from_slice(tail);
                slot.value[at].store(u64::from_le_bytes(b), Ordering::Relaxed);
            }
        });
        if was_fresh {
            Stored::Fresh
        } else {
            Stored::Reused
        }
    }

    /// The shard's note that `fp`'s block of `len` bytes lies at `offset` of its DRAM arena,
    /// written at `at_ms` (only the one writer may call this). It takes the key's own slot,
    /// an emptied one, a fresh one (if `fresh_ok`) or another located one, never a slot
    /// holding a value: blocks noted as they are written must not push out the small values
    /// read as bytes. The shard calls it only once the block's bytes are all in place.
    pub fn locate(
        &self,
        fp: Fingerprint,
        offset: u64,
        len: u64,
        at_ms: u64,
        turn: u64,
        fresh_ok: bool,
    ) -> Stored {
        if len & LOCATED != 0 || self.value_max < 16 {
            self.remove(fp);
            return Stored::No;
        }
        let base = self.base(fp);
        let (mut mine, mut empty, mut fresh, mut other) = (None, None, None, None);
        let turn = turn as usize % WAYS;
        for i in 0..WAYS {
            let way = (turn + i) % WAYS;
            let slot = self.slot(base, way);
            if slot.is(fp) {
                mine = Some(way);
                break;
            }
            let written = slot.head[0].load(Ordering::Relaxed) != 0;
            if slot.head[1].load(Ordering::Relaxed) == 0 {
                if written {
                    empty = empty.or(Some(way));
                } else {
                    fresh = fresh.or(Some(way));
                }
            } else if slot.head[3].load(Ordering::Relaxed) & LOCATED != 0 {
                other = other.or(Some(way));
            }
        }
        let way = match (mine.or(empty), fresh, other) {
            (Some(w), _, _) => w,
            (None, Some(w), _) if fresh_ok => w,
            (None, _, Some(w)) => w,
            _ => return Stored::No,
        };
        let slot = self.slot(base, way);
        let was_fresh = slot.head[0].load(Ordering::Relaxed) == 0;
        slot.write(|| {
            slot.head[1].store(fp.a, Ordering::Relaxed);
            slot.head[2].store(fp.b, Ordering::Relaxed);
            slot.head[3].store(len | LOCATED, Ordering::Relaxed);
            slot.value[0].store(offset, Ordering::Relaxed);
            slot.value[1].store(at_ms, Ordering::Relaxed);
        });
        if was_fresh {
            Stored::Fresh
        } else {
            Stored::Reused
        }
    }

    /// Drops `fp`'s value, if mirrored. Only the slot's key is cleared: its bytes stay until
    /// the slot is reused or the mirror is cleared, readable only by holders of the same
    /// bucket's grant, who could read the value before (an overwrite drops and stores at
    /// once, and wiping 4 KiB twice a put cost more than the put's own copy).
    pub fn remove(&self, fp: Fingerprint) {
        for slot in self.set(fp) {
            if slot.is(fp) {
                slot.write(|| {
                    slot.head[1].store(0, Ordering::Relaxed);
                    slot.head[2].store(0, Ordering::Relaxed);
                });
                // A located slot's block may be reused next, written with streaming stores,
                // which x86 lets pass older ordinary stores: the sequence's move is visible
                // before any byte of the reuse.
                fence(Ordering::SeqCst);
                return;
            }
        }
    }

    /// Empties every slot, bytes and all (a retired table: no holder reads its values after
    /// this).
    pub fn clear(&self) {
        let set_words = WAYS * slot_words(self.value_max);
        for set in 0..self.sets {
            for way in 0..WAYS {
                let slot = self.slot(set * set_words, way);
                // A slot ever written has a sequence; what it held may be longer than its
                // last value, so all of it goes.
                if slot.head[0].load(Ordering::Relaxed) != 0 {
                    slot.write(|| {
                        slot.head[1..]
                            .iter()
                            .chain(slot.value)
                            .for_each(|w| w.store(0, Ordering::Relaxed));
                    });
                }
            }
        }
    }
}

/// One slot: its header words (sequence, fingerprint, length) and its value's.
struct Slot<'a> {
    head: &'a [AtomicU64],
    value: &'a [AtomicU64],
}

impl Slot<'_> {
    /// Whether the slot holds `fp`'s value (as of this read: a reader checks it under the
    /// sequence lock).
    fn is(&self, fp: Fingerprint) -> bool {
        self.head[1].load(Ordering::Relaxed) == fp.a && self.head[2].load(Ordering::Relaxed) == fp.b
    }

    /// Changes the slot under its sequence lock.
    fn write(&self, change: impl FnOnce()) {
        let seq = &self.head[0];
        let s = seq.load(Ordering::Relaxed);
        seq.store(s.wrapping_add(1) | 1, Ordering::Relaxed);
        fence(Ordering::Release);
        change();
        seq.store((s | 1).wrapping_add(1), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presence::fingerprint;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    const SECRET: [u8; 32] = [7; 32];

    fn words(slots: usize, value_max: usize) -> Vec<AtomicU64> {
        (0..8 + words_for(slots, value_max))
            .map(|_| AtomicU64::new(0))
            .collect()
    }

    fn mirror(w: &[AtomicU64], slots: usize, value_max: usize) -> Mirror<'_> {
        let m = Mirror::over(w, 8, slots as u64, value_max as u64).unwrap();
        m.announce(w, 8);
        m
    }

    #[test]
    fn values_are_read_back_replaced_and_dropped() {
        let w = words(64, 4096);
        let m = mirror(&w, 64, 4096);
        let named = Mirror::named(&w).unwrap().unwrap();
        let mut out = Vec::new();
        let k = fingerprint(&SECRET, "k");
        assert_eq!(named.read(k, &mut out), Read::Miss);
        for v in [
            &b"hello"[..],
            &[9u8; 4096][..],
            &[][..],
            &b"odd length!"[..],
        ] {
            assert_ne!(m.store(k, v, 0, true), Stored::No);
            assert_eq!(named.read(k, &mut out), Read::Hit(v.len()));
            assert_eq!(out, v);
        }
        // Too large: not mirrored, and the old value is gone.
        assert_eq!(m.store(k, &[1u8; 4097], 0, true), Stored::No);
        assert_eq!(named.read(k, &mut out), Read::Miss);
        assert_eq!(m.store(k, b"again", 0, true), Stored::Reused);
        m.remove(k);
        assert_eq!(named.read(k, &mut out), Read::Miss);
        assert!(out.is_empty());
    }

    #[test]
    fn a_full_set_gives_up_a_slot_and_never_answers_another_keys_value() {
        let w = words(WAYS, 64);
        let m = mirror(&w, WAYS, 64);
        let keys: Vec<String> = (0..20).map(|i| format!("key-{i}")).collect();
        for (i, k) in keys.iter().enumerate() {
            assert_ne!(
                m.store(fingerprint(&SECRET, k), k.as_bytes(), i as u64, true),
                Stored::No
            );
        }
        let mut out = Vec::new();
        let mut hits = 0;
        for k in &keys {
            match m.read(fingerprint(&SECRET, k), &mut out) {
                Read::Hit(_) => {
                    assert_eq!(out, k.as_bytes());
                    hits += 1;
                }
                Read::Miss => {}
                Read::Busy => panic!("no writer is running"),
            }
        }
        assert_eq!(hits, WAYS, "one set of {WAYS} slots holds {WAYS} keys");
        // The last key stored is always there.
        assert_eq!(
            m.read(fingerprint(&SECRET, &keys[19]), &mut out),
            Read::Hit(keys[19].len())
        );
    }

    /// Without fresh slots allowed, a store takes only slots written before: the key's own,
    /// an emptied one, or another key's; with none written, nothing is stored.
    #[test]
    fn a_store_takes_a_fresh_slot_only_when_allowed() {
        let w = words(WAYS, 64);
        let m = mirror(&w, WAYS, 64);
        let fp = |k: &str| fingerprint(&SECRET, k);
        assert_eq!(m.store(fp("a"), b"1", 0, false), Stored::No);
        assert_eq!(m.store(fp("a"), b"1", 0, true), Stored::Fresh);
        assert_eq!(m.store(fp("a"), b"2", 0, false), Stored::Reused);
        // Another key takes the only written slot, never a fresh one.
        assert_eq!(m.store(fp("b"), b"3", 0, false), Stored::Reused);
        let mut out = Vec::new();
        assert_eq!(m.read(fp("a"), &mut out), Read::Miss);
        assert_eq!(m.read(fp("b"), &mut out), Read::Hit(1));
        // An emptied slot is reused before a fresh one.
        m.remove(fp("b"));
        assert_eq!(m.store(fp("c"), b"4", 0, true), Stored::Reused);
        let fresh = (0..WAYS)
            .filter(|&i| m.slot(0, i).head[0].load(Ordering::Relaxed) == 0)
            .count();
        assert_eq!(fresh, WAYS - 1);
    }

    #[test]
    fn clear_empties_every_slot_and_its_bytes() {
        let w = words(16, 64);
        let m = mirror(&w, 16, 64);
        for i in 0..10 {
            m.store(fingerprint(&SECRET, &format!("{i}")), &[0xAB; 60], i, true);
        }
        // A shorter value over a longer one, and a dropped one: their old bytes go too.
        m.store(fingerprint(&SECRET, "0"), b"abc", 0, true);
        m.remove(fingerprint(&SECRET, "1"));
        m.clear();
        let mut out = Vec::new();
        for i in 0..10 {
            assert_eq!(
                m.read(fingerprint(&SECRET, &format!("{i}")), &mut out),
                Read::Miss
            );
        }
        // Nothing of the values is left in the memory a holder maps.
        let set_words = WAYS * slot_words(64);
        let sequences: Vec<usize> = (0..16)
            .map(|i| 8 + (i / WAYS) * set_words + (i % WAYS) * SLOT_HEADER_WORDS)
            .collect();
        for (i, word) in w.iter().enumerate().skip(8) {
            if !sequences.contains(&i) {
                assert_eq!(word.load(Ordering::Relaxed), 0, "word {i}");
            }
        }
    }

    #[test]
    fn bad_shapes_are_refused() {
        let w = words(16, 64);
        assert_eq!(
            Mirror::over(&w, 8, 12, 64).err(),
            Some(MirrorError::Slots(12))
        );
        assert_eq!(
            Mirror::over(&w, 8, 16, 60).err(),
            Some(MirrorError::ValueMax(60))
        );
        assert!(matches!(
            Mirror::over(&w, 9, 16, 64),
            Err(MirrorError::Short { .. })
        ));
        assert!(matches!(
            Mirror::over(&w, u64::MAX, 16, 64),
            Err(MirrorError::Short { .. })
        ));
        // No mirror named: none.
        assert!(Mirror::named(&w).unwrap().is_none());
    }

    /// A mapping of garbage (as a misbehaving or foreign node might give): the header is
    /// checked against the mapping, and a read of any key ends without a panic and never
    /// answers more than a slot holds.
    #[test]
    fn reads_of_garbage_never_panic_nor_overrun() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for round in 0..300 {
            let len = 8 + (next() % 600) as usize;
            let w: Vec<AtomicU64> = (0..len).map(|_| AtomicU64::new(next())).collect();
            // Plausible shapes half the time, so that reads happen.
            if round % 2 == 0 {
                w[W_MIRROR_AT].store(8 + next() % 16, Ordering::Relaxed);
                w[W_MIRROR_SLOTS].store(1 << (2 + next() % 3), Ordering::Relaxed);
                w[W_MIRROR_VALUE_MAX].store(8 * (1 + next() % 8), Ordering::Relaxed);
            }
            if let Ok(Some(m)) = Mirror::named(&w) {
                let mut out = Vec::new();
                for k in 0..16 {
                    let fp = fingerprint(&SECRET, &format!("{k}"));
                    let _ = m.read(fp, &mut out);
                    assert!(out.len() <= m.value_max());
                    if let Some(at) = m.located(fp) {
                        assert!(at.len & LOCATED == 0);
                        let _ = m.still(&at);
                    }
                    // A slot claiming this key with a length past the slot: no hit.
                    let base = m.base(fp);
                    let slot = m.slot(base, 0);
                    slot.head[0].store(0, Ordering::Relaxed);
                    slot.head[1].store(fp.a, Ordering::Relaxed);
                    slot.head[2].store(fp.b, Ordering::Relaxed);
                    slot.head[3].store(u64::MAX, Ordering::Relaxed);
                    assert!(!matches!(m.read(fp, &mut out), Read::Hit(_)));
                    assert!(out.is_empty());
                }
            }
        }
    }

    #[test]
    fn located_slots_are_found_checked_and_never_read_as_values() {
        let w = words(64, 4096);
        let m = mirror(&w, 64, 4096);
        let fp = |k: &str| fingerprint(&SECRET, k);
        let mut out = Vec::new();
        assert_eq!(m.located(fp("k")), None);
        assert_ne!(m.locate(fp("k"), 4096, 1 << 20, 77, 0, true), Stored::No);
        let at = m.located(fp("k")).unwrap();
        assert_eq!((at.offset, at.len, at.at_ms), (4096, 1 << 20, 77));
        assert!(m.still(&at));
        // A reader of values sees no value there.
        assert_eq!(m.read(fp("k"), &mut out), Read::Miss);
        // Each change of the slot fails the check of a copy made before it.
        m.remove(fp("k"));
        assert!(!m.still(&at));
        assert_eq!(m.located(fp("k")), None);
        assert_eq!(m.locate(fp("k"), 8192, 100, 78, 0, true), Stored::Reused);
        let again = m.located(fp("k")).unwrap();
        assert_eq!((again.offset, again.len), (8192, 100));
        assert_ne!(m.store(fp("k"), b"small", 0, true), Stored::No);
        assert!(!m.still(&again));
        assert_eq!(m.located(fp("k")), None);
        assert_eq!(m.read(fp("k"), &mut out), Read::Hit(5));
        m.locate(fp("k"), 0, 10, 79, 0, true);
        let third = m.located(fp("k")).unwrap();
        m.locate(fp("k"), 0, 10, 80, 0, true);
        assert!(!m.still(&third), "a rewrite of the slot counts as a change");
        let fourth = m.located(fp("k")).unwrap();
        m.clear();
        assert!(!m.still(&fourth));
        // A length that would carry the flag itself is refused.
        assert_eq!(m.locate(fp("k"), 0, LOCATED | 1, 0, 0, true), Stored::No);
        // A mirror with room for one word per value holds no locations.
        let narrow = words(WAYS, 8);
        let n = mirror(&narrow, WAYS, 8);
        assert_eq!(n.locate(fp("k"), 0, 10, 0, 0, true), Stored::No);
        assert_eq!(n.located(fp("k")), None);
    }

    /// Locations written as blocks are put never take a slot holding a value (those are
    /// read as bytes, and cost a call when pushed out); they replace other locations.
    #[test]
    fn a_location_never_pushes_out_a_value() {
        let w = words(WAYS, 64);
        let m = mirror(&w, WAYS, 64);
        let fp = |k: &str| fingerprint(&SECRET, k);
        for i in 0..WAYS {
            assert_ne!(m.store(fp(&format!("v{i}")), b"value", 0, true), Stored::No);
        }
        assert_eq!(m.locate(fp("big"), 0, 1 << 20, 1, 0, true), Stored::No);
        let mut out = Vec::new();
        for i in 0..WAYS {
            assert_eq!(m.read(fp(&format!("v{i}")), &mut out), Read::Hit(5));
        }
        // With one slot located, a new location takes that one.
        m.remove(fp("v0"));
        assert_ne!(m.locate(fp("big"), 0, 1 << 20, 1, 0, true), Stored::No);
        assert_eq!(
            m.locate(fp("big2"), 64, 1 << 20, 2, 3, false),
            Stored::Reused
        );
        assert_eq!(m.located(fp("big")), None);
        assert_eq!(m.located(fp("big2")).map(|l| l.offset), Some(64));
        for i in 1..WAYS {
            assert_eq!(m.read(fp(&format!("v{i}")), &mut out), Read::Hit(5));
        }
        // Without fresh slots allowed, a location takes none.
        let w2 = words(WAYS, 64);
        let m2 = mirror(&w2, WAYS, 64);
        assert_eq!(m2.locate(fp("big"), 0, 1, 1, 0, false), Stored::No);
    }

    /// The shard's side of a located slot, as the store keeps it: a block's bytes are
    /// written before its slot names them, and its slot is emptied before its bytes are
    /// reused for another key. Readers on other threads copy through the slot and keep a
    /// copy only when `still` confirms it: every copy kept must be one whole version of
    /// the key asked for.
    #[test]
    fn copies_through_located_slots_are_whole_or_refused() {
        const REGIONS: usize = 6;
        const REGION_WORDS: usize = 64;
        let w: Arc<Vec<AtomicU64>> = Arc::new(words(8, 64));
        mirror(&w, 8, 64);
        let arena: Arc<Vec<AtomicU64>> = Arc::new(
            (0..REGIONS * REGION_WORDS)
                .map(|_| AtomicU64::new(0))
                .collect(),
        );
        let keys: Vec<String> = (0..3).map(|i| format!("k{i}")).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (w, arena, keys, stop) = (w.clone(), arena.clone(), keys.clone(), stop.clone());
                std::thread::spawn(move || {
                    let m = Mirror::named(&w).unwrap().unwrap();
                    let (mut kept, mut refused) = (0u64, 0u64);
                    let mut copy = vec![0u64; REGION_WORDS];
                    while !stop.load(Ordering::Relaxed) {
                        for (i, k) in keys.iter().enumerate() {
                            let Some(at) = m.located(fingerprint(&SECRET, k)) else {
                                continue;
                            };
                            let first = at.offset as usize;
                            for (j, c) in copy.iter_mut().enumerate() {
                                *c = arena[first + j].load(Ordering::Relaxed);
                            }
                            if !m.still(&at) {
                                refused += 1;
                                continue;
                            }
                            // Word 0 names the key, the rest one version's counter.
                            assert_eq!(copy[0], i as u64, "{k}: another key's bytes");
                            assert!(copy[1..].iter().all(|&c| c == copy[1]), "{k}: a torn copy");
                            kept += 1;
                        }
                    }
                    (kept, refused)
                })
            })
            .collect();
        let m = Mirror::named(&w).unwrap().unwrap();
        // Which region each key's current version is in; the others are free.
        let mut home: Vec<Option<usize>> = vec![None; keys.len()];
        for n in 1..=30_000u64 {
            let i = (n as usize) % keys.len();
            let fp = fingerprint(&SECRET, &keys[i]);
            // The old version goes first (its slot emptied), then its region is free.
            if home[i].take().is_some() {
                m.remove(fp);
            }
            if n % 5 == 0 {
                continue; // a remove
            }
            let free = (0..REGIONS).find(|r| !home.contains(&Some(*r))).unwrap();
            let first = free * REGION_WORDS;
            arena[first].store(i as u64, Ordering::Relaxed);
            for j in 1..REGION_WORDS {
                arena[first + j].store(n, Ordering::Relaxed);
            }
            home[i] = Some(free);
            m.locate(fp, first as u64, REGION_WORDS as u64, n, n, true);
        }
        stop.store(true, Ordering::Relaxed);
        let kept: u64 = readers.into_iter().map(|r| r.join().unwrap().0).sum();
        assert!(kept > 0);
    }

    /// A writer overwrites keys with values that name their key and a counter, and drops
    /// them; readers on other threads must only ever see a whole value of the key they
    /// asked for, and per key never an older one than they saw before.
    #[test]
    fn readers_see_whole_values_while_the_writer_changes_them() {
        let w: Arc<Vec<AtomicU64>> = Arc::new(words(8, 256));
        mirror(&w, 8, 256);
        let keys: Vec<String> = (0..6).map(|i| format!("k{i}")).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (w, keys, stop) = (w.clone(), keys.clone(), stop.clone());
                std::thread::spawn(move || {
                    let m = Mirror::named(&w).unwrap().unwrap();
                    let mut last = vec![0u64; keys.len()];
                    let mut out = Vec::new();
                    let mut hits = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        for (i, k) in keys.iter().enumerate() {
                            if let Read::Hit(n) = m.read(fingerprint(&SECRET, k), &mut out) {
                                let text = std::str::from_utf8(&out[..n]).unwrap();
                                let (key, count) = text.split_once('=').unwrap();
                                assert_eq!(key, k);
                                let count: u64 = count.trim_end_matches('.').parse().unwrap();
                                assert!(count >= last[i], "{k}: {count} after {}", last[i]);
                                last[i] = count;
                                hits += 1;
                            }
                        }
                    }
                    hits
                })
            })
            .collect();
        let m = Mirror::named(&w).unwrap().unwrap();
        for n in 1..=20_000u64 {
            let i = (n as usize) % keys.len();
            let fp = fingerprint(&SECRET, &keys[i]);
            if n % 7 == 0 {
                m.remove(fp);
            } else {
                // Lengths vary so a torn read would show.
                let pad = ".".repeat((n % 200) as usize);
                m.store(fp, format!("{}={n}{pad}", keys[i]).as_bytes(), n, true);
            }
        }
        stop.store(true, Ordering::Relaxed);
        let hits: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
        assert!(hits > 0);
    }
}
