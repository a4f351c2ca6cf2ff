//! Large copies split over a few threads.
//!
//! One thread copying between the node's arena and a client's memory moves about 6.5 GB/s
//! through cross-memory attach and 7–9 GB/s with `memcpy` on the development VM, where two
//! threads together move twice that: one thread does not use the memory system up. A shard
//! that copies a 2 MiB block alone leaves the other cores idle, and when a batch's keys fall
//! unevenly on the shards (10 and 6 of 16 is common), the busier shard sets the pace while
//! the other waits.
//!
//! So a copy of at least [`SPLIT_MIN`] bytes is cut into pieces of about [`PIECE`] bytes, and
//! the calling thread and its helpers take pieces from a shared counter until none is left.
//! The caller never waits for a helper to start: a helper that wakes late (waking an idle
//! core takes tens of microseconds on a VM) finds fewer pieces left, or none, and then touches
//! nothing of the caller's. The caller returns once every piece that was taken is done, so
//! the borrowed ranges, and the shard's guarantee that nothing evicts a block mid-copy, hold
//! for the helpers too; it waits for at most the last piece a helper took, polling, since
//! that is tens of microseconds and a sleeping thread takes as long to wake.
//!
//! Helping pays only while cores are idle: when two shards copy at once they already use
//! two cores, and a helper would only take turns with them (a `--only yutu` run of the
//! bench's 2 MiB batches measured 6% slower with every large copy split). So the helpers are
//! pinned, one to each CPU, and a copy asks only the helpers of CPUs that are free: not its
//! own, not one where another large copy's caller runs, and not one where a thread serving
//! copies ([`working`]: a shard inside a same-host get-into or put-from) runs. A helper goes
//! back as soon as such a thread shows up on its CPU. And a shard that has served its part of
//! a batch sends its own CPU's helper to a copy still in progress
//! ([`Working::offer_help`]): with a batch's keys uneven on two shards, the busier one gets
//! help when the other is done.
//!
//! Why pinned: a helper the scheduler places lands on its waker's CPU often enough to matter,
//! and there it only takes turns with the shard that asked it. The helpers used to be made on
//! the first large copy, from that shard's pinned thread, and inherited its one CPU; on the
//! 2-vCPU development VM a 16-block batch of 2 MiB blocks whose keys all fell on one shard then
//! took 4.5-7 ms with the helper copying 1-3 MiB of its 32 (2.3-2.5 ms pinned beside it, as
//! fast as a batch split 8/8). Left to the scheduler, they cost Mooncake's stress shape (8
//! threads getting 1 MiB values) 5% of its gets, landing beside busy shards.
//!
//! The helpers are made on first use, and only in a process that called [`set_threads`] (the
//! node does, with `--copy-threads`, the number of CPUs by default): it chooses how many
//! threads copy one large transfer, the caller included; 1 turns splitting off (a host whose
//! cores belong to its engines). There is one helper per CPU of the thread that called
//! [`set_threads`] (the node's main thread, before any shard is pinned); without that set, as
//! many as a copy may ask, unpinned. The helpers are written here rather than taken from
//! rayon: rayon's scopes wait for every spawned job to run, so a copy would wait for a
//! helper's wake-up even when it had finished every piece itself, and a helper could not go
//! back when it finds the cores taken.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Copies smaller than this stay on the calling thread: a helper's wake-up would cost more
/// than the half of the copy it could take.
pub const SPLIT_MIN: usize = 1 << 20;

/// The size of the pieces a large copy is cut into (more of them for a very large copy, see
/// [`MAX_PIECES`]): small enough that the threads finish close together, large enough that a
/// piece costs one system call among hundreds of microseconds of copying.
pub const PIECE: usize = 256 * 1024;

/// Most pieces one copy is cut into.
const MAX_PIECES: usize = 64;

/// Runs the helpers copied, and their bytes, since the process started.
static HELPER_RUNS: AtomicU64 = AtomicU64::new(0);
static HELPER_BYTES: AtomicU64 = AtomicU64::new(0);

