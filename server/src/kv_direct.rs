//! The same-host fast path of the KV API: the owning shard copies blocks straight between its
//! arena and the client's registered buffer, mapped into the node ([`DirectRange`]).
//!
//! With the client on the same host, a get-into or put-from needs no lease, no pending put
//! and no transfer thread: the owner looks the key up and `memcpy`s, in one step that does
//! not yield, so a reader sees the old block or the whole new one and nothing can evict the
//! bytes mid-copy. Long batches yield between blocks, so one client cannot hold a shard for
//! the length of a 64 MiB batch. Blocks only on NVMe are read (and promoted) as a GET would.

use std::rc::Rc;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use futures::channel::oneshot;
use yutu_transfer::DirectRange;

use crate::catalog::Durability;
use crate::s3::conditions::{ReadConditions, WriteConditions};
use crate::shard::Shard;
use crate::store::{ObjectMeta, StoreError};

/// What a get-into did for one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Copied {
    /// The block's bytes are in the client's buffer.
    Len(u64),
    /// No such key in any tier.
    Missing,
    /// The block did not fit the room the client gave it; nothing was written for it.
    TooSmall { len: u64, room: u64 },
}

/// Metadata of a block written through the KV path (the ETag is set once the bytes are in).
pub(crate) fn kv_meta(len: u64) -> ObjectMeta {
    ObjectMeta {
        size: len,
        etag: String::new(),
        last_modified: SystemTime::now(),
        content_type: None,
        headers: Vec::new(),
        user_meta: Vec::new(),
        checksum: None,
        parts: None,
    }
}

fn copy_into(target: &DirectRange, bytes: &[u8]) -> Copied {
    let (len, room) = (bytes.len() as u64, target.len());
    if len > room {
        return Copied::TooSmall { len, room };
    }
    match target.write_at(0, bytes) {
        Ok(()) => Copied::Len(len),
        // Unreachable after the length check; reported rather than assumed.
        Err(_) => Copied::TooSmall { len, room },
    }
}

impl Shard {
    /// get-into for a same-host client: each key's block copied into its target range.
    pub(crate) async fn copy_out(
        self: Rc<Self>,
        bucket: String,
        items: Vec<(String, DirectRange)>,
    ) -> Result<Vec<Copied>, StoreError> {
        let mut out = Vec::with_capacity(items.len());
        for (key, target) in items {
            let hit = self
                .store
                .borrow_mut()
                .read_with(&bucket, &key, |_, bytes| copy_into(&target, bytes))?;
            let copied = match hit {
                Some(c) => {
                    self.metrics.dram_hits.inc();
                    c
                }
                None => self.copy_out_nvme(&bucket, &key, &target).await?,
            };
            out.push(copied);
            glommio::yield_if_needed().await;
        }
        Ok(out)
    }

    /// A DRAM miss: read from NVMe (promoting it, as a GET does), or report it missing.
    async fn copy_out_nvme(
        self: &Rc<Self>,
        bucket: &str,
        key: &str,
        target: &DirectRange,
    ) -> Result<Copied, StoreError> {
        if self.nvme.is_none() {
            self.metrics.misses.inc();
            return Ok(Copied::Missing);
        }
        let (tx, rx) = oneshot::channel();
        self.tiered_get(
            bucket.to_string(),
            key.to_string(),
            None,
            false,
            ReadConditions::default(),
            tx,
        );
        match rx.await {
            Ok(Ok((_, _, data))) => Ok(copy_into(target, &data)),
            Ok(Err(StoreError::NoSuchKey)) => Ok(Copied::Missing),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(StoreError::Device("the NVMe read was dropped".into())),
        }
    }

    /// put-from for a same-host client: each block copied out of the client's buffer into a
    /// fresh arena range and published. One result per item, in order; the items before a
    /// failed one stay stored.
    pub(crate) async fn put_from(
        self: Rc<Self>,
        bucket: String,
        items: Vec<(String, DirectRange)>,
    ) -> Vec<Result<Arc<ObjectMeta>, StoreError>> {
        let disk = self.nvme.is_some()
            && self.store.borrow().durability(&bucket) == Some(Durability::Disk);
        let mut out = Vec::with_capacity(items.len());
        for (key, source) in items {
            let r = if disk {
                self.put_from_durable(&bucket, key, &source).await
            } else {
                self.put_from_memory(&bucket, &key, &source).await
            };
            out.push(r);
            glommio::yield_if_needed().await;
        }
        out
    }

    /// A `memory` bucket: straight into the arena; an older version on NVMe is tombstoned
    /// before the answer, as for a PUT.
    async fn put_from_memory(
        self: &Rc<Self>,
        bucket: &str,
        key: &str,
        source: &DirectRange,
    ) -> Result<Arc<ObjectMeta>, StoreError> {
        let meta = self.store.borrow_mut().put_filled(
            bucket,
            key,
            source.len(),
            kv_meta(source.len()),
            |dst| source.read_at(0, dst).is_ok(),
        )?;
        if let Some(nvme) = self.nvme.clone() {
            if nvme.get(bucket, key).is_some() {
                nvme.delete(bucket, key)
                    .await
                    .map_err(crate::tier::nvme_error)?;
            }
        }
        Ok(meta)
    }

    /// A `disk` bucket: the bytes are staged once and written through (synced to NVMe before
    /// the answer), exactly as a PUT.
    async fn put_from_durable(
        self: &Rc<Self>,
        bucket: &str,
        key: String,
        source: &DirectRange,
    ) -> Result<Arc<ObjectMeta>, StoreError> {
        let len = usize::try_from(source.len()).map_err(|_| StoreError::TooLarge {
            size: source.len(),
            capacity: self.store.borrow().capacity(),
        })?;
        let mut data = vec![0u8; len];
        source
            .read_at(0, &mut data)
            .map_err(|_| StoreError::InvalidRange { size: source.len() })?;
        let mut meta = kv_meta(source.len());
        meta.etag = self.store.borrow_mut().next_kv_etag();
        let (tx, rx) = oneshot::channel();
        self.tiered_put(
            bucket.to_string(),
            key,
            Bytes::from(data),
            meta,
            WriteConditions::default(),
            tx,
        );
        rx.await
            .unwrap_or_else(|_| Err(StoreError::Device("the write-through was dropped".into())))
    }
}
