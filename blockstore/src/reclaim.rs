//! Space reclamation: when the shard runs out of free regions, its oldest region is emptied
//! as a whole and reused.
//!
//! Whole regions, oldest first, because that is what keeps a log-structured store simple and
//! the device happy: no compaction of partially dead regions, no random writes, and (since
//! sequence numbers grow with region generations) a tombstone never outlives the older
//! versions it hides.
//!
//! Entries of the victim that the index still points to are "live". A
//! [`ReclaimPolicy`](crate::ReclaimPolicy) (`reclaim_policy.rs`) decides each one's fate: drop
//! it (the normal case for a cache), hand its bytes back to the caller to re-admit into DRAM
//! (hot entries), or rewrite it forward into the active region (entries that must stay on
//! disk, such as objects of `durability=disk` buckets). Everything the reclamation did is
//! reported in a [`Reclaimed`], so the server can update its own state and emit "removed"
//! events for what left the tier.
//!
//! Order of operations, for crash safety: live entries are read and re-placed first; if any
//! were rewritten, a flush makes the new copies durable; only then is the victim's header
//! overwritten with a new generation and nonce (which invalidates every old record in it at
//! once) and flushed, before the region is handed out again. A crash at any point leaves either
//! the old copy or the new one valid.

use std::ops::Range;
use std::rc::Rc;

use bytes::Bytes;

use crate::bdev::Bdev;
use crate::error::StoreError;
use crate::location::Location;
use crate::reclaim_policy::{ObjectName, Readmitted, ReclaimAction, ReclaimCandidate, Reclaimed};
use crate::record::{parse_header, verify, RecordKind};
use crate::region::{new_nonce, RegionHeader};
use crate::region_info::RegionState;
use crate::store::{NewRecord, Place, RegionStore};

