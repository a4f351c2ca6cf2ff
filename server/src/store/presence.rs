//! A shard's presence tables ([`yutu_api::presence`]): per bucket, the keys this shard holds,
//! in a sealed memfd that same-host clients map read-only and look up without a call.
//!
//! A table is built when a client first asks for it (`FrameOp::Presence`), from the keys both
//! tiers hold, and kept in step after that: the DRAM index and the NVMe index report every key
//! that comes or goes ([`Presence::changed`]), on the shard's thread, before the operation
//! that changed it answers. So a lookup sees what `exists` on the shard would answer at that
//! moment.
//!
//! # What a holder can learn, and for how long
//! - A grant needs read and list permission on the bucket, checked at the moment of the
//!   grant: a holder learns nothing `exists` and `ListObjects` would not tell it (and only
//!   fingerprints, not names).
//! - The table is sealed (`F_SEAL_FUTURE_WRITE`, size seals, `F_SEAL_SEAL`) before it is
//!   given out: no holder can write it, so no tenant can make another's lookups lie.
//! - The table stops being updated (it is retired; clients then ask the node, which checks
//!   their access again) when the bucket's settings change (ACL, policy, public access
//!   block, ownership, CORS), when the bucket goes, and at the first change after the
//!   earliest expiry among the tokens it was granted to. A holder whose access ended learns
//!   at most the state at that moment.
//!
//! # Bounds
//! Tables of one shard take at most [`BUDGET`] bytes (memory besides `--memory`): a new
//! table that does not fit retires the tables granted longest ago (their clients ask for
//! them again), and a table larger than the budget is not built (its clients ask the node).
//! A table that fills (half its slots, or a key that cannot be placed within
//! [`yutu_api::presence::MAX_PROBE`] slots, as keys chosen to collide could make) is
//! retired, and the next grant builds one twice the size with a new hash key.
//!
//! # Value mirrors
//! A table may carry a mirror of the bucket's small KV values ([`yutu_api::mirror`]) after
//! its slots, in the same memfd: the shard copies a KV block of at most [`MIRROR_VALUE_MAX`]
//! bytes there when it serves it from DRAM to a frame `read` ([`Presence::stored`]; the call
//! a client's get of a small value sends), and drops it when DRAM loses the key or its
//! version ([`Presence::changed`]), before the operation that changed it answers. Writes and
//! batched get-into calls never copy into a mirror: a batch of small puts costs what it did,
//! and what is mirrored is what is read as bytes, the calls whose latency is their cost. A holder may
//! read every mirrored value: the grant's checks (read and list on the whole bucket) are the
//! ones a frame `read` of any key of the bucket passes, and only KV blocks are mirrored, not S3
//! objects with ACLs of their own. A retired table's mirror is emptied (`Mirror::clear`):
//! its holders keep no value they could not read while their access lasted. Mirrors take
//! memory of their own: every table has one (address space), and the slots ever written in
//! a shard's live mirrors (whose pages stay until their table goes) are bounded by
//! `--value-mirror-bytes`; past it a value goes only into a slot written before.
//!
//! # Located blocks
//! A KV block of [`LOCATE_MIN`] bytes or more gets a located slot instead
//! ([`Presence::located`], `yutu_api::mirror`'s located slots): where it lies in the shard's
//! DRAM arena. The shard writes it when it publishes the block (its bytes are all in place by
//! then) and again when it leases it (a fresh time for the client's freshness rule), and
//! empties it before the block's bytes can be reused: DRAM losing the key or its version
//! drops the slot as above, and an eviction that keeps the key present while its bytes go
//! to NVMe (a demotion, whose copy serves it meanwhile) drops the slot alone
//! ([`Presence::unmirror`]). A holder that also has a view of the arena (proof that it
//! could read the node's memory anyway) copies the block itself, without a call. Locations
//! never push out values, and count against the same slots as values.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use memmap2::MmapMut;
use yutu_api::mirror::{self, Mirror, Stored};
use yutu_api::presence::{
    bytes_for, capacity_for, fingerprint, words_for, PresenceError, Table, MAX_CAPACITY,
};

pub use yutu_api::presence::{FLAG_DRAM, FLAG_NVME};

