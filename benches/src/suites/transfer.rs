//! The `transfer` suite: one-sided reads of 2 MiB blocks through the transfer engine, against
//! what the same machine does without it, measured in the same run.
//!
//! - `read_2MiB_shm`: an engine reads blocks of another engine's registered segment over shm
//!   (memfd passed over a Unix socket once, then `memcpy` between the mappings). Reference: one
//!   thread `memcpy`ing the same blocks between two memfd mappings of the same sizes.
//! - `read_2MiB_tcp`: the same reads over the tcp transport (engines that look remote to each
//!   other). Reference: one raw loopback TCP stream carrying the same blocks from a mapping
//!   into a mapping with 2 MiB writes and reads, no protocol at all.
//!
//! The source (`--blocks` x 2 MiB, 128 MiB by default) is larger than any last-level cache;
//! each step reads `--batch` consecutive blocks into a destination of that size, cycling, so
//! neither side is measured from cache. Both engines run in this process, which is how shm is
//! used (two processes on one host) minus a process boundary that costs nothing on the data
//! path. Before measuring, one batch is read and compared byte for byte, so an engine that
//! returns the wrong bytes fails the run instead of winning it.
//!
//! Shared machines drift by tens of percent within seconds, so the two sides of a ratio are not
//! run one after the other: the measured time is cut into `--rounds` rounds, and in each round
//! both sides run for the same time, in alternating order. Each side's value is its bytes over
//! its time, summed over the rounds.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _};
use clap::Args;
use yutu_transfer::{
    EngineConfig, HugePages, LocalSegment, MemoryRegion, NodeId, RdmaMode, SegmentDescriptor,
    TransferEngine, TransferRequest, TransportKind,
};

use crate::report::{BenchResult, Machine, Reference, Report};

const BLOCK: usize = 2 << 20;
/// The ratio both cases should reach (docs/benchmarks.md, "Measuring").
const TARGET: f64 = 0.8;

/// Options of `yutu-bench transfer`.
#[derive(Debug, Clone, Args)]
pub struct TransferArgs {
    /// Seconds measured per side of each case (after one unmeasured pass over every block).
    #[arg(long, default_value_t = 4)]
    pub duration_secs: u64,
    /// Rounds the measured time is cut into; the two sides alternate within each.
    #[arg(long, default_value_t = 8)]
    pub rounds: u32,
    /// 2 MiB blocks in the source segment.
    #[arg(long, default_value_t = 64)]
    pub blocks: usize,
    /// Blocks read per batch (the destination holds one batch).
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    /// Transfer workers per engine (also the connections one peer gets over tcp).
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    /// Slice size of the engines in KiB (`EngineConfig::slice_size`); the engine's default
    /// when not given.
    #[arg(long)]
    pub slice_kib: Option<u64>,
}

pub async fn run(args: &TransferArgs) -> anyhow::Result<Report> {
    tokio::task::block_in_place(|| run_blocking(args))
}

fn run_blocking(args: &TransferArgs) -> anyhow::Result<Report> {
    if args.blocks == 0
        || args.batch == 0
        || args.duration_secs == 0
        || args.workers == 0
        || args.rounds == 0
    {
        bail!("--blocks, --batch, --duration-secs, --rounds and --workers must be at least 1");
    }
    if args.batch > args.blocks {
        bail!("--batch cannot exceed --blocks");
    }
    let dir = crate::tempdir::TempDir::new_in(&std::env::temp_dir(), "yutu-bench-transfer-")?;
    let mut results = Vec::new();

    eprintln!("shm reads against memcpy...");
    {
        let engines = Engines::start(args, dir.path(), TransportKind::Shm)?;
        let memcpy = Memcpy::new(args.blocks, args.batch)?;
        let (yutu, reference) = interleave(
            args,
            |step| engines.read_batch(step),
            |step| {
                memcpy.copy_batch(step);
                Ok(())
            },
        )?;
        results.push(result(
            "read_2MiB_shm",
            yutu,
            engines.errors(),
            "memcpy_2MiB",
            reference,
        ));
    }

    eprintln!("tcp reads against a raw loopback stream...");
    {
        let engines = Engines::start(args, dir.path(), TransportKind::Tcp)?;
        let mut stream = Stream::start(args.blocks, args.batch)?;
        let (yutu, reference) = interleave(
            args,
            |step| engines.read_batch(step),
            |_| stream.receive_batch(),
        )?;
        stream.stop()?;
        results.push(result(
            "read_2MiB_tcp",
            yutu,
            engines.errors(),
            "tcp_stream_2MiB",
            reference,
        ));
    }

    Ok(Report {
        suite: "transfer".to_owned(),
        notes: Default::default(),
        skipped: None,
        machine: Machine::detect(),
        results,
    })
}

