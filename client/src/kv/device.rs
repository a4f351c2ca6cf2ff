//! GPU buffers in the KV API: [`DeviceBuffer`]s are registered like host [`Buffer`]s and go
//! wherever one goes ([`Memory`]); their blocks move by GPUDirect RDMA where the NIC can reach
//! the GPU, and are staged everywhere else.
//!
//! **GPUDirect.** When this client's engine runs the rdma transport and a peer-memory module
//! is loaded (`yutu_transfer::device::gpudirect`), registration also registers the device
//! range with the NIC. A call whose nodes all offer RDMA then hands the node a descriptor of
//! GPU memory, and the node's one-sided writes (a get) and reads (a put) reach it directly,
//! with no copy on this host. The CPU paths refuse such a segment, so a node that cannot use
//! RDMA gets a refusal, never a CPU copy into device memory.
//!
//! **Staging.** Otherwise, the node's one-sided copies reach only host memory it can map or
//! address through this client's engine, so a batch for device memory runs through the
//! staging pipeline of `yutu_transfer::device::staging`: a pinned host buffer registered with
//! the engine, whose
//! two halves alternate between the node's copy of one chunk and the device's copy of the
//! previous one. Staging buffers are pooled per client and device: at most
//! [`STAGING_BUFFERS`] per device, with halves of [`STAGING_HALF`] (grown for a batch whose
//! largest block needs more, and then not kept).
//!
//! A device copy that fails fails its block only; the call then answers
//! [`KvError::Blocks`], which says which blocks failed and carries the others' results.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use yutu_transfer::device::staging::{self, BlockError, ChunkRequest, DeviceBlock, StagingSlot};
use yutu_transfer::device::{gpudirect, CancelToken, Device, DeviceMemory};
use yutu_transfer::MemoryRegion;

use super::{Buffer, Inner, KvClient, KvError, PutOptions, MAX_BATCH};

/// Bytes in each half of a pooled staging buffer: the most a chunk moves per node call, and
/// the largest block staged without a buffer of its own. Large enough that a chunk of 16 MiB
/// blocks spans four of them, which the node's shards copy in parallel: one block per chunk
/// would leave the copy to a single shard, slower than PCIe.
pub const STAGING_HALF: u64 = 64 << 20;
/// Most staging buffers one client keeps per device (each `2 * STAGING_HALF`, 128 MiB, of
/// pinned memory); a call that finds them all lent waits for one, up to [`STAGING_WAIT`].
pub const STAGING_BUFFERS: usize = 4;
/// How long a call waits for a staging buffer other threads are using.
pub const STAGING_WAIT: Duration = Duration::from_secs(60);

/// Device memory registered with a [`KvClient`]: the source of puts and the target of gets,
/// used exactly like a [`Buffer`] (offsets into it).
pub struct DeviceBuffer {
    device: Arc<dyn Device>,
    memory: DeviceMemory,
    inner: Arc<Inner>,
    /// The same memory registered with the NIC (GPUDirect RDMA), when it could be; also
    /// listed in the client's [`DirectRanges`] until this buffer is dropped.
    direct: Option<Arc<Buffer>>,
    /// How this buffer's blocks travel, and why.
    path: String,
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("device", &self.device.name())
            .field("ptr", &format_args!("{:#x}", self.memory.ptr))
            .field("len", &self.memory.len)
            .field("path", &self.path)
            .finish()
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if let Some(direct) = &self.direct {
            self.inner.gpudirect.remove(direct);
        }
    }
}

/// The GPU ranges of one client registered with the NIC (by [`KvClient::register_device`]),
/// for the calls that name device blocks by address.
#[derive(Default)]
pub(super) struct DirectRanges {
    ranges: Mutex<Vec<(DeviceMemory, Arc<Buffer>)>>,
}

impl DirectRanges {
    fn lock(&self) -> MutexGuard<'_, Vec<(DeviceMemory, Arc<Buffer>)>> {
        // Pushes and removals leave the list consistent.
        self.ranges.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn insert(&self, memory: DeviceMemory, buffer: Arc<Buffer>) {
        self.lock().push((memory, buffer));
    }

    fn remove(&self, buffer: &Arc<Buffer>) {
        self.lock().retain(|(_, b)| !Arc::ptr_eq(b, buffer));
    }

