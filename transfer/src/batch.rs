//! Batch completion: what a submitter polls, waits on or awaits.
//!
//! A batch is split into jobs (one per worker that got slices of it); each job reports all its
//! slices' outcomes at once, and the last job to finish completes the batch, waking a blocked
//! [`BatchHandle::wait`] through a condition variable and an awaiting task through its waker.
//! The waker may belong to any executor: it is called from a worker thread, which glommio (the
//! storage node's runtime) supports for its tasks.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::error::TransferError;
use crate::kind::TransportKind;

/// How one request of a batch completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The path that moved the bytes (of the last slice, if slices took different paths).
    pub transport: TransportKind,
    pub bytes: u64,
    /// Some slice failed on another path first and was retried on this one.
    pub retried: bool,
}

/// The outcome of a batch: one entry per request, in submission order.
#[derive(Clone, Debug)]
pub struct BatchResult {
    pub outcomes: Vec<Result<Completion, TransferError>>,
}

impl BatchResult {
    pub fn is_ok(&self) -> bool {
        self.outcomes.iter().all(|o| o.is_ok())
    }

    /// All completions, or the first request's error.
    pub fn into_result(self) -> Result<Vec<Completion>, TransferError> {
        self.outcomes.into_iter().collect()
    }

    /// Bytes moved by the requests that succeeded.
    pub fn bytes(&self) -> u64 {
        self.outcomes
            .iter()
            .filter_map(|o| o.as_ref().ok())
            .map(|c| c.bytes)
            .sum()
    }
}

/// One slice's outcome as a worker reports it.
pub(crate) type SliceOutcome = Result<(TransportKind, u64, bool), TransferError>;

pub(crate) struct BatchState {
    inner: Mutex<Inner>,
    cond: Condvar,
}

struct Inner {
    slots: Vec<Slot>,
    jobs_left: usize,
    waker: Option<Waker>,
}

struct Slot {
    slices_left: usize,
    error: Option<TransferError>,
    transport: Option<TransportKind>,
    bytes: u64,
    retried: bool,
}

impl BatchState {
    /// A batch whose request `i` is cut into `slices[i]` slices, spread over `jobs` jobs.
    /// Requests with no slices (zero length) are complete from the start.
    pub(crate) fn new(slices: &[usize], jobs: usize) -> Arc<BatchState> {
        Arc::new(BatchState {
            inner: Mutex::new(Inner {
                slots: slices
                    .iter()
                    .map(|&n| Slot {
                        slices_left: n,
                        error: None,
                        transport: None,
                        bytes: 0,
                        retried: false,
                    })
                    .collect(),
                jobs_left: jobs,
                waker: None,
            }),
            cond: Condvar::new(),
        })
    }

    /// Records a finished job's slice outcomes (request index, outcome).
    pub(crate) fn finish_job(&self, outcomes: impl IntoIterator<Item = (usize, SliceOutcome)>) {
        let waker = {
            let mut inner = self.lock();
            for (request, outcome) in outcomes {
                let slot = &mut inner.slots[request];
                slot.slices_left = slot.slices_left.saturating_sub(1);
                match outcome {
                    Ok((kind, bytes, retried)) => {
                        slot.transport = Some(kind);
                        slot.bytes += bytes;
                        slot.retried |= retried;
                    }
                    Err(err) => {
                        // The first error is the one worth reporting; later slices of the same
                        // request usually fail the same way.
                        slot.error.get_or_insert(err);
                    }
                }
            }
            inner.jobs_left = inner.jobs_left.saturating_sub(1);
            if inner.jobs_left > 0 {
                return;
            }
            inner.waker.take()
        };
        self.cond.notify_all();
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Workers never panic while holding the lock with a half-updated slot that matters
        // (each update is a few assignments), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Inner {
    fn done(&self) -> bool {
        self.jobs_left == 0
    }

    fn result(&self) -> BatchResult {
        BatchResult {
            outcomes: self
                .slots
                .iter()
                .map(|s| match (&s.error, s.transport) {
                    (Some(err), _) => Err(err.clone()),
                    (None, Some(transport)) => Ok(Completion {
                        transport,
                        bytes: s.bytes,
                        retried: s.retried,
                    }),
                    // A zero-length request: nothing moved, nothing could fail.
                    (None, None) => Ok(Completion {
                        transport: TransportKind::Tcp,
                        bytes: 0,
                        retried: false,
                    }),
                })
                .collect(),
        }
    }
}

/// A submitted batch. Poll it ([`BatchHandle::try_result`]), block on it
/// ([`BatchHandle::wait`]), or `.await` it from any executor.
///
/// Dropping the handle does not cancel the batch: the transfers run to completion, and the
/// local segments stay referenced (and their bytes may change) until they do.
pub struct BatchHandle {
    pub(crate) state: Arc<BatchState>,
}

impl BatchHandle {
    pub fn is_done(&self) -> bool {
        self.state.lock().done()
    }

