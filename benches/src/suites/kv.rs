//! The `kv` suite: the KV block API of a real `yutu-server`, driven through the client library
//! (`yutu_client::kv::KvClient`: one HTTP call per batch, the node moves the bytes) and through
//! the raw API with a client-side transfer engine (leases and one-sided reads), against what
//! the same machine does without Yutu, measured in the same run.
//!
//! - `get_into_2MiB_shm`: `batch_get_into` of a batch of 2 MiB keys into a registered buffer
//!   on the same host (the owning shards copy into the client's mapped buffer); GB/s with the
//!   HTTP call counted. Reference: one thread `memcpy`ing the same number of 2 MiB blocks
//!   between mappings.
//! - `put_from_2MiB_shm`: `batch_put_from` of the same batches of 2 MiB keys (overwriting
//!   them) out of the registered buffer; the owning shards copy out of the client's mapped
//!   buffer into their arenas. Reference: one thread `memcpy`ing the same number of 2 MiB
//!   blocks from one batch-sized mapping into blocks rotating over a `--big-keys` mapping, so
//!   neither side's destination is in the cache.
//! - `get_2MiB_tcp`: the raw form (`get`: leases and read-only descriptors, one-sided reads by
//!   the client's engine, `release`) over tcp. There is no shm case of the raw form: the
//!   client's engine is never handed an arena (every tenant's blocks are in it); the two
//!   cases above use arena views where the node gives them (`docs/kv-api.md`), so on the
//!   same host as the node, run by its user, the client library copies their blocks itself.
//!   Reference: one raw loopback TCP stream carrying 2 MiB blocks, no protocol at all.
//! - `put_get_4KiB_batched`: 4 KiB blocks in batches of `--small-batch` keys, alternating
//!   `batch_put_from` and `batch_get_into` through the client library; blocks per second over
//!   both. Reference: `redis-benchmark -t set,get -d 4096 -P <small-batch>` against a
//!   redis-server started here (set and get combined as total requests over total time).
//!   Extra row `put_get_4KiB_batched_vs_memcached`: memcached started here, driven by a
//!   single-connection client in this file alternating `small-batch` pipelined `set`s and one
//!   multi-key `get`, the same shape as Yutu's side.
//! - `put_get_4KiB_batched_per_node_cpu_second`: the same Yutu run, as blocks per second of
//!   the node's own CPU time (`/proc/PID/stat`, all its threads), against redis-server's
//!   requests per second of its CPU time in the Redis run: what each server spends on a
//!   request, without the load generator, which shares the two cores and whose share moves
//!   the throughput rows from run to run.
//!
//! Every case alternates Yutu and its references in rounds (as the `transfer` suite does), so
//! that the VM's speed, which moves by a fifth within minutes, moves both sides of a ratio
//! alike. For the 4 KiB case, yutu-server, redis-server and memcached are all up and take
//! turns (`SMALL_ROUNDS`): only the side being measured has clients, the others sit idle.
//! When the references ran one after the other instead, the Redis reference alone moved
//! between 239k and 332k requests/s over one session's runs and the ratio between 2.3 and
//! 3.2; in rounds, eight runs of one node gave 2.98 to 3.34. Before measuring, one batch of
//! every Yutu case and of memcached is read back and compared byte for byte. A missing
//! reference binary gives `reference: null`.

use super::transfer::{alternate, Memcpy, Side, Stream};
use std::io::{BufRead as _, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, ensure, Context as _};
use clap::Args;
use serde::Deserialize;
use serde_json::{json, Value};
use yutu_transfer::{
    EngineConfig, HugePages, LocalSegment, MemoryRegion, NodeAddress, NodeId, RdmaMode,
    SegmentDescriptor, TransferEngine, TransferRequest, TransportKind,
};

use crate::child::ChildGuard;
use crate::report::{BenchResult, Machine, Reference, Report};
use crate::tempdir::TempDir;

const BIG: usize = 2 << 20;
const SMALL: usize = 4 << 10;
const BUCKET: &str = "kvbench";
/// One-sided batches and control calls that take longer than this fail the run.
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a started reference server gets to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// Options of `yutu-bench kv`.
#[derive(Debug, Clone, Args)]
pub struct KvArgs {
    /// Seconds measured per side of each case.
    #[arg(long, default_value_t = 4)]
    pub duration_secs: u64,
    /// Rounds the measured time of the 2 MiB cases is cut into; the sides alternate in each.
    #[arg(long, default_value_t = 8)]
    pub rounds: u32,
    /// 2 MiB keys stored for the get cases (128 MiB by default).
    #[arg(long, default_value_t = 64)]
    pub big_keys: usize,
    /// 2 MiB keys per get call.
    #[arg(long, default_value_t = 16)]
    pub big_batch: usize,
    /// 4 KiB keys the put/get case cycles over.
    #[arg(long, default_value_t = 4096)]
    pub small_keys: usize,
    /// 4 KiB keys per put or get call (also redis-benchmark's -P and memcached's batch).
    #[arg(long, default_value_t = 256)]
    pub small_batch: usize,
    /// Requests redis-benchmark sends per test (-n).
    #[arg(long, default_value_t = 400_000)]
    pub redis_requests: u64,
    /// Client threads of the 4 KiB put/get case, each with its own connection and buffer
    /// (and memcached's connections; redis-benchmark keeps its default 50).
    #[arg(long, default_value_t = 2)]
    pub clients: usize,
    /// Only the 4 KiB put/get case (for profiling it).
    #[arg(long)]
    pub small_only: bool,
    /// DRAM given to yutu-server (`--memory`).
    #[arg(long, default_value = "1GiB")]
    pub yutu_memory: String,
}

pub async fn run(args: &KvArgs) -> anyhow::Result<Report> {
    tokio::task::block_in_place(|| run_blocking(args))
}