use crate::metrics::ShardMetrics;

/// Most bytes of tables one shard keeps: 8 million slots, about 2 million keys at the quarter
/// full a table is built at.
pub const BUDGET: u64 = 128 << 20;
/// Largest value a mirror holds: a KV block this small costs more to ask for than to copy.
pub const MIRROR_VALUE_MAX: usize = 4096;
/// Smallest KV block a located slot is written for: below it, a batch copies on the node in
/// one system call, and slots are kept for the values read as bytes.
pub const LOCATE_MIN: u64 = 64 << 10;
/// Slots of one mirror: about 17 MB of address space, whose pages are taken only as slots
/// are first written (and those the budget counts).
pub const MIRROR_SLOTS: usize = 4096;
/// Bytes of value mirrors a shard keeps by default (`--value-mirror-bytes`).
pub const MIRROR_BUDGET: u64 = crate::config::DEFAULT_VALUE_MIRROR_BYTES;

/// Bytes of address space one mirror takes.
pub fn mirror_bytes() -> u64 {
    (mirror::words_for(MIRROR_SLOTS, MIRROR_VALUE_MAX) * 8) as u64
}

/// Bytes one slot takes once written.
fn slot_bytes() -> u64 {
    mirror_bytes() / MIRROR_SLOTS as u64
}

/// A shard's tables, by bucket.
pub struct Presence {
    enabled: bool,
    budget: u64,
    used: u64,
    tables: HashMap<String, Shared>,
    /// Bytes of value mirrors a shard may keep, and the slots ever written in its live
    /// mirrors (what they keep: a written slot's pages stay until its table goes).
    mirror_budget: u64,
    mirror_slots: u64,
    /// Picks the slot a full mirror set gives up.
    turn: u64,
    /// The capacity the next table of a bucket starts at, after one filled.
    grow: HashMap<String, usize>,
    pub stats: PresenceStats,
    metrics: Arc<ShardMetrics>,
}

/// What the tables did, for `/metrics`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PresenceStats {
    pub grants: u64,
    pub builds: u64,
    pub retired: u64,
    pub refused: u64,
    /// Values copied into mirrors.
    pub mirrored: u64,
    /// Blocks noted in located slots.
    pub located: u64,
}

/// One live table.
struct Shared {
    file: File,
    map: MmapMut,
    capacity: usize,
    secret: [u8; 32],
    /// Unix milliseconds after which the table is retired at its next change.
    retire_at: Option<u64>,
    /// Changes are inside one sequence-lock write (`Presence::hold`).
    held: bool,
    /// The last grant of the table: the table granted longest ago goes first when the
    /// budget is short.
    granted: Instant,
    /// Slots of its value mirror ever written.
    touched: u64,
}

impl Shared {
    /// The table's words.
    fn words(&self) -> &[AtomicU64] {
        // SAFETY: the mapping is page-aligned (so aligned for u64), `bytes_for(capacity)` long
        // (`words_for` u64s), lives as long as `self`, and every access to it, here and in
        // every process that maps it, is atomic.
        unsafe {
            std::slice::from_raw_parts(
                self.map.as_ptr().cast::<AtomicU64>(),
                words_for(self.capacity),
            )
        }
    }

    /// The table (`None` cannot happen: the mapping was made for its capacity).
    fn table(&self) -> Option<Table<'_>> {
        Table::built(self.words(), self.capacity)
    }

    /// The whole mapping's words, the mirror's included.
    fn all_words(&self) -> &[AtomicU64] {
        // SAFETY: as in `words`, over the whole mapping (a whole number of u64s: both parts
        // are).
        unsafe {
            std::slice::from_raw_parts(self.map.as_ptr().cast::<AtomicU64>(), self.map.len() / 8)
        }
    }

    /// The table's value mirror, if its header names one.
    fn mirror(&self) -> Option<Mirror<'_>> {
        Mirror::named(self.all_words()).ok().flatten()
    }
}

/// Walks a bucket's keys: calls its argument with each key and a tier that holds it.
pub type KeyWalk<'a> = dyn Fn(&mut dyn FnMut(&str, u64)) + 'a;

