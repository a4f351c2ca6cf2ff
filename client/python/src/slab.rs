//! `yutu._native.Slab`: a buffer registered with the store's transfer engine, carved up by the
//! Python half into the memory of Mooncake's `BufferHandle`s.
//!
//! `get_buffer`/`batch_get_buffer` answer handles whose memory the client owns. Were that
//! memory ordinary heap, every block would be copied twice (node into a staging buffer, staging
//! buffer into the handle) and the handle's fresh pages faulted in on every call. A slab is
//! memory the node writes into directly (a sealed memfd it maps, or the client's engine), as
//! Mooncake's handles live in its registered local buffer: one copy per block, and pages that
//! stay mapped from one call to the next. The Python half allocates ranges of it, hands them
//! out as handles that keep the slab alive, and frees a range when its handle is collected.

use std::sync::Arc;

use pyo3::prelude::*;
use yutu_client::kv::Buffer;

/// One registered buffer; unregistered and unmapped when the last reference goes (the store
/// and every handle over it hold one).
#[pyclass(module = "yutu._native", frozen)]
pub struct Slab {
    pub(crate) buf: Arc<Buffer>,
}

#[pymethods]
impl Slab {
    /// The address of its first byte.
    #[getter]
    fn addr(&self) -> usize {
        self.buf.segment().region().as_ptr() as usize
    }

    /// Its length in bytes.
    #[getter]
    fn size(&self) -> u64 {
        self.buf.len()
    }

    fn __repr__(&self) -> String {
        format!("Slab(addr={:#x}, size={})", self.addr(), self.size())
    }
}