fn result(name: &str, yutu: f64, errors: u64, reference: &str, base: f64) -> BenchResult {
    BenchResult {
        name: name.to_owned(),
        value: Some(yutu),
        unit: "GB/s".to_owned(),
        p50_us: None,
        p99_us: None,
        mb_per_s: Some(yutu * 1000.0),
        errors: Some(errors),
        reference: Some(Reference {
            name: reference.to_owned(),
            value: base,
            p50_us: None,
            p99_us: None,
            mb_per_s: Some(base * 1000.0),
            errors: Some(0),
        }),
        ratio: None,
        target: Some(TARGET),
    }
    .with_ratio()
}

/// Runs both sides for `--duration-secs` each, in alternating rounds; GB/s of each. A step
/// moves one batch (`--batch` blocks).
fn interleave(
    args: &TransferArgs,
    yutu: impl FnMut(usize) -> anyhow::Result<()>,
    reference: impl FnMut(usize) -> anyhow::Result<()>,
) -> anyhow::Result<(f64, f64)> {
    let batches = args.blocks / args.batch;
    let duration = Duration::from_secs(args.duration_secs);
    let (a, b) = alternate(batches, duration, args.rounds, yutu, reference)?;
    let rate = |(steps, time): Side| (steps * args.batch * BLOCK) as f64 / time.as_secs_f64() / 1e9;
    Ok((rate(a), rate(b)))
}

/// Steps taken by one side, and the time they took.
pub(crate) type Side = (usize, Duration);

/// Runs two sides for `duration` each, split over `rounds` rounds in alternating order (so
/// drift on a shared machine hits both alike), after one unmeasured pass over `warmup` steps
/// of each (page faults, connections, mappings). A side is called with its step number.
pub(crate) fn alternate(
    warmup: usize,
    duration: Duration,
    rounds: u32,
    mut yutu: impl FnMut(usize) -> anyhow::Result<()>,
    mut reference: impl FnMut(usize) -> anyhow::Result<()>,
) -> anyhow::Result<(Side, Side)> {
    for step in 0..warmup {
        yutu(step)?;
        reference(step)?;
    }
    let per_round = duration / rounds.max(1);
    let mut totals = [(0usize, Duration::ZERO); 2];
    for round in 0..rounds.max(1) {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for side in order {
            let (steps, time) = &mut totals[side];
            let start = Instant::now();
            while start.elapsed() < per_round {
                if side == 0 {
                    yutu(*steps)?;
                } else {
                    reference(*steps)?;
                }
                *steps += 1;
            }
            *time += start.elapsed();
        }
    }
    Ok((totals[0], totals[1]))
}

/// A region of `blocks` blocks, every page touched, each block tagged with its number.
pub(crate) fn region(name: &str, blocks: usize) -> anyhow::Result<MemoryRegion> {
    let region = MemoryRegion::allocate(name, blocks * BLOCK, HugePages::Auto)
        .with_context(|| format!("allocating {name}"))?;
    let fill: Vec<u8> = (0..BLOCK).map(|i| (i % 251) as u8).collect();
    for b in 0..blocks {
        region.write_at((b * BLOCK) as u64, &fill)?;
        region.write_at((b * BLOCK) as u64, &(b as u64).to_le_bytes())?;
    }
    Ok(region)
}

/// Two engines in this process, the client reading the server's blocks over one path.
struct Engines {
    _server: TransferEngine,
    client: TransferEngine,
    kind: TransportKind,
    src: LocalSegment,
    dst: LocalSegment,
    descs: Vec<SegmentDescriptor>,
    batch: usize,
    errors: std::cell::Cell<u64>,
}

impl Engines {
    fn start(
        args: &TransferArgs,
        dir: &std::path::Path,
        kind: TransportKind,
    ) -> anyhow::Result<Engines> {
        let start = |node: u64, host: &str| {
            let mut config = EngineConfig::new(NodeId(node));
            config.shm_dir = Some(dir.to_path_buf());
            config.workers = args.workers;
            config.rdma = RdmaMode::Off;
            if let Some(kib) = args.slice_kib {
                config.slice_size = kib << 10;
            }
            // Different host ids make the engines remote to each other: tcp is the only path.
            if kind == TransportKind::Tcp {
                config.host = Some(host.to_owned());
            }
            TransferEngine::start(config).context("starting a transfer engine")
        };
        let server = start(1, "bench-server")?;
        let client = start(2, "bench-client")?;
        client.add_peer(server.address());
        let src = server.register(region("engine-src", args.blocks)?)?;
        let dst = client.register(region("engine-dst", args.batch)?)?;
        let descs = (0..args.blocks)
            .map(|b| src.descriptor((b * BLOCK) as u64, BLOCK as u64))
            .collect::<Result<_, _>>()?;
        let engines = Engines {
            _server: server,
            client,
            kind,
            src,
            dst,
            descs,
            batch: args.batch,
            errors: std::cell::Cell::new(0),
        };
        engines.read_batch(0)?;
        ensure!(engines.errors() == 0, "the first batch failed over {kind}");
        engines.verify(0)?;
        Ok(engines)
    }