fn run_blocking(args: &KvArgs) -> anyhow::Result<Report> {
    if [args.duration_secs, args.rounds.into(), args.redis_requests].contains(&0)
        || [
            args.big_keys,
            args.big_batch,
            args.small_keys,
            args.small_batch,
        ]
        .contains(&0)
    {
        bail!("every count and duration of the kv suite must be at least 1");
    }
    ensure!(
        args.big_batch <= args.big_keys && args.small_batch <= args.small_keys,
        "a batch cannot exceed the keys it cycles over"
    );
    let bin = crate::yutu::locate_binary()?;
    eprintln!("under test: {}", bin.display());
    let dir = TempDir::new_in(&std::env::temp_dir(), "yutu-bench-kv-")?;
    let mut results = Vec::new();

    {
        let mut server = Server::start(&bin, &args.yutu_memory)?;
        let client = KvClient::connect(server.addr, dir.path(), args)?;

        let lib = LibClient::connect(server.addr, args)?;
        if !args.small_only {
            eprintln!("storing {} x 2 MiB blocks...", args.big_keys);
            let big_keys: Vec<String> = (0..args.big_keys).map(|i| format!("big-{i}")).collect();
            for chunk in (0..args.big_keys)
                .collect::<Vec<_>>()
                .chunks(args.big_batch)
            {
                let keys: Vec<&str> = chunk.iter().map(|&i| big_keys[i].as_str()).collect();
                for (slot, &i) in chunk.iter().enumerate() {
                    client
                        .buf
                        .region()
                        .write_at((slot * BIG) as u64, &pattern(BIG, i as u64))?;
                }
                client.put(&keys, BIG, TransportKind::Tcp)?;
            }

            {
                eprintln!("get_into_2MiB_shm: batch_get_into against memcpy_2MiB...");
                let batches = args.big_keys / args.big_batch;
                let batch_keys = |step: usize| -> Vec<String> {
                    let first = (step % batches) * args.big_batch;
                    big_keys[first..first + args.big_batch].to_vec()
                };
                let offsets: Vec<u64> = (0..args.big_batch).map(|i| (i * BIG) as u64).collect();
                let copied = lib.get_into(&batch_keys(0), &offsets)?;
                ensure!(
                    copied.iter().all(|c| *c == Some(BIG as u64)),
                    "a 2 MiB block is missing"
                );
                let mut back = vec![0u8; BIG];
                for i in 0..args.big_batch {
                    lib.buf.read_at((i * BIG) as u64, &mut back)?;
                    ensure!(
                        back == pattern(BIG, i as u64),
                        "get-into block {i} came back wrong"
                    );
                }
                let memcpy = Memcpy::new(args.big_keys, args.big_batch)?;
                let (yutu, base) = interleave(
                    args,
                    batches,
                    |step| {
                        lib.get_into(&batch_keys(step), &offsets)?;
                        Ok(())
                    },
                    |step| {
                        memcpy.copy_batch(step);
                        Ok(())
                    },
                )?;
                server.check_running()?;
                results.push(big_result(
                    args,
                    "get_into_2MiB_shm",
                    "memcpy_2MiB",
                    yutu,
                    base,
                    0,
                    Some(0.8),
                ));
            }

            {
                let (kind, name, reference_name, target) = (
                    TransportKind::Tcp,
                    "get_2MiB_tcp",
                    "tcp_stream_2MiB",
                    Some(0.8),
                );
                eprintln!("{name}: kv get over {kind} against {reference_name}...");
                let batches = args.big_keys / args.big_batch;
                let batch_keys = |step: usize| -> Vec<&str> {
                    let first = (step % batches) * args.big_batch;
                    big_keys[first..first + args.big_batch]
                        .iter()
                        .map(String::as_str)
                        .collect()
                };
                // Correctness first: one batch read back and compared.
                client.get(&batch_keys(0), BIG, kind)?;
                client.verify(args.big_batch, BIG, 0)?;
                let mut errors = 0u64;
                let (yutu, base) = if kind == TransportKind::Shm {
                    let memcpy = Memcpy::new(args.big_keys, args.big_batch)?;
                    interleave(
                        args,
                        batches,
                        |step| {
                            errors += client.get(&batch_keys(step), BIG, kind)?;
                            Ok(())
                        },
                        |step| {
                            memcpy.copy_batch(step);
                            Ok(())
                        },
                    )?
                } else {
                    let mut stream = Stream::start(args.big_keys, args.big_batch)?;
                    let r = interleave(
                        args,
                        batches,
                        |step| {
                            errors += client.get(&batch_keys(step), BIG, kind)?;
                            Ok(())
                        },
                        |_| stream.receive_batch(),
                    )?;
                    stream.stop()?;
                    r
                };
                server.check_running()?;
                results.push(big_result(
                    args,
                    name,
                    reference_name,
                    yutu,
                    base,
                    errors,
                    target,
                ));
            }

            {
                eprintln!("put_from_2MiB_shm: batch_put_from against memcpy_into_2MiB...");
                let batches = args.big_keys / args.big_batch;
                let batch_keys = |step: usize| -> Vec<String> {
                    let first = (step % batches) * args.big_batch;
                    big_keys[first..first + args.big_batch].to_vec()
                };
                // Sources in the buffer's second half, a pattern of its own in each slot; every
                // batch stores the same sources under its keys. Checked once, read back into
                // the first half.
                let sources: Vec<u64> = (0..args.big_batch)
                    .map(|i| lib.half + (i * BIG) as u64)
                    .collect();
                let lens = vec![BIG as u64; args.big_batch];
                for (i, &at) in sources.iter().enumerate() {
                    lib.buf.write_at(at, &pattern(BIG, 1000 + i as u64))?;
                }
                lib.kv
                    .batch_put_from(BUCKET, &batch_keys(0), &lib.buf, &sources, &lens)?;
                let offsets: Vec<u64> = (0..args.big_batch).map(|i| (i * BIG) as u64).collect();
                lib.get_into(&batch_keys(0), &offsets)?;
                let mut back = vec![0u8; BIG];
                for (i, &at) in offsets.iter().enumerate() {
                    lib.buf.read_at(at, &mut back)?;
                    ensure!(
                        back == pattern(BIG, 1000 + i as u64),
                        "put-from block {i} came back wrong"
                    );
                }
                let memcpy = Memcpy::new(args.big_keys, args.big_batch)?;
                let (yutu, base) = interleave(
                    args,
                    batches,
                    |step| {
                        lib.kv.batch_put_from(
                            BUCKET,
                            &batch_keys(step),
                            &lib.buf,
                            &sources,
                            &lens,
                        )?;
                        Ok(())
                    },
                    |step| {
                        memcpy.fill_batch(step);
                        Ok(())
                    },
                )?;
                server.check_running()?;
                results.push(big_result(
                    args,
                    "put_from_2MiB_shm",
                    "memcpy_into_2MiB",
                    yutu,
                    base,
                    0,
                    Some(0.9),
                ));
            }
        }

        eprintln!("put_get_4KiB_batched: yutu...");
        let small_keys: Vec<String> = (0..args.small_keys).map(|i| format!("small-{i}")).collect();
        let batches = args.small_keys / args.small_batch;
        let batch_keys = |step: usize| -> &[String] {
            let first = (step % batches) * args.small_batch;
            &small_keys[first..first + args.small_batch]
        };
        let put_offsets: Vec<u64> = (0..args.small_batch).map(|i| (i * SMALL) as u64).collect();
        let get_offsets: Vec<u64> = put_offsets.iter().map(|o| lib.half + o).collect();
        let lens = vec![SMALL as u64; args.small_batch];
        for step in 0..batches {
            for slot in 0..args.small_batch {
                let key = (step * args.small_batch + slot) as u64;
                lib.buf
                    .write_at((slot * SMALL) as u64, &pattern(SMALL, key))?;
            }
            lib.kv
                .batch_put_from(BUCKET, batch_keys(step), &lib.buf, &put_offsets, &lens)?;
        }
        // Read back batch 0 into the second half of the buffer and compare.
        lib.get_into(batch_keys(0), &get_offsets)?;
        for slot in 0..args.small_batch {
            let mut back = vec![0u8; SMALL];
            lib.buf
                .read_at(lib.half + (slot * SMALL) as u64, &mut back)?;
            ensure!(
                back == pattern(SMALL, slot as u64),
                "4 KiB block {slot} came back with the wrong bytes"
            );
        }
        drop(lib);
        small_case(args, &mut server, dir.path(), &small_keys, &mut results)?;
        server.check_running()?;
        // The server stops here.
    };

    Ok(Report {
        suite: "kv".to_owned(),
        notes: Default::default(),
        skipped: None,
        machine: Machine::detect(),
        results,
    })
}

