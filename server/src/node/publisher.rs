//! Shard 0's numbering of the node's KV events, and the queue they wait in for the conductor.
//!
//! One sequence per node and epoch, as `yutu_api::events` requires; if the queue overflows
//! while the conductor is away, the oldest events are dropped, which the conductor sees as a
//! gap and answers with a resync from the node's snapshot.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;

use yutu_api::events::{KvEvent, KvEventKind};

/// Most events waiting for the conductor before the oldest are dropped (forcing a resync).
const MAX_QUEUE: usize = 1 << 20;
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

impl Publisher {
    /// Up to `max` of the oldest queued events, in order.
    pub fn peek(&self, max: usize) -> Vec<KvEvent> {
        self.queue.borrow().iter().take(max).cloned().collect()
    }

    /// Forgets the events up to `seq` (the conductor has them).
    pub fn acknowledge(&self, seq: u64) {
        let mut q = self.queue.borrow_mut();
        while q.front().is_some_and(|e| e.seq <= seq) {
            q.pop_front();
        }
    }
}
