//! One storage node's event stream: ordering, gaps, restarts and resyncs.
//!
//! The index is only right if it has seen every event of a node, in order. Events travel
//! over HTTP pushes that can be lost, retried or reordered across a node restart, so each
//! node's stream is checked against its sequence numbers (see [`yutu_api::events`] for the
//! contract):
//!
//! - the next expected event (`last_seq + 1`) is applied; an event already applied (a
//!   retried push) is skipped;
//! - anything else means events were missed: the feed enters *resyncing*, buffers what keeps
//!   arriving, and asks for the node's snapshot. The snapshot replaces everything known
//!   about the node; buffered events after the snapshot's `seq` are replayed on top, and the
//!   feed is live again. If the buffer does not continue the snapshot (or overflowed), it
//!   asks for a newer snapshot.
//! - a higher epoch is a restart: the node's DRAM is gone, so its entries are dropped at once,
//!   then resynced (its NVMe tier may have survived). A lower epoch is a late push from
//!   before the restart and is ignored.
//! - with an etcd membership ([`crate::membership`]), a node whose lease is gone has
//!   *departed*: its entries are dropped and its events ignored (it is not routed to, even if
//!   it still pushes from the wrong side of a partition) until it is a member again, when it
//!   is resynced. A member record with a newer run than the events have shown is a restart
//!   announced by etcd before the node's first push: the node is dropped and resynced at
//!   once, and when its events of the new run arrive they are taken as the run the resync is
//!   for, not as a second restart. Either may come first; the node is resynced once.
//!
//! Each resync has a *generation* so that a snapshot fetched for an older resync, arriving
//! late, cannot overwrite a newer state.

use yutu_api::events::{KvEvent, KvEventBatch, KvEventKind, KvSnapshot};

/// Where a feed's decisions are carried out: the index, for one node.
pub trait FeedSink {
    /// Applies one event's change.
    fn apply(&mut self, kind: &KvEventKind);
    /// Forgets everything the node was known to hold.
    fn forget_node(&mut self);
    /// Replaces everything the node holds with the snapshot's contents.
    fn load_snapshot(&mut self, snapshot: &KvSnapshot);
}

/// Why a resync was started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResyncReason {
    /// The first events seen from the node do not start at 1 (the conductor started after
    /// the node, or lost its state).
    FirstContact,
    /// A sequence number was skipped.
    Gap { expected: u64, got: u64 },
    /// The node restarted (higher epoch).
    Restart,
    /// The sequence started over at 1 within one epoch.
    SequenceReset,
    /// Events buffered during a resync were lost (buffer full) or do not continue the
    /// snapshot: a newer snapshot is needed.
    SnapshotBehind,
    /// The node is back in the etcd membership after leaving it, or etcd lists a new run of
    /// it before any of its events did.
    Rejoin,
}

impl ResyncReason {
    /// A metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            ResyncReason::FirstContact => "first_contact",
            ResyncReason::Gap { .. } => "gap",
            ResyncReason::Restart => "restart",
            ResyncReason::SequenceReset => "sequence_reset",
            ResyncReason::SnapshotBehind => "snapshot_behind",
            ResyncReason::Rejoin => "rejoin",
        }
    }
}

/// A resync the caller must serve by fetching the node's snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResyncNeeded {
    pub generation: u64,
    pub reason: ResyncReason,
}

/// What one batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchOutcome {
    pub applied: usize,
    pub duplicates: usize,
    /// Held back until the snapshot arrives.
    pub buffered: usize,
    /// The whole batch belonged to an older epoch and was ignored.
    pub stale: bool,
    /// The whole batch was ignored: the node is not in the etcd membership.
    pub departed: bool,
    /// Set when this batch started a resync.
    pub resync: Option<ResyncNeeded>,
}

/// What a snapshot did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotOutcome {
    /// Applied; `replayed` buffered events were applied on top; the feed is live.
    Synced { replayed: usize },
    /// Applied, but a newer snapshot is needed (fetch again for this generation).
    Again(ResyncNeeded),
    /// Not for the current resync (late, or the feed is live): ignored.
    Ignored,
}

