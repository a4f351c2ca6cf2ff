//! Memory regions: page-aligned, memfd-backed, shared mappings that transports can reach.
//!
//! Every region is a `MAP_SHARED` mapping of a memfd, for two reasons: a same-host peer can map
//! the very same pages after receiving the fd (the shm transport), and an RDMA NIC can register
//! it like any other pinned range. Regions are created here ([`MemoryRegion::allocate`], huge
//! pages when the machine has them) or wrap memory someone else already mapped from a memfd
//! (the storage node's shard arenas: [`MemoryRegion::map_memfd`] or
//! [`MemoryRegion::from_mapping`]).
//!
//! A region that will be handed to other processes must be sealed against shrinking: a peer
//! that truncated a shared memfd would make every access beyond the new end fault with
//! `SIGBUS`, in this process. Regions allocated here are sealed (`F_SEAL_SHRINK`,
//! `F_SEAL_GROW`, `F_SEAL_SEAL`); for a wrapped fd the seals are added when the memfd allows
//! it (created with `MFD_ALLOW_SEALING`), and otherwise the region is simply not offered over
//! shm ([`MemoryRegion::sealed`]).
//!
//! A region can also name memory the process already has ([`MemoryRegion::process_memory`]:
//! an engine's numpy array or torch tensor). It is no memfd; a same-host peer reaches it
//! through the owner's memory file instead of a mapping (see `transport/shm/mapping.rs`).
//!
//! A region can also name GPU memory ([`MemoryRegion::device_memory`]): no memfd, no CPU
//! access (every CPU path refuses it with [`RegionError::DeviceMemory`]), only an address
//! range for the rdma transport to register with the NIC (GPUDirect RDMA).
//!
//! The bytes of a region are shared with peers and devices that write them at any time, so the
//! region never hands out `&[u8]` safely: [`MemoryRegion::read_at`] and
//! [`MemoryRegion::write_at`] copy, and the transports work with raw pointers under the
//! contract described in the crate docs.

use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;

/// Whether [`MemoryRegion::allocate`] uses huge pages (hugetlbfs, 2 MiB).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HugePages {
    /// Huge pages when the pool has enough, normal pages otherwise (with a transparent-huge-page
    /// hint). What the storage node wants: faster on machines set up for it, fine elsewhere.
    #[default]
    Auto,
    /// Normal pages only.
    Never,
    /// Huge pages or an error ([`RegionError::HugePagesUnavailable`]).
    Require,
}

/// Creating or using a memory region failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RegionError {
    #[error("a memory region cannot be empty")]
    Empty,
    #[error("cannot create a memfd: {0}")]
    Memfd(Arc<io::Error>),
    #[error("cannot size the memfd to {len} bytes: {source}")]
    Resize {
        len: u64,
        #[source]
        source: Arc<io::Error>,
    },
    #[error("cannot map {len} bytes: {source}")]
    Map {
        len: u64,
        #[source]
        source: Arc<io::Error>,
    },
    #[error("no huge pages for {len} bytes: {source}")]
    HugePagesUnavailable {
        len: u64,
        #[source]
        source: Arc<io::Error>,
    },
    #[error("cannot inspect the file descriptor: {0}")]
    Fd(Arc<io::Error>),
    #[error("the file is {actual} bytes, shorter than the {len} bytes to register")]
    FileTooShort { len: u64, actual: u64 },
    #[error("the mapping's base address {0:#x} is not page-aligned")]
    Unaligned(usize),
    #[error("bytes {offset}..{offset}+{len} are outside the region of {size} bytes")]
    OutOfBounds { offset: u64, len: u64, size: u64 },
    /// The CPU was asked to touch GPU memory: only the NIC reaches a device region.
    #[error("the region is memory of GPU {ordinal}, which only an RDMA NIC can reach (GPUDirect)")]
    DeviceMemory { ordinal: u32 },
}

