//! The NVMe tier of a shard: DRAM eviction demotes to it, NVMe hits are served from it (and
//! may be promoted back), `disk` buckets write through to it before a PUT is acknowledged.
//!
//! The shard's `ShardStore` stays synchronous; everything here that waits for the device runs
//! in tasks on the shard's own executor, so the two tiers are still owned by one thread:
//!
//! - a GET that misses DRAM (and the demotion queue) reads the record from NVMe, verifying its
//!   checksum; a corrupt record is an error, never wrong bytes;
//! - a PUT into a `memory` bucket publishes in DRAM and writes a tombstone for an older NVMe
//!   version before it answers, so a restart cannot resurrect the older bytes; a PUT into a
//!   `disk` bucket appends to NVMe and syncs before publishing and answering;
//! - a DELETE removes the key from both tiers (tombstone synced for `disk` buckets);
//! - the demoter writes evicted objects to NVMe in eviction order, and writes a tombstone when
//!   the object was replaced or deleted while its append was in flight.
//!
//! Object metadata (ETag, content type, user metadata, checksum) travels in the record's
//! metadata blob and is kept in the NVMe index in DRAM, so HEAD and LIST never read the device.

use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use yutu_api::events::Tier;
use yutu_api::RangeSpec;
use yutu_spdk::{RegionStore, UringBdev};

use crate::catalog::Durability;
use crate::listing::{merge, shard_page, ListItem, ListQuery};
use crate::s3::checksum::{Algorithm, Checksum};
use crate::s3::conditions::{ReadConditions, WriteConditions};
use crate::shard::{GetResult, Reply, Shard};
use crate::store::{serve, ListedMeta, ObjectMeta, StoreError};

pub type Nvme = RegionStore<UringBdev>;

/// NVMe hits no larger than this share of a shard's DRAM are promoted back into DRAM.
const PROMOTE_SHARE: u64 = 16;

/// The metadata blob of an NVMe record.
#[derive(Serialize, Deserialize)]
struct StoredMeta {
    etag: String,
    modified_ms: u64,
    #[serde(default)]
    content_type: Option<String>,
    #[serde(default)]
    headers: Vec<(String, String)>,
    #[serde(default)]
    user_meta: Vec<(String, String)>,
    #[serde(default)]
    checksum: Option<(String, String, Option<u32>)>,
    #[serde(default)]
    parts: Option<u32>,
    /// The object belongs to a `disk` bucket: region reclamation must rewrite it, not drop it.
    #[serde(default)]
    disk: bool,
}

pub fn encode_meta(m: &ObjectMeta, disk: bool) -> Vec<u8> {
    let stored = StoredMeta {
        etag: m.etag.clone(),
        modified_ms: m
            .last_modified
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
        content_type: m.content_type.clone(),
        headers: m.headers.clone(),
        user_meta: m.user_meta.clone(),
        checksum: m.checksum.as_ref().map(|c| {
            (
                c.algorithm.name().to_string(),
                c.value.clone(),
                c.composite_parts,
            )
        }),
        parts: m.parts,
        disk,
    };
    serde_json::to_vec(&stored).unwrap_or_default()
}

/// Decodes a metadata blob; `size` is the record's value length.
pub fn decode_meta(blob: &[u8], size: u64) -> Option<ObjectMeta> {
    let s: StoredMeta = serde_json::from_slice(blob).ok()?;
    Some(ObjectMeta {
        size,
        etag: s.etag,
        last_modified: UNIX_EPOCH + Duration::from_millis(s.modified_ms),
        content_type: s.content_type,
        headers: s.headers,
        user_meta: s.user_meta,
        checksum: s.checksum.and_then(|(alg, value, composite_parts)| {
            Some(Checksum {
                algorithm: Algorithm::from_name(&alg)?,
                value,
                composite_parts,
            })
        }),
        parts: s.parts,
    })
}

