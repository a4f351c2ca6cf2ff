//! The discrete-event simulation of one policy over one trace.
//!
//! The cluster: `prefill` instances, each with its own storage node whose cache holds
//! `cache_tokens` worth of blocks, and `decode` instances. Each request is routed by the real
//! [`Conductor`] at its arrival time (in virtual milliseconds), and then *executed* by the
//! simulator, which knows the truth the conductor only predicts:
//!
//! - a prefill instance runs one request at a time, first come first served. When it starts
//!   one, the prefix actually in its node's cache at that moment is reused; if the decision
//!   said to pull a longer prefix, whatever of it the source still holds is transferred.
//!   The rest is computed. Time = transfer + the prefill model (the same model the conductor
//!   predicts with, so prediction errors come from the cache and the queue, not the model).
//! - when a prefill ends, every block of the prompt is stored in the node's cache (evicting
//!   by the policy), and the node publishes `stored`/`removed` events that reach the
//!   conductor `event_delay_ms` later through the same ingestion path the HTTP service uses.
//! - decode instances run continuous batching: every step (decode-step model of the batch
//!   size and context) gives each running request one token; a request joins at the next
//!   step after its prefill, or waits while the batch's KV would exceed `decode_max_tokens`.
//! - instances report their true load to the conductor (prefill: at each start; decode: at
//!   each step), as engines would.
//!
//! Hits are counted block-weighted at prefill start: blocks reused locally or pulled, over
//! all blocks of the requests served.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};
use std::time::Instant;

use yutu_api::block_hash::BlockHash;
use yutu_api::events::{KvEvent, KvEventBatch, KvEventKind, Tier};
use yutu_api::route::{InstanceRegistration, LoadReport, Role, Slo};

use super::cache::{BlockCache, Eviction};
use super::trace::Trace;
use crate::conductor::Conductor;
use crate::config::ConductorConfig;
use crate::cost::CostModel;
use crate::ids::{BucketId, InstanceId, NodeId};
use crate::policy::Policy;
use crate::routing::{PullPlan, RouteInput};

/// The simulated cluster and workload knobs.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub prefill: usize,
    pub decode: usize,
    /// Cache capacity of each prefill instance's node, in tokens.
    pub cache_tokens: u64,
    pub eviction: Eviction,
    /// Arrival times are divided by this (2 = twice the request rate).
    pub speed: f64,
    /// Delay between a node storing blocks and the conductor receiving the event.
    pub event_delay_ms: f64,
    /// KV tokens one decode instance can hold.
    pub decode_max_tokens: u64,
    /// Interval of the load-over-time samples.
    pub sample_ms: f64,
    /// Routing settings (the policy is set per run; SLOs, cost model and block size come
    /// from here).
    pub conductor: ConductorConfig,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            prefill: 8,
            decode: 8,
            cache_tokens: 3_000_000,
            eviction: Eviction::Lru,
            speed: 1.0,
            event_delay_ms: 100.0,
            decode_max_tokens: 1_500_000,
            sample_ms: 5_000.0,
            conductor: ConductorConfig::default(),
        }
    }
}

