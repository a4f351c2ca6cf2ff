//! The `conductor` suite: how fast the conductor's prefix index takes KV events, and how fast
//! (and with what tail latency) it makes routing decisions, on one core.
//!
//! The setting is the issue's: an index of 1M blocks (8192 prefix chains of 128 blocks, each
//! chain on 1 to 3 of 64 storage nodes), 64 prefill instances (one per node) and 64 decode
//! instances, and requests of 128 blocks.
//!
//! - `index_ingest`: a steady stream of `stored`/`removed` events (each naming one chain's
//!   128 blocks on one node, 16 events per batch) through `Conductor::ingest`, the path the
//!   HTTP handler takes after parsing. Value: block events per second. Reference: the same
//!   inserts and removes on a plain `std::collections::HashMap<[u8; 32], u32>` (SipHash), in
//!   the same run. Target: over 5M block events/s.
//! - `route_128_blocks`: routing decisions with the global cache-aware policy, committed
//!   (load booked, blocks predicted), on a virtual clock advancing 10 ms per request, so the
//!   cluster is overloaded and early rejection is exercised too (the full evaluation happens
//!   before a rejection). Each request shares a random-length prefix with an indexed chain
//!   and continues with new blocks. Value: decisions per second (housekeeping included),
//!   with p50/p99 of one decision (`Conductor::route`; housekeeping runs off that path).
//!   Reference: the 128 lookups of the request's blocks in the plain `HashMap`, per decision.
//!   Target: p99 under 20 us.
//!
//! Everything is measured on the calling thread: the conductor's state is one structure
//! behind one lock, so one core is what one decision gets.

use std::collections::HashMap;
use std::time::Instant;

use clap::Args;
use yutu_api::block_hash::BlockHash;
use yutu_api::events::{KvEvent, KvEventBatch, KvEventKind, Tier};
use yutu_api::route::{InstanceRegistration, Role, Slo};
use yutu_conductor::{Conductor, ConductorConfig, Policy, RouteInput};

use crate::report::{BenchResult, Machine, Reference, Report};

const BUCKET: &str = "bench";
const CHAIN_BLOCKS: usize = 128;

/// Options of `yutu-bench conductor`.
#[derive(Debug, Clone, Args)]
pub struct ConductorArgs {
    /// Blocks in the index (rounded down to whole chains of 128).
    #[arg(long, default_value_t = 1 << 20)]
    pub blocks: usize,
    /// Storage nodes, each with one prefill instance.
    #[arg(long, default_value_t = 64)]
    pub instances: usize,
    /// Block events measured (after the index is built).
    #[arg(long, default_value_t = 4_000_000)]
    pub events: usize,
    /// Routing decisions measured (after as many unmeasured ones as warm-up).
    #[arg(long, default_value_t = 20_000)]
    pub decisions: usize,
}

/// Runs the suite (CPU-bound, on the calling runtime thread).
pub async fn run(args: &ConductorArgs) -> anyhow::Result<Report> {
    tokio::task::block_in_place(|| measure(args))
}

/// xorshift64*: reproducible workloads without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn node_name(i: usize) -> String {
    format!("node-{i}")
}

