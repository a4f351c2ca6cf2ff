//! The node's clock for versions of writes ([`Version`], defined with the wire contracts).
//!
//! Every write of an object (PUT, copy, multipart completion, ACL change) and every delete
//! (kept as a tombstone) carries a [`Version`]. A replica applies a write only when it is
//! newer than what it holds, so two replicas that saw the same writes hold the same bytes.
//! The clock never goes back and is pushed forward by every version the node receives
//! ([`Hlc::observe`]), so a write a node makes after it has seen another is always newer than
//! it, even with the clocks of two hosts apart.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

pub use yutu_api::version::{node_id, Version};

/// A hybrid logical clock, shared by the node's shards.
#[derive(Debug)]
pub struct Hlc {
    last: AtomicU64,
    node: AtomicU32,
}

/// The node's clock: one per process, as there is one node per process. Its node id is set
/// at start ([`Hlc::set_node`]) from the node's name.
pub static CLOCK: Hlc = Hlc::new(1);

fn wall() -> u64 {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    ms << 16
}

impl Hlc {
    pub const fn new(node: u32) -> Hlc {
        Hlc {
            last: AtomicU64::new(0),
            node: AtomicU32::new(if node == 0 { 1 } else { node }),
        }
    }

    /// Sets the id the clock's versions carry (at start, before the first write).
    pub fn set_node(&self, node: u32) {
        self.node.store(node.max(1), Ordering::Relaxed);
    }

    /// A version newer than every version this clock made or saw.
    pub fn now(&self) -> Version {
        self.now_many(1)
    }

    /// The first of `n` consecutive versions, all newer than every version this clock made
    /// or saw (`first.clock + i` for `i < n`, on this clock's node), for one clock read and
    /// one update where a batch of writes would take `n` of each.
    pub fn now_many(&self, n: u64) -> Version {
        let wall = wall();
        let n = n.max(1);
        let mut prev = self.last.load(Ordering::Relaxed);
        loop {
            let first = wall.max(prev.saturating_add(1));
            let last = first.saturating_add(n - 1);
            match self
                .last
                .compare_exchange_weak(prev, last, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => {
                    return Version {
                        clock: first,
                        node: self.node.load(Ordering::Relaxed),
                    }
                }
                Err(p) => prev = p,
            }
        }
    }

    /// Moves the clock past a version received from elsewhere, so this node's next write of
    /// the key is newer than it.
    pub fn observe(&self, v: Version) {
        self.last.fetch_max(v.clock, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_only_moves_forward_and_past_what_it_saw() {
        let hlc = Hlc::new(node_id("n1"));
        let a = hlc.now();
        let b = hlc.now();
        assert!(b > a && !a.is_zero());
        let far = Version {
            clock: b.clock + (1000 << 16),
            node: 7,
        };
        hlc.observe(far);
        let c = hlc.now();
        assert!(
            c.clock > far.clock,
            "a write after seeing a version is newer"
        );
        assert!(a.millis() > 1_600_000_000_000);
        assert_ne!(node_id("a"), node_id("b"));
    }

    #[test]
    fn a_batch_of_versions_is_consecutive_and_older_than_the_next_version() {
        let hlc = Hlc::new(node_id("n1"));
        let before = hlc.now();
        let first = hlc.now_many(256);
        assert!(first > before);
        let next = hlc.now();
        assert!(
            next.clock > first.clock + 255,
            "the batch's last version was handed out"
        );
        assert_eq!(first.node, next.node);
        // A batch of none still hands out one version.
        let one = hlc.now_many(0);
        assert!(one > next && hlc.now() > one);
    }
}
