//! KV events: how a storage node tells the conductor which KV blocks it holds.
//!
//! The conductor routes a request to where its prefix is cached, so it keeps an index of
//! block hash -> holders. Storage nodes feed that index by pushing batches of events
//! (`POST /v1/events` on the conductor, body [`KvEventBatch`] as JSON):
//!
//! ```json
//! {"node": "node-a", "epoch": 1718000000000, "events": [
//!   {"seq": 1, "kind": {"stored":  {"bucket": "llama3-70b", "tier": "dram", "blocks": ["<64 hex>", "..."]}}},
//!   {"seq": 2, "kind": {"removed": {"bucket": "llama3-70b", "blocks": ["<64 hex>"]}}},
//!   {"seq": 3, "kind": {"cleared": {"bucket": null}}}
//! ]}
//! ```
//!
//! Ordering contract, which lets the conductor notice anything it missed:
//! - `seq` numbers the events of one node *and epoch*: consecutive, starting at 1, never reused.
//!   Within a batch they are consecutive too. A batch may be re-sent after a timeout; events
//!   the conductor already applied are skipped.
//! - `epoch` identifies one run of the node and must **increase** on every restart (the node's
//!   start time in milliseconds since the Unix epoch is the suggested value). A restart loses
//!   the DRAM tier, so a new epoch makes the conductor drop what it knew about the node.
//! - When the conductor sees a gap in `seq`, a new epoch, or a sequence that starts over, it
//!   fetches [`KvSnapshot`] from the node at [`SNAPSHOT_PATH`] and replays the events it
//!   buffered meanwhile that come after the snapshot's `seq`.
//!
//! Meaning of the events:
//! - `stored`: the node now serves these blocks from `tier` (the fastest tier it has them in).
//!   A block moving between tiers (DRAM eviction demoting it to NVMe, a promotion back) is
//!   published as `stored` again with the new tier.
//! - `removed`: the node no longer holds these blocks in any tier.
//! - `cleared`: every block of `bucket` (or of every bucket when `null`) is gone, e.g. the
//!   bucket was deleted or an admin evicted it.
//!
//! KV blocks are the objects written through the KV API, whatever their key (engines choose
//! their own: SGLang `"{hash}_{tp_rank}_k"`, LMCache `"{model}@...@{chunk_hash}@{dtype}"`),
//! named by their opaque id [`crate::block_hash::BlockHash::of_key`], and the objects whose key
//! is a block hash ([`crate::block_hash::BlockHash::from_key`]: 64 lowercase hex characters,
//! which `of_key` maps to itself). Other objects (S3 writes under other keys) produce no
//! events. The engines' keys already name a whole prefix, so events carry no parent: a route
//! request gives the chain as the order of its `block_keys`.

use serde::{Deserialize, Serialize};

use crate::block_hash::BlockHash;
use crate::bucket::{validate_bucket_name, BucketNameError};

/// The conductor's endpoint that storage nodes POST their [`KvEventBatch`]es to.
pub const EVENTS_PATH: &str = "/v1/events";

/// The storage-node endpoint that answers a [`KvSnapshot`] (GET, admin scope).
pub const SNAPSHOT_PATH: &str = "/admin/v1/kv/snapshot";

/// The longest node name accepted; names end up in metric labels and log lines.
pub const MAX_NODE_NAME: usize = 128;

/// The storage tier a node serves a block from. Ordered fastest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    Dram,
    Nvme,
}

impl Tier {
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Dram => "dram",
            Tier::Nvme => "nvme",
        }
    }
}

/// One push from a node: its consecutive events since the previous push.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvEventBatch {
    /// The node's name, as registered with the conductor (`POST /v1/nodes`).
    pub node: String,
    /// Increases on every restart of the node.
    pub epoch: u64,
    pub events: Vec<KvEvent>,
}

/// One change in what a node holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvEvent {
    /// Consecutive per node and epoch, from 1.
    pub seq: u64,
    pub kind: KvEventKind,
}

/// What changed. Externally tagged on the wire (`{"stored": {...}}`) so that a parser reads
/// the tag first and never buffers the block list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvEventKind {
    Stored {
        bucket: String,
        tier: Tier,
        blocks: Vec<BlockHash>,
    },
    Removed {
        bucket: String,
        blocks: Vec<BlockHash>,
    },
    Cleared {
        #[serde(default)]
        bucket: Option<String>,
    },
}

/// Everything a node holds, as of event `seq` of `epoch`: the conductor's starting point after
/// a gap or a restart. Served as JSON at [`SNAPSHOT_PATH`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvSnapshot {
    pub node: String,
    pub epoch: u64,
    /// The last event included; events after it are replayed on top. 0 when none was
    /// published yet in this epoch.
    pub seq: u64,
    /// The blocks, grouped by bucket and tier (the same shape as a `stored` event, so that a
    /// snapshot of millions of blocks is not millions of repeated bucket names).
    pub groups: Vec<SnapshotGroup>,
}

