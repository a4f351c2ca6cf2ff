//! The prefix index: block hash -> the storage nodes that hold it, and in which tier.
//!
//! Two kinds of entries live here:
//! - **confirmed** holders, from the KV events nodes publish (and their snapshots);
//! - **predicted** holders, written when a request is routed: the prefill node will hold the
//!   request's blocks once it has computed them, but its `stored` event arrives only after
//!   that. Without predictions, a burst of requests sharing a *new* prefix would see no cache
//!   anywhere and be spread over every instance, each recomputing the same prefix. A
//!   prediction expires on its own (it is a guess), is replaced by the confirmed entry when
//!   the event arrives, and is never used as the source of a pull (the blocks do not exist
//!   yet, so nothing can be read from there).
//!
//! Because block hashes are chained, a hash names a whole prefix, and "how much of this
//! prompt does node X hold" is the length of the run of the prompt's hashes, from the first,
//! that X holds. [`PrefixIndex::match_prefix`] computes that run for every node in one pass
//! over the prompt, stopping as soon as no node holds the next block.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use yutu_api::block_hash::BlockHash;
use yutu_api::events::Tier;

use crate::ids::{BucketId, NodeId};
use crate::table::{BlockTable, RawHolder};

/// The largest node id the index can hold (ids are stored in 16 bits, one reserved).
pub const MAX_NODE_ID: u32 = u16::MAX as u32 - 1;

/// Blocks whose slots are looked up together, their cache misses overlapping.
const AHEAD: usize = 16;

/// A block within its bucket: the same tokens in two models are two different blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockKey {
    pub bucket: BucketId,
    pub hash: BlockHash,
}

/// One node holding one block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder {
    pub node: NodeId,
    pub tier: Tier,
    /// A prediction made at routing time rather than a confirmed event.
    pub predicted: bool,
}

impl Holder {
    pub fn is_confirmed(&self) -> bool {
        !self.predicted
    }
}

/// Predictions expire on a 16 ms clock: enough resolution for lifetimes of seconds, and a
/// 32-bit tick lasts two years.
fn tick(ms: u64) -> u32 {
    ((ms >> 4) + 1).min(u64::from(u32::MAX)) as u32
}

fn live(h: &RawHolder, now_tick: u32) -> bool {
    h.expires == 0 || h.expires > now_tick
}

fn tier_code(t: Tier) -> u8 {
    match t {
        Tier::Dram => 0,
        Tier::Nvme => 1,
    }
}

fn node1(node: NodeId) -> Option<u16> {
    (node.0 <= MAX_NODE_ID).then(|| node.0 as u16 + 1)
}

/// Predictions made together, expiring together (one per routed request).
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct PredictionBatch {
    expires_ms: u64,
    node: NodeId,
    bucket: BucketId,
    blocks: Box<[BlockHash]>,
}

/// How much of one prompt one node holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeMatch {
    /// Leading blocks held, counting predicted holders.
    pub any: u32,
    /// Leading blocks held by confirmed entries only (what can be pulled from the node).
    pub confirmed: u32,
    /// Of the `any` blocks, those the node serves from NVMe.
    pub nvme_any: u32,
    /// Of the `confirmed` blocks, those the node serves from NVMe.
    pub nvme_confirmed: u32,
}

/// The result of [`PrefixIndex::match_prefix`], reused across calls to avoid allocating.
#[derive(Debug, Default, Clone)]
pub struct PrefixMatch {
    by_node: Vec<NodeMatch>,
    touched: Vec<NodeId>,
}

impl PrefixMatch {
    /// What `node` holds of the prompt (all zero when nothing).
    pub fn node(&self, node: NodeId) -> NodeMatch {
        self.by_node.get(node.index()).copied().unwrap_or_default()
    }

    /// The nodes that hold at least the first block.
    pub fn holders(&self) -> &[NodeId] {
        &self.touched
    }

    /// The node with the longest confirmed prefix (fewest NVMe blocks on a tie), if any.
    pub fn best_confirmed(&self) -> Option<(NodeId, NodeMatch)> {
        self.touched
            .iter()
            .map(|n| (*n, self.node(*n)))
            .filter(|(_, m)| m.confirmed > 0)
            .max_by(|a, b| {
                a.1.confirmed
                    .cmp(&b.1.confirmed)
                    .then(b.1.nvme_confirmed.cmp(&a.1.nvme_confirmed))
                    .then(b.0.cmp(&a.0))
            })
    }

    /// Forgets the previous answer (a prompt that matches nothing).
    pub fn clear(&mut self) {
        self.reset();
    }