/// Rounds of the 4 KiB case: Yutu, Redis and memcached alternate, each side running a quarter
/// of its time (redis-benchmark a quarter of its requests) per round, so that a change in
/// the VM's speed during the run moves every side alike. Fewer rounds than the 2 MiB cases
/// have: each redis-benchmark run must still send every one of its connections many
/// pipelines.
const SMALL_ROUNDS: u32 = 4;

/// The 4 KiB put/get case against `server` (its keys stored and read back already), with
/// redis-server and memcached started beside it and the three measured in alternation
/// ([`SMALL_ROUNDS`]); only the side being measured has clients, the others idle. A
/// reference that cannot start or fails gives `reference: null`.
fn small_case(
    args: &KvArgs,
    server: &mut Server,
    dir: &Path,
    keys: &[String],
    results: &mut Vec<BenchResult>,
) -> anyhow::Result<()> {
    let mut redis = Redis::start(dir)
        .inspect_err(|e| eprintln!("no redis reference: {e:#}"))
        .ok();
    let mut memcached = Memcached::start(args)
        .inspect_err(|e| eprintln!("no memcached reference: {e:#}"))
        .ok();
    let slice = Duration::from_secs(args.duration_secs) / SMALL_ROUNDS;
    let requests = (args.redis_requests / u64::from(SMALL_ROUNDS)).max(1);
    let shape = SmallShape {
        keys,
        batch: args.small_batch,
        clients: args.clients,
        duration: slice,
    };
    let (mut yutu, mut redis_side, mut mc_side) =
        (SmallSide::new(), SmallSide::new(), SmallSide::new());
    let mut tally = Tally::default();
    for round in 1..=SMALL_ROUNDS {
        eprintln!("put_get_4KiB_batched: round {round} of {SMALL_ROUNDS}");
        let cpu_before = server.cpu_seconds();
        let (secs, t) = small_yutu_run(server.addr, args, &shape)?;
        yutu.add(t.ops as f64, secs, cpu_before, server.cpu_seconds());
        tally.add(t);
        server.check_running()?;
        if let Some(r) = redis.as_mut() {
            if let Err(e) = r.run(args, requests, &mut redis_side) {
                eprintln!("no redis reference: {e:#}");
                redis = None;
            }
        }
        if let Some(m) = memcached.as_mut() {
            if let Err(e) = m.run(args, slice, &mut mc_side) {
                eprintln!("no memcached reference: {e:#}");
                memcached = None;
            }
        }
    }
    let rounds = tally.rounds.max(1) as f64;
    eprintln!(
        "yutu: {} put+get rounds of {} keys over {} clients; per round {:.0} us in batch_put_from, {:.0} us in batch_get_into",
        tally.rounds,
        args.small_batch,
        args.clients,
        tally.put_time.as_secs_f64() * 1e6 / rounds,
        tally.get_time.as_secs_f64() * 1e6 / rounds,
    );
    if let Some(p) = yutu.per_cpu() {
        eprintln!("yutu: the node used {:.2} us of CPU per block", 1e6 / p);
    }
    let errors = tally.errors;
    let redis_name = format!("redis_set_get_4KiB_P{}", args.small_batch);
    let redis_ran = redis.is_some();
    // Blocks per second of the node's own CPU time against requests per second of
    // redis-server's: what each server spends per request, the load generators not counted.
    results.push(
        BenchResult {
            name: "put_get_4KiB_batched_per_node_cpu_second".to_owned(),
            value: yutu.per_cpu(),
            unit: "ops/cpu-s".to_owned(),
            p50_us: None,
            p99_us: None,
            mb_per_s: None,
            errors: Some(errors),
            reference: redis_side
                .per_cpu()
                .filter(|_| redis_ran)
                .map(|v| Reference {
                    name: format!("{redis_name}_per_server_cpu_second"),
                    value: v,
                    p50_us: None,
                    p99_us: None,
                    mb_per_s: None,
                    errors: Some(0),
                }),
            ratio: None,
            target: None,
        }
        .with_ratio(),
    );
    let mc_name = format!(
        "memcached_set_get_4KiB_x{}_c{}",
        args.small_batch, args.clients
    );
    for (name, reference, target) in [
        (
            "put_get_4KiB_batched",
            redis_ran.then(|| (redis_name.clone(), redis_side.rate())),
            Some(3.0),
        ),
        (
            "put_get_4KiB_batched_vs_memcached",
            memcached.is_some().then(|| (mc_name, mc_side.rate())),
            None,
        ),
    ] {
        let value = yutu.rate();
        results.push(
            BenchResult {
                name: name.to_owned(),
                value: Some(value),
                unit: "ops/s".to_owned(),
                p50_us: None,
                p99_us: None,
                mb_per_s: Some(value * SMALL as f64 / 1e6),
                errors: Some(errors),
                reference: reference.map(|(name, v)| Reference {
                    name,
                    value: v,
                    p50_us: None,
                    p99_us: None,
                    mb_per_s: Some(v * SMALL as f64 / 1e6),
                    errors: Some(0),
                }),
                ratio: None,
                target,
            }
            .with_ratio(),
        );
    }
    Ok(())
}