    /// The result if the batch has completed, without blocking.
    pub fn try_result(&self) -> Option<BatchResult> {
        let inner = self.state.lock();
        inner.done().then(|| inner.result())
    }

    /// Blocks the calling thread until the batch completes.
    pub fn wait(self) -> BatchResult {
        let mut inner = self.state.lock();
        while !inner.done() {
            inner = self
                .state
                .cond
                .wait(inner)
                .unwrap_or_else(|p| p.into_inner());
        }
        inner.result()
    }

    /// Blocks until the batch completes or `timeout` passes (then `None`; the batch goes on).
    pub fn wait_timeout(&self, timeout: Duration) -> Option<BatchResult> {
        let deadline = Instant::now() + timeout;
        let mut inner = self.state.lock();
        while !inner.done() {
            let left = deadline.checked_duration_since(Instant::now())?;
            inner = self
                .state
                .cond
                .wait_timeout(inner, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        Some(inner.result())
    }
}

impl Future for BatchHandle {
    type Output = BatchResult;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<BatchResult> {
        let mut inner = self.state.lock();
        if inner.done() {
            return Poll::Ready(inner.result());
        }
        match &mut inner.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            slot => *slot = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::descriptor::NodeId;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    struct CountingWaker(AtomicUsize);

    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn completes_after_the_last_job_and_wakes_once() {
        let state = BatchState::new(&[2, 1, 0], 2);
        let mut handle = BatchHandle {
            state: Arc::clone(&state),
        };
        let counter = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&counter));
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut handle).poll(&mut cx).is_pending());
        state.finish_job([(0, Ok((TransportKind::Shm, 10, false)))]);
        assert!(handle.try_result().is_none());
        assert_eq!(counter.0.load(Ordering::SeqCst), 0);
        let err = TransferError::NoPath { node: NodeId(1) };
        state.finish_job([(0, Ok((TransportKind::Tcp, 10, true))), (1, Err(err))]);
        assert_eq!(counter.0.load(Ordering::SeqCst), 1);
        let Poll::Ready(result) = Pin::new(&mut handle).poll(&mut cx) else {
            panic!("batch should be complete");
        };
        assert!(!result.is_ok());
        assert_eq!(
            result.outcomes[0].as_ref().unwrap(),
            &Completion {
                transport: TransportKind::Tcp,
                bytes: 20,
                retried: true
            }
        );
        assert!(matches!(
            result.outcomes[1],
            Err(TransferError::NoPath { .. })
        ));
        assert_eq!(result.outcomes[2].as_ref().unwrap().bytes, 0);
        assert_eq!(result.bytes(), 20);
        assert!(handle.wait_timeout(Duration::from_secs(5)).is_some());
    }

    #[test]
    fn an_empty_batch_is_done_at_once() {
        let handle = BatchHandle {
            state: BatchState::new(&[], 0),
        };
        assert!(handle.is_done());
        assert!(handle.wait().is_ok());
    }
}
