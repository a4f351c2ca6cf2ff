//! The `gpu` suite (issue #16): KV blocks fetched from a real `yutu-server` into GPU memory
//! through the client library, against a plain pinned host-to-device copy of the same bytes,
//! measured in the same run.
//!
//! - `get_into_gpu_2MiB`, `get_into_gpu_16MiB`: `KvClient::batch_get_into` of `--total-mib`
//!   of blocks into device memory (`Device::alloc`), `--batch-mib` of blocks per call. The
//!   node copies each chunk into a pinned staging buffer over shm and the device copies it on
//!   (`yutu_client::kv`'s double-buffered staging, halves of `STAGING_HALF`); GB/s with the
//!   HTTP calls counted. Reference (`cuMemcpyHtoD_pinned_*`): the same bytes, already in a
//!   pinned host buffer (`Device::alloc_pinned`), copied to the same device addresses by one
//!   stream, one `copy_to_device` (`cuMemcpyHtoDAsync`) per block and one `synchronize` per
//!   `--batch-mib`: a plain pinned `cuMemcpyHtoD` of the same blocks. Target ratio 0.8.
//!
//! Each block size gets one unmeasured pass of each side, then `--reps` measured passes of
//! both in alternating order; a side's value is the median of its passes. Before measuring,
//! and once more after (with the checked blocks zeroed on the device first, so that only
//! Yutu's copy can have put the bytes back), the first, middle and last block are downloaded
//! and compared byte for byte; so is the reference's first pass.
//!
//! `--device host` runs the same code against `HostDevice`, a stand-in whose "device memory"
//! is host memory copied by a thread per stream: a smoke run for machines without a GPU.
//! Its rows are named `*_host_standin` and carry no target; they are not GPU numbers. With
//! `--device cuda` on a host without a CUDA driver (or device) the suite measures nothing:
//! it says `skipped: ...` and reports both rows with `value`, `reference` and `ratio` null.

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, ensure, Context as _};
use clap::{Args, ValueEnum};
use yutu_client::kv::{DeviceBuffer, KvClient, KvOptions, MAX_BATCH};
use yutu_transfer::device::{Device, DeviceError, DeviceMemory, HostDevice};

use super::kv::{pattern, Http, Server};
use crate::report::{BenchResult, Machine, Reference, Report};

const MIB: u64 = 1 << 20;
/// The block sizes measured: a typical KV page group and the staging half itself.
const SIZES: [u64; 2] = [2 * MIB, 16 * MIB];
/// The ratio both sizes should reach (issue #16).
const TARGET: f64 = 0.8;
const BUCKET: &str = "gpubench";

/// Which device the suite copies into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DeviceKind {
    /// A GPU through the CUDA driver (needs a build with `--features cuda`).
    Cuda,
    /// `HostDevice`, a stand-in whose memory is host memory: exercises the suite without a
    /// GPU; its numbers are not GPU numbers.
    Host,
}

/// Options of `yutu-bench gpu`.
#[derive(Debug, Clone, Args)]
pub struct GpuArgs {
    /// The device: `cuda` (skipped, exit 0, on a host without a CUDA driver) or `host` (the
    /// stand-in).
    #[arg(long, value_enum, default_value_t = DeviceKind::Cuda)]
    pub device: DeviceKind,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub ordinal: u32,
    /// MiB of blocks stored and fetched per block size (the device allocation and the
    /// reference's pinned buffer are this large too).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(16..=16384))]
    pub total_mib: u64,
    /// MiB of blocks per `batch_get_into` call (and per `synchronize` of the reference); at
    /// least one block.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=16384))]
    pub batch_mib: u64,
    /// Measured passes of each side per block size (the median is reported).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub reps: u32,
    /// DRAM given to yutu-server (`--memory`) [default: 4 x --total-mib + 512 MiB, which
    /// costs nothing untouched and leaves room for blocks hashing unevenly onto shards].
    #[arg(long)]
    pub yutu_memory: Option<String>,
}