    /// Reads batch `step` (cycling over the source) into the destination.
    fn read_batch(&self, step: usize) -> anyhow::Result<()> {
        let first = (step % (self.descs.len() / self.batch)) * self.batch;
        let reqs = (0..self.batch)
            .map(|i| TransferRequest::read(&self.dst, (i * BLOCK) as u64, &self.descs[first + i]));
        let result = self.client.submit_via(reqs, &[self.kind])?.wait();
        for outcome in &result.outcomes {
            match outcome {
                Ok(c) if c.transport == self.kind => {}
                Ok(c) => bail!("a read went over {} instead of {}", c.transport, self.kind),
                Err(_) => self.errors.set(self.errors.get() + 1),
            }
        }
        Ok(())
    }

    /// Compares the destination with the source blocks of batch `step`.
    fn verify(&self, step: usize) -> anyhow::Result<()> {
        let first = (step % (self.descs.len() / self.batch)) * self.batch;
        let mut a = vec![0u8; BLOCK];
        let mut b = vec![0u8; BLOCK];
        for i in 0..self.batch {
            self.src
                .region()
                .read_at(((first + i) * BLOCK) as u64, &mut a)?;
            self.dst.region().read_at((i * BLOCK) as u64, &mut b)?;
            ensure!(
                a == b,
                "block {} arrived with the wrong bytes over {}",
                first + i,
                self.kind
            );
        }
        Ok(())
    }

    fn errors(&self) -> u64 {
        self.errors.get()
    }
}

/// The shm reference: one thread copying the same blocks between two mappings.
pub(crate) struct Memcpy {
    src: MemoryRegion,
    dst: MemoryRegion,
    blocks: usize,
    batch: usize,
}

impl Memcpy {
    pub(crate) fn new(blocks: usize, batch: usize) -> anyhow::Result<Memcpy> {
        Ok(Memcpy {
            src: region("memcpy-src", blocks)?,
            dst: region("memcpy-dst", batch)?,
            blocks,
            batch,
        })
    }

    pub(crate) fn copy_batch(&self, step: usize) {
        let first = (step % (self.blocks / self.batch)) * self.batch;
        for i in 0..self.batch {
            // SAFETY: both ranges lie inside live mappings of this process that nothing else
            // touches during the benchmark, and they belong to different mappings.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.src.as_ptr().add((first + i) * BLOCK),
                    self.dst.as_ptr().add(i * BLOCK),
                    BLOCK,
                );
            }
        }
    }

    /// The other direction, a put's shape: the batch's blocks copied from one buffer into the
    /// blocks of this step, which rotate over all of them (so the destination is not cached).
    pub(crate) fn fill_batch(&self, step: usize) {
        let first = (step % (self.blocks / self.batch)) * self.batch;
        for i in 0..self.batch {
            // SAFETY: as in `copy_batch`, with the roles of the mappings swapped.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.dst.as_ptr().add(i * BLOCK),
                    self.src.as_ptr().add((first + i) * BLOCK),
                    BLOCK,
                );
            }
        }
    }
}

/// The tcp reference: a sender thread streaming blocks from a mapping over one loopback
/// connection, received with 2 MiB reads into a mapping.
pub(crate) struct Stream {
    sock: Option<TcpStream>,
    dst: MemoryRegion,
    batch: usize,
    sender: Option<JoinHandle<std::io::Result<()>>>,
}

impl Stream {
    pub(crate) fn start(blocks: usize, batch: usize) -> anyhow::Result<Stream> {
        let src = region("stream-src", blocks)?;
        let dst = region("stream-dst", batch)?;
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;

        let sender = std::thread::spawn(move || -> std::io::Result<()> {
            let (mut sock, _) = listener.accept()?;
            sock.set_nodelay(true)?;
            let mut b = 0usize;
            loop {
                // SAFETY: a block inside the live source mapping (moved into this thread),
                // read by this thread only.
                let block =
                    unsafe { std::slice::from_raw_parts(src.as_ptr().add(b * BLOCK), BLOCK) };
                if sock.write_all(block).is_err() {
                    // The receiver hung up: the benchmark is over.
                    return Ok(());
                }
                b = (b + 1) % blocks;
            }
        });
        let sock = TcpStream::connect(addr)?;
        sock.set_nodelay(true)?;
        Ok(Stream {
            sock: Some(sock),
            dst,
            batch,
            sender: Some(sender),
        })
    }

    pub(crate) fn receive_batch(&mut self) -> anyhow::Result<()> {
        let sock = self.sock.as_mut().context("the stream is stopped")?;
        for i in 0..self.batch {
            // SAFETY: a block inside the live destination mapping, written by this thread only.
            let block =
                unsafe { std::slice::from_raw_parts_mut(self.dst.as_ptr().add(i * BLOCK), BLOCK) };
            sock.read_exact(block)?;
        }
        Ok(())
    }

    pub(crate) fn stop(&mut self) -> anyhow::Result<()> {
        drop(self.sock.take());
        if let Some(sender) = self.sender.take() {
            sender
                .join()
                .map_err(|_| anyhow::anyhow!("the stream sender panicked"))??;
        }
        Ok(())
    }
}