/// The block hashes of chain `c`.
fn chain(c: usize) -> Vec<BlockHash> {
    (0..CHAIN_BLOCKS)
        .map(|i| BlockHash::from_id((c * CHAIN_BLOCKS + i) as u64))
        .collect()
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn measure(args: &ConductorArgs) -> anyhow::Result<Report> {
    let chains = (args.blocks / CHAIN_BLOCKS).max(1);
    let nodes = args.instances.max(1);
    eprintln!(
        "conductor: {} blocks in {chains} chains of {CHAIN_BLOCKS}, {nodes} nodes/instances",
        chains * CHAIN_BLOCKS
    );

    // The cluster and the index, unmeasured.
    let cfg = ConductorConfig {
        policy: Policy::GlobalCacheAware,
        instance_ttl_ms: None,
        ..ConductorConfig::default()
    };
    let mut conductor = Conductor::new(cfg);
    for i in 0..nodes {
        for (id, role, node) in [
            (format!("prefill-{i}"), Role::Prefill, Some(node_name(i))),
            (format!("decode-{i}"), Role::Decode, None),
        ] {
            conductor.register_instance(
                &InstanceRegistration {
                    id,
                    role,
                    node,
                    node_url: None,
                },
                0.0,
            )?;
        }
    }
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let chain_hashes: Vec<Vec<BlockHash>> = (0..chains).map(chain).collect();
    // holds[c * nodes + n]: whether node n holds chain c.
    let mut holds = vec![false; chains * nodes];
    let mut seqs = vec![0u64; nodes];
    let mut reference: HashMap<[u8; 32], u32> = HashMap::with_capacity(chains * CHAIN_BLOCKS);
    conductor.index_mut().reserve(chains * CHAIN_BLOCKS);
    for (c, hashes) in chain_hashes.iter().enumerate() {
        for _ in 0..1 + rng.below(3) {
            let n = rng.below(nodes);
            if holds[c * nodes + n] {
                continue;
            }
            holds[c * nodes + n] = true;
            seqs[n] += 1;
            conductor.ingest(&batch(n, seqs[n], vec![(true, hashes.clone())]))?;
        }
        for h in hashes {
            reference.insert(h.0, 0);
        }
    }
    eprintln!(
        "index built: {} blocks, {} (block, node) entries",
        conductor.index().len(),
        conductor.index().confirmed_total()
    );

    // Ingestion: churn (a node drops a chain it holds, or stores one it lacks), 16 events
    // of 128 blocks per batch. Batches are built outside the timed region.
    let per_batch = 16;
    let batches = (args.events / (per_batch * CHAIN_BLOCKS)).max(1);
    let mut ours_s = 0.0;
    let mut ref_s = 0.0;
    let mut block_events = 0usize;
    for _ in 0..batches {
        let n = rng.below(nodes);
        let mut events = Vec::with_capacity(per_batch);
        for _ in 0..per_batch {
            let c = rng.below(chains);
            let store = !holds[c * nodes + n];
            holds[c * nodes + n] = store;
            events.push((store, chain_hashes[c].clone()));
        }
        let ref_ops: Vec<(bool, Vec<BlockHash>)> = events.clone();
        let first = seqs[n] + 1;
        seqs[n] += per_batch as u64;
        let b = batch(n, first, events);
        block_events += b.block_count();
        let t = Instant::now();
        let out = conductor.ingest(&b)?;
        ours_s += t.elapsed().as_secs_f64();
        anyhow::ensure!(
            out.batch.applied == per_batch,
            "events were not applied in order"
        );
        let t = Instant::now();
        for (store, hashes) in &ref_ops {
            for h in hashes {
                if *store {
                    reference.insert(h.0, n as u32);
                } else {
                    reference.remove(&h.0);
                }
            }
        }
        ref_s += t.elapsed().as_secs_f64();
        // Keep the reference map the size of the index: removed keys come back.
        for (store, hashes) in &ref_ops {
            if !*store {
                for h in hashes {
                    reference.insert(h.0, 0);
                }
            }
        }
    }
    let ingest = BenchResult {
        name: format!(
            "index_ingest_{}k_blocks_{nodes}_nodes",
            chains * CHAIN_BLOCKS / 1024
        ),
        value: Some(block_events as f64 / ours_s),
        unit: "block events/s".into(),
        p50_us: None,
        p99_us: None,
        mb_per_s: None,
        errors: None,
        reference: Some(Reference {
            name: "std_hashmap_insert_remove".into(),
            value: block_events as f64 / ref_s,
            p50_us: None,
            p99_us: None,
            mb_per_s: None,
            errors: None,
        }),
        ratio: None,
        target: None,
    }
    .with_ratio();

    // Routing.
    let bucket = conductor.bucket(BUCKET);
    let slo = Slo {
        ttft_ms: conductor.config().ttft_slo_ms,
        tbt_ms: conductor.config().tbt_slo_ms,
    };
    let mut fresh = (chains * CHAIN_BLOCKS) as u64;
    let mut request = |rng: &mut Rng| -> Vec<BlockHash> {
        let c = rng.below(chains);
        let shared = rng.below(CHAIN_BLOCKS + 1);
        let mut blocks = chain_hashes[c][..shared].to_vec();
        while blocks.len() < CHAIN_BLOCKS {
            fresh += 1;
            blocks.push(BlockHash::from_id(fresh));
        }
        blocks
    };
    let mut now_ms = 0.0;
    let mut lat_us = Vec::with_capacity(args.decisions);
    let mut ref_us = Vec::with_capacity(args.decisions);
    // Accepted decisions also book the request (load, predicted blocks): they cost more.
    let mut accepted_us: Vec<f64> = Vec::new();
    let mut rejected_us: Vec<f64> = Vec::new();
    let mut maintain_us = 0.0;
    let total = args.decisions.max(1) * 2;
    for k in 0..total {
        let blocks = request(&mut rng);
        let input = RouteInput {
            bucket,
            blocks: &blocks,
            input_tokens: (CHAIN_BLOCKS * 512) as u64,
            output_tokens: 256,
            slo,
        };
        now_ms += 10.0;
        // Housekeeping (lapsed predictions, departed decode requests) runs beside routing
        // in the service, on a timer; here before each decision, counted in the throughput
        // but not in the decision's latency.
        let t = Instant::now();
        conductor.maintain(now_ms);
        let housekeeping = t.elapsed().as_secs_f64() * 1e6;
        let t = Instant::now();
        let out = conductor.route(&input, now_ms, true);
        let ours = t.elapsed().as_secs_f64() * 1e6;
        let t = Instant::now();
        let mut found = 0u32;
        for h in &blocks {
            found += u32::from(reference.contains_key(&h.0));
        }
        std::hint::black_box(found);
        let theirs = t.elapsed().as_secs_f64() * 1e6;
        if k >= total / 2 {
            maintain_us += housekeeping;
            lat_us.push(ours);
            ref_us.push(theirs);
            match out {
                Ok(_) => accepted_us.push(ours),
                Err(_) => rejected_us.push(ours),
            }
        }
    }
    accepted_us.sort_by(f64::total_cmp);
    rejected_us.sort_by(f64::total_cmp);
    eprintln!(
        "routing: {} accepted (p50 {:.1} us, p99 {:.1} us), {} rejected early (p50 {:.1} us, p99 {:.1} us)",
        accepted_us.len(),
        percentile(&accepted_us, 0.5),
        percentile(&accepted_us, 0.99),
        rejected_us.len(),
        percentile(&rejected_us, 0.5),
        percentile(&rejected_us, 0.99),
    );
    let measured = lat_us.len().max(1) as f64;
    let (mean, ref_mean) = (
        (lat_us.iter().sum::<f64>() + maintain_us) / measured,
        ref_us.iter().sum::<f64>() / ref_us.len().max(1) as f64,
    );
    eprintln!(
        "routing: {:.1} us per decision on average, of which {:.1} us housekeeping",
        mean,
        maintain_us / measured
    );
    lat_us.sort_by(f64::total_cmp);
    ref_us.sort_by(f64::total_cmp);
    let route = BenchResult {
        name: format!("route_128_blocks_{nodes}_instances"),
        value: Some(1e6 / mean),
        unit: "decisions/s".into(),
        p50_us: Some(percentile(&lat_us, 0.5)),
        p99_us: Some(percentile(&lat_us, 0.99)),
        mb_per_s: None,
        errors: None,
        reference: Some(Reference {
            name: "std_hashmap_128_lookups".into(),
            value: 1e6 / ref_mean,
            p50_us: Some(percentile(&ref_us, 0.5)),
            p99_us: Some(percentile(&ref_us, 0.99)),
            mb_per_s: None,
            errors: None,
        }),
        ratio: None,
        target: None,
    }
    .with_ratio();

    let ingest_rate = ingest.value.unwrap_or(0.0);
    let p99 = route.p99_us.unwrap_or(f64::INFINITY);
    eprintln!(
        "targets: ingestion > 5M block events/s: {} ({:.2}M); routing p99 < 20 us: {} ({p99:.1} us)",
        if ingest_rate > 5e6 { "met" } else { "MISSED" },
        ingest_rate / 1e6,
        if p99 < 20.0 { "met" } else { "MISSED" },
    );
    Ok(Report {
        suite: "conductor".to_owned(),
        notes: Default::default(),
        skipped: None,
        machine: Machine::detect(),
        results: vec![ingest, route],
    })
}

/// One batch from node `n` with consecutive events from `first`.
fn batch(n: usize, first: u64, events: Vec<(bool, Vec<BlockHash>)>) -> KvEventBatch {
    KvEventBatch {
        node: node_name(n),
        epoch: 1,
        events: events
            .into_iter()
            .enumerate()
            .map(|(i, (store, blocks))| KvEvent {
                seq: first + i as u64,
                kind: if store {
                    KvEventKind::Stored {
                        bucket: BUCKET.into(),
                        tier: Tier::Dram,
                        blocks,
                    }
                } else {
                    KvEventKind::Removed {
                        bucket: BUCKET.into(),
                        blocks,
                    }
                },
            })
            .collect(),
    }
}