pub async fn run(args: &GpuArgs) -> anyhow::Result<Report> {
    tokio::task::block_in_place(|| run_blocking(args))
}

fn run_blocking(args: &GpuArgs) -> anyhow::Result<Report> {
    let (device, description) = match open(args)? {
        Opened::Ready {
            device,
            description,
        } => (device, description),
        Opened::Skipped(reason) => {
            eprintln!("skipped: {reason}");
            let mut r = report(args.device, SIZES.iter().map(|&b| (b, None)).collect());
            r.skipped = Some(reason);
            return Ok(r);
        }
    };
    let bin = crate::yutu::locate_binary()?;
    eprintln!("under test: {}", bin.display());
    let memory = args
        .yutu_memory
        .clone()
        .unwrap_or_else(|| format!("{}MiB", 4 * args.total_mib + 512));
    let mut server = Server::start_with(&bin, None, &["--memory", &memory])?;
    let mut http = Http::connect(server.addr)?;
    let (status, body) = http.send_as(None, "PUT", &format!("/{BUCKET}"), b"")?;
    ensure!(
        status == 200,
        "creating bucket {BUCKET}: {status} {}",
        String::from_utf8_lossy(&body)
    );
    let kv = KvClient::new(&format!("http://{}", server.addr), KvOptions::default())
        .context("connecting the KV client")?;
    let path = kv.device_path();
    eprintln!("device: {description}");
    eprintln!("device path: {path}");

    let mut measured = Vec::new();
    for &block in &SIZES {
        let m = measure(&kv, &device, args, block)
            .with_context(|| format!("the {} MiB case", block / MIB))?;
        server.check_running()?;
        measured.push((block, Some(m)));
    }
    let mut r = report(args.device, measured);
    r.notes.insert("device".to_owned(), description);
    r.notes.insert("device_path".to_owned(), path);
    Ok(r)
}

/// What opening the chosen device gave.
enum Opened {
    Ready {
        device: Arc<dyn Device>,
        /// `cuda:0 (NVIDIA H100 80GB HBM3)`, or the stand-in's name and what it is.
        description: String,
    },
    /// Nothing to measure on this host, and why.
    Skipped(String),
}

fn open(args: &GpuArgs) -> anyhow::Result<Opened> {
    if args.device == DeviceKind::Host {
        return Ok(Opened::Ready {
            device: HostDevice::new(0),
            description: "host:0 (HostDevice stand-in: its \"device memory\" is host memory; \
                          not GPU numbers)"
                .to_owned(),
        });
    }
    match open_cuda(args.ordinal) {
        Ok((device, description)) => Ok(Opened::Ready {
            device,
            description,
        }),
        Err(DeviceError::NoDriver) => Ok(Opened::Skipped("no CUDA driver on this host".into())),
        Err(DeviceError::NotBuilt) if !libcuda_loadable() => Ok(Opened::Skipped(
            "no CUDA driver on this host (and this yutu-bench was built without the `cuda` \
             feature)"
                .into(),
        )),
        Err(DeviceError::NotBuilt) => bail!(
            "this host has a CUDA driver but this yutu-bench was built without the `cuda` \
             feature: cargo run --release -p yutu-bench --features cuda -- gpu"
        ),
        Err(DeviceError::NoDevice { count: 0, .. }) => Ok(Opened::Skipped(
            "no CUDA device on this host (the driver sees none)".into(),
        )),
        Err(DeviceError::Driver { call, code }) if code.contains("NO_DEVICE") => Ok(
            Opened::Skipped(format!("no CUDA device on this host ({call}: {code})")),
        ),
        Err(e) => Err(e).context("opening the CUDA device"),
    }
}

/// The CUDA device and its description (with the model name).
#[cfg(feature = "cuda")]
fn open_cuda(ordinal: u32) -> Result<(Arc<dyn Device>, String), DeviceError> {
    let device = yutu_transfer::device::CudaDevice::open(ordinal)?;
    let description = format!("{} ({})", device.name(), device.model());
    Ok((device, description))
}

