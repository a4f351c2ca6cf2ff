//! The KV events a shard records as its store changes, before shard 0 numbers them.
//!
//! A KV block is an object written through the KV API (whatever its key: engines choose their
//! own, published under [`BlockHash::of_key`]) or one whose key is a block hash (64 lowercase
//! hex characters); only KV blocks produce events. Runs of one kind, bucket and tier coalesce
//! into one event.

use yutu_api::block_hash::BlockHash;
use yutu_api::events::{KvEventKind, Tier};

use crate::model::object::block_id;

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

    /// An object was published in `tier`; an event only if it is a KV block: written through
    /// the KV API (`kv`), or under a block-hash key.
    pub fn stored(&mut self, bucket: &str, key: &str, kv: bool, tier: Tier) {
        if let Some(h) = block_id(kv, key) {
            self.push_block(bucket, h, Some(tier));
        }
    }

    /// An object left the node; an event only if it is a KV block (as for [`Self::stored`]).
    pub fn removed(&mut self, bucket: &str, key: &str, kv: bool) {
        if let Some(h) = block_id(kv, key) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn blocks(kind: &KvEventKind) -> &[BlockHash] {
        match kind {
            KvEventKind::Stored { blocks, .. } | KvEventKind::Removed { blocks, .. } => blocks,
            KvEventKind::Cleared { .. } => &[],
        }
    }

    #[test]
    fn kv_api_blocks_are_published_whatever_their_key() {
        let hex = BlockHash::from_id(1).to_key();
        let mut log = EventLog::default();
        // Written through S3: only a block-hash key is a block.
        log.stored("llama", "plain_0_k", false, Tier::Dram);
        log.stored("llama", &hex, false, Tier::Dram);
        // Written through the KV API: any key, under its opaque id.
        log.stored("llama", "abc_0_k", true, Tier::Dram);
        log.stored("llama", "m@1@0@ff@bf16", true, Tier::Dram);
        log.removed("llama", "plain_0_k", false);
        log.removed("llama", "abc_0_k", true);
        let events = log.take();
        assert_eq!(events.len(), 2, "{events:?}");
        assert_eq!(
            blocks(&events[0]),
            [
                BlockHash::from_key(&hex).unwrap(),
                BlockHash::of_key("abc_0_k"),
                BlockHash::of_key("m@1@0@ff@bf16"),
            ]
        );
        assert!(matches!(events[1], KvEventKind::Removed { .. }));
        assert_eq!(blocks(&events[1]), [BlockHash::of_key("abc_0_k")]);
    }
}