/// A registered-to-be range of shared memory. Cheap to clone (an `Arc`); the mapping lives until
/// the last clone is dropped.
#[derive(Clone)]
pub struct MemoryRegion {
    inner: Arc<RegionInner>,
}

struct RegionInner {
    ptr: NonNull<u8>,
    /// Usable bytes, what [`MemoryRegion::len`] reports.
    len: usize,
    /// Bytes mapped, when this region owns its mapping (rounded up to whole huge pages);
    /// `None` for a mapping that belongs to the caller of [`MemoryRegion::from_mapping`].
    owned_map_len: Option<usize>,
    /// The memfd (our own duplicate of it), kept open for the shm transport to send; `None`
    /// for device memory.
    fd: Option<OwnedFd>,
    /// The GPU whose memory this is (`ptr` is then a device address the CPU must not touch).
    device: Option<u32>,
    /// Memory this process already had (an engine's array or tensor), not a memfd: a
    /// same-host peer reaches it through this process's memory file, see
    /// [`MemoryRegion::process_memory`].
    process: bool,
    page_size: usize,
    huge: bool,
    sealed: bool,
}

// SAFETY: the region is a plain shared mapping; the pointer is only dereferenced through
// bounds-checked copies or by transports under the crate's documented contract, and the
// mapping itself stays valid for the lifetime of `RegionInner` whichever thread drops it.
unsafe impl Send for RegionInner {}
// SAFETY: as above; `&RegionInner` gives no unsynchronised access to Rust-owned state.
unsafe impl Sync for RegionInner {}

impl Drop for RegionInner {
    fn drop(&mut self) {
        if let Some(map_len) = self.owned_map_len {
            // SAFETY: `ptr`/`map_len` are exactly what our own mmap returned; every clone of the
            // region is gone, and the transports hold a clone while they use the bytes.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), map_len) };
        }
    }
}

const HUGE_PAGE: usize = 2 << 20;
/// The granularity at which GPUDirect pins device memory.
const GPU_PAGE: usize = 64 << 10;

impl MemoryRegion {
    /// Allocates `len` bytes of zeroed, page-aligned shared memory backed by a new sealed memfd
    /// named `name` (the name shows in `/proc/PID/maps`).
    pub fn allocate(name: &str, len: usize, huge: HugePages) -> Result<MemoryRegion, RegionError> {
        if len == 0 {
            return Err(RegionError::Empty);
        }
        match huge {
            HugePages::Never => allocate_with(name, len, false),
            HugePages::Require => allocate_with(name, len, true),
            HugePages::Auto => allocate_with(name, len, true).or_else(|err| {
                tracing::debug!(%err, len, "no huge pages for a memory region, using normal pages");
                allocate_with(name, len, false)
            }),
        }
    }

    /// Maps the first `len` bytes of an existing memfd a second time, into a mapping this region
    /// owns. The physical pages are the same as the caller's; only address space is added.
    /// Safe: the engine's view stays valid however the caller's mapping is used, which makes
    /// this the recommended way to register a storage node's arena.
    pub fn map_memfd(fd: BorrowedFd<'_>, len: usize) -> Result<MemoryRegion, RegionError> {
        if len == 0 {
            return Err(RegionError::Empty);
        }
        let fd = fd
            .try_clone_to_owned()
            .map_err(|e| RegionError::Fd(Arc::new(e)))?;
        let stat = fstat(&fd)?;
        check_size(&stat, len)?;
        let sealed = seal(fd.as_fd());
        let page = page_size_of(&stat);
        let ptr = map_shared(&fd, len)?;
        Ok(MemoryRegion::from_parts(
            ptr,
            len,
            Some(len),
            fd,
            page,
            sealed,
        ))
    }

