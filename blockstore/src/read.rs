//! The read path: every read is verified against the record's checksum and against the
//! location it was asked for, so a caller gets the bytes it appended or an error.
//!
//! A record's bytes may sit in three places at once: on the device (chunks whose writes have
//! completed), in flight, or still in the region buffer. Reads take what is in memory
//! synchronously and read the rest from the device; the region's generation is checked again
//! after the I/O, so a region reclaimed meanwhile yields `Stale`, never its new contents.

use bytes::Bytes;

use crate::bdev::Bdev;
use crate::error::{CorruptKind, StoreError};
use crate::location::Location;
use crate::record::{parse_header, verify, RecordKind, SumKey};
use crate::region::{align_down, align_up};
use crate::store::{Record, RegionStore};

impl<B: Bdev + 'static> RegionStore<B> {
    /// Reads and verifies the value at `loc`. Never returns bytes other than the ones
    /// appended: a checksum mismatch is [`StoreError::Corrupt`] (and the entry is dropped from
    /// the index), a location whose region was reclaimed is [`StoreError::Stale`].
    pub async fn read(&self, loc: Location) -> Result<Bytes, StoreError> {
        Ok(self.read_checked(loc, None).await?.value)
    }

    /// Like [`RegionStore::read`], with the record's metadata.
    pub async fn read_record(&self, loc: Location) -> Result<Record, StoreError> {
        self.read_checked(loc, None).await
    }

    /// Looks `bucket`/`key` up and reads its value; `Ok(None)` if the store does not have it.
    pub async fn read_key(&self, bucket: &str, key: &str) -> Result<Option<Bytes>, StoreError> {
        Ok(self.read_key_record(bucket, key).await?.map(|r| r.value))
    }

    /// Like [`RegionStore::read_key`], with the record's metadata.
    pub async fn read_key_record(
        &self,
        bucket: &str,
        key: &str,
    ) -> Result<Option<Record>, StoreError> {
        // A reclamation can move the entry between the lookup and the read; look again.
        for _ in 0..4 {
            let Some(loc) = self.get(bucket, key) else {
                return Ok(None);
            };
            match self.read_checked(loc, Some((bucket, key))).await {
                Err(StoreError::Stale { .. }) => continue,
                other => return other.map(Some),
            }
        }
        Ok(None)
    }

    async fn read_checked(
        &self,
        loc: Location,
        names: Option<(&str, &str)>,
    ) -> Result<Record, StoreError> {
        let sh = &self.shared;
        let geo = sh.geo;
        let start = u64::from(loc.offset);
        let end = start + loc.record_len();
        let (key, mem) = {
            let st = sh.state.borrow();
            let key = st.current_key(&loc)?;
            let mem = if st.writer.touches_memory(loc.region, start, end) {
                let mut buf = vec![0u8; loc.record_len as usize];
                let missing = st.writer.read_mem(loc.region, start, &mut buf);
                Some((buf, missing))
            } else {
                None
            };
            (key, mem)
        };
        let bs = geo.block_size;
        match mem {
            None => {
                // The common case: one aligned read, verified in glommio's buffer, and one
                // copy of metadata and value into memory the caller owns.
                let (a0, a1) = (align_down(start, bs), align_up(end, bs));
                let data = sh
                    .bdev
                    .read_blocks(geo.lba(loc.region, a0), (a1 - a0) / bs)
                    .await?;
                sh.state.borrow().current_key(&loc)?;
                let rec = &data.as_ref()[(start - a0) as usize..(end - a0) as usize];
                let (m, v) = self.check_record(&key, &loc, rec, names)?;
                let both = Bytes::copy_from_slice(&rec[m..]);
                Ok(Record {
                    meta: both.slice(..v - m),
                    value: both.slice(v - m..),
                })
            }
            Some((mut buf, missing)) => {
                for (s, e) in missing {
                    let (a0, a1) = (align_down(s, bs), align_up(e, bs));
                    let data = sh
                        .bdev
                        .read_blocks(geo.lba(loc.region, a0), (a1 - a0) / bs)
                        .await?;
                    buf[(s - start) as usize..(e - start) as usize]
                        .copy_from_slice(&data.as_ref()[(s - a0) as usize..(e - a0) as usize]);
                }
                sh.state.borrow().current_key(&loc)?;
                let (m, v) = self.check_record(&key, &loc, &buf, names)?;
                let all = Bytes::from(buf);
                Ok(Record {
                    meta: all.slice(m..v),
                    value: all.slice(v..),
                })
            }
        }
    }

    /// Verifies that `rec` is the record `loc` names; returns where its metadata and its
    /// value start within it.
    fn check_record(
        &self,
        key: &SumKey,
        loc: &Location,
        rec: &[u8],
        names: Option<(&str, &str)>,
    ) -> Result<(usize, usize), StoreError> {
        let verdict = match parse_header(key, loc.offset, rec) {
            None => Err(CorruptKind::Header),
            Some(h)
                if h.seq != loc.seq
                    || h.kind != RecordKind::Put
                    || h.total_len() != loc.record_len() =>
            {
                Err(CorruptKind::Mismatch)
            }
            Some(h) => verify(key, loc.offset, &h, rec).and_then(|v| match names {
                Some((b, k)) if v.bucket != b.as_bytes() || v.key != k.as_bytes() => {
                    Err(CorruptKind::Mismatch)
                }
                _ => Ok((h.meta_offset(), h.value_offset())),
            }),
        };
        verdict.map_err(|kind| {
            self.forget_corrupt(loc);
            StoreError::Corrupt {
                region: loc.region,
                offset: loc.offset,
                kind,
            }
        })
    }

    /// Counts a corrupt record and drops the index entry pointing at it, so it is reported
    /// once and then treated as a miss.
    fn forget_corrupt(&self, loc: &Location) {
        let mut st = self.shared.state.borrow_mut();
        st.counters.corrupt_records += 1;
        let name = st.regions.get(&loc.region).and_then(|info| {
            info.members
                .iter()
                .find(|m| m.loc == *loc)
                .map(|m| (m.bucket.clone(), m.key.clone()))
        });
        if let Some((b, k)) = name {
            st.index_remove_if(&b, &k, loc);
        }
        tracing::warn!(
            region = loc.region,
            offset = loc.offset,
            "corrupt record dropped"
        );
    }
}
