//! The block-device layer: a [`Bdev`] moves whole, aligned blocks between memory and a device.
//!
//! The shape is SPDK's `spdk_bdev`: a device is a number of fixed-size blocks; reads and writes
//! name a starting block (LBA) and cover many blocks; `flush` makes every completed write
//! durable. Nothing above this layer knows whether the blocks live in a file opened with
//! O_DIRECT, on a raw NVMe namespace, or in RAM.
//!
//! The trait is async and deliberately not `Send`: each server shard is a glommio executor on
//! its own thread, and the device handle, its buffers and its in-flight I/O never leave that
//! thread (io_uring rings and SPDK queue pairs are both per-thread objects). That is also why
//! it uses `async fn` in the trait: the futures need no `Send` bound and no boxing.
//!
//! Buffers are the backend's own type ([`Bdev::Buf`]) because the backends disagree on what
//! memory may be handed to the hardware: glommio wants its `DmaBuffer` (aligned, possibly from
//! its registered pool), SPDK wants `spdk_dma_malloc` memory, RAM takes anything. Writes take
//! the buffer behind an `Rc` so the caller can keep serving reads from it while the device
//! still owns it.

pub mod ram;
pub mod uring;

use std::rc::Rc;

use crate::error::BdevError;

/// A buffer a backend accepts for writes: writable bytes whose address and length satisfy the
/// device's DMA alignment.
pub trait IoBuf: AsRef<[u8]> + AsMut<[u8]> {}

impl<T: AsRef<[u8]> + AsMut<[u8]>> IoBuf for T {}

/// A block device used from one thread.
///
/// Contract for implementations:
/// - `write_blocks` and `read_blocks` either move exactly the requested blocks or fail; a
///   short transfer is an error ([`BdevError::Short`]), never a partial success.
/// - A write that has completed is visible to every later read, but durable only after a
///   later `flush` has completed (the device may have a volatile write cache).
/// - Concurrent I/Os to disjoint blocks are allowed and may complete in any order. Callers
///   never issue overlapping writes concurrently.
#[allow(async_fn_in_trait)] // Deliberate: used on one shard thread; see the module docs.
pub trait Bdev {
    /// The memory this device writes from.
    type Buf: IoBuf;
    /// What a read returns.
    type ReadBuf: AsRef<[u8]>;

    /// Bytes per block: the smallest aligned unit of I/O (O_DIRECT alignment, NVMe LBA size).
    fn block_size(&self) -> usize;

    /// Number of blocks on the device.
    fn block_count(&self) -> u64;

    /// A short name for logs and errors (a path, `ram`, a PCIe address).
    fn name(&self) -> String;

    /// Allocates a zeroed buffer of `len` bytes, `len` a multiple of [`Bdev::block_size`].
    fn alloc_buf(&self, len: usize) -> Self::Buf;

    /// Writes the whole of `buf` (a multiple of the block size) starting at block `lba`.
    async fn write_blocks(&self, lba: u64, buf: Rc<Self::Buf>) -> Result<(), BdevError>;

    /// Reads `nblocks` blocks starting at block `lba`.
    async fn read_blocks(&self, lba: u64, nblocks: u64) -> Result<Self::ReadBuf, BdevError>;

    /// Makes every write that completed before this call durable (fdatasync, NVMe FLUSH).
    async fn flush(&self) -> Result<(), BdevError>;
}

/// Checks an I/O request against the device geometry; every backend calls it first, so
/// misuse fails the same way on RAM as on real hardware.
pub(crate) fn check_io(
    lba: u64,
    len_bytes: u64,
    block_size: usize,
    block_count: u64,
) -> Result<u64, BdevError> {
    let bs = block_size as u64;
    if len_bytes % bs != 0 {
        return Err(BdevError::Misaligned {
            what: "length",
            value: len_bytes,
            block_size,
        });
    }
    let nblocks = len_bytes / bs;
    let end = lba.saturating_add(nblocks);
    if end > block_count {
        return Err(BdevError::OutOfRange {
            lba,
            end,
            block_count,
        });
    }
    Ok(nblocks)
}