    /// The registration holding every block (of GPU `ordinal`), and each block's offset in
    /// it; `None` when no single registration holds them all.
    fn find(&self, ordinal: u32, blocks: &[DeviceBlock]) -> Option<(Arc<Buffer>, Vec<u64>)> {
        let ranges = self.lock();
        let first = blocks.first()?;
        let (memory, buffer) = ranges
            .iter()
            .find(|(m, _)| m.ordinal == ordinal && inside(m, first))?;
        Some((buffer.clone(), offsets_in(memory, blocks)?))
    }
}

/// Each block's offset in `memory`, `None` unless all of them lie inside it.
fn offsets_in(memory: &DeviceMemory, blocks: &[DeviceBlock]) -> Option<Vec<u64>> {
    blocks
        .iter()
        .map(|b| inside(memory, b).then(|| b.addr - memory.ptr))
        .collect()
}

/// Whether `block` lies inside `memory`.
fn inside(memory: &DeviceMemory, block: &DeviceBlock) -> bool {
    block.addr >= memory.ptr
        && block
            .addr
            .checked_add(block.len)
            .is_some_and(|end| end <= memory.ptr.saturating_add(memory.len))
}

impl DeviceBuffer {
    pub fn len(&self) -> u64 {
        self.memory.len
    }

    /// Always false: registration refuses empty ranges.
    pub fn is_empty(&self) -> bool {
        self.memory.len == 0
    }

    pub fn memory(&self) -> &DeviceMemory {
        &self.memory
    }

    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    /// How this buffer's blocks travel: `gpudirect: ...` when it is registered with the NIC,
    /// else `staged: ` and why not.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// True when the buffer is registered with the NIC for GPUDirect RDMA.
    pub fn gpudirect(&self) -> bool {
        self.direct.is_some()
    }
}

/// The memory of a KV call: host or device. `&Buffer` and `&DeviceBuffer` both convert, so
/// every batch call takes either.
#[derive(Debug, Clone, Copy)]
pub enum Memory<'a> {
    Host(&'a Buffer),
    Device(&'a DeviceBuffer),
}

impl<'a> From<&'a Buffer> for Memory<'a> {
    fn from(b: &'a Buffer) -> Memory<'a> {
        Memory::Host(b)
    }
}

impl<'a> From<&'a DeviceBuffer> for Memory<'a> {
    fn from(b: &'a DeviceBuffer) -> Memory<'a> {
        Memory::Device(b)
    }
}

impl Memory<'_> {
    pub fn len(&self) -> u64 {
        match self {
            Memory::Host(b) => b.len(),
            Memory::Device(b) => b.len(),
        }
    }

    /// Always false: both kinds have at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Blocks of a staged batch that were not moved, and what the others did.
#[derive(Debug)]
pub struct BlockFailures {
    /// Index in the batch and reason, for every block that failed.
    pub failed: Vec<(usize, BlockError)>,
    /// Blocks in the batch.
    pub total: usize,
    /// For a get: each block's length (`None` where the key is absent or the block failed).
    pub copied: Vec<Option<u64>>,
    /// For a put: each stored block's ETag (`None` where the block failed).
    pub etags: Vec<Option<String>>,
}

impl fmt::Display for BlockFailures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} of {} blocks failed", self.failed.len(), self.total)?;
        let shown: Vec<String> = self
            .failed
            .iter()
            .take(4)
            .map(|(i, e)| format!("block {i}: {e}"))
            .collect();
        write!(f, " ({}", shown.join("; "))?;
        if self.failed.len() > shown.len() {
            write!(f, "; ...")?;
        }
        write!(f, ")")
    }
}

/// Each block's outcome of a staged batch, and the first node error (kept whole).
type Staged<T> = (Vec<Result<T, BlockError>>, Option<KvError>);

/// Staging buffers of one client, per device.
#[derive(Default)]
pub(super) struct StagingPool {
    state: Mutex<HashMap<String, DevicePool>>,
    freed: Condvar,
}

#[derive(Default)]
struct DevicePool {
    free: Vec<Slot>,
    /// Slots of this device in existence, free or lent.
    total: usize,
}

/// A staging slot and its registration with the client's engine.
struct Slot {
    // Unregistered (dropped) before the slot's pinned buffer is unpinned and freed.
    buffer: Buffer,
    staging: StagingSlot,
}