/// What the 4 KiB put/get case cycles over: the keys, cut into batches dealt round-robin to
/// the client threads.
struct SmallShape<'a> {
    keys: &'a [String],
    batch: usize,
    clients: usize,
    duration: Duration,
}

/// What the client threads of the 4 KiB case did, summed.
#[derive(Default)]
struct Tally {
    ops: u64,
    errors: u64,
    put_time: Duration,
    get_time: Duration,
    rounds: usize,
}

impl Tally {
    fn add(&mut self, o: Tally) {
        self.ops += o.ops;
        self.errors += o.errors;
        self.put_time += o.put_time;
        self.get_time += o.get_time;
        self.rounds += o.rounds;
    }
}

/// Runs `clients` threads, each with its own `KvClient` and buffer, alternating
/// `batch_put_from` and `batch_get_into` over its share of the batches for the duration.
/// Returns blocks per second and the summed tally.
fn small_yutu_run(
    addr: SocketAddr,
    args: &KvArgs,
    shape: &SmallShape<'_>,
) -> anyhow::Result<(f64, Tally)> {
    let batches = shape.keys.len() / shape.batch;
    // Every thread sets up (connects, registers and fills its buffer) before the clock starts,
    // as redis-benchmark connects before it measures; one that failed still reaches the
    // barrier, so that none waits for it, and gives its error after.
    let ready = std::sync::Barrier::new(shape.clients);
    let started = std::sync::OnceLock::new();
    let client = |t: usize| -> anyhow::Result<Tally> {
        let put_offsets: Vec<u64> = (0..shape.batch).map(|i| (i * SMALL) as u64).collect();
        let lens = vec![SMALL as u64; shape.batch];
        let set_up = LibClient::connect(addr, args).and_then(|lib| {
            for (slot, off) in put_offsets.iter().enumerate() {
                lib.buf.write_at(*off, &pattern(SMALL, slot as u64))?;
            }
            Ok(lib)
        });
        ready.wait();
        let start = *started.get_or_init(Instant::now);
        let lib = set_up?;
        let get_offsets: Vec<u64> = put_offsets.iter().map(|o| lib.half + o).collect();
        let mut tally = Tally::default();
        let mut step = t;
        while start.elapsed() < shape.duration {
            let first = (step % batches) * shape.batch;
            let keys = &shape.keys[first..first + shape.batch];
            let t0 = Instant::now();
            lib.kv
                .batch_put_from(BUCKET, keys, &lib.buf, &put_offsets, &lens)?;
            let t1 = Instant::now();
            tally.errors += lib
                .get_into(keys, &get_offsets)?
                .iter()
                .filter(|c| **c != Some(SMALL as u64))
                .count() as u64;
            tally.put_time += t1 - t0;
            tally.get_time += t1.elapsed();
            tally.ops += 2 * keys.len() as u64;
            tally.rounds += 1;
            step += shape.clients;
        }
        Ok(tally)
    };
    let outcomes = on_threads(shape.clients, client);
    let elapsed = started.get().map_or(Duration::ZERO, Instant::elapsed);
    let mut total = Tally::default();
    for o in outcomes {
        total.add(o?);
    }
    Ok((elapsed.as_secs_f64(), total))
}

/// Runs `work(0..n)` on `n` scoped threads; their results in order (a panic is an error).
fn on_threads<T: Send>(
    n: usize,
    work: impl Fn(usize) -> anyhow::Result<T> + Sync,
) -> Vec<anyhow::Result<T>> {
    let work = &work;
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..n).map(|t| scope.spawn(move || work(t))).collect();
        threads
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a client thread panicked")))
            })
            .collect()
    })
}

/// A 2 MiB row: GB/s of both sides and their ratio.
fn big_result(
    args: &KvArgs,
    name: &str,
    reference_name: &str,
    yutu: Side,
    base: Side,
    errors: u64,
    target: Option<f64>,
) -> BenchResult {
    let gbps =
        |(steps, time): Side| (steps * args.big_batch * BIG) as f64 / time.as_secs_f64() / 1e9;
    let (yutu, base) = (gbps(yutu), gbps(base));
    BenchResult {
        name: name.to_owned(),
        value: Some(yutu),
        unit: "GB/s".to_owned(),
        p50_us: None,
        p99_us: None,
        mb_per_s: Some(yutu * 1000.0),
        errors: Some(errors),
        reference: Some(Reference {
            name: reference_name.to_owned(),
            value: base,
            p50_us: None,
            p99_us: None,
            mb_per_s: Some(base * 1000.0),
            errors: Some(0),
        }),
        ratio: None,
        target,
    }
    .with_ratio()
}

