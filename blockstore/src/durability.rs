//! Durability: when an appended record is on stable storage.
//!
//! A record is durable once the writes covering it have completed and a device flush has
//! followed. `flush` pads and submits the partly filled chunk, waits for every write handed out
//! so far, and flushes the device; `sync` does the same only if the record is not durable yet.
//! Flushes are serialised, which makes them a group commit: tasks that queue behind a flush
//! usually find their record covered when they get their turn, and return without I/O.

use crate::bdev::Bdev;
use crate::error::StoreError;
use crate::location::Location;
use crate::store::RegionStore;

impl<B: Bdev + 'static> RegionStore<B> {
    /// Makes every record appended before this call durable.
    pub async fn flush(&self) -> Result<(), StoreError> {
        let _permit = self
            .shared
            .flush_lock
            .acquire_permit(1)
            .await
            .map_err(|e| StoreError::Poisoned(e.to_string()))?;
        self.flush_locked().await
    }

    /// Returns once the record at `loc` is durable (group commit: one device flush covers
    /// every record appended before it, so concurrent callers share flushes).
    pub async fn sync(&self, loc: &Location) -> Result<(), StoreError> {
        self.sync_seq(loc.seq).await
    }

    /// Returns once every record up to sequence number `seq` is durable.
    pub async fn sync_seq(&self, seq: u64) -> Result<(), StoreError> {
        if self.shared.state.borrow().durable_seq >= seq {
            return Ok(());
        }
        let _permit = self
            .shared
            .flush_lock
            .acquire_permit(1)
            .await
            .map_err(|e| StoreError::Poisoned(e.to_string()))?;
        if self.shared.state.borrow().durable_seq >= seq {
            return Ok(());
        }
        self.flush_locked().await
    }

    /// Whether the record at `loc` is known to be durable.
    pub fn is_durable(&self, loc: &Location) -> bool {
        self.shared.state.borrow().durable_seq >= loc.seq
    }

    async fn flush_locked(&self) -> Result<(), StoreError> {
        let sh = &self.shared;
        let (hi, last) = {
            let mut st = sh.state.borrow_mut();
            if let Some(p) = &st.poisoned {
                return Err(StoreError::Poisoned(p.clone()));
            }
            let mut out = Vec::new();
            st.writer.submit_tail(&sh.bdev, &mut out);
            let hi = st.next_seq - 1;
            let last = st.writer.last_id();
            drop(st);
            self.spawn_writes(out);
            (hi, last)
        };
        sh.signal
            .wait_until(|| {
                let st = sh.state.borrow();
                !st.writer.any_in_flight_upto(last) || st.poisoned.is_some()
            })
            .await;
        if let Some(p) = &sh.state.borrow().poisoned {
            return Err(StoreError::Poisoned(p.clone()));
        }
        if let Err(e) = sh.bdev.flush().await {
            self.poison(&e.to_string());
            return Err(e.into());
        }
        let mut st = sh.state.borrow_mut();
        st.durable_seq = st.durable_seq.max(hi);
        Ok(())
    }

    /// Waits until every write submitted so far has completed, without submitting the
    /// partly filled chunk or flushing the device. After it, dropping the store is what a
    /// process crash looks like to the device: what was only in the region buffer is lost.
    pub async fn wait_writes(&self) {
        let sh = &self.shared;
        let last = sh.state.borrow().writer.last_id();
        sh.signal
            .wait_until(|| !sh.state.borrow().writer.any_in_flight_upto(last))
            .await;
    }

    /// Flushes and closes the store.
    pub async fn close(self) -> Result<(), StoreError> {
        self.flush().await
    }
}