impl<B: Bdev + 'static> RegionStore<B> {
    /// Reclaims the oldest sealed region now (for a server that keeps free space ahead of
    /// demand). `None` when no region is sealed.
    pub async fn reclaim_oldest(&self) -> Result<Option<Reclaimed>, StoreError> {
        let _permit = self
            .shared
            .space_lock
            .acquire_permit(1)
            .await
            .map_err(|e| StoreError::Poisoned(e.to_string()))?;
        self.reclaim_locked(0).await
    }

    /// Empties the oldest sealed region and puts it on the free list. Returns `None` when no
    /// region is sealed. The caller holds the space lock. `reserve` bytes of the active region
    /// are kept free for the record that triggered the reclamation.
    pub(crate) async fn reclaim_locked(
        &self,
        reserve: u64,
    ) -> Result<Option<Reclaimed>, StoreError> {
        let sh = &self.shared;
        let victim = {
            let mut st = sh.state.borrow_mut();
            let Some(v) = st.sealed.pop_front() else {
                return Ok(None);
            };
            if let Some(info) = st.regions.get_mut(&v) {
                info.state = RegionState::Reclaiming;
            }
            v
        };
        match self.reclaim_region(victim, reserve).await {
            Ok(r) => Ok(Some(r)),
            Err(e) => {
                // Leave the region where it was; it is still intact on disk.
                let mut st = sh.state.borrow_mut();
                if let Some(info) = st.regions.get_mut(&victim) {
                    if info.state == RegionState::Reclaiming {
                        info.state = RegionState::Sealed;
                        st.sealed.push_front(victim);
                    }
                }
                Err(e)
            }
        }
    }

    async fn reclaim_region(&self, victim: u32, reserve: u64) -> Result<Reclaimed, StoreError> {
        let sh = &self.shared;
        // Its last writes may still be in flight if the store is small.
        sh.signal
            .wait_until(|| {
                let st = sh.state.borrow();
                !st.writer.holds(victim) || st.poisoned.is_some()
            })
            .await;
        if let Some(p) = &sh.state.borrow().poisoned {
            return Err(StoreError::Poisoned(p.clone()));
        }

        // Live entries: members the index still points to.
        let (generation, key, candidates) = {
            let st = sh.state.borrow();
            let info = st
                .regions
                .get(&victim)
                .ok_or_else(|| StoreError::Config(format!("region {victim} is not owned")))?;
            let live: Vec<(Rc<str>, Rc<str>, Location, Bytes)> = info
                .members
                .iter()
                .filter(|m| st.index.get(&m.bucket, &m.key) == Some(m.loc))
                .map(|m| {
                    let meta = st.index.meta(&m.bucket, &m.key).unwrap_or_default();
                    (m.bucket.clone(), m.key.clone(), m.loc, meta)
                })
                .collect();
            (info.generation, info.key, live)
        };
        let decisions: Vec<ReclaimAction> = {
            let mut policy = sh.policy.borrow_mut();
            candidates
                .iter()
                .map(|(b, k, loc, meta)| {
                    policy.decide(&ReclaimCandidate {
                        bucket: b,
                        key: k,
                        meta,
                        location: *loc,
                    })
                })
                .collect()
        };
        let data = if decisions.iter().any(|d| *d != ReclaimAction::Drop) {
            let geo = sh.geo;
            Some(
                sh.bdev
                    .read_blocks(geo.region_lba(victim), geo.region_blocks())
                    .await?,
            )
        } else {
            None
        };

        let mut report = Reclaimed {
            region: victim,
            generation,
            ..Reclaimed::default()
        };
        let mut rewrites = Vec::new();
        {
            let mut st = sh.state.borrow_mut();
            for ((bucket, name, loc, _), decision) in candidates.iter().zip(&decisions) {
                if st.index.get(bucket, name) != Some(*loc) {
                    continue; // replaced or deleted while we were reading
                }
                let value = match (&data, decision) {
                    (Some(d), ReclaimAction::Readmit | ReclaimAction::Rewrite) => {
                        match payload_ranges(d.as_ref(), &key, loc) {
                            Some(r) => Some(r),
                            None => {
                                report.corrupt += 1;
                                st.counters.corrupt_records += 1;
                                None
                            }
                        }
                    }
                    _ => None,
                };
                let object = ObjectName {
                    bucket: bucket.to_string(),
                    key: name.to_string(),
                };
                match (decision, value) {
                    (ReclaimAction::Readmit, Some((meta, value))) => {
                        st.index_remove_if(bucket, name, loc);
                        st.counters.entries_readmitted += 1;
                        let d = data.as_ref().map(|d| d.as_ref()).unwrap_or_default();
                        report.readmitted.push(Readmitted {
                            bucket: object.bucket,
                            key: object.key,
                            meta: Bytes::copy_from_slice(&d[meta]),
                            value: Bytes::copy_from_slice(&d[value]),
                        });
                    }
                    (ReclaimAction::Rewrite, Some(ranges)) => rewrites.push((object, *loc, ranges)),
                    _ => {
                        st.index_remove_if(bucket, name, loc);
                        st.counters.entries_dropped += 1;
                        report.dropped.push(object);
                    }
                }
            }
        }

        // Rewrites go through the normal append path, keeping `reserve` bytes free.
        if let Some(d) = &data {
            for (object, old, (meta, value)) in rewrites {
                let rec = NewRecord {
                    bucket: &object.bucket,
                    key: &object.key,
                    meta: &d.as_ref()[meta],
                    value: &d.as_ref()[value],
                };
                self.wait_for_write_slot().await;
                let mut placed = self.place(RecordKind::Put, &rec, Some((old, reserve)))?;
                if matches!(placed, Place::NoRoom) && reserve > 0 {
                    // An entry the policy keeps (an acknowledged durable write) is never
                    // dropped to keep room for the record that triggered the reclamation:
                    // that record waits for the next region instead. Reclaiming right after
                    // activating a fresh region (`make_room`), the victim's live entries
                    // always fit in it, as they fitted in the victim.
                    placed = self.place(RecordKind::Put, &rec, Some((old, 0)))?;
                }
                let mut st = sh.state.borrow_mut();
                match placed {
                    Place::Done(_) => {
                        st.counters.entries_rewritten += 1;
                        report.rewritten.push(object);
                    }
                    Place::NoRoom => {
                        if st.index_remove_if(&object.bucket, &object.key, &old) {
                            st.counters.entries_dropped += 1;
                            report.dropped.push(object);
                        }
                    }
                    Place::Absent => {}
                }
            }
            if !report.rewritten.is_empty() {
                self.flush().await?;
            }
        }

        // Invalidate every old record at once: new generation, new nonce.
        let header = {
            let mut st = sh.state.borrow_mut();
            // Anything still pointing into the victim (nothing, unless an entry slipped in
            // between the steps above) goes too.
            let leftovers: Vec<(Rc<str>, Rc<str>, Location)> = st
                .regions
                .get(&victim)
                .map(|i| {
                    i.members
                        .iter()
                        .map(|m| (m.bucket.clone(), m.key.clone(), m.loc))
                        .collect()
                })
                .unwrap_or_default();
            for (b, k, loc) in leftovers {
                if st.index_remove_if(&b, &k, &loc) {
                    st.counters.entries_dropped += 1;
                    report.dropped.push(ObjectName {
                        bucket: b.to_string(),
                        key: k.to_string(),
                    });
                }
            }
            let gen = st.next_gen;
            st.next_gen += 1;
            let header = RegionHeader {
                io_align: sh.geo.io_align as u32,
                region_size: sh.geo.region_size,
                region: victim,
                shard: sh.cfg.shard,
                nshards: sh.cfg.nshards,
                generation: gen,
                nonce: new_nonce(),
            };
            if let Some(info) = st.regions.get_mut(&victim) {
                // From here on, locations into the old generation are stale.
                info.generation = gen;
                info.key = header.sum_key();
                info.fill = 0;
                info.live_bytes = 0;
                info.members = Vec::new();
            }
            header
        };
        let mut block = sh.bdev.alloc_buf(sh.geo.io_align as usize);
        header.encode(block.as_mut());
        let lba = sh.geo.region_lba(victim);
        let written = async {
            sh.bdev.write_blocks(lba, Rc::new(block)).await?;
            sh.bdev.flush().await
        }
        .await;
        if let Err(e) = written {
            // The old header may or may not be on disk; either way the region is not safe to
            // hand out, and records we acknowledged elsewhere are unaffected.
            self.poison(&e.to_string());
            return Err(e.into());
        }
        let mut st = sh.state.borrow_mut();
        if let Some(info) = st.regions.get_mut(&victim) {
            info.state = RegionState::Free;
        }
        st.free.push_back(victim);
        st.counters.regions_reclaimed += 1;
        tracing::debug!(
            region = victim,
            generation,
            dropped = report.dropped.len(),
            readmitted = report.readmitted.len(),
            rewritten = report.rewritten.len(),
            "region reclaimed"
        );
        Ok(report)
    }
}

/// Verifies the record at `loc` inside a whole-region buffer and returns where its metadata
/// and its value are.
fn payload_ranges(
    region: &[u8],
    key: &crate::record::SumKey,
    loc: &Location,
) -> Option<(Range<usize>, Range<usize>)> {
    let start = loc.offset as usize;
    let end = start.checked_add(loc.record_len as usize)?;
    let rec = region.get(start..end)?;
    let hdr = parse_header(key, loc.offset, rec)?;
    if hdr.seq != loc.seq || hdr.kind != RecordKind::Put || hdr.total_len() != loc.record_len() {
        return None;
    }
    verify(key, loc.offset, &hdr, rec).ok()?;
    let (m, v) = (start + hdr.meta_offset(), start + hdr.value_offset());
    Some((m..v, v..end))
}