pub(crate) fn nvme_error(e: yutu_spdk::StoreError) -> StoreError {
    tracing::error!(error = %e, "NVMe tier");
    StoreError::Device(e.to_string())
}

/// The NVMe version of `bucket/key` with its metadata, from the index in DRAM.
fn nvme_meta(
    nvme: &Nvme,
    bucket: &str,
    key: &str,
) -> Option<(yutu_spdk::Location, Arc<ObjectMeta>)> {
    let loc = nvme.get(bucket, key)?;
    let blob = nvme.meta(bucket, key)?;
    let meta = decode_meta(&blob, loc.value_len())?;
    Some((loc, Arc::new(meta)))
}

impl Shard {
    /// GetObject/HeadObject on the owner: DRAM, then the demotion queue, then NVMe.
    pub(crate) fn tiered_get(
        self: &Rc<Self>,
        bucket: String,
        key: String,
        range: Option<RangeSpec>,
        head_only: bool,
        cond: ReadConditions,
        reply: Reply<GetResult>,
    ) {
        let r = self
            .store
            .borrow_mut()
            .get(&bucket, &key, range, head_only, &cond);
        let Some(nvme) = self.nvme.clone() else {
            self.count_read(&r, false);
            let _ = reply.send(r);
            return;
        };
        if !matches!(r, Err(StoreError::NoSuchKey)) {
            self.count_read(&r, false);
            let _ = reply.send(r);
            return;
        }
        let Some((loc, meta)) = nvme_meta(&nvme, &bucket, &key) else {
            self.metrics.misses.inc();
            let _ = reply.send(r);
            return;
        };
        if head_only {
            self.metrics.nvme_hits.inc();
            let _ = reply.send(serve(&meta, &[], range, true, &cond));
            return;
        }
        let this = self.clone();
        glommio::spawn_local(async move {
            let r = match nvme.read(loc).await {
                Ok(value) => {
                    this.metrics.nvme_hits.inc();
                    let r = serve(&meta, &value, range, false, &cond);
                    this.maybe_promote(&bucket, &key, &meta, &value, loc);
                    r
                }
                Err(e) => Err(nvme_error(e)),
            };
            let _ = reply.send(r);
        })
        .detach();
    }

    fn count_read(&self, r: &GetResult, _nvme: bool) {
        match r {
            Ok(_) | Err(StoreError::NotModified(_)) | Err(StoreError::PreconditionFailed) => {
                self.metrics.dram_hits.inc()
            }
            Err(StoreError::NoSuchKey) => self.metrics.misses.inc(),
            _ => {}
        }
    }

    /// Copies a small NVMe hit back into DRAM, unless a newer version arrived meanwhile.
    fn maybe_promote(
        &self,
        bucket: &str,
        key: &str,
        meta: &Arc<ObjectMeta>,
        value: &[u8],
        loc: yutu_spdk::Location,
    ) {
        let mut store = self.store.borrow_mut();
        if meta.size > store.capacity() / PROMOTE_SHARE || store.has_key(bucket, key) {
            return;
        }
        let still_current = self.nvme.as_ref().and_then(|n| n.get(bucket, key)) == Some(loc);
        if !still_current {
            return;
        }
        if store
            .put(
                bucket,
                key,
                value,
                (**meta).clone(),
                &WriteConditions::default(),
            )
            .is_ok()
        {
            store.mark_on_nvme(bucket, key);
            self.metrics.promotions.inc();
        }
    }

