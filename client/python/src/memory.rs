//! The caller's memory: spans of bytes, and the pointer ranges registered with
//! `register_buffer`.
//!
//! A registered host range is handed to the client's transfer engine
//! (`yutu_client::kv::InPlace`): as its memfd when it is memory from
//! `MooncakeHostMemAllocator` (the node maps it and copies with `memcpy`), otherwise as
//! process memory the node reaches through this process's memory file. Memory outside every
//! registered range goes through the store's staging buffers (`yutu_client::kv::SpanStaging`).
//! Registration is still required for raw pointers, as in Mooncake: it is the one check that
//! a pointer the caller passes was meant as transfer memory, so a wrong integer fails with an
//! error instead of scribbling over the interpreter. Python objects (buffers, tensors) are
//! resolved into pointers by the package's Python half (`yutu/_memory.py`), which keeps them
//! alive for the call and marks their spans as not needing registration: the buffer protocol
//! is not in the stable ABI before Python 3.11, and the package's one wheel serves 3.9 and
//! later.
//!
//! A span may be GPU memory: a CUDA tensor or `__cuda_array_interface__` object (its device
//! comes from Python), or a raw pointer inside a range registered with
//! `register_buffer(ptr, size, device="cuda:N")`. Those move through `device.rs`.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::errors::{Error, Result};

/// Most ranges one store keeps registered; each is a map entry, and engines register a few
/// large buffers, not one per block.
const MAX_REGISTERED: usize = 4096;

pub use yutu_client::kv::Span;

/// One registered range.
#[derive(Debug, Clone, Copy)]
struct Range {
    len: u64,
    /// The GPU it is memory of (`register_buffer(..., device="cuda:N")`); `None`: host.
    device: Option<u32>,
}

/// The ranges registered with `register_buffer`, by start address.
#[derive(Default)]
pub struct Registry {
    ranges: Mutex<BTreeMap<usize, Range>>,
}

impl Registry {
    /// Registers `[addr, addr + len)`, memory of GPU `device` or (`None`) host memory; a range
    /// that overlaps one already registered is refused (registering the same range twice too).
    pub fn register(&self, addr: usize, len: u64, device: Option<u32>) -> Result<()> {
        if addr == 0 {
            return Err(Error::invalid("cannot register a null pointer"));
        }
        if len == 0 {
            return Err(Error::invalid("cannot register an empty buffer"));
        }
        let end = end_of(addr, len)?;
        let mut ranges = self.lock();
        if ranges.len() >= MAX_REGISTERED {
            return Err(Error::invalid(format!(
                "at most {MAX_REGISTERED} buffers can be registered at once"
            )));
        }
        let before = ranges.range(..end).next_back();
        if let Some((&start, r)) = before {
            let l = r.len;
            if start as u128 + l as u128 > addr as u128 {
                return Err(Error::invalid(format!(
                    "bytes {addr:#x}..{end:#x} overlap the buffer registered at {start:#x} ({l} bytes)"
                )));
            }
        }
        ranges.insert(addr, Range { len, device });
        Ok(())
    }

    /// Forgets the range registered at `addr`; false when none starts there.
    pub fn unregister(&self, addr: usize) -> bool {
        self.lock().remove(&addr).is_some()
    }

    /// Checks that `[addr, addr + len)` lies inside one registered range; the GPU that range
    /// is memory of (`None`: host memory).
    pub fn check(&self, addr: usize, len: u64) -> Result<Option<u32>> {
        let end = end_of(addr, len)?;
        self.containing(addr, end).ok_or_else(|| {
            Error::invalid(format!(
                "bytes {addr:#x}..{end:#x} are not inside a registered buffer \
                 (register_buffer(ptr, size) first)"
            ))
        })
    }

    /// The GPU of the registered range that holds `[addr, addr + len)`; `None` when that is a
    /// host range or no range holds it (for pointers that need no registration, as
    /// Mooncake's calls take them).
    pub fn device_of(&self, addr: usize, len: u64) -> Option<u32> {
        let end = end_of(addr, len).ok()?;
        self.containing(addr, end).flatten()
    }

    /// The bytes from `addr` to the end of the registered range holding it; 0 when none does.
    pub fn room(&self, addr: usize) -> u64 {
        let ranges = self.lock();
        match ranges.range(..=addr).next_back() {
            Some((&start, r)) => (start as u128 + r.len as u128)
                .saturating_sub(addr as u128)
                .try_into()
                .unwrap_or(0),
            None => 0,
        }
    }

    /// `Some(device)` of the range holding `[addr, end)`, `None` when none holds it.
    fn containing(&self, addr: usize, end: usize) -> Option<Option<u32>> {
        let ranges = self.lock();
        match ranges.range(..=addr).next_back() {
            Some((&start, r)) if start as u128 + r.len as u128 >= end as u128 => Some(r.device),
            _ => None,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<usize, Range>> {
        // A panic under this lock leaves the map whole (every change is one insert/remove).
        self.ranges.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn end_of(addr: usize, len: u64) -> Result<usize> {
    usize::try_from(len)
        .ok()
        .and_then(|l| addr.checked_add(l))
        .ok_or_else(|| Error::invalid(format!("{len} bytes at {addr:#x} wrap the address space")))
}

/// The spans of a call: `ptrs[i]` and `sizes[i]`, each inside a registered range unless
/// `checked[i]` is false (memory of a Python object the caller holds for the call). A checked
/// span is on the GPU its range was registered for; an unchecked one on `devices[i]` (`None`,
/// or `devices` empty: host memory).
pub fn spans(
    registry: &Registry,
    ptrs: &[usize],
    sizes: &[u64],
    checked: &[bool],
    devices: &[Option<u32>],
) -> Result<Vec<Span>> {
    if ptrs.len() != sizes.len() || ptrs.len() != checked.len() {
        return Err(Error::invalid(format!(
            "{} pointers but {} sizes",
            ptrs.len(),
            sizes.len()
        )));
    }
    if !devices.is_empty() && devices.len() != ptrs.len() {
        return Err(Error::invalid(format!(
            "{} pointers but {} devices",
            ptrs.len(),
            devices.len()
        )));
    }
    let mut out = Vec::with_capacity(ptrs.len());
    for (i, ((&addr, &len), &check)) in ptrs.iter().zip(sizes).zip(checked).enumerate() {
        let device = if check {
            registry
                .check(addr, len)
                .map_err(|e| Error::invalid(format!("buffer {i}: {e}")))?
        } else if addr == 0 && len > 0 {
            return Err(Error::invalid(format!("buffer {i} is a null pointer")));
        } else {
            devices.get(i).copied().flatten()
        };
        out.push(Span { addr, len, device });
    }
    Ok(out)
}
