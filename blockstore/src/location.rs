//! Where a record lives: the handle the index stores and `read` takes.

/// The address of one record on the device, valid for one incarnation of its region.
///
/// It carries the region's generation and the record's sequence number, so a location that
/// outlived its region (reclaimed and rewritten since) is recognised and refused
/// ([`crate::StoreError::Stale`]) instead of returning whatever lives there now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Location {
    pub(crate) region: u32,
    pub(crate) offset: u32,
    pub(crate) record_len: u32,
    pub(crate) value_len: u32,
    pub(crate) generation: u64,
    pub(crate) seq: u64,
}

impl Location {
    /// Index of the region on the device.
    pub fn region(&self) -> u32 {
        self.region
    }

    /// Byte offset of the record within its region.
    pub fn offset(&self) -> u32 {
        self.offset
    }

    /// Generation of the region incarnation the record was written into.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The record's sequence number; later writes of a key have larger ones.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Length of the stored value in bytes.
    pub fn value_len(&self) -> u64 {
        u64::from(self.value_len)
    }

    /// Bytes the whole record (header, names, value) occupies on the device.
    pub fn record_len(&self) -> u64 {
        u64::from(self.record_len)
    }
}