/// What the copy helpers have done since the process started (the node's
/// `yutu_copy_helper_*` metrics): whether they help is visible, not guessed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HelperStats {
    /// Runs (pieces of about [`PIECE`] bytes) a helper copied.
    pub runs: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// The copy helpers' counters.
pub fn stats() -> HelperStats {
    HelperStats {
        runs: HELPER_RUNS.load(Ordering::Relaxed),
        bytes: HELPER_BYTES.load(Ordering::Relaxed),
    }
}

/// Threads that copy one large transfer together, the caller included; 0 until set, which
/// means 1: a process splits copies only when it asks to (the storage node does; a client
/// library starting threads in an engine's process unasked would be a surprise).
static THREADS: AtomicUsize = AtomicUsize::new(0);

/// The helpers, made on first use; `None` when splitting is off or no helper could start.
static HELPERS: OnceLock<Option<Helpers>> = OnceLock::new();

/// The CPUs the helpers are pinned to: those of the thread that called [`set_threads`];
/// unset when they could not be read (the helpers are then not pinned).
static CPUS: OnceLock<Cpus> = OnceLock::new();

/// Most CPUs the per-CPU bookkeeping covers (the kernel's `CPU_SETSIZE`).
const MAX_CPUS: usize = 1024;

/// Threads that hold [`Working`], in all and per CPU.
static WORKING: AtomicUsize = AtomicUsize::new(0);
static WORKING_ON: [AtomicU32; MAX_CPUS] = [const { AtomicU32::new(0) }; MAX_CPUS];

/// The CPU the calling thread runs on (where it is pinned, for a shard).
fn current_cpu() -> Option<usize> {
    // SAFETY: `sched_getcpu` has no preconditions.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).ok().filter(|&c| c < MAX_CPUS)
}

/// Whether a thread serving copies runs on `cpu`.
fn working_on(cpu: usize) -> bool {
    WORKING_ON
        .get(cpu)
        .is_some_and(|n| n.load(Ordering::Relaxed) > 0)
}

/// Held by a thread while it serves copies (a shard inside a same-host get-into or
/// put-from), on the CPU it holds it from: no helper is asked to that CPU meanwhile, and a
/// helper there goes back. Without it, a shard between two large copies looks idle, and a
/// helper sent to its CPU takes turns with it once its next request comes. The CPU is read
/// when the guard is taken: right for a pinned shard (the default), possibly stale for one
/// the scheduler moves (`--no-pin`), which then only makes a helper's choice worse.
#[must_use = "the thread counts as working only while this is held"]
pub struct Working {
    cpu: Option<usize>,
}

/// Marks the calling thread as serving copies until the guard drops.
pub fn working() -> Working {
    WORKING.fetch_add(1, Ordering::Relaxed);
    let cpu = current_cpu();
    if let Some(c) = cpu {
        WORKING_ON[c].fetch_add(1, Ordering::Relaxed);
    }
    Working { cpu }
}

