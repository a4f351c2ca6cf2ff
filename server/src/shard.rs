//! A shard: one pinned thread that owns a slice of the keys, their index and their DRAM.
//!
//! Requests reach the shard that owns their key in one of two ways: directly, when the
//! connection that carried them was accepted by the owner, or over the glommio channel mesh
//! from the shard that accepted the connection. Either way the owner runs the operation on
//! its own thread, so the data path takes no lock. Each message carries its own typed
//! one-shot reply channel, so a reply can never be matched to the wrong request.
//!
//! Bucket creation and deletion are serialised through shard 0 (the bucket coordinator),
//! which broadcasts them to every shard; every shard keeps a full copy of the bucket list so
//! that HeadBucket and ListBuckets are answered locally.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use futures::channel::oneshot;
use glommio::channels::channel_mesh::Senders;
use yutu_api::{ByteRange, RangeSpec};

use crate::catalog::{BucketRecord, Catalog, Durability};
use crate::config::Settings;
use crate::kv_events::Publisher;
use crate::listing::{ListItem, ListQuery};
use crate::metrics::ShardMetrics;
use crate::multipart::{CompletePart, PartInfo, Upload, UploadInfo};
use crate::s3::conditions::{ReadConditions, WriteConditions};
use crate::store::{ObjectMeta, ShardStore, StoreError};
use yutu_api::block_hash::BlockHash;
use yutu_api::events::{KvEventKind, KvSnapshot, Tier};

pub type Reply<T> = oneshot::Sender<T>;
/// Per key, the leased block and its descriptor (`None`: not in DRAM).
pub type LeaseResult =
    Result<Vec<Option<(crate::kv::BlockRef, yutu_transfer::SegmentDescriptor)>>, StoreError>;
pub type GetResult = Result<(Arc<ObjectMeta>, Option<ByteRange>, Bytes), StoreError>;