    /// PutObject (and CopyObject) on the owner.
    pub(crate) fn tiered_put(
        self: &Rc<Self>,
        bucket: String,
        key: String,
        data: Bytes,
        meta: ObjectMeta,
        cond: WriteConditions,
        reply: Reply<Result<Arc<ObjectMeta>, StoreError>>,
    ) {
        let Some(nvme) = self.nvme.clone() else {
            let _ = reply.send(
                self.store
                    .borrow_mut()
                    .put(&bucket, &key, &data, meta, &cond),
            );
            return;
        };
        let disk = self.store.borrow().durability(&bucket) == Some(Durability::Disk);
        if !disk {
            let r = self
                .store
                .borrow_mut()
                .put(&bucket, &key, &data, meta, &cond);
            if r.is_err() || nvme.get(&bucket, &key).is_none() {
                let _ = reply.send(r);
                return;
            }
            // An older version is on NVMe: tombstone it before answering.
            glommio::spawn_local(async move {
                let r = match nvme.delete(&bucket, &key).await {
                    Ok(_) => r,
                    Err(e) => Err(nvme_error(e)),
                };
                let _ = reply.send(r);
            })
            .detach();
            return;
        }
        let this = self.clone();
        glommio::spawn_local(async move {
            let _ = reply.send(
                this.write_through(&nvme, &bucket, &key, data, meta, &cond)
                    .await,
            );
        })
        .detach();
    }

    /// Appends to NVMe and syncs, then publishes in DRAM: the `disk` durability path.
    async fn write_through(
        &self,
        nvme: &Nvme,
        bucket: &str,
        key: &str,
        data: Bytes,
        meta: ObjectMeta,
        cond: &WriteConditions,
    ) -> Result<Arc<ObjectMeta>, StoreError> {
        self.store.borrow().check_write(bucket, key, cond)?;
        let blob = encode_meta(&meta, true);
        let max = nvme.max_value_len(bucket, key, blob.len());
        if data.len() as u64 > max {
            return Err(StoreError::TooLarge {
                size: data.len() as u64,
                capacity: max,
            });
        }
        let appended = nvme
            .append_with_meta(bucket, key, &blob, &data)
            .await
            .map_err(nvme_error)?;
        self.after_reclaim(&appended.reclaimed);
        nvme.sync(&appended.location).await.map_err(nvme_error)?;
        let mut store = self.store.borrow_mut();
        // Publish only if no newer write-through of the key got there first.
        if nvme.get(bucket, key) != Some(appended.location) {
            return Ok(Arc::new(meta));
        }
        let stored = match store.put(
            bucket,
            key,
            &data,
            meta.clone(),
            &WriteConditions::default(),
        ) {
            Ok(m) => m,
            // Durable on NVMe even when DRAM has no room for it right now.
            Err(StoreError::TooLarge { .. }) | Err(StoreError::NoSpace(_)) => Arc::new(meta),
            Err(e) => return Err(e),
        };
        store.mark_on_nvme(bucket, key);
        store.record_tier_event(bucket, key, Some(Tier::Dram));
        Ok(stored)
    }

    /// Writes a whole object just published in DRAM through to NVMe (a `disk` bucket's
    /// CompleteMultipartUpload).
    pub(crate) async fn write_through_published(
        &self,
        bucket: &str,
        key: &str,
    ) -> Result<(), StoreError> {
        let Some(nvme) = self.nvme.clone() else {
            return Ok(());
        };
        if self.store.borrow().durability(bucket) != Some(Durability::Disk) {
            return Ok(());
        }
        let (meta, _, data) =
            self.store
                .borrow_mut()
                .get(bucket, key, None, false, &ReadConditions::default())?;
        self.write_through(
            &nvme,
            bucket,
            key,
            data,
            (*meta).clone(),
            &WriteConditions::default(),
        )
        .await
        .map(|_| ())
    }