#[derive(Debug)]
enum State {
    Live,
    Resyncing {
        generation: u64,
        buffer: Vec<KvEvent>,
        buffered_blocks: usize,
        /// The highest seq dropped from a full buffer; a snapshot older than this cannot be
        /// completed by replay.
        dropped_through: u64,
        /// The resync was started for a new run that etcd announced before the node's
        /// events: the first batch of a higher epoch is that run, not another restart.
        new_run: bool,
    },
    /// Out of the etcd membership: nothing held, events ignored.
    Departed,
}

/// The stream state of one node.
#[derive(Debug)]
pub struct Feed {
    epoch: Option<u64>,
    last_seq: u64,
    state: State,
    next_generation: u64,
    max_buffer_blocks: usize,
}

impl Feed {
    /// A node never heard from. During a resync at most `max_buffer_blocks` blocks' worth of
    /// events are held.
    pub fn new(max_buffer_blocks: usize) -> Feed {
        Feed {
            epoch: None,
            last_seq: 0,
            state: State::Live,
            next_generation: 1,
            max_buffer_blocks,
        }
    }

    pub fn epoch(&self) -> Option<u64> {
        self.epoch
    }

    /// The last event applied (or included in the snapshot applied).
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// The generation of the resync in progress, if any.
    pub fn resyncing(&self) -> Option<u64> {
        match self.state {
            State::Live | State::Departed => None,
            State::Resyncing { generation, .. } => Some(generation),
        }
    }

    /// Whether the node is out of the etcd membership.
    pub fn departed(&self) -> bool {
        matches!(self.state, State::Departed)
    }

    /// The node left the etcd membership (its lease was revoked or expired): forget what it
    /// held, so nothing is routed to it, and ignore its events until it is back. A resync in
    /// progress is abandoned (its task sees that it is no longer wanted). Returns whether
    /// the node was not departed already.
    pub fn depart(&mut self, sink: &mut impl FeedSink) -> bool {
        if self.departed() {
            return false;
        }
        sink.forget_node();
        self.state = State::Departed;
        true
    }

    /// The node is a member, in the run that started at `started_ms` (its epoch: a node
    /// registers its epoch as `started_ms`), after it joined, came back, or restarted. Returns
    /// the resync to serve, if what the index holds for it cannot be trusted:
    /// - back after leaving: everything was forgotten when it left, and events were ignored
    ///   since; only its snapshot says what it holds now (nothing to do if it never sent
    ///   events: they will start its feed);
    /// - a run newer than the events have shown: the node restarted and its DRAM is gone, so
    ///   it is forgotten and resynced now, without waiting for its first push (which may not
    ///   come soon: a restarted node has nothing to publish about what it recovered).
    ///
    /// A run the events already showed (they came first and started the resync) changes
    /// nothing.
    pub fn on_member(&mut self, started_ms: u64, sink: &mut impl FeedSink) -> Option<ResyncNeeded> {
        let newer = self.epoch.is_some_and(|e| started_ms > e);
        if self.departed() {
            if self.epoch.is_none() {
                self.state = State::Live;
                return None;
            }
            let need = self.start_resync(ResyncReason::Rejoin);
            self.mark_new_run(newer);
            return Some(need);
        }
        if !newer {
            return None;
        }
        sink.forget_node();
        let need = self.start_resync(ResyncReason::Rejoin);
        self.mark_new_run(true);
        Some(need)
    }

    fn mark_new_run(&mut self, value: bool) {
        if let State::Resyncing { new_run, .. } = &mut self.state {
            *new_run = value;
        }
    }