    /// Wraps a mapping the caller already made: `len` bytes at `base`, a `MAP_SHARED` mapping
    /// of `fd` from offset 0. No second mapping is made, so the region's addresses are the
    /// caller's.
    ///
    /// # Safety
    ///
    /// `[base, base + len)` must be a readable and writable `MAP_SHARED` mapping of `fd` at
    /// offset 0, and must stay mapped until the returned region and all its clones are dropped
    /// (which, once it is registered, happens after [`crate::TransferEngine::unregister`] and
    /// after in-flight transfers complete). Prefer [`MemoryRegion::map_memfd`] when that is hard
    /// to promise.
    pub unsafe fn from_mapping(
        fd: BorrowedFd<'_>,
        base: NonNull<u8>,
        len: usize,
    ) -> Result<MemoryRegion, RegionError> {
        if len == 0 {
            return Err(RegionError::Empty);
        }
        let page = crate::sys::page_size();
        if (base.as_ptr() as usize) % page != 0 {
            return Err(RegionError::Unaligned(base.as_ptr() as usize));
        }
        let fd = fd
            .try_clone_to_owned()
            .map_err(|e| RegionError::Fd(Arc::new(e)))?;
        let stat = fstat(&fd)?;
        check_size(&stat, len)?;
        let sealed = seal(fd.as_fd());
        Ok(MemoryRegion::from_parts(
            base,
            len,
            None,
            fd,
            page_size_of(&stat),
            sealed,
        ))
    }

    /// A region naming GPU memory, for GPUDirect RDMA: the rdma transport registers it with
    /// the NIC (`ibv_reg_mr` on the device address, which works when a peer-memory module is
    /// loaded), and every CPU path refuses it ([`RegionError::DeviceMemory`]). It has no memfd,
    /// so it is never offered over shm.
    ///
    /// Takes the fields of a `device::DeviceMemory` (this module sits below `device`).
    ///
    /// # Safety
    ///
    /// `[ptr, ptr + len)` must be device memory of GPU `ordinal` (a `CUdeviceptr` range inside
    /// one allocation) that stays allocated until the region and all its clones are dropped
    /// (after [`crate::TransferEngine::unregister`] and after in-flight transfers complete).
    pub unsafe fn device_memory(
        ordinal: u32,
        ptr: u64,
        len: u64,
    ) -> Result<MemoryRegion, RegionError> {
        let out = || RegionError::OutOfBounds {
            offset: ptr,
            len,
            size: usize::MAX as u64,
        };
        let len = usize::try_from(len).map_err(|_| out())?;
        if len == 0 {
            return Err(RegionError::Empty);
        }
        let ptr = usize::try_from(ptr)
            .ok()
            .filter(|p| p.checked_add(len).is_some())
            .and_then(|p| NonNull::new(p as *mut u8))
            .ok_or_else(out)?;
        Ok(MemoryRegion {
            inner: Arc::new(RegionInner {
                ptr,
                len,
                owned_map_len: None,
                fd: None,
                device: Some(ordinal),
                process: false,
                page_size: GPU_PAGE,
                huge: false,
                sealed: false,
            }),
        })
    }

    /// A region naming memory this process already has (a numpy array, a torch tensor, an
    /// engine's host pool): no memfd, no second mapping. A same-host peer reaches it without
    /// a staging copy through the memory file of this process (`/proc/self/mem`), which the
    /// shm listener hands to a peer only with a checked descriptor of such a region (see
    /// `transport/shm/mapping.rs` for why that file and not `process_vm_writev`); the other
    /// transports copy through the pointer like any region.
    ///
    /// # Safety
    ///
    /// `[ptr, ptr + len)` must be readable and writable memory of this process that stays
    /// mapped until the region and all its clones are dropped (after
    /// [`crate::TransferEngine::unregister`] and after in-flight transfers complete). Peers
    /// write into it at any time while it is registered, as into any region.
    pub unsafe fn process_memory(ptr: *mut u8, len: usize) -> Result<MemoryRegion, RegionError> {
        if len == 0 {
            return Err(RegionError::Empty);
        }
        let out = || RegionError::OutOfBounds {
            offset: ptr as u64,
            len: len as u64,
            size: usize::MAX as u64,
        };
        if (ptr as usize).checked_add(len).is_none() {
            return Err(out());
        }
        let ptr = NonNull::new(ptr).ok_or_else(out)?;
        Ok(MemoryRegion {
            inner: Arc::new(RegionInner {
                ptr,
                len,
                owned_map_len: None,
                fd: None,
                device: None,
                process: true,
                page_size: crate::sys::page_size(),
                huge: false,
                sealed: false,
            }),
        })
    }

