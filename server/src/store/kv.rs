//! The KV data path on a shard: read leases, two-phase puts, existence and prefix queries.
//!
//! A client reads a block one-sidedly from the shard's arena, so the server hands out where
//! the bytes are and promises, for the lease's lifetime, not to reuse them: a leased entry is
//! taken out of the eviction policy, and if it is deleted or replaced meanwhile its bytes stay
//! reserved (an orphan) until the last lease on it ends. A read after expiry is refused by the
//! transfer layer, never served from reused memory.
//!
//! A two-phase put reserves arena space (put-start), the client writes into it one-sidedly,
//! and put-end publishes it in one non-yielding step, so a reader sees the old object or the
//! whole new one. A put-start never ended is reclaimed when its deadline passes.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use super::arena::Extent;
use super::eviction::EntryId;
use super::shard::{NewEtag, ShardStore, Staged};
use crate::model::conditions::WriteConditions;
use crate::model::{ObjectMeta, StoreError};
use yutu_transfer::{Access, GrantId, SegmentDescriptor};

/// The grants a shard has handed out through descriptors: per (grant id, offset), the range's
/// length, access and deadline. The transfer engine asks it on every request, so a descriptor
/// used after its lease or put ended (release, expiry, revoke, or its block deleted or
/// replaced) is refused instead of reaching memory that may now hold another object; grant
/// ids are never reused, so a range granted again is a new grant that old descriptors do not
/// name. Every operation is one hash-map operation per block.
///
/// Written by the shard's thread on lease and put changes, read by the engine's transfer
/// threads: a mutex held for one map operation (or one per block of a lease). It is not on the
/// S3 data path.
#[derive(Default)]
pub struct Grants {
    map: std::sync::Mutex<GrantMap>,
}

#[derive(Clone, Copy)]
struct Granted {
    len: u64,
    access: Access,
    until: Instant,
}

type GrantMap = std::collections::HashMap<(GrantId, u64), Granted>;

impl Grants {
    fn lock(&self) -> std::sync::MutexGuard<'_, GrantMap> {
        // The map is valid after any panic (single inserts and removes), so poison is ignored.
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Grants `access` to `(offset, len)` under `grant` until `until`.
    pub fn grant(&self, grant: GrantId, range: (u64, u64), access: Access, until: Instant) {
        self.lock().insert(
            (grant, range.0),
            Granted {
                len: range.1,
                access,
                until,
            },
        );
    }

    /// Ends `grant` for the blocks at `offsets`.
    pub fn revoke(&self, grant: GrantId, offsets: impl IntoIterator<Item = u64>) {
        let mut map = self.lock();
        for offset in offsets {
            map.remove(&(grant, offset));
        }
    }

    /// Grants in force (for tests and gauges).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl yutu_transfer::RangeGuard for Grants {
    fn allows(&self, d: &SegmentDescriptor) -> bool {
        let now = Instant::now();
        self.lock()
            .get(&(d.grant, d.offset))
            .is_some_and(|g| g.len == d.len && g.access == d.access && g.until > now)
    }
}

/// A pinned entry: how many leases hold it, which grants name its bytes (revoked when it
/// leaves the index, so a deleted or replaced block is unreachable at once), and its bytes
/// once it left the index (kept reserved until the last lease ends, because a transfer that
/// passed its check may still be copying).
pub struct Pin {
    pub(crate) count: u32,
    pub(crate) grants: Vec<GrantId>,
    pub(crate) orphan: Option<(Extent, u64)>,
}

/// What a deadline in [`ShardStore`]'s expiry index ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Held {
    Lease,
    Put,
}

/// What one user holds on a shard, checked against [`crate::config::KvLimits`] before a lease or put-start.
/// An entry exists only while the user holds something, so the map is bounded by the users
/// with live leases or puts.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct KvUsage {
    pub leased_bytes: u64,
    pub reserved_bytes: u64,
    pub leases: u64,
}

pub struct Lease {
    /// Who took it (the user's name; empty without authentication): only they may release it.
    pub(crate) holder: String,
    /// Bytes of the distinct blocks it pins (counted against the holder's limit).
    pub(crate) bytes: u64,
    /// The grant its descriptors carry.
    pub(crate) grant: GrantId,
    /// The distinct entries it pins, with the arena offset each was granted at.
    pub(crate) entries: Vec<(EntryId, u64)>,
    pub(crate) expires: Instant,
}

pub struct PendingPut {
    /// Who started it: only they may end or revoke it.
    pub(crate) holder: String,
    /// The grant its descriptor carries.
    pub(crate) grant: GrantId,
    pub(crate) bucket: String,
    pub(crate) key: String,
    pub(crate) extent: Extent,
    pub(crate) charge: u64,
    pub(crate) meta: ObjectMeta,
    pub(crate) expires: Instant,
}

/// Where a leased block's bytes are in the shard's arena.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockRef {
    pub offset: u64,
    pub len: u64,
    pub etag: String,
    /// The lease's grant, for the block's read-only descriptor.
    pub grant: GrantId,
}

impl ShardStore {
    /// ETag of a block written through the KV path: unique per write (this store's random
    /// salt and a sequence number), with the `-1` suffix S3 uses for ETags that are not an
    /// MD5, so that S3 clients do not check it against one. Not a content hash on purpose:
    /// hashing a 4 KiB block costs as much as the rest of its put.
    pub fn next_kv_etag(&mut self) -> String {
        let seq = self.next_id;
        self.next_id += 1;
        let mut out = String::with_capacity(36);
        super::shard::render_kv_etag(self.etag_salt, seq, &mut out);
        out
    }

    /// What `holder` holds on this shard now.
    pub fn kv_usage(&self, holder: &str) -> KvUsage {
        self.kv_usage.get(holder).copied().unwrap_or_default()
    }

    /// Refuses a lease of `bytes` that would take `holder` past a limit.
    fn admit_lease(&self, holder: &str, bytes: u64) -> Result<(), StoreError> {
        let (u, l) = (self.kv_usage(holder), self.kv_limits);
        if u.leases >= l.leases {
            self.metrics.kv_limit_leases.inc();
            return Err(StoreError::UserLimit(format!(
                "You hold {} leases on this shard, the most a user may; release some and retry.",
                u.leases
            )));
        }
        if u.leased_bytes.saturating_add(bytes) > l.leased_bytes {
            self.metrics.kv_limit_leased.inc();
            return Err(StoreError::UserLimit(format!(
                "You hold {} leased bytes on this shard; {bytes} more would pass the limit of {}. Release some and retry.",
                u.leased_bytes, l.leased_bytes
            )));
        }
        Ok(())
    }

