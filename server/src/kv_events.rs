//! Publishing KV events to the conductor, and the snapshot it resyncs from.
//!
//! A KV block is an object whose key is a block hash (64 lowercase hex characters). Each
//! shard records `stored` / `removed` / `cleared` events as its store changes and hands them,
//! every few milliseconds, to shard 0. Shard 0 numbers them (one sequence per node and
//! epoch, as `yutu_api::events` requires) and pushes batches to the conductor, retrying with
//! backoff; if the queue overflows while the conductor is away, the oldest events are dropped,
//! which the conductor sees as a gap and answers with a resync from `GET /admin/v1/kv/snapshot`.
//!
//! The snapshot is consistent with its `seq`: shard 0 reads the last assigned number first and
//! only then asks every shard for its blocks, so every event up to `seq` is already reflected
//! in what the shards report; events after it that are also reflected replay idempotently.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::Duration;

use yutu_api::block_hash::BlockHash;
use yutu_api::events::{
    KvEvent, KvEventBatch, KvEventKind, KvSnapshot, SnapshotGroup, Tier, EVENTS_PATH,
};
use yutu_api::route::NodeRegistration;

use crate::http::client::Client;
use crate::shard::{Request, Shard};

/// Events a shard records before they are numbered, coalescing runs of one kind.
#[derive(Default)]
pub struct EventLog {
    pending: Vec<KvEventKind>,
}

impl EventLog {
    /// Appends a block to the last event when it is of the same kind, bucket and tier.
    fn push_block(&mut self, bucket: &str, block: BlockHash, stored: Option<Tier>) {
        match (self.pending.last_mut(), stored) {
            (
                Some(KvEventKind::Stored {
                    bucket: b,
                    blocks,
                    tier,
                }),
                Some(t),
            ) if b == bucket && *tier == t => blocks.push(block),
            (Some(KvEventKind::Removed { bucket: b, blocks }), None) if b == bucket => {
                blocks.push(block)
            }
            _ => self.pending.push(match stored {
                Some(tier) => KvEventKind::Stored {
                    bucket: bucket.to_string(),
                    tier,
                    blocks: vec![block],
                },
                None => KvEventKind::Removed {
                    bucket: bucket.to_string(),
                    blocks: vec![block],
                },
            }),
        }
    }

    /// An object was published in `tier`; an event only if its key is a block hash.
    pub fn stored(&mut self, bucket: &str, key: &str, tier: Tier) {
        if let Some(h) = BlockHash::from_key(key) {
            self.push_block(bucket, h, Some(tier));
        }
    }

    pub fn removed(&mut self, bucket: &str, key: &str) {
        if let Some(h) = BlockHash::from_key(key) {
            self.push_block(bucket, h, None);
        }
    }

    pub fn cleared(&mut self, bucket: &str) {
        self.pending.push(KvEventKind::Cleared {
            bucket: Some(bucket.to_string()),
        });
    }

    pub fn take(&mut self) -> Vec<KvEventKind> {
        std::mem::take(&mut self.pending)
    }
}

/// Most events waiting for the conductor before the oldest are dropped (forcing a resync).
const MAX_QUEUE: usize = 1 << 20;
/// Most events per pushed batch.
const MAX_BATCH: usize = 4096;
/// How often shards hand their events to shard 0, and shard 0 pushes.
const FLUSH_EVERY: Duration = Duration::from_millis(5);

/// Shard 0's numbering and push queue.
pub struct Publisher {
    pub node: String,
    pub epoch: u64,
    seq: Cell<u64>,
    queue: RefCell<VecDeque<KvEvent>>,
}

impl Publisher {
    pub fn new(node: String, epoch: u64) -> Publisher {
        Publisher {
            node,
            epoch,
            seq: Cell::new(0),
            queue: RefCell::new(VecDeque::new()),
        }
    }

    /// The last number given out.
    pub fn last_seq(&self) -> u64 {
        self.seq.get()
    }

    /// Numbers events and queues them for the conductor.
    pub fn append(&self, kinds: Vec<KvEventKind>) {
        let mut q = self.queue.borrow_mut();
        for kind in kinds {
            let seq = self.seq.get() + 1;
            self.seq.set(seq);
            q.push_back(KvEvent { seq, kind });
        }
        while q.len() > MAX_QUEUE {
            q.pop_front();
        }
    }
}