/// The client library as an inference engine would use it: one `KvClient`, one registered
/// buffer (two halves: put sources, get targets).
struct LibClient {
    kv: yutu_client::kv::KvClient,
    buf: yutu_client::kv::Buffer,
    half: u64,
}

impl LibClient {
    fn connect(addr: SocketAddr, args: &KvArgs) -> anyhow::Result<LibClient> {
        let kv = yutu_client::kv::KvClient::new(
            &format!("http://{addr}"),
            yutu_client::kv::KvOptions::default(),
        )?;
        let half = (args.big_batch * BIG).max(args.small_batch * SMALL) as u64;
        let buf = kv.register(2 * half)?;
        // Touch every page once, as a long-running engine's buffer would be.
        buf.write_at(0, &vec![0u8; 2 * half as usize])?;
        Ok(LibClient { kv, buf, half })
    }

    fn get_into(&self, keys: &[String], offsets: &[u64]) -> anyhow::Result<Vec<Option<u64>>> {
        Ok(self.kv.batch_get_into(BUCKET, keys, &self.buf, offsets)?)
    }
}

/// Runs both sides for `--duration-secs` each, in alternating rounds, after one unmeasured pass
/// over every batch; returns (steps, time) of each side.
fn interleave(
    args: &KvArgs,
    batches: usize,
    yutu: impl FnMut(usize) -> anyhow::Result<()>,
    reference: impl FnMut(usize) -> anyhow::Result<()>,
) -> anyhow::Result<(Side, Side)> {
    let duration = Duration::from_secs(args.duration_secs);
    alternate(batches, duration, args.rounds, yutu, reference)
}

/// Deterministic block contents, different per key.
pub(super) fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// yutu-server with the NVMe tier off, so the KV blocks live in DRAM only and no 4 GiB file is
/// preallocated; stopped and its data removed when dropped.
pub(super) struct Server {
    child: ChildGuard,
    pub(super) addr: SocketAddr,
    _data: TempDir,
}

impl Server {
    /// Without authentication, with `memory` of DRAM.
    fn start(bin: &Path, memory: &str) -> anyhow::Result<Server> {
        Server::start_with(bin, None, &["--memory", memory])
    }

    /// With `users` (a config file's `[[users]]` tables) or without authentication when
    /// `None`, and `args` (memory, shards...).
    pub(super) fn start_with(
        bin: &Path,
        users: Option<&str>,
        args: &[&str],
    ) -> anyhow::Result<Server> {
        let data = TempDir::new_in(&std::env::temp_dir(), "yutu-bench-data-")?;
        let mut cmd = Command::new(bin);
        match users {
            Some(users) => {
                let config = data.path().join("yutu.toml");
                std::fs::write(&config, users).context("writing the users' config file")?;
                cmd.arg("--config").arg(config);
            }
            None => {
                cmd.arg("--no-auth");
            }
        }
        cmd.args(["--listen", "127.0.0.1:0"])
            .args(args)
            .args(["--nvme-capacity", "0"])
            .args(
                std::env::var("YUTU_BENCH_SERVER_ARGS")
                    .map(|a| a.split_whitespace().map(String::from).collect::<Vec<_>>())
                    .unwrap_or_default(),
            )
            .arg("--data-dir")
            .arg(data.path().join("node"))
            .env("NO_COLOR", "1");
        let (mut child, lines) = ChildGuard::spawn("yutu-server", &mut cmd)?;
        let deadline = Instant::now() + Duration::from_secs(30);
        let addr = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!(
                    "yutu-server did not log its address; last output:\n{}",
                    child.tail()
                );
            }
            match lines.recv_timeout(left.min(Duration::from_millis(100))) {
                Ok(line) => {
                    if let Some(addr) = crate::yutu::parse_listening(&line) {
                        break addr;
                    }
                }
                Err(RecvTimeoutError::Timeout) => child.check_running()?,
                Err(RecvTimeoutError::Disconnected) => {
                    std::thread::sleep(Duration::from_millis(50));
                    child.check_running()?;
                    bail!("yutu-server closed its output without logging its address");
                }
            }
        };
        Ok(Server {
            child,
            addr,
            _data: data,
        })
    }

    pub(super) fn check_running(&mut self) -> anyhow::Result<()> {
        self.child.check_running()
    }

    /// The node's CPU time so far (see [`ChildGuard::cpu_seconds`]).
    pub(super) fn cpu_seconds(&self) -> Option<f64> {
        self.child.cpu_seconds()
    }
}

/// A minimal blocking HTTP/1.1 client on one keep-alive connection: JSON in, JSON out,
/// `Content-Length` bodies only (what the server sends for the KV API).
pub(super) struct Http {
    addr: SocketAddr,
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    wbuf: Vec<u8>,
}

impl Http {
    pub(super) fn connect(addr: SocketAddr) -> anyhow::Result<Http> {
        let sock = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
        sock.set_nodelay(true)?;
        sock.set_read_timeout(Some(IO_TIMEOUT))?;
        sock.set_write_timeout(Some(IO_TIMEOUT))?;
        Ok(Http {
            addr,
            reader: BufReader::with_capacity(64 << 10, sock.try_clone()?),
            writer: sock,
            wbuf: Vec::with_capacity(64 << 10),
        })
    }

    /// Sends one request; returns the status and body.
    fn send(&mut self, method: &str, path: &str, body: &[u8]) -> anyhow::Result<(u16, Vec<u8>)> {
        self.send_as(None, method, path, body)
    }

