//! Memory the caller did not allocate through the client: an engine's own host memory (a
//! numpy array, a pinned tensor, a host pool), named by spans of address and length. One
//! place decides how a batch of such spans travels, for the Rust client and the Python
//! package alike:
//!
//! - **In place** ([`InPlace`]): spans that all lie in one host range registered as it is
//!   ([`KvClient::register_host`]) are one node call naming those ranges
//!   (`batch_get_into_parts` / `batch_put_from_parts`). The node on the same host copies
//!   straight between its arena and that memory through this process's memory file: no
//!   staging buffer and no copy in this process.
//! - **Staged** ([`SpanStaging`]): anything else (spans in several ranges, unregistered
//!   memory, a cluster, a range the engine would not register). The node copies a block
//!   into or out of a registered staging buffer, and this process copies between it and the
//!   caller's spans. A batch larger than half a staging buffer is split into chunks that
//!   alternate between its two halves, so that this thread's copy of chunk `i` runs while the
//!   node moves chunk `i + 1`. Staging buffers come from a pool shared by every thread using
//!   it: at most `max_buffers`, each at least `chunk * 2` bytes and grown for a batch that
//!   needs more.
//!
//! Device (GPU) memory has its own staging through pinned buffers (`device.rs`).

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::{Buffer, KvClient, KvError, Parts, PutOptions, MAX_BATCH};

type Result<T> = std::result::Result<T, KvError>;

fn invalid(msg: impl Into<String>) -> KvError {
    KvError::InvalidArgument(msg.into())
}

/// Bytes of the caller's memory: the source of a put or the target of a get.
#[derive(Debug, Clone, Copy)]
pub struct Span {
    /// The address, as an integer so that spans can cross threads: a host address, or a
    /// device address of GPU `device`.
    pub addr: usize,
    pub len: u64,
    /// The ordinal of the GPU whose memory this is; `None` for host memory. Only host spans
    /// are moved here; a device span is refused.
    pub device: Option<u32>,
}

/// The largest block a get stages: a caller's capacity above it is capped to it (a get into
/// external memory of a larger block fails as "larger than its room").
pub const MAX_STAGED_BLOCK: u64 = 1 << 30;
/// How long a call waits for a staging buffer that other threads are using.
const TAKE_TIMEOUT: Duration = Duration::from_secs(60);

/// The pool of staging buffers of one store.
pub struct SpanStaging {
    /// Registered engine memory the node reaches without staging (tried first).
    pub in_place: InPlace,
    state: Mutex<PoolState>,
    freed: Condvar,
    /// Bytes per half of a buffer: the largest chunk of a batch.
    chunk: u64,
    max_buffers: usize,
}

struct PoolState {
    free: Vec<Buffer>,
    /// Buffers in existence, free or lent.
    total: usize,
}

/// A staging buffer lent to one call; back to the pool when dropped.
pub struct Lease<'a> {
    pool: &'a SpanStaging,
    buf: Option<Buffer>,
    /// False once a call on the buffer failed: the node may still be copying into it (a call
    /// that timed out on this side is not cancelled on the node's), so it is not lent again.
    reusable: bool,
}

impl Lease<'_> {
    fn buf(&self) -> &Buffer {
        self.buf
            .as_ref()
            .expect("a lease holds its buffer until dropped")
    }

    /// Keeps the buffer out of the pool when `result` is a failure.
    fn settle<T>(mut self, result: Result<T>) -> Result<T> {
        if result.is_err() {
            self.reusable = false;
        }
        result
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            let mut st = self.pool.lock();
            if !self.reusable || buf.len() > self.pool.chunk * 2 {
                // Failed, or grown for one large block: unregistered rather than kept.
                st.total -= 1;
                drop(st);
                drop(buf);
            } else {
                st.free.push(buf);
            }
            self.pool.freed.notify_one();
        }
    }
}