/// A message to the owning shard. Every variant carries the channel its answer goes back on.
pub enum Request {
    Put {
        bucket: String,
        key: String,
        data: Bytes,
        meta: ObjectMeta,
        cond: WriteConditions,
        reply: Reply<Result<Arc<ObjectMeta>, StoreError>>,
    },
    Get {
        bucket: String,
        key: String,
        range: Option<RangeSpec>,
        head_only: bool,
        cond: ReadConditions,
        reply: Reply<GetResult>,
    },
    DeleteMany {
        bucket: String,
        keys: Vec<String>,
        reply: Reply<Result<Vec<bool>, StoreError>>,
    },
    CreateUpload {
        id: String,
        upload: Box<Upload>,
        reply: Reply<Result<(), StoreError>>,
    },
    UploadPart {
        id: String,
        bucket: String,
        key: String,
        number: u32,
        data: Bytes,
        etag: String,
        checksum: Option<String>,
        reply: Reply<Result<(), StoreError>>,
    },
    CompleteUpload {
        id: String,
        bucket: String,
        key: String,
        parts: Vec<CompletePart>,
        cond: WriteConditions,
        reply: Reply<Result<Arc<ObjectMeta>, StoreError>>,
    },
    AbortUpload {
        id: String,
        bucket: String,
        key: String,
        reply: Reply<Result<(), StoreError>>,
    },
    ListParts {
        id: String,
        bucket: String,
        key: String,
        after: u32,
        max: usize,
        reply: Reply<Result<Vec<PartInfo>, StoreError>>,
    },
    ListUploads {
        bucket: String,
        prefix: String,
        reply: Reply<Vec<UploadInfo>>,
    },
    KvLease {
        lease_id: u64,
        holder: String,
        bucket: String,
        keys: Vec<String>,
        ttl: std::time::Duration,
        reply: Reply<LeaseResult>,
    },
    KvRelease {
        lease_id: u64,
        holder: String,
        reply: Reply<bool>,
    },
    /// A batch of put-starts on this shard: `(put id, key, length)` each. All or none: on an
    /// error the ones already started are revoked and the failing index is returned.
    KvPutStart {
        holder: String,
        bucket: String,
        items: Vec<(u64, String, u64)>,
        ttl: std::time::Duration,
        reply: Reply<Result<Vec<yutu_transfer::SegmentDescriptor>, (usize, StoreError)>>,
    },
    KvPutEnd {
        put_ids: Vec<u64>,
        holder: String,
        reply: Reply<Vec<Result<Arc<ObjectMeta>, StoreError>>>,
    },
    KvRevoke {
        put_id: u64,
        holder: String,
        reply: Reply<bool>,
    },
    /// get-into for a same-host client: copy each key's block into its mapped target.
    KvCopyOut {
        bucket: String,
        items: Vec<(String, yutu_transfer::DirectRange)>,
        reply: Reply<Result<Vec<crate::kv_direct::Copied>, StoreError>>,
    },
    /// put-from for a same-host client: store each block copied out of its mapped source.
    KvPutFrom {
        bucket: String,
        items: Vec<(String, yutu_transfer::DirectRange)>,
        reply: Reply<Vec<Result<Arc<ObjectMeta>, StoreError>>>,
    },
    /// This shard's arena segment (for a batch the connection's shard submits).
    KvSegment {
        reply: Reply<Option<yutu_transfer::LocalSegment>>,
    },
    KvExists {
        bucket: String,
        keys: Vec<String>,
        reply: Reply<Result<Vec<bool>, StoreError>>,
    },
    /// To shard 0: KV events to number and publish.
    KvEvents {
        events: Vec<KvEventKind>,
        reply: Reply<()>,
    },
    /// Every KV block a shard holds, for a snapshot.
    Blocks {
        reply: Reply<Vec<(String, Tier, Vec<BlockHash>)>>,
    },
    /// Coordinator only (shard 0): a KV snapshot of the node.
    Snapshot {
        reply: Reply<Result<KvSnapshot, ShardError>>,
    },
    List {
        bucket: String,
        query: ListQuery,
        reply: Reply<Result<Vec<ListItem>, StoreError>>,
    },
    AddBucket {
        name: String,
        created: SystemTime,
        owner: String,
        durability: Durability,
        reply: Reply<()>,
    },
    CloseBucket {
        name: String,
        reply: Reply<Result<bool, StoreError>>,
    },
    FinishClose {
        name: String,
        commit: bool,
        reply: Reply<()>,
    },
    /// Coordinator only (shard 0).
    CreateBucket {
        name: String,
        owner: String,
        durability: Durability,
        reply: Reply<Result<(), BucketError>>,
    },
    /// Coordinator only (shard 0).
    DeleteBucket {
        name: String,
        reply: Reply<Result<(), BucketError>>,
    },
}

/// Why a bucket-level operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BucketError {
    #[error("the bucket already exists and is yours")]
    AlreadyOwned,
    #[error("the bucket already exists and belongs to another user")]
    AlreadyExists,
    #[error("the bucket does not exist")]
    NoSuchBucket,
    #[error("the bucket is not empty")]
    NotEmpty,
    #[error("another operation on the bucket is in progress")]
    Conflict,
    #[error(transparent)]
    Shard(#[from] ShardError),
    #[error("{0}")]
    Catalog(String),
}

/// A failure of the shard mesh itself, never of the request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardError {
    #[error("shard {0} is not reachable")]
    Unreachable(usize),
    #[error("shard {0} dropped the request")]
    Dropped(usize),
}

