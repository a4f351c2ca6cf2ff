//! [`HostDevice`]: a stand-in GPU whose memory is host memory.
//!
//! It behaves like a GPU where the pipeline can tell: its copies are asynchronous (each
//! stream is a worker thread that runs its copies in order), a copy into memory it did not
//! allocate fails instead of corrupting anything, and a synchronize reports which copies
//! failed. A [`CopyHook`] runs on the stream's thread before each copy, so a test can watch
//! the order of copies, hold one back until something else has happened (to prove overlap
//! without timing), or make one fail.
//!
//! [`HostDevice::over_host_memory`] is the other use: a device whose "device addresses" are
//! any host addresses, for exercising the GPU code paths of a client (the Python package's
//! tests) with ordinary host buffers posing as GPU tensors.

use std::alloc::Layout;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;

use super::{Device, DeviceError, DeviceMemory, PinnedBuffer, Stream};
use crate::region::{HugePages, MemoryRegion};

/// Which way a copy goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyDirection {
    /// Host (a staging buffer) to device: the end of a get.
    ToDevice,
    /// Device to host: the start of a put.
    ToHost,
}

/// One copy, as a [`CopyHook`] sees it.
#[derive(Debug, Clone, Copy)]
pub struct CopyEvent {
    /// The tag the pipeline gave it (the block's index in its batch).
    pub tag: usize,
    pub direction: CopyDirection,
    /// The device address copied to or from.
    pub device_addr: u64,
    pub len: usize,
    /// Which stream of this device runs it (numbered from 0 in creation order).
    pub stream: u64,
}

/// Runs before each copy, on the stream's thread; an `Err` fails the copy with that reason.
pub type CopyHook = Arc<dyn Fn(&CopyEvent) -> Result<(), String> + Send + Sync>;

/// A device whose memory is host memory (see the module docs).
#[derive(Debug)]
pub struct HostDevice {
    shared: Arc<Shared>,
}

struct Shared {
    ordinal: u32,
    /// Start address → length of each allocation. Held while a copy runs, so that a free
    /// waits for copies in progress.
    allocations: Mutex<BTreeMap<u64, u64>>,
    /// When false, any non-null address counts as device memory (`over_host_memory`).
    checked: bool,
    hook: RwLock<Option<CopyHook>>,
    streams: AtomicU64,
    /// Pinned buffers allocated, and the largest (what a test of staging sizes looks at).
    pinned: AtomicU64,
    largest_pinned: AtomicU64,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostDevice")
            .field("ordinal", &self.ordinal)
            .field("checked", &self.checked)
            .finish()
    }
}

/// Alignment of allocations: a GPU allocation is at least 256-byte aligned.
const ALIGN: usize = 256;

impl HostDevice {
    /// A device with memory of its own: only what [`Device::alloc`] returned is device
    /// memory.
    pub fn new(ordinal: u32) -> Arc<HostDevice> {
        Self::build(ordinal, true)
    }

    /// A device whose addresses are host addresses: every non-null range is accepted as its
    /// memory, and copies are plain `memcpy`s. For tests that pose host buffers as GPU
    /// memory; the caller vouches for every address it hands over, exactly as it would for a
    /// real GPU pointer.
    pub fn over_host_memory(ordinal: u32) -> Arc<HostDevice> {
        Self::build(ordinal, false)
    }

    fn build(ordinal: u32, checked: bool) -> Arc<HostDevice> {
        Arc::new(HostDevice {
            shared: Arc::new(Shared {
                ordinal,
                allocations: Mutex::new(BTreeMap::new()),
                checked,
                hook: RwLock::new(None),
                streams: AtomicU64::new(0),
                pinned: AtomicU64::new(0),
                largest_pinned: AtomicU64::new(0),
            }),
        })
    }

    /// Installs (or with `None` removes) the hook run before each copy.
    pub fn set_hook(&self, hook: Option<CopyHook>) {
        *self.shared.hook.write().unwrap_or_else(|p| p.into_inner()) = hook;
    }

    /// Streams created so far.
    pub fn streams_created(&self) -> u64 {
        self.shared.streams.load(Ordering::Relaxed)
    }