/// A slot lent to one call; back to the pool when dropped, unless the call failed in a way
/// that may leave the node still writing it, or it was grown for one call.
struct Lease<'a> {
    pool: &'a StagingPool,
    key: String,
    slot: Option<Slot>,
    keep: bool,
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        let Some(slot) = self.slot.take() else { return };
        let mut st = self.pool.lock();
        let dev = st.entry(self.key.clone()).or_default();
        if self.keep && slot.staging.half() <= STAGING_HALF {
            dev.free.push(slot);
        } else {
            dev.total = dev.total.saturating_sub(1);
            drop(st);
            drop(slot);
        }
        self.pool.freed.notify_all();
    }
}

impl StagingPool {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, DevicePool>> {
        // Every change under the lock leaves the map consistent (a push, a pop, a count).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lends a slot of `device` whose halves hold at least `half` bytes.
    fn take(
        &self,
        kv: &KvClient,
        device: &Arc<dyn Device>,
        half: u64,
    ) -> Result<Lease<'_>, KvError> {
        let key = device.name();
        let half = half.max(STAGING_HALF);
        let deadline = Instant::now() + STAGING_WAIT;
        let mut st = self.lock();
        loop {
            let dev = st.entry(key.clone()).or_default();
            if let Some(i) = dev.free.iter().position(|s| s.staging.half() >= half) {
                let slot = dev.free.swap_remove(i);
                return Ok(self.lease(key, slot));
            }
            if dev.total < STAGING_BUFFERS || !dev.free.is_empty() {
                if dev.total >= STAGING_BUFFERS {
                    // All exist and none free is large enough: replace a free one.
                    dev.free.pop();
                    dev.total -= 1;
                }
                dev.total += 1;
                drop(st);
                return match new_slot(kv, device.as_ref(), half) {
                    Ok(slot) => Ok(self.lease(key, slot)),
                    Err(e) => {
                        let mut st = self.lock();
                        let dev = st.entry(key).or_default();
                        dev.total = dev.total.saturating_sub(1);
                        self.freed.notify_all();
                        Err(e)
                    }
                };
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(KvError::Busy(format!(
                    "all {STAGING_BUFFERS} staging buffers of {key} stayed busy for {}s",
                    STAGING_WAIT.as_secs()
                )));
            }
            st = self
                .freed
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn lease(&self, key: String, slot: Slot) -> Lease<'_> {
        Lease {
            pool: self,
            key,
            slot: Some(slot),
            keep: true,
        }
    }
}

fn new_slot(kv: &KvClient, device: &dyn Device, half: u64) -> Result<Slot, KvError> {
    let staging = StagingSlot::new(device, half).map_err(KvError::Device)?;
    let segment = kv
        .inner
        .engine
        .register(staging.pinned().region().clone())?;
    Ok(Slot {
        buffer: Buffer {
            segment,
            inner: kv.inner.clone(),
        },
        staging,
    })
}

impl KvClient {
    /// How device memory travels between this client and its nodes, and why: GPUDirect RDMA
    /// when the engine runs rdma and a peer-memory module is loaded, else staged through
    /// pinned host memory, with the reason (no RDMA path, no peer-memory module).
    /// [`DeviceBuffer::path`] says what one registration got.
    pub fn device_path(&self) -> String {
        gpudirect::status(self.rdma_unavailable(), std::path::Path::new(SYS_MODULE))
    }

    fn rdma_unavailable(&self) -> Option<String> {
        self.inner.engine.rdma_unavailable().map(|e| e.to_string())
    }

    /// Registers `memory` with the NIC when GPUDirect can be tried here; the registration (or
    /// `None`) and the buffer's path.
    ///
    /// # Safety
    ///
    /// As [`KvClient::register_device`]: `memory` is device memory that stays allocated while
    /// the returned buffer exists.
    unsafe fn register_direct(&self, memory: &DeviceMemory) -> (Option<Arc<Buffer>>, String) {
        let sys_module = std::path::Path::new(SYS_MODULE);
        if let Some(why) = gpudirect::blocker(self.rdma_unavailable(), sys_module) {
            return (None, format!("staged: {why}"));
        }
        // SAFETY: this function's contract, passed on: the caller keeps the memory allocated
        // while the DeviceBuffer (which holds the registration) exists.
        let registered =
            unsafe { MemoryRegion::device_memory(memory.ordinal, memory.ptr, memory.len) }
                .map_err(yutu_transfer::TransferError::from)
                .and_then(|region| self.inner.engine.register(region));
        match registered {
            Ok(segment) => {
                let buffer = Arc::new(Buffer {
                    segment,
                    inner: self.inner.clone(),
                });
                self.inner.gpudirect.insert(*memory, buffer.clone());
                (Some(buffer), gpudirect::status(None, sys_module))
            }
            Err(err) => {
                tracing::warn!(%err, ptr = memory.ptr, len = memory.len, "GPU buffer not registered with the NIC; its blocks will be staged");
                (None, format!("staged: {err}"))
            }
        }
    }