pub struct Shard {
    pub id: usize,
    pub nshards: usize,
    pub settings: Arc<Settings>,
    pub store: RefCell<ShardStore>,
    pub metrics: Arc<ShardMetrics>,
    pub all_metrics: Arc<Vec<Arc<ShardMetrics>>>,
    senders: Option<Senders<Request>>,
    /// Shard 0: numbers and publishes KV events.
    pub publisher: Option<Rc<Publisher>>,
    /// This shard's part of the NVMe tier, when there is one.
    pub nvme: Option<Rc<crate::tier::Nvme>>,
    /// The node's transfer engine and this shard's arena registered with it: KV blocks are
    /// read and written one-sidedly through descriptors into this segment.
    pub transfer: Option<(yutu_transfer::TransferEngine, yutu_transfer::LocalSegment)>,
    /// Lease and put ids handed out by this shard (the shard is in the top 16 bits).
    kv_seq: Cell<u64>,
    /// Serialises bucket creation and deletion on the coordinator.
    bucket_lock: glommio::sync::Semaphore,
    request_seq: Cell<u64>,
}

impl Shard {
    pub fn new(
        id: usize,
        nshards: usize,
        settings: Arc<Settings>,
        store: ShardStore,
        all_metrics: Arc<Vec<Arc<ShardMetrics>>>,
        senders: Option<Senders<Request>>,
    ) -> Shard {
        let publisher =
            (id == 0).then(|| Rc::new(Publisher::new(settings.node_name.clone(), settings.epoch)));
        Shard {
            id,
            nshards,
            settings,
            store: RefCell::new(store),
            metrics: all_metrics[id].clone(),
            all_metrics,
            publisher,
            nvme: None,
            transfer: None,
            kv_seq: Cell::new(0),
            senders,
            bucket_lock: glommio::sync::Semaphore::new(1),
            request_seq: Cell::new(0),
        }
    }

    /// Every KV block this shard holds, by bucket and fastest tier.
    pub fn blocks(&self) -> Vec<(String, Tier, Vec<BlockHash>)> {
        let dram = self.store.borrow().blocks();
        let mut out: Vec<(String, Tier, Vec<BlockHash>)> = Vec::new();
        let mut in_dram = std::collections::HashSet::new();
        for (bucket, blocks) in dram {
            for b in &blocks {
                in_dram.insert((bucket.clone(), *b));
            }
            out.push((bucket, Tier::Dram, blocks));
        }
        if let Some(nvme) = &self.nvme {
            for bucket in nvme.buckets() {
                let mut blocks = Vec::new();
                let mut after: Option<String> = None;
                loop {
                    let chunk = nvme.list(&bucket, "", after.as_deref(), 4096);
                    let Some(last) = chunk.last() else { break };
                    after = Some(last.key.clone());
                    blocks.extend(
                        chunk
                            .iter()
                            .filter_map(|l| BlockHash::from_key(&l.key))
                            .filter(|b| !in_dram.contains(&(bucket.clone(), *b))),
                    );
                }
                if !blocks.is_empty() {
                    out.push((bucket, Tier::Nvme, blocks));
                }
            }
        }
        out
    }

    /// A lease or put id for shard `owner`: unique on the node (owner in the top 16 bits, the
    /// issuing shard in the next 16, a counter below), so it routes back to its owner.
    pub fn kv_id_for(&self, owner: usize) -> u64 {
        let n = self.kv_seq.get() + 1;
        self.kv_seq.set(n);
        ((owner as u64) << 48) | ((self.id as u64 & 0xffff) << 32) | (n & 0xffff_ffff)
    }

    /// The shard that issued a lease or put id.
    pub fn shard_of_id(&self, id: u64) -> Option<usize> {
        let s = (id >> 48) as usize;
        (s < self.nshards).then_some(s)
    }

    /// A request id unique across shards and restarts of the same process.
    pub fn next_request_id(&self) -> String {
        let n = self.request_seq.get() + 1;
        self.request_seq.set(n);
        format!("{:x}-{:x}-{n:x}", std::process::id(), self.id)
    }

    /// The shard that owns `bucket/key`.
    pub fn owner(&self, bucket: &str, key: &str) -> usize {
        yutu_api::placement::shard_for(bucket, key, self.nshards)
    }