    fn from_parts(
        ptr: NonNull<u8>,
        len: usize,
        owned_map_len: Option<usize>,
        fd: OwnedFd,
        page_size: usize,
        sealed: bool,
    ) -> MemoryRegion {
        MemoryRegion {
            inner: Arc::new(RegionInner {
                ptr,
                len,
                owned_map_len,
                fd: Some(fd),
                device: None,
                process: false,
                page_size,
                huge: page_size > crate::sys::page_size(),
                sealed,
            }),
        }
    }

    /// Usable bytes.
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// Always false: empty regions are refused at creation. Here for clippy's sake.
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// The first byte. Page-aligned for host memory; a device address (not to be
    /// dereferenced) for device memory.
    pub fn as_ptr(&self) -> *mut u8 {
        self.inner.ptr.as_ptr()
    }

    /// The backing memfd (for sending to a peer or registering elsewhere); `None` for device
    /// memory.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.inner.fd.as_ref().map(|fd| fd.as_fd())
    }

    /// The GPU whose memory this region is, `None` for host memory.
    pub fn device(&self) -> Option<u32> {
        self.inner.device
    }

    /// True for memory this process already had ([`MemoryRegion::process_memory`]).
    pub fn process(&self) -> bool {
        self.inner.process
    }

    /// Size of the pages backing the region: 2 MiB for hugetlbfs, else the base page size.
    pub fn page_size(&self) -> usize {
        self.inner.page_size
    }

    /// True when the region is backed by hugetlbfs pages.
    pub fn huge_pages(&self) -> bool {
        self.inner.huge
    }

    /// True when the memfd is sealed against shrinking, so it is safe to hand to other
    /// processes (the shm transport offers only sealed regions).
    pub fn sealed(&self) -> bool {
        self.inner.sealed
    }

    /// Copies `dst.len()` bytes starting at `offset` out of the region.
    pub fn read_at(&self, offset: u64, dst: &mut [u8]) -> Result<(), RegionError> {
        let src = self.range_ptr(offset, dst.len() as u64)?;
        // SAFETY: `range_ptr` checked that the range lies inside the live mapping; `dst` is a
        // distinct Rust buffer. Concurrent writers (peers) can only make the copied bytes
        // stale, which is the documented contract of shared regions.
        unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Copies `src` into the region starting at `offset`.
    pub fn write_at(&self, offset: u64, src: &[u8]) -> Result<(), RegionError> {
        let dst = self.range_ptr(offset, src.len() as u64)?;
        // SAFETY: as in `read_at`, with the roles of the buffers swapped.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        Ok(())
    }

    /// Pointer for the CPU to `offset` after checking that `[offset, offset + len)` is inside
    /// the region; refused for device memory, which the CPU cannot touch.
    pub(crate) fn range_ptr(&self, offset: u64, len: u64) -> Result<*mut u8, RegionError> {
        if let Some(ordinal) = self.inner.device {
            return Err(RegionError::DeviceMemory { ordinal });
        }
        self.range_addr(offset, len)
    }

    /// Address of `offset` after checking that `[offset, offset + len)` is inside the region,
    /// for a NIC (host or device memory alike); never to be dereferenced by the CPU.
    pub(crate) fn range_addr(&self, offset: u64, len: u64) -> Result<*mut u8, RegionError> {
        let out = || RegionError::OutOfBounds {
            offset,
            len,
            size: self.inner.len as u64,
        };
        let end = offset.checked_add(len).ok_or_else(out)?;
        if end > self.inner.len as u64 {
            return Err(out());
        }
        // offset <= len, so the result stays inside (or one past) the range; wrapping_add
        // because a device address is not an allocation of this process.
        Ok(self.inner.ptr.as_ptr().wrapping_add(offset as usize))
    }
}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("ptr", &self.inner.ptr)
            .field("len", &self.inner.len)
            .field("page_size", &self.inner.page_size)
            .field("sealed", &self.inner.sealed)
            .field("device", &self.inner.device)
            .field("process", &self.inner.process)
            .field("owned_mapping", &self.inner.owned_map_len.is_some())
            .finish()
    }
}