    /// Applies, skips or buffers the batch's events. `batch` must have passed
    /// [`KvEventBatch::validate`] (consecutive seqs from 1 or more).
    pub fn on_batch(&mut self, batch: &KvEventBatch, sink: &mut impl FeedSink) -> BatchOutcome {
        let mut out = BatchOutcome::default();
        if self.departed() {
            // Its snapshot will say what it holds when it is a member again; until then it is
            // not routed to, whatever it publishes.
            out.departed = true;
            return out;
        }
        let epoch = match self.epoch {
            Some(e) if batch.epoch < e => {
                out.stale = true;
                return out;
            }
            Some(e) => e,
            None => {
                // First contact: nothing is known, so unless the stream starts at the very
                // beginning, ask for the snapshot.
                self.epoch = Some(batch.epoch);
                self.last_seq = 0;
                match batch.events.first() {
                    Some(first) if first.seq != 1 => {
                        out.resync = Some(self.start_resync(ResyncReason::FirstContact));
                        self.buffer(&batch.events, &mut out);
                        return out;
                    }
                    _ => batch.epoch,
                }
            }
        };
        if batch.epoch > epoch {
            if let State::Resyncing {
                new_run: true,
                buffer,
                buffered_blocks,
                dropped_through,
                ..
            } = &mut self.state
            {
                // The run etcd announced: the node was forgotten then and its snapshot is
                // on its way. What was buffered belongs to the dead run.
                buffer.clear();
                *buffered_blocks = 0;
                *dropped_through = 0;
                self.mark_new_run(false);
                self.epoch = Some(batch.epoch);
                self.last_seq = 0;
                self.buffer(&batch.events, &mut out);
                return out;
            }
            sink.forget_node();
            self.epoch = Some(batch.epoch);
            self.last_seq = 0;
            out.resync = Some(self.start_resync(ResyncReason::Restart));
            self.buffer(&batch.events, &mut out);
            return out;
        }
        if matches!(self.state, State::Resyncing { .. }) {
            self.buffer(&batch.events, &mut out);
            return out;
        }
        for (k, ev) in batch.events.iter().enumerate() {
            if ev.seq == self.last_seq + 1 {
                sink.apply(&ev.kind);
                self.last_seq = ev.seq;
                out.applied += 1;
            } else if ev.seq == 1 && k == 0 {
                // The stream starts over without a new epoch: the node lost its publisher
                // state. What it holds is unknown until its snapshot says. (A retry of the
                // node's very first push looks the same; telling them apart would need the
                // events' contents, and a needless resync only costs one snapshot.)
                out.resync = Some(self.start_resync(ResyncReason::SequenceReset));
                self.buffer(&batch.events, &mut out);
                return out;
            } else if ev.seq <= self.last_seq {
                out.duplicates += 1;
            } else {
                out.resync = Some(self.start_resync(ResyncReason::Gap {
                    expected: self.last_seq + 1,
                    got: ev.seq,
                }));
                self.buffer(&batch.events[k..], &mut out);
                return out;
            }
        }
        out
    }

    /// Applies the snapshot fetched for resync `generation`.
    pub fn on_snapshot(
        &mut self,
        generation: u64,
        snapshot: &KvSnapshot,
        sink: &mut impl FeedSink,
    ) -> SnapshotOutcome {
        match &self.state {
            State::Resyncing {
                generation: current,
                ..
            } if *current == generation => {}
            _ => return SnapshotOutcome::Ignored,
        }
        let epoch = self.epoch.unwrap_or(snapshot.epoch);
        if snapshot.epoch < epoch {
            // Served by the node's previous run (or a stale copy): useless; keep what is
            // buffered and ask again.
            return SnapshotOutcome::Again(self.next_attempt());
        }
        if snapshot.epoch > epoch {
            // The node restarted after the events we buffered: they describe a dead run.
            if let State::Resyncing {
                buffer,
                buffered_blocks,
                dropped_through,
                ..
            } = &mut self.state
            {
                buffer.clear();
                *buffered_blocks = 0;
                *dropped_through = 0;
            }
            self.epoch = Some(snapshot.epoch);
        }
        sink.load_snapshot(snapshot);
        self.last_seq = snapshot.seq;
        let State::Resyncing {
            buffer,
            dropped_through,
            ..
        } = &mut self.state
        else {
            return SnapshotOutcome::Ignored;
        };
        if *dropped_through > snapshot.seq {
            // Events between the snapshot and what is buffered were dropped.
            return SnapshotOutcome::Again(self.next_attempt());
        }
        let buffer = std::mem::take(buffer);
        let mut replayed = 0;
        for (k, ev) in buffer.iter().enumerate() {
            if ev.seq <= self.last_seq {
                continue;
            }
            if ev.seq != self.last_seq + 1 {
                // The snapshot is older than the first buffered event: keep the rest and ask
                // for a newer one.
                let again = self.start_resync(ResyncReason::SnapshotBehind);
                let mut scratch = BatchOutcome::default();
                self.buffer(&buffer[k..], &mut scratch);
                return SnapshotOutcome::Again(again);
            }
            sink.apply(&ev.kind);
            self.last_seq = ev.seq;
            replayed += 1;
        }
        self.state = State::Live;
        SnapshotOutcome::Synced { replayed }
    }

