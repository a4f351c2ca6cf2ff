//! [`CudaDevice`]: a GPU through the CUDA driver API, loaded at run time by cudarc.
//!
//! Nothing links against `libcuda`: cudarc's `dynamic-loading` opens it on first use, so
//! the crate builds without a CUDA toolkit and runs on hosts without a GPU. Every entry
//! point checks `is_culib_present()` first and answers [`DeviceError::NoDriver`], because
//! cudarc's loader panics when the library is missing.
//!
//! The device uses its primary context (the one the CUDA runtime, and so PyTorch, uses), so
//! pointers from an engine's allocations are valid here, and binds it on whichever thread
//! makes a call: the client's calls come from the caller's threads.

use std::ffi::c_void;
use std::mem::MaybeUninit;
use std::sync::Arc;

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys;

use super::{Device, DeviceError, DeviceMemory, PinnedBuffer, Stream};
use crate::region::{HugePages, MemoryRegion};

/// One CUDA device (see the module docs). Cheap to share: open it once per ordinal.
#[derive(Debug)]
pub struct CudaDevice {
    inner: Arc<Context>,
    name: String,
}

/// The retained primary context; released when the device and every stream and pinned
/// buffer made from it are gone.
#[derive(Debug)]
struct Context {
    ordinal: u32,
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
}

// SAFETY: a CUcontext is a handle the driver lets any thread make current; this crate only
// passes it to driver calls.
unsafe impl Send for Context {}
// SAFETY: as above; the handle is never dereferenced here.
unsafe impl Sync for Context {}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: `dev` came from `device::get` and its primary context was retained once.
        let _ = unsafe { result::primary_ctx::release(self.dev) };
    }
}

fn driver(call: &'static str) -> impl Fn(DriverError) -> DeviceError {
    move |e| DeviceError::Driver {
        call,
        code: format!("{:?}", e.0),
    }
}

/// Whether the driver library can be loaded; every public entry point asks first.
fn present() -> Result<(), DeviceError> {
    // SAFETY: only tries to open the library by its usual names.
    if unsafe { sys::is_culib_present() } {
        Ok(())
    } else {
        Err(DeviceError::NoDriver)
    }
}

impl Context {
    /// Makes the context current on this thread.
    fn bind(&self) -> Result<(), DeviceError> {
        // SAFETY: `ctx` is a retained primary context, alive as long as `self`.
        unsafe { result::ctx::set_current(self.ctx) }.map_err(driver("cuCtxSetCurrent"))
    }
}

impl CudaDevice {
    /// Opens device `ordinal`: [`DeviceError::NoDriver`] without a driver,
    /// [`DeviceError::NoDevice`] when the host has fewer devices.
    pub fn open(ordinal: u32) -> Result<Arc<CudaDevice>, DeviceError> {
        present()?;
        result::init().map_err(driver("cuInit"))?;
        let count = result::device::get_count().map_err(driver("cuDeviceGetCount"))?;
        let count = u32::try_from(count).unwrap_or(0);
        if ordinal >= count {
            return Err(DeviceError::NoDevice { ordinal, count });
        }
        let dev = result::device::get(ordinal as i32).map_err(driver("cuDeviceGet"))?;
        // SAFETY: `dev` came from `device::get`.
        let ctx = unsafe { result::primary_ctx::retain(dev) }
            .map_err(driver("cuDevicePrimaryCtxRetain"))?;
        let name = result::device::get_name(dev).unwrap_or_else(|_| "unknown".into());
        Ok(Arc::new(CudaDevice {
            inner: Arc::new(Context { ordinal, dev, ctx }),
            name,
        }))
    }

    /// The device's model name (`NVIDIA H100 80GB HBM3`).
    pub fn model(&self) -> &str {
        &self.name
    }

    fn attribute<T: Copy>(
        &self,
        attr: sys::CUpointer_attribute,
        ptr: u64,
    ) -> Result<T, DeviceError> {
        let mut out = MaybeUninit::<T>::zeroed();
        // SAFETY: `out` has room for the attribute's type, which the caller names per the
        // driver's documentation of `attr`.
        unsafe { sys::cuPointerGetAttribute(out.as_mut_ptr().cast(), attr, ptr) }
            .result()
            .map_err(|e| {
                DeviceError::NotDeviceMemory(format!("{ptr:#x}: cuPointerGetAttribute: {:?}", e.0))
            })?;
        // SAFETY: the driver filled it (or it stays zeroed, a valid value for these types).
        Ok(unsafe { out.assume_init() })
    }
}

