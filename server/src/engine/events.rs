//! The KV events a shard records as its store changes, before shard 0 numbers them.
//!
//! A KV block is an object whose key is a block hash (64 lowercase hex characters); only such
//! keys produce events. Runs of one kind, bucket and tier coalesce into one event.

use yutu_api::block_hash::BlockHash;
use yutu_api::events::{KvEventKind, Tier};

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