    fn reset(&mut self) {
        for n in self.touched.drain(..) {
            if let Some(m) = self.by_node.get_mut(n.index()) {
                *m = NodeMatch::default();
            }
        }
    }

    fn set(&mut self, node: NodeId, m: NodeMatch) {
        if self.by_node.len() <= node.index() {
            self.by_node.resize(node.index() + 1, NodeMatch::default());
        }
        self.by_node[node.index()] = m;
        self.touched.push(node);
    }
}

/// Per-node progress while walking a prompt's chain.
#[derive(Clone, Copy)]
struct Track {
    node1: u16,
    confirmed_alive: bool,
    m: NodeMatch,
}

/// Block hash -> holders, with predictions.
pub struct PrefixIndex {
    table: BlockTable,
    /// Confirmed entries per node, for metrics and tests.
    confirmed: Vec<u64>,
    predicted: u64,
    expiries: BinaryHeap<Reverse<PredictionBatch>>,
}

impl Default for PrefixIndex {
    fn default() -> Self {
        PrefixIndex::new()
    }
}

impl PrefixIndex {
    pub fn new() -> PrefixIndex {
        PrefixIndex {
            table: BlockTable::default(),
            confirmed: Vec::new(),
            predicted: 0,
            expiries: BinaryHeap::new(),
        }
    }

    /// Room for `blocks` more keys without growing (growing a table of a million blocks is
    /// a latency spike on the ingestion path).
    pub fn reserve(&mut self, blocks: usize) {
        self.table.reserve(blocks);
    }

    /// Distinct blocks with at least one holder (confirmed or predicted).
    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Confirmed (block, node) entries of `node`.
    pub fn confirmed_on(&self, node: NodeId) -> u64 {
        self.confirmed.get(node.index()).copied().unwrap_or(0)
    }

    /// Confirmed (block, node) entries in all.
    pub fn confirmed_total(&self) -> u64 {
        self.confirmed.iter().sum()
    }

    /// Predicted (block, node) entries not yet expired, confirmed or removed.
    pub fn predicted_total(&self) -> u64 {
        self.predicted
    }

    /// The holders of one block, predictions included (expired ones too, until swept).
    pub fn holders(&self, bucket: BucketId, hash: &BlockHash) -> Vec<Holder> {
        let mut out = Vec::new();
        if let Some(i) = self.table.find(bucket.0, &hash.0) {
            self.table.for_each_holder(i, |h| {
                out.push(Holder {
                    node: NodeId(u32::from(h.node1) - 1),
                    tier: if h.tier == 1 { Tier::Nvme } else { Tier::Dram },
                    predicted: h.expires != 0,
                });
                true
            });
        }
        out
    }

    fn count_confirmed(&mut self, node: NodeId, delta: i64) {
        if self.confirmed.len() <= node.index() {
            self.confirmed.resize(node.index() + 1, 0);
        }
        let c = &mut self.confirmed[node.index()];
        *c = c.saturating_add_signed(delta);
    }

    /// Computes the home slots of `chunk`, then starts loading them all: hashing first and
    /// loading after keeps the loads close together, so that they are all in flight at once
    /// instead of each waiting behind the hashing of the next.
    fn homes(&self, bucket: BucketId, chunk: &[BlockHash], out: &mut [usize; AHEAD]) {
        for (slot, h) in out.iter_mut().zip(chunk) {
            *slot = self.table.home(bucket.0, &h.0);
        }
        for slot in &out[..chunk.len()] {
            self.table.prefetch(*slot);
        }
    }

    /// `node` now serves `blocks` from `tier` (a `stored` event).
    pub fn store(&mut self, node: NodeId, bucket: BucketId, blocks: &[BlockHash], tier: Tier) {
        let Some(n1) = node1(node) else {
            return;
        };
        self.table.reserve(blocks.len());
        let mut added = 0i64;
        let mut confirmed_predictions = 0u64;
        let mut homes = [0usize; AHEAD];
        for chunk in blocks.chunks(AHEAD) {
            self.homes(bucket, chunk, &mut homes);
            for (hash, home) in chunk.iter().zip(homes) {
                let i = self.table.find_or_insert_from(home, bucket.0, &hash.0);
                match self.table.holder_mut(i, n1) {
                    Some(h) => {
                        if h.expires != 0 {
                            confirmed_predictions += 1;
                            added += 1;
                        }
                        h.tier = tier_code(tier);
                        h.expires = 0;
                    }
                    None => {
                        self.table.push_holder(
                            i,
                            RawHolder {
                                node1: n1,
                                tier: tier_code(tier),
                                pad: 0,
                                expires: 0,
                            },
                        );
                        added += 1;
                    }
                }
            }
        }
        self.predicted = self.predicted.saturating_sub(confirmed_predictions);
        self.count_confirmed(node, added);
    }