/// A table handed to a client: a descriptor of its memfd, and what to map it with.
pub struct Grant {
    pub fd: OwnedFd,
    pub bytes: u64,
    pub secret: [u8; 32],
}

/// Why no table is given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PresenceRefusal {
    #[error("presence tables are off on this node")]
    Off,
    #[error("the bucket's presence table would pass the shard's {0} bytes for tables")]
    Budget(u64),
    #[error("cannot make a presence table: {0}")]
    System(String),
}

impl Presence {
    pub fn new(enabled: bool, metrics: Arc<ShardMetrics>) -> Presence {
        Presence {
            metrics,
            enabled,
            budget: BUDGET,
            used: 0,
            tables: HashMap::new(),
            mirror_budget: MIRROR_BUDGET,
            mirror_slots: 0,
            turn: 0,
            grow: HashMap::new(),
            stats: PresenceStats::default(),
        }
    }

    fn publish(&self) {
        let m = &self.metrics;
        m.presence_tables.set(self.tables.len() as u64);
        m.presence_bytes.set(self.used);
        m.presence_grants.set(self.stats.grants);
        m.presence_retired.set(self.stats.retired);
        m.mirror_bytes.set(self.mirror_slots * slot_bytes());
        m.mirrored_values.set(self.stats.mirrored);
    }

    /// Bytes of value mirrors this shard may keep (`--value-mirror-bytes`; 0: tables built
    /// from now on have none). Counted in slots ever written: a store needing a slot never
    /// written is refused past it (written slots are reused).
    pub fn set_mirror_budget(&mut self, bytes: u64) {
        self.mirror_budget = bytes;
    }

    /// Turns grants on or off (`--no-presence-tables`); tables given out stay until retired.
    pub fn set_enabled(&mut self, enabled: bool) {
        self.enabled = enabled;
    }

    /// Tables live now, and their bytes.
    pub fn usage(&self) -> (usize, u64) {
        (self.tables.len(), self.used)
    }

    /// A tier (`flag`) now holds (`on`) or no longer holds `bucket/key`.
    pub fn changed(&mut self, bucket: &str, key: &str, flag: u64, on: bool) {
        self.apply(bucket, key, flag, on, flag == FLAG_DRAM && !on);
    }

    /// DRAM holds a new version of `bucket/key` in place of the one it held (an overwrite):
    /// its mirror slot goes and the table shows it in DRAM, what `changed(.., false)` then
    /// `changed(.., true)` do within one hold, with one keyed hash of the key, not two.
    pub fn rewritten(&mut self, bucket: &str, key: &str) {
        self.apply(bucket, key, FLAG_DRAM, true, true);
    }

    /// Sets or clears `flag` of `bucket/key` in the bucket's table, first dropping the key's
    /// mirror slot when `drop_mirror`.
    fn apply(&mut self, bucket: &str, key: &str, flag: u64, on: bool, drop_mirror: bool) {
        if self.tables.is_empty() {
            return;
        }
        let Some(shared) = self.tables.get(bucket) else {
            return;
        };
        if shared.retire_at.is_some_and(|at| now_ms() > at) {
            self.retire(bucket);
            return;
        }
        let Some(table) = shared.table() else {
            return;
        };
        let fp = fingerprint(&shared.secret, key);
        if drop_mirror {
            if let Some(m) = shared.mirror() {
                m.remove(fp);
            }
        }
        let done = if shared.held {
            table.set_unlocked(fp, flag, on)
        } else {
            table.set(fp, flag, on)
        };
        if let Err(PresenceError::Full) = done {
            let next = (shared.capacity * 2).min(MAX_CAPACITY);
            tracing::info!(
                bucket,
                capacity = shared.capacity,
                next,
                "a presence table filled; the next grant builds a larger one"
            );
            self.grow.insert(bucket.to_string(), next);
            self.retire(bucket);
        }
    }

