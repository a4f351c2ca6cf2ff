//! A wake-all notification for tasks of one thread that wait for a condition on shared state.
//!
//! The store's tasks wait for things such as "fewer than N writes in flight" or "every write
//! up to id X has completed"; completions arrive in spawned write tasks. Each completion
//! notifies, and each waiter re-checks its own condition. On one thread, with a handful of
//! waiters, this is simpler and cheaper than a condition variable per condition.

use std::cell::RefCell;
use std::future::poll_fn;
use std::task::{Poll, Waker};

#[derive(Default)]
pub(crate) struct Signal {
    waiters: RefCell<Vec<Waker>>,
}

impl Signal {
    /// Wakes every task waiting in [`Signal::wait_until`] so it re-checks its condition.
    pub fn notify_all(&self) {
        let waiters = std::mem::take(&mut *self.waiters.borrow_mut());
        for w in waiters {
            w.wake();
        }
    }

    /// Returns once `cond` holds; `cond` is re-evaluated after every notification.
    pub async fn wait_until(&self, mut cond: impl FnMut() -> bool) {
        poll_fn(|cx| {
            if cond() {
                Poll::Ready(())
            } else {
                let mut waiters = self.waiters.borrow_mut();
                if !waiters.iter().any(|w| w.will_wake(cx.waker())) {
                    waiters.push(cx.waker().clone());
                }
                Poll::Pending
            }
        })
        .await
    }
}