impl Drop for Working {
    fn drop(&mut self) {
        WORKING.fetch_sub(1, Ordering::Relaxed);
        if let Some(c) = self.cpu {
            WORKING_ON[c].fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// A CPU set, as `sched_getaffinity` fills it.
#[derive(Clone, Copy)]
struct Cpus(libc::cpu_set_t);

impl Cpus {
    /// The calling thread's CPUs.
    fn of_this_thread() -> Option<Cpus> {
        // SAFETY: an all-zero `cpu_set_t` is a valid empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid `cpu_set_t` of the size passed, written by the kernel.
        let rc =
            unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
        (rc == 0).then_some(Cpus(set))
    }

    /// The set of CPU `cpu` alone.
    fn one(cpu: usize) -> Cpus {
        // SAFETY: an all-zero `cpu_set_t` is a valid empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `CPU_SET` writes the bit of `cpu`, below the set's size (callers pass CPUs
        // of a set, below `MAX_CPUS`).
        unsafe { libc::CPU_SET(cpu, &mut set) };
        Cpus(set)
    }

    /// The CPUs in the set, in order.
    fn list(&self) -> Vec<usize> {
        // SAFETY: `CPU_ISSET` only reads the bit of a CPU below the set's size.
        (0..MAX_CPUS)
            .filter(|&c| unsafe { libc::CPU_ISSET(c, &self.0) })
            .collect()
    }

    /// Moves the calling thread onto these CPUs.
    fn apply_to_this_thread(&self) -> io::Result<()> {
        // SAFETY: `self.0` is a valid `cpu_set_t` of the size passed, only read.
        let rc =
            unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &self.0) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

/// One helper thread: where to send it a copy, the CPU it is pinned to (`None`: not pinned),
/// and whether it has one already (set by whoever sends it one, cleared by the helper when
/// it is done with it).
struct Helper {
    jobs: crossbeam_channel::Sender<Arc<Job>>,
    cpu: Option<usize>,
    busy: Arc<AtomicBool>,
}

/// Threads waiting for copies to help with.
struct Helpers {
    all: Vec<Helper>,
    /// The most helpers one copy asks: the copying threads but its caller.
    per_copy: usize,
}

/// Sets how many threads copy one large transfer, the caller included (1: no splitting).
/// Takes effect only before the first large copy; `false` when it came too late.
/// Call it from a thread that may run on every CPU the helpers may use (the node's main
/// thread, before it pins its shards): there is a helper pinned to each of its CPUs.
pub fn set_threads(threads: usize) -> bool {
    THREADS.store(threads.max(1), Ordering::Relaxed);
    if let Some(cpus) = Cpus::of_this_thread() {
        let _ = CPUS.set(cpus);
    }
    HELPERS.get().is_none()
}

fn helpers() -> Option<&'static Helpers> {
    HELPERS
        .get_or_init(|| Helpers::start(THREADS.load(Ordering::Relaxed), CPUS.get().copied()))
        .as_ref()
}

impl Helpers {
    /// Helpers for copies of `threads` threads (the caller and `threads - 1` helpers): one
    /// pinned to each CPU of `cpus`, or without them `threads - 1` the scheduler places;
    /// `None` when `threads` is 1 or none started. They stop when their queues close (the
    /// `Helpers` is dropped).
    fn start(threads: usize, cpus: Option<Cpus>) -> Option<Helpers> {
        let per_copy = threads.saturating_sub(1);
        if per_copy == 0 {
            return None;
        }
        let places: Vec<Option<usize>> = match cpus {
            Some(cpus) => cpus.list().into_iter().map(Some).collect(),
            None => vec![None; per_copy],
        };
        let mut all = Vec::with_capacity(places.len());
        for (i, cpu) in places.into_iter().enumerate() {
            let (jobs, queue) = crossbeam_channel::unbounded::<Arc<Job>>();
            let busy = Arc::new(AtomicBool::new(false));
            let done = Arc::clone(&busy);
            let started = std::thread::Builder::new()
                .name(format!("yutu-copy-{i}"))
                .spawn(move || {
                    let mut cpu = cpu;
                    if let Some(c) = cpu {
                        if let Err(e) = Cpus::one(c).apply_to_this_thread() {
                            tracing::warn!(error = %e, cpu = c, "a copy helper is not pinned");
                            cpu = None;
                        }
                    }
                    for job in queue {
                        job.help(cpu, threads);
                        done.store(false, Ordering::Release);
                    }
                });
            match started {
                Ok(_) => all.push(Helper { jobs, cpu, busy }),
                Err(e) => {
                    tracing::warn!(error = %e, "a copy helper did not start");
                    break;
                }
            }
        }
        (!all.is_empty()).then_some(Helpers { all, per_copy })
    }

    /// Claims helpers for a copy by a thread on CPU `me` while `list` is in progress: at most
    /// `want`, pinned to CPUs free of copies (see the module docs), or unpinned ones while
    /// fewer threads copy than a copy may use.
    fn claim(&self, me: Option<usize>, list: &[Arc<Job>], want: usize) -> Vec<&Helper> {
        let mut room = (self.per_copy + 1).saturating_sub(busy(list, 1));
        let mut out = Vec::new();
        for h in &self.all {
            if out.len() == want {
                break;
            }
            let free = match h.cpu {
                Some(c) => {
                    Some(c) != me && !working_on(c) && !list.iter().any(|j| j.cpu == Some(c))
                }
                None => room > 0,
            };
            if free && !h.busy.swap(true, Ordering::AcqRel) {
                room = room.saturating_sub(1);
                out.push(h);
            }
        }
        out
    }
}

/// A piece of a copy: (offset in the peer's segment, local address, length).
pub(crate) type Piece = (u64, *mut u8, usize);

/// The caller's copy function with its lifetime erased (see [`Job::copy`]).
type CopyFn<'a> = dyn Fn(&[Piece]) -> Option<io::Result<()>> + Sync + 'a;

/// One split copy, shared by its caller and the helpers it asked.
struct Job {
    runs: Vec<Vec<Piece>>,
    /// The next run to take; at or past `runs.len()`, none is left.
    next: AtomicUsize,
    /// Runs taken and finished (copied, failed or skipped).
    finished: AtomicUsize,
    /// Helpers sent to it.
    helped: AtomicUsize,
    /// The CPU its caller runs on.
    cpu: Option<usize>,
    stop: AtomicBool,
    failed: Mutex<Option<Option<io::Result<()>>>>,
    /// The caller's `copy`, which borrows from its stack. Called only for a run taken from
    /// `next`, and the caller returns only when every run has been finished, so no call
    /// outlives the borrow; a helper that comes later takes no run and calls nothing.
    copy: *const CopyFn<'static>,
}

// SAFETY: the local addresses in `runs` and the `copy` pointer are used only for a run taken
// from `next`, while the caller waits for it (see `Job::copy`); each run goes to exactly one
// thread, and `copy` is `Sync`.
unsafe impl Send for Job {}
// SAFETY: as for `Send`; everything else in a job is atomics and a mutex.
unsafe impl Sync for Job {}

impl Job {
    /// A helper's share: runs taken and copied until none is left, or until its CPU is
    /// wanted (`cpu`: a thread serving copies runs there) or, for a helper not pinned, more
    /// threads copy than there are copying threads (`threads`, callers included). A helper is
    /// asked while a core is free, but wakes tens of microseconds later; when a shard has
    /// started work there by then, the helper would only take turns with it (puts, which
    /// read through a bounce buffer that one core's cache holds, lost 6-10% to that), so it
    /// goes back instead, before any run or between two.
    fn help(&self, cpu: Option<usize>, threads: usize) {
        loop {
            let crowded = match cpu {
                Some(c) => working_on(c),
                None => busy(&copying(), 0) > threads,
            };
            let copied = if crowded { None } else { self.copy_one() };
            if let Some(bytes) = copied {
                HELPER_RUNS.fetch_add(1, Ordering::Relaxed);
                HELPER_BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
            } else {
                // Saturating: a count is only ever a hint for the next copy.
                let _ = self
                    .helped
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| h.checked_sub(1));
                return;
            }
        }
    }

    /// Takes runs and copies them until none is left.
    fn drain(&self) {
        while self.copy_one().is_some() {}
    }

    /// Takes the next run and copies it: its bytes, or `None` when none was left.
    fn copy_one(&self) -> Option<usize> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        let run = self.runs.get(i)?;
        if !self.stop.load(Ordering::Relaxed) {
            // SAFETY: run `i` was taken, so the caller is still waiting (see `copy`).
            let copy = unsafe { &*self.copy };
            // A panic must not end a helper with its run unfinished (the caller would wait
            // forever), nor unwind the caller while helpers still use its memory: it fails
            // the copy instead.
            let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| copy(run)))
                .unwrap_or_else(|_| Some(Err(io::Error::other("a copy panicked"))));
            match done {
                Some(Ok(())) => {}
                other => {
                    self.stop.store(true, Ordering::Relaxed);
                    let mut first = self.failed.lock().unwrap_or_else(|p| p.into_inner());
                    first.get_or_insert(other);
                }
            }
        }
        self.finished.fetch_add(1, Ordering::Release);
        Some(run.iter().map(|p| p.2).sum())
    }
}

