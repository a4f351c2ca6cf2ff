//! GPU memory: the devices a store has opened, and batches whose spans are on GPUs.
//!
//! A span on GPU `N` (a CUDA tensor, a `__cuda_array_interface__` object, or a pointer inside
//! a range registered with `device="cuda:N"`) moves through the KV client's device calls
//! (`KvClient::batch_get_into_device` / `batch_put_from_device`): staged through pinned host
//! buffers that the node reaches like any other registered memory, double-buffered so that
//! the GPU's copies of one chunk overlap the node's work on the next. Blocks that all lie in
//! one range registered with `device=` go by GPUDirect RDMA instead, where the host allows it:
//! the store registers such a range with the KV client as well (`KvClient::register_device`),
//! and the client's device calls use that registration (`KvClient::device_path` says what
//! this host allows).
//!
//! A batch is split by where its spans are: the host spans go through the client's span
//! staging (`yutu_client::kv::SpanStaging`) and each GPU's spans through that GPU's calls,
//! one group after the other in the order their first span appears, and the answers are
//! merged in the caller's order. A span of 0 bytes names no memory and goes with the host spans.
//!
//! Devices are opened on first use and kept for the store's life: `open_cuda(N)` (the CUDA
//! driver through cudarc, loaded at run time; "no CUDA driver" on a host without one), or,
//! when the environment variable `YUTU_TEST_DEVICE=host` is set at the store's creation, a
//! stand-in whose "GPU" addresses are host addresses (`HostDevice::over_host_memory`), so
//! that the GPU paths are tested on machines without a GPU.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use yutu_client::kv::{
    Device, DeviceBlock, DeviceMemory, HostDevice, KvClient, KvError, PutOptions,
    SpanStaging as Staging, MAX_BATCH, MAX_STAGED_BLOCK,
};

use crate::errors::{Error, Result};
use crate::memory::Span;

/// The environment variable that, set to `host` when a store is created, makes its "GPUs"
/// stand-ins over host memory.
pub const TEST_DEVICE_ENV: &str = "YUTU_TEST_DEVICE";

/// The GPUs one store has opened, by CUDA ordinal.
pub struct Devices {
    /// `YUTU_TEST_DEVICE=host`: every ordinal is a stand-in over host memory.
    stand_in: bool,
    open: Mutex<HashMap<u32, Arc<dyn Device>>>,
}

impl Devices {
    /// Devices as the environment says: real GPUs, or with `YUTU_TEST_DEVICE=host` the
    /// stand-in (any other value is refused, so that a typo does not go unnoticed).
    pub fn from_env() -> Result<Devices> {
        let stand_in = match std::env::var(TEST_DEVICE_ENV) {
            Ok(v) if v == "host" => true,
            Ok(v) if !v.is_empty() => {
                return Err(Error::invalid(format!(
                    "{TEST_DEVICE_ENV}={v:?}: the only value it takes is \"host\" (host \
                     memory poses as GPU memory, for tests)"
                )))
            }
            _ => false,
        };
        Ok(Devices {
            stand_in,
            open: Mutex::new(HashMap::new()),
        })
    }

    /// The GPU whose memory `addr` is, asked of the CUDA driver; `None` for host memory, on
    /// hosts without a driver, and for the stand-in (whose "GPU memory" is host memory).
    pub fn detect(&self, addr: usize) -> Option<u32> {
        if self.stand_in || addr == 0 {
            return None;
        }
        yutu_transfer::device::cuda_device_of(addr as u64)
    }

    /// How errors name GPU `ordinal`.
    pub fn name(&self, ordinal: u32) -> String {
        if self.stand_in {
            format!("host:{ordinal} (YUTU_TEST_DEVICE=host)")
        } else {
            format!("cuda:{ordinal}")
        }
    }

    /// GPU `ordinal`, opened on first use. A failed open is not remembered: the next call
    /// tries again.
    pub fn get(&self, ordinal: u32) -> Result<Arc<dyn Device>> {
        // Held while opening, so that threads racing for one device open it once.
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(d) = open.get(&ordinal) {
            return Ok(d.clone());
        }
        let device: Arc<dyn Device> = if self.stand_in {
            HostDevice::over_host_memory(ordinal)
        } else {
            yutu_transfer::device::open_cuda(ordinal).map_err(|source| Error::Device {
                name: self.name(ordinal),
                source,
            })?
        };
        open.insert(ordinal, device.clone());
        Ok(device)
    }