    /// `bucket/key`, a KV block DRAM holds, has `value`: copied into the bucket's mirror
    /// (dropped from it when too large). Only with the value DRAM holds at this moment.
    pub fn stored(&mut self, bucket: &str, key: &str, value: &[u8]) {
        let fresh_ok = (self.mirror_slots + 1) * slot_bytes() <= self.mirror_budget;
        let Some(shared) = self.tables.get_mut(bucket) else {
            return;
        };
        if shared.retire_at.is_some_and(|at| now_ms() > at) {
            self.retire(bucket);
            return;
        }
        self.turn = self.turn.wrapping_add(1);
        let done = match shared.mirror() {
            Some(m) => m.store(fingerprint(&shared.secret, key), value, self.turn, fresh_ok),
            None => Stored::No,
        };
        if done == Stored::Fresh {
            shared.touched += 1;
            self.mirror_slots += 1;
        }
        if done != Stored::No {
            self.stats.mirrored += 1;
            self.metrics.mirrored_values.set(self.stats.mirrored);
            self.metrics
                .mirror_bytes
                .set(self.mirror_slots * slot_bytes());
        }
    }

    /// `bucket/key`, a KV block DRAM holds whole, lies at `offset` of the shard's arena and
    /// is `len` bytes long: noted in a located slot of the bucket's mirror. Only once every
    /// byte of it is in place, and only with the version DRAM holds at this moment.
    pub fn located(&mut self, bucket: &str, key: &str, offset: u64, len: u64) {
        if self.tables.is_empty() || len < LOCATE_MIN {
            return;
        }
        let fresh_ok = (self.mirror_slots + 1) * slot_bytes() <= self.mirror_budget;
        let Some(shared) = self.tables.get_mut(bucket) else {
            return;
        };
        if shared.retire_at.is_some_and(|at| now_ms() > at) {
            self.retire(bucket);
            return;
        }
        self.turn = self.turn.wrapping_add(1);
        let done = match shared.mirror() {
            Some(m) => m.locate(
                fingerprint(&shared.secret, key),
                offset,
                len,
                now_ms(),
                self.turn,
                fresh_ok,
            ),
            None => Stored::No,
        };
        if done == Stored::Fresh {
            shared.touched += 1;
            self.mirror_slots += 1;
            self.metrics
                .mirror_bytes
                .set(self.mirror_slots * slot_bytes());
        }
        if done != Stored::No {
            self.stats.located += 1;
            self.metrics.located_blocks.set(self.stats.located);
        }
    }

    /// Empties `bucket/key`'s mirror slot, value or location, leaving the table's flags as
    /// they are: its bytes are about to be reused while the key stays present.
    pub fn unmirror(&mut self, bucket: &str, key: &str) {
        if self.tables.is_empty() {
            return;
        }
        if let Some(shared) = self.tables.get(bucket) {
            if let Some(m) = shared.mirror() {
                m.remove(fingerprint(&shared.secret, key));
            }
        }
    }

    /// Changes to `bucket`'s table are one write until [`Presence::release`]: readers wait
    /// for (or give up on) the table meanwhile, so a replaced key never looks absent.
    pub fn hold(&mut self, bucket: &str) {
        if let Some(s) = self.tables.get_mut(bucket) {
            if let (false, Some(t)) = (s.held, s.table()) {
                t.begin_write();
                s.held = true;
            }
        }
    }

    pub fn release(&mut self, bucket: &str) {
        if let Some(s) = self.tables.get_mut(bucket) {
            if let (true, Some(t)) = (s.held, s.table()) {
                t.end_write();
                s.held = false;
            }
        }
    }

    /// Stops `bucket`'s table: its holders ask the node from now on.
    pub fn retire(&mut self, bucket: &str) {
        if let Some(s) = self.tables.remove(bucket) {
            if let Some(table) = s.table() {
                if s.held {
                    table.end_write();
                }
                table.retire();
            }
            if let Some(m) = s.mirror() {
                m.clear();
            }
            self.mirror_slots -= s.touched;
            self.used -= bytes_for(s.capacity) as u64;
            self.stats.retired += 1;
            self.publish();
        }
    }