/// `pieces` cut into runs of about [`PIECE`] bytes (a long piece split where a run ends),
/// or `None` when they are too few bytes to be worth splitting.
fn cut(pieces: &[Piece]) -> Option<Vec<Vec<Piece>>> {
    let total: usize = pieces.iter().map(|p| p.2).sum();
    if total < SPLIT_MIN {
        return None;
    }
    let size = PIECE.max(total.div_ceil(MAX_PIECES));
    let mut runs = Vec::with_capacity(total.div_ceil(size));
    let mut run = Vec::new();
    let mut filled = 0usize;
    for &(offset, local, len) in pieces {
        let mut at = 0usize;
        while at < len {
            let take = (len - at).min(size - filled);
            run.push((offset + at as u64, local.wrapping_add(at), take));
            at += take;
            filled += take;
            if filled == size {
                runs.push(std::mem::take(&mut run));
                filled = 0;
            }
        }
    }
    if !run.is_empty() {
        runs.push(run);
    }
    Some(runs)
}

/// The large copies in progress in this process (those of [`SPLIT_MIN`] bytes or more).
static COPYING: Mutex<Vec<Arc<Job>>> = Mutex::new(Vec::new());

/// Threads copying or serving copies: the threads that hold [`Working`] or else the callers
/// of the jobs in `list` plus `callers` more (whichever is more), and the helpers sent to the
/// jobs.
fn busy(list: &[Arc<Job>], callers: usize) -> usize {
    let helped = list
        .iter()
        .map(|j| j.helped.load(Ordering::Relaxed))
        .fold(0, usize::saturating_add);
    WORKING
        .load(Ordering::Relaxed)
        .max(list.len().saturating_add(callers))
        .saturating_add(helped)
}