    /// Checks with GPU `ordinal` that `len` bytes at `addr` are its memory, inside one
    /// allocation (what `register_buffer(..., device=...)` vouches for).
    pub fn check(&self, ordinal: u32, addr: usize, len: u64) -> Result<()> {
        let device = self.get(ordinal)?;
        let memory = DeviceMemory {
            ordinal,
            ptr: addr as u64,
            len,
        };
        device.check(&memory).map_err(|source| Error::Device {
            name: self.name(ordinal),
            source,
        })
    }
}

/// The parts of a session a batch needs.
pub struct Ctx<'a> {
    pub kv: &'a KvClient,
    pub bucket: &'a str,
    pub staging: &'a Staging,
    pub devices: &'a Devices,
}

/// The spans of a batch by where they are: host (`None`) or a GPU, each with the batch
/// indices of its spans, in the order each place first appears.
fn groups(spans: &[Span]) -> Vec<(Option<u32>, Vec<usize>)> {
    let mut out: Vec<(Option<u32>, Vec<usize>)> = Vec::new();
    for (i, s) in spans.iter().enumerate() {
        // Nothing to copy: no memory to be on.
        let place = if s.len == 0 { None } else { s.device };
        match out.iter_mut().find(|(p, _)| *p == place) {
            Some((_, idx)) => idx.push(i),
            None => out.push((place, vec![i])),
        }
    }
    out
}

fn check_lens(keys: &[String], n: usize) -> Result<()> {
    if keys.len() != n {
        return Err(Error::invalid(format!(
            "{} keys but {n} buffers",
            keys.len()
        )));
    }
    Ok(())
}

/// Fetches `keys[i]` into `dests[i]` (whose `len` is the room for the block); each block's
/// length, `None` where the key is absent.
pub fn get_into(ctx: &Ctx<'_>, keys: &[String], dests: &[Span]) -> Result<Vec<Option<u64>>> {
    check_lens(keys, dests.len())?;
    if dests.iter().all(|d| d.device.is_none()) {
        return Ok(ctx.staging.get_into(ctx.kv, ctx.bucket, keys, dests)?);
    }
    if let Some(i) = dests.iter().position(|d| d.len == 0) {
        return Err(Error::invalid(format!("key {i} has a size of 0 bytes")));
    }
    let mut out = vec![None; keys.len()];
    run_groups(keys, dests, |place, idx, ks, ss| {
        let got = match place {
            None => ctx
                .staging
                .get_into(ctx.kv, ctx.bucket, ks, ss)
                .map_err(|e| Failure::new(e, 0))?,
            Some(ordinal) => {
                let device = ctx.devices.get(ordinal)?;
                // As on the host path, a get stages at most MAX_STAGED_BLOCK per block.
                let blocks: Vec<DeviceBlock> = ss
                    .iter()
                    .map(|s| DeviceBlock {
                        addr: s.addr as u64,
                        len: s.len.min(MAX_STAGED_BLOCK),
                    })
                    .collect();
                let mut got = Vec::with_capacity(ks.len());
                for (part, (ks, bs)) in ks
                    .chunks(MAX_BATCH)
                    .zip(blocks.chunks(MAX_BATCH))
                    .enumerate()
                {
                    // SAFETY: each span is memory of GPU `ordinal` that the caller may write
                    // for its length while the call runs: a tensor or array the Python half
                    // holds for the call, or a range the caller registered for this device
                    // (and so vouched for). The client checks each block with the device.
                    let r = unsafe {
                        ctx.kv
                            .batch_get_into_device(ctx.bucket, ks, &device, bs, None)
                    };
                    got.extend(r.map_err(|e| Failure::new(e, part * MAX_BATCH))?);
                }
                got
            }
        };
        for (&i, n) in idx.iter().zip(got) {
            out[i] = n;
        }
        Ok(())
    })?;
    Ok(out)
}