    /// A table of `bucket` for a caller whose access ends at `valid_until_ms` (`None`: no
    /// end): the live one, or one built from `keys`, which calls its argument with each key
    /// and a tier that holds it (a key in both tiers may come twice, once per tier). `keys`
    /// runs only when a table is built, on the shard's thread: about 0.1 µs a key, borrowed,
    /// not copied.
    pub fn grant(
        &mut self,
        bucket: &str,
        valid_until_ms: Option<u64>,
        keys: &KeyWalk<'_>,
    ) -> Result<Grant, PresenceRefusal> {
        if !self.enabled {
            return Err(PresenceRefusal::Off);
        }
        if self
            .tables
            .get(bucket)
            .and_then(|s| s.retire_at)
            .is_some_and(|at| now_ms() > at)
        {
            self.retire(bucket);
        }
        if !self.tables.contains_key(bucket) {
            let built = self.build(bucket, keys);
            if built.is_err() {
                self.stats.refused += 1;
            }
            self.tables.insert(bucket.to_string(), built?);
        }
        let Some(shared) = self.tables.get_mut(bucket) else {
            return Err(PresenceRefusal::System("the table went".into()));
        };
        shared.granted = Instant::now();
        shared.retire_at = match (shared.retire_at, valid_until_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let fd = read_only(&shared.file)
            .or_else(|_| shared.file.try_clone().map(OwnedFd::from))
            .map_err(|e| PresenceRefusal::System(e.to_string()))?;
        let grant = Grant {
            fd,
            bytes: shared.map.len() as u64,
            secret: shared.secret,
        };
        self.stats.grants += 1;
        self.publish();
        Ok(grant)
    }

    fn build(&mut self, bucket: &str, keys: &KeyWalk<'_>) -> Result<Shared, PresenceRefusal> {
        let start = self.grow.get(bucket).copied().unwrap_or(0);
        let mut count = 0usize;
        keys(&mut |_, _| count += 1);
        let mut capacity = capacity_for(count).max(start);
        loop {
            let bytes = bytes_for(capacity) as u64;
            if bytes > self.budget {
                return Err(PresenceRefusal::Budget(self.budget));
            }
            // Room is made by retiring the tables granted longest ago (their clients, if
            // any are still looking, ask for them again).
            while self.used + bytes > self.budget {
                let oldest = self
                    .tables
                    .iter()
                    .min_by_key(|(_, s)| s.granted)
                    .map(|(b, _)| b.clone());
                match oldest {
                    Some(b) => self.retire(&b),
                    None => return Err(PresenceRefusal::Budget(self.budget)),
                }
            }
            let shared = new_table(capacity, self.mirror_budget > 0)?;
            let Some(table) = shared.table() else {
                return Err(PresenceRefusal::System("a table of a bad size".into()));
            };
            let mut placed = Ok(());
            keys(&mut |key, flag| {
                if placed.is_ok() {
                    placed = table.set_unlocked(fingerprint(&shared.secret, key), flag, true);
                }
            });
            match placed {
                Ok(()) => {
                    seal(&shared.file)?;
                    self.used += bytes;
                    self.stats.builds += 1;
                    self.grow.remove(bucket);
                    return Ok(shared);
                }
                Err(_) if capacity < MAX_CAPACITY => capacity *= 2,
                Err(e) => return Err(PresenceRefusal::System(e.to_string())),
            }
        }
    }
}

/// A zeroed, initialised table of `capacity` slots (and, if `mirrored`, a value mirror after
/// them) in a new memfd, mapped for writing, with a new random hash key.
fn new_table(capacity: usize, mirrored: bool) -> Result<Shared, PresenceRefusal> {
    let sys = |what: &str, e: std::io::Error| PresenceRefusal::System(format!("{what}: {e}"));
    // SAFETY: a NUL-terminated name and valid flags; the result is checked.
    let fd = unsafe {
        libc::memfd_create(
            c"yutu-presence".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if fd < 0 {
        return Err(sys("memfd_create", std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` is a new descriptor that nothing else owns.
    let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let mirror_at = words_for(capacity);
    let bytes = bytes_for(capacity) as u64 + if mirrored { mirror_bytes() } else { 0 };
    file.set_len(bytes).map_err(|e| sys("ftruncate", e))?;
    // SAFETY: the memfd is this process's own and not yet shared; its size is fixed from
    // here on (sealed before it is given out), so the mapping cannot lose its pages.
    let map = unsafe { MmapMut::map_mut(&file) }.map_err(|e| sys("mmap", e))?;
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret).map_err(|e| PresenceRefusal::System(e.to_string()))?;
    let shared = Shared {
        file,
        map,
        capacity,
        secret,
        retire_at: None,
        held: false,
        granted: Instant::now(),
        touched: 0,
    };
    Table::init(shared.words(), capacity).map_err(|e| PresenceRefusal::System(e.to_string()))?;
    if mirrored {
        let words = shared.all_words();
        let m = Mirror::over(
            words,
            mirror_at as u64,
            MIRROR_SLOTS as u64,
            MIRROR_VALUE_MAX as u64,
        )
        .map_err(|e| PresenceRefusal::System(e.to_string()))?;
        m.announce(words, mirror_at as u64);
    }
    Ok(shared)
}

/// A read-only descriptor of the memfd (a new open file description, through `/proc`): the
/// seals already refuse writes through any descriptor; this refuses them a second way.
fn read_only(file: &File) -> std::io::Result<OwnedFd> {
    let path = format!("/proc/self/fd/{}", file.as_raw_fd());
    let f = std::fs::OpenOptions::new().read(true).open(path)?;
    Ok(OwnedFd::from(f))
}

/// Seals the memfd: no size change, no write through any mapping made from now on (the
/// node's own, made before, stays writable), and no seal removed.
fn seal(file: &File) -> Result<(), PresenceRefusal> {
    let seals =
        libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SEAL;
    // SAFETY: fcntl on a descriptor we own, with an int argument.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
        return Err(PresenceRefusal::System(format!(
            "sealing the table: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use yutu_api::presence::Found;

    /// Each key with its tier, as the tiers report them.
    type Each<'a> = dyn FnMut(&str, u64) + 'a;

    /// No keys.
    fn none(_: &mut Each<'_>) {}
    const NONE: fn(&mut Each<'_>) = none;

    /// The keys of `keys`, each with its tier.
    fn list(keys: Vec<(&'static str, u64)>) -> impl Fn(&mut Each<'_>) {
        move |f| keys.iter().for_each(|(k, t)| f(k, *t))
    }

    /// A client's view: the granted descriptor mapped read-only.
    fn lookup(g: &Grant, key: &str) -> Found {
        let file = File::from(g.fd.try_clone().unwrap());
        // SAFETY: test mapping of a sealed memfd.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        assert_eq!(map.len() as u64, g.bytes);
        // SAFETY: page-aligned, read only through atomics.
        let words =
            unsafe { std::slice::from_raw_parts(map.as_ptr().cast::<AtomicU64>(), map.len() / 8) };
        Table::open(words)
            .unwrap()
            .lookup(fingerprint(&g.secret, key))
    }

    #[test]
    fn a_table_is_built_from_both_tiers_and_kept_in_step() {
        let mut p = Presence::new(true, Arc::default());
        let g = p
            .grant(
                "b",
                None,
                &list(vec![("dram", FLAG_DRAM), ("nvme", FLAG_NVME)]),
            )
            .unwrap();
        assert_eq!(lookup(&g, "dram"), Found::Present);
        assert_eq!(lookup(&g, "nvme"), Found::Present);
        assert_eq!(lookup(&g, "other"), Found::Absent);
        p.changed("b", "other", FLAG_DRAM, true);
        p.changed("b", "dram", FLAG_DRAM, false);
        p.changed("other-bucket", "x", FLAG_DRAM, true);
        assert_eq!(lookup(&g, "other"), Found::Present);
        assert_eq!(lookup(&g, "dram"), Found::Absent);
        // A second grant shares the table; keys are not enumerated again.
        let g2 = p.grant("b", None, &|_| panic!("built again")).unwrap();
        assert_eq!(g2.secret, g.secret);
        assert_eq!(p.stats.builds, 1);
        assert_eq!(p.stats.grants, 2);
        p.retire("b");
        assert_eq!(lookup(&g, "other"), Found::Retired);
        assert_eq!(p.usage(), (0, 0));
    }

    #[test]
    fn the_granted_descriptor_cannot_write_the_table() {
        let mut p = Presence::new(true, Arc::default());
        let g = p.grant("b", None, &NONE).unwrap();
        let file = File::from(g.fd.try_clone().unwrap());
        // SAFETY: a mapping attempt that must fail.
        let writable = unsafe { MmapMut::map_mut(&file) };
        assert!(writable.is_err(), "a shared writable mapping was allowed");
        use std::io::Write;
        assert!((&file).write_all(b"x").is_err());
        assert!(file.set_len(0).is_err());
        // SAFETY: fallocate on a descriptor we own; it must be refused.
        let punched = unsafe {
            libc::fallocate(
                file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                0,
                4096,
            )
        };
        assert!(punched < 0, "a hole was punched in the table");
        // A read-only mapping cannot be made writable afterwards either.
        // SAFETY: a read-only test mapping of the sealed memfd.
        let ro = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        // SAFETY: mprotect on a live mapping of ours; it must be refused.
        let upgraded = unsafe {
            libc::mprotect(
                ro.as_ptr() as *mut libc::c_void,
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
            )
        };
        assert!(upgraded < 0, "a read-only mapping was made writable");
        // Nor can a descriptor open for writing (the node's own memfd, sealed).
        let writer = p.tables.get("b").unwrap().file.try_clone().unwrap();
        // SAFETY: a mapping attempt that must fail.
        assert!(unsafe { MmapMut::map_mut(&writer) }.is_err());
        assert_eq!(lookup(&g, "k"), Found::Absent);
    }

    #[test]
    fn a_table_retires_at_its_holders_expiry_and_when_full() {
        let mut p = Presence::new(true, Arc::default());
        let g = p.grant("b", Some(now_ms() - 1), &NONE).unwrap();
        p.changed("b", "k", FLAG_DRAM, true);
        assert_eq!(lookup(&g, "k"), Found::Retired, "expired before the change");
        let g = p.grant("b", None, &NONE).unwrap();
        assert_eq!(lookup(&g, "k"), Found::Absent, "built anew");
        let cap = yutu_api::presence::MIN_CAPACITY;
        for i in 0..cap / 2 {
            p.changed("b", &format!("k{i}"), FLAG_DRAM, true);
        }
        assert_ne!(lookup(&g, "k0"), Found::Retired);
        p.changed("b", "one-more", FLAG_DRAM, true);
        assert_eq!(lookup(&g, "k0"), Found::Retired);
        let bigger = p
            .grant("b", None, &|f| {
                (0..cap / 2 + 1).for_each(|i| f(&format!("k{i}"), FLAG_DRAM));
            })
            .unwrap();
        assert!(bigger.bytes > g.bytes);
        assert_eq!(lookup(&bigger, "k0"), Found::Present);
        assert_eq!(
            Presence::new(false, Arc::default())
                .grant("b", None, &NONE)
                .err(),
            Some(PresenceRefusal::Off)
        );
    }

    #[test]
    fn the_budget_bounds_the_tables_and_the_longest_ungranted_goes_first() {
        let mut p = Presence::new(true, Arc::default());
        let one = bytes_for(yutu_api::presence::MIN_CAPACITY) as u64;
        p.budget = 2 * one;
        let a = p.grant("a", None, &NONE).unwrap();
        let b = p.grant("b", None, &NONE).unwrap();
        p.grant("a", None, &|_| panic!("a is live")).unwrap();
        // No room for c: b, granted longest ago, is retired for it.
        let c = p.grant("c", None, &NONE).unwrap();
        assert_eq!(lookup(&b, "k"), Found::Retired);
        assert_eq!(lookup(&a, "k"), Found::Absent);
        assert_eq!(lookup(&c, "k"), Found::Absent);
        assert_eq!(p.usage(), (2, 2 * one));
        // A table larger than the whole budget is refused, and nothing is retired for it.
        assert!(matches!(
            p.grant("big", None, &|f| (0..1000)
                .for_each(|i| f(&format!("k{i}"), FLAG_DRAM))),
            Err(PresenceRefusal::Budget(_))
        ));
        assert_eq!(p.stats.refused, 1);
        assert_eq!(p.usage(), (2, 2 * one));
    }

    /// A client's read of `key` from the granted table's mirror.
    fn mirrored(g: &Grant, key: &str) -> Option<Vec<u8>> {
        let file = File::from(g.fd.try_clone().unwrap());
        // SAFETY: test mapping of a sealed memfd.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        // SAFETY: page-aligned, read only through atomics.
        let words =
            unsafe { std::slice::from_raw_parts(map.as_ptr().cast::<AtomicU64>(), map.len() / 8) };
        let m = Mirror::named(words).unwrap()?;
        let mut out = Vec::new();
        match m.read(fingerprint(&g.secret, key), &mut out) {
            mirror::Read::Hit(_) => Some(out),
            _ => None,
        }
    }

    /// Values stored are read back through the grant until DRAM loses them; a retired
    /// table's mirror is emptied to the last byte; the slots ever written are bounded by the
    /// shard's budget (and with none, tables have no mirror).
    #[test]
    fn mirrors_follow_dram_are_wiped_when_retired_and_bounded() {
        let mut p = Presence::new(true, Arc::default());
        let g = p.grant("b", None, &list(vec![("k", FLAG_DRAM)])).unwrap();
        assert_eq!(
            g.bytes,
            bytes_for(yutu_api::presence::MIN_CAPACITY) as u64 + mirror_bytes()
        );
        assert_eq!(mirrored(&g, "k"), None, "nothing is mirrored until stored");
        p.stored("b", "k", b"value");
        assert_eq!(mirrored(&g, "k").as_deref(), Some(&b"value"[..]));
        // Another tier's change leaves it; DRAM losing the key drops it.
        p.changed("b", "k", FLAG_NVME, true);
        assert_eq!(mirrored(&g, "k").as_deref(), Some(&b"value"[..]));
        p.changed("b", "k", FLAG_DRAM, false);
        assert_eq!(mirrored(&g, "k"), None);
        // An overwrite in place drops it too, and the key is still shown in DRAM: also one
        // the table did not show before (the pair of changes it stands for would add it).
        p.changed("b", "k", FLAG_DRAM, true);
        p.stored("b", "k", b"value");
        p.rewritten("b", "k");
        assert_eq!(mirrored(&g, "k"), None);
        assert_eq!(lookup(&g, "k"), Found::Present);
        p.rewritten("b", "unseen");
        assert_eq!(lookup(&g, "unseen"), Found::Present);
        // Too large: not mirrored.
        p.stored("b", "big", &vec![1u8; MIRROR_VALUE_MAX + 1]);
        assert_eq!(mirrored(&g, "big"), None);

        p.stored("b", "k", &[0xEE; 4000]);
        p.retire("b");
        let file = File::from(g.fd.try_clone().unwrap());
        // SAFETY: test mapping of a sealed memfd.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        let mirror_at = bytes_for(yutu_api::presence::MIN_CAPACITY);
        assert!(
            !map[mirror_at..].windows(2).any(|w| w == [0xEE, 0xEE]),
            "a retired mirror keeps no value bytes"
        );
        assert_eq!(p.mirror_slots, 0, "a retired mirror's slots are given back");

        // Room for two written slots: a third key finds only fresh slots and is not stored
        // (unless its set has a written slot), while the written ones are reused.
        p.set_mirror_budget(2 * slot_bytes());
        let a = p.grant("a", None, &NONE).unwrap();
        p.stored("a", "k1", b"1");
        p.stored("a", "k2", b"2");
        assert_eq!(p.mirror_slots, 2);
        let stored: Vec<bool> = (3..40)
            .map(|i| {
                let k = format!("k{i}");
                p.stored("a", &k, b"x");
                mirrored(&a, &k).is_some()
            })
            .collect();
        assert_eq!(p.mirror_slots, 2, "no slot past the budget");
        assert!(stored.iter().filter(|s| **s).count() <= 2);
        p.stored("a", "k1", b"again");
        assert_eq!(p.mirror_slots, 2);
        p.retire("a");
        assert_eq!(p.mirror_slots, 0);
        // No budget: tables have no mirror at all.
        p.set_mirror_budget(0);
        let d = p.grant("d", None, &NONE).unwrap();
        assert_eq!(d.bytes, bytes_for(yutu_api::presence::MIN_CAPACITY) as u64);
        p.stored("d", "k", b"x");
        assert_eq!(mirrored(&d, "k"), None);
        assert_eq!(lookup(&d, "k"), Found::Absent);
    }
}