/// What one policy did over the trace.
#[derive(Debug, Clone)]
pub struct PolicyRun {
    pub policy: Policy,
    pub requests: usize,
    pub served: usize,
    pub rejected: usize,
    /// Served requests meeting both objectives.
    pub met_slo: usize,
    pub hit_blocks: u64,
    pub served_blocks: u64,
    /// Per served request, ms.
    pub ttft_ms: Vec<f64>,
    /// Per served request with more than one output token: mean time between tokens, ms.
    pub tbt_ms: Vec<f64>,
    /// Prefill busy time per instance, ms.
    pub busy_ms: Vec<f64>,
    /// (seconds, the largest prefill backlog of any instance in seconds).
    pub backlog: Vec<(f64, f64)>,
    pub pulls: u64,
    pub hints: u64,
    /// Routed TTFT predictions against what happened: mean absolute error, ms.
    pub ttft_prediction_error_ms: f64,
    /// Wall-clock time the simulation took.
    pub wall_ms: f64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Event {
    Arrival(usize),
    PrefillDone(usize),
    DecodeStep(usize),
    /// Index into the pending batches.
    Deliver(usize),
    Replicate {
        req: usize,
        from: usize,
        to: usize,
        first: usize,
        count: usize,
    },
    Sample,
}

/// A heap entry: earliest time first, then first scheduled.
#[derive(Debug, Clone, Copy)]
struct Scheduled {
    at_ms: f64,
    seq: u64,
    event: Event,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> Ordering {
        // Reversed: BinaryHeap is a max-heap.
        other
            .at_ms
            .total_cmp(&self.at_ms)
            .then(other.seq.cmp(&self.seq))
    }
}

#[derive(Debug, Clone, Copy)]
struct Job {
    req: usize,
    decode: usize,
    pull: Option<PullPlan>,
    /// What the conductor predicted for it (ms).
    predicted_service_ms: f64,
    predicted_ttft_ms: f64,
}

#[derive(Debug, Default)]
struct PrefillSim {
    queue: VecDeque<Job>,
    running: Option<(Job, f64)>,
    busy_ms: f64,
}

#[derive(Debug, Clone, Copy)]
struct Decoding {
    req: usize,
    remaining: u64,
    tokens: u64,
    prefill_done_ms: f64,
}

#[derive(Debug, Default)]
struct DecodeSim {
    running: Vec<Decoding>,
    joining: Vec<Decoding>,
    waiting: VecDeque<Decoding>,
    tokens: u64,
    stepping: bool,
}

/// Builds one node's event stream.
struct Publisher {
    name: String,
    seq: u64,
}

struct Sim<'a> {
    trace: &'a Trace,
    cfg: &'a SimConfig,
    cost: CostModel,
    conductor: Conductor,
    bucket: BucketId,
    bucket_name: String,
    slo: Slo,
    prefill_ids: Vec<InstanceId>,
    decode_ids: Vec<InstanceId>,
    /// Conductor node id -> simulated node (prefill instance) index.
    node_index: Vec<usize>,
    caches: Vec<BlockCache>,
    publishers: Vec<Publisher>,
    prefill: Vec<PrefillSim>,
    decode: Vec<DecodeSim>,
    heap: BinaryHeap<Scheduled>,
    seq: u64,
    batches: Vec<Option<KvEventBatch>>,
    open: usize,
    run: PolicyRun,
    prediction_error_sum: f64,
    evicted: Vec<u32>,
}

/// Simulates `policy` over `trace`.
pub fn run_policy(trace: &Trace, cfg: &SimConfig, policy: Policy) -> PolicyRun {
    let started = Instant::now();
    let mut sim = Sim::new(trace, cfg, policy);
    sim.run();
    let mut run = sim.run;
    run.wall_ms = started.elapsed().as_secs_f64() * 1e3;
    run
}

