//! Checks of the pointer and size lists engines pass to the batch calls, done here because
//! the same checks in Python cost about 2 us per span: for SGLang's layer-first pools (512
//! spans a batch) that was a third of the call, and for a `batch_get_into` of 256 blocks of
//! 4 KiB more than half of it.

use pyo3::conversion::FromPyObjectOwned;
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyList};

/// Whether `ptrs` and `sizes` are lists of `n` lists, pairwise of the same length and never
/// empty, whose items are all plain `int`s (not `bool`, not numpy integers) above zero,
/// pointers within the address space: then every key of the call is usable as given, and
/// the package skips its per-span checks. `False` sends the call through those checks,
/// which decide per key (so a bad span fails only its key, as in Mooncake).
#[pyfunction]
pub fn plain_spans(ptrs: &Bound<'_, PyAny>, sizes: &Bound<'_, PyAny>, n: usize) -> bool {
    let (Ok(ptrs), Ok(sizes)) = (ptrs.cast_exact::<PyList>(), sizes.cast_exact::<PyList>()) else {
        return false;
    };
    if ptrs.len() != n || sizes.len() != n {
        return false;
    }
    ptrs.iter().zip(sizes.iter()).all(|(p, z)| {
        let (Ok(p), Ok(z)) = (p.cast_exact::<PyList>(), z.cast_exact::<PyList>()) else {
            return false;
        };
        !p.is_empty()
            && p.len() == z.len()
            && p.iter()
                .zip(z.iter())
                .all(|(p, z)| positive::<usize>(&p) && positive::<u64>(&z))
    })
}

/// Whether `ptrs` and `sizes` are lists of `n` plain `int`s above zero (pointers within the
/// address space): the single-buffer batch calls (`batch_get_into`, `batch_put_from`) then
/// send the call as given. `False` sends it through the per-key checks.
#[pyfunction]
pub fn plain_flat(ptrs: &Bound<'_, PyAny>, sizes: &Bound<'_, PyAny>, n: usize) -> bool {
    let (Ok(ptrs), Ok(sizes)) = (ptrs.cast_exact::<PyList>(), sizes.cast_exact::<PyList>()) else {
        return false;
    };
    ptrs.len() == n
        && sizes.len() == n
        && ptrs
            .iter()
            .zip(sizes.iter())
            .all(|(p, z)| positive::<usize>(&p) && positive::<u64>(&z))
}

/// Whether `x` is a plain `int` above zero that fits a `T`.
fn positive<'py, T>(x: &Bound<'py, PyAny>) -> bool
where
    T: FromPyObjectOwned<'py> + Default + PartialOrd,
{
    x.is_exact_instance_of::<PyInt>() && x.extract::<T>().is_ok_and(|v| v > T::default())
}
