//! The worker threads that initiate transfers, and the retry-on-another-path loop.
//!
//! Each worker has its own queue and its own lane per transport (connections, queue pairs),
//! so workers share nothing on the data path. A batch's slices are dealt round-robin over the
//! workers, which is what spreads a large transfer over several connections; a worker runs its
//! share of a batch (one job) through the candidate paths in order: everything on the first
//! path, the retryable failures on the next, and so on. A job reports all its outcomes at once.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::address::NodeAddress;
use crate::batch::{BatchState, SliceOutcome};
use crate::descriptor::NodeId;
use crate::error::TransferError;
use crate::select::PathHealth;
use crate::stats::TransportCounters;
use crate::transport::{Lane, SliceOp, Transport, TransportKind};

/// A known peer: its address and how its paths have been doing.
pub(crate) struct Peer {
    pub(crate) addr: NodeAddress,
    pub(crate) health: PathHealth,
}

/// One worker's share of a batch, all for one peer.
pub(crate) struct Job {
    pub(crate) batch: Arc<BatchState>,
    pub(crate) peer: Arc<Peer>,
    pub(crate) ops: Vec<SliceOp>,
    /// Paths to try, best first (already filtered to those both ends share).
    pub(crate) candidates: Vec<TransportKind>,
}

enum Message {
    Run(Job),
    Forget(NodeId),
}

/// The transports and their counters, as workers see them.
pub(crate) struct Paths {
    pub(crate) transports: HashMap<TransportKind, Arc<dyn Transport>>,
    pub(crate) counters: HashMap<TransportKind, TransportCounters>,
}

impl Paths {
    fn counters(&self, kind: TransportKind) -> Option<&TransportCounters> {
        self.counters.get(&kind)
    }
}

pub(crate) struct WorkerPool {
    senders: Vec<mpsc::Sender<Message>>,
    threads: Vec<JoinHandle<()>>,
    next: AtomicUsize,
}

impl WorkerPool {
    pub(crate) fn start(workers: usize, paths: Arc<Paths>) -> std::io::Result<WorkerPool> {
        let mut senders = Vec::new();
        let mut threads = Vec::new();
        for i in 0..workers.max(1) {
            let (tx, rx) = mpsc::channel();
            let paths = Arc::clone(&paths);
            let thread = std::thread::Builder::new()
                .name(format!("yutu-transfer-{i}"))
                .spawn(move || worker_loop(rx, &paths))?;
            senders.push(tx);
            threads.push(thread);
        }
        Ok(WorkerPool {
            senders,
            threads,
            next: AtomicUsize::new(0),
        })
    }

    pub(crate) fn width(&self) -> usize {
        self.senders.len()
    }

    /// Where the next batch starts dealing slices, so that single-slice batches do not all
    /// land on worker 0.
    pub(crate) fn rotate(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed) % self.senders.len()
    }

    /// Queues a job on worker `i`; a stopped worker completes it with [`TransferError::Shutdown`].
    pub(crate) fn send(&self, i: usize, job: Job) {
        if let Err(mpsc::SendError(Message::Run(job))) = self.senders[i].send(Message::Run(job)) {
            let outcomes: Vec<_> = job
                .ops
                .iter()
                .map(|op| (op.request, Err(TransferError::Shutdown)))
                .collect();
            job.batch.finish_job(outcomes);
        }
    }

    /// Makes every worker drop its connections to `node`.
    pub(crate) fn forget(&self, node: NodeId) {
        for tx in &self.senders {
            let _ = tx.send(Message::Forget(node));
        }
    }

    /// Lets queued jobs finish and stops the workers.
    pub(crate) fn shutdown(&mut self) {
        self.senders.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn worker_loop(rx: mpsc::Receiver<Message>, paths: &Paths) {
    let mut lanes: HashMap<TransportKind, Box<dyn Lane>> = HashMap::new();
    while let Ok(msg) = rx.recv() {
        match msg {
            Message::Forget(node) => {
                for lane in lanes.values_mut() {
                    lane.forget(node);
                }
            }
            Message::Run(job) => run_job(job, &mut lanes, paths),
        }
    }
}

fn run_job(job: Job, lanes: &mut HashMap<TransportKind, Box<dyn Lane>>, paths: &Paths) {
    let node = job.peer.addr.node;
    let n = job.ops.len();
    let mut outcomes: Vec<Option<SliceOutcome>> = vec![None; n];
    let mut attempts: Vec<Vec<(TransportKind, TransferError)>> = vec![Vec::new(); n];
    let mut pending: Vec<usize> = (0..n).collect();
    for &kind in &job.candidates {
        if pending.is_empty() {
            break;
        }
        let (Some(transport), Some(counters)) = (paths.transports.get(&kind), paths.counters(kind))
        else {
            let err = TransferError::unavailable(kind, node, "not running in this engine");
            for &i in &pending {
                attempts[i].push((kind, err.clone()));
            }
            continue;
        };
        let lane = lanes.entry(kind).or_insert_with(|| transport.lane());
        let subset: Vec<SliceOp>;
        let ops: &[SliceOp] = if pending.len() == n {
            &job.ops
        } else {
            subset = pending.iter().map(|&i| job.ops[i].clone()).collect();
            &subset
        };
        let results = match std::panic::catch_unwind(AssertUnwindSafe(|| {
            lane.execute(&job.peer.addr, ops)
        })) {
            Ok(results) if results.len() == ops.len() => results,
            outcome => {
                // A bug in a lane fails its ops (on this path) instead of hanging the batch.
                if outcome.is_err() {
                    tracing::error!(%kind, "transfer lane panicked; its state is dropped");
                    lanes.remove(&kind);
                }
                let err = TransferError::protocol(kind, node, "internal error in the lane");
                vec![Err(err); ops.len()]
            }
        };
        let mut still = Vec::new();
        let mut any_ok = false;
        for (&i, result) in pending.iter().zip(results) {
            let retried = !attempts[i].is_empty();
            if retried {
                counters.retries_here.fetch_add(1, Ordering::Relaxed);
            }
            match result {
                Ok(()) => {
                    any_ok = true;
                    let len = job.ops[i].len;
                    counters.ops.fetch_add(1, Ordering::Relaxed);
                    counters.bytes.fetch_add(len, Ordering::Relaxed);
                    outcomes[i] = Some(Ok((kind, len, retried)));
                }
                Err(err) if err.is_retryable() => {
                    counters.failures.fetch_add(1, Ordering::Relaxed);
                    attempts[i].push((kind, err));
                    still.push(i);
                }
                Err(err) => {
                    counters.failures.fetch_add(1, Ordering::Relaxed);
                    outcomes[i] = Some(Err(err));
                }
            }
        }
        if !still.is_empty() {
            job.peer.health.failed(kind);
        } else if any_ok {
            job.peer.health.succeeded(kind);
        }
        pending = still;
    }
    for i in pending {
        let tried = std::mem::take(&mut attempts[i]);
        outcomes[i] = Some(Err(if tried.is_empty() {
            TransferError::NoPath { node }
        } else {
            TransferError::AllPathsFailed {
                node,
                attempts: tried,
            }
        }));
    }
    let reported = job.ops.iter().zip(outcomes).map(|(op, outcome)| {
        (
            op.request,
            outcome.unwrap_or(Err(TransferError::NoPath { node })),
        )
    });
    job.batch.finish_job(reported.collect::<Vec<_>>());
}
