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
    sched: Arc<Scheduler>,
    threads: Vec<JoinHandle<()>>,
    next: AtomicUsize,
}

/// Where jobs go. Without a per-peer cap a job goes to the worker the batch dealt it to (so a
/// large transfer spreads over every worker). With one, at most `cap` jobs of one peer run or
/// wait in worker queues at a time, each on the least-loaded worker; the peer's other jobs
/// wait here. A peer that stalls (it proved its address, then stopped answering) then holds
/// at most `cap` workers until its I/O deadlines fire, and the others stay free for the other
/// peers.
struct Scheduler {
    senders: std::sync::RwLock<Vec<mpsc::Sender<Message>>>,
    /// Jobs queued or running on each worker.
    load: Vec<AtomicUsize>,
    cap: usize,
    peers: std::sync::Mutex<HashMap<NodeId, PeerJobs>>,
}

#[derive(Default)]
struct PeerJobs {
    active: usize,
    held: std::collections::VecDeque<Job>,
}

impl Scheduler {
    fn capped(&self) -> bool {
        self.cap < self.load.len()
    }

    fn lock_peers(&self) -> std::sync::MutexGuard<'_, HashMap<NodeId, PeerJobs>> {
        // Each critical section is a few map operations; the map is valid after a panic.
        self.peers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `job` on worker `i`; a stopped pool completes it with [`TransferError::Shutdown`].
    fn enqueue(&self, i: usize, job: Job) {
        let senders = self.senders.read().unwrap_or_else(|p| p.into_inner());
        let Some(tx) = senders.get(i) else {
            return fail(job);
        };
        self.load[i].fetch_add(1, Ordering::Relaxed);
        if let Err(mpsc::SendError(Message::Run(job))) = tx.send(Message::Run(job)) {
            self.load[i].fetch_sub(1, Ordering::Relaxed);
            fail(job);
        }
    }

    fn least_loaded(&self) -> usize {
        (0..self.load.len())
            .min_by_key(|&i| self.load[i].load(Ordering::Relaxed))
            .unwrap_or(0)
    }

    fn submit(&self, i: usize, job: Job) {
        if !self.capped() {
            return self.enqueue(i, job);
        }
        let node = job.peer.addr.node;
        let run = {
            let mut peers = self.lock_peers();
            let p = peers.entry(node).or_default();
            if p.active < self.cap {
                p.active += 1;
                Some(job)
            } else {
                p.held.push_back(job);
                None
            }
        };
        if let Some(job) = run {
            self.enqueue(self.least_loaded(), job);
        }
    }

    /// Worker `i` finished a job for `node`: starts the peer's next held job, if any.
    fn finished(&self, i: usize, node: NodeId) {
        self.load[i].fetch_sub(1, Ordering::Relaxed);
        if !self.capped() {
            return;
        }
        let next = {
            let mut peers = self.lock_peers();
            let Some(p) = peers.get_mut(&node) else {
                return;
            };
            match p.held.pop_front() {
                Some(job) => Some(job),
                None => {
                    p.active -= 1;
                    if p.active == 0 {
                        peers.remove(&node);
                    }
                    None
                }
            }
        };
        if let Some(job) = next {
            self.enqueue(self.least_loaded(), job);
        }
    }
}

/// Completes a job that cannot run with [`TransferError::Shutdown`].
fn fail(job: Job) {
    let outcomes: Vec<_> = job
        .ops
        .iter()
        .map(|op| (op.request, Err(TransferError::Shutdown)))
        .collect();
    job.batch.finish_job(outcomes);
}

impl WorkerPool {
    /// `per_peer`: the most workers one peer's jobs may occupy at once (`>= workers`: no cap).
    pub(crate) fn start(
        workers: usize,
        per_peer: usize,
        paths: Arc<Paths>,
    ) -> std::io::Result<WorkerPool> {
        let workers = workers.max(1);
        let mut senders = Vec::new();
        let mut receivers = Vec::new();
        for _ in 0..workers {
            let (tx, rx) = mpsc::channel();
            senders.push(tx);
            receivers.push(rx);
        }
        let sched = Arc::new(Scheduler {
            senders: std::sync::RwLock::new(senders),
            load: (0..workers).map(|_| AtomicUsize::new(0)).collect(),
            cap: per_peer.max(1),
            peers: std::sync::Mutex::new(HashMap::new()),
        });
        let mut threads = Vec::new();
        for (i, rx) in receivers.into_iter().enumerate() {
            let paths = Arc::clone(&paths);
            let sched = Arc::clone(&sched);
            let thread = std::thread::Builder::new()
                .name(format!("yutu-transfer-{i}"))
                .spawn(move || worker_loop(i, rx, &paths, &sched))?;
            threads.push(thread);
        }
        Ok(WorkerPool {
            sched,
            threads,
            next: AtomicUsize::new(0),
        })
    }

    pub(crate) fn width(&self) -> usize {
        self.sched.load.len()
    }

    /// Where the next batch starts dealing slices, so that single-slice batches do not all
    /// land on worker 0.
    pub(crate) fn rotate(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed) % self.width()
    }

    /// Queues a job dealt to worker `i` (or, under a per-peer cap, to the least-loaded worker
    /// when the peer is under its cap, else after the peer's running jobs).
    pub(crate) fn send(&self, i: usize, job: Job) {
        self.sched.submit(i, job);
    }

    /// Makes every worker drop its connections to `node`.
    pub(crate) fn forget(&self, node: NodeId) {
        let senders = self.sched.senders.read().unwrap_or_else(|p| p.into_inner());
        for tx in senders.iter() {
            let _ = tx.send(Message::Forget(node));
        }
    }

    /// Lets queued jobs finish and stops the workers; jobs still held back fail.
    pub(crate) fn shutdown(&mut self) {
        self.sched
            .senders
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let held: Vec<Job> = self
            .sched
            .lock_peers()
            .drain()
            .flat_map(|(_, p)| p.held)
            .collect();
        held.into_iter().for_each(fail);
    }
}

fn worker_loop(i: usize, rx: mpsc::Receiver<Message>, paths: &Paths, sched: &Scheduler) {
    let mut lanes: HashMap<TransportKind, Box<dyn Lane>> = HashMap::new();
    while let Ok(msg) = rx.recv() {
        match msg {
            Message::Forget(node) => {
                for lane in lanes.values_mut() {
                    lane.forget(node);
                }
            }
            Message::Run(job) => {
                let node = job.peer.addr.node;
                run_job(job, &mut lanes, paths);
                sched.finished(i, node);
            }
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