    /// For a call on `buf` (checked to be this client's): its GPUDirect registration when the
    /// call can use it, `None` when the blocks are to be staged.
    pub(super) fn direct_buffer<'b>(
        &self,
        buf: &'b DeviceBuffer,
    ) -> Result<Option<&'b Buffer>, KvError> {
        self.check_device_buffer(buf)?;
        let Some(direct) = buf.direct.as_deref() else {
            return Ok(None);
        };
        Ok(self.nodes_offer_rdma().then_some(direct))
    }

    /// Whether every node a call may reach offers RDMA (a node without it could only refuse
    /// a GPU segment).
    fn nodes_offer_rdma(&self) -> bool {
        self.route.all_offer_rdma()
    }

    /// The GPUDirect registration holding all of `blocks` (memory of `device`) and their
    /// offsets in it, when there is one and this call can use it.
    fn direct_blocks(
        &self,
        device: &Arc<dyn Device>,
        blocks: &[DeviceBlock],
    ) -> Option<(Arc<Buffer>, Vec<u64>)> {
        let found = self.inner.gpudirect.find(device.ordinal(), blocks)?;
        self.nodes_offer_rdma().then_some(found)
    }

    /// Registers device memory (a GPU buffer) for batch calls: checked with the device (it
    /// must be this device's memory, inside one allocation), then used like a [`Buffer`].
    ///
    /// # Safety
    ///
    /// The memory must stay allocated, and not be used by the caller for anything that
    /// conflicts with the calls it is named in, while the returned buffer is in use.
    pub unsafe fn register_device(
        &self,
        device: Arc<dyn Device>,
        memory: DeviceMemory,
    ) -> Result<DeviceBuffer, KvError> {
        if memory.len == 0 {
            return Err(KvError::InvalidArgument(
                "device memory needs at least one byte".into(),
            ));
        }
        device.check(&memory).map_err(KvError::Device)?;
        // SAFETY: this function's contract.
        let (direct, path) = unsafe { self.register_direct(&memory) };
        Ok(DeviceBuffer {
            device,
            memory,
            inner: self.inner.clone(),
            direct,
            path,
        })
    }

    pub(super) fn check_device_buffer(&self, buf: &DeviceBuffer) -> Result<(), KvError> {
        if !Arc::ptr_eq(&buf.inner, &self.inner) {
            return Err(KvError::InvalidArgument(
                "the device buffer was registered by another KvClient".into(),
            ));
        }
        Ok(())
    }

    /// Fetches `keys[i]` into the device memory of `blocks[i]` (whose `len` is the room for
    /// it); each block's length, `None` where the key is absent. When one GPUDirect
    /// registration ([`KvClient::register_device`]) holds every block and every node offers
    /// RDMA, the node writes them straight into GPU memory in one call. Otherwise they are
    /// staged: a failed device copy fails its block only ([`KvError::Blocks`]), and `cancel`
    /// stops the batch between chunks.
    ///
    /// # Safety
    ///
    /// Every block must be `device` memory the caller may write, untouched by anything else
    /// until this returns (each is also checked with [`Device::check`]).
    pub unsafe fn batch_get_into_device(
        &self,
        bucket: &str,
        keys: &[String],
        device: &Arc<dyn Device>,
        blocks: &[DeviceBlock],
        cancel: Option<&CancelToken>,
    ) -> Result<Vec<Option<u64>>, KvError> {
        if let Some((direct, offsets)) = self.direct_blocks(device, blocks) {
            let lens: Vec<u64> = blocks.iter().map(|b| b.len).collect();
            return self.batch_get_into_ranges(bucket, keys, &*direct, &offsets, &lens);
        }
        let (outcomes, first_error) =
            self.staged(keys, device, blocks, |slot, host, first_error| {
                let fetch = |c: &ChunkRequest<'_>| {
                    let ks: Vec<String> = c.blocks.iter().map(|&i| keys[i].clone()).collect();
                    self.batch_get_into_ranges(bucket, &ks, host, c.offsets, c.lens)
                        .map_err(|e| keep_first(first_error, e))
                };
                // SAFETY: the blocks are the caller's device memory (this function's
                // contract), checked against the device by `staged`.
                unsafe { staging::get_into(slot, blocks, MAX_BATCH, cancel, fetch) }
            })?;
        collect(outcomes, first_error, |f, v| {
            f.copied = v.into_iter().map(Option::flatten).collect();
        })
    }

    /// Stores `keys[i]` from the device memory of `blocks[i]` with the put's `options`; the
    /// ETags. By GPUDirect RDMA as in [`KvClient::batch_get_into_device`], else staged: a
    /// failed device copy fails its block only ([`KvError::Blocks`]).
    ///
    /// # Safety
    ///
    /// Every block must be `device` memory the caller may read, not written by anything else
    /// until this returns (each is also checked with [`Device::check`]).
    pub unsafe fn batch_put_from_device(
        &self,
        bucket: &str,
        keys: &[String],
        device: &Arc<dyn Device>,
        blocks: &[DeviceBlock],
        options: &PutOptions,
        cancel: Option<&CancelToken>,
    ) -> Result<Vec<String>, KvError> {
        if let Some((direct, offsets)) = self.direct_blocks(device, blocks) {
            let lens: Vec<u64> = blocks.iter().map(|b| b.len).collect();
            return self.batch_put_from_opts(bucket, keys, &*direct, &offsets, &lens, options);
        }
        let (outcomes, first_error) =
            self.staged(keys, device, blocks, |slot, host, first_error| {
                let store = |c: &ChunkRequest<'_>| {
                    let ks: Vec<String> = c.blocks.iter().map(|&i| keys[i].clone()).collect();
                    self.batch_put_from_opts(bucket, &ks, host, c.offsets, c.lens, options)
                        .map_err(|e| keep_first(first_error, e))
                };
                // SAFETY: as in `batch_get_into_device`, read instead of written.
                unsafe { staging::put_from(slot, blocks, MAX_BATCH, cancel, store) }
            })?;
        collect(outcomes, first_error, |f, v| f.etags = v)
    }

    /// What both directions share: the arguments are checked, a staging slot is lent for
    /// the largest block, `run` moves the batch, and the slot goes back to the pool unless a
    /// node call failed. After a failure on this side (a timeout) the node may still be
    /// writing the slot (a get) or reading it (a put, which would then store whatever the
    /// next call put there), so such a slot is never lent again.
    fn staged<T>(
        &self,
        keys: &[String],
        device: &Arc<dyn Device>,
        blocks: &[DeviceBlock],
        run: impl FnOnce(&mut StagingSlot, &Buffer, &mut Option<KvError>) -> Vec<Result<T, BlockError>>,
    ) -> Result<Staged<T>, KvError> {
        super::same_len(keys, blocks.len(), "blocks")?;
        super::check_batch(keys)?;
        self.check_blocks(device, blocks)?;
        if keys.is_empty() {
            return Ok((Vec::new(), None));
        }
        let half = blocks.iter().map(|b| b.len).max().unwrap_or(0);
        let mut lease = self.staging.take(self, device, half)?;
        let Some(slot) = lease.slot.as_mut() else {
            return Err(KvError::InvalidArgument("no staging slot".into()));
        };
        let mut first_error = None;
        let outcomes = run(&mut slot.staging, &slot.buffer, &mut first_error);
        lease.keep = first_error.is_none();
        Ok((outcomes, first_error))
    }

    /// Each block is inside `device` memory (and a batch's blocks fit a `usize` each).
    fn check_blocks(
        &self,
        device: &Arc<dyn Device>,
        blocks: &[DeviceBlock],
    ) -> Result<(), KvError> {
        for (i, b) in blocks.iter().enumerate() {
            if b.len > staging_limit() {
                return Err(KvError::InvalidArgument(format!(
                    "block {i} is {} bytes; a staged block is at most {}",
                    b.len,
                    staging_limit()
                )));
            }
            let memory = DeviceMemory {
                ordinal: device.ordinal(),
                ptr: b.addr,
                len: b.len,
            };
            device
                .check(&memory)
                .map_err(|e| KvError::InvalidArgument(format!("block {i}: {e}")))?;
        }
        Ok(())
    }

    /// The blocks of `buf` at `offsets`, `lens` bytes each (checked against the buffer).
    pub(super) fn device_blocks(
        buf: &DeviceBuffer,
        offsets: &[u64],
        lens: &[u64],
    ) -> Result<Vec<DeviceBlock>, KvError> {
        offsets
            .iter()
            .zip(lens)
            .enumerate()
            .map(|(i, (&off, &len))| {
                let addr = buf
                    .memory
                    .addr(off, len)
                    .map_err(|e| KvError::InvalidArgument(format!("key {i}: {e}")))?;
                Ok(DeviceBlock { addr, len })
            })
            .collect()
    }
}