    /// Pinned buffers allocated so far, and the size of the largest.
    pub fn pinned_allocated(&self) -> (u64, u64) {
        (
            self.shared.pinned.load(Ordering::Relaxed),
            self.shared.largest_pinned.load(Ordering::Relaxed),
        )
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, u64>> {
        // Every change under this lock is one insert or remove: a panic leaves it whole.
        self.allocations.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Checks `[addr, addr + len)` against the allocations held in `allocs`.
    fn check_range(
        &self,
        allocs: &BTreeMap<u64, u64>,
        addr: u64,
        len: u64,
    ) -> Result<(), DeviceError> {
        if addr == 0 {
            return Err(DeviceError::NotDeviceMemory("a null address".into()));
        }
        let end = addr.checked_add(len).ok_or_else(|| {
            DeviceError::NotDeviceMemory(format!("{len} bytes at {addr:#x} wrap"))
        })?;
        if !self.checked {
            return Ok(());
        }
        match allocs.range(..=addr).next_back() {
            Some((&start, &l)) if start + l >= end => Ok(()),
            _ => Err(DeviceError::NotDeviceMemory(format!(
                "bytes {addr:#x}..{end:#x} are not inside one allocation of host:{}",
                self.ordinal
            ))),
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let allocs = std::mem::take(
            self.allocations
                .get_mut()
                .unwrap_or_else(|p| p.into_inner()),
        );
        for (addr, len) in allocs {
            if let Ok(layout) = Layout::from_size_align(len as usize, ALIGN) {
                // SAFETY: allocated in `alloc` with this layout and not freed since; every
                // stream (which holds an `Arc<Shared>`) is gone, so no copy is running.
                unsafe { std::alloc::dealloc(addr as *mut u8, layout) };
            }
        }
    }
}

impl Device for HostDevice {
    fn name(&self) -> String {
        format!("host:{}", self.shared.ordinal)
    }

    fn ordinal(&self) -> u32 {
        self.shared.ordinal
    }

    fn alloc_pinned(&self, len: usize) -> Result<PinnedBuffer, DeviceError> {
        let region = MemoryRegion::allocate("yutu-staging", len, HugePages::Auto)?;
        self.shared.pinned.fetch_add(1, Ordering::Relaxed);
        self.shared
            .largest_pinned
            .fetch_max(region.len() as u64, Ordering::Relaxed);
        Ok(PinnedBuffer::new(region, None))
    }

    fn stream(&self) -> Result<Box<dyn Stream>, DeviceError> {
        let id = self.shared.streams.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel::<Job>();
        let shared = self.shared.clone();
        let worker = std::thread::Builder::new()
            .name(format!("yutu-hostdev-{id}"))
            .spawn(move || run_stream(&shared, id, rx))
            .map_err(|e| DeviceError::Copy(format!("cannot start a stream thread: {e}")))?;
        Ok(Box::new(HostStream {
            tx: Some(tx),
            worker: Some(worker),
        }))
    }

    fn check(&self, memory: &DeviceMemory) -> Result<(), DeviceError> {
        if memory.ordinal != self.shared.ordinal {
            return Err(DeviceError::NotDeviceMemory(format!(
                "the range is on device {}, not host:{}",
                memory.ordinal, self.shared.ordinal
            )));
        }
        let allocs = self.shared.lock();
        self.shared.check_range(&allocs, memory.ptr, memory.len)
    }

    fn alloc(&self, len: u64) -> Result<DeviceMemory, DeviceError> {
        let size = usize::try_from(len)
            .ok()
            .filter(|&l| l > 0)
            .ok_or_else(|| DeviceError::Copy(format!("cannot allocate {len} bytes")))?;
        let layout = Layout::from_size_align(size, ALIGN)
            .map_err(|e| DeviceError::Copy(format!("cannot allocate {len} bytes: {e}")))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(DeviceError::Copy(format!("out of memory for {len} bytes")));
        }
        self.shared.lock().insert(ptr as u64, len);
        Ok(DeviceMemory {
            ordinal: self.shared.ordinal,
            ptr: ptr as u64,
            len,
        })
    }

    unsafe fn free(&self, memory: DeviceMemory) -> Result<(), DeviceError> {
        let mut allocs = self.shared.lock();
        match allocs.get(&memory.ptr) {
            Some(&len) if self.shared.checked => {
                allocs.remove(&memory.ptr);
                let layout = Layout::from_size_align(len as usize, ALIGN)
                    .map_err(|e| DeviceError::Copy(e.to_string()))?;
                // SAFETY: allocated in `alloc` with this layout; removed from the map under
                // the lock copies hold, so none is running, and the caller promises none
                // will start.
                unsafe { std::alloc::dealloc(memory.ptr as *mut u8, layout) };
                Ok(())
            }
            _ => Err(DeviceError::NotDeviceMemory(format!(
                "{:#x} was not allocated by host:{}",
                memory.ptr, self.shared.ordinal
            ))),
        }
    }

    fn upload(&self, memory: &DeviceMemory, offset: u64, src: &[u8]) -> Result<(), DeviceError> {
        let addr = memory.addr(offset, src.len() as u64)?;
        let allocs = self.shared.lock();
        self.shared.check_range(&allocs, addr, src.len() as u64)?;
        // SAFETY: the range is inside a live allocation (or, unchecked, a host range the
        // caller vouched for), held by the lock against a free.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), addr as *mut u8, src.len()) };
        Ok(())
    }

    fn download(
        &self,
        memory: &DeviceMemory,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<(), DeviceError> {
        let addr = memory.addr(offset, dst.len() as u64)?;
        let allocs = self.shared.lock();
        self.shared.check_range(&allocs, addr, dst.len() as u64)?;
        // SAFETY: as in `upload`, reading.
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }
}

enum Job {
    Copy {
        event: CopyEvent,
        /// Host address (as an integer, to cross the thread).
        host: usize,
    },
    Sync(mpsc::Sender<Vec<(usize, DeviceError)>>),
}

/// The worker of one stream: runs copies in order, collects failures until the next sync.
fn run_stream(shared: &Shared, id: u64, rx: mpsc::Receiver<Job>) {
    let mut failed = Vec::new();
    for job in rx {
        match job {
            Job::Copy { mut event, host } => {
                event.stream = id;
                if let Err(e) = copy_one(shared, &event, host) {
                    failed.push((event.tag, e));
                }
            }
            Job::Sync(reply) => {
                let _ = reply.send(std::mem::take(&mut failed));
            }
        }
    }
}

fn copy_one(shared: &Shared, event: &CopyEvent, host: usize) -> Result<(), DeviceError> {
    let hook = shared
        .hook
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    if let Some(hook) = hook {
        hook(event).map_err(DeviceError::Copy)?;
    }
    let allocs = shared.lock();
    shared.check_range(&allocs, event.device_addr, event.len as u64)?;
    let dev = event.device_addr as *mut u8;
    // SAFETY: the device range is inside a live allocation (checked under the lock that
    // `free` takes), or a host range the caller vouched for; the host range is the pinned
    // buffer the enqueuer promised to leave alone until the stream is synchronized.
    unsafe {
        match event.direction {
            CopyDirection::ToDevice => {
                std::ptr::copy_nonoverlapping(host as *const u8, dev, event.len)
            }
            CopyDirection::ToHost => std::ptr::copy_nonoverlapping(dev, host as *mut u8, event.len),
        }
    }
    Ok(())
}

struct HostStream {
    tx: Option<mpsc::Sender<Job>>,
    worker: Option<JoinHandle<()>>,
}

impl HostStream {
    fn enqueue(
        &mut self,
        tag: usize,
        direction: CopyDirection,
        device_addr: u64,
        host: usize,
        len: usize,
    ) -> Result<(), DeviceError> {
        let event = CopyEvent {
            tag,
            direction,
            device_addr,
            len,
            stream: 0,
        };
        self.tx
            .as_ref()
            .and_then(|tx| tx.send(Job::Copy { event, host }).ok())
            .ok_or_else(|| DeviceError::Copy("the stream's thread is gone".into()))
    }
}

impl Stream for HostStream {
    unsafe fn copy_to_device(
        &mut self,
        tag: usize,
        dst: u64,
        src: *const u8,
        len: usize,
    ) -> Result<(), DeviceError> {
        self.enqueue(tag, CopyDirection::ToDevice, dst, src as usize, len)
    }

    unsafe fn copy_to_host(
        &mut self,
        tag: usize,
        dst: *mut u8,
        src: u64,
        len: usize,
    ) -> Result<(), DeviceError> {
        self.enqueue(tag, CopyDirection::ToHost, src, dst as usize, len)
    }

    fn synchronize(&mut self) -> Vec<(usize, DeviceError)> {
        let (reply, answer) = mpsc::channel();
        match self.tx.as_ref().map(|tx| tx.send(Job::Sync(reply))) {
            Some(Ok(())) => answer.recv().unwrap_or_default(),
            _ => Vec::new(),
        }
    }
}

impl Drop for HostStream {
    fn drop(&mut self) {
        // Closing the channel lets the worker finish what is queued and exit; joining it
        // means no copy outlives the stream.
        drop(self.tx.take());
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}