    /// Refuses a put-start of `bytes` that would take `holder` past its reservation limit.
    fn admit_reservation(&self, holder: &str, bytes: u64) -> Result<(), StoreError> {
        let (u, l) = (self.kv_usage(holder), self.kv_limits);
        if u.reserved_bytes.saturating_add(bytes) > l.reserved_bytes {
            self.metrics.kv_limit_reserved.inc();
            return Err(StoreError::UserLimit(format!(
                "You hold {} bytes of unfinished puts on this shard; {bytes} more would pass the limit of {}. End or revoke some and retry.",
                u.reserved_bytes, l.reserved_bytes
            )));
        }
        Ok(())
    }

    /// Applies `change` to `holder`'s usage, dropping the entry once it holds nothing.
    fn account(&mut self, holder: &str, change: impl FnOnce(&mut KvUsage)) {
        let u = self.kv_usage.entry(holder.to_string()).or_default();
        change(u);
        if *u == KvUsage::default() {
            self.kv_usage.remove(holder);
        }
    }

    /// A grant id never used before on this shard.
    fn next_grant(&mut self) -> GrantId {
        self.next_id += 1;
        GrantId(self.next_id)
    }

    /// Leases the named objects of a bucket for `ttl`; `None` for a key that is absent. A key
    /// named twice is leased once.
    pub fn lease(
        &mut self,
        lease_id: u64,
        holder: &str,
        bucket: &str,
        keys: &[String],
        ttl: Duration,
    ) -> Result<Vec<Option<BlockRef>>, StoreError> {
        if self.leases.contains_key(&lease_id) {
            // Two live ids alike (see `Shard::kv_id_for`): the client retries.
            return Err(StoreError::Conflict);
        }
        let grant = self.next_grant();
        let part = self.buckets.get(bucket).ok_or(StoreError::NoSuchBucket)?;
        let mut found = Vec::with_capacity(keys.len());
        let mut entries: Vec<(EntryId, u64)> = Vec::new();
        let mut ranges = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for key in keys {
            match part.objects.get(key) {
                Some(e) => {
                    if seen.insert(e.id) {
                        entries.push((e.id, e.extent.offset));
                        ranges.push((e.extent.offset, e.extent.len));
                    }
                    found.push(Some(BlockRef {
                        offset: e.extent.offset,
                        len: e.extent.len,
                        etag: e.meta.etag.clone(),
                        grant,
                    }));
                }
                None => found.push(None),
            }
        }
        let bytes: u64 = ranges.iter().map(|(_, len)| len).sum();
        self.admit_lease(holder, bytes)?;
        // Large blocks' places, written afresh (see `note_located`): the lease is a read.
        if let Some(part) = self.buckets.get(bucket) {
            for (key, b) in keys.iter().zip(&found) {
                if let (Some(_), Some(e)) = (b, part.objects.get(key)) {
                    self.note_located(bucket, key, e);
                }
            }
        }
        for (id, _) in &entries {
            let pin = self.pins.entry(*id).or_insert(Pin {
                count: 0,
                grants: Vec::new(),
                orphan: None,
            });
            if pin.count == 0 {
                self.policy.on_remove(*id);
            }
            pin.count += 1;
            pin.grants.push(grant);
        }
        let expires = Instant::now() + ttl;
        if let Some(g) = &self.grants {
            for r in &ranges {
                g.grant(grant, *r, Access::Read, expires);
            }
        }
        self.account(holder, |u| {
            u.leased_bytes += bytes;
            u.leases += 1;
        });
        self.kv_deadlines.insert((expires, Held::Lease, lease_id));
        self.leases.insert(
            lease_id,
            Lease {
                holder: holder.to_string(),
                bytes,
                grant,
                entries,
                expires,
            },
        );
        Ok(found)
    }

    /// Ends a lease early; `false` when it had already ended.
    pub fn release_lease(&mut self, lease_id: u64) -> bool {
        let Some(lease) = self.leases.remove(&lease_id) else {
            return false;
        };
        self.kv_deadlines
            .remove(&(lease.expires, Held::Lease, lease_id));
        self.account(&lease.holder, |u| {
            u.leased_bytes -= lease.bytes;
            u.leases -= 1;
        });
        if let Some(g) = &self.grants {
            g.revoke(lease.grant, lease.entries.iter().map(|(_, offset)| *offset));
        }
        for (id, _) in lease.entries {
            self.unpin(id, lease.grant);
        }
        self.publish_gauges();
        true
    }

    /// Ends `holder`'s lease early; `false` when it had ended or is someone else's (ids are
    /// not secrets: a user who learns another's id must not be able to use it).
    pub fn release_lease_by(&mut self, lease_id: u64, holder: &str) -> bool {
        if self
            .leases
            .get(&lease_id)
            .is_none_or(|l| l.holder != holder)
        {
            return false;
        }
        self.release_lease(lease_id)
    }

    /// Publishes `holder`'s put into `bucket`; another holder's put id, or one started in
    /// another bucket, is answered as unknown (the caller's permission was checked on the
    /// bucket it names, so that must be the put's).
    ///
    /// `key`, when given, is the key the put is stored under: a room's (a put started
    /// without a key, see [`ShardStore::put_start`]) must be given, and the caller has checked
    /// that this shard owns it; a keyed put's must be the one it started with.
    pub fn put_end_by(
        &mut self,
        put_id: u64,
        holder: &str,
        bucket: &str,
        key: Option<&str>,
    ) -> Result<(String, String, Staged), StoreError> {
        let Some(p) = self
            .pending_puts
            .get_mut(&put_id)
            .filter(|p| p.holder == holder && p.bucket == bucket)
        else {
            return Err(StoreError::NoSuchUpload);
        };
        match (p.key.is_empty(), key) {
            (true, None) => {
                return Err(StoreError::PutKey(format!(
                    "Put {put_id} is a room: publish it under a key."
                )))
            }
            (true, Some(k)) => {
                // The room was charged for the longest key; the charge is now the key's.
                let charge = Self::charge_for(bucket, k, p.extent.len, &p.meta);
                let over = p.charge.saturating_sub(charge);
                p.key = k.to_string();
                p.charge -= over;
                self.used -= over;
                self.metrics.kv_rooms_published.inc();
            }
            (false, Some(k)) if k != p.key => {
                return Err(StoreError::PutKey(format!(
                    "Put {put_id} was started for another key than {k}."
                )))
            }
            (false, _) => {}
        }
        self.stage_put(put_id)
    }