/// Unpins a staging buffer when it is dropped (before its mapping goes).
struct Unpin {
    ptr: usize,
    ctx: Arc<Context>,
}

impl Drop for Unpin {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: `ptr` was registered with cuMemHostRegister and is still mapped (the
            // pinned buffer drops this before its region).
            let _ = unsafe { sys::cuMemHostUnregister(self.ptr as *mut c_void) };
        }
    }
}

impl Device for CudaDevice {
    fn name(&self) -> String {
        format!("cuda:{}", self.inner.ordinal)
    }

    fn ordinal(&self) -> u32 {
        self.inner.ordinal
    }

    fn alloc_pinned(&self, len: usize) -> Result<PinnedBuffer, DeviceError> {
        let region = MemoryRegion::allocate("yutu-staging", len, HugePages::Auto)?;
        self.inner.bind()?;
        // SAFETY: the region is a live mapping of at least `len` bytes; it is unregistered
        // (by `Unpin`) before it is unmapped.
        unsafe {
            sys::cuMemHostRegister_v2(
                region.as_ptr().cast(),
                region.len(),
                sys::CU_MEMHOSTREGISTER_PORTABLE,
            )
        }
        .result()
        .map_err(driver("cuMemHostRegister"))?;
        let unpin = Unpin {
            ptr: region.as_ptr() as usize,
            ctx: self.inner.clone(),
        };
        Ok(PinnedBuffer::new(region, Some(Box::new(unpin))))
    }

    fn stream(&self) -> Result<Box<dyn Stream>, DeviceError> {
        self.inner.bind()?;
        let stream = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(driver("cuStreamCreate"))?;
        Ok(Box::new(CudaStream {
            stream,
            ctx: self.inner.clone(),
            tags: Vec::new(),
        }))
    }

    fn check(&self, memory: &DeviceMemory) -> Result<(), DeviceError> {
        if memory.ordinal != self.inner.ordinal {
            return Err(DeviceError::NotDeviceMemory(format!(
                "the range is on device {}, not cuda:{}",
                memory.ordinal, self.inner.ordinal
            )));
        }
        self.inner.bind()?;
        let ptr = memory.ptr;
        let kind: u32 = self.attribute(
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            ptr,
        )?;
        if kind != sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 {
            return Err(DeviceError::NotDeviceMemory(format!(
                "{ptr:#x} is not device memory (memory type {kind})"
            )));
        }
        let ordinal: i32 = self.attribute(
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            ptr,
        )?;
        if ordinal != self.inner.ordinal as i32 {
            return Err(DeviceError::NotDeviceMemory(format!(
                "{ptr:#x} is on cuda:{ordinal}, not cuda:{}",
                self.inner.ordinal
            )));
        }
        let start: u64 = self.attribute(
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
            ptr,
        )?;
        let size: usize = self.attribute(
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
            ptr,
        )?;
        let end = ptr.checked_add(memory.len);
        if end.is_none_or(|e| e > start.saturating_add(size as u64)) {
            return Err(DeviceError::NotDeviceMemory(format!(
                "{} bytes at {ptr:#x} run past the allocation at {start:#x} ({size} bytes)",
                memory.len
            )));
        }
        Ok(())
    }

    fn alloc(&self, len: u64) -> Result<DeviceMemory, DeviceError> {
        let size = usize::try_from(len)
            .ok()
            .filter(|&l| l > 0)
            .ok_or_else(|| DeviceError::Copy(format!("cannot allocate {len} bytes")))?;
        self.inner.bind()?;
        // SAFETY: a plain allocation in the bound context.
        let ptr = unsafe { result::malloc_sync(size) }.map_err(driver("cuMemAlloc"))?;
        Ok(DeviceMemory {
            ordinal: self.inner.ordinal,
            ptr,
            len,
        })
    }

    unsafe fn free(&self, memory: DeviceMemory) -> Result<(), DeviceError> {
        self.inner.bind()?;
        // SAFETY: the caller frees what `alloc` returned, with no copy in flight.
        unsafe { result::free_sync(memory.ptr) }.map_err(driver("cuMemFree"))
    }

    fn upload(&self, memory: &DeviceMemory, offset: u64, src: &[u8]) -> Result<(), DeviceError> {
        let addr = memory.addr(offset, src.len() as u64)?;
        self.inner.bind()?;
        // SAFETY: `addr..+len` is inside `memory`, which the caller says is device memory of
        // this device; the copy is synchronous, so `src` is only read during the call.
        unsafe { sys::cuMemcpyHtoD_v2(addr, src.as_ptr().cast(), src.len()) }
            .result()
            .map_err(driver("cuMemcpyHtoD"))
    }

