//! `exists` answered from the node's presence tables ([`yutu_api::presence`]): per bucket and
//! shard, a table the node keeps and this process maps read-only, so a lookup costs a hash
//! and a few loads instead of a call.
//!
//! A table comes from a grant (`FrameOp::Presence`, which checks the caller's read and list
//! permission) the first time a bucket's key on a shard is asked about. A key the table
//! cannot answer (retired, busy, past the grant's validity, or no grant) is asked of the node
//! as before, and the node's answer (or error) is the answer. A bucket whose grant is refused
//! is not asked again for [`REFUSED_FOR`]; a retired table is replaced at the next lookup.
//!
//! A table may carry the bucket's value mirror ([`yutu_api::mirror`]): small KV blocks the
//! shard copies next to its slots. A get of such a key ([`Tables::read`]) is then a copy out
//! of this process's own mapping; a key the mirror does not hold is asked of the node.
//!
//! A large block's slot may instead say where the block lies in its shard's arena (a located
//! slot): with a view of that arena (`arena.rs`) a get of it is a copy out of the view and a
//! check that the slot did not change meanwhile ([`Location`], `NodeClient::copy_located`),
//! no call either. A slot older than [`LOCATED_FRESH_MS`] is not used: the node is asked,
//! which sees the read (the block moves to the front of its eviction order) and writes the
//! slot afresh.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use memmap2::Mmap;
use yutu_api::kv_frame::PresenceGrant;
use yutu_api::mirror::{Located, Mirror, Read, LOCATED_FRESH_MS};
use yutu_api::presence::{fingerprint, Found, Table};

use super::frames::Frames;
use super::KvError;

/// How long a bucket whose grant was refused is asked of the node only.
pub const REFUSED_FOR: Duration = Duration::from_secs(10);
/// Most tables (bucket and shard pairs) one client keeps mapped; past it, new buckets are
/// asked of the node.
pub const MAX_TABLES: usize = 1024;
/// Largest table mapped (the node's tables are far smaller).
const MAX_TABLE_BYTES: u64 = 2 << 30;

/// Where a large block lay, read from its located slot: the table it was read from (which
/// [`Location::still`] checks again after the copy), the shard whose arena holds it, and
/// the place.
pub struct Location {
    /// The tables it was read from ([`Tables::id`]): a location is copied only by the
    /// client whose views belong to the same node.
    owner: u64,
    table: Arc<Mapped>,
    pub(super) shard: usize,
    pub(super) at: Located,
}

impl Location {
    /// The block's length in bytes.
    pub fn len(&self) -> u64 {
        self.at.len
    }

    /// Whether the block is empty (a located slot never names an empty one).
    pub fn is_empty(&self) -> bool {
        self.at.len == 0
    }

    /// Whether the slot is unchanged since it was read (and the table still live): a copy
    /// of the block made in between stands.
    pub(super) fn still(&self) -> bool {
        let Some(t) = self.table.table() else {
            return false;
        };
        if t.is_retired() {
            return false;
        }
        match Mirror::named(self.table.words()) {
            Ok(Some(m)) => m.still(&self.at),
            _ => false,
        }
    }
}

/// The tables of one node, by bucket, one slot per shard.
pub(super) struct Tables {
    /// Unique in this process, for [`Location`]s to name their tables by.
    id: u64,
    shards: usize,
    by_bucket: Mutex<HashMap<String, Vec<Slot>>>,
    /// Values read from mirrors.
    mirror_hits: AtomicU64,
    /// Blocks read through located slots.
    located_hits: AtomicU64,
}

#[derive(Clone, Default)]
enum Slot {
    /// Not asked for yet (or retired: ask again).
    #[default]
    None,
    Mapped(Arc<Mapped>),
    Refused(Instant),
}

/// A mapped table and what it was granted with.
struct Mapped {
    map: Mmap,
    secret: [u8; 32],
    valid_until_ms: Option<u64>,
}

impl Mapped {
    fn open(grant: PresenceGrant, fd: OwnedFd) -> Result<Mapped, KvError> {
        let bad = |what: String| KvError::InvalidResponse(format!("presence table: {what}"));
        let secret: [u8; 32] = grant
            .secret
            .as_slice()
            .try_into()
            .map_err(|_| bad(format!("a key of {} bytes", grant.secret.len())))?;
        let file = File::from(fd);
        let len = file.metadata().map_err(|e| bad(e.to_string()))?.len();
        if len != grant.bytes || len > MAX_TABLE_BYTES || len % 8 != 0 {
            return Err(bad(format!("{len} bytes, the grant says {}", grant.bytes)));
        }
        // SAFETY: a read-only shared mapping of a memfd the node sealed against size changes
        // (`F_SEAL_SHRINK`), so its pages stay; the node writes it concurrently, which is why
        // it is only ever read through atomics (`words`).
        let map = unsafe { Mmap::map(&file) }.map_err(|e| bad(e.to_string()))?;
        let mapped = Mapped {
            map,
            secret,
            valid_until_ms: grant.valid_until_ms,
        };
        Table::open(mapped.words()).map_err(|e| bad(e.to_string()))?;
        Ok(mapped)
    }

