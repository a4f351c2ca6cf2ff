//! `yutu._native`: the extension module of the Python package `yutu` (see `python/yutu`).
//!
//! A thin layer over `yutu_client`: [`store::Store`] wraps a `KvClient` and an S3 `Client`
//! for one bucket, [`staging`] moves blocks between the caller's memory and buffers the node
//! can reach, [`device`] moves the spans that are GPU memory, [`memory`] turns pointers and
//! Python buffers into byte spans, [`slab`] is registered memory for Mooncake's buffer
//! handles, and [`errors`] turns failures into the package's exception
//! classes.

use pyo3::prelude::*;

mod device;
mod errors;
mod hashing;
mod memory;
mod slab;
mod store;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<store::Store>()?;
    m.add_class::<slab::Slab>()?;
    m.add_class::<hashing::BlockHasher>()?;
    m.add("MAX_BATCH", yutu_client::kv::MAX_BATCH)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
