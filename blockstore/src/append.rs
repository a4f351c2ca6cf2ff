//! The write path: placing records in the active region, and making room when it is full.
//!
//! Placing is synchronous (a copy into the region buffer, an index update, writes handed to
//! the executor); only waiting for a free write slot and making room await. Making room is
//! serialised by the space lock: seal the active region, activate a free one, and reclaim the
//! oldest region whenever that leaves no free region behind, so one region is always free for
//! the next reclamation to rewrite entries into.

use bytes::Bytes;

use crate::bdev::Bdev;
use crate::error::StoreError;
use crate::location::Location;
use crate::reclaim_policy::Reclaimed;
use crate::record::{align_record, encode_header, record_len, Parts, RecordKind};
use crate::region::{new_nonce, RegionHeader};
use crate::region_info::RegionState;
use crate::store::{check_lengths, Appended, Deleted, NewRecord, Place, RegionStore, State};
use crate::writer::PendingWrite;

impl<B: Bdev + 'static> RegionStore<B> {
    /// Appends `value` under `bucket`/`key` with no metadata; see
    /// [`RegionStore::append_with_meta`].
    pub async fn append(
        &self,
        bucket: &str,
        key: &str,
        value: &[u8],
    ) -> Result<Appended, StoreError> {
        self.append_with_meta(bucket, key, &[], value).await
    }

    /// Appends `value` under `bucket`/`key`, with an opaque metadata blob that is stored in
    /// the record and kept in the index ([`RegionStore::meta`], [`RegionStore::list`]),
    /// replacing any older version in the index.
    ///
    /// Returns once the record is in the region buffer: readable, but durable only after a
    /// [`RegionStore::sync`] (or `flush`) that returns after this call. When the active region
    /// is full this seals it and, if no free region is left, reclaims the oldest; what that
    /// evicted is in [`Appended::reclaimed`].
    pub async fn append_with_meta(
        &self,
        bucket: &str,
        key: &str,
        meta: &[u8],
        value: &[u8],
    ) -> Result<Appended, StoreError> {
        check_lengths(bucket, key, meta)?;
        let need = align_record(record_len(bucket.len(), key.len(), meta.len(), value.len()));
        if need > self.shared.geo.max_record() {
            return Err(StoreError::TooLarge {
                len: value.len() as u64,
                max: self.max_value_len(bucket, key, meta.len()),
            });
        }
        let rec = NewRecord {
            bucket,
            key,
            meta,
            value,
        };
        let mut reclaimed = Vec::new();
        loop {
            self.wait_for_write_slot().await;
            match self.place(RecordKind::Put, &rec, None)? {
                Place::Done(location) => {
                    return Ok(Appended {
                        location,
                        reclaimed,
                    })
                }
                Place::NoRoom | Place::Absent => reclaimed.extend(self.make_room(need).await?),
            }
        }
    }

    /// Deletes `bucket`/`key`: removes it from the index and appends a tombstone, so the
    /// delete survives a restart once synced. A key that is not in the store writes nothing.
    pub async fn delete(&self, bucket: &str, key: &str) -> Result<Deleted, StoreError> {
        check_lengths(bucket, key, &[])?;
        let need = align_record(record_len(bucket.len(), key.len(), 0, 0));
        let rec = NewRecord {
            bucket,
            key,
            meta: &[],
            value: &[],
        };
        let mut reclaimed = Vec::new();
        loop {
            if self.shared.state.borrow().index.get(bucket, key).is_none() {
                return Ok(Deleted {
                    existed: false,
                    seq: None,
                    reclaimed,
                });
            }
            self.wait_for_write_slot().await;
            match self.place(RecordKind::Tombstone, &rec, None)? {
                Place::Done(loc) => {
                    return Ok(Deleted {
                        existed: true,
                        seq: Some(loc.seq),
                        reclaimed,
                    })
                }
                Place::Absent => {
                    return Ok(Deleted {
                        existed: false,
                        seq: None,
                        reclaimed,
                    })
                }
                Place::NoRoom => reclaimed.extend(self.make_room(need).await?),
            }
        }
    }

    /// Waits until another write may be put in flight.
    pub(crate) async fn wait_for_write_slot(&self) {
        let sh = &self.shared;
        let max = sh.cfg.max_inflight_writes;
        sh.signal
            .wait_until(|| {
                let st = sh.state.borrow();
                st.writer.in_flight() < max || st.poisoned.is_some()
            })
            .await;
    }

    /// Places one record in the active region if it fits, without awaiting. With
    /// `replace = Some((old, reserve))` it is a rewrite: it only happens if the index still
    /// points at `old`, and only if `reserve` bytes stay free afterwards.
    pub(crate) fn place(
        &self,
        kind: RecordKind,
        rec: &NewRecord<'_>,
        replace: Option<(Location, u64)>,
    ) -> Result<Place, StoreError> {
        let sh = &self.shared;
        let (bucket, key) = (rec.bucket, rec.key);
        let parts = Parts {
            bucket: bucket.as_bytes(),
            key: key.as_bytes(),
            meta: rec.meta,
            value: rec.value,
        };
        let mut st = sh.state.borrow_mut();
        if let Some(p) = &st.poisoned {
            return Err(StoreError::Poisoned(p.clone()));
        }
        let total = record_len(bucket.len(), key.len(), parts.meta.len(), parts.value.len());
        let mut need = align_record(total);
        if let Some((old, reserve)) = replace {
            if st.index.get(bucket, key) != Some(old) {
                return Ok(Place::Absent);
            }
            need += reserve;
        }
        if kind == RecordKind::Tombstone && st.index.get(bucket, key).is_none() {
            return Ok(Place::Absent);
        }
        let Some(active) = st.writer.active().copied() else {
            return Ok(Place::NoRoom);
        };
        if st.writer.room() < need {
            return Ok(Place::NoRoom);
        }
        let seq = st.next_seq;
        st.next_seq += 1;
        let offset = active.fill as u32;
        let header = encode_header(&active.key, offset, kind, &parts, seq);
        let mut out = Vec::new();
        st.writer.append(
            &sh.bdev,
            &[&header, parts.bucket, parts.key, parts.meta, parts.value],
            &mut out,
        );
        let loc = Location {
            region: active.region,
            offset,
            record_len: total as u32,
            value_len: parts.value.len() as u32,
            generation: active.generation,
            seq,
        };
        match kind {
            RecordKind::Put => {
                st.index_put(bucket, key, loc, Bytes::copy_from_slice(parts.meta));
            }
            RecordKind::Tombstone => {
                st.index_remove(bucket, key);
            }
        }
        st.counters.appended_records += 1;
        st.counters.appended_bytes += parts.value.len() as u64;
        drop(st);
        self.spawn_writes(out);
        Ok(Place::Done(loc))
    }

    /// Hands writes to the executor; each reports back to the writer when it completes.
    pub(crate) fn spawn_writes(&self, writes: Vec<PendingWrite<B::Buf>>) {
        if writes.is_empty() {
            return;
        }
        self.shared.state.borrow_mut().counters.writes_submitted += writes.len() as u64;
        for w in writes {
            let sh = self.shared.clone();
            glommio::spawn_local(async move {
                let res = sh.bdev.write_blocks(w.lba, w.buf).await;
                let mut st = sh.state.borrow_mut();
                st.writer.complete(w.id, w.region, w.chunk);
                if let Err(e) = res {
                    tracing::error!(region = w.region, error = %e, "region write failed");
                    st.poisoned.get_or_insert_with(|| e.to_string());
                }
                drop(st);
                sh.signal.notify_all();
            })
            .detach();
        }
    }

    /// Makes room for a record of `need` bytes: seals the active region, activates a free one,
    /// and reclaims the oldest region whenever that leaves no free region behind (one region is
    /// kept free so that the next reclamation has somewhere to rewrite entries to).
    async fn make_room(&self, need: u64) -> Result<Vec<Reclaimed>, StoreError> {
        let sh = &self.shared;
        let _permit = sh
            .space_lock
            .acquire_permit(1)
            .await
            .map_err(|e| StoreError::Poisoned(e.to_string()))?;
        let mut reports = Vec::new();
        let attempts = sh.state.borrow().regions.len() + 1;
        for _ in 0..attempts {
            let has_active = {
                let mut st = sh.state.borrow_mut();
                if let Some(p) = &st.poisoned {
                    return Err(StoreError::Poisoned(p.clone()));
                }
                if st.writer.room() >= need {
                    return Ok(reports);
                }
                let mut out = Vec::new();
                if let Some((r, fill)) = st.writer.seal(&sh.bdev, &mut out) {
                    if let Some(info) = st.regions.get_mut(&r) {
                        info.state = RegionState::Sealed;
                        info.fill = fill;
                    }
                    st.sealed.push_back(r);
                }
                let activated = self.activate_free(&mut st);
                drop(st);
                self.spawn_writes(out);
                activated
            };
            let free_left = !sh.state.borrow().free.is_empty();
            if !free_left {
                // Without an active region rewrites have nowhere to go: reserve everything.
                let reserve = if has_active { need } else { u64::MAX / 2 };
                match self.reclaim_locked(reserve).await? {
                    Some(r) => reports.push(r),
                    None if !has_active => return Err(StoreError::NoSpace { need }),
                    None => {}
                }
            }
        }
        Err(StoreError::NoSpace { need })
    }

    /// Starts a new incarnation of the first free region as the active one.
    fn activate_free(&self, st: &mut State<B::Buf>) -> bool {
        let sh = &self.shared;
        let Some(r) = st.free.pop_front() else {
            return false;
        };
        let generation = st.next_gen;
        st.next_gen += 1;
        let header = RegionHeader {
            io_align: sh.geo.io_align as u32,
            region_size: sh.geo.region_size,
            region: r,
            shard: sh.cfg.shard,
            nshards: sh.cfg.nshards,
            generation,
            nonce: new_nonce(),
        };
        st.writer.activate(&sh.bdev, &header);
        if let Some(info) = st.regions.get_mut(&r) {
            info.generation = generation;
            info.key = header.sum_key();
            info.state = RegionState::Active;
            info.fill = sh.geo.data_start();
            info.live_bytes = 0;
            info.members.clear();
        }
        true
    }
}