/// Without the `cuda` feature: [`DeviceError::NotBuilt`], from the transfer crate.
#[cfg(not(feature = "cuda"))]
fn open_cuda(ordinal: u32) -> Result<(Arc<dyn Device>, String), DeviceError> {
    let device = yutu_transfer::device::open_cuda(ordinal)?;
    let description = device.name();
    Ok((device, description))
}

/// Whether the CUDA driver library can be loaded (asked only when this build cannot use it,
/// to tell "no GPU here" from "wrong build").
fn libcuda_loadable() -> bool {
    // SAFETY: dlopen of a constant, NUL-terminated name; the handle is closed at once and
    // nothing from the library is called.
    unsafe {
        let handle = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
        if handle.is_null() {
            return false;
        }
        libc::dlclose(handle);
    }
    true
}

/// Both sides of one block size: GB/s of each measured pass.
struct Measured {
    yutu: Vec<f64>,
    reference: Vec<f64>,
}

/// Device memory from [`Device::alloc`], freed when dropped.
struct DeviceAlloc {
    device: Arc<dyn Device>,
    memory: DeviceMemory,
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        // SAFETY: every copy into this memory was synchronized before its pass returned (the
        // client's calls return after their staging streams are, the reference synchronizes
        // its stream), and the `DeviceBuffer`s over it are dropped before this guard.
        if let Err(e) = unsafe { self.device.free(self.memory) } {
            eprintln!("freeing {} bytes of device memory: {e}", self.memory.len);
        }
    }
}

/// Seed of block `i` of size `block`: different for every key of every size.
fn seed(block: u64, i: usize) -> u64 {
    (block << 20) ^ i as u64
}