    /// Sends a request to `shard` (or runs it here) and waits for its answer.
    pub async fn call<T>(
        self: &Rc<Self>,
        shard: usize,
        make: impl FnOnce(Reply<T>) -> Request,
    ) -> Result<T, ShardError> {
        let (tx, rx) = oneshot::channel();
        let req = make(tx);
        if shard == self.id {
            self.dispatch(req);
        } else {
            let senders = self
                .senders
                .as_ref()
                .ok_or(ShardError::Unreachable(shard))?;
            self.metrics.forwarded.inc();
            if senders.send_to(shard, req).await.is_err() {
                return Err(ShardError::Unreachable(shard));
            }
        }
        rx.await.map_err(|_| ShardError::Dropped(shard))
    }

    /// Calls every shard in turn with requests made by `make`.
    pub async fn broadcast<T>(
        self: &Rc<Self>,
        make: impl Fn(Reply<T>) -> Request,
    ) -> Result<Vec<T>, ShardError> {
        let calls = (0..self.nshards).map(|s| self.call(s, &make));
        futures::future::try_join_all(calls).await
    }

    /// Runs a request that this shard owns. Store operations finish before this returns;
    /// coordinator operations continue in a task of their own.
    pub fn dispatch(self: &Rc<Self>, req: Request) {
        // A dropped receiver means the requester went away (its client disconnected); the
        // operation itself still happened, so an unsent reply is not an error.
        match req {
            Request::Put {
                bucket,
                key,
                data,
                meta,
                cond,
                reply,
            } => self.tiered_put(bucket, key, data, meta, cond, reply),
            Request::Get {
                bucket,
                key,
                range,
                head_only,
                cond,
                reply,
            } => self.tiered_get(bucket, key, range, head_only, cond, reply),
            Request::DeleteMany {
                bucket,
                keys,
                reply,
            } => self.tiered_delete(bucket, keys, reply),
            Request::CreateUpload { id, upload, reply } => {
                let _ = reply.send(self.store.borrow_mut().create_upload(id, *upload));
            }
            Request::UploadPart {
                id,
                bucket,
                key,
                number,
                data,
                etag,
                checksum,
                reply,
            } => {
                let r = self
                    .store
                    .borrow_mut()
                    .upload_part(&id, &bucket, &key, number, &data, etag, checksum);
                let _ = reply.send(r);
            }
            Request::CompleteUpload {
                id,
                bucket,
                key,
                parts,
                cond,
                reply,
            } => {
                let r = self
                    .store
                    .borrow_mut()
                    .complete_upload(&id, &bucket, &key, &parts, &cond);
                let this = self.clone();
                glommio::spawn_local(async move {
                    let r = match r {
                        Ok(meta) => this
                            .write_through_published(&bucket, &key)
                            .await
                            .map(|()| meta),
                        Err(e) => Err(e),
                    };
                    let _ = reply.send(r);
                })
                .detach();
            }
            Request::AbortUpload {
                id,
                bucket,
                key,
                reply,
            } => {
                let _ = reply.send(self.store.borrow_mut().abort_upload(&id, &bucket, &key));
            }
            Request::ListParts {
                id,
                bucket,
                key,
                after,
                max,
                reply,
            } => {
                let r = self
                    .store
                    .borrow_mut()
                    .list_parts(&id, &bucket, &key, after, max);
                let _ = reply.send(r);
            }
            Request::ListUploads {
                bucket,
                prefix,
                reply,
            } => {
                let _ = reply.send(self.store.borrow().list_uploads(&bucket, &prefix));
            }
            Request::List {
                bucket,
                query,
                reply,
            } => {
                let _ = reply.send(self.tiered_list(&bucket, &query));
            }
            Request::AddBucket {
                name,
                created,
                owner,
                durability,
                reply,
            } => {
                self.store
                    .borrow_mut()
                    .add_bucket(&name, created, &owner, durability);
                let _ = reply.send(());
            }
            Request::CloseBucket { name, reply } => {
                let r = self.store.borrow_mut().close_bucket(&name);
                let _ = reply.send(r.map(|empty| empty && !self.nvme_has_bucket(&name)));
            }
            Request::FinishClose {
                name,
                commit,
                reply,
            } => {
                self.store.borrow_mut().finish_close(&name, commit);
                let _ = reply.send(());
            }
            Request::KvLease {
                lease_id,
                holder,
                bucket,
                keys,
                ttl,
                reply,
            } => {
                let r = self
                    .store
                    .borrow_mut()
                    .lease(lease_id, &holder, &bucket, &keys, ttl);
                let _ = reply.send(r.map(|found| {
                    found
                        .into_iter()
                        .map(|b| {
                            let b = b?;
                            let (_, seg) = self.transfer.as_ref()?;
                            let d = seg.descriptor(b.offset, b.len).ok()?;
                            Some((b, d))
                        })
                        .collect()
                }));
            }
            Request::KvRelease {
                lease_id,
                holder,
                reply,
            } => {
                let _ = reply.send(self.store.borrow_mut().release_lease_by(lease_id, &holder));
            }
            Request::KvPutStart {
                holder,
                bucket,
                items,
                ttl,
                reply,
            } => {
                let mut out = Vec::with_capacity(items.len());
                let mut failed = None;
                for (i, (put_id, key, len)) in items.iter().enumerate() {
                    let started = self
                        .store
                        .borrow_mut()
                        .put_start(*put_id, &holder, &bucket, key, *len, ttl);
                    let desc = started.and_then(|offset| {
                        self.transfer
                            .as_ref()
                            .and_then(|(_, seg)| seg.descriptor(offset, *len).ok())
                            .ok_or(StoreError::Device("no transfer engine".into()))
                    });
                    match desc {
                        Ok(d) => out.push(d),
                        Err(e) => {
                            failed = Some((i, e));
                            break;
                        }
                    }
                }
                if let Some((i, e)) = failed {
                    for (put_id, _, _) in &items[..i.min(items.len())] {
                        self.store.borrow_mut().put_revoke(*put_id);
                    }
                    let _ = reply.send(Err((i, e)));
                } else {
                    let _ = reply.send(Ok(out));
                }
            }
            Request::KvPutEnd {
                put_ids,
                holder,
                reply,
            } => {
                let ended: Vec<_> = put_ids
                    .iter()
                    .map(|id| self.store.borrow_mut().put_end_by(*id, &holder))
                    .collect();
                let this = self.clone();
                glommio::spawn_local(async move {
                    // A `disk` bucket's block is on NVMe before put-end is answered.
                    let mut out = Vec::with_capacity(ended.len());
                    for r in ended {
                        out.push(match r {
                            Ok((bucket, key, meta)) => this
                                .write_through_published(&bucket, &key)
                                .await
                                .map(|()| meta),
                            Err(e) => Err(e),
                        });
                    }
                    let _ = reply.send(out);
                })
                .detach();
            }
            Request::KvCopyOut {
                bucket,
                items,
                reply,
            } => {
                let this = self.clone();
                glommio::spawn_local(async move {
                    let _ = reply.send(this.copy_out(bucket, items).await);
                })
                .detach();
            }
            Request::KvPutFrom {
                bucket,
                items,
                reply,
            } => {
                let this = self.clone();
                glommio::spawn_local(async move {
                    let _ = reply.send(this.put_from(bucket, items).await);
                })
                .detach();
            }
            Request::KvSegment { reply } => {
                let _ = reply.send(self.transfer.as_ref().map(|(_, seg)| seg.clone()));
            }
            Request::KvRevoke {
                put_id,
                holder,
                reply,
            } => {
                let _ = reply.send(self.store.borrow_mut().put_revoke_by(put_id, &holder));
            }
            Request::KvExists {
                bucket,
                keys,
                reply,
            } => {
                let r = self.store.borrow().exists(&bucket, &keys).map(|found| {
                    found
                        .into_iter()
                        .zip(&keys)
                        .map(|(f, k)| {
                            f || self
                                .nvme
                                .as_ref()
                                .is_some_and(|n| n.get(&bucket, k).is_some())
                        })
                        .collect()
                });
                let _ = reply.send(r);
            }
            Request::KvEvents { events, reply } => {
                if let Some(p) = &self.publisher {
                    p.append(events);
                }
                let _ = reply.send(());
            }
            Request::Blocks { reply } => {
                let _ = reply.send(self.blocks());
            }
            Request::Snapshot { reply } => {
                let this = self.clone();
                glommio::spawn_local(async move {
                    let _ = reply.send(crate::kv_events::snapshot(&this).await);
                })
                .detach();
            }
            Request::CreateBucket {
                name,
                owner,
                durability,
                reply,
            } => {
                let this = self.clone();
                glommio::spawn_local(async move {
                    let _ = reply.send(this.coordinate_create(name, owner, durability).await);
                })
                .detach();
            }
            Request::DeleteBucket { name, reply } => {
                let this = self.clone();
                glommio::spawn_local(async move {
                    let _ = reply.send(this.coordinate_delete(name).await);
                })
                .detach();
            }
        }
    }

