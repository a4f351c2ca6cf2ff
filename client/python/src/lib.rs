//! `yutu._native`: the extension module of the Python package `yutu` (see `python/yutu`).
//!
//! A thin layer over `yutu_client`: [`store::Store`] wraps a `KvClient` and an S3 `Client`
//! for one bucket, [`device`] moves the spans that are GPU memory (host spans go through
//! `yutu_client::kv::{InPlace, SpanStaging}`), [`memory`] turns pointers and Python buffers
//! into byte spans, [`args`] checks the span lists of the multi-buffer calls, [`slab`] is
//! registered memory for Mooncake's buffer handles, and [`errors`] turns failures into the
//! package's exception classes.

use pyo3::prelude::*;

mod args;
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
    m.add_function(wrap_pyfunction!(args::plain_spans, m)?)?;
    m.add_function(wrap_pyfunction!(args::plain_flat, m)?)?;
    m.add("MAX_BATCH", yutu_client::kv::MAX_BATCH)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