/// Every shard: hand recorded events to shard 0 every few milliseconds.
pub fn spawn_flusher(shard: Rc<Shard>) {
    glommio::spawn_local(async move {
        loop {
            glommio::timer::sleep(FLUSH_EVERY).await;
            let events = shard.store.borrow_mut().take_events();
            if !events.is_empty() {
                let _ = shard
                    .call(0, |reply| Request::KvEvents { events, reply })
                    .await;
            }
        }
    })
    .detach();
}

/// Shard 0: register with the conductor, then push numbered events in order, forever.
pub fn spawn_pusher(shard: Rc<Shard>, conductor: String, advertise: String) {
    glommio::spawn_local(async move {
        let Some(publisher) = shard.publisher.clone() else {
            return;
        };
        let mut client = match Client::new(&conductor, Duration::from_secs(10)) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "KV events are not published");
                return;
            }
        };
        let registration = NodeRegistration {
            node: publisher.node.clone(),
            url: advertise,
        };
        let mut registered = false;
        // After (re-)registering, the first push announces this epoch even with no events:
        // a restarted node publishes nothing for what it recovered from NVMe, and the new
        // epoch is what makes the conductor resync from the snapshot.
        let mut announce = true;
        let mut backoff = Duration::from_millis(100);
        loop {
            if !registered {
                let body = serde_json::to_vec(&registration).unwrap_or_default();
                match client.send(http::Method::POST, "/v1/nodes", Some(body)).await {
                    Ok(r) if (200..300).contains(&r.status) => {
                        tracing::info!(conductor = %conductor, node = %registration.node, "registered with the conductor");
                        registered = true;
                        announce = true;
                        backoff = Duration::from_millis(100);
                    }
                    Ok(r) => tracing::warn!(status = r.status, "the conductor refused the node registration"),
                    Err(e) => tracing::debug!(error = %e, "cannot reach the conductor"),
                }
                if !registered {
                    glommio::timer::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                    continue;
                }
            }
            let batch: Vec<KvEvent> = publisher.queue.borrow().iter().take(MAX_BATCH).cloned().collect();
            if batch.is_empty() && !announce {
                glommio::timer::sleep(FLUSH_EVERY).await;
                continue;
            }
            let sent = batch.len();
            let last = batch.last().map_or(0, |e| e.seq);
            let body = KvEventBatch {
                node: publisher.node.clone(),
                epoch: publisher.epoch,
                events: batch,
            };
            let json = serde_json::to_vec(&body).unwrap_or_default();
            match client.send(http::Method::POST, EVENTS_PATH, Some(json)).await {
                Ok(r) if (200..300).contains(&r.status) => {
                    let mut q = publisher.queue.borrow_mut();
                    while q.front().is_some_and(|e| e.seq <= last) {
                        q.pop_front();
                    }
                    announce = false;
                    backoff = Duration::from_millis(100);
                    shard.metrics.events_published.add(sent as u64);
                }
                Ok(r) => {
                    tracing::warn!(status = r.status, body = %String::from_utf8_lossy(&r.body), "the conductor refused KV events; registering again");
                    registered = false;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "cannot push KV events");
                    glommio::timer::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
    })
    .detach();
}

/// Shard 0: the snapshot at the current sequence number.
pub async fn snapshot(shard: &Rc<Shard>) -> Result<KvSnapshot, crate::shard::ShardError> {
    let (node, epoch, seq) = match &shard.publisher {
        Some(p) => (p.node.clone(), p.epoch, p.last_seq()),
        None => (shard.settings.node_name.clone(), shard.settings.epoch, 0),
    };
    let parts = shard.broadcast(|reply| Request::Blocks { reply }).await?;
    let mut groups: Vec<SnapshotGroup> = Vec::new();
    for (bucket, tier, blocks) in parts.into_iter().flatten() {
        match groups
            .iter_mut()
            .find(|g| g.bucket == bucket && g.tier == tier)
        {
            Some(g) => g.blocks.extend(blocks),
            None => groups.push(SnapshotGroup {
                bucket,
                tier,
                blocks,
            }),
        }
    }
    Ok(KvSnapshot {
        node,
        epoch,
        seq,
        groups,
    })
}