    /// DeleteObject / DeleteObjects on the owner: both tiers.
    pub(crate) fn tiered_delete(
        self: &Rc<Self>,
        bucket: String,
        keys: Vec<String>,
        reply: Reply<Result<Vec<bool>, StoreError>>,
    ) {
        let r = self.store.borrow_mut().delete_many(&bucket, &keys);
        let Some(nvme) = self.nvme.clone() else {
            let _ = reply.send(r);
            return;
        };
        let Ok(mut existed) = r else {
            let _ = reply.send(r);
            return;
        };
        let on_nvme: Vec<usize> = (0..keys.len())
            .filter(|i| nvme.get(&bucket, &keys[*i]).is_some())
            .collect();
        if on_nvme.is_empty() {
            let _ = reply.send(Ok(existed));
            return;
        }
        let disk = self.store.borrow().durability(&bucket) == Some(Durability::Disk);
        let this = self.clone();
        glommio::spawn_local(async move {
            let mut last_seq = None;
            for i in on_nvme {
                match nvme.delete(&bucket, &keys[i]).await {
                    Ok(d) => {
                        existed[i] = true;
                        last_seq = d.seq.or(last_seq);
                        this.after_reclaim(&d.reclaimed);
                        this.store
                            .borrow_mut()
                            .record_tier_event(&bucket, &keys[i], None);
                    }
                    Err(e) => {
                        let _ = reply.send(Err(nvme_error(e)));
                        return;
                    }
                }
            }
            if disk {
                if let Some(seq) = last_seq {
                    if let Err(e) = nvme.sync_seq(seq).await {
                        let _ = reply.send(Err(nvme_error(e)));
                        return;
                    }
                }
            }
            let _ = reply.send(Ok(existed));
        })
        .detach();
    }

    /// One shard's listing page over both tiers.
    pub(crate) fn tiered_list(
        &self,
        bucket: &str,
        q: &ListQuery,
    ) -> Result<Vec<ListItem>, StoreError> {
        let dram = self.store.borrow().list(bucket, q)?;
        let Some(nvme) = &self.nvme else {
            return Ok(dram);
        };
        let want = q.limit.saturating_add(1);
        // Read the NVMe index in chunks, rolling delimiters up as the DRAM page does, until
        // the page is full or the bucket's keys are exhausted.
        let mut items: Vec<ListItem> = Vec::new();
        let mut after = q.after.clone().filter(|a| a.as_str() >= q.prefix.as_str());
        loop {
            let chunk = nvme.list(bucket, &q.prefix, after.as_deref(), 1000);
            if chunk.is_empty() {
                break;
            }
            after = chunk.last().map(|l| l.key.clone());
            let map: std::collections::BTreeMap<String, ListedMeta> = chunk
                .into_iter()
                .filter_map(|l| {
                    let meta = decode_meta(&l.meta, l.location.value_len())?;
                    Some((l.key, ListedMeta(Arc::new(meta))))
                })
                .collect();
            let page = shard_page(&map, q);
            items = merge(vec![items, page], want).0;
            if items.len() >= want {
                break;
            }
        }
        Ok(merge(vec![dram, items], want).0)
    }

    /// Whether NVMe holds any key of `bucket` (a bucket delete needs both tiers empty).
    pub(crate) fn nvme_has_bucket(&self, bucket: &str) -> bool {
        self.nvme
            .as_ref()
            .is_some_and(|n| !n.list(bucket, "", None, 1).is_empty())
    }

    /// Objects a region reclamation dropped left the node unless DRAM still has them.
    fn after_reclaim(&self, reclaimed: &[yutu_spdk::Reclaimed]) {
        let mut store = self.store.borrow_mut();
        for r in reclaimed {
            for o in &r.dropped {
                if !store.has_key(&o.bucket, &o.key) {
                    store.record_tier_event(&o.bucket, &o.key, None);
                }
            }
        }
    }
}