/// Stores `keys[i]` from `srcs[i]` with the put's `options`.
pub fn put_from(ctx: &Ctx<'_>, keys: &[String], srcs: &[Span], options: &PutOptions) -> Result<()> {
    check_lens(keys, srcs.len())?;
    if srcs.iter().all(|s| s.device.is_none()) {
        return Ok(ctx
            .staging
            .put_from(ctx.kv, ctx.bucket, keys, srcs, options)?);
    }
    if let Some(i) = srcs.iter().position(|s| s.len > MAX_STAGED_BLOCK) {
        return Err(Error::invalid(format!(
            "block {i} is {} bytes; a block is at most {MAX_STAGED_BLOCK}",
            srcs[i].len
        )));
    }
    run_groups(keys, srcs, |place, _idx, ks, ss| {
        match place {
            None => ctx
                .staging
                .put_from(ctx.kv, ctx.bucket, ks, ss, options)
                .map_err(|e| Failure::new(e, 0))?,
            Some(ordinal) => {
                let device = ctx.devices.get(ordinal)?;
                let blocks: Vec<DeviceBlock> = ss
                    .iter()
                    .map(|s| DeviceBlock {
                        addr: s.addr as u64,
                        len: s.len,
                    })
                    .collect();
                for (part, (ks, bs)) in ks
                    .chunks(MAX_BATCH)
                    .zip(blocks.chunks(MAX_BATCH))
                    .enumerate()
                {
                    // SAFETY: as in `get_into`, for memory the caller lets the call read.
                    let r = unsafe {
                        ctx.kv
                            .batch_put_from_device(ctx.bucket, ks, &device, bs, options, None)
                    };
                    r.map_err(|e| Failure::new(e, part * MAX_BATCH))?;
                }
            }
        }
        Ok(())
    })
}

/// A group's failure: the error, and where the failing call's blocks start in the group (its
/// block numbers count from there).
struct Failure {
    error: Error,
    offset: usize,
}

impl Failure {
    fn new(e: KvError, offset: usize) -> Failure {
        Failure {
            error: e.into(),
            offset,
        }
    }
}

impl From<Error> for Failure {
    fn from(error: Error) -> Failure {
        Failure { error, offset: 0 }
    }
}

/// Runs `call(place, indices, keys, spans)` for each group of the batch, in order, and stops
/// at the first failure. A failure in part (some blocks of a device call failed) becomes
/// [`Error::Blocks`] in the caller's numbering, with every block of the groups not run
/// listed as failed too; any other error is the answer as it is, its block or key number
/// (if it names one) turned into the caller's.
fn run_groups(
    keys: &[String],
    spans: &[Span],
    mut call: impl FnMut(Option<u32>, &[usize], &[String], &[Span]) -> std::result::Result<(), Failure>,
) -> Result<()> {
    let groups = groups(spans);
    for (g, (place, idx)) in groups.iter().enumerate() {
        let ks: Vec<String> = idx.iter().map(|&i| keys[i].clone()).collect();
        let ss: Vec<Span> = idx.iter().map(|&i| spans[i]).collect();
        let Err(Failure { error, offset }) = call(*place, idx, &ks, &ss) else {
            continue;
        };
        let map = |n: usize| idx.get(offset + n).copied();
        return Err(match error {
            Error::Kv(KvError::Blocks(f)) => {
                let mut failed: Vec<(usize, String)> = f
                    .failed
                    .iter()
                    .filter_map(|(n, e)| Some((map(*n)?, e.to_string())))
                    .collect();
                // Blocks of this group past the failed call, and the groups after it.
                let end = offset + f.total;
                let rest = idx[end.min(idx.len())..]
                    .iter()
                    .chain(groups[g + 1..].iter().flat_map(|(_, i)| i));
                failed.extend(rest.map(|&i| {
                    (
                        i,
                        "not attempted: an earlier part of the batch failed".to_string(),
                    )
                }));
                failed.sort_by_key(|(i, _)| *i);
                Error::Blocks {
                    failed,
                    total: keys.len(),
                }
            }
            Error::Kv(KvError::InvalidArgument(m)) => {
                Error::Kv(KvError::InvalidArgument(renumber(&m, map)))
            }
            Error::InvalidArgument(m) => Error::InvalidArgument(renumber(&m, map)),
            e => e,
        });
    }
    Ok(())
}

/// A message that starts "block N" or "key N" (the client's and the staging's numbering
/// within one call) with N turned into the caller's number; unchanged otherwise.
fn renumber(msg: &str, map: impl Fn(usize) -> Option<usize>) -> String {
    for word in ["block ", "key "] {
        let Some(rest) = msg.strip_prefix(word) else {
            continue;
        };
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let mapped = rest[..digits].parse().ok().and_then(&map);
        if let Some(n) = mapped {
            return format!("{word}{n}{}", &rest[digits..]);
        }
    }
    msg.to_string()
}

