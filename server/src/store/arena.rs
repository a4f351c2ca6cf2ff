//! A shard's DRAM arena: one memfd-backed mapping carved up by an offset allocator.
//!
//! The arena is a memfd rather than anonymous memory so that later work can register it with
//! the transfer engine and hand its file descriptor to same-host peers (one-sided reads over
//! shared memory). Objects are placed by `offset-allocator`, a two-level segregated-fit
//! allocator with O(1) allocate and free and bounded fragmentation, working in 64-byte
//! granules so that a `u32` covers up to 256 GiB per shard.
//!
//! Only the owning shard's thread touches its arena, so no synchronisation is needed here.

use std::fs::File;

use memmap2::MmapMut;
use offset_allocator::{Allocation, Allocator};

use super::prefault::{FirstUse, Prefault};

/// Allocation unit. Small enough that 4 KiB objects waste little, large enough that a `u32`
/// count of granules covers any realistic shard.
pub const GRANULE: u64 = 64;

/// Bytes of a stored object inside the arena.
pub struct Extent {
    alloc: Allocation,
    pub offset: u64,
    pub len: u64,
    /// Bytes reserved, a whole number of granules (at least one, even for an empty object).
    pub reserved: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ArenaError {
    #[error("cannot create the DRAM arena memfd: {0}")]
    Memfd(String),
    #[error("cannot size the DRAM arena to {size} bytes: {source}")]
    Resize { size: u64, source: std::io::Error },
    #[error("cannot map the DRAM arena: {0}")]
    Map(std::io::Error),
    #[error("arena of {0} bytes is larger than 256 GiB per shard")]
    TooLarge(u64),
}

pub struct Arena {
    /// Declared first so that it is dropped (stopped and joined) before the mapping goes.
    prefault: Option<Prefault>,
    map: MmapMut,
    /// Kept open so the memfd can be shared with peers later; the mapping keeps the pages.
    _file: File,
    alloc: Allocator,
    /// The chunks allocations have reached, populated as they first do.
    first_use: FirstUse,
    capacity: u64,
    reserved: u64,
}

impl Arena {
    /// Creates an arena of `capacity` bytes (rounded down to whole granules).
    ///
    /// `max_objects` bounds the allocator's node table (one node per live allocation or free
    /// fragment); its memory is preallocated, about 28 bytes a node.
    pub fn new(name: &str, capacity: u64, max_objects: u32) -> Result<Arena, ArenaError> {
        let granules = capacity / GRANULE;
        if granules >= u32::MAX as u64 {
            return Err(ArenaError::TooLarge(capacity));
        }
        let capacity = granules * GRANULE;
        // Sealing is allowed so that the transfer engine can seal the size and hand the memfd
        // to same-host peers (shared-memory transport) without them fearing a shrink.
        let memfd = memfd::MemfdOptions::default()
            .close_on_exec(true)
            .allow_sealing(true)
            .create(name)
            .map_err(|e| ArenaError::Memfd(e.to_string()))?;
        let file = memfd.into_file();
        file.set_len(capacity)
            .map_err(|source| ArenaError::Resize {
                size: capacity,
                source,
            })?;
        // SAFETY: the memfd was created above and is private to this process until it is
        // shared on purpose; nothing else truncates it, so the mapping stays valid for the
        // arena's lifetime (the file is kept open next to it).
        let map = unsafe { MmapMut::map_mut(&file) }.map_err(ArenaError::Map)?;
        Ok(Arena {
            prefault: None,
            map,
            _file: file,
            alloc: Allocator::with_max_allocs(granules as u32, max_objects.max(16)),
            first_use: FirstUse::new(capacity as usize),
            capacity,
            reserved: 0,
        })
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Starts faulting the whole arena in, in a thread named `thread` (`--prefault`; see
    /// `prefault.rs`). The arena stops it when dropped.
    pub fn prefault(&mut self, thread: String) -> std::io::Result<()> {
        let (base, len) = (self.map.as_mut_ptr(), self.map.len());
        // SAFETY: the arena's own mapping, which outlives the prefault: `prefault` is the
        // first field, dropped (stopped and joined) before `map`.
        self.prefault = Some(unsafe { Prefault::start(thread, base, len) }?);
        Ok(())
    }

    /// Waits until a prefault started by [`Arena::prefault`] is done.
    pub fn finish_prefault(&mut self) {
        if let Some(p) = self.prefault.take() {
            p.finish();
        }
    }

    /// The memfd behind the arena, for registration with the transfer engine.
    pub fn memfd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self._file.as_fd()
    }

    /// Bytes currently reserved by live extents.
    pub fn reserved(&self) -> u64 {
        self.reserved
    }

    /// Bytes an object of `len` bytes reserves.
    pub fn reservation_for(len: u64) -> u64 {
        len.div_ceil(GRANULE).max(1) * GRANULE
    }

    /// Reserves room for `len` bytes; `None` when no free block is large enough (or the node
    /// table is full), in which case the caller evicts and tries again.
    ///
    /// The room's pages are the node's when this answers: the first allocation to reach a
    /// part of the arena populates it (see `prefault.rs`), so a same-host client may write
    /// the room through its view and nothing waits on page faults.
    pub fn allocate(&mut self, len: u64) -> Option<Extent> {
        let granules = u32::try_from(Self::reservation_for(len) / GRANULE).ok()?;
        let alloc = self.alloc.allocate(granules)?;
        let reserved = granules as u64 * GRANULE;
        self.reserved += reserved;
        let offset = alloc.offset as u64 * GRANULE;
        self.first_use.reach(&mut self.map[..], offset, reserved);
        Some(Extent {
            offset,
            alloc,
            len,
            reserved,
        })
    }

    pub fn free(&mut self, extent: Extent) {
        self.reserved -= extent.reserved;
        self.alloc.free(extent.alloc);
    }

    /// `len` bytes at `offset`, if the range lies inside the arena.
    pub fn slice(&self, offset: u64, len: u64) -> Option<&[u8]> {
        let end = offset.checked_add(len)?;
        self.map.get(offset as usize..end as usize)
    }

    pub fn slice_mut(&mut self, offset: u64, len: u64) -> Option<&mut [u8]> {
        let end = offset.checked_add(len)?;
        self.map.get_mut(offset as usize..end as usize)
    }

    pub fn bytes(&self, extent: &Extent) -> &[u8] {
        &self.map[extent.offset as usize..(extent.offset + extent.len) as usize]
    }

    pub fn bytes_mut(&mut self, extent: &Extent) -> &mut [u8] {
        &mut self.map[extent.offset as usize..(extent.offset + extent.len) as usize]
    }

    /// The bytes of several extents at once, in the order given (a batch of blocks filled
    /// by one copy); `None` when two overlap, which extents the allocator handed out never do.
    pub fn bytes_mut_many(&mut self, extents: &[&Extent]) -> Option<Vec<&mut [u8]>> {
        let mut order: Vec<usize> = (0..extents.len()).collect();
        order.sort_unstable_by_key(|&i| extents[i].offset);
        let mut out: Vec<Option<&mut [u8]>> = (0..extents.len()).map(|_| None).collect();
        let mut rest: &mut [u8] = &mut self.map[..];
        let mut at = 0u64;
        for i in order {
            let e = extents[i];
            let skip = usize::try_from(e.offset.checked_sub(at)?).ok()?;
            let tail = std::mem::take(&mut rest).get_mut(skip..)?;
            let (mine, after) = tail.split_at_mut_checked(usize::try_from(e.len).ok()?)?;
            out[i] = Some(mine);
            rest = after;
            at = e.offset + e.len;
        }
        out.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_write_free_reuse() {
        let mut a = Arena::new("t", 1 << 20, 1024).unwrap();
        let e = a.allocate(1000).unwrap();
        assert_eq!(e.reserved, 1024);
        a.bytes_mut(&e).fill(7);
        assert!(a.bytes(&e).iter().all(|b| *b == 7));
        assert_eq!(a.reserved(), 1024);
        let big = a.allocate(1 << 20);
        assert!(
            big.is_none(),
            "cannot fit a whole-arena object beside another"
        );
        a.free(e);
        assert_eq!(a.reserved(), 0);
        let whole = a.allocate(1 << 20).unwrap();
        assert_eq!(whole.offset, 0);
        let empty = Arena::reservation_for(0);
        assert_eq!(empty, GRANULE);
    }

    /// `--prefault`: every page of the arena is resident once it is done, and the bytes
    /// written meanwhile are kept (populating never writes).
    #[test]
    fn a_prefaulted_arena_is_resident_and_keeps_what_was_written() {
        let len = 8 << 20;
        let mut a = Arena::new("t", len, 1024).unwrap();
        let e = a.allocate(4096).unwrap();
        a.bytes_mut(&e).fill(9);
        assert!(resident_bytes(&a) < len as usize / 2, "not resident before");
        a.prefault("prefault-test".into()).unwrap();
        a.finish_prefault();
        assert_eq!(resident_bytes(&a), len as usize);
        assert!(a.bytes(&e).iter().all(|b| *b == 9));
    }

    /// Pages of `a` resident in its memfd, in bytes.
    fn resident_bytes(a: &Arena) -> usize {
        let len = a.map.len();
        let mut v = vec![0u8; len.div_ceil(4096)];
        // SAFETY: the arena's own mapping, one output byte per page of it.
        let rc = unsafe { libc::mincore(a.map.as_ptr() as *mut libc::c_void, len, v.as_mut_ptr()) };
        assert_eq!(rc, 0);
        v.iter().filter(|b| **b & 1 == 1).count() * 4096
    }

    /// Without `--prefault`, the room an allocation hands out is resident before anything
    /// writes it (so a client may write it through its view), the whole 2 MiB chunk around
    /// it; chunks no allocation reached stay unallocated.
    #[test]
    fn an_allocation_populates_the_chunks_it_reaches_first() {
        use super::super::prefault::FIRST_USE_CHUNK as C;
        let mut a = Arena::new("t", 8 << 20, 1024).unwrap();
        assert_eq!(resident_bytes(&a), 0);
        let small = a.allocate(4096).unwrap();
        assert_eq!(resident_bytes(&a), C, "the first chunk, not a byte written");
        let again = a.allocate(4096).unwrap();
        assert_eq!(resident_bytes(&a), C);
        // A 3 MiB block: every chunk it reaches, and no other.
        let big = a.allocate(3 << 20).unwrap();
        let reached =
            |e: &Extent| (e.offset as usize / C)..=((e.offset + e.reserved - 1) as usize / C);
        let chunks: std::collections::BTreeSet<usize> = [&small, &again, &big]
            .into_iter()
            .flat_map(reached)
            .collect();
        assert!(chunks.len() >= 2 && chunks.len() < 4, "{chunks:?}");
        assert_eq!(resident_bytes(&a), chunks.len() * C);
        assert!(a.bytes(&big).iter().all(|b| *b == 0));
        for e in [small, again, big] {
            a.free(e);
        }
    }

    #[test]
    fn several_extents_are_filled_at_once_in_the_order_given() {
        let mut a = Arena::new("t", 1 << 20, 1024).unwrap();
        let x = a.allocate(100).unwrap();
        let y = a.allocate(3000).unwrap();
        let z = a.allocate(0).unwrap();
        {
            let mut many = a.bytes_mut_many(&[&y, &z, &x]).unwrap();
            assert_eq!(
                many.iter().map(|b| b.len()).collect::<Vec<_>>(),
                [3000, 0, 100]
            );
            many[0].fill(2);
            many[2].fill(1);
        }
        assert!(a.bytes(&x).iter().all(|b| *b == 1));
        assert!(a.bytes(&y).iter().all(|b| *b == 2));
        // The same extent twice would be two mutable borrows of one range.
        assert!(a.bytes_mut_many(&[&x, &x]).is_none());
    }
}
