//! Graceful shutdown: on SIGTERM (or SIGINT) every shard stops accepting connections, lets the
//! requests in progress finish (up to a deadline), flushes its NVMe tier and stops; the
//! process then exits 0.
//!
//! The signal is caught on a plain thread (`signal-hook`), which raises a process-wide flag;
//! each shard watches the flag from its own executor, so no shard thread blocks on a signal.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// How often a shard looks at the flag.
const POLL: Duration = Duration::from_millis(20);

/// Set once a stop was asked for.
#[derive(Clone, Default)]
pub struct StopFlag(Arc<AtomicBool>);

impl StopFlag {
    pub fn raise(&self) {
        self.0.store(true, Ordering::Release);
    }

    pub fn raised(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    /// Resolves once the flag is raised (checked every few milliseconds on this executor).
    pub async fn wait(&self) {
        while !self.raised() {
            glommio::timer::sleep(POLL).await;
        }
    }

    /// Raises the flag on SIGTERM or SIGINT, from a thread of its own.
    pub fn on_signals(&self) -> std::io::Result<()> {
        use signal_hook::consts::{SIGINT, SIGTERM};
        let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])?;
        let flag = self.clone();
        std::thread::Builder::new()
            .name("yutu-signals".into())
            .spawn(move || {
                if let Some(sig) = signals.forever().next() {
                    tracing::info!(signal = sig, "stopping: draining connections");
                    flag.raise();
                }
            })?;
        Ok(())
    }
}

/// A shard's view of the stop: one watcher task looks at the flag and wakes every waiting
/// connection. Waiting costs a `Cell` read per poll (a connection polls it each time it
/// wakes), so a busy connection pays nothing measurable while the node runs.
#[derive(Clone, Default)]
pub struct StopSignal(Rc<StopState>);

#[derive(Default)]
struct StopState {
    stopped: Cell<bool>,
    next: Cell<u64>,
    waiting: RefCell<HashMap<u64, Waker>>,
}

impl StopSignal {
    /// Starts the watcher on the current executor.
    pub fn watch(flag: StopFlag) -> StopSignal {
        let signal = StopSignal::default();
        let state = signal.0.clone();
        glommio::spawn_local(async move {
            flag.wait().await;
            state.stopped.set(true);
            for (_, w) in state.waiting.borrow_mut().drain() {
                w.wake();
            }
        })
        .detach();
        signal
    }

    /// Whether the node is stopping.
    pub fn is_stopped(&self) -> bool {
        self.0.stopped.get()
    }

    /// Waits `d`, or less if the node starts stopping meanwhile: whether it is stopping (the
    /// pause of a background loop between two rounds).
    pub async fn sleep(&self, d: std::time::Duration) -> bool {
        futures_lite::future::or(
            async {
                glommio::timer::sleep(d).await;
                false
            },
            async {
                self.stopped().await;
                true
            },
        )
        .await
    }

    /// Resolves once the node is stopping.
    pub fn stopped(&self) -> Stopped {
        Stopped {
            state: self.0.clone(),
            slot: None,
        }
    }
}

/// The future of [`StopSignal::stopped`].
pub struct Stopped {
    state: Rc<StopState>,
    slot: Option<u64>,
}

impl Future for Stopped {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.state.stopped.get() {
            return Poll::Ready(());
        }
        if self.slot.is_none() {
            let id = self.state.next.get();
            self.state.next.set(id + 1);
            self.state
                .waiting
                .borrow_mut()
                .insert(id, cx.waker().clone());
            self.slot = Some(id);
        }
        Poll::Pending
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if let Some(id) = self.slot {
            self.state.waiting.borrow_mut().remove(&id);
        }
    }
}

/// The shards still draining their own connections. A request on one shard may need a job
/// run on any other (the key's owner), so a shard that has drained keeps serving the others'
/// jobs until every shard has drained, and only then stops.
#[derive(Clone)]
pub struct DrainBarrier(Arc<std::sync::atomic::AtomicUsize>);

impl DrainBarrier {
    pub fn new(shards: usize) -> DrainBarrier {
        DrainBarrier(Arc::new(std::sync::atomic::AtomicUsize::new(shards)))
    }

    /// Counts this shard as drained, then waits until all are or `deadline` passes; how many
    /// are still draining.
    pub async fn arrive_and_wait(&self, deadline: Instant) -> usize {
        self.0.fetch_sub(1, Ordering::AcqRel);
        loop {
            let left = self.0.load(Ordering::Acquire);
            if left == 0 || Instant::now() >= deadline {
                return left;
            }
            glommio::timer::sleep(POLL).await;
        }
    }
}

/// Connections a shard is serving, so that a stop can wait for them.
#[derive(Clone, Default)]
pub struct Connections(Rc<Cell<usize>>);

/// Held while a connection is served.
pub struct ConnectionGuard(Rc<Cell<usize>>);

impl Connections {
    pub fn open(&self) -> ConnectionGuard {
        self.0.set(self.0.get() + 1);
        ConnectionGuard(self.0.clone())
    }

    pub fn count(&self) -> usize {
        self.0.get()
    }

    /// Waits until every connection has closed or `deadline` passes; how many are left.
    pub async fn drained(&self, deadline: Instant) -> usize {
        while self.count() > 0 && Instant::now() < deadline {
            glommio::timer::sleep(POLL).await;
        }
        self.count()
    }
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.0.set(self.0.get() - 1);
    }
}