    /// Whether put `put_id` is started and not yet ended, revoked or expired.
    pub fn put_pending(&self, put_id: u64) -> bool {
        self.pending_puts.contains_key(&put_id)
    }

    /// Abandons `holder`'s put into `bucket`; `false` when it is gone, someone else's, or
    /// another bucket's.
    pub fn put_revoke_by(&mut self, put_id: u64, holder: &str, bucket: &str) -> bool {
        if self
            .pending_puts
            .get(&put_id)
            .is_none_or(|p| p.holder != holder || p.bucket != bucket)
        {
            return false;
        }
        self.put_revoke(put_id)
    }

    /// Whether a lease is still in force (the transfer layer asks before serving a read).
    pub fn lease_valid(&self, lease_id: u64, now: Instant) -> bool {
        self.leases.get(&lease_id).is_some_and(|l| l.expires > now)
    }

    fn unpin(&mut self, id: EntryId, grant: GrantId) {
        let Some(pin) = self.pins.get_mut(&id) else {
            return;
        };
        pin.grants.retain(|g| *g != grant);
        pin.count -= 1;
        if pin.count > 0 {
            return;
        }
        let pin = self.pins.remove(&id);
        match pin.and_then(|p| p.orphan) {
            Some((extent, charge)) => self.drop_entry_charge(charge, extent),
            // Still indexed: evictable again.
            None if self.ids.contains_key(&id) => self.policy.on_insert(id, 0),
            None => {}
        }
    }

    /// Reserves `len` bytes for `bucket/key` until put-end or `ttl`; returns the offset the
    /// client writes to. An empty `key` (never a valid object key) starts a room: a put whose
    /// key is named when it ends, charged meanwhile as for the longest key.
    pub fn put_start(
        &mut self,
        put_id: u64,
        holder: &str,
        bucket: &str,
        key: &str,
        len: u64,
        ttl: Duration,
    ) -> Result<(u64, GrantId), StoreError> {
        if self.pending_puts.contains_key(&put_id) {
            // Two live ids alike (see `Shard::kv_id_for`): the client retries.
            return Err(StoreError::Conflict);
        }
        let meta = ObjectMeta::for_block(len);
        self.check_write(bucket, key, &Default::default())?;
        self.admit_reservation(holder, len)?;
        let charge = if key.is_empty() {
            // A room's key is not known yet: charged as the longest key would be.
            Self::charge_for(bucket, "", len, &meta) + 2 * yutu_api::MAX_KEY_LEN as u64
        } else {
            Self::charge_for(bucket, key, len, &meta)
        };
        let extent = self.reserve(len, charge)?;
        self.account(holder, |u| u.reserved_bytes += len);
        let offset = extent.offset;
        let grant = self.next_grant();
        if let Some(g) = &self.grants {
            g.grant(grant, (offset, len), Access::Write, Instant::now() + ttl);
        }
        let expires = Instant::now() + ttl;
        self.kv_deadlines.insert((expires, Held::Put, put_id));
        self.pending_puts.insert(
            put_id,
            PendingPut {
                holder: holder.to_string(),
                grant,
                bucket: bucket.to_string(),
                key: key.to_string(),
                extent,
                charge,
                meta,
                expires,
            },
        );
        if key.is_empty() {
            self.metrics.kv_rooms_reserved.inc();
        }
        self.publish_gauges();
        Ok((offset, grant))
    }

    /// Publishes a put whose bytes the client has written; returns its bucket, key and
    /// metadata.
    pub fn put_end(
        &mut self,
        put_id: u64,
    ) -> Result<(String, String, Arc<ObjectMeta>), StoreError> {
        let (bucket, key, staged) = self.stage_put(put_id)?;
        let meta = self.publish_staged(&bucket, &key, staged);
        Ok((bucket, key, meta))
    }

    /// Ends a put without publishing it: the client can no longer write its bytes, and
    /// readers still see the old version until [`ShardStore::publish_staged`].
    pub fn stage_put(&mut self, put_id: u64) -> Result<(String, String, Staged), StoreError> {
        if self
            .pending_puts
            .get(&put_id)
            .is_some_and(|p| p.key.is_empty())
        {
            return Err(StoreError::PutKey(format!(
                "Put {put_id} is a room: publish it under a key."
            )));
        }
        let p = self
            .pending_puts
            .remove(&put_id)
            .ok_or(StoreError::NoSuchUpload)?;
        self.kv_deadlines.remove(&(p.expires, Held::Put, put_id));
        self.account(&p.holder, |u| u.reserved_bytes -= p.extent.len);
        if let Some(g) = &self.grants {
            g.revoke(p.grant, [p.extent.offset]);
        }
        if let Err(e) = self.check_write(&p.bucket, &p.key, &Default::default()) {
            self.release(p.extent, p.charge);
            return Err(e);
        }
        let mut meta = p.meta;
        meta.size = p.extent.len;
        meta.etag = self.next_kv_etag();
        meta.last_modified = SystemTime::now();
        Ok((p.bucket, p.key, Staged::new(p.extent, meta, p.charge)))
    }

    /// Abandons a put-start; `false` when it was already gone.
    pub fn put_revoke(&mut self, put_id: u64) -> bool {
        match self.pending_puts.remove(&put_id) {
            Some(p) => {
                self.kv_deadlines.remove(&(p.expires, Held::Put, put_id));
                self.account(&p.holder, |u| u.reserved_bytes -= p.extent.len);
                if let Some(g) = &self.grants {
                    g.revoke(p.grant, [p.extent.offset]);
                }
                self.release(p.extent, p.charge);
                true
            }
            None => false,
        }
    }

    /// Ends expired leases and reclaims expired put-starts; returns how many of each. Walks
    /// only what is due, in deadline order (not every lease), so a shard holding many leases
    /// pays per expiry, not per tick.
    pub fn expire(&mut self, now: Instant) -> (usize, usize) {
        let (mut leases, mut puts) = (0, 0);
        while let Some(&(due, held, id)) = self.kv_deadlines.first() {
            if due > now {
                break;
            }
            self.kv_deadlines.pop_first();
            match held {
                Held::Lease => leases += usize::from(self.release_lease(id)),
                Held::Put => puts += usize::from(self.put_revoke(id)),
            }
        }
        (leases, puts)
    }