/// A batch's spans with every GPU span replaced by host memory of the same length (a bounce
/// buffer): scatter/gather over GPU memory goes through the host staging path, one extra copy
/// per GPU span (the driver's synchronous copy).
struct Bounced {
    /// The host spans of each key, in the caller's order.
    parts: Vec<Vec<Span>>,
    /// Per key and span: the bounce buffer standing for it, when it is GPU memory.
    bounces: Vec<Vec<Option<Vec<u8>>>>,
}

impl Bounced {
    fn new(parts: &[Vec<Span>]) -> Result<Bounced> {
        let mut out = Vec::with_capacity(parts.len());
        let mut bounces = Vec::with_capacity(parts.len());
        for (k, spans) in parts.iter().enumerate() {
            let mut host = Vec::with_capacity(spans.len());
            let mut mine = Vec::with_capacity(spans.len());
            for s in spans {
                if s.device.is_none() || s.len == 0 {
                    host.push(Span { device: None, ..*s });
                    mine.push(None);
                    continue;
                }
                let len = usize::try_from(s.len)
                    .ok()
                    .filter(|&l| l as u64 <= MAX_STAGED_BLOCK)
                    .ok_or_else(|| {
                        Error::invalid(format!(
                            "key {k}: a GPU span of {} bytes; at most {MAX_STAGED_BLOCK}",
                            s.len
                        ))
                    })?;
                let bytes = vec![0u8; len];
                host.push(Span {
                    addr: bytes.as_ptr() as usize,
                    len: s.len,
                    device: None,
                });
                mine.push(Some(bytes));
            }
            out.push(host);
            bounces.push(mine);
        }
        Ok(Bounced {
            parts: out,
            bounces,
        })
    }

    fn slices(&self) -> Vec<&[Span]> {
        self.parts.iter().map(Vec::as_slice).collect()
    }
}

/// Runs `f` on GPU span `s` with its device, naming the device in a failure.
fn on_gpu(
    ctx: &Ctx<'_>,
    s: &Span,
    f: impl FnOnce(
        &dyn Device,
        &DeviceMemory,
    ) -> std::result::Result<(), yutu_transfer::device::DeviceError>,
) -> Result<()> {
    let ordinal = s.device.unwrap_or(0);
    let device = ctx.devices.get(ordinal)?;
    let memory = DeviceMemory {
        ordinal,
        ptr: s.addr as u64,
        len: s.len,
    };
    f(device.as_ref(), &memory).map_err(|source| Error::Device {
        name: ctx.devices.name(ordinal),
        source,
    })
}

/// Fetches each `keys[i]` into the spans `parts[i]` in order (scatter); each block's length,
/// `None` where the key is absent. One node call per staging chunk, whatever the number of
/// spans; GPU spans are filled from host bounce buffers after the node's call.
pub fn get_into_parts(
    ctx: &Ctx<'_>,
    keys: &[String],
    parts: &[Vec<Span>],
) -> Result<Vec<Option<u64>>> {
    check_lens(keys, parts.len())?;
    let bounced = Bounced::new(parts)?;
    let got = ctx
        .staging
        .get_into_parts(ctx.kv, ctx.bucket, keys, &bounced.slices())?;
    for (k, n) in got.iter().enumerate() {
        let mut left = n.unwrap_or(0);
        for (s, bounce) in parts[k].iter().zip(&bounced.bounces[k]) {
            let take = s.len.min(left);
            left -= take;
            if let (Some(bytes), true) = (bounce, take > 0) {
                on_gpu(ctx, s, |d, m| d.upload(m, 0, &bytes[..take as usize]))?;
            }
        }
    }
    Ok(got)
}

/// Stores each `keys[i]` as the concatenation of the spans `parts[i]` (gather), with the
/// put's `options`. GPU spans are copied to host bounce buffers first.
pub fn put_from_parts(
    ctx: &Ctx<'_>,
    keys: &[String],
    parts: &[Vec<Span>],
    options: &PutOptions,
) -> Result<()> {
    check_lens(keys, parts.len())?;
    let mut bounced = Bounced::new(parts)?;
    for (k, spans) in parts.iter().enumerate() {
        for (s, bounce) in spans.iter().zip(bounced.bounces[k].iter_mut()) {
            if let Some(bytes) = bounce {
                on_gpu(ctx, s, |d, m| d.download(m, 0, bytes))?;
            }
        }
    }
    Ok(ctx
        .staging
        .put_from_parts(ctx.kv, ctx.bucket, keys, &bounced.slices(), options)?)
}