/// Writes evicted objects to NVMe, in eviction order, forever.
pub fn spawn_demoter(shard: Rc<Shard>) {
    glommio::spawn_local(async move {
        let Some(nvme) = shard.nvme.clone() else {
            return;
        };
        loop {
            let next = shard.store.borrow_mut().next_demotion();
            let Some((bucket, key, meta, data)) = next else {
                glommio::timer::sleep(Duration::from_millis(2)).await;
                continue;
            };
            let blob = encode_meta(&meta, false);
            if data.len() as u64 > nvme.max_value_len(&bucket, &key, blob.len()) {
                shard.store.borrow_mut().finish_demotion(&bucket, &key, &meta);
                shard.store.borrow_mut().record_tier_event(&bucket, &key, None);
                shard.metrics.demotions_dropped.inc();
                continue;
            }
            match nvme.append_with_meta(&bucket, &key, &blob, &data).await {
                Ok(appended) => {
                    shard.after_reclaim(&appended.reclaimed);
                    let current = shard.store.borrow_mut().finish_demotion(&bucket, &key, &meta);
                    if current {
                        shard.metrics.demotions.inc();
                    } else if !shard.store.borrow().newer_than_nvme(&bucket, &key)
                        || nvme.get(&bucket, &key) == Some(appended.location)
                    {
                        // Replaced or deleted while the append was in flight: the record just
                        // written is stale, and must not outlive a restart.
                        if let Err(e) = nvme.delete(&bucket, &key).await {
                            tracing::error!(error = %e, bucket, key, "cannot tombstone a stale demotion");
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, bucket, key, "demotion failed; the object is dropped");
                    shard.store.borrow_mut().finish_demotion(&bucket, &key, &meta);
                    shard.store.borrow_mut().record_tier_event(&bucket, &key, None);
                    shard.metrics.demotions_dropped.inc();
                }
            }
        }
    })
    .detach();
}

/// Refreshes the NVMe gauges every second.
pub fn spawn_stats(shard: Rc<Shard>) {
    glommio::spawn_local(async move {
        let Some(nvme) = shard.nvme.clone() else {
            return;
        };
        loop {
            let s = nvme.stats();
            let m = &shard.metrics;
            m.nvme_used.set(s.used_bytes);
            m.nvme_capacity.set(s.capacity_bytes);
            m.nvme_objects.set(s.records);
            m.nvme_reclaimed_regions.set(s.regions_reclaimed);
            m.nvme_corrupt_records.set(s.corrupt_records);
            glommio::timer::sleep(Duration::from_secs(1)).await;
        }
    })
    .detach();
}

/// Opens (creating and preallocating it if needed) this shard's part of the NVMe file.
pub async fn open(
    path: &std::path::Path,
    capacity: u64,
    shard: u32,
    nshards: u32,
) -> Result<Nvme, String> {
    let bdev = UringBdev::open(path)
        .await
        .map_err(|e| format!("cannot open the NVMe tier {}: {e}", path.display()))?;
    let mut config = yutu_spdk::StoreConfig::for_shard(shard, nshards);
    config.region_size = region_size(capacity, nshards);
    // Reclaiming a region drops the demoted copies of `memory` objects (the tier is a cache)
    // but rewrites `disk` objects forward: they were acknowledged as durable.
    let policy = |c: &yutu_spdk::ReclaimCandidate<'_>| {
        let disk = serde_json::from_slice::<StoredMeta>(c.meta).is_ok_and(|m| m.disk);
        if disk {
            yutu_spdk::ReclaimAction::Rewrite
        } else {
            yutu_spdk::ReclaimAction::Drop
        }
    };
    RegionStore::open_with_policy(bdev, config, Box::new(policy))
        .await
        .map_err(|e| format!("cannot open the NVMe tier {}: {e}", path.display()))
}

/// Regions of 1 to 64 MiB, at least 8 per shard: large enough for sequential writes, small
/// enough that reclaiming one frees a modest share of the tier.
pub fn region_size(capacity: u64, nshards: u32) -> u64 {
    let per_shard = capacity / nshards.max(1) as u64;
    let size = (per_shard / 8).clamp(1 << 20, 64 << 20);
    size & !((1 << 20) - 1)
}

/// Prepares the NVMe file before the shards open it: created and preallocated once, with its
/// first block written (glommio's poll-ring probe must read real data, see `yutu-spdk`).
pub fn prepare_file(path: &std::path::Path, capacity: u64) -> Result<(), String> {
    UringBdev::prepare_file(path, capacity).map_err(|e| e.to_string())
}