fn copying() -> std::sync::MutexGuard<'static, Vec<Arc<Job>>> {
    // Each critical section is one push, removal or scan: the list is valid after a panic.
    COPYING.lock().unwrap_or_else(|p| p.into_inner())
}

/// Copies `pieces` with `copy`: on this thread alone when they are fewer than [`SPLIT_MIN`]
/// bytes or splitting is off; otherwise cut into runs that this thread and helpers take from
/// a shared counter. Helpers are asked only for cores no other large copy (or its helpers)
/// keeps busy: two shards copying at once already use two cores, and a helper would only
/// take turns with them ([`Working::offer_help`] sends one later, when a core comes free). The
/// result is `copy`'s, or for a split
/// copy `Some(Ok)` when every run succeeded, else the first failure seen (a run's `None` or
/// error; the runs not started by then are skipped).
///
/// # Safety
///
/// `copy` must be safe to call with any sub-range of the pieces from any thread for the
/// length of this call, as it is for the whole of them from this one: every local address
/// valid for its length (reads or writes, as `copy` uses it), and local ranges that `copy`
/// writes not overlapping.
pub(crate) unsafe fn run(pieces: &[Piece], copy: &CopyFn<'_>) -> Option<io::Result<()>> {
    // SAFETY: as this function's contract.
    unsafe { run_with(&helpers, pieces, copy) }
}