    /// The catalog as it will be with `change` applied (shard 0 knows every bucket).
    fn catalog_with(&self, add: Option<BucketRecord>, remove: Option<&str>) -> Vec<BucketRecord> {
        let mut records: Vec<BucketRecord> = self
            .store
            .borrow()
            .buckets()
            .into_iter()
            .filter(|b| Some(b.name.as_str()) != remove)
            .map(|b| BucketRecord {
                created_ms: BucketRecord::millis(b.created),
                name: b.name,
                owner: b.owner,
                durability: b.durability,
            })
            .collect();
        records.extend(add);
        records
    }

    async fn coordinate_create(
        self: Rc<Self>,
        name: String,
        owner: String,
        durability: Durability,
    ) -> Result<(), BucketError> {
        let _permit = self.bucket_lock.acquire_permit(1).await;
        if let Some(current) = self.store.borrow().bucket_owner(&name) {
            return Err(if current == owner {
                BucketError::AlreadyOwned
            } else {
                BucketError::AlreadyExists
            });
        }
        let created = SystemTime::now();
        // The catalog is written first: a bucket is never acknowledged that a restart loses.
        let record = BucketRecord {
            name: name.clone(),
            created_ms: BucketRecord::millis(created),
            owner: owner.clone(),
            durability,
        };
        let catalog = Catalog::new(&self.settings.data_dir);
        catalog
            .save(&self.catalog_with(Some(record), None))
            .map_err(|e| BucketError::Catalog(e.to_string()))?;
        self.broadcast(|reply| Request::AddBucket {
            name: name.clone(),
            created,
            owner: owner.clone(),
            durability,
            reply,
        })
        .await?;
        tracing::info!(bucket = %name, "bucket created");
        Ok(())
    }

    /// Two-phase delete: every shard closes the bucket to writes and reports whether it is
    /// empty; only if all are empty is the delete committed, otherwise it is rolled back.
    async fn coordinate_delete(self: Rc<Self>, name: String) -> Result<(), BucketError> {
        let _permit = self.bucket_lock.acquire_permit(1).await;
        if !self.store.borrow().bucket_known(&name) {
            return Err(BucketError::NoSuchBucket);
        }
        let answers = self
            .broadcast(|reply| Request::CloseBucket {
                name: name.clone(),
                reply,
            })
            .await?;
        let empty = answers.iter().all(|a| matches!(a, Ok(true)));
        self.broadcast(|reply| Request::FinishClose {
            name: name.clone(),
            commit: empty,
            reply,
        })
        .await?;
        if empty {
            let catalog = Catalog::new(&self.settings.data_dir);
            if let Err(e) = catalog.save(&self.catalog_with(None, Some(&name))) {
                // The bucket is gone from memory; it would come back (empty) after a restart.
                tracing::error!(bucket = %name, error = %e, "cannot record the bucket deletion");
            }
            tracing::info!(bucket = %name, "bucket deleted");
            Ok(())
        } else {
            Err(BucketError::NotEmpty)
        }
    }
}