    /// Stores a `len`-byte object whose bytes `fill` writes straight into its arena range (a
    /// put-from copying out of a client's buffer: one copy, no staging). Same rules as
    /// [`ShardStore::put`]; when `fill` reports failure nothing is published and the old
    /// version, if any, is gone (as with a failed PUT that already replaced it).
    pub fn put_filled(
        &mut self,
        bucket: &str,
        key: &str,
        len: u64,
        mut meta: ObjectMeta,
        cond: &WriteConditions,
        fill: impl FnOnce(&mut [u8]) -> bool,
    ) -> Result<Arc<ObjectMeta>, StoreError> {
        self.check_write(bucket, key, cond)?;
        let charge = Self::charge_for(bucket, key, len, &meta);
        let extent = self.reserve_replacing(bucket, key, len, charge)?;
        if !fill(self.arena.bytes_mut(&extent)) {
            self.release(extent, charge);
            return Err(StoreError::InvalidRange { size: len });
        }
        meta.size = len;
        meta.etag = self.next_kv_etag();
        Ok(self.publish(bucket, key, extent, meta, charge))
    }

    /// [`ShardStore::put_filled`] for a batch of `(key, len)` blocks of `bucket` whose bytes
    /// `fill` writes all at once (one copy out of a client's memory for the batch): it gets
    /// each block's range (`None` where the block found no room) and says for each whether
    /// it was filled. One result per block, in order; a block that found no room or was not
    /// filled is not stored, and the others are.
    pub fn put_many_filled(
        &mut self,
        bucket: &str,
        blocks: &[(&str, u64)],
        fill: impl FnOnce(&mut [Option<&mut [u8]>]) -> Vec<bool>,
    ) -> Vec<Result<Arc<ObjectMeta>, StoreError>> {
        let cond = WriteConditions::default();
        // One clock read and one version update for the run, not one of each per block.
        let now = std::time::SystemTime::now();
        let mut version = crate::model::version::CLOCK.now_many(blocks.len() as u64);
        let mut reserved = Vec::with_capacity(blocks.len());
        for &(key, len) in blocks {
            let r = self.check_write(bucket, key, &cond).and_then(|()| {
                let mut meta = ObjectMeta::for_block_at(len, now);
                meta.version = version;
                version.clock += 1;
                let charge = Self::charge_for(bucket, key, len, &meta);
                self.reserve_replacing(bucket, key, len, charge)
                    .map(|e| (e, charge, meta))
            });
            reserved.push(r);
        }
        let extents: Vec<&Extent> = reserved.iter().flatten().map(|(e, _, _)| e).collect();
        let filled = match self.arena.bytes_mut_many(&extents) {
            Some(ranges) => {
                let mut ranges = ranges.into_iter();
                let mut aligned: Vec<Option<&mut [u8]>> = reserved
                    .iter()
                    .map(|r| r.as_ref().ok().and_then(|_| ranges.next()))
                    .collect();
                fill(&mut aligned)
            }
            None => Vec::new(),
        };
        let mut filled = filled.into_iter();
        let mut out = Vec::with_capacity(blocks.len());
        for (&(key, len), r) in blocks.iter().zip(reserved) {
            let filled = filled.next() == Some(true);
            out.push(r.and_then(|(extent, charge, mut meta)| {
                if !filled {
                    self.release(extent, charge);
                    return Err(StoreError::InvalidRange { size: len });
                }
                meta.size = len;
                Ok(self.publish_as(bucket, key, extent, meta, charge, NewEtag::Kv))
            }));
        }
        out
    }

    /// Runs `f` on a DRAM-resident object's metadata and bytes without copying them out
    /// (counts as an access for eviction); `Ok(None)` when DRAM does not hold the key.
    pub fn read_with<R>(
        &mut self,
        bucket: &str,
        key: &str,
        f: impl FnOnce(&ObjectMeta, &[u8]) -> R,
    ) -> Result<Option<R>, StoreError> {
        let part = self.buckets.get(bucket).ok_or(StoreError::NoSuchBucket)?;
        if let Some(entry) = part.objects.get(key) {
            let r = f(&entry.meta, self.arena.bytes(&entry.extent));
            self.note_located(bucket, key, entry);
            self.policy.on_access(entry.id);
            return Ok(Some(r));
        }
        // On its way to NVMe: still served from the copy kept for the demotion.
        Ok(self
            .demoting_get(bucket, key)
            .map(|(meta, data)| f(meta, data)))
    }

    /// Notes where a large KV block DRAM serves lies, in the bucket's mirror (a located
    /// slot, `presence.rs`), with the time of this read: a same-host client copies it
    /// without a call from then on, and asks the node again (a read that comes here) once
    /// the slot is older than `LOCATED_FRESH_MS`, so a block read only through its slot
    /// still moves to the front of the eviction order about that often.
    fn note_located(&self, bucket: &str, key: &str, entry: &super::shard::Entry) {
        if entry.meta.kv && entry.extent.len >= super::presence::LOCATE_MIN {
            self.presence
                .borrow_mut()
                .located(bucket, key, entry.extent.offset, entry.extent.len);
        }
    }

    /// Reads several keys of `bucket` in place at once: `f` gets each key's bytes, `None`
    /// where DRAM does not hold it, all borrowed together (so one copy can move them all).
    pub fn read_many_with<R>(
        &mut self,
        bucket: &str,
        keys: &[&str],
        f: impl FnOnce(&[Option<&[u8]>]) -> R,
    ) -> Result<R, StoreError> {
        let part = self.buckets.get(bucket).ok_or(StoreError::NoSuchBucket)?;
        let mut ids = Vec::with_capacity(keys.len());
        let found: Vec<Option<&[u8]>> = keys
            .iter()
            .map(|k| match part.objects.get(*k) {
                Some(entry) => {
                    ids.push(entry.id);
                    self.note_located(bucket, k, entry);
                    Some(self.arena.bytes(&entry.extent))
                }
                // On its way to NVMe: still served from the copy kept for the demotion.
                None => self.demoting_get(bucket, k).map(|(_, data)| &data[..]),
            })
            .collect();
        let r = f(&found);
        drop(found);
        for id in ids {
            self.policy.on_access(id);
        }
        Ok(r)
    }