/// Where the kernel lists its loaded modules (the peer-memory module among them).
const SYS_MODULE: &str = "/sys/module";

/// The largest block staged: 1 GiB, so that a staging buffer (two halves) stays a sane size.
fn staging_limit() -> u64 {
    1 << 30
}

/// Caps the room of the key at the highest offset (`last`), which runs to the end of the
/// buffer, at the largest room of the others (at least [`STAGING_HALF`]). Staging reserves
/// each block's room: an engine that registered its whole KV cache would otherwise have the
/// last block of every call reserve the rest of the cache in pinned memory. A larger last
/// block needs [`KvClient::batch_get_into_ranges`] with its room.
pub(super) fn cap_open_room(capacities: &mut [u64], last: usize) {
    let others = capacities
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != last)
        .map(|(_, &c)| c)
        .max()
        .unwrap_or(0);
    if let Some(c) = capacities.get_mut(last) {
        *c = (*c).min(others.max(STAGING_HALF));
    }
}

/// Keeps the first node error of a batch whole (with its S3 code), and gives the pipeline
/// its message.
fn keep_first(first: &mut Option<KvError>, e: KvError) -> String {
    let msg = e.to_string();
    if first.is_none() {
        *first = Some(e);
    }
    msg
}

/// One outcome per block into the call's answer: all good → the values; the node failed
/// before anything moved → that error as it was; otherwise [`KvError::Blocks`], with
/// `fill` putting the blocks' values (`None` where a block failed) into it.
fn collect<T>(
    outcomes: Vec<Result<T, BlockError>>,
    first_error: Option<KvError>,
    fill: impl FnOnce(&mut BlockFailures, Vec<Option<T>>),
) -> Result<Vec<T>, KvError> {
    let total = outcomes.len();
    if outcomes.iter().all(Result::is_ok) {
        return Ok(outcomes.into_iter().flatten().collect());
    }
    let nothing_moved = outcomes
        .iter()
        .all(|o| matches!(o, Err(BlockError::Node(_))));
    if let (true, Some(e)) = (nothing_moved, first_error) {
        // Nothing moved and the node said why: that is the answer, with its code.
        return Err(e);
    }
    let mut failed = Vec::new();
    let mut values = Vec::with_capacity(total);
    for (i, o) in outcomes.into_iter().enumerate() {
        match o {
            Ok(v) => values.push(Some(v)),
            Err(e) => {
                values.push(None);
                failed.push((i, e));
            }
        }
    }
    let mut f = BlockFailures {
        failed,
        total,
        copied: Vec::new(),
        etags: Vec::new(),
    };
    fill(&mut f, values);
    Err(KvError::Blocks(Box::new(f)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_map_into_a_registration_only_when_all_lie_inside() {
        let memory = DeviceMemory {
            ordinal: 0,
            ptr: 0x10_000,
            len: 0x1000,
        };
        let block = |addr, len| DeviceBlock { addr, len };
        assert_eq!(
            offsets_in(&memory, &[block(0x10_000, 0x100), block(0x10_f00, 0x100)]),
            Some(vec![0, 0xf00])
        );
        // One byte past the end, one byte before the start, and an overflowing length.
        assert_eq!(offsets_in(&memory, &[block(0x10_f00, 0x101)]), None);
        assert_eq!(offsets_in(&memory, &[block(0xffff, 0x10)]), None);
        assert_eq!(offsets_in(&memory, &[block(0x10_000, u64::MAX)]), None);
        assert_eq!(
            offsets_in(&memory, &[block(0x10_000, 1), block(0x20_000, 1)]),
            None
        );
    }

    #[test]
    fn the_open_room_is_capped_at_the_largest_other_room() {
        let mut caps = vec![4096, 1 << 30, 8192];
        cap_open_room(&mut caps, 1);
        assert_eq!(caps, vec![4096, STAGING_HALF, 8192]);
        let mut caps = vec![STAGING_HALF * 2, 1 << 30];
        cap_open_room(&mut caps, 1);
        assert_eq!(caps, vec![STAGING_HALF * 2, STAGING_HALF * 2]);
    }
}
