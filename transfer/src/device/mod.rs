//! Device memory (GPU buffers) and the staging pipeline that moves KV blocks into and out of
//! it.
//!
//! An inference engine keeps its KV cache in GPU memory, which none of the host transports
//! can touch: shm and tcp copy with the CPU, and only an RDMA NIC with GPUDirect (see
//! [`gpudirect`]) reaches it directly. Everywhere else a block bound for a GPU lands first in
//! a pinned host buffer the node can reach (registered with the transfer engine like any
//! other region), and an asynchronous copy on a device stream carries it over PCIe; a put
//! goes the other way. The [`staging`] pipeline double-buffers this: while the device copies chunk `i`
//! out of one half of the staging buffer, the node fills the other half with chunk `i + 1`.
//!
//! The pipeline is written against [`Device`] and [`Stream`], the four things it needs from a
//! device (pinned host memory, an async host-to-device copy, an async device-to-host copy, and
//! a synchronize). Two devices implement them:
//! - `CudaDevice` (cargo feature `cuda`): the CUDA driver, loaded at run time through
//!   cudarc, so the crate builds and runs without a CUDA toolkit; [`DeviceError::NoDriver`]
//!   when the driver library is absent.
//! - [`HostDevice`]: "device memory" that is plain host memory, copied by a worker thread per
//!   stream. It exists so that the pipeline's ordering, overlap, partial failure and
//!   cancellation are tested on every machine, with hooks that observe, delay or fail
//!   individual copies.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::region::{MemoryRegion, RegionError};

#[cfg(feature = "cuda")]
mod cuda;
pub mod gpudirect;
mod host;
pub mod staging;

#[cfg(feature = "cuda")]
pub use cuda::CudaDevice;
pub use host::{CopyDirection, CopyEvent, CopyHook, HostDevice};

/// A range of one device's memory: what an engine registers for its KV cache (a CUDA
/// allocation, or part of one). Plain data; registering it is where the caller vouches for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceMemory {
    /// Which device of its kind (CUDA's ordinal).
    pub ordinal: u32,
    /// The device address of the first byte (a `CUdeviceptr`).
    pub ptr: u64,
    pub len: u64,
}

impl DeviceMemory {
    /// The device address of byte `offset`, after checking that `[offset, offset + len)` lies
    /// inside this range.
    pub fn addr(&self, offset: u64, len: u64) -> Result<u64, DeviceError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(self.ptr + offset),
            _ => Err(DeviceError::OutOfBounds {
                offset,
                len,
                size: self.len,
            }),
        }
    }

    /// The first `len` bytes from `offset`, as a range of their own.
    pub fn slice(&self, offset: u64, len: u64) -> Result<DeviceMemory, DeviceError> {
        Ok(DeviceMemory {
            ordinal: self.ordinal,
            ptr: self.addr(offset, len)?,
            len,
        })
    }
}

/// What can go wrong with a device.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DeviceError {
    /// The CUDA driver library (`libcuda.so`) cannot be loaded: no NVIDIA driver on this host.
    #[error("no CUDA driver: libcuda cannot be loaded on this host")]
    NoDriver,
    /// This build has no CUDA support (the `cuda` feature is off).
    #[error("this build has no CUDA support (built without the `cuda` feature)")]
    NotBuilt,
    #[error("no device {ordinal}: the host has {count}")]
    NoDevice { ordinal: u32, count: u32 },
    /// A driver call failed; `call` names it and `code` is the driver's error name.
    #[error("{call} failed: {code}")]
    Driver { call: &'static str, code: String },
    /// The memory is not what it claims to be: not device memory, another device's, or not
    /// inside one allocation.
    #[error("not usable device memory: {0}")]
    NotDeviceMemory(String),
    #[error("bytes {offset}..{offset}+{len} are outside the device range of {size} bytes")]
    OutOfBounds { offset: u64, len: u64, size: u64 },
    /// A copy failed (the host device's hooks report their own reasons here).
    #[error("device copy failed: {0}")]
    Copy(String),
    /// The staging buffer could not be allocated.
    #[error("staging buffer: {0}")]
    Region(#[from] RegionError),
}

/// Host memory the device can copy to and from asynchronously (page-locked for a GPU). The
/// region is a sealed memfd like any other, so it is registered with the transfer engine and
/// the node's one-sided copies reach it.
pub struct PinnedBuffer {
    /// Undoes the pinning when dropped (CUDA's `cuMemHostUnregister`). Declared first so it
    /// is dropped first, while this clone of the region still keeps the pages mapped.
    _unpin: Option<Box<dyn Send + Sync>>,
    region: MemoryRegion,
}

impl PinnedBuffer {
    /// `region`, pinned by `unpin`'s owner until this buffer is dropped.
    pub fn new(region: MemoryRegion, unpin: Option<Box<dyn Send + Sync>>) -> PinnedBuffer {
        PinnedBuffer {
            region,
            _unpin: unpin,
        }
    }

    pub fn region(&self) -> &MemoryRegion {
        &self.region
    }

    pub fn len(&self) -> u64 {
        self.region.len() as u64
    }

    /// Always false: a region has at least one byte.
    pub fn is_empty(&self) -> bool {
        self.region.is_empty()
    }
}

impl fmt::Debug for PinnedBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedBuffer")
            .field("len", &self.region.len())
            .finish()
    }
}