fn allocate_with(name: &str, len: usize, huge: bool) -> Result<MemoryRegion, RegionError> {
    let mut opts = memfd::MemfdOptions::default()
        .close_on_exec(true)
        .allow_sealing(true);
    let map_len = if huge {
        opts = opts.hugetlb(Some(memfd::HugetlbSize::Huge2MB));
        len.div_ceil(HUGE_PAGE) * HUGE_PAGE
    } else {
        len.div_ceil(crate::sys::page_size()) * crate::sys::page_size()
    };
    let unavailable = |source: io::Error| {
        if huge {
            RegionError::HugePagesUnavailable {
                len: len as u64,
                source: Arc::new(source),
            }
        } else {
            RegionError::Memfd(Arc::new(source))
        }
    };
    let mfd = opts
        .create(name)
        .map_err(|e| unavailable(io::Error::other(e.to_string())))?;
    mfd.as_file()
        .set_len(map_len as u64)
        .map_err(|source| RegionError::Resize {
            len: map_len as u64,
            source: Arc::new(source),
        })?;
    let fd: OwnedFd = mfd.into_file().into();
    let sealed = seal(fd.as_fd());
    // hugetlbfs reserves the pages at mmap time (no MAP_NORESERVE), so an empty pool fails
    // here, cleanly, rather than with SIGBUS on first touch.
    let ptr = map_shared(&fd, map_len).map_err(|err| match err {
        RegionError::Map { source, .. } if huge => RegionError::HugePagesUnavailable {
            len: len as u64,
            source,
        },
        other => other,
    })?;
    let page = if huge {
        HUGE_PAGE
    } else {
        // SAFETY: `ptr`/`map_len` is the mapping just created; MADV_HUGEPAGE is only a hint
        // (transparent huge pages for shmem, when the kernel is configured to honour it).
        unsafe { libc::madvise(ptr.as_ptr().cast(), map_len, libc::MADV_HUGEPAGE) };
        crate::sys::page_size()
    };
    Ok(MemoryRegion::from_parts(
        ptr,
        len,
        Some(map_len),
        fd,
        page,
        sealed,
    ))
}

/// `mmap(MAP_SHARED, PROT_READ | PROT_WRITE)` of the first `len` bytes of `fd`.
pub(crate) fn map_shared(fd: &OwnedFd, len: usize) -> Result<NonNull<u8>, RegionError> {
    // SAFETY: a fresh mapping chosen by the kernel (addr = null) cannot alias Rust-owned memory;
    // the caller owns the result and unmaps it exactly once.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(RegionError::Map {
            len: len as u64,
            source: Arc::new(io::Error::last_os_error()),
        });
    }
    NonNull::new(ptr.cast()).ok_or_else(|| RegionError::Map {
        len: len as u64,
        source: Arc::new(io::Error::other("mmap returned null")),
    })
}

pub(crate) fn fstat(fd: &OwnedFd) -> Result<libc::stat, RegionError> {
    // SAFETY: `stat` is plain old data that fstat fully initialises on success.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is an open descriptor and `stat` a valid out-pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut stat) } != 0 {
        return Err(RegionError::Fd(Arc::new(io::Error::last_os_error())));
    }
    Ok(stat)
}