impl SpanStaging {
    /// A pool of up to `max_buffers` buffers whose halves hold `chunk` bytes.
    pub fn new(chunk: u64, max_buffers: usize) -> SpanStaging {
        SpanStaging {
            in_place: InPlace::default(),
            state: Mutex::new(PoolState {
                free: Vec::new(),
                total: 0,
            }),
            freed: Condvar::new(),
            chunk: chunk.max(1),
            max_buffers: max_buffers.max(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lends a buffer of at least `len` bytes: a free one, a new one while the pool has room,
    /// or (when every buffer is lent) the first to come back, replacing a free one that is too
    /// small.
    fn take(&self, kv: &KvClient, len: u64) -> Result<Lease<'_>> {
        // Buffers of the usual size are pooled and reused; a larger one serves one call.
        let len = len.max(self.chunk * 2);
        let deadline = Instant::now() + TAKE_TIMEOUT;
        let mut st = self.lock();
        loop {
            if let Some(i) = st.free.iter().position(|b| b.len() >= len) {
                let buf = st.free.swap_remove(i);
                return Ok(Lease {
                    pool: self,
                    buf: Some(buf),
                    reusable: true,
                });
            }
            if st.total < self.max_buffers || !st.free.is_empty() {
                if st.total >= self.max_buffers {
                    // Every buffer exists and none free is large enough: replace one.
                    st.free.pop();
                    st.total -= 1;
                }
                st.total += 1;
                drop(st);
                return match kv.register(len) {
                    Ok(buf) => Ok(Lease {
                        pool: self,
                        buf: Some(buf),
                        reusable: true,
                    }),
                    Err(e) => {
                        self.lock().total -= 1;
                        self.freed.notify_one();
                        Err(e)
                    }
                };
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(KvError::Busy(format!(
                    "all {} staging buffers stayed busy for {}s",
                    self.max_buffers,
                    TAKE_TIMEOUT.as_secs()
                )));
            }
            st = self
                .freed
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Fetches `keys[i]` into `dests[i]` (whose `len` is the room for the block); returns each
    /// block's length, `None` where the key is absent.
    pub fn get_into(
        &self,
        kv: &KvClient,
        bucket: &str,
        keys: &[String],
        dests: &[Span],
    ) -> Result<Vec<Option<u64>>> {
        let parts: Vec<&[Span]> = dests.iter().map(std::slice::from_ref).collect();
        self.get_into_parts(kv, bucket, keys, &parts)
    }

    /// As [`SpanStaging::get_into_parts`], for memory this process owns and holds for the
    /// call (a buffer it just allocated, an object it keeps alive; never an address a caller
    /// names): written by the node in place through the client's own memory (`own.rs`) where it can, else
    /// staged.
    pub fn get_into_own(
        &self,
        kv: &KvClient,
        bucket: &str,
        keys: &[String],
        dests: &[&[Span]],
    ) -> Result<Vec<Option<u64>>> {
        self.get_into_spans(kv, bucket, keys, dests, true)
    }

    /// As [`SpanStaging::put_from_parts`], for memory this process owns and holds for the
    /// call (as [`SpanStaging::get_into_own`]).
    pub fn put_from_own(
        &self,
        kv: &KvClient,
        bucket: &str,
        keys: &[String],
        srcs: &[&[Span]],
        options: &PutOptions,
    ) -> Result<()> {
        self.put_from_spans(kv, bucket, keys, srcs, options, true)
    }

    /// Fetches `keys[i]` into the spans `dests[i]`, in order (scatter: the block's first bytes
    /// fill the first span, the next ones the second...; their lengths sum to the room for
    /// the block); returns each block's length, `None` where the key is absent. The node
    /// writes every block of a chunk into the staging buffer in one call, whatever the number
    /// of spans.
    pub fn get_into_parts(
        &self,
        kv: &KvClient,
        bucket: &str,
        keys: &[String],
        dests: &[&[Span]],
    ) -> Result<Vec<Option<u64>>> {
        self.get_into_spans(kv, bucket, keys, dests, false)
    }

    /// [`SpanStaging::get_into_parts`], trying the client's own memory first when `own`.
    fn get_into_spans(
        &self,
        kv: &KvClient,
        bucket: &str,
        keys: &[String],
        dests: &[&[Span]],
        own: bool,
    ) -> Result<Vec<Option<u64>>> {
        check_lens(keys, dests.len())?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        if own {
            if let Some(done) = self.in_place.get_into_own(kv, bucket, keys, dests) {
                return done;
            }
        }
        check_host(dests)?;
        if let Some(done) = self.in_place.get_into(kv, bucket, keys, dests) {
            return done;
        }
        let caps: Vec<u64> = dests
            .iter()
            .map(|d| total(d).min(MAX_STAGED_BLOCK))
            .collect();
        if let Some(i) = caps.iter().position(|&c| c == 0) {
            return Err(invalid(format!("key {i} has a size of 0 bytes")));
        }
        let chunks = plan(&caps, self.chunk);
        let half = largest_chunk(&caps, &chunks);
        let lease = self.take(kv, if chunks.len() > 1 { half * 2 } else { half })?;
        let buf = lease.buf();
        let mut out = vec![None; keys.len()];
        let result = std::thread::scope(|s| -> Result<()> {
            let mut copying = None;
            for (k, r) in chunks.iter().enumerate() {
                let offsets = offsets_in_half(&caps[r.clone()], k, half);
                let got = kv.batch_get_into_ranges(
                    bucket,
                    &keys[r.clone()],
                    buf,
                    &offsets,
                    &caps[r.clone()],
                );
                // The copy of the previous chunk reads the other half: wait for it before
                // anything else, whatever this chunk's result.
                if let Some(h) = copying.take() {
                    join(h)?;
                }
                let got = got?;
                for (i, n) in r.clone().zip(&got) {
                    out[i] = *n;
                }
                let targets = &dests[r.clone()];
                let job = move || copy_out(buf, &offsets, &got, targets);
                if k + 1 < chunks.len() {
                    copying = Some(s.spawn(job));
                } else {
                    job()?;
                }
            }
            Ok(())
        });
        lease.settle(result)?;
        Ok(out)
    }

    /// Stores `keys[i]` from `srcs[i]`, with the put's `options` (mode, replicas, preferred
    /// node, pin) applied to every chunk.
    pub fn put_from(
        &self,
        kv: &KvClient,
        bucket: &str,
        keys: &[String],
        srcs: &[Span],
        options: &PutOptions,
    ) -> Result<()> {
        let parts: Vec<&[Span]> = srcs.iter().map(std::slice::from_ref).collect();
        self.put_from_parts(kv, bucket, keys, &parts, options)
    }

    /// Stores each `keys[i]` as the concatenation of the spans `srcs[i]` (gather), with the
    /// put's `options`: one node call per chunk, whatever the number of spans.
    pub fn put_from_parts(
        &self,
        kv: &KvClient,
        bucket: &str,
        keys: &[String],
        srcs: &[&[Span]],
        options: &PutOptions,
    ) -> Result<()> {
        self.put_from_spans(kv, bucket, keys, srcs, options, false)
    }

    /// [`SpanStaging::put_from_parts`], trying the client's own memory first when `own`.
    fn put_from_spans(
        &self,
        kv: &KvClient,
        bucket: &str,
        keys: &[String],
        srcs: &[&[Span]],
        options: &PutOptions,
        own: bool,
    ) -> Result<()> {
        check_lens(keys, srcs.len())?;
        if keys.is_empty() {
            return Ok(());
        }
        if own {
            if let Some(done) = self.in_place.put_from_own(kv, bucket, keys, srcs, options) {
                return done;
            }
        }
        check_host(srcs)?;
        if let Some(done) = self.in_place.put_from(kv, bucket, keys, srcs, options) {
            return done;
        }
        let lens: Vec<u64> = srcs.iter().map(|s| total(s)).collect();
        if let Some(i) = lens.iter().position(|&l| l > MAX_STAGED_BLOCK) {
            return Err(invalid(format!(
                "block {i} is {} bytes; a block is at most {MAX_STAGED_BLOCK}",
                lens[i]
            )));
        }
        let chunks = plan(&lens, self.chunk);
        let half = largest_chunk(&lens, &chunks).max(1);
        let lease = self.take(kv, if chunks.len() > 1 { half * 2 } else { half })?;
        let buf = lease.buf();
        let offsets: Vec<Vec<u64>> = chunks
            .iter()
            .enumerate()
            .map(|(k, r)| offsets_in_half(&lens[r.clone()], k, half))
            .collect();
        let first = copy_in(buf, &offsets[0], &srcs[chunks[0].clone()]);
        let result = first.and_then(|()| {
            std::thread::scope(|s| -> Result<()> {
                for (k, r) in chunks.iter().enumerate() {
                    let (keys, offs, lens) = (&keys[r.clone()], &offsets[k], &lens[r.clone()]);
                    let put = move || -> Result<()> {
                        kv.batch_put_from_opts(bucket, keys, buf, offs, lens, options)?;
                        Ok(())
                    };
                    match chunks.get(k + 1) {
                        Some(next) => {
                            // The node reads this chunk's half while the next chunk is copied
                            // into the other one.
                            let putting = s.spawn(put);
                            let copied = copy_in(buf, &offsets[k + 1], &srcs[next.clone()]);
                            join(putting)?;
                            copied?;
                        }
                        None => put()?,
                    }
                }
                Ok(())
            })
        });
        lease.settle(result)
    }
}

fn check_lens(keys: &[String], n: usize) -> Result<()> {
    if keys.len() != n {
        return Err(invalid(format!("{} keys but {n} buffers", keys.len())));
    }
    Ok(())
}

/// Only host memory is copied here (a device span goes through its device's staging); an
/// empty span copies nothing, wherever it is.
fn check_host(blocks: &[&[Span]]) -> Result<()> {
    let on_device = |s: &&Span| s.device.is_some() && s.len > 0;
    match blocks.iter().flat_map(|b| b.iter()).find(on_device) {
        Some(s) => Err(invalid(format!(
            "a span of device {} memory cannot be staged through host buffers",
            s.device.unwrap_or_default()
        ))),
        None => Ok(()),
    }
}

fn join(h: std::thread::ScopedJoinHandle<'_, Result<()>>) -> Result<()> {
    h.join()
        .unwrap_or_else(|_| Err(invalid("a staging copy panicked")))
}

/// Splits blocks of `sizes` into runs of consecutive blocks of at most `chunk` bytes and
/// [`MAX_BATCH`] keys (a block larger than `chunk` is a run of its own).
fn plan(sizes: &[u64], chunk: u64) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut sum = 0u64;
    for (i, &s) in sizes.iter().enumerate() {
        if i > start && (sum.saturating_add(s) > chunk || i - start == MAX_BATCH) {
            out.push(start..i);
            start = i;
            sum = 0;
        }
        sum = sum.saturating_add(s);
    }
    out.push(start..sizes.len());
    out
}

fn largest_chunk(sizes: &[u64], chunks: &[Range<usize>]) -> u64 {
    chunks
        .iter()
        .map(|r| sizes[r.clone()].iter().sum::<u64>())
        .max()
        .unwrap_or(0)
}

/// The offsets of a chunk's blocks, packed from the start of half `k % 2`.
fn offsets_in_half(sizes: &[u64], k: usize, half: u64) -> Vec<u64> {
    let mut at = if k % 2 == 0 { 0 } else { half };
    sizes
        .iter()
        .map(|&s| {
            let o = at;
            at += s;
            o
        })
        .collect()
}

/// The bytes of a key's spans together.
fn total(parts: &[Span]) -> u64 {
    parts.iter().fold(0u64, |a, p| a.saturating_add(p.len))
}

/// Copies each present block out of the staging buffer into the caller's spans, filling them
/// in order.
fn copy_out(buf: &Buffer, offsets: &[u64], got: &[Option<u64>], dests: &[&[Span]]) -> Result<()> {
    for ((&off, n), parts) in offsets.iter().zip(got).zip(dests) {
        let Some(n) = *n else { continue };
        let room = total(parts);
        if n > room {
            return Err(invalid(format!(
                "the node sent {n} bytes for spans of {room}"
            )));
        }
        let mut done = 0u64;
        for d in *parts {
            if done == n {
                break;
            }
            let take = d.len.min(n - done);
            // SAFETY: `d` names writable memory of at least `d.len` bytes that stays valid for
            // the call: an exported buffer or tensor pinned by the caller, or a pointer range
            // the caller registered (and so vouched for) with register_buffer.
            let dst = unsafe { std::slice::from_raw_parts_mut(d.addr as *mut u8, take as usize) };
            buf.read_at(off + done, dst)?;
            done += take;
        }
    }
    Ok(())
}

/// Copies the caller's spans into the staging buffer, each key's spans one after the other.
fn copy_in(buf: &Buffer, offsets: &[u64], srcs: &[&[Span]]) -> Result<()> {
    for (&off, parts) in offsets.iter().zip(srcs) {
        let mut at = off;
        for s in *parts {
            if s.len == 0 {
                continue;
            }
            // SAFETY: as in `copy_out`, for readable memory of `s.len` bytes.
            let src = unsafe { std::slice::from_raw_parts(s.addr as *const u8, s.len as usize) };
            buf.write_at(at, src)?;
            at += s.len;
        }
    }
    Ok(())
}

/// Spans one node call names at most (the node takes 65,536).
const MAX_CALL_SPANS: usize = 16_384;

/// What became of a host range registered with `register_buffer`.
enum Registered {
    /// Registered with the engine: the range's length, the registration, and the address
    /// of the registration's first byte (the range's own start, or the start of the memfd
    /// mapping the range lies in).
    InPlace {
        len: u64,
        buf: Arc<Buffer>,
        origin: usize,
    },
    /// Staged, and why.
    Staged(String),
}

/// The registered host ranges, by start address (they never overlap: `Registry` refuses it).
#[derive(Default)]
pub struct InPlace {
    ranges: Mutex<BTreeMap<usize, Registered>>,
}

impl InPlace {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<usize, Registered>> {
        self.ranges.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers `[addr, addr + len)` with the engine. A failure is not an error: the range
    /// then goes through staging, as it always could, and [`InPlace::path`] says why.
    ///
    /// # Safety
    ///
    /// The range must stay mapped until [`InPlace::unregister`] (the contract of Mooncake's
    /// `register_buffer`, which the caller has already checked the range against).
    pub unsafe fn register(&self, kv: &KvClient, addr: usize, len: u64) {
        let registered = if kv.cluster_nodes() > 0 {
            Registered::Staged("the client routes over a cluster".into())
        } else {
            // SAFETY: the caller's contract.
            match unsafe { kv.register_host(addr as *mut u8, len) } {
                Ok(buf) => Registered::InPlace {
                    len,
                    buf: Arc::new(buf),
                    origin: addr,
                },
                Err(err) => Registered::Staged(err.to_string()),
            }
        };
        self.lock().insert(addr, registered);
    }

    /// Registers `[addr, addr + len)`, which lies in the caller's `MAP_SHARED` mapping of the
    /// memfd `fd` from its offset 0 at `map_base` (`map_len` bytes): memory the engine
    /// allocated through Yutu. The node then maps the memfd and copies with `memcpy`. As
    /// [`InPlace::register`], a failure falls back to plain process memory, then to staging.
    ///
    /// # Safety
    ///
    /// As [`InPlace::register`]; and `map_base .. map_base + map_len` must be the caller's
    /// mapping of `fd` from offset 0, holding the range.
    pub unsafe fn register_memfd(
        &self,
        kv: &KvClient,
        addr: usize,
        len: u64,
        fd: std::os::fd::BorrowedFd<'_>,
        map_base: usize,
        map_len: u64,
    ) {
        let inside =
            addr >= map_base && (addr as u128 + len as u128) <= map_base as u128 + map_len as u128;
        if inside && kv.cluster_nodes() == 0 {
            match kv.register_memfd(fd, map_len) {
                Ok(buf) => {
                    let registered = Registered::InPlace {
                        len,
                        buf: Arc::new(buf),
                        origin: map_base,
                    };
                    self.lock().insert(addr, registered);
                    return;
                }
                Err(err) => {
                    tracing::debug!(%err, "memfd not registered, as process memory instead")
                }
            }
        }
        // SAFETY: the caller's contract.
        unsafe { self.register(kv, addr, len) }
    }

    /// Records the range at `addr` as one to stage, and why (the caller chose not to have it
    /// reached in place).
    pub fn register_staged(&self, addr: usize, why: String) {
        self.lock().insert(addr, Registered::Staged(why));
    }

    /// How the host range registered at `addr` travels: `"in place"`, or `"staged: "` and
    /// why; `None` when no host range starts there.
    pub fn path(&self, addr: usize) -> Option<String> {
        self.lock().get(&addr).map(|r| match r {
            Registered::InPlace { buf, .. } if buf.segment().region().process() => {
                "in place".to_string()
            }
            Registered::InPlace { .. } => "in place: memfd".to_string(),
            Registered::Staged(why) => format!("staged: {why}"),
        })
    }

    /// Forgets the range registered at `addr` (the engine unregisters it once no call uses it).
    pub fn unregister(&self, addr: usize) {
        self.lock().remove(&addr);
    }

    /// Fetches `keys[i]` into the spans `dests[i]`, memory the caller owns for the call (the
    /// client's own memory, `own.rs`); `None` when that cannot be done in place.
    pub fn get_into_own(
        &self,
        kv: &KvClient,
        bucket: &str,
        keys: &[String],
        dests: &[&[Span]],
    ) -> Option<Result<Vec<Option<u64>>>> {
        let parts = KvClient::own_parts(dests)?;
        let own = kv.own_memory()?;
        Some(get_parts_on(kv, bucket, keys, &own, &parts))
    }

    /// Stores `keys[i]` from the spans `srcs[i]`, memory the caller owns for the call; `None`
    /// as for [`InPlace::get_into_own`].
    pub fn put_from_own(
        &self,
        kv: &KvClient,
        bucket: &str,
        keys: &[String],
        srcs: &[&[Span]],
        options: &PutOptions,
    ) -> Option<Result<()>> {
        let parts = KvClient::own_parts(srcs)?;
        let own = kv.own_memory()?;
        Some(put_parts_on(kv, bucket, keys, &own, &parts, options))
    }

    /// The registration holding every span, and each block's spans as ranges of it; `None`
    /// when the spans are not all in one registered host range.
    fn resolve(&self, blocks: &[&[Span]]) -> Option<(Arc<Buffer>, Vec<Parts>)> {
        let first = blocks.iter().flat_map(|b| b.iter()).find(|s| s.len > 0)?;
        let ranges = self.lock();
        let (&base, Registered::InPlace { len, buf, origin }) =
            ranges.range(..=first.addr).next_back()?
        else {
            return None;
        };
        let end = base.checked_add(*len as usize)?;
        let mut parts = Vec::with_capacity(blocks.len());
        for b in blocks {
            let mut p = Vec::with_capacity(b.len());
            for s in b.iter().filter(|s| s.len > 0) {
                let inside = s.device.is_none()
                    && s.addr >= base
                    && s.addr.checked_add(s.len as usize).is_some_and(|e| e <= end);
                if !inside {
                    return None;
                }
                p.push(((s.addr - origin) as u64, s.len));
            }
            if p.is_empty() {
                return None;
            }
            parts.push(p);
        }
        Some((Arc::clone(buf), parts))
    }

    /// Fetches `keys[i]` into the spans `dests[i]` in place; `None` when the spans are not
    /// in one registered range (the caller stages instead).
    pub fn get_into(
        &self,
        kv: &KvClient,
        bucket: &str,
        keys: &[String],
        dests: &[&[Span]],
    ) -> Option<Result<Vec<Option<u64>>>> {
        let (buf, parts) = self.resolve(dests)?;
        Some(get_parts_on(kv, bucket, keys, &buf, &parts))
    }

    /// Stores `keys[i]` from the spans `srcs[i]` in place; `None` as for `get_into`.
    pub fn put_from(
        &self,
        kv: &KvClient,
        bucket: &str,
        keys: &[String],
        srcs: &[&[Span]],
        options: &PutOptions,
    ) -> Option<Result<()>> {
        let (buf, parts) = self.resolve(srcs)?;
        Some(put_parts_on(kv, bucket, keys, &buf, &parts, options))
    }
}

/// `keys[i]` fetched into the ranges `parts[i]` of `buf`, in as many node calls as the
/// limits on keys and spans take ([`batches`]).
fn get_parts_on(
    kv: &KvClient,
    bucket: &str,
    keys: &[String],
    buf: &Buffer,
    parts: &[Parts],
) -> Result<Vec<Option<u64>>> {
    let mut out = Vec::with_capacity(keys.len());
    for (ks, ps) in batches(keys, parts) {
        out.extend(kv.batch_get_into_parts(bucket, ks, buf, ps)?);
    }
    Ok(out)
}

/// `keys[i]` stored from the ranges `parts[i]` of `buf`, as [`get_parts_on`].
fn put_parts_on(
    kv: &KvClient,
    bucket: &str,
    keys: &[String],
    buf: &Buffer,
    parts: &[Parts],
    options: &PutOptions,
) -> Result<()> {
    for (ks, ps) in batches(keys, parts) {
        kv.batch_put_from_parts(bucket, ks, buf, ps, options)?;
    }
    Ok(())
}

/// `keys` and their parts cut into node calls of at most `MAX_BATCH` keys and
/// `MAX_CALL_SPANS` spans.
fn batches<'a>(keys: &'a [String], parts: &'a [Parts]) -> Vec<(&'a [String], &'a [Parts])> {
    let mut out = Vec::new();
    let (mut start, mut spans) = (0, 0);
    for (i, p) in parts.iter().enumerate() {
        if i > start && (i - start == MAX_BATCH || spans + p.len() > MAX_CALL_SPANS) {
            out.push((&keys[start..i], &parts[start..i]));
            (start, spans) = (i, 0);
        }
        spans += p.len();
    }
    if start < keys.len() {
        out.push((&keys[start..], &parts[start..]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_respect_both_limits() {
        let keys: Vec<String> = (0..5000).map(|i| i.to_string()).collect();
        let parts: Vec<Parts> = (0..5000).map(|_| vec![(0, 1)]).collect();
        let b = batches(&keys, &parts);
        assert_eq!(b.len(), 2);
        assert_eq!(b[0].0.len(), MAX_BATCH);
        let wide: Vec<Parts> = (0..3).map(|_| vec![(0, 1); 10_000]).collect();
        let b = batches(&keys[..3], &wide);
        assert_eq!(b.len(), 3);
        assert!(batches(&[], &[]).is_empty());
    }
}