    fn download(
        &self,
        memory: &DeviceMemory,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<(), DeviceError> {
        let addr = memory.addr(offset, dst.len() as u64)?;
        self.inner.bind()?;
        // SAFETY: as in `upload`, writing `dst` during the call only.
        unsafe { sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), addr, dst.len()) }
            .result()
            .map_err(driver("cuMemcpyDtoH"))
    }
}

struct CudaStream {
    stream: sys::CUstream,
    ctx: Arc<Context>,
    /// Tags of the copies enqueued since the last synchronize: CUDA reports a stream's error
    /// without saying which copy caused it, so all of them are failed.
    tags: Vec<usize>,
}

// SAFETY: a CUstream may be used from any thread once its context is current there, which
// every method ensures; the stream is used by one thread at a time (`&mut self`).
unsafe impl Send for CudaStream {}

impl Stream for CudaStream {
    unsafe fn copy_to_device(
        &mut self,
        tag: usize,
        dst: u64,
        src: *const u8,
        len: usize,
    ) -> Result<(), DeviceError> {
        self.ctx.bind()?;
        // SAFETY: the caller keeps `src` (pinned staging memory) alive and untouched until
        // synchronize, and `dst` is device memory it may write.
        unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), len, self.stream) }
            .result()
            .map_err(driver("cuMemcpyHtoDAsync"))?;
        self.tags.push(tag);
        Ok(())
    }

    unsafe fn copy_to_host(
        &mut self,
        tag: usize,
        dst: *mut u8,
        src: u64,
        len: usize,
    ) -> Result<(), DeviceError> {
        self.ctx.bind()?;
        // SAFETY: as in `copy_to_device`, the other way round.
        unsafe { sys::cuMemcpyDtoHAsync_v2(dst.cast(), src, len, self.stream) }
            .result()
            .map_err(driver("cuMemcpyDtoHAsync"))?;
        self.tags.push(tag);
        Ok(())
    }

    fn synchronize(&mut self) -> Vec<(usize, DeviceError)> {
        let tags = std::mem::take(&mut self.tags);
        // SAFETY: the stream is alive and its context bound.
        let result = self.ctx.bind().and_then(|()| {
            unsafe { result::stream::synchronize(self.stream) }
                .map_err(driver("cuStreamSynchronize"))
        });
        match result {
            Ok(()) => Vec::new(),
            Err(e) => tags.into_iter().map(|t| (t, e.clone())).collect(),
        }
    }
}

impl Drop for CudaStream {
    fn drop(&mut self) {
        let _ = self.synchronize();
        if self.ctx.bind().is_ok() {
            // SAFETY: created by cuStreamCreate and synchronized above.
            let _ = unsafe { result::stream::destroy(self.stream) };
        }
    }
}

/// The CUDA ordinal of the device whose memory `ptr` is; `None` for host memory (pageable or
/// pinned), for an address the driver does not know, and on a host without a driver or GPU.
///
/// This is how a range registered without saying where it is (Mooncake's
/// `register_buffer(ptr, size)`) is told apart: engines register GPU KV tensors and host
/// pools through the same call. The query needs no context when the process already has one
/// current (an engine's); otherwise the primary context of device 0 is made current for it.
pub fn device_of(ptr: u64) -> Option<u32> {
    present().ok()?;
    result::init().ok()?;
    let query = |attr, out: *mut c_void| {
        // SAFETY: `out` has room for the attribute's type (an unsigned int for the memory
        // type, an int for the ordinal, per the driver's documentation).
        unsafe { sys::cuPointerGetAttribute(out, attr, ptr) }.result()
    };
    let mut kind = 0u32;
    let memory_type = sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE;
    let mut _held = None;
    if let Err(e) = query(memory_type, (&mut kind as *mut u32).cast()) {
        if e.0 != sys::cudaError_enum::CUDA_ERROR_INVALID_CONTEXT {
            return None;
        }
        let device = CudaDevice::open(0).ok()?;
        device.inner.bind().ok()?;
        query(memory_type, (&mut kind as *mut u32).cast()).ok()?;
        _held = Some(device);
    }
    if kind != sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 {
        return None;
    }
    let mut ordinal = -1i32;
    query(
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        (&mut ordinal as *mut i32).cast(),
    )
    .ok()?;
    u32::try_from(ordinal).ok()
}