/// Stores `--total-mib` of `block`-byte blocks, measures both sides, removes the blocks.
fn measure(
    kv: &KvClient,
    device: &Arc<dyn Device>,
    args: &GpuArgs,
    block: u64,
) -> anyhow::Result<Measured> {
    let n = usize::try_from(args.total_mib * MIB / block)?;
    ensure!(n > 0, "--total-mib holds no {} MiB block", block / MIB);
    let per_call = usize::try_from((args.batch_mib * MIB / block).max(1))?.min(MAX_BATCH);
    let calls: Vec<Range<usize>> = (0..n)
        .step_by(per_call)
        .map(|s| s..(s + per_call).min(n))
        .collect();
    let bl = usize::try_from(block)?;
    let total = n as u64 * block;
    let keys: Vec<String> = (0..n).map(|i| format!("b{}m-{i}", block / MIB)).collect();
    let label = format!("{} MiB", block / MIB);

    // The same bytes in the node (put from a host buffer) and in the reference's pinned
    // buffer, at the same offsets the device copies go to.
    eprintln!("{label}: storing {n} blocks ({} MiB)...", total / MIB);
    let pinned = device
        .alloc_pinned(usize::try_from(total)?)
        .context("allocating the reference's pinned buffer")?;
    {
        let buf = kv.register((per_call as u64) * block)?;
        for r in &calls {
            let mut offsets = Vec::with_capacity(r.len());
            for (slot, i) in r.clone().enumerate() {
                let bytes = pattern(bl, seed(block, i));
                buf.write_at(slot as u64 * block, &bytes)?;
                pinned.region().write_at(i as u64 * block, &bytes)?;
                offsets.push(slot as u64 * block);
            }
            let lens = vec![block; r.len()];
            kv.batch_put_from(BUCKET, &keys[r.clone()], &buf, &offsets, &lens)
                .context("storing the blocks")?;
        }
    }

    let dev = DeviceAlloc {
        device: device.clone(),
        memory: device
            .alloc(total)
            .context("allocating device memory for the blocks")?,
    };
    // One registered device buffer per call, over that call's blocks exactly: the room
    // `batch_get_into` gives a key runs to the next offset or the buffer's end, so a buffer
    // longer than the call's blocks would make the last key's room (and the staging half
    // sized for it) the rest of the allocation.
    let mut targets: Vec<(Range<usize>, DeviceBuffer, Vec<u64>)> = Vec::new();
    for r in &calls {
        let memory = dev
            .memory
            .slice(r.start as u64 * block, r.len() as u64 * block)?;
        // SAFETY: the range is inside an allocation this function owns and frees only after
        // `targets` is dropped; nothing else touches it while a call runs.
        let buf = unsafe { kv.register_device(device.clone(), memory) }?;
        let offsets = (0..r.len() as u64).map(|j| j * block).collect();
        targets.push((r.clone(), buf, offsets));
    }
    let mut stream = device.stream()?;

    let yutu_pass = || -> anyhow::Result<()> {
        for (r, buf, offsets) in &targets {
            let got = kv
                .batch_get_into(BUCKET, &keys[r.clone()], buf, offsets)
                .context("batch_get_into the device")?;
            if let Some(j) = got.iter().position(|g| *g != Some(block)) {
                bail!(
                    "key {} came back as {:?}, not {block} bytes (evicted? raise --yutu-memory)",
                    keys[r.start + j],
                    got[j]
                );
            }
        }
        Ok(())
    };
    let host = pinned.region().as_ptr();
    let mut reference_pass = || -> anyhow::Result<()> {
        for (r, _, _) in &targets {
            for i in r.clone() {
                let dst = dev.memory.addr(i as u64 * block, block)?;
                // SAFETY: `host + i * block` is inside the pinned buffer (n blocks), which
                // nothing writes while the pass runs and which outlives the synchronize
                // below; `dst` is inside the device allocation (checked by `addr`).
                unsafe { stream.copy_to_device(i, dst, host.add(i * bl), bl) }?;
            }
            let failed = stream.synchronize();
            if let Some((tag, e)) = failed.first() {
                bail!(
                    "{} reference copies failed, the first of block {tag}: {e}",
                    failed.len()
                );
            }
        }
        Ok(())
    };
    let samples = {
        let mut s = vec![0, n / 2, n - 1];
        s.dedup();
        s
    };
    let verify = |who: &str| -> anyhow::Result<()> {
        let mut back = vec![0u8; bl];
        for &i in &samples {
            device.download(&dev.memory, i as u64 * block, &mut back)?;
            ensure!(
                back == pattern(bl, seed(block, i)),
                "{who}: block {i} of {label} came back with the wrong bytes"
            );
        }
        Ok(())
    };
    let zero = || -> anyhow::Result<()> {
        let zeros = vec![0u8; bl];
        for &i in &samples {
            device.upload(&dev.memory, i as u64 * block, &zeros)?;
        }
        Ok(())
    };
    let timed = |pass: &mut dyn FnMut() -> anyhow::Result<()>| -> anyhow::Result<f64> {
        let t = Instant::now();
        pass()?;
        Ok(total as f64 / t.elapsed().as_secs_f64() / 1e9)
    };

    eprintln!(
        "{label}: {} calls of {per_call} blocks; one unmeasured pass of each side, checked...",
        calls.len()
    );
    zero()?;
    yutu_pass()?;
    verify("batch_get_into")?;
    zero()?;
    reference_pass()?;
    verify("the reference")?;

    eprintln!("{label}: {} measured passes of each side...", args.reps);
    let mut yutu_pass = yutu_pass;
    let (mut yutu, mut reference) = (Vec::new(), Vec::new());
    for rep in 0..args.reps {
        // Alternating which side goes first cancels drift between the two.
        if rep % 2 == 0 {
            yutu.push(timed(&mut yutu_pass)?);
            reference.push(timed(&mut reference_pass)?);
        } else {
            reference.push(timed(&mut reference_pass)?);
            yutu.push(timed(&mut yutu_pass)?);
        }
    }
    zero()?;
    yutu_pass()?;
    verify("batch_get_into after the measured passes")?;
    eprintln!(
        "{label}: batch_get_into {} GB/s, reference {} GB/s (each pass: {:?} / {:?})",
        fmt_gbps(median(&yutu)),
        fmt_gbps(median(&reference)),
        yutu.iter().map(|x| fmt_gbps(*x)).collect::<Vec<_>>(),
        reference.iter().map(|x| fmt_gbps(*x)).collect::<Vec<_>>(),
    );

    drop(stream);
    drop(targets);
    drop(dev);
    for chunk in keys.chunks(MAX_BATCH) {
        kv.remove(BUCKET, chunk)
            .context("removing the blocks of this size")?;
    }
    Ok(Measured { yutu, reference })
}