    /// Starts a resync with an empty buffer.
    fn start_resync(&mut self, reason: ResyncReason) -> ResyncNeeded {
        let generation = self.next_generation;
        self.next_generation += 1;
        self.state = State::Resyncing {
            generation,
            buffer: Vec::new(),
            buffered_blocks: 0,
            dropped_through: 0,
            new_run: false,
        };
        ResyncNeeded { generation, reason }
    }

    /// Asks for another snapshot within the resync in progress, keeping its buffer.
    fn next_attempt(&mut self) -> ResyncNeeded {
        let generation = self.next_generation;
        self.next_generation += 1;
        if let State::Resyncing {
            generation: current,
            ..
        } = &mut self.state
        {
            *current = generation;
        }
        ResyncNeeded {
            generation,
            reason: ResyncReason::SnapshotBehind,
        }
    }

    fn buffer(&mut self, events: &[KvEvent], out: &mut BatchOutcome) {
        let State::Resyncing {
            buffer,
            buffered_blocks,
            dropped_through,
            ..
        } = &mut self.state
        else {
            return;
        };
        for ev in events {
            let blocks = ev.block_count().max(1);
            if *buffered_blocks + blocks > self.max_buffer_blocks {
                // Keep memory bounded: drop what is held and remember how far the loss
                // reaches; the snapshot must then be at least that recent.
                let last = buffer.last().map_or(0, |e| e.seq);
                *dropped_through = (*dropped_through).max(last).max(ev.seq);
                buffer.clear();
                *buffered_blocks = 0;
                continue;
            }
            *buffered_blocks += blocks;
            buffer.push(ev.clone());
            out.buffered += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use yutu_api::block_hash::BlockHash;
    use yutu_api::events::{SnapshotGroup, Tier};

    /// Records what the feed asked for, as a set of held block ids.
    #[derive(Default)]
    struct Held {
        blocks: std::collections::BTreeSet<u64>,
        forgets: usize,
        snapshots: usize,
    }

    fn id(h: &BlockHash) -> u64 {
        (0..1000)
            .find(|i| BlockHash::from_id(*i) == *h)
            .expect("test ids are below 1000")
    }

    impl FeedSink for Held {
        fn apply(&mut self, kind: &KvEventKind) {
            match kind {
                KvEventKind::Stored { blocks, .. } => {
                    self.blocks.extend(blocks.iter().map(id));
                }
                KvEventKind::Removed { blocks, .. } => {
                    for b in blocks {
                        self.blocks.remove(&id(b));
                    }
                }
                KvEventKind::Cleared { .. } => self.blocks.clear(),
            }
        }
        fn forget_node(&mut self) {
            self.forgets += 1;
            self.blocks.clear();
        }
        fn load_snapshot(&mut self, s: &KvSnapshot) {
            self.snapshots += 1;
            self.blocks = s
                .groups
                .iter()
                .flat_map(|g| g.blocks.iter().map(id))
                .collect();
        }
    }

    fn stored(seq: u64, ids: &[u64]) -> KvEvent {
        KvEvent {
            seq,
            kind: KvEventKind::Stored {
                bucket: "llama".into(),
                tier: Tier::Dram,
                blocks: ids.iter().map(|i| BlockHash::from_id(*i)).collect(),
            },
        }
    }

    fn removed(seq: u64, ids: &[u64]) -> KvEvent {
        KvEvent {
            seq,
            kind: KvEventKind::Removed {
                bucket: "llama".into(),
                blocks: ids.iter().map(|i| BlockHash::from_id(*i)).collect(),
            },
        }
    }

    fn batch(epoch: u64, events: Vec<KvEvent>) -> KvEventBatch {
        KvEventBatch {
            node: "a".into(),
            epoch,
            events,
        }
    }

    fn snapshot(epoch: u64, seq: u64, ids: &[u64]) -> KvSnapshot {
        KvSnapshot {
            node: "a".into(),
            epoch,
            seq,
            groups: vec![SnapshotGroup {
                bucket: "llama".into(),
                tier: Tier::Dram,
                blocks: ids.iter().map(|i| BlockHash::from_id(*i)).collect(),
            }],
        }
    }

    fn set(ids: &[u64]) -> std::collections::BTreeSet<u64> {
        ids.iter().copied().collect()
    }

    #[test]
    fn in_order_events_apply_and_retries_are_skipped() {
        let (mut f, mut s) = (Feed::new(100), Held::default());
        let o = f.on_batch(&batch(1, vec![stored(1, &[1, 2]), stored(2, &[3])]), &mut s);
        assert_eq!((o.applied, o.resync), (2, None));
        let o = f.on_batch(&batch(1, vec![stored(2, &[3]), removed(3, &[1])]), &mut s);
        assert_eq!((o.applied, o.duplicates), (1, 1));
        assert_eq!(s.blocks, set(&[2, 3]));
        assert_eq!(f.last_seq(), 3);
        // An empty push (a keep-alive) changes nothing.
        let o = f.on_batch(&batch(1, vec![]), &mut s);
        assert_eq!(o, BatchOutcome::default());
    }

    #[test]
    fn a_gap_resyncs_and_replays_what_follows_the_snapshot() {
        let (mut f, mut s) = (Feed::new(100), Held::default());
        f.on_batch(&batch(1, vec![stored(1, &[1])]), &mut s);
        // Events 2 and 3 are lost; 4 arrives.
        let o = f.on_batch(&batch(1, vec![stored(4, &[4])]), &mut s);
        let need = o.resync.expect("a gap resyncs");
        assert_eq!(
            need.reason,
            ResyncReason::Gap {
                expected: 2,
                got: 4
            }
        );
        assert_eq!(o.buffered, 1);
        assert_eq!(f.resyncing(), Some(need.generation));
        // More events arrive while the snapshot is fetched; they are held, not applied.
        f.on_batch(&batch(1, vec![removed(5, &[2])]), &mut s);
        assert_eq!(s.blocks, set(&[1]));
        // The snapshot covers up to 4 (it includes 2, 3 and 4); 5 is replayed on top.
        let out = f.on_snapshot(need.generation, &snapshot(1, 4, &[1, 2, 3, 4]), &mut s);
        assert_eq!(out, SnapshotOutcome::Synced { replayed: 1 });
        assert_eq!(s.blocks, set(&[1, 3, 4]));
        assert_eq!((f.last_seq(), f.resyncing()), (5, None));
        // Back to normal.
        assert_eq!(
            f.on_batch(&batch(1, vec![stored(6, &[6])]), &mut s).applied,
            1
        );
    }

    #[test]
    fn a_restart_forgets_the_node_and_resyncs() {
        let (mut f, mut s) = (Feed::new(100), Held::default());
        f.on_batch(&batch(1, vec![stored(1, &[1, 2])]), &mut s);
        let o = f.on_batch(&batch(2, vec![stored(1, &[7])]), &mut s);
        assert_eq!(o.resync.map(|r| r.reason), Some(ResyncReason::Restart));
        assert_eq!(s.forgets, 1);
        assert!(s.blocks.is_empty(), "DRAM contents died with the old run");
        // A late push of the old run is ignored.
        assert!(f.on_batch(&batch(1, vec![stored(2, &[9])]), &mut s).stale);
        let gen = o.resync.map(|r| r.generation).unwrap_or_default();
        // The snapshot (what survived on NVMe, before event 1) plus the replayed event 1.
        let out = f.on_snapshot(gen, &snapshot(2, 0, &[2]), &mut s);
        assert_eq!(out, SnapshotOutcome::Synced { replayed: 1 });
        assert_eq!(s.blocks, set(&[2, 7]));
        assert_eq!(f.epoch(), Some(2));
    }

    #[test]
    fn a_sequence_reset_and_a_late_first_contact_resync() {
        let (mut f, mut s) = (Feed::new(100), Held::default());
        let o = f.on_batch(&batch(1, vec![stored(40, &[1])]), &mut s);
        assert_eq!(o.resync.map(|r| r.reason), Some(ResyncReason::FirstContact));
        let gen = o.resync.map(|r| r.generation).unwrap_or_default();
        f.on_snapshot(gen, &snapshot(1, 40, &[1, 2]), &mut s);
        assert_eq!(f.last_seq(), 40);
        let o = f.on_batch(&batch(1, vec![stored(1, &[3])]), &mut s);
        assert_eq!(
            o.resync.map(|r| r.reason),
            Some(ResyncReason::SequenceReset)
        );
    }

    #[test]
    fn stale_or_short_snapshots_ask_again() {
        let (mut f, mut s) = (Feed::new(100), Held::default());
        f.on_batch(&batch(5, vec![stored(1, &[1])]), &mut s);
        let gen = f
            .on_batch(&batch(5, vec![stored(3, &[3]), stored(4, &[4])]), &mut s)
            .resync
            .map(|r| r.generation)
            .unwrap_or_default();
        // From an older run: ask again.
        let again = match f.on_snapshot(gen, &snapshot(4, 9, &[]), &mut s) {
            SnapshotOutcome::Again(r) => r,
            other => panic!("{other:?}"),
        };
        // A snapshot for the superseded generation is ignored.
        assert_eq!(
            f.on_snapshot(gen, &snapshot(5, 3, &[]), &mut s),
            SnapshotOutcome::Ignored
        );
        // Covers only up to 1, but the buffer starts at 3: event 2 is still missing.
        let later = match f.on_snapshot(again.generation, &snapshot(5, 1, &[1]), &mut s) {
            SnapshotOutcome::Again(r) => r,
            other => panic!("{other:?}"),
        };
        // The buffer was kept: a snapshot at 2 completes it.
        let out = f.on_snapshot(later.generation, &snapshot(5, 2, &[1, 2]), &mut s);
        assert_eq!(out, SnapshotOutcome::Synced { replayed: 2 });
        assert_eq!(s.blocks, set(&[1, 2, 3, 4]));
        // Once live, a stray snapshot is ignored.
        assert_eq!(
            f.on_snapshot(later.generation, &snapshot(5, 2, &[]), &mut s),
            SnapshotOutcome::Ignored
        );
    }

    fn generation(need: Option<ResyncNeeded>) -> u64 {
        need.map(|r| r.generation).expect("a resync")
    }

    #[test]
    fn a_departed_node_is_forgotten_ignored_and_resynced_when_back() {
        let (mut f, mut s) = (Feed::new(100), Held::default());
        f.on_batch(&batch(1, vec![stored(1, &[1, 2])]), &mut s);
        assert!(f.depart(&mut s));
        assert!(!f.depart(&mut s), "once");
        assert!(s.blocks.is_empty(), "not routed to any more");
        assert!(f.departed());
        // Whatever it still pushes (from across a partition, or a new run pushing before
        // etcd lists it) is ignored.
        let o = f.on_batch(&batch(1, vec![stored(2, &[3])]), &mut s);
        assert!(o.departed && o.applied == 0 && o.resync.is_none());
        let o = f.on_batch(&batch(9, vec![stored(1, &[4])]), &mut s);
        assert!(o.departed);
        assert!(s.blocks.is_empty());
        // Back (same run): resynced from its snapshot, then live.
        let need = f.on_member(1, &mut s).expect("resync");
        assert_eq!(need.reason, ResyncReason::Rejoin);
        assert!(!f.departed());
        f.on_batch(&batch(1, vec![stored(4, &[4])]), &mut s);
        let out = f.on_snapshot(need.generation, &snapshot(1, 3, &[1, 2, 3]), &mut s);
        assert_eq!(out, SnapshotOutcome::Synced { replayed: 1 });
        assert_eq!(s.blocks, set(&[1, 2, 3, 4]));
        // A node that never sent events comes back with nothing to resync.
        let (mut g, mut t) = (Feed::new(100), Held::default());
        g.depart(&mut t);
        assert_eq!(g.on_member(5, &mut t), None);
        assert_eq!(
            g.on_batch(&batch(5, vec![stored(1, &[1])]), &mut t).applied,
            1
        );
    }

    #[test]
    fn a_departed_node_back_in_a_new_run_takes_its_new_epoch_once() {
        let (mut f, mut s) = (Feed::new(100), Held::default());
        f.on_batch(&batch(1, vec![stored(1, &[1])]), &mut s);
        f.depart(&mut s);
        let gen = generation(f.on_member(2, &mut s));
        // Its first push of run 2 arrives before the snapshot: buffered, no second resync.
        let o = f.on_batch(&batch(2, vec![stored(1, &[5])]), &mut s);
        assert_eq!((o.resync, o.buffered), (None, 1));
        assert_eq!(f.resyncing(), Some(gen));
        let out = f.on_snapshot(gen, &snapshot(2, 0, &[]), &mut s);
        assert_eq!(out, SnapshotOutcome::Synced { replayed: 1 });
        assert_eq!((s.blocks.clone(), f.epoch()), (set(&[5]), Some(2)));
    }

    #[test]
    fn a_restart_etcd_announces_first_is_resynced_once() {
        let (mut f, mut s) = (Feed::new(100), Held::default());
        f.on_batch(&batch(1, vec![stored(1, &[1, 2])]), &mut s);
        // Same run: nothing to do.
        assert_eq!(f.on_member(1, &mut s), None);
        assert_eq!(f.on_member(0, &mut s), None, "an unknown run");
        // etcd lists run 2 before any of its events: forgotten and resynced at once.
        let need = f.on_member(2, &mut s).expect("resync");
        assert_eq!(need.reason, ResyncReason::Rejoin);
        assert!(s.blocks.is_empty());
        // A late push of run 1 is buffered with the resync, then its run 2 events arrive:
        // the run the resync is for, not another restart. Run 1's events are dropped.
        f.on_batch(&batch(1, vec![stored(2, &[9])]), &mut s);
        let o = f.on_batch(&batch(2, vec![stored(1, &[7])]), &mut s);
        assert_eq!((o.resync, o.buffered, s.forgets), (None, 1, 1));
        assert_eq!(f.epoch(), Some(2));
        // A later push of run 1 is stale now.
        assert!(f.on_batch(&batch(1, vec![stored(3, &[9])]), &mut s).stale);
        let out = f.on_snapshot(need.generation, &snapshot(2, 0, &[3]), &mut s);
        assert_eq!(out, SnapshotOutcome::Synced { replayed: 1 });
        assert_eq!(s.blocks, set(&[3, 7]));
        // A run 3 seen in events after that is an ordinary restart again.
        let o = f.on_batch(&batch(3, vec![]), &mut s);
        assert_eq!(o.resync.map(|r| r.reason), Some(ResyncReason::Restart));
    }

    #[test]
    fn a_restart_etcd_announces_first_may_be_answered_by_the_snapshot_alone() {
        let (mut f, mut s) = (Feed::new(100), Held::default());
        f.on_batch(&batch(1, vec![stored(1, &[1])]), &mut s);
        let gen = generation(f.on_member(2, &mut s));
        // The new run's snapshot comes before any of its events.
        let out = f.on_snapshot(gen, &snapshot(2, 3, &[4]), &mut s);
        assert_eq!(out, SnapshotOutcome::Synced { replayed: 0 });
        assert_eq!((f.epoch(), f.last_seq()), (Some(2), 3));
        // Then its events: those the snapshot covers are duplicates, the rest apply.
        let o = f.on_batch(&batch(2, vec![stored(3, &[4]), stored(4, &[5])]), &mut s);
        assert_eq!((o.applied, o.duplicates, o.resync), (1, 1, None));
        assert_eq!(s.blocks, set(&[4, 5]));
    }

    #[test]
    fn a_restart_the_events_showed_first_is_not_resynced_again() {
        let (mut f, mut s) = (Feed::new(100), Held::default());
        f.on_batch(&batch(1, vec![stored(1, &[1])]), &mut s);
        let gen = generation(f.on_batch(&batch(2, vec![]), &mut s).resync);
        // etcd's record of run 2 arrives while that resync is under way: nothing more.
        assert_eq!(f.on_member(2, &mut s), None);
        assert_eq!(f.resyncing(), Some(gen));
        assert_eq!(s.forgets, 1);
    }

    #[test]
    fn an_overflowing_buffer_needs_a_recent_enough_snapshot() {
        let (mut f, mut s) = (Feed::new(2), Held::default());
        f.on_batch(&batch(1, vec![stored(1, &[1])]), &mut s);
        let gen = f
            .on_batch(
                &batch(1, vec![stored(3, &[3]), stored(4, &[4]), stored(5, &[5])]),
                &mut s,
            )
            .resync
            .map(|r| r.generation)
            .unwrap_or_default();
        // 3 and 4 filled the buffer; 5 overflowed it: events through 5 are lost.
        match f.on_snapshot(gen, &snapshot(1, 4, &[1, 3, 4]), &mut s) {
            SnapshotOutcome::Again(r) => assert_eq!(r.reason, ResyncReason::SnapshotBehind),
            other => panic!("{other:?}"),
        }
        let gen = f.resyncing().unwrap_or_default();
        let out = f.on_snapshot(gen, &snapshot(1, 5, &[1, 3, 4, 5]), &mut s);
        assert_eq!(out, SnapshotOutcome::Synced { replayed: 0 });
        assert_eq!(s.blocks, set(&[1, 3, 4, 5]));
    }
}