/// A GPU, or a stand-in for one: what the staging pipeline needs from it, and what tests and
/// benchmarks need to put bytes in and take them out.
pub trait Device: Send + Sync + fmt::Debug {
    /// A name for logs and errors (`cuda:0`, `host:0`).
    fn name(&self) -> String;

    fn ordinal(&self) -> u32;

    /// Allocates `len` bytes of host memory the device copies asynchronously (pinned).
    fn alloc_pinned(&self, len: usize) -> Result<PinnedBuffer, DeviceError>;

    /// A new stream: copies enqueued on it run in order, asynchronously to the caller.
    fn stream(&self) -> Result<Box<dyn Stream>, DeviceError>;

    /// Checks that `memory` is this device's memory, inside one allocation.
    fn check(&self, memory: &DeviceMemory) -> Result<(), DeviceError>;

    /// Allocates `len` bytes of device memory (for tests, benchmarks and tools; an engine
    /// brings its own).
    fn alloc(&self, len: u64) -> Result<DeviceMemory, DeviceError>;

    /// Frees what [`Device::alloc`] returned.
    ///
    /// # Safety
    ///
    /// No copy into or out of `memory` may be in flight or start later.
    unsafe fn free(&self, memory: DeviceMemory) -> Result<(), DeviceError>;

    /// Copies `src` into the device at `memory`'s byte `offset`, synchronously.
    fn upload(&self, memory: &DeviceMemory, offset: u64, src: &[u8]) -> Result<(), DeviceError>;

    /// Copies device bytes from `memory`'s byte `offset` into `dst`, synchronously.
    fn download(
        &self,
        memory: &DeviceMemory,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<(), DeviceError>;
}

/// An ordered queue of asynchronous copies between pinned host memory and the device. Every
/// copy carries a `tag` (the pipeline's block index) so that a failure can be traced to its
/// block. Dropping a stream waits for the copies still in it.
pub trait Stream: Send {
    /// Enqueues a copy of `len` bytes from host `src` to device address `dst`.
    ///
    /// # Safety
    ///
    /// `src` must stay readable for `len` bytes, and not be written, until
    /// [`Stream::synchronize`] returns; `dst` must be device memory the caller may write
    /// (checked with [`Device::check`]).
    unsafe fn copy_to_device(
        &mut self,
        tag: usize,
        dst: u64,
        src: *const u8,
        len: usize,
    ) -> Result<(), DeviceError>;

    /// Enqueues a copy of `len` bytes from device address `src` to host `dst`.
    ///
    /// # Safety
    ///
    /// `dst` must stay writable for `len` bytes, and untouched, until [`Stream::synchronize`]
    /// returns; `src` must be device memory the caller may read.
    unsafe fn copy_to_host(
        &mut self,
        tag: usize,
        dst: *mut u8,
        src: u64,
        len: usize,
    ) -> Result<(), DeviceError>;

    /// Waits until every copy enqueued so far has finished; returns the tags of those that
    /// failed. A device that cannot tell which copy failed (CUDA reports a stream's first
    /// error) names every copy enqueued since the last synchronize.
    fn synchronize(&mut self) -> Vec<(usize, DeviceError)>;
}

/// Stops a staging pipeline between chunks. Cheap to clone; every clone cancels the same
/// calls. Copies already enqueued finish before the call returns (their buffers must not be
/// reused under them); blocks not yet moved are reported as cancelled.
#[derive(Debug, Clone, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    pub fn new() -> CancelToken {
        CancelToken::default()
    }

    pub fn cancel(&self) {
        self.0.store(true, Ordering::Release);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// The CUDA ordinal of the GPU whose memory `ptr` is, asked of the driver; `None` for host
/// memory, on hosts without a driver, and in builds without the `cuda` feature.
pub fn cuda_device_of(ptr: u64) -> Option<u32> {
    #[cfg(feature = "cuda")]
    {
        cuda::device_of(ptr)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = ptr;
        None
    }
}

/// Opens device `ordinal` of the CUDA driver. Without the `cuda` feature this is
/// [`DeviceError::NotBuilt`], so that callers (the Python package, `yutu-bench gpu`) need no
/// feature gates of their own.
pub fn open_cuda(ordinal: u32) -> Result<Arc<dyn Device>, DeviceError> {
    #[cfg(feature = "cuda")]
    {
        Ok(CudaDevice::open(ordinal)? as Arc<dyn Device>)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = ordinal;
        Err(DeviceError::NotBuilt)
    }
}