fn fmt_gbps(x: f64) -> String {
    format!("{x:.2}")
}

/// The middle value (the mean of the two middle ones for an even count).
fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Row names: the stand-in's carry `_host_standin`, so that no script takes them for GPU
/// numbers.
fn names(kind: DeviceKind, block: u64) -> (String, String) {
    let size = format!("{}MiB", block / MIB);
    match kind {
        DeviceKind::Cuda => (
            format!("get_into_gpu_{size}"),
            format!("cuMemcpyHtoD_pinned_{size}"),
        ),
        DeviceKind::Host => (
            format!("get_into_gpu_{size}_host_standin"),
            format!("pinned_copy_{size}_host_standin"),
        ),
    }
}

/// One row per block size; `None` for a size not measured (the skipped suite).
fn report(kind: DeviceKind, measured: Vec<(u64, Option<Measured>)>) -> Report {
    let results = measured
        .into_iter()
        .map(|(block, m)| {
            let (name, reference_name) = names(kind, block);
            let (value, reference) = match m {
                Some(m) => {
                    let (y, r) = (median(&m.yutu), median(&m.reference));
                    (
                        Some(y),
                        Some(Reference {
                            name: reference_name,
                            value: r,
                            p50_us: None,
                            p99_us: None,
                            mb_per_s: Some(r * 1000.0),
                            errors: Some(0),
                        }),
                    )
                }
                None => (None, None),
            };
            BenchResult {
                name,
                value,
                unit: "GB/s".to_owned(),
                p50_us: None,
                p99_us: None,
                mb_per_s: value.map(|v| v * 1000.0),
                errors: value.map(|_| 0),
                reference,
                ratio: None,
                // The target is about a GPU; the stand-in's ratio measures host memcpys.
                target: (kind == DeviceKind::Cuda).then_some(TARGET),
            }
            .with_ratio()
        })
        .collect();
    Report {
        suite: "gpu".to_owned(),
        notes: Default::default(),
        skipped: None,
        machine: Machine::detect(),
        results,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }

    #[test]
    fn skipped_report_has_null_rows_with_the_target() {
        let r = report(DeviceKind::Cuda, SIZES.iter().map(|&b| (b, None)).collect());
        let v = serde_json::to_value(&r).expect("serializes");
        assert_eq!(v["suite"], "gpu");
        let rows = v["results"].as_array().expect("rows");
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0]["name"], "get_into_gpu_2MiB");
        assert_eq!(rows[1]["name"], "get_into_gpu_16MiB");
        for row in rows {
            assert!(row["value"].is_null() && row["ratio"].is_null());
            assert!(row["reference"].is_null());
            assert_eq!(row["target"], TARGET);
        }
    }

    #[test]
    fn stand_in_rows_say_so_and_carry_no_target() {
        let m = Measured {
            yutu: vec![1.0, 3.0, 2.0],
            reference: vec![4.0, 4.0, 4.0],
        };
        let r = report(DeviceKind::Host, vec![(2 * MIB, Some(m))]);
        let row = &r.results[0];
        assert_eq!(row.name, "get_into_gpu_2MiB_host_standin");
        assert_eq!(row.value, Some(2.0));
        assert_eq!(row.ratio, Some(0.5));
        assert_eq!(row.target, None);
    }

    #[test]
    fn seeds_differ_across_sizes_and_keys() {
        let mut all: Vec<u64> = SIZES
            .iter()
            .flat_map(|&b| (0..8192).map(move |i| seed(b, i)))
            .collect();
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n);
    }
}