fn check_size(stat: &libc::stat, len: usize) -> Result<(), RegionError> {
    let actual = u64::try_from(stat.st_size).unwrap_or(0);
    if actual < len as u64 {
        return Err(RegionError::FileTooShort {
            len: len as u64,
            actual,
        });
    }
    Ok(())
}

/// hugetlbfs reports its page size as the block size.
fn page_size_of(stat: &libc::stat) -> usize {
    usize::try_from(stat.st_blksize)
        .ok()
        .filter(|b| *b >= crate::sys::page_size())
        .unwrap_or_else(crate::sys::page_size)
}

/// True when `fd` can no longer shrink: already sealed, or sealed now. Also seals growth and
/// further sealing, so that a peer cannot add `F_SEAL_FUTURE_WRITE` behind our back.
pub(crate) fn seal(fd: BorrowedFd<'_>) -> bool {
    if is_sealed(fd) {
        return true;
    }
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: F_ADD_SEALS takes an int argument and touches no memory of ours.
    let rc = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) };
    rc == 0 && is_sealed(fd)
}

/// True when `fd` is a memfd sealed against shrinking (so mapping it cannot lead to `SIGBUS`).
pub(crate) fn is_sealed(fd: BorrowedFd<'_>) -> bool {
    // SAFETY: F_GET_SEALS takes no argument and touches no memory of ours.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    seals >= 0 && seals & libc::F_SEAL_SHRINK != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_is_zeroed_aligned_sealed_and_bounds_checked() {
        let r = MemoryRegion::allocate("t", 10_000, HugePages::Never).unwrap();
        assert_eq!(r.len(), 10_000);
        assert_eq!(r.as_ptr() as usize % crate::sys::page_size(), 0);
        assert!(r.sealed());
        assert!(!r.huge_pages());
        let mut buf = vec![1u8; 10_000];
        r.read_at(0, &mut buf).unwrap();
        assert!(buf.iter().all(|b| *b == 0));
        r.write_at(9_990, b"0123456789").unwrap();
        let mut tail = [0u8; 10];
        r.read_at(9_990, &mut tail).unwrap();
        assert_eq!(&tail, b"0123456789");
        assert!(matches!(
            r.write_at(9_991, b"0123456789"),
            Err(RegionError::OutOfBounds { .. })
        ));
        assert!(matches!(
            r.read_at(u64::MAX, &mut tail),
            Err(RegionError::OutOfBounds { .. })
        ));
        assert!(matches!(
            MemoryRegion::allocate("t", 0, HugePages::Never),
            Err(RegionError::Empty)
        ));
    }

    /// A device region is an address range only: no memfd, not shareable, and every CPU
    /// access is refused with the GPU's ordinal, while the NIC's address is bounds-checked.
    #[test]
    fn device_memory_is_never_touched_by_the_cpu() {
        // SAFETY: the region is never dereferenced: every CPU access is refused (what this
        // test checks) and no NIC is involved.
        let r = unsafe { MemoryRegion::device_memory(3, 0x7f00_0000_0000, 1 << 20) }.unwrap();
        assert_eq!(r.device(), Some(3));
        assert_eq!(r.len(), 1 << 20);
        assert!(r.fd().is_none());
        assert!(!r.sealed());
        let mut buf = [0u8; 8];
        let refused = |e: Result<(), RegionError>| {
            assert!(
                matches!(e, Err(RegionError::DeviceMemory { ordinal: 3 })),
                "{e:?}"
            )
        };
        refused(r.read_at(0, &mut buf));
        refused(r.write_at(0, &buf));
        assert!(matches!(
            r.range_ptr(0, 8),
            Err(RegionError::DeviceMemory { ordinal: 3 })
        ));
        assert_eq!(r.range_addr(16, 8).unwrap() as u64, 0x7f00_0000_0010);
        assert!(matches!(
            r.range_addr(1 << 20, 1),
            Err(RegionError::OutOfBounds { .. })
        ));
        let mk = |ptr, len| {
            // SAFETY: as above; these are refused before anything is built.
            unsafe { MemoryRegion::device_memory(0, ptr, len) }
        };
        assert!(matches!(mk(0x1000, 0), Err(RegionError::Empty)));
        assert!(matches!(mk(0, 4096), Err(RegionError::OutOfBounds { .. })));
        assert!(matches!(
            mk(u64::MAX - 10, 4096),
            Err(RegionError::OutOfBounds { .. })
        ));
    }

    /// Whatever the machine has: `Auto` always works, `Require` either gives huge pages or the
    /// typed error, and the two agree with each other.
    #[test]
    fn huge_pages_fall_back_cleanly() {
        let len = 3 << 20;
        let auto = MemoryRegion::allocate("auto", len, HugePages::Auto).unwrap();
        assert_eq!(auto.len(), len);
        auto.write_at(len as u64 - 1, &[7]).unwrap();
        match MemoryRegion::allocate("req", len, HugePages::Require) {
            Ok(r) => {
                assert!(r.huge_pages());
                assert_eq!(r.page_size(), 2 << 20);
                assert_eq!(r.as_ptr() as usize % (2 << 20), 0);
            }
            Err(RegionError::HugePagesUnavailable { .. }) => assert!(!auto.huge_pages()),
            Err(other) => panic!("unexpected error {other}"),
        }
    }

    #[test]
    fn map_memfd_shares_pages_with_the_owner() {
        let owner = MemoryRegion::allocate("owner", 8192, HugePages::Never).unwrap();
        let view = MemoryRegion::map_memfd(owner.fd().unwrap(), 8192).unwrap();
        assert_ne!(owner.as_ptr(), view.as_ptr());
        owner.write_at(100, b"shared").unwrap();
        let mut got = [0u8; 6];
        view.read_at(100, &mut got).unwrap();
        assert_eq!(&got, b"shared");
        assert!(view.sealed());
        assert!(matches!(
            MemoryRegion::map_memfd(owner.fd().unwrap(), 8193),
            Err(RegionError::FileTooShort { .. })
        ));
    }

    /// The storage node's arena today is a memfd created without `MFD_ALLOW_SEALING`: it can be
    /// registered, but is not offered over shm.
    #[test]
    fn existing_mapping_without_sealing_is_usable_but_not_shareable() {
        let mfd = memfd::MemfdOptions::default().create("arena").unwrap();
        let file = mfd.into_file();
        file.set_len(16384).unwrap();
        let fd: OwnedFd = file.into();
        let ptr = map_shared(&fd, 16384).unwrap();
        // SAFETY: the mapping above stays alive (it is unmapped at the end of the test, after
        // the region is dropped).
        let region = unsafe { MemoryRegion::from_mapping(fd.as_fd(), ptr, 16384) }.unwrap();
        assert!(!region.sealed());
        assert_eq!(region.as_ptr(), ptr.as_ptr());
        region.write_at(0, b"abc").unwrap();
        // SAFETY: reading 3 bytes of our own live mapping.
        assert_eq!(
            unsafe { std::slice::from_raw_parts(ptr.as_ptr(), 3) },
            b"abc"
        );
        // SAFETY: a deliberately misaligned pointer is rejected before use.
        let bad = unsafe {
            MemoryRegion::from_mapping(fd.as_fd(), NonNull::new(ptr.as_ptr().add(1)).unwrap(), 100)
        };
        assert!(matches!(bad, Err(RegionError::Unaligned(_))));
        drop(region);
        // SAFETY: unmapping our own mapping once, after the region that borrowed it is gone.
        unsafe { libc::munmap(ptr.as_ptr().cast(), 16384) };
    }
}