    /// `node` no longer holds `blocks` (a `removed` event); predictions for it go too.
    pub fn remove(&mut self, node: NodeId, bucket: BucketId, blocks: &[BlockHash]) {
        let Some(n1) = node1(node) else {
            return;
        };
        let mut removed_confirmed = 0i64;
        let mut removed_predicted = 0u64;
        let mut homes = [0usize; AHEAD];
        for chunk in blocks.chunks(AHEAD) {
            self.homes(bucket, chunk, &mut homes);
            for (hash, home) in chunk.iter().zip(homes) {
                let Some(i) = self.table.find_from(home, bucket.0, &hash.0) else {
                    continue;
                };
                match self.table.remove_holder(i, n1) {
                    Some(h) if h.expires == 0 => removed_confirmed += 1,
                    Some(_) => removed_predicted += 1,
                    None => {}
                }
            }
        }
        self.predicted = self.predicted.saturating_sub(removed_predicted);
        self.count_confirmed(node, -removed_confirmed);
    }

    /// Drops everything `node` holds, in `bucket` or in every bucket. A full scan: clears
    /// and resyncs are rare, and keeping a per-node key set to avoid the scan would double
    /// the cost of every event.
    pub fn clear(&mut self, node: NodeId, bucket: Option<BucketId>) {
        let Some(n1) = node1(node) else {
            return;
        };
        let mut removed_confirmed = 0i64;
        let mut removed_predicted = 0u64;
        self.table.retain(|b, h| {
            if h.node1 != n1 || bucket.is_some_and(|x| x.0 != b) {
                return true;
            }
            if h.expires == 0 {
                removed_confirmed += 1;
            } else {
                removed_predicted += 1;
            }
            false
        });
        self.predicted = self.predicted.saturating_sub(removed_predicted);
        self.count_confirmed(node, -removed_confirmed);
    }

    /// Predicts that `node` will hold `blocks` until `expires_ms` (unless an event confirms
    /// or removes them first). Blocks the node holds for sure are left alone.
    pub fn predict(
        &mut self,
        node: NodeId,
        bucket: BucketId,
        blocks: &[BlockHash],
        expires_ms: u64,
    ) {
        let Some(n1) = node1(node) else {
            return;
        };
        if blocks.is_empty() {
            return;
        }
        let expires = tick(expires_ms);
        self.table.reserve(blocks.len());
        let mut added = 0u64;
        let mut homes = [0usize; AHEAD];
        for chunk in blocks.chunks(AHEAD) {
            self.homes(bucket, chunk, &mut homes);
            for (hash, home) in chunk.iter().zip(homes) {
                let i = self.table.find_or_insert_from(home, bucket.0, &hash.0);
                match self.table.holder_mut(i, n1) {
                    Some(h) if h.expires == 0 => {}
                    Some(h) => h.expires = h.expires.max(expires),
                    None => {
                        self.table.push_holder(
                            i,
                            RawHolder {
                                node1: n1,
                                tier: tier_code(Tier::Dram),
                                pad: 0,
                                expires,
                            },
                        );
                        added += 1;
                    }
                }
            }
        }
        self.predicted += added;
        self.expiries.push(Reverse(PredictionBatch {
            expires_ms,
            node,
            bucket,
            blocks: blocks.into(),
        }));
    }

    /// Removes predictions that lapsed by `now_ms`. Lookups already ignore them; this frees
    /// their slots, in time proportional to what expired.
    pub fn expire(&mut self, now_ms: u64) {
        let now_tick = tick(now_ms);
        while self
            .expiries
            .peek()
            .is_some_and(|Reverse(b)| b.expires_ms <= now_ms)
        {
            let Some(Reverse(batch)) = self.expiries.pop() else {
                break;
            };
            let Some(n1) = node1(batch.node) else {
                continue;
            };
            let mut homes = [0usize; AHEAD];
            for chunk in batch.blocks.chunks(AHEAD) {
                self.homes(batch.bucket, chunk, &mut homes);
                for (hash, home) in chunk.iter().zip(homes) {
                    let Some(i) = self.table.find_from(home, batch.bucket.0, &hash.0) else {
                        continue;
                    };
                    // Only a prediction that is still lapsed goes: it may have been confirmed
                    // or extended by a later prediction since this batch was queued.
                    let lapsed = self
                        .table
                        .holder(i, n1)
                        .is_some_and(|h| h.expires != 0 && !live(&h, now_tick));
                    if lapsed {
                        self.table.remove_holder(i, n1);
                        self.predicted = self.predicted.saturating_sub(1);
                    }
                }
            }
        }
    }