/// Blocks of one bucket held in one tier.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotGroup {
    pub bucket: String,
    pub tier: Tier,
    pub blocks: Vec<BlockHash>,
}

/// Why a batch or snapshot was refused as a whole.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    #[error("node name must be 1 to {MAX_NODE_NAME} printable ASCII characters without spaces")]
    NodeName,
    #[error("event sequence numbers start at 1")]
    ZeroSeq,
    #[error("event {next} follows {prev} in one batch; events of a batch are consecutive")]
    NotConsecutive { prev: u64, next: u64 },
    #[error("bucket {bucket:?}: {source}")]
    Bucket {
        bucket: String,
        source: BucketNameError,
    },
}

/// Checks a node name: it is a map key, a metric label and part of log lines.
pub fn validate_node_name(name: &str) -> Result<(), EventError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NODE_NAME
        && name.bytes().all(|b| b.is_ascii_graphic() && b != b'"');
    if ok {
        Ok(())
    } else {
        Err(EventError::NodeName)
    }
}

fn check_bucket(bucket: &str) -> Result<(), EventError> {
    validate_bucket_name(bucket).map_err(|source| EventError::Bucket {
        bucket: bucket.to_owned(),
        source,
    })
}

impl KvEventBatch {
    /// Checks what the index relies on: a valid node name and buckets, sequence numbers from 1
    /// and consecutive within the batch. (Gaps *between* batches are not errors; they trigger a
    /// resync.)
    pub fn validate(&self) -> Result<(), EventError> {
        validate_node_name(&self.node)?;
        let mut prev: Option<u64> = None;
        for ev in &self.events {
            if ev.seq == 0 {
                return Err(EventError::ZeroSeq);
            }
            if let Some(p) = prev {
                if p.checked_add(1) != Some(ev.seq) {
                    return Err(EventError::NotConsecutive {
                        prev: p,
                        next: ev.seq,
                    });
                }
            }
            prev = Some(ev.seq);
            match &ev.kind {
                KvEventKind::Stored { bucket, .. } | KvEventKind::Removed { bucket, .. } => {
                    check_bucket(bucket)?
                }
                KvEventKind::Cleared { bucket: Some(b) } => check_bucket(b)?,
                KvEventKind::Cleared { bucket: None } => {}
            }
        }
        Ok(())
    }

    /// Blocks named by the batch's `stored` and `removed` events (a cost measure).
    pub fn block_count(&self) -> usize {
        self.events.iter().map(KvEvent::block_count).sum()
    }
}

impl KvEvent {
    /// Blocks this event names (0 for `cleared`).
    pub fn block_count(&self) -> usize {
        match &self.kind {
            KvEventKind::Stored { blocks, .. } | KvEventKind::Removed { blocks, .. } => {
                blocks.len()
            }
            KvEventKind::Cleared { .. } => 0,
        }
    }
}

impl KvSnapshot {
    /// Checks the node name and every bucket.
    pub fn validate(&self) -> Result<(), EventError> {
        validate_node_name(&self.node)?;
        for g in &self.groups {
            check_bucket(&g.bucket)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(seq: u64, bucket: &str) -> KvEvent {
        KvEvent {
            seq,
            kind: KvEventKind::Removed {
                bucket: bucket.into(),
                blocks: vec![BlockHash::from_id(seq)],
            },
        }
    }

    #[test]
    fn batches_must_be_consecutive_from_one() {
        let mut b = KvEventBatch {
            node: "node-a".into(),
            epoch: 1,
            events: vec![ev(4, "llama"), ev(5, "llama")],
        };
        assert_eq!(b.validate(), Ok(()));
        assert_eq!(b.block_count(), 2);
        b.events.push(ev(7, "llama"));
        assert_eq!(
            b.validate(),
            Err(EventError::NotConsecutive { prev: 5, next: 7 })
        );
        b.events = vec![ev(0, "llama")];
        assert_eq!(b.validate(), Err(EventError::ZeroSeq));
    }

    #[test]
    fn names_and_buckets_are_checked() {
        let mut b = KvEventBatch {
            node: "node a".into(),
            epoch: 1,
            events: vec![],
        };
        assert_eq!(b.validate(), Err(EventError::NodeName));
        b.node = "x".repeat(MAX_NODE_NAME + 1);
        assert_eq!(b.validate(), Err(EventError::NodeName));
        b.node = "node-a".into();
        b.events = vec![ev(1, "No_Such")];
        assert!(matches!(b.validate(), Err(EventError::Bucket { .. })));
        b.events = vec![KvEvent {
            seq: 1,
            kind: KvEventKind::Cleared { bucket: None },
        }];
        assert_eq!(b.validate(), Ok(()));
        assert_eq!(b.block_count(), 0);
    }

    #[test]
    fn tiers_order_fastest_first() {
        assert!(Tier::Dram < Tier::Nvme);
        assert_eq!(Tier::Nvme.as_str(), "nvme");
    }
}