    /// Sends one request, signed with SigV4 by `who` when given; returns the status and body.
    pub(super) fn send_as(
        &mut self,
        who: Option<&yutu_client::Credentials>,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> anyhow::Result<(u16, Vec<u8>)> {
        self.wbuf.clear();
        write!(
            self.wbuf,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
            self.addr,
            body.len()
        )?;
        if let Some(who) = who {
            let host = self.addr.to_string();
            for (name, value) in who.sign(method, &host, path, "", body, SystemTime::now()) {
                write!(self.wbuf, "{name}: {value}\r\n")?;
            }
        }
        self.wbuf.extend_from_slice(b"\r\n");
        self.wbuf.extend_from_slice(body);
        self.writer.write_all(&self.wbuf)?;
        let mut line = String::new();
        self.reader.read_line(&mut line)?;
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("bad status line {line:?} for {method} {path}"))?;
        let mut len = 0usize;
        loop {
            line.clear();
            if self.reader.read_line(&mut line)? == 0 {
                bail!("connection closed in the response head of {method} {path}");
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse()?;
                } else if k.eq_ignore_ascii_case("transfer-encoding") {
                    bail!("chunked responses are not supported by the kv bench client");
                }
            }
        }
        let mut out = vec![0u8; len];
        self.reader.read_exact(&mut out)?;
        Ok((status, out))
    }

    fn post(&mut self, path: &str, body: &Value) -> anyhow::Result<Value> {
        let (status, out) = self.send("POST", path, body.to_string().as_bytes())?;
        ensure!(
            status == 200,
            "POST {path}: {status} {}",
            String::from_utf8_lossy(&out)
        );
        Ok(serde_json::from_slice(&out)?)
    }
}

#[derive(Deserialize)]
struct GetReply {
    leases: Vec<u64>,
    blocks: Vec<GetBlock>,
}

#[derive(Deserialize)]
struct GetBlock {
    descriptor: Option<SegmentDescriptor>,
}

#[derive(Deserialize)]
struct PutReply {
    puts: Vec<PutStarted>,
}

#[derive(Deserialize)]
struct PutStarted {
    put_id: u64,
    descriptor: SegmentDescriptor,
}

/// The raw client side of the KV API: one HTTP connection for the control calls and one
/// transfer engine with a registered buffer (`big_batch * 2 MiB`) for the one-sided reads.
struct KvClient {
    http: std::cell::RefCell<Http>,
    engine: TransferEngine,
    buf: LocalSegment,
}

impl KvClient {
    fn connect(addr: SocketAddr, shm_dir: &Path, args: &KvArgs) -> anyhow::Result<KvClient> {
        let mut http = Http::connect(addr)?;
        let (status, body) = http.send("PUT", &format!("/{BUCKET}"), b"")?;
        ensure!(
            status == 200,
            "creating bucket {BUCKET}: {status} {}",
            String::from_utf8_lossy(&body)
        );
        let (status, body) = http.send("GET", "/v1/kv/engine", b"")?;
        ensure!(status == 200, "GET /v1/kv/engine: {status}");
        let server: NodeAddress = serde_json::from_slice(&body).context("the engine address")?;
        let mut config = EngineConfig::new(NodeId(0xbe4c));
        config.shm_dir = Some(shm_dir.to_path_buf());
        config.rdma = RdmaMode::Off;
        let engine = TransferEngine::start(config).context("starting the client engine")?;
        engine.add_peer(server);
        let len = args.big_batch * BIG;
        let region = MemoryRegion::allocate("kv-bench-client", len, HugePages::Auto)?;
        region.write_at(0, &vec![0u8; len])?;
        let buf = engine.register(region)?;
        Ok(KvClient {
            http: std::cell::RefCell::new(http),
            engine,
            buf,
        })
    }

    fn post(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        self.http.borrow_mut().post(path, body)
    }

    /// Submits one batch over `kind` and waits for it.
    fn transfer(
        &self,
        reqs: impl IntoIterator<Item = TransferRequest>,
        kind: TransportKind,
    ) -> anyhow::Result<yutu_transfer::BatchResult> {
        self.engine
            .submit_via(reqs, &[kind])?
            .wait_timeout(IO_TIMEOUT)
            .context("a one-sided batch timed out")
    }

    /// Writes `keys.len()` blocks of `len` bytes from the start of the buffer: put-start,
    /// one-sided writes over `kind`, put-end.
    fn put(&self, keys: &[&str], len: usize, kind: TransportKind) -> anyhow::Result<()> {
        let blocks: Vec<Value> = keys.iter().map(|k| json!({"key": k, "len": len})).collect();
        let started: PutReply = serde_json::from_value(self.post(
            &format!("/v1/kv/{BUCKET}/put-start"),
            &json!({ "blocks": blocks }),
        )?)?;
        ensure!(started.puts.len() == keys.len(), "put-start answered short");
        let writes = started
            .puts
            .iter()
            .enumerate()
            .map(|(i, p)| TransferRequest::write(&self.buf, (i * len) as u64, &p.descriptor));
        let result = self.transfer(writes, kind)?;
        for outcome in result.outcomes {
            let c = outcome.context("a one-sided write failed")?;
            ensure!(c.transport == kind, "a write went over {}", c.transport);
        }
        let ids: Vec<u64> = started.puts.iter().map(|p| p.put_id).collect();
        self.post(
            &format!("/v1/kv/{BUCKET}/put-end"),
            &json!({ "put_ids": ids }),
        )?;
        Ok(())
    }

    /// get, one-sided reads over `kind` into the buffer, release; the failed reads.
    fn get(&self, keys: &[&str], len: usize, kind: TransportKind) -> anyhow::Result<u64> {
        let got: GetReply = serde_json::from_value(
            self.post(&format!("/v1/kv/{BUCKET}/get"), &json!({ "keys": keys }))?,
        )?;
        ensure!(got.blocks.len() == keys.len(), "get answered short");
        let mut reads = Vec::with_capacity(keys.len());
        for (i, b) in got.blocks.iter().enumerate() {
            let d = b
                .descriptor
                .as_ref()
                .context("a stored key was not found")?;
            ensure!(
                d.len == len as u64,
                "a block came back with length {}",
                d.len
            );
            reads.push(TransferRequest::read(&self.buf, (i * len) as u64, d));
        }
        let result = self.transfer(reads, kind)?;
        let mut errors = 0;
        for outcome in result.outcomes {
            match outcome {
                Ok(c) if c.transport == kind => {}
                Ok(c) => bail!("a read went over {} instead of {kind}", c.transport),
                Err(_) => errors += 1,
            }
        }
        self.post("/v1/kv/release", &json!({ "leases": got.leases }))?;
        Ok(errors)
    }