    fn words(&self) -> &[AtomicU64] {
        // SAFETY: the mapping is page-aligned, a whole number of u64s long (checked in
        // `open`), lives as long as `self`, and is only read, atomically (atomic loads of
        // lock-free widths are allowed on read-only memory).
        unsafe {
            std::slice::from_raw_parts(self.map.as_ptr().cast::<AtomicU64>(), self.map.len() / 8)
        }
    }

    /// `key`'s value from the table's mirror, into `out`: `Some(true)` when it was there,
    /// `Some(false)` when not (ask the node), `None` when the table is retired (ask the
    /// node, and for a new table).
    fn read(&self, key: &str, out: &mut Vec<u8>) -> Option<bool> {
        if self.table()?.is_retired() {
            return None;
        }
        let Ok(Some(mirror)) = Mirror::named(self.words()) else {
            return Some(false);
        };
        Some(matches!(
            mirror.read(fingerprint(&self.secret, key), out),
            Read::Hit(_)
        ))
    }

    /// Where `key`'s block lies, when a located slot of the table's mirror says so and was
    /// written less than [`LOCATED_FRESH_MS`] ago; `None` otherwise (and when retired).
    fn located(&self, key: &str) -> Option<Located> {
        if self.table()?.is_retired() {
            return None;
        }
        let mirror = Mirror::named(self.words()).ok()??;
        let at = mirror.located(fingerprint(&self.secret, key))?;
        // A slot written later than now (another clock) or long ago: ask the node.
        let age = now_ms().checked_sub(at.at_ms)?;
        (age < LOCATED_FRESH_MS).then_some(at)
    }

    /// The table, while its grant is valid and its header is one (`None`: treat it as
    /// retired).
    fn table(&self) -> Option<Table<'_>> {
        if self.valid_until_ms.is_some_and(|until| now_ms() > until) {
            return None;
        }
        Table::open(self.words()).ok()
    }

    fn lookup(&self, key: &str) -> Found {
        match self.table() {
            Some(t) => t.lookup(fingerprint(&self.secret, key)),
            None => Found::Retired,
        }
    }
}

impl Tables {
    pub(super) fn new(shards: usize) -> Tables {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Tables {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            shards,
            by_bucket: Mutex::new(HashMap::new()),
            mirror_hits: AtomicU64::new(0),
            located_hits: AtomicU64::new(0),
        }
    }

    /// `key`'s value, when the mirror of its shard's table holds it (`out` holds it then):
    /// `false` means ask the node.
    pub(super) fn read(&self, frames: &Frames, bucket: &str, key: &str, out: &mut Vec<u8>) -> bool {
        let shard = yutu_api::placement::shard_for(bucket, key, self.shards);
        let Some(t) = self.table(frames, bucket, shard) else {
            return false;
        };
        match t.read(key, out) {
            Some(true) => {
                self.mirror_hits.fetch_add(1, Ordering::Relaxed);
                true
            }
            Some(false) => false,
            None => {
                // Retired: the next call asks for the table again.
                self.forget(bucket, shard, &t, None);
                false
            }
        }
    }

    /// Where `key`'s block lies, when its shard's table has a fresh located slot for it.
    pub(super) fn locate(&self, frames: &Frames, bucket: &str, key: &str) -> Option<Location> {
        let shard = yutu_api::placement::shard_for(bucket, key, self.shards);
        let table = self.table(frames, bucket, shard)?;
        if table.table().is_none_or(|t| t.is_retired()) {
            // Retired: the next call asks for the table again (as `read` does).
            self.forget(bucket, shard, &table, None);
            return None;
        }
        let at = table.located(key)?;
        Some(Location {
            owner: self.id,
            table,
            shard,
            at,
        })
    }

    /// Whether `loc` was read from these tables.
    pub(super) fn owns(&self, loc: &Location) -> bool {
        loc.owner == self.id
    }

    /// Counts a read made through a located slot.
    pub(super) fn count_located(&self) {
        self.located_hits.fetch_add(1, Ordering::Relaxed);
    }