impl<'a> Sim<'a> {
    fn new(trace: &'a Trace, cfg: &'a SimConfig, policy: Policy) -> Sim<'a> {
        let mut ccfg = cfg.conductor.clone();
        ccfg.policy = policy;
        // The simulated instances never go silent; liveness is not what is measured.
        ccfg.instance_ttl_ms = None;
        let slo = Slo {
            ttft_ms: ccfg.ttft_slo_ms,
            tbt_ms: ccfg.tbt_slo_ms,
        };
        let cost = ccfg.cost.clone();
        let mut conductor = Conductor::new(ccfg);
        let bucket_name = "trace".to_owned();
        let bucket = conductor.bucket(&bucket_name).unwrap_or(BucketId(0));
        let block_tokens = u64::from(cfg.conductor.block_tokens.max(1));
        let capacity = (cfg.cache_tokens / block_tokens) as usize;
        let mut prefill_ids = Vec::new();
        let mut node_index = Vec::new();
        let mut publishers = Vec::new();
        for i in 0..cfg.prefill.max(1) {
            let node = format!("node-{i}");
            let reg = InstanceRegistration {
                id: format!("prefill-{i}"),
                role: Role::Prefill,
                node: Some(node.clone()),
                node_url: None,
            };
            let (iid, _) = conductor
                .register_instance(&reg, 0.0)
                .expect("simulated instances have valid names");
            let nid = conductor.node_id(&node).unwrap_or(NodeId(0));
            if node_index.len() <= nid.index() {
                node_index.resize(nid.index() + 1, usize::MAX);
            }
            node_index[nid.index()] = i;
            prefill_ids.push(iid);
            publishers.push(Publisher { name: node, seq: 0 });
        }
        let mut decode_ids = Vec::new();
        for i in 0..cfg.decode.max(1) {
            let reg = InstanceRegistration {
                id: format!("decode-{i}"),
                role: Role::Decode,
                node: None,
                node_url: None,
            };
            let (iid, _) = conductor
                .register_instance(&reg, 0.0)
                .expect("simulated instances have valid names");
            decode_ids.push(iid);
        }
        let n_prefill = prefill_ids.len();
        let n_decode = decode_ids.len();
        Sim {
            trace,
            cfg,
            cost,
            conductor,
            bucket,
            bucket_name,
            slo,
            caches: (0..n_prefill)
                .map(|_| BlockCache::new(capacity, trace.distinct, cfg.eviction))
                .collect(),
            prefill_ids,
            decode_ids,
            node_index,
            publishers,
            prefill: (0..n_prefill).map(|_| PrefillSim::default()).collect(),
            decode: (0..n_decode).map(|_| DecodeSim::default()).collect(),
            heap: BinaryHeap::new(),
            seq: 0,
            batches: Vec::new(),
            open: trace.requests.len(),
            run: PolicyRun {
                policy,
                requests: trace.requests.len(),
                served: 0,
                rejected: 0,
                met_slo: 0,
                hit_blocks: 0,
                served_blocks: 0,
                ttft_ms: Vec::with_capacity(trace.requests.len()),
                tbt_ms: Vec::with_capacity(trace.requests.len()),
                busy_ms: vec![0.0; n_prefill],
                backlog: Vec::new(),
                pulls: 0,
                hints: 0,
                ttft_prediction_error_ms: 0.0,
                wall_ms: 0.0,
            },
            prediction_error_sum: 0.0,
            evicted: Vec::new(),
        }
    }

    fn at(&mut self, at_ms: f64, event: Event) {
        self.seq += 1;
        self.heap.push(Scheduled {
            at_ms,
            seq: self.seq,
            event,
        });
    }

    fn run(&mut self) {
        // Arrivals are scheduled lazily, one ahead, to keep the heap small.
        if !self.trace.requests.is_empty() {
            self.at(self.arrival_ms(0), Event::Arrival(0));
        }
        self.at(0.0, Event::Sample);
        while let Some(s) = self.heap.pop() {
            let now = s.at_ms;
            match s.event {
                Event::Arrival(i) => {
                    if i + 1 < self.trace.requests.len() {
                        self.at(self.arrival_ms(i + 1), Event::Arrival(i + 1));
                    }
                    self.arrive(i, now);
                }
                Event::PrefillDone(p) => self.prefill_done(p, now),
                Event::DecodeStep(d) => self.decode_step(d, now),
                Event::Deliver(k) => {
                    if let Some(batch) = self.batches.get_mut(k).and_then(Option::take) {
                        // The simulator's own stream is always in order; an error here would
                        // be a simulator bug, and losing a batch only degrades routing.
                        let _ = self.conductor.ingest(&batch);
                    }
                }
                Event::Replicate {
                    req,
                    from,
                    to,
                    first,
                    count,
                } => self.replicate(req, from, to, first, count, now),
                Event::Sample => {
                    self.sample(now);
                    if self.open > 0 {
                        self.at(now + self.cfg.sample_ms.max(1.0), Event::Sample);
                    }
                }
            }
        }
        let st = self.conductor.stats();
        self.run.pulls = st.pulls;
        self.run.hints = st.hints;
        self.run.ttft_prediction_error_ms =
            self.prediction_error_sum / self.run.served.max(1) as f64;
        for (i, p) in self.prefill.iter().enumerate() {
            self.run.busy_ms[i] = p.busy_ms;
        }
    }

    fn arrive(&mut self, i: usize, now: f64) {
        let r = &self.trace.requests[i];
        let input = RouteInput {
            bucket: Some(self.bucket),
            blocks: self.trace.hashes_of(r),
            input_tokens: r.input_tokens,
            output_tokens: r.output_tokens,
            slo: self.slo,
        };
        self.conductor.maintain(now);
        match self.conductor.route(&input, now, true) {
            Err(_) => {
                self.run.rejected += 1;
                self.open -= 1;
            }
            Ok(d) => {
                let p = self
                    .prefill_ids
                    .iter()
                    .position(|x| *x == d.prefill)
                    .unwrap_or(0);
                let dec = self
                    .decode_ids
                    .iter()
                    .position(|x| *x == d.decode)
                    .unwrap_or(0);
                if let Some(h) = d.hint {
                    let (from, to) = (self.sim_node(h.from), self.sim_node(h.to));
                    let tokens = u64::from(h.blocks) * u64::from(self.cfg.conductor.block_tokens);
                    let delay = self.cost.transfer_ms(tokens, Tier::Dram, true);
                    self.at(
                        now + delay,
                        Event::Replicate {
                            req: i,
                            from,
                            to,
                            first: h.first_block as usize,
                            count: h.blocks as usize,
                        },
                    );
                }
                self.prefill[p].queue.push_back(Job {
                    req: i,
                    decode: dec,
                    pull: d.pull,
                    predicted_service_ms: d.prediction.transfer_ms + d.prediction.prefill_ms,
                    predicted_ttft_ms: d.prediction.ttft_ms,
                });
                if self.prefill[p].running.is_none() {
                    self.start_prefill(p, now);
                }
            }
        }
    }

    fn sim_node(&self, node: NodeId) -> usize {
        self.node_index
            .get(node.index())
            .copied()
            .filter(|i| *i < self.caches.len())
            .unwrap_or(0)
    }

    fn start_prefill(&mut self, p: usize, now: f64) {
        let Some(job) = self.prefill[p].queue.pop_front() else {
            return;
        };
        let r = &self.trace.requests[job.req];
        let ids = self.trace.ids_of(r);
        let bt = u64::from(self.cfg.conductor.block_tokens.max(1));
        let local = self.caches[p].prefix_len(ids);
        let mut pulled = 0;
        if let Some(pull) = job.pull {
            let src = self.sim_node(pull.from);
            if src != p {
                let planned_end = (pull.first_block + pull.blocks) as usize;
                let available = self.caches[src].prefix_len(ids).min(planned_end);
                if available > local {
                    pulled = available - local;
                    for id in &ids[local..available] {
                        self.caches[src].touch(*id);
                    }
                }
            }
        }
        for id in &ids[..local] {
            self.caches[p].touch(*id);
        }
        let hit = (local + pulled) as u64;
        let transfer = self.cost.transfer_ms(pulled as u64 * bt, Tier::Dram, true);
        let compute = self
            .cost
            .prefill_ms(r.input_tokens, (hit * bt).min(r.input_tokens));
        let service = transfer + compute;
        self.run.hit_blocks += hit;
        self.run.served_blocks += ids.len() as u64;
        self.prefill[p].busy_ms += service;
        self.prefill[p].running = Some((job, now + service));
        self.at(now + service, Event::PrefillDone(p));
        // The engine knows its queue: what runs now plus what waits, as predicted.
        let waiting: f64 = self.prefill[p]
            .queue
            .iter()
            .map(|j| j.predicted_service_ms)
            .sum();
        let report = LoadReport {
            queued_prefill_ms: Some(service + waiting),
            ..LoadReport::default()
        };
        self.conductor
            .report_load_by_id(self.prefill_ids[p], &report, now);
    }

    /// Stores `ids` on node `p`, publishing the changes `event_delay_ms` later.
    fn store(&mut self, p: usize, ids: &[u32], now: f64) {
        let by_id = &self.trace.by_id;
        let mut events: Vec<KvEvent> = Vec::new();
        let seq = &mut self.publishers[p].seq;
        for id in ids {
            self.evicted.clear();
            let added = self.caches[p].insert(*id, &mut self.evicted);
            for victim in &self.evicted {
                push_block(
                    &mut events,
                    seq,
                    &self.bucket_name,
                    false,
                    by_id[*victim as usize],
                );
            }
            if added {
                push_block(
                    &mut events,
                    seq,
                    &self.bucket_name,
                    true,
                    by_id[*id as usize],
                );
            }
        }
        if events.is_empty() {
            return;
        }
        let batch = KvEventBatch {
            node: self.publishers[p].name.clone(),
            epoch: 1,
            events,
        };
        self.batches.push(Some(batch));
        let k = self.batches.len() - 1;
        self.at(now + self.cfg.event_delay_ms.max(0.0), Event::Deliver(k));
    }

    /// When request `i` arrives, in the sped-up time.
    fn arrival_ms(&self, i: usize) -> f64 {
        self.trace.requests[i].arrival_ms / self.speed()
    }

    fn speed(&self) -> f64 {
        if self.cfg.speed > 0.0 && self.cfg.speed.is_finite() {
            self.cfg.speed
        } else {
            1.0
        }
    }

    fn prefill_done(&mut self, p: usize, now: f64) {
        let Some((job, _)) = self.prefill[p].running.take() else {
            return;
        };
        let r = &self.trace.requests[job.req];
        let ids: Vec<u32> = self.trace.ids_of(r).to_vec();
        self.store(p, &ids, now);
        let ttft = now - self.arrival_ms(job.req);
        self.run.ttft_ms.push(ttft);
        self.prediction_error_sum += (ttft - job.predicted_ttft_ms).abs();
        self.run.served += 1;
        let d = Decoding {
            req: job.req,
            remaining: r.output_tokens.saturating_sub(1),
            tokens: r.input_tokens + 1,
            prefill_done_ms: now,
        };
        if d.remaining == 0 {
            self.finish(d, now);
        } else {
            let dec = &mut self.decode[job.decode];
            dec.joining.push(d);
            if !dec.stepping {
                self.admit_and_step(job.decode, now);
            }
        }
        self.start_prefill(p, now);
    }

    fn finish(&mut self, d: Decoding, now: f64) {
        let r = &self.trace.requests[d.req];
        let tbt = if r.output_tokens > 1 {
            let t = (now - d.prefill_done_ms) / (r.output_tokens - 1) as f64;
            self.run.tbt_ms.push(t);
            t
        } else {
            0.0
        };
        self.open -= 1;
        let ttft_ok = self.slo.ttft_ms.is_none_or(|l| self.ttft_of(d) <= l);
        let tbt_ok = self.slo.tbt_ms.is_none_or(|l| tbt <= l);
        if ttft_ok && tbt_ok {
            self.run.met_slo += 1;
        }
    }

    fn ttft_of(&self, d: Decoding) -> f64 {
        d.prefill_done_ms - self.arrival_ms(d.req)
    }

    /// Moves joining and waiting requests into the batch (memory permitting) and schedules
    /// the next step if there is anything to run.
    fn admit_and_step(&mut self, di: usize, now: f64) {
        let max = self.cfg.decode_max_tokens;
        let dec = &mut self.decode[di];
        for d in dec.joining.drain(..) {
            dec.waiting.push_back(d);
        }
        while let Some(d) = dec.waiting.front() {
            // An empty batch admits anything, or a request larger than the memory would
            // wait forever.
            if !dec.running.is_empty() && dec.tokens + d.tokens > max {
                break;
            }
            dec.tokens += d.tokens;
            if let Some(d) = dec.waiting.pop_front() {
                dec.running.push(d);
            }
        }
        if dec.running.is_empty() {
            dec.stepping = false;
            return;
        }
        dec.stepping = true;
        let step = self
            .cost
            .decode_step_ms(dec.running.len() as f64, dec.tokens as f64);
        let report = LoadReport {
            running_requests: Some(dec.running.len() as u32),
            running_tokens: Some(dec.tokens),
            ..LoadReport::default()
        };
        self.conductor
            .report_load_by_id(self.decode_ids[di], &report, now);
        self.at(now + step.max(1e-3), Event::DecodeStep(di));
    }

    fn decode_step(&mut self, di: usize, now: f64) {
        let mut done = Vec::new();
        let dec = &mut self.decode[di];
        dec.running.retain_mut(|d| {
            d.remaining -= 1;
            d.tokens += 1;
            dec.tokens += 1;
            if d.remaining == 0 {
                dec.tokens -= d.tokens;
                done.push(*d);
                false
            } else {
                true
            }
        });
        for d in done {
            self.finish(d, now);
        }
        self.admit_and_step(di, now);
    }

    fn replicate(
        &mut self,
        req: usize,
        from: usize,
        to: usize,
        first: usize,
        count: usize,
        now: f64,
    ) {
        let r = &self.trace.requests[req];
        let ids: Vec<u32> = self.trace.ids_of(r).to_vec();
        let end = (first + count).min(ids.len());
        // Copy what the source still has, from the start of the prefix (a chain is only
        // useful from its beginning).
        let have = self.caches[from].prefix_len(&ids[..end]);
        if have > first {
            let copy = ids[..have].to_vec();
            self.store(to, &copy, now);
        }
    }

    fn sample(&mut self, now: f64) {
        let backlog = self
            .prefill
            .iter()
            .map(|p| {
                let running = p.running.map_or(0.0, |(_, end)| (end - now).max(0.0));
                running + p.queue.iter().map(|j| j.predicted_service_ms).sum::<f64>()
            })
            .fold(0.0, f64::max);
        self.run.backlog.push((now / 1e3, backlog / 1e3));
    }
}

/// Appends one block to the event stream, extending the last event when it is of the same
/// kind (the stream stays in order: a block evicted after being stored comes after it).
fn push_block(
    events: &mut Vec<KvEvent>,
    seq: &mut u64,
    bucket: &str,
    stored: bool,
    hash: BlockHash,
) {
    match events.last_mut().map(|e| &mut e.kind) {
        Some(KvEventKind::Stored { blocks, .. }) if stored => blocks.push(hash),
        Some(KvEventKind::Removed { blocks, .. }) if !stored => blocks.push(hash),
        _ => {
            *seq += 1;
            let kind = if stored {
                KvEventKind::Stored {
                    bucket: bucket.to_owned(),
                    tier: Tier::Dram,
                    blocks: vec![hash],
                }
            } else {
                KvEventKind::Removed {
                    bucket: bucket.to_owned(),
                    blocks: vec![hash],
                }
            };
            events.push(KvEvent { seq: *seq, kind });
        }
    }
}