    /// For each key, whether the bucket holds it.
    pub fn exists(&self, bucket: &str, keys: &[String]) -> Result<Vec<bool>, StoreError> {
        let part = self.buckets.get(bucket).ok_or(StoreError::NoSuchBucket)?;
        // A key on its way to NVMe is still read from the demotion's copy, so it exists.
        Ok(keys
            .iter()
            .map(|k| part.objects.contains_key(k) || self.demoting_get(bucket, k).is_some())
            .collect())
    }

    /// The bytes at an arena range, for the in-process (HTTP) fallback of one-sided reads.
    pub fn arena_bytes(&self, extent_offset: u64, len: u64) -> Option<&[u8]> {
        self.arena.slice(extent_offset, len)
    }

    /// Writes into a pending put's reservation (the HTTP fallback of a one-sided write).
    pub fn write_pending(&mut self, put_id: u64, at: u64, data: &[u8]) -> Result<(), StoreError> {
        let p = self
            .pending_puts
            .get(&put_id)
            .ok_or(StoreError::NoSuchUpload)?;
        let end = at
            .checked_add(data.len() as u64)
            .ok_or(StoreError::InvalidRange { size: p.extent.len })?;
        if end > p.extent.len {
            return Err(StoreError::InvalidRange { size: p.extent.len });
        }
        let (offset, len) = (p.extent.offset + at, data.len() as u64);
        let dst = self
            .arena
            .slice_mut(offset, len)
            .ok_or(StoreError::InvalidRange { size: len })?;
        yutu_transfer::cold_copy::copy_cold_slice(dst, data);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::metrics::ShardMetrics;
    use crate::model::conditions::{ReadConditions, WriteConditions};
    use crate::store::arena::Arena;
    use crate::store::eviction::Lru;

    fn meta() -> ObjectMeta {
        ObjectMeta {
            size: 0,
            etag: String::new(),
            last_modified: SystemTime::now(),
            content_type: None,
            headers: vec![],
            user_meta: vec![],
            checksum: None,
            parts: None,
            owner: String::new(),
            acl: Default::default(),
            kv: false,
            version: crate::model::Version::ZERO,
        }
    }

    fn store(cap: u64) -> ShardStore {
        let mut s = ShardStore::new(
            Arena::new("kv-test", cap, 4096).unwrap(),
            Box::new(Lru::new()),
            Arc::new(ShardMetrics::default()),
        );
        s.add_bucket(
            "b",
            SystemTime::now(),
            "",
            crate::model::Durability::Memory,
            1,
        );
        s
    }

    fn put(s: &mut ShardStore, key: &str, data: &[u8]) {
        let mut m = meta();
        m.size = data.len() as u64;
        s.put("b", key, data, m, &WriteConditions::default())
            .unwrap();
    }

    #[test]
    fn leased_bytes_survive_eviction_and_replacement() {
        let mut s = store(64 * 1024);
        put(&mut s, "hot", &[1u8; 8192]);
        let refs = s
            .lease(
                7,
                "",
                "b",
                &["hot".into(), "missing".into()],
                Duration::from_secs(10),
            )
            .unwrap();
        let r = refs[0].clone().unwrap();
        assert!(refs[1].is_none());
        // Fill far past capacity: the leased entry is never the victim.
        for i in 0..40 {
            put(&mut s, &format!("k{i}"), &[2u8; 8192]);
        }
        assert_eq!(s.arena_bytes(r.offset, r.len).unwrap(), &[1u8; 8192][..]);
        assert!(s
            .get("b", "hot", None, true, &ReadConditions::default())
            .is_ok());
        // Replaced while leased: the old bytes stay put until the lease ends.
        put(&mut s, "hot", &[3u8; 8192]);
        for i in 40..80 {
            put(&mut s, &format!("k{i}"), &[4u8; 8192]);
        }
        assert_eq!(s.arena_bytes(r.offset, r.len).unwrap(), &[1u8; 8192][..]);
        let used = s.used();
        assert!(s.release_lease(7));
        assert!(s.used() < used, "the orphaned bytes were freed");
        assert!(!s.release_lease(7));
        assert!(s.used() <= s.capacity());
    }

    /// A batch filled by one copy: each block gets its own range, in the batch's order; a
    /// block with no room gets none and fails alone; one not filled is not stored; a key
    /// twice keeps its later block; the old version a block replaces is freed.
    #[test]
    fn a_batch_of_blocks_is_filled_at_once_and_each_fails_alone() {
        let mut s = store(1 << 20);
        put(&mut s, "a", &[9u8; 5000]);
        let blocks = [
            ("a", 100),
            ("huge", 4 << 20),
            ("b", 3000),
            ("a", 200),
            ("c", 10),
        ];
        let mut seen = Vec::new();
        let done = s.put_many_filled("b", &blocks, |dst| {
            seen = dst.iter().map(|d| d.as_ref().map(|d| d.len())).collect();
            dst.iter_mut()
                .enumerate()
                .map(|(i, d)| match d {
                    Some(d) => {
                        d.fill(i as u8);
                        i != 4
                    }
                    None => true,
                })
                .collect()
        });
        assert_eq!(seen, [Some(100), None, Some(3000), Some(200), Some(10)]);
        assert!(
            done[0].is_ok() && done[2].is_ok() && done[3].is_ok(),
            "{done:?}"
        );
        assert!(
            matches!(done[1], Err(StoreError::TooLarge { .. })),
            "{done:?}"
        );
        assert!(
            matches!(done[4], Err(StoreError::InvalidRange { .. })),
            "{done:?}"
        );
        let read = |s: &mut ShardStore, k: &str| {
            s.get("b", k, None, false, &ReadConditions::default())
                .map(|(_, _, d)| d.to_vec())
        };
        assert_eq!(read(&mut s, "a").unwrap(), vec![3u8; 200]);
        assert_eq!(read(&mut s, "b").unwrap(), vec![2u8; 3000]);
        assert!(read(&mut s, "huge").is_err() && read(&mut s, "c").is_err());
        // Only what is stored is held: "a" at 200 bytes and "b".
        let held = ShardStore::charge_for("b", "a", 200, &ObjectMeta::for_block(200))
            + ShardStore::charge_for("b", "b", 3000, &ObjectMeta::for_block(3000));
        assert_eq!(s.used(), held);
    }

    /// Batches that overwrite their keys over and over (each overwrite takes the old entry's
    /// place in the index): the store holds exactly the last versions, each newer than the
    /// one it replaced, the reverse map and the policy keep one entry per key, and eviction
    /// still takes the least recently written key first.
    #[test]
    fn overwriting_batches_keep_one_entry_per_key_and_the_eviction_order() {
        let block = 4096u64;
        let one = ShardStore::charge_for("b", "k0", block, &ObjectMeta::for_block(block));
        let keys: Vec<String> = (0..8).map(|i| format!("k{i}")).collect();
        // Room for the 8 keys and one more block, not two.
        let mut s = store(one * 9 + one / 2);
        let mut last = std::collections::HashMap::new();
        for round in 0..50u8 {
            let blocks: Vec<(&str, u64)> = keys.iter().map(|k| (k.as_str(), block)).collect();
            let done = s.put_many_filled("b", &blocks, |dst| {
                dst.iter_mut()
                    .map(|d| d.as_mut().map(|d| d.fill(round)).is_some())
                    .collect()
            });
            for (k, d) in keys.iter().zip(done) {
                let meta = d.unwrap();
                if let Some(before) = last.insert(k.clone(), meta.version) {
                    assert!(meta.version > before, "{k}: a newer version each round");
                }
            }
            assert_eq!(s.used(), one * 8);
            assert_eq!((s.object_count(), s.ids.len()), (8, 8));
        }
        for k in &keys {
            let (_, _, d) = s
                .get("b", k, None, false, &ReadConditions::default())
                .unwrap();
            assert_eq!(&d[..], &[49u8; 4096][..]);
        }
        // k0 is written again, "new" takes the spare room, and "new2" needs one key's
        // room: k1 goes (the least recent), not k0.
        put(&mut s, "k0", &[7u8; 4096]);
        put(&mut s, "new", &[8u8; 4096]);
        put(&mut s, "new2", &[8u8; 4096]);
        let here = |s: &mut ShardStore, k: &str| {
            s.get("b", k, None, true, &ReadConditions::default())
                .is_ok()
        };
        assert!(here(&mut s, "k0") && here(&mut s, "new") && here(&mut s, "new2"));
        assert!(!here(&mut s, "k1"), "the least recently written key went");
        assert!((2..8).all(|i| here(&mut s, &format!("k{i}"))));
        assert_eq!(s.ids.len(), s.object_count());
    }

    /// A block overwritten while an answer still holds its metadata leaves that answer as it
    /// was (a new allocation for the new version); once nothing holds it, the next overwrite
    /// reuses it in place. Either way every version gets a new ETag in the KV form, and reads
    /// see the newest bytes and metadata.
    #[test]
    fn an_overwrite_reuses_the_old_metadata_only_when_nothing_holds_it() {
        let mut s = store(64 * 1024);
        let put_one = |s: &mut ShardStore, byte: u8| {
            s.put_many_filled("b", &[("k", 4096)], |dst| {
                dst.iter_mut()
                    .map(|d| d.as_mut().map(|d| d.fill(byte)).is_some())
                    .collect()
            })
            .pop()
            .unwrap()
            .unwrap()
        };
        let first = put_one(&mut s, 1);
        let held = first.clone();
        let second = put_one(&mut s, 2);
        assert!(
            !Arc::ptr_eq(&first, &second),
            "the first answer still holds its metadata"
        );
        assert_eq!((held.etag.as_str(), held.size), (first.etag.as_str(), 4096));
        assert_ne!(second.etag, first.etag);
        let at = Arc::as_ptr(&second);
        let second_etag = second.etag.clone();
        drop((first, held, second));
        let third = put_one(&mut s, 3);
        assert_eq!(Arc::as_ptr(&third), at, "nothing held it: reused in place");
        for etag in [&second_etag, &third.etag] {
            assert!(etag.starts_with('"') && etag.ends_with("-1\"") && etag.len() == 36);
        }
        assert_ne!(third.etag, second_etag);
        assert!(third.kv && third.version > crate::model::Version::ZERO);
        let (meta, _, data) = s
            .get("b", "k", None, false, &ReadConditions::default())
            .unwrap();
        assert_eq!((&meta.etag, &data[..]), (&third.etag, &[3u8; 4096][..]));
    }

    /// A large KV block's located slot names its bytes from its publication on, and goes
    /// before those bytes can be reused: an overwrite (in place or over a leased version),
    /// a remove, an eviction that demotes it. A lease writes it afresh; S3 objects and small
    /// blocks get none.
    #[test]
    fn located_slots_name_a_blocks_bytes_until_they_can_be_reused() {
        use yutu_api::mirror::Mirror;
        use yutu_api::presence::fingerprint;
        let big = super::super::presence::LOCATE_MIN as usize;
        let mut s = store(8 * big as u64);
        s.enable_demotion(8 * big as u64);
        let grant = s.presence.borrow_mut().grant("b", None, &|_| {}).unwrap();
        let file = std::fs::File::from(grant.fd);
        // SAFETY: a read-only test mapping of the sealed table.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        // SAFETY: page-aligned, read only through atomics.
        let words = unsafe {
            std::slice::from_raw_parts(
                map.as_ptr().cast::<std::sync::atomic::AtomicU64>(),
                map.len() / 8,
            )
        };
        let mirror = Mirror::named(words).unwrap().unwrap();
        let located = |k: &str| mirror.located(fingerprint(&grant.secret, k));
        let put_kv = |s: &mut ShardStore, key: &str, len: usize, byte: u8| {
            s.put_many_filled("b", &[(key, len as u64)], |dst| {
                dst.iter_mut()
                    .map(|d| d.as_mut().map(|d| d.fill(byte)).is_some())
                    .collect()
            })
            .pop()
            .unwrap()
            .unwrap();
        };
        // The slot names exactly the bytes a lease hands out.
        put_kv(&mut s, "a", big, 1);
        let first = located("a").expect("a large block is located as it is published");
        let lease = |s: &mut ShardStore, id: u64, key: &str| {
            s.lease(id, "", "b", &[key.to_string()], Duration::from_secs(10))
                .unwrap()
                .pop()
                .unwrap()
                .unwrap()
        };
        let r = lease(&mut s, 1, "a");
        assert_eq!((first.offset, first.len), (r.offset, big as u64));
        assert!(!mirror.still(&first), "the lease wrote the slot afresh");
        let leased = located("a").unwrap();
        assert_eq!((leased.offset, leased.len), (r.offset, r.len));
        // An overwrite over the leased version: the old bytes stay (leased), the slot moves.
        put_kv(&mut s, "a", big, 2);
        assert!(!mirror.still(&leased));
        let second = located("a").unwrap();
        assert_ne!(
            second.offset, leased.offset,
            "the leased bytes are not reused"
        );
        assert!(s.release_lease(1));
        // An overwrite of an unleased version (its entry reused in place).
        put_kv(&mut s, "a", big, 3);
        assert!(!mirror.still(&second));
        let third = located("a").unwrap();
        let (_, _, data) = s
            .get("b", "a", None, false, &ReadConditions::default())
            .unwrap();
        assert_eq!(&data[..], &vec![3u8; big][..]);
        // Reads by the node (its own copy) write the slot too.
        s.presence.borrow_mut().unmirror("b", "a");
        assert!(located("a").is_none());
        s.read_with("b", "a", |_, _| ()).unwrap();
        assert_eq!(located("a").map(|l| l.offset), Some(third.offset));
        s.presence.borrow_mut().unmirror("b", "a");
        s.read_many_with("b", &["a"], |_| ()).unwrap();
        let third = located("a").unwrap();
        // A remove.
        assert_eq!(s.delete("b", "a"), Ok(true));
        assert!(!mirror.still(&third) && located("a").is_none());
        // Small blocks and S3 objects get none.
        put_kv(&mut s, "small", big - 1, 4);
        assert!(located("small").is_none());
        put(&mut s, "s3", &vec![5u8; big]);
        assert!(located("s3").is_none());
        let _ = lease(&mut s, 2, "s3");
        assert!(located("s3").is_none(), "nor does a lease of an S3 object");
        assert!(s.release_lease(2));
        // Eviction into demotion: the key stays present, its arena bytes go, and so does
        // its slot.
        put_kv(&mut s, "old", big, 6);
        let old = located("old").unwrap();
        for i in 0..8 {
            put_kv(&mut s, &format!("fill{i}"), big, 7);
        }
        let evicted = std::iter::from_fn(|| s.next_demotion()).any(|(_, k, _, _)| k == "old");
        assert!(evicted, "the oldest block was evicted to NVMe");
        assert!(!mirror.still(&old) && located("old").is_none());
        assert_eq!(s.exists("b", &["old".to_string()]).unwrap(), [true]);
    }

    /// An overwrite that nothing holds the old version of keeps the entry's id (the reverse
    /// map and the policy keep their entry); one over a leased version takes a new id, the
    /// lease keeps reading the old bytes, and when it ends every structure has one entry per
    /// key: each key is evicted once, and then nothing is held.
    #[test]
    fn an_overwrite_keeps_the_id_unless_a_lease_pins_the_old_version() {
        let mut s = store(64 * 1024);
        let id = |s: &ShardStore, k: &str| s.buckets["b"].objects[k].id;
        put(&mut s, "a", &[1u8; 4096]);
        put(&mut s, "z", &[1u8; 4096]);
        let first = id(&s, "a");
        put(&mut s, "a", &[2u8; 4096]);
        assert_eq!(id(&s, "a"), first, "nothing held the old version");
        let r = s
            .lease(7, "", "b", &["a".into()], Duration::from_secs(10))
            .unwrap()[0]
            .clone()
            .unwrap();
        put(&mut s, "a", &[3u8; 4096]);
        assert_ne!(
            id(&s, "a"),
            first,
            "the lease pins the old version by its id"
        );
        assert_eq!(s.arena_bytes(r.offset, r.len).unwrap(), &[2u8; 4096][..]);
        put(&mut s, "a", &[4u8; 4096]);
        assert!(s.release_lease(7));
        assert_eq!((s.ids.len(), s.object_count()), (2, 2));
        let mut evicted = 0;
        while s.evict_one() {
            evicted += 1;
        }
        assert_eq!((evicted, s.used(), s.object_count()), (2, 0, 0));
    }

    #[test]
    fn leases_expire() {
        let mut s = store(64 * 1024);
        put(&mut s, "a", b"x");
        s.lease(1, "", "b", &["a".into()], Duration::from_millis(0))
            .unwrap();
        assert!(!s.lease_valid(1, Instant::now()));
        assert_eq!(s.expire(Instant::now()), (1, 0));
        assert!(s.pins.is_empty());
    }

    #[test]
    fn a_staged_put_is_invisible_until_published_and_discarding_frees_it() {
        let mut s = store(1 << 20);
        put(&mut s, "blk", b"old");
        let before = s.used();
        s.put_start(9, "", "b", "blk", 5, Duration::from_secs(10))
            .unwrap();
        s.write_pending(9, 0, b"new!!").unwrap();
        let (bucket, key, staged) = s.stage_put(9).unwrap();
        assert_eq!((bucket.as_str(), key.as_str()), ("b", "blk"));
        assert_eq!(&s.staged_bytes(&staged)[..], b"new!!");
        // Neither the client nor a reader reaches it now.
        assert!(s.write_pending(9, 0, b"again").is_err());
        let (_, _, old) = s
            .get("b", "blk", None, false, &ReadConditions::default())
            .unwrap();
        assert_eq!(&old[..], b"old");
        s.discard_staged(staged);
        assert_eq!(s.used(), before);
        let (_, _, still) = s
            .get("b", "blk", None, false, &ReadConditions::default())
            .unwrap();
        assert_eq!(&still[..], b"old");
    }

    #[test]
    fn expiry_visits_only_what_is_due_and_forgets_what_ended() {
        let mut s = store(1 << 20);
        put(&mut s, "a", b"x");
        let keys = vec!["a".to_string()];
        for id in 0..100 {
            s.lease(id, "", "b", &keys, Duration::from_secs(60))
                .unwrap();
        }
        s.lease(100, "", "b", &keys, Duration::from_millis(0))
            .unwrap();
        s.put_start(101, "", "b", "p", 8, Duration::from_millis(0))
            .unwrap();
        s.put_start(102, "", "b", "q", 8, Duration::from_secs(60))
            .unwrap();
        assert_eq!(s.kv_deadlines.len(), 103);
        assert_eq!(s.expire(Instant::now()), (1, 1));
        assert_eq!(s.kv_deadlines.len(), 101);
        // Released and ended ones leave the index at once.
        assert!(s.release_lease(5));
        assert!(s.stage_put(102).is_ok_and(|(_, _, st)| {
            s.discard_staged(st);
            true
        }));
        assert_eq!(s.kv_deadlines.len(), 99);
        assert_eq!(s.expire(Instant::now() + Duration::from_secs(61)), (99, 0));
        assert!(s.kv_deadlines.is_empty() && s.leases.is_empty() && s.pins.is_empty());
    }

    #[test]
    fn per_user_limits_refuse_and_release_restores() {
        let mut s = store(1 << 20);
        s.set_kv_limits(crate::config::KvLimits {
            leased_bytes: 8192,
            reserved_bytes: 4096,
            leases: 2,
        });
        for k in ["a", "b", "c"] {
            put(&mut s, k, &[7u8; 4096]);
        }
        let keys = |ks: &[&str]| ks.iter().map(|k| k.to_string()).collect::<Vec<_>>();
        let ttl = Duration::from_secs(10);
        // A key named twice counts once.
        s.lease(1, "bob", "b", &keys(&["a", "a"]), ttl).unwrap();
        assert_eq!(s.kv_usage("bob").leased_bytes, 4096);
        assert!(matches!(
            s.lease(2, "bob", "b", &keys(&["b", "c"]), ttl),
            Err(StoreError::UserLimit(_))
        ));
        s.lease(3, "bob", "b", &keys(&["b"]), ttl).unwrap();
        // Two leases: the third is refused even for no bytes; alice is not affected.
        assert!(matches!(
            s.lease(4, "bob", "b", &keys(&["missing"]), ttl),
            Err(StoreError::UserLimit(_))
        ));
        s.lease(5, "alice", "b", &keys(&["a", "b"]), ttl).unwrap();
        assert!(s.put_start(6, "bob", "b", "p", 4096, ttl).is_ok());
        assert!(matches!(
            s.put_start(7, "bob", "b", "q", 1, ttl),
            Err(StoreError::UserLimit(_))
        ));
        assert!(s.release_lease(1) && s.release_lease(3) && s.put_revoke(6));
        assert_eq!(s.kv_usage("bob"), KvUsage::default());
        assert!(!s.kv_usage.contains_key("bob"), "empty usage is dropped");
        s.lease(8, "bob", "b", &keys(&["b", "c"]), ttl).unwrap();
    }

    #[test]
    fn two_phase_put() {
        let mut s = store(1 << 20);
        put(&mut s, "blk", b"old");
        s.put_start(9, "", "b", "blk", 5, Duration::from_secs(10))
            .unwrap();
        s.write_pending(9, 0, b"new!!").unwrap();
        assert!(s.write_pending(9, 3, b"too long").is_err());
        // Until put-end, readers see the old object.
        let (_, _, old) = s
            .get("b", "blk", None, false, &ReadConditions::default())
            .unwrap();
        assert_eq!(&old[..], b"old");
        let (_, _, m) = s.put_end(9).unwrap();
        assert!(m.etag.ends_with("-1\""));
        let (_, _, new) = s
            .get("b", "blk", None, false, &ReadConditions::default())
            .unwrap();
        assert_eq!(&new[..], b"new!!");
        assert!(s.put_end(9).is_err());
        // A put-start never ended is reclaimed.
        let before = s.used();
        s.put_start(10, "", "b", "never", 4096, Duration::from_millis(0))
            .unwrap();
        assert!(s.used() > before);
        assert_eq!(s.expire(Instant::now()), (0, 1));
        assert_eq!(s.used(), before);
        assert_eq!(
            s.exists("b", &["blk".into(), "never".into()]).unwrap(),
            [true, false]
        );
    }

    #[test]
    fn only_the_holder_may_release_end_or_revoke() {
        let mut s = store(1 << 20);
        put(&mut s, "a", b"x");
        s.lease(1, "alice", "b", &["a".into()], Duration::from_secs(10))
            .unwrap();
        assert!(!s.release_lease_by(1, "bob"));
        assert!(s.lease_valid(1, Instant::now()));
        assert!(s.release_lease_by(1, "alice"));

        s.put_start(2, "alice", "b", "k", 4, Duration::from_secs(10))
            .unwrap();
        assert!(matches!(
            s.put_end_by(2, "bob", "b", None),
            Err(StoreError::NoSuchUpload)
        ));
        assert!(!s.put_revoke_by(2, "bob", "b"));
        // The holder's own put, named through another bucket (one its permission was checked
        // on), is unknown there too.
        assert!(matches!(
            s.put_end_by(2, "alice", "other", None),
            Err(StoreError::NoSuchUpload)
        ));
        assert!(!s.put_revoke_by(2, "alice", "other"));
        assert!(s.put_end_by(2, "alice", "b", None).is_ok());
        s.put_start(3, "alice", "b", "k", 4, Duration::from_secs(10))
            .unwrap();
        assert!(s.put_revoke_by(3, "alice", "b"));
    }

    #[test]
    fn a_room_is_published_under_the_key_it_is_given_and_charged_for_it() {
        let mut s = store(1 << 20);
        let before = s.used();
        let (offset, _) = s
            .put_start(4, "alice", "b", "", 5, Duration::from_secs(10))
            .unwrap();
        let held = s.used() - before;
        s.write_pending(4, 0, b"room!").unwrap();
        // A room needs a key, and only its holder may end it.
        assert!(matches!(
            s.put_end_by(4, "alice", "b", None),
            Err(StoreError::PutKey(_))
        ));
        assert!(matches!(s.put_end(4), Err(StoreError::PutKey(_))));
        assert!(matches!(
            s.put_end_by(4, "bob", "b", Some("k")),
            Err(StoreError::NoSuchUpload)
        ));
        let (bucket, key, staged) = s.put_end_by(4, "alice", "b", Some("k")).unwrap();
        assert_eq!((bucket.as_str(), key.as_str()), ("b", "k"));
        s.publish_staged(&bucket, &key, staged);
        let (_, _, got) = s
            .get("b", "k", None, false, &ReadConditions::default())
            .unwrap();
        assert_eq!(&got[..], b"room!");
        // Charged as for its one-byte key now, no longer for the longest key.
        let stored = s.used() - before;
        assert_eq!(held - stored, 2 * (yutu_api::MAX_KEY_LEN as u64 - 1));
        // The bytes stay where the room was.
        let leased = s
            .lease(6, "alice", "b", &["k".into()], Duration::from_secs(10))
            .unwrap();
        assert_eq!(leased[0].as_ref().map(|b| b.offset), Some(offset));
        assert!(s.release_lease_by(6, "alice"));
        // A keyed put ends under its own key only.
        s.put_start(5, "alice", "b", "k2", 4, Duration::from_secs(10))
            .unwrap();
        assert!(matches!(
            s.put_end_by(5, "alice", "b", Some("other")),
            Err(StoreError::PutKey(_))
        ));
        assert!(s.put_end_by(5, "alice", "b", Some("k2")).is_ok());
    }
}
