//! A block device in RAM, for tests and for machines without a spare disk.
//!
//! It keeps the contract of a real device so that tests exercise the same paths: requests are
//! checked for alignment and range, every I/O yields to the executor once before it completes
//! (so callers really have I/O in flight), and, when built with
//! [`RamBdev::with_volatile_cache`], writes that were not followed by a `flush` are lost by
//! [`RamBdev::crash`], like a disk's volatile write cache losing power.
//!
//! Clones share the same blocks: a test keeps one clone, drops the store (or "crashes" it),
//! and opens a new store on another clone to observe recovery.

use std::cell::RefCell;
use std::rc::Rc;

use super::{check_io, Bdev};
use crate::error::BdevError;

/// Byte offset and previous contents of each write since the last flush.
type UndoLog = Vec<(usize, Vec<u8>)>;

/// A RAM-backed block device; see the module docs.
#[derive(Clone)]
pub struct RamBdev {
    inner: Rc<Inner>,
}

struct Inner {
    block_size: usize,
    block_count: u64,
    data: RefCell<Vec<u8>>,
    /// `Some` in volatile-cache mode: the previous contents of every range written since the
    /// last flush, oldest first, so a crash can put them back.
    undo: RefCell<Option<UndoLog>>,
}

impl RamBdev {
    /// A device of `block_count` blocks of `block_size` bytes whose writes are durable as soon
    /// as they complete. `block_size` must be a power of two of at least 512.
    pub fn new(block_size: usize, block_count: u64) -> Self {
        Self::build(block_size, block_count, false)
    }

    /// Like [`RamBdev::new`], but completed writes survive [`RamBdev::crash`] only once a
    /// flush has followed them.
    pub fn with_volatile_cache(block_size: usize, block_count: u64) -> Self {
        Self::build(block_size, block_count, true)
    }

    fn build(block_size: usize, block_count: u64, volatile: bool) -> Self {
        assert!(
            block_size.is_power_of_two() && block_size >= 512,
            "block size must be a power of two >= 512"
        );
        let len = usize::try_from(block_count)
            .ok()
            .and_then(|n| n.checked_mul(block_size))
            .expect("RAM device larger than the address space");
        RamBdev {
            inner: Rc::new(Inner {
                block_size,
                block_count,
                data: RefCell::new(vec![0; len]),
                undo: RefCell::new(volatile.then(Vec::new)),
            }),
        }
    }

    /// Loses every write not covered by a flush (volatile-cache mode; a no-op otherwise).
    pub fn crash(&self) {
        let mut undo = self.inner.undo.borrow_mut();
        if let Some(log) = undo.as_mut() {
            let mut data = self.inner.data.borrow_mut();
            for (off, old) in log.drain(..).rev() {
                data[off..off + old.len()].copy_from_slice(&old);
            }
        }
    }

    /// Overwrites raw bytes at a byte offset, bypassing the block interface: the fault
    /// injector of the recovery tests. Panics if the range is outside the device.
    pub fn poke(&self, offset: u64, bytes: &[u8]) {
        let off = usize::try_from(offset).expect("offset fits in memory");
        self.inner.data.borrow_mut()[off..off + bytes.len()].copy_from_slice(bytes);
    }

    /// Copies raw bytes out at a byte offset. Panics if the range is outside the device.
    pub fn peek(&self, offset: u64, len: usize) -> Vec<u8> {
        let off = usize::try_from(offset).expect("offset fits in memory");
        self.inner.data.borrow()[off..off + len].to_vec()
    }

    fn byte_range(&self, lba: u64, len: usize) -> std::ops::Range<usize> {
        // check_io has already bounded lba + len by the device size, which fits in memory.
        let start = lba as usize * self.inner.block_size;
        start..start + len
    }
}

impl Bdev for RamBdev {
    type Buf = Vec<u8>;
    type ReadBuf = Vec<u8>;

    fn block_size(&self) -> usize {
        self.inner.block_size
    }

    fn block_count(&self) -> u64 {
        self.inner.block_count
    }

    fn name(&self) -> String {
        "ram".to_owned()
    }

    fn alloc_buf(&self, len: usize) -> Vec<u8> {
        vec![0; len]
    }

    async fn write_blocks(&self, lba: u64, buf: Rc<Vec<u8>>) -> Result<(), BdevError> {
        check_io(lba, buf.len() as u64, self.block_size(), self.block_count())?;
        futures_lite::future::yield_now().await;
        let range = self.byte_range(lba, buf.len());
        let mut data = self.inner.data.borrow_mut();
        if let Some(log) = self.inner.undo.borrow_mut().as_mut() {
            log.push((range.start, data[range.clone()].to_vec()));
        }
        data[range].copy_from_slice(&buf);
        Ok(())
    }

    async fn read_blocks(&self, lba: u64, nblocks: u64) -> Result<Vec<u8>, BdevError> {
        let bs = self.block_size() as u64;
        let len = nblocks.saturating_mul(bs);
        check_io(lba, len, self.block_size(), self.block_count())?;
        futures_lite::future::yield_now().await;
        let range = self.byte_range(lba, len as usize);
        Ok(self.inner.data.borrow()[range].to_vec())
    }

    async fn flush(&self) -> Result<(), BdevError> {
        futures_lite::future::yield_now().await;
        if let Some(log) = self.inner.undo.borrow_mut().as_mut() {
            log.clear();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
        futures_lite::future::block_on(f)
    }

    #[test]
    fn rejects_misaligned_and_out_of_range_io() {
        let dev = RamBdev::new(512, 8);
        let short = Rc::new(vec![0u8; 100]);
        assert!(matches!(
            block_on(dev.write_blocks(0, short)),
            Err(BdevError::Misaligned { .. })
        ));
        let two = Rc::new(vec![0u8; 1024]);
        assert!(matches!(
            block_on(dev.write_blocks(7, two)),
            Err(BdevError::OutOfRange { .. })
        ));
        assert!(matches!(
            block_on(dev.read_blocks(u64::MAX, 2)),
            Err(BdevError::OutOfRange { .. })
        ));
    }

    #[test]
    fn crash_loses_only_unflushed_writes() {
        let dev = RamBdev::with_volatile_cache(512, 4);
        block_on(dev.write_blocks(0, Rc::new(vec![1u8; 512]))).expect("write");
        block_on(dev.flush()).expect("flush");
        block_on(dev.write_blocks(0, Rc::new(vec![2u8; 512]))).expect("write");
        block_on(dev.write_blocks(1, Rc::new(vec![3u8; 512]))).expect("write");
        assert_eq!(
            block_on(dev.read_blocks(0, 1)).expect("read"),
            vec![2u8; 512]
        );
        dev.crash();
        assert_eq!(
            block_on(dev.read_blocks(0, 1)).expect("read"),
            vec![1u8; 512]
        );
        assert_eq!(
            block_on(dev.read_blocks(1, 1)).expect("read"),
            vec![0u8; 512]
        );
    }
}