    /// Whether predictions are due to expire by `now_ms` (so that a caller can run
    /// [`PrefixIndex::expire`] off its latency-critical path).
    pub fn expiry_due(&self, now_ms: u64) -> bool {
        self.expiries
            .peek()
            .is_some_and(|Reverse(b)| b.expires_ms <= now_ms)
    }

    /// For every node, how many leading blocks of `blocks` it holds (see [`NodeMatch`]).
    pub fn match_prefix(
        &self,
        bucket: BucketId,
        blocks: &[BlockHash],
        now_ms: u64,
        out: &mut PrefixMatch,
    ) {
        out.reset();
        let now_tick = tick(now_ms);
        let mut tracks: smallvec::SmallVec<[Track; 16]> = smallvec::SmallVec::new();
        let mut reached = 0u32;
        let mut homes = [0usize; AHEAD];
        'walk: for (c, chunk) in blocks.chunks(AHEAD).enumerate() {
            self.homes(bucket, chunk, &mut homes);
            for (k, (hash, home)) in chunk.iter().zip(homes).enumerate() {
                let i = (c * AHEAD + k) as u32;
                let Some(slot) = self.table.find_from(home, bucket.0, &hash.0) else {
                    break 'walk;
                };
                if i == 0 {
                    self.table.for_each_holder(slot, |h| {
                        if live(h, now_tick) {
                            let nvme = u32::from(h.tier == 1);
                            let confirmed = h.expires == 0;
                            tracks.push(Track {
                                node1: h.node1,
                                confirmed_alive: confirmed,
                                m: NodeMatch {
                                    any: 0,
                                    confirmed: 0,
                                    nvme_any: nvme,
                                    nvme_confirmed: if confirmed { nvme } else { 0 },
                                },
                            });
                        }
                        true
                    });
                } else {
                    tracks.retain(|t| match self.table.holder(slot, t.node1) {
                        Some(h) if live(&h, now_tick) => {
                            let nvme = u32::from(h.tier == 1);
                            t.m.nvme_any += nvme;
                            if t.confirmed_alive {
                                if h.expires == 0 {
                                    t.m.nvme_confirmed += nvme;
                                } else {
                                    t.confirmed_alive = false;
                                    t.m.confirmed = i;
                                }
                            }
                            true
                        }
                        _ => {
                            t.m.any = i;
                            if t.confirmed_alive {
                                t.m.confirmed = i;
                            }
                            out.set(NodeId(u32::from(t.node1) - 1), t.m);
                            false
                        }
                    });
                }
                if tracks.is_empty() {
                    break 'walk;
                }
                reached = i + 1;
            }
        }
        for t in tracks.iter_mut() {
            t.m.any = reached;
            if t.confirmed_alive {
                t.m.confirmed = reached;
            }
            out.set(NodeId(u32::from(t.node1) - 1), t.m);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: BucketId = BucketId(0);
    const A: NodeId = NodeId(0);
    const N1: NodeId = NodeId(1);
    const N2: NodeId = NodeId(2);

    fn chain(ids: std::ops::Range<u64>) -> Vec<BlockHash> {
        ids.map(BlockHash::from_id).collect()
    }

    fn matched(ix: &PrefixIndex, blocks: &[BlockHash], now: u64) -> PrefixMatch {
        let mut m = PrefixMatch::default();
        ix.match_prefix(B, blocks, now, &mut m);
        m
    }

    #[test]
    fn insert_and_longest_prefix_per_node() {
        let mut ix = PrefixIndex::new();
        let p = chain(0..10);
        ix.store(A, B, &p[..6], Tier::Dram);
        ix.store(N1, B, &p[..3], Tier::Dram);
        ix.store(N1, B, &p[3..8], Tier::Nvme);
        // N2 holds blocks 1.. but not 0: a prefix must start at the first block.
        ix.store(N2, B, &p[1..10], Tier::Dram);
        let m = matched(&ix, &p, 0);
        assert_eq!(m.node(A).confirmed, 6);
        assert_eq!(m.node(N1).confirmed, 8);
        assert_eq!(m.node(N1).nvme_confirmed, 5);
        assert_eq!(m.node(N2), NodeMatch::default());
        assert_eq!(m.best_confirmed().map(|b| b.0), Some(N1));
        assert_eq!(ix.confirmed_on(N1), 8);
        assert_eq!(ix.len(), 10);
        // Storing again is idempotent and moves the tier.
        ix.store(N1, B, &p[3..8], Tier::Dram);
        assert_eq!(ix.confirmed_on(N1), 8);
        assert_eq!(matched(&ix, &p, 0).node(N1).nvme_confirmed, 0);
        // A different bucket shares nothing.
        let mut other = PrefixMatch::default();
        ix.match_prefix(BucketId(1), &p, 0, &mut other);
        assert!(other.holders().is_empty());
    }

    #[test]
    fn remove_cuts_the_prefix_and_clear_drops_a_node() {
        let mut ix = PrefixIndex::new();
        let p = chain(0..8);
        ix.store(A, B, &p, Tier::Dram);
        ix.store(N1, B, &p, Tier::Dram);
        ix.remove(A, B, &p[4..5]);
        let m = matched(&ix, &p, 0);
        assert_eq!(m.node(A).confirmed, 4);
        assert_eq!(m.node(N1).confirmed, 8);
        assert_eq!(ix.confirmed_on(A), 7);
        // Removing what is not there changes nothing.
        ix.remove(A, B, &p[4..5]);
        ix.remove(N2, B, &p);
        assert_eq!(ix.confirmed_on(A), 7);
        ix.clear(A, Some(BucketId(9)));
        assert_eq!(ix.confirmed_on(A), 7);
        ix.clear(A, None);
        assert_eq!(ix.confirmed_on(A), 0);
        assert_eq!(matched(&ix, &p, 0).node(A), NodeMatch::default());
        ix.clear(N1, Some(B));
        assert!(ix.is_empty());
    }

    #[test]
    fn predictions_count_locally_expire_and_yield_to_events() {
        let mut ix = PrefixIndex::new();
        let p = chain(0..6);
        ix.store(A, B, &p[..2], Tier::Dram);
        ix.predict(A, B, &p, 1_000);
        ix.predict(N1, B, &p[..3], 500);
        assert_eq!(ix.predicted_total(), 4 + 3);
        let m = matched(&ix, &p, 100);
        assert_eq!(m.node(A).any, 6);
        assert_eq!(
            m.node(A).confirmed,
            2,
            "predicted blocks are never pull sources"
        );
        assert_eq!(m.node(N1).any, 3);
        assert_eq!(m.node(N1).confirmed, 0);
        assert_eq!(m.best_confirmed().map(|b| b.0), Some(A));
        // An event confirms part of a prediction.
        ix.store(A, B, &p[2..4], Tier::Dram);
        assert_eq!(ix.predicted_total(), 2 + 3);
        // Past 500 ms N1's guess is ignored even before it is swept, then swept.
        assert_eq!(matched(&ix, &p, 600).node(N1), NodeMatch::default());
        ix.expire(600);
        assert_eq!(ix.predicted_total(), 2);
        assert!(ix.holders(B, &p[0]).iter().all(|h| h.node == A));
        // A removal takes a prediction with it.
        ix.remove(A, B, &p[5..6]);
        assert_eq!(ix.predicted_total(), 1);
        ix.expire(1_000);
        assert_eq!(ix.predicted_total(), 0);
        assert_eq!(matched(&ix, &p, 1_000).node(A).any, 4);
        assert_eq!(ix.confirmed_on(A), 4);
    }

    #[test]
    fn a_later_prediction_extends_an_earlier_one() {
        let mut ix = PrefixIndex::new();
        let p = chain(0..3);
        ix.predict(A, B, &p, 100);
        ix.predict(A, B, &p, 300);
        assert_eq!(ix.predicted_total(), 3);
        ix.expire(200);
        assert_eq!(matched(&ix, &p, 200).node(A).any, 3);
        ix.expire(300);
        assert!(ix.is_empty());
    }

    #[test]
    fn empty_prompt_and_unknown_blocks_match_nothing() {
        let mut ix = PrefixIndex::new();
        ix.store(A, B, &chain(0..3), Tier::Dram);
        assert!(matched(&ix, &[], 0).holders().is_empty());
        assert!(matched(&ix, &chain(5..9), 0).holders().is_empty());
        let mut m = matched(&ix, &chain(0..3), 0);
        assert_eq!(m.node(A).any, 3);
        // Reuse resets the previous answer.
        ix.match_prefix(B, &chain(7..8), 0, &mut m);
        assert_eq!(m.node(A), NodeMatch::default());
    }
}