    /// Blocks read through located slots so far (for tests and diagnostics).
    pub(super) fn located_hits(&self) -> u64 {
        self.located_hits.load(Ordering::Relaxed)
    }

    /// Values read from mirrors so far (for tests and diagnostics).
    pub(super) fn mirror_hits(&self) -> u64 {
        self.mirror_hits.load(Ordering::Relaxed)
    }

    /// Whether each key is present, where a table can say (`None`: ask the node).
    pub(super) fn lookup(
        &self,
        frames: &Frames,
        bucket: &str,
        keys: &[String],
    ) -> Vec<Option<bool>> {
        let mut tables: Vec<Option<Arc<Mapped>>> = vec![None; self.shards];
        let mut looked: Vec<bool> = vec![false; self.shards];
        keys.iter()
            .map(|key| {
                let shard = yutu_api::placement::shard_for(bucket, key, self.shards);
                if !looked[shard] {
                    looked[shard] = true;
                    tables[shard] = self.table(frames, bucket, shard);
                }
                let t = tables[shard].clone()?;
                match t.lookup(key) {
                    Found::Retired => {
                        // Retired since: ask for the table again, once. A new table that is
                        // retired at once (its grant already past, by this host's clock)
                        // is not asked for again for a while.
                        self.forget(bucket, shard, &t, None);
                        tables[shard] = self.table(frames, bucket, shard);
                        let fresh = tables[shard].clone()?;
                        let found = fresh.lookup(key);
                        if found == Found::Retired {
                            self.forget(bucket, shard, &fresh, Some(Instant::now()));
                            tables[shard] = None;
                        }
                        answer(found)
                    }
                    found => answer(found),
                }
            })
            .collect()
    }

    /// The mapped table of `bucket` on `shard`, asked for when there is none.
    fn table(&self, frames: &Frames, bucket: &str, shard: usize) -> Option<Arc<Mapped>> {
        {
            let by_bucket = self.by_bucket.lock().unwrap_or_else(|p| p.into_inner());
            match by_bucket.get(bucket).and_then(|s| s.get(shard)) {
                Some(Slot::Mapped(m)) => return Some(m.clone()),
                Some(Slot::Refused(at)) if at.elapsed() < REFUSED_FOR => return None,
                _ => {}
            }
            if !by_bucket.contains_key(bucket) && by_bucket.len() * self.shards >= MAX_TABLES {
                return None;
            }
        }
        // Asked without the lock: a grant is a call. Two threads may both ask; the later
        // answer is kept, and the other table unmapped when its last lookup ends.
        let slot = match frames
            .presence(shard, bucket)
            .and_then(|(grant, fd)| Mapped::open(grant, fd))
        {
            Ok(m) => Slot::Mapped(Arc::new(m)),
            Err(e) => {
                tracing::debug!(bucket, shard, error = %e, "no presence table; asking the node");
                Slot::Refused(Instant::now())
            }
        };
        let mut by_bucket = self.by_bucket.lock().unwrap_or_else(|p| p.into_inner());
        let slots = by_bucket
            .entry(bucket.to_string())
            .or_insert_with(|| vec![Slot::None; self.shards]);
        slots[shard] = slot.clone();
        match slot {
            Slot::Mapped(m) => Some(m),
            _ => None,
        }
    }

    /// Drops a retired table (unless another thread already replaced it); `refused`: and
    /// asks for none until [`REFUSED_FOR`] after then.
    fn forget(&self, bucket: &str, shard: usize, retired: &Arc<Mapped>, refused: Option<Instant>) {
        let mut by_bucket = self.by_bucket.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(slot) = by_bucket.get_mut(bucket).and_then(|s| s.get_mut(shard)) {
            if matches!(slot, Slot::Mapped(m) if Arc::ptr_eq(m, retired)) {
                *slot = refused.map_or(Slot::None, Slot::Refused);
            }
        }
    }

    /// Tables mapped now (for tests and diagnostics).
    pub(super) fn mapped(&self) -> usize {
        let by_bucket = self.by_bucket.lock().unwrap_or_else(|p| p.into_inner());
        by_bucket
            .values()
            .flatten()
            .filter(|s| matches!(s, Slot::Mapped(_)))
            .count()
    }
}

/// What a lookup says of a key: present, absent, or nothing (ask the node).
fn answer(found: Found) -> Option<bool> {
    match found {
        Found::Present => Some(true),
        Found::Absent => Some(false),
        Found::Retired | Found::Busy => None,
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