    /// Compares the first `n` blocks of the buffer with the keys of batch `step`.
    fn verify(&self, n: usize, len: usize, first_key: usize) -> anyhow::Result<()> {
        let mut back = vec![0u8; len];
        for i in 0..n {
            self.buf.region().read_at((i * len) as u64, &mut back)?;
            ensure!(
                back == pattern(len, (first_key + i) as u64),
                "block {} came back with the wrong bytes",
                first_key + i
            );
        }
        Ok(())
    }
}

/// Finds `name` on `$PATH` or in the sbin directories Debian installs servers to.
fn find_binary(name: &str) -> anyhow::Result<std::path::PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/local/sbin", "/usr/bin"].map(Into::into))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .with_context(|| format!("{name} not found (scripts/install-bench-deps.sh installs it)"))
}

/// A loopback port that was free a moment ago (the reference servers cannot announce theirs).
fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Waits until `child` accepts connections on `port`.
fn wait_listening(child: &mut ChildGuard, port: u16) -> anyhow::Result<()> {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        child.check_running()?;
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("nothing listens on port {port} after {START_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Operations per second of CPU time, from a process's CPU seconds before and after them.
fn per_cpu_second(ops: f64, before: Option<f64>, after: Option<f64>) -> Option<f64> {
    let used = after? - before?;
    (used > 0.0).then(|| ops / used)
}

/// What one side of the 4 KiB case did over its rounds, summed: operations, the seconds they
/// took, and the server's CPU seconds (`None` once a round could not read them).
struct SmallSide {
    ops: f64,
    secs: f64,
    cpu: Option<f64>,
}

impl SmallSide {
    fn new() -> SmallSide {
        SmallSide {
            ops: 0.0,
            secs: 0.0,
            cpu: Some(0.0),
        }
    }

    /// Adds a round of `ops` in `secs`, with the server's CPU seconds before and after it.
    fn add(&mut self, ops: f64, secs: f64, cpu_before: Option<f64>, cpu_after: Option<f64>) {
        self.ops += ops;
        self.secs += secs;
        self.cpu = match (self.cpu, cpu_before, cpu_after) {
            (Some(sum), Some(b), Some(a)) => Some(sum + (a - b)),
            _ => None,
        };
    }

    fn rate(&self) -> f64 {
        self.ops / self.secs
    }

    fn per_cpu(&self) -> Option<f64> {
        per_cpu_second(self.ops, Some(0.0), self.cpu)
    }
}

/// redis-server on a free port, measured by redis-benchmark in rounds ([`Redis::run`]).
struct Redis {
    server: ChildGuard,
    _lines: std::sync::mpsc::Receiver<String>,
    _data: TempDir,
    port: u16,
    bench_bin: std::path::PathBuf,
}

impl Redis {
    fn start(dir: &Path) -> anyhow::Result<Redis> {
        let server_bin = find_binary("redis-server")?;
        let bench_bin = find_binary("redis-benchmark")?;
        let port = free_port()?;
        let data = TempDir::new_in(dir, "redis-")?;
        let mut cmd = Command::new(server_bin);
        cmd.args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(data.path());
        let (mut server, lines) = ChildGuard::spawn("redis-server", &mut cmd)?;
        wait_listening(&mut server, port)?;
        Ok(Redis {
            server,
            _lines: lines,
            _data: data,
            port,
            bench_bin,
        })
    }

    /// One redis-benchmark run of `n` SETs and `n` GETs, added to `side`: the requests, the
    /// time of both tests (from their rates), and redis-server's CPU time.
    fn run(&mut self, args: &KvArgs, n: u64, side: &mut SmallSide) -> anyhow::Result<()> {
        let cpu_before = self.server.cpu_seconds();
        let mut bench = Command::new(&self.bench_bin);
        bench
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-t", "set,get", "-d", &SMALL.to_string()])
            .args(["-P", &args.small_batch.to_string()])
            .args(["-n", &n.to_string(), "-q", "--csv"]);
        // Generous but bounded: redis moves far more than 10k requests a second.
        let limit = Duration::from_secs(10 + 2 * n / 10_000);
        let out = run_bounded("redis-benchmark", &mut bench, limit)?;
        self.server.check_running()?;
        let cpu_after = self.server.cpu_seconds();
        let mut rps = Vec::new();
        for line in out.lines() {
            let cells: Vec<&str> = line.split(',').map(|c| c.trim_matches('"')).collect();
            if let [test, value, ..] = cells.as_slice() {
                if let Ok(v) = value.parse::<f64>() {
                    rps.push((test.to_owned().to_owned(), v));
                }
            }
        }
        let find = |t: &str| rps.iter().find(|(n, _)| n == t).map(|(_, v)| *v);
        let (Some(set), Some(get)) = (find("SET"), find("GET")) else {
            bail!("no SET and GET rates in redis-benchmark's output:\n{out}");
        };
        eprintln!("redis-benchmark: SET {set:.0}/s, GET {get:.0}/s");
        let n = n as f64;
        side.add(2.0 * n, n / set + n / get, cpu_before, cpu_after);
        Ok(())
    }
}

/// Runs `cmd` to completion within `limit`, killing it otherwise; its stdout.
fn run_bounded(name: &str, cmd: &mut Command, limit: Duration) -> anyhow::Result<String> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {name}"))?;
    let mut stdout = child.stdout.take().context("no stdout")?;
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{name} ran longer than {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = reader
        .join()
        .map_err(|_| anyhow::anyhow!("reader panicked"))?;
    ensure!(status.success(), "{name} failed ({status}):\n{out}");
    Ok(out)
}

/// memcached on a free port, its keys stored and one batch read back, then driven in rounds
/// ([`Memcached::run`]) by one connection per client thread alternating a batch of pipelined
/// `set`s and one multi-key `get`: the same shape and client thread count as Yutu's side.
struct Memcached {
    server: ChildGuard,
    _lines: std::sync::mpsc::Receiver<String>,
    port: u16,
    keys: Vec<String>,
    values: Vec<Vec<u8>>,
}

impl Memcached {
    fn start(args: &KvArgs) -> anyhow::Result<Memcached> {
        let bin = find_binary("memcached")?;
        let port = free_port()?;
        let mut cmd = Command::new(bin);
        cmd.args(["-l", "127.0.0.1", "-p", &port.to_string(), "-U", "0"])
            .args(["-m", "1024", "-c", "64"]);
        // SAFETY: geteuid has no preconditions and touches no memory.
        if unsafe { libc::geteuid() } == 0 {
            cmd.args(["-u", "root"]);
        }
        let (mut server, lines) = ChildGuard::spawn("memcached", &mut cmd)?;
        wait_listening(&mut server, port)?;
        let mc = Memcached {
            server,
            _lines: lines,
            port,
            keys: (0..args.small_keys).map(|i| format!("small-{i}")).collect(),
            values: (0..args.small_keys)
                .map(|i| pattern(SMALL, i as u64))
                .collect(),
        };
        let mut conn = Memcache::connect(port)?;
        for step in 0..args.small_keys / args.small_batch {
            let r = batch_range(args, step);
            conn.set(&mc.keys[r.clone()], &mc.values[r])?;
        }
        let r = batch_range(args, 0);
        conn.get(&mc.keys[r.clone()], Some(&mc.values[r]))?;
        Ok(mc)
    }

    /// The client threads for `duration`, added to `side`.
    fn run(
        &mut self,
        args: &KvArgs,
        duration: Duration,
        side: &mut SmallSide,
    ) -> anyhow::Result<()> {
        let cpu_before = self.server.cpu_seconds();
        let start = Instant::now();
        let (port, keys, values) = (self.port, &self.keys, &self.values);
        let counts = on_threads(args.clients, |t| -> anyhow::Result<u64> {
            let mut mc = Memcache::connect(port)?;
            let (mut ops, mut step) = (0u64, t);
            while start.elapsed() < duration {
                let r = batch_range(args, step);
                mc.set(&keys[r.clone()], &values[r.clone()])?;
                mc.get(&keys[r], None)?;
                ops += 2 * args.small_batch as u64;
                step += args.clients;
            }
            Ok(ops)
        });
        let mut ops = 0u64;
        for c in counts {
            ops += c?;
        }
        let secs = start.elapsed().as_secs_f64();
        self.server.check_running()?;
        side.add(ops as f64, secs, cpu_before, self.server.cpu_seconds());
        Ok(())
    }
}

/// The indices of the 4 KiB keys of batch `step` (batches cycle over the keys).
fn batch_range(args: &KvArgs, step: usize) -> std::ops::Range<usize> {
    let batches = args.small_keys / args.small_batch;
    let first = (step % batches) * args.small_batch;
    first..first + args.small_batch
}

/// A pipelined text-protocol memcached client on one connection.
struct Memcache {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    wbuf: Vec<u8>,
    line: Vec<u8>,
    value: Vec<u8>,
}

impl Memcache {
    fn connect(port: u16) -> anyhow::Result<Memcache> {
        let sock = TcpStream::connect(("127.0.0.1", port))?;
        sock.set_nodelay(true)?;
        sock.set_read_timeout(Some(IO_TIMEOUT))?;
        Ok(Memcache {
            reader: BufReader::with_capacity(1 << 20, sock.try_clone()?),
            writer: sock,
            wbuf: Vec::new(),
            line: Vec::new(),
            value: vec![0; SMALL + 2],
        })
    }

    fn read_line(&mut self) -> anyhow::Result<&[u8]> {
        self.line.clear();
        ensure!(
            self.reader.read_until(b'\n', &mut self.line)? > 0,
            "memcached closed the connection"
        );
        Ok(self.line.trim_ascii_end())
    }

    /// One write of `keys.len()` sets, then their `STORED` replies.
    fn set(&mut self, keys: &[String], values: &[Vec<u8>]) -> anyhow::Result<()> {
        self.wbuf.clear();
        for (k, v) in keys.iter().zip(values) {
            write!(self.wbuf, "set {k} 0 0 {}\r\n", v.len())?;
            self.wbuf.extend_from_slice(v);
            self.wbuf.extend_from_slice(b"\r\n");
        }
        self.writer.write_all(&self.wbuf)?;
        for _ in keys {
            let line = self.read_line()?;
            ensure!(
                line == b"STORED",
                "memcached set: {}",
                String::from_utf8_lossy(line)
            );
        }
        Ok(())
    }

    /// One multi-key `get`; every value read in full (and compared when `expect` is given).
    fn get(&mut self, keys: &[String], expect: Option<&[Vec<u8>]>) -> anyhow::Result<()> {
        self.wbuf.clear();
        self.wbuf.extend_from_slice(b"get");
        for k in keys {
            self.wbuf.push(b' ');
            self.wbuf.extend_from_slice(k.as_bytes());
        }
        self.wbuf.extend_from_slice(b"\r\n");
        self.writer.write_all(&self.wbuf)?;
        for i in 0..keys.len() {
            let line = String::from_utf8_lossy(self.read_line()?).into_owned();
            let mut parts = line.split(' ');
            let (Some("VALUE"), Some(key), _, Some(len)) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                bail!("memcached get: unexpected {line:?}");
            };
            ensure!(key == keys[i], "memcached answered {key} for {}", keys[i]);
            let len: usize = len.parse()?;
            ensure!(len == SMALL, "memcached value of {len} bytes");
            self.reader.read_exact(&mut self.value)?;
            if let Some(expect) = expect {
                ensure!(
                    self.value[..SMALL] == expect[i][..],
                    "memcached returned wrong bytes"
                );
            }
        }
        ensure!(self.read_line()? == b"END", "memcached get: no END");
        Ok(())
    }
}
