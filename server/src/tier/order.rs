//! One order for the durable writes of a key.
//!
//! A durable write appends its record to NVMe, waits for the sync, and only then publishes
//! the object in DRAM. Two such writes of one key used to run side by side: the NVMe index
//! took them in the order they were placed, the DRAM copy in the order their syncs came
//! back, and a write that found a newer record placed after its own skipped the DRAM update,
//! answered 200, and left readers with the version *before* both until the newer write got
//! there. A reader after the first acknowledgement could so see a version that was already
//! overwritten when the acknowledged write started.
//!
//! So the durable writes of one key take turns: a write holds its key's turn from before its
//! version is checked until it is published (or refused), and the next write of the key
//! starts only then. Placement on NVMe, the DRAM update and the acknowledgement then follow
//! the same order, and a write that finds a newer version already applied is answered as
//! overwritten without being appended (see `TieredStore::append_and_publish`). Turns are
//! handed out first come, first served; different keys never wait for each other. Memory
//! bucket writes need no turn: they are applied synchronously on the shard.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use glommio::sync::{Semaphore, StaticPermit};

use super::KeyName;
use crate::model::StoreError;

/// The keys whose durable writes are taking turns, each with its turn and how many writes
/// hold or wait for it (so the entry goes when the last one is done).
type Turns = Rc<RefCell<HashMap<KeyName, (Rc<Semaphore>, u32)>>>;

/// Hands out turns to the durable writes of each key, one at a time, in arrival order.
#[derive(Default)]
pub(super) struct KeyOrder {
    turns: Turns,
}

/// A write's turn on its key: the next write of the key waits until this is dropped.
pub(super) struct KeyTurn {
    // Dropped before `_waiting`, so the next writer is woken before the entry is counted out.
    _permit: StaticPermit,
    _waiting: Waiting,
}

/// Counts a write in its key's entry while it waits or holds the turn, also when its future
/// is dropped while waiting.
struct Waiting {
    turns: Turns,
    name: KeyName,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut turns = self.turns.borrow_mut();
        if let Some((_, n)) = turns.get_mut(&self.name) {
            *n -= 1;
            if *n == 0 {
                turns.remove(&self.name);
            }
        }
    }
}

impl KeyOrder {
    /// Waits for the turn of `bucket/key`.
    pub(super) async fn turn(&self, bucket: &str, key: &str) -> Result<KeyTurn, StoreError> {
        let name = (bucket.to_string(), key.to_string());
        let semaphore = {
            let mut turns = self.turns.borrow_mut();
            let (s, n) = turns
                .entry(name.clone())
                .or_insert_with(|| (Rc::new(Semaphore::new(1)), 0));
            *n += 1;
            s.clone()
        };
        let waiting = Waiting {
            turns: self.turns.clone(),
            name,
        };
        // The semaphore is never closed (only this type sees it), so this does not fail.
        let permit = semaphore
            .acquire_static_permit(1)
            .await
            .map_err(|e| StoreError::Device(format!("the write order of a key was closed: {e}")))?;
        Ok(KeyTurn {
            _permit: permit,
            _waiting: waiting,
        })
    }

    /// Keys with a turn held or waited for (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.turns.borrow().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn writes_of_one_key_take_turns_in_arrival_order_and_others_do_not_wait() {
        glommio::LocalExecutor::default().run(async {
            let order = Rc::new(KeyOrder::default());
            let log = Rc::new(RefCell::new(Vec::new()));
            let first = order.turn("b", "k").await.expect("turn");
            let spawned: Vec<_> = (1..=3)
                .map(|i| {
                    let (order, log) = (order.clone(), log.clone());
                    glommio::spawn_local(async move {
                        let _turn = order.turn("b", "k").await.expect("turn");
                        log.borrow_mut().push(i);
                        glommio::executor().yield_task_queue_now().await;
                    })
                })
                .collect();
            // Another key is never held up by the first one's turn.
            let other = Rc::new(Cell::new(false));
            let o = other.clone();
            let order2 = order.clone();
            glommio::spawn_local(async move {
                let _t = order2.turn("b", "other").await.expect("turn");
                o.set(true);
            })
            .await;
            assert!(other.get());
            glommio::executor().yield_task_queue_now().await;
            assert!(
                log.borrow().is_empty(),
                "nobody ran while the first held the turn"
            );
            drop(first);
            for t in spawned {
                t.await;
            }
            assert_eq!(*log.borrow(), vec![1, 2, 3]);
            assert_eq!(order.len(), 0, "entries go with their last write");
        });
    }
}