/// Copies each `(src, dst, len)` with `copy`, split over this thread and the helpers as
/// [`run`] splits a transfer: for a process's own copies between two of its mappings (a
/// client's copy out of a view of a node's arena). Splits only in a process that called
/// [`set_threads`] with more than one thread.
///
/// # Safety
///
/// Every `src` valid for reads and every `dst` for writes of its `len` bytes for the length of
/// the call, from any thread; no destination overlapping another piece's source or
/// destination; `copy` safe to call with any sub-range of a piece (the same offset into its
/// source and its destination).
pub unsafe fn copy_local(
    pieces: &[(*const u8, *mut u8, usize)],
    copy: unsafe fn(*const u8, *mut u8, usize),
) {
    let as_runs: Vec<Piece> = pieces
        .iter()
        .map(|&(src, dst, len)| (src as u64, dst, len))
        .collect();
    let each = |run: &[Piece]| {
        for &(src, dst, len) in run {
            // SAFETY: a sub-range of a piece the caller vouched for (`cut` moves the source
            // and the destination of a piece by the same amount).
            unsafe { copy(src as usize as *const u8, dst, len) };
        }
        Some(Ok(()))
    };
    // SAFETY: as this function's contract.
    let _ = unsafe { run(&as_runs, &each) };
}

/// [`run`] with the helpers `helpers` gives (none: on this thread alone), asked for only when
/// the copy is large enough for them (the process's helpers start on the first such copy).
///
/// # Safety
///
/// As [`run`].
unsafe fn run_with<'h>(
    helpers: &dyn Fn() -> Option<&'h Helpers>,
    pieces: &[Piece],
    copy: &CopyFn<'_>,
) -> Option<io::Result<()>> {
    let Some(runs) = cut(pieces) else {
        return copy(pieces);
    };
    let Some(helpers) = helpers() else {
        return copy(pieces);
    };
    let n = runs.len();
    // SAFETY: only the lifetime is erased; see `Job::copy` for why no call outlives it.
    let copy = unsafe { std::mem::transmute::<&CopyFn<'_>, &'static CopyFn<'static>>(copy) };
    let me = current_cpu();
    let job = Arc::new(Job {
        runs,
        next: AtomicUsize::new(0),
        finished: AtomicUsize::new(0),
        helped: AtomicUsize::new(0),
        cpu: me,
        stop: AtomicBool::new(false),
        failed: Mutex::new(None),
        copy,
    });
    let asked = {
        let mut list = copying();
        let asked = helpers.claim(me, &list, helpers.per_copy.min(n - 1));
        // Counted before the job is listed, where `offer_help` may add to it.
        job.helped.store(asked.len(), Ordering::Relaxed);
        list.push(Arc::clone(&job));
        asked
    };
    for helper in asked {
        // The helpers never stop, so their queues are always open.
        let _ = helper.jobs.send(Arc::clone(&job));
    }
    job.drain();
    // Every run is taken: wait for the ones the helpers are still copying.
    while job.finished.load(Ordering::Acquire) < n {
        std::thread::yield_now();
    }
    copying().retain(|j| !Arc::ptr_eq(j, &job));
    let first = job.failed.lock().unwrap_or_else(|p| p.into_inner()).take();
    first.unwrap_or(Some(Ok(())))
}

impl Working {
    /// Says that the calling thread is done with its share of a batch and about to idle: it
    /// stops counting as working, and the helper of its CPU (a helper, where they are not
    /// pinned) goes to another thread's large copy still in progress with runs left, if there
    /// is one. A shard calls it when it has served its part of a batch, so that the shard
    /// with the larger share of an uneven batch gets help once the other is done. (Not at the
    /// end of every large copy: a shard with more runs to go would then take turns with the
    /// helper it sent.)
    pub fn offer_help(self) {
        // Dropped first: the helper sent looks for its CPU free of working threads.
        drop(self);
        let Some(helpers) = HELPERS.get().and_then(Option::as_ref) else {
            return;
        };
        let me = current_cpu();
        // This CPU's helper, or (not pinned) any idle one.
        let Some(helper) = helpers.all.iter().find(|h| h.cpu.is_none() || h.cpu == me) else {
            return;
        };
        if helper.busy.swap(true, Ordering::AcqRel) {
            return;
        }
        let next = copying()
            .iter()
            .find(|j| j.cpu != me && j.next.load(Ordering::Relaxed) + 1 < j.runs.len())
            .cloned();
        match next {
            Some(other) => {
                other.helped.fetch_add(1, Ordering::Relaxed);
                // The helpers never stop, so their queues are always open.
                let _ = helper.jobs.send(other);
            }
            None => helper.busy.store(false, Ordering::Release),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_copies_are_not_cut() {
        let mut buf = vec![0u8; SPLIT_MIN - 1];
        assert!(cut(&[(0, buf.as_mut_ptr(), buf.len())]).is_none());
    }

    #[test]
    fn cutting_covers_every_byte_once_in_order() {
        let mut buf = vec![0u8; 3 << 20];
        let base = buf.as_mut_ptr();
        // Uneven pieces, one empty, one longer than a run.
        let pieces = vec![
            (1000, base, 100),
            (5000, base.wrapping_add(100), 0),
            (9000, base.wrapping_add(100), (1 << 20) + 7),
            (1 << 30, base.wrapping_add((1 << 20) + 107), (2 << 20) - 107),
        ];
        let runs = cut(&pieces).expect("3 MiB is cut");
        assert!(runs.len() > 2);
        let mut local = 0usize;
        let mut covered = 0usize;
        for run in &runs {
            let bytes: usize = run.iter().map(|p| p.2).sum();
            assert!(bytes <= PIECE.max((3 << 20) / MAX_PIECES));
            for &(_, at, len) in run {
                assert_eq!(at as usize - base as usize, local, "runs follow each other");
                local += len;
                covered += len;
            }
        }
        assert_eq!(covered, 3 << 20);
        // The long piece keeps its segment offsets where it is split.
        let split: Vec<&Piece> = runs
            .iter()
            .flatten()
            .filter(|p| p.0 >= 9000 && p.0 < 1 << 30)
            .collect();
        assert!(split.len() >= 2);
        for w in split.windows(2) {
            assert_eq!(w[0].0 + w[0].2 as u64, w[1].0);
        }
    }

    #[test]
    fn a_copys_helpers_run_beside_its_caller_even_when_made_on_its_cpu() {
        let Some(all) = Cpus::of_this_thread() else {
            return;
        };
        let cpus = all.list();
        if cpus.len() < 2 {
            // One CPU: no CPU beside the caller.
            return;
        }
        // The maker and the caller are pinned to one CPU, as a shard's thread is.
        let first = cpus[0];
        Cpus::one(first)
            .apply_to_this_thread()
            .expect("pin the caller");
        let helpers = Helpers::start(2, Some(all)).expect("helpers");
        assert_eq!(helpers.all.len(), cpus.len(), "one helper per CPU");
        // A caller slow enough that a helper takes runs; each run a helper takes notes its CPU.
        let seen = Mutex::new(Vec::new());
        let copy = |_: &[Piece]| -> Option<io::Result<()>> {
            let helper = std::thread::current()
                .name()
                .is_some_and(|n| n.starts_with("yutu-copy"));
            if helper {
                seen.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(current_cpu());
            } else {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            Some(Ok(()))
        };
        let pieces = vec![(0u64, std::ptr::null_mut(), 4 << 20)];
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while seen.lock().unwrap_or_else(|p| p.into_inner()).is_empty() {
            assert!(std::time::Instant::now() < deadline, "no helper took a run");
            // SAFETY: `copy` touches no memory.
            let done = unsafe { run_with(&|| Some(&helpers), &pieces, &copy) };
            assert!(matches!(done, Some(Ok(()))));
        }
        let seen = seen.into_inner().unwrap_or_else(|p| p.into_inner());
        assert!(
            seen.iter().all(|c| c.is_some() && *c != Some(first)),
            "helpers ran on CPUs {seen:?}, the caller on {first}"
        );
    }

    #[test]
    fn no_helper_is_asked_to_a_cpu_where_a_thread_serves_copies() {
        let Some(all) = Cpus::of_this_thread() else {
            return;
        };
        let cpus = all.list();
        if cpus.len() != 2 {
            return;
        }
        let helpers = Helpers::start(2, Some(all)).expect("helpers");
        // The caller on one CPU, a thread serving copies on the other.
        Cpus::one(cpus[0])
            .apply_to_this_thread()
            .expect("pin the caller");
        let (held, release) = (std::sync::mpsc::channel(), std::sync::mpsc::channel::<()>());
        let (held_tx, held_rx) = held;
        let (release_tx, release_rx) = release;
        let other = cpus[1];
        let server = std::thread::spawn(move || {
            Cpus::one(other).apply_to_this_thread().expect("pin");
            let guard = working();
            held_tx.send(()).expect("say held");
            let _ = release_rx.recv();
            drop(guard);
        });
        held_rx.recv().expect("held");
        assert!(working_on(other));
        // No copy in progress (other tests' copies are theirs, not this one's).
        let list: Vec<Arc<Job>> = Vec::new();
        assert!(
            helpers.claim(Some(cpus[0]), &list, 1).is_empty(),
            "both CPUs are taken"
        );
        release_tx.send(()).expect("release");
        server.join().expect("the serving thread");
        let claimed = helpers.claim(Some(cpus[0]), &list, 1);
        assert_eq!(claimed.len(), 1, "the other CPU is free again");
        assert_eq!(claimed[0].cpu, Some(other));
        claimed[0].busy.store(false, Ordering::Release);
    }

    #[test]
    fn a_split_copy_moves_every_byte_and_reports_a_failure() {
        let helpers = Helpers::start(2, None).expect("a helper");
        assert_eq!(helpers.all.len(), 1);
        let run = |pieces: &[Piece], copy: &CopyFn<'_>| {
            // SAFETY: as each call below says.
            unsafe { run_with(&|| Some(&helpers), pieces, copy) }
        };
        let src: Vec<u8> = (0..(5 << 20) + 13).map(|i| (i * 7 % 251) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        let pieces = vec![(0u64, dst.as_mut_ptr(), dst.len())];
        let base = dst.as_mut_ptr() as usize;
        let copy = |run: &[Piece]| -> Option<io::Result<()>> {
            for &(offset, local, len) in run {
                assert_eq!(offset as usize, local as usize - base);
                // SAFETY: each piece is a distinct part of `dst`, alive for the call.
                unsafe {
                    std::ptr::copy_nonoverlapping(src.as_ptr().add(offset as usize), local, len)
                };
            }
            Some(Ok(()))
        };
        // The pieces are `dst`, exclusively borrowed for the call.
        let done = run(&pieces, &copy);
        assert!(matches!(done, Some(Ok(()))));
        assert_eq!(dst, src);

        let fail = |run: &[Piece]| -> Option<io::Result<()>> {
            if run[0].0 >= (2 << 20) {
                Some(Err(io::Error::other("unmapped")))
            } else {
                Some(Ok(()))
            }
        };
        // `fail` touches no memory.
        let done = run(&pieces, &fail);
        assert_eq!(done.unwrap().unwrap_err().to_string(), "unmapped");

        let panics = |run: &[Piece]| -> Option<io::Result<()>> {
            assert!(run[0].0 < (4 << 20), "a run past 4 MiB");
            Some(Ok(()))
        };
        // `panics` touches no memory.
        let done = run(&pieces, &panics);
        assert_eq!(done.unwrap().unwrap_err().to_string(), "a copy panicked");
        // The helpers are still there for the next copy.
        dst.fill(0);
        let pieces = vec![(0u64, dst.as_mut_ptr(), dst.len())];
        // As the first copy.
        let done = run(&pieces, &copy);
        assert!(matches!(done, Some(Ok(()))));
        assert_eq!(dst, src);
    }
}
