//! Routing one request: Mooncake's Algorithm 1, the baselines, admission, and bookkeeping.
//!
//! For the global cache-aware policy, every live prefill instance `i` is costed:
//!
//! ```text
//! TTFT_i = queue_i + min( load(local NVMe blocks) + prefill(n, local_i),
//!                         load(local NVMe blocks) + transfer(best - local_i) + prefill(n, best) )
//! ```
//!
//! where `local_i` is the prefix already on (or predicted for) `i`'s storage node and `best`
//! the longest prefix confirmed anywhere: pulling the difference from its holder is chosen
//! only when it beats recomputing it. The instance with the lowest TTFT wins. The decode
//! instance is the one with the lowest predicted time between tokens *at the time the
//! request would reach it* (now + TTFT), from the decode bookkeeping.
//!
//! Prediction-based early rejection: when the best TTFT or that TBT exceeds the request's
//! objective, the request is refused now (HTTP 429) instead of being admitted to miss it
//! while delaying everyone queued behind it.
//!
//! An accepted request is then booked: its prefill time onto the instance's queue, its stay
//! onto the decode instance's batch, and its blocks as predicted entries on the prefill
//! node, so the next request sharing the prefix is routed as if the cache were already
//! there. Expiring those predictions is left to [`Conductor::maintain`], off the request's
//! path. Hot prefixes whose holders are loaded get a replication hint towards a lightly
//! loaded node.

use std::cmp::Ordering;

use yutu_api::block_hash::{BlockHash, BlockHasher};
use yutu_api::events::Tier;
use yutu_api::route::{
    Placement, Prediction, Pull, Reject, RejectReason, ReplicationHint, Role, RouteDecision,
    RouteRequest, RouteRequestError, Slo,
};

use crate::conductor::{Conductor, Scratch};
use crate::ids::{BucketId, InstanceId, NodeId};
use crate::index::{BlockKey, NodeMatch, PrefixMatch};
use crate::policy::Policy;

/// A request reduced to what routing reads.
#[derive(Debug, Clone, Copy)]
pub struct RouteInput<'a> {
    /// `None` for a bucket the conductor cannot track (nothing cached, nothing predicted).
    pub bucket: Option<BucketId>,
    /// The prompt's full blocks (a trace may also count its partial last block).
    pub blocks: &'a [BlockHash],
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// The objectives to admit against (already defaulted).
    pub slo: Slo,
}

/// Blocks to read from another node before prefill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PullPlan {
    pub from: NodeId,
    pub first_block: u32,
    pub blocks: u32,
    pub tier: Tier,
}

/// A prefix to copy to a lightly loaded node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HintPlan {
    pub from: NodeId,
    pub to: NodeId,
    /// Blocks before this one are already on `to`.
    pub first_block: u32,
    pub blocks: u32,
}

/// An accepted request's placement, by id.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    pub prefill: InstanceId,
    pub decode: InstanceId,
    /// Leading blocks on (or predicted for) the prefill node.
    pub cached_blocks: u32,
    pub pull: Option<PullPlan>,
    pub prediction: Prediction,
    pub hint: Option<HintPlan>,
}

/// A refused request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rejection {
    pub reason: RejectReason,
    pub ttft_ms: Option<f64>,
    pub tbt_ms: Option<f64>,
    pub slo: Slo,
}

/// Why `POST /v1/route` did not place a request.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RouteError {
    #[error("bad route request: {0}")]
    BadRequest(#[from] RouteRequestError),
    #[error("{}", .0.message)]
    Rejected(Box<Reject>),
}

/// How a prompt would be served given what is cached where (independent of the queue).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Service {
    transfer_ms: f64,
    prefill_ms: f64,
    cached_blocks: u32,
    pull: Option<PullPlan>,
}

/// A memo entry: (local blocks, local NVMe blocks) -> service.
pub(crate) type ServiceKey = ((u32, u32), Service);

/// One prefill instance's best way to serve the request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PrefillPlan {
    inst: InstanceId,
    queue_ms: f64,
    transfer_ms: f64,
    prefill_ms: f64,
    cached_blocks: u32,
    pull: Option<PullPlan>,
    routed: u64,
}

impl PrefillPlan {
    fn service_ms(&self) -> f64 {
        self.transfer_ms + self.prefill_ms
    }

    fn ttft_ms(&self) -> f64 {
        self.queue_ms + self.service_ms()
    }
}

/// Lowest TTFT; on a tie the shorter queue, then the instance routed to least.
fn by_ttft(a: &PrefillPlan, b: &PrefillPlan) -> Ordering {
    a.ttft_ms()
        .total_cmp(&b.ttft_ms())
        .then(a.queue_ms.total_cmp(&b.queue_ms))
        .then(a.routed.cmp(&b.routed))
        .then(a.inst.cmp(&b.inst))
}

/// A decode instance's predicted state when the request arrives.
#[derive(Debug, Clone, Copy)]
struct DecodePlan {
    inst: InstanceId,
    tbt_ms: f64,
    batch: f64,
    routed: u64,
}

fn by_tbt(a: &DecodePlan, b: &DecodePlan) -> Ordering {
    a.tbt_ms
        .total_cmp(&b.tbt_ms)
        .then(a.batch.total_cmp(&b.batch))
        .then(a.routed.cmp(&b.routed))
        .then(a.inst.cmp(&b.inst))
}

impl Conductor {
    /// Housekeeping off the routing path: drops lapsed predictions from the index and
    /// departed requests from the decode bookkeeping. Routing ignores both already, so this
    /// only bounds memory; the service runs it on a timer, the simulator before each
    /// arrival.
    pub fn maintain(&mut self, now_ms: f64) {
        self.index.expire(now_ms.max(0.0) as u64);
        let ttl = self.cfg.instance_ttl_ms;
        let mut decode = std::mem::take(&mut self.scratch.decode);
        self.registry.live(Role::Decode, now_ms, ttl, &mut decode);
        for &d in &decode {
            self.registry.get_mut(d).decode.prune(now_ms);
        }
        self.scratch.decode = decode;
    }

    /// Places (or refuses) one request at `now_ms`. With `commit` false nothing is recorded.
    pub fn route(
        &mut self,
        input: &RouteInput<'_>,
        now_ms: f64,
        commit: bool,
    ) -> Result<Decision, Rejection> {
        let mut scratch = std::mem::take(&mut self.scratch);
        let out = self.route_with(&mut scratch, input, now_ms, commit);
        self.scratch = scratch;
        if commit {
            if let Err(r) = &out {
                self.stats.reject(r.reason);
            }
        }
        out
    }

    fn next_random(&mut self) -> u64 {
        // xorshift64*: deterministic from the configured seed, good enough to spread load.
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn route_with(
        &mut self,
        s: &mut Scratch,
        input: &RouteInput<'_>,
        now_ms: f64,
        commit: bool,
    ) -> Result<Decision, Rejection> {
        let now_u = now_ms.max(0.0) as u64;
        let ttl = self.cfg.instance_ttl_ms;
        self.registry
            .live(Role::Prefill, now_ms, ttl, &mut s.prefill);
        self.registry.live(Role::Decode, now_ms, ttl, &mut s.decode);
        let reject = |reason, ttft_ms, tbt_ms| Rejection {
            reason,
            ttft_ms,
            tbt_ms,
            slo: input.slo,
        };
        if s.prefill.is_empty() {
            return Err(reject(RejectReason::NoPrefillInstance, None, None));
        }
        if s.decode.is_empty() {
            return Err(reject(RejectReason::NoDecodeInstance, None, None));
        }
        match input.bucket {
            Some(b) if !input.blocks.is_empty() => {
                self.index
                    .match_prefix(b, input.blocks, now_u, &mut s.matches)
            }
            _ => s.matches.clear(),
        }

        let policy = self.cfg.policy;
        let plan = self.choose_prefill(policy, s, input, now_ms, commit);
        let ttft = plan.ttft_ms();
        let dplan = self.choose_decode(policy, s, input, now_ms, ttft, commit);
        let prediction = Prediction {
            queue_ms: plan.queue_ms,
            transfer_ms: plan.transfer_ms,
            prefill_ms: plan.prefill_ms,
            ttft_ms: ttft,
            tbt_ms: dplan.tbt_ms,
            decode_batch: dplan.batch.round().max(1.0) as u32,
        };
        if self.cfg.rejects() {
            // A prompt too long to meet its TTFT objective even on an idle instance is not
            // refused when an instance is idle: rejecting it spares no one a wait, and
            // serving it caches its prefix for the requests that will share it (a long
            // document is rarely asked about once). Under load the queue is not empty and
            // it is refused like any other.
            let idle_warm = self.cfg.serve_unattainable_when_idle
                && plan.queue_ms <= 0.0
                && input
                    .slo
                    .ttft_ms
                    .is_some_and(|limit| plan.service_ms() > limit);
            if !idle_warm && input.slo.ttft_ms.is_some_and(|limit| ttft > limit) {
                return Err(reject(
                    RejectReason::TtftSlo,
                    Some(ttft),
                    Some(dplan.tbt_ms),
                ));
            }
            if input.slo.tbt_ms.is_some_and(|limit| dplan.tbt_ms > limit) {
                return Err(reject(RejectReason::TbtSlo, Some(ttft), Some(dplan.tbt_ms)));
            }
        }
        let mut decision = Decision {
            prefill: plan.inst,
            decode: dplan.inst,
            cached_blocks: plan.pull.map_or(plan.cached_blocks, |p| p.first_block),
            pull: plan.pull,
            prediction,
            hint: None,
        };
        if commit {
            self.commit(s, input, &plan, &decision, now_ms);
            if policy == Policy::GlobalCacheAware && self.cfg.hot.enabled {
                decision.hint = self.replication_hint(s, input, &decision, now_ms);
            }
        }
        Ok(decision)
    }

    /// The best way to serve the request with `local` blocks (`nvme` of them on NVMe) on the
    /// instance's node: recompute the rest, or (with `allow_pull`) pull the longest
    /// confirmed prefix from its holder first when that is faster.
    fn service(
        &self,
        input: &RouteInput<'_>,
        local: u32,
        nvme: u32,
        best: Option<(NodeId, NodeMatch)>,
        allow_pull: bool,
    ) -> Service {
        let cost = &self.cfg.cost;
        let bt = u64::from(self.cfg.block_tokens.max(1));
        let n = input.input_tokens;
        let local_load = cost.transfer_ms(u64::from(nvme.min(local)) * bt, Tier::Nvme, false);
        let mut out = Service {
            transfer_ms: local_load,
            prefill_ms: cost.prefill_ms(n, (u64::from(local) * bt).min(n)),
            cached_blocks: local,
            pull: None,
        };
        let Some((src, best)) = best.filter(|_| allow_pull) else {
            return out;
        };
        // The instance's own node never has less than its confirmed prefix, so a node that
        // is the source never gets here.
        if best.confirmed <= local {
            return out;
        }
        let pulled = best.confirmed - local;
        let tokens = u64::from(pulled) * bt;
        // Which of the pulled blocks are on the source's NVMe is not tracked per block;
        // assume the prefix-wide share.
        let nvme_tokens =
            (tokens as f64 * f64::from(best.nvme_confirmed) / f64::from(best.confirmed)) as u64;
        let transfer = cost.transfer_ms(tokens - nvme_tokens, Tier::Dram, true)
            + cost.transfer_ms(nvme_tokens, Tier::Nvme, true);
        let prefill = cost.prefill_ms(n, (u64::from(best.confirmed) * bt).min(n));
        if local_load + transfer + prefill < out.transfer_ms + out.prefill_ms {
            out = Service {
                transfer_ms: local_load + transfer,
                prefill_ms: prefill,
                cached_blocks: best.confirmed,
                pull: Some(PullPlan {
                    from: src,
                    first_block: local,
                    blocks: pulled,
                    tier: if nvme_tokens > 0 {
                        Tier::Nvme
                    } else {
                        Tier::Dram
                    },
                }),
            };
        }
        out
    }

    /// Costs serving the request on `iid`. Service times depend only on how much is cached
    /// locally, and in a large cluster most instances share that (usually "nothing"), so
    /// they are computed once per distinct local prefix and reused from `memo`.
    fn plan_prefill(
        &self,
        iid: InstanceId,
        input: &RouteInput<'_>,
        matches: &PrefixMatch,
        now_ms: f64,
        allow_pull: bool,
        memo: &mut Vec<ServiceKey>,
    ) -> PrefillPlan {
        let inst = self.registry.get(iid);
        let m = inst.node.map(|nd| matches.node(nd)).unwrap_or_default();
        let local = m.any.min(input.blocks.len() as u32);
        let key = (local, m.nvme_any);
        let svc = match memo.iter().find(|(k, _)| *k == key) {
            Some((_, svc)) => *svc,
            None => {
                let svc = self.service(
                    input,
                    local,
                    m.nvme_any,
                    matches.best_confirmed(),
                    allow_pull,
                );
                memo.push((key, svc));
                svc
            }
        };
        PrefillPlan {
            inst: iid,
            queue_ms: inst.prefill.queue_ms(now_ms),
            transfer_ms: svc.transfer_ms,
            prefill_ms: svc.prefill_ms,
            cached_blocks: svc.cached_blocks,
            pull: svc.pull,
            routed: inst.routed,
        }
    }

    fn choose_prefill(
        &mut self,
        policy: Policy,
        s: &mut Scratch,
        input: &RouteInput<'_>,
        now_ms: f64,
        commit: bool,
    ) -> PrefillPlan {
        s.memo.clear();
        let one = |c: &Conductor, s: &mut Scratch, i: InstanceId| {
            c.plan_prefill(i, input, &s.matches, now_ms, false, &mut s.memo)
        };
        let fallback = s.prefill[0];
        match policy {
            Policy::GlobalCacheAware => {
                s.plans.clear();
                for k in 0..s.prefill.len() {
                    let p = self.plan_prefill(
                        s.prefill[k],
                        input,
                        &s.matches,
                        now_ms,
                        true,
                        &mut s.memo,
                    );
                    s.plans.push(p);
                }
                let Some(best) = s.plans.iter().copied().min_by(by_ttft) else {
                    return one(self, s, fallback);
                };
                // Among instances (nearly) as fast as the best, take the one that computes
                // the least: equal TTFT, less work for the cluster. This is what keeps a
                // burst sharing a new prefix together: the second request waits for the
                // first (its blocks are predicted there) instead of recomputing them
                // elsewhere for the same TTFT.
                let bound = best.ttft_ms() * (1.0 + self.cfg.reuse_slack.max(0.0));
                s.plans
                    .iter()
                    .copied()
                    .filter(|p| p.ttft_ms() <= bound)
                    .min_by(|a, b| {
                        a.service_ms()
                            .total_cmp(&b.service_ms())
                            .then_with(|| by_ttft(a, b))
                    })
                    .unwrap_or(best)
            }
            Policy::LocalCacheAware => {
                s.plans.clear();
                for k in 0..s.prefill.len() {
                    let p = one(self, s, s.prefill[k]);
                    s.plans.push(p);
                }
                // The load limit is relative to the shortest queue (like SGLang's
                // cache-aware router balancing threshold): under uniform overload the cache
                // still decides, and only a real imbalance overrides it.
                let shortest = s
                    .plans
                    .iter()
                    .map(|p| p.queue_ms)
                    .fold(f64::INFINITY, f64::min);
                let limit = shortest + self.cfg.local_queue_limit_ms;
                let eligible = s
                    .plans
                    .iter()
                    .copied()
                    .filter(|p| p.queue_ms <= limit)
                    .max_by(|a, b| {
                        a.cached_blocks
                            .cmp(&b.cached_blocks)
                            .then(b.queue_ms.total_cmp(&a.queue_ms))
                            .then(b.routed.cmp(&a.routed))
                            .then(b.inst.cmp(&a.inst))
                    });
                match eligible.or_else(|| {
                    s.plans.iter().copied().min_by(|a, b| {
                        a.queue_ms
                            .total_cmp(&b.queue_ms)
                            .then(a.routed.cmp(&b.routed))
                    })
                }) {
                    Some(p) => p,
                    None => one(self, s, fallback),
                }
            }
            Policy::LeastLoaded => {
                let reg = &self.registry;
                let pick = s
                    .prefill
                    .iter()
                    .copied()
                    .min_by(|a, b| {
                        let (x, y) = (reg.get(*a), reg.get(*b));
                        x.prefill
                            .queue_ms(now_ms)
                            .total_cmp(&y.prefill.queue_ms(now_ms))
                            .then(x.routed.cmp(&y.routed))
                            .then(a.cmp(b))
                    })
                    .unwrap_or(fallback);
                one(self, s, pick)
            }
            Policy::Random => {
                let k = (self.next_random() % s.prefill.len() as u64) as usize;
                one(self, s, s.prefill[k])
            }
            Policy::RoundRobin => {
                let k = self.rr_prefill % s.prefill.len();
                if commit {
                    self.rr_prefill = self.rr_prefill.wrapping_add(1);
                }
                one(self, s, s.prefill[k])
            }
        }
    }

    fn choose_decode(
        &mut self,
        policy: Policy,
        s: &Scratch,
        input: &RouteInput<'_>,
        now_ms: f64,
        ttft_ms: f64,
        commit: bool,
    ) -> DecodePlan {
        let arrive = now_ms + ttft_ms;
        let ctx = input.input_tokens as f64 + input.output_tokens as f64 / 2.0;
        let ttl = self.cfg.report_ttl_ms;
        let eval = |c: &Conductor, i: InstanceId| {
            let inst = c.registry.get(i);
            let (r, t) = inst.decode.predicted(arrive, now_ms, ttl);
            DecodePlan {
                inst: i,
                tbt_ms: c.cfg.cost.decode_step_ms(r + 1.0, t + ctx),
                batch: r + 1.0,
                routed: inst.routed,
            }
        };
        match policy {
            Policy::Random => {
                let k = (self.next_random() % s.decode.len() as u64) as usize;
                eval(self, s.decode[k])
            }
            Policy::RoundRobin => {
                let k = self.rr_decode % s.decode.len();
                if commit {
                    self.rr_decode = self.rr_decode.wrapping_add(1);
                }
                eval(self, s.decode[k])
            }
            _ => s
                .decode
                .iter()
                .map(|&i| eval(self, i))
                .min_by(by_tbt)
                .unwrap_or_else(|| eval(self, s.decode[0])),
        }
    }

    /// Books an accepted request: load on both instances, predicted cache entries, counters.
    fn commit(
        &mut self,
        s: &Scratch,
        input: &RouteInput<'_>,
        plan: &PrefillPlan,
        decision: &Decision,
        now_ms: f64,
    ) {
        let p = &decision.prediction;
        let prefill = self.registry.get_mut(plan.inst);
        prefill.prefill.add(now_ms, plan.service_ms());
        prefill.routed += 1;
        let node = prefill.node;
        let arrive = now_ms + p.ttft_ms;
        let decode_steps = input.output_tokens.saturating_sub(1) as f64;
        let dec = self.registry.get_mut(decision.decode);
        dec.decode.add(
            arrive,
            arrive + decode_steps * p.tbt_ms,
            input.input_tokens as f64 + input.output_tokens as f64 / 2.0,
        );
        dec.routed += 1;
        if let (Some(bucket), Some(node)) = (input.bucket, node) {
            // Blocks the node is known to hold need no prediction.
            let held = (s.matches.node(node).confirmed as usize).min(input.blocks.len());
            let expires = now_ms + p.ttft_ms + self.cfg.prediction_grace_ms;
            self.index
                .predict(node, bucket, &input.blocks[held..], expires.max(0.0) as u64);
        }
        let st = &mut self.stats;
        st.routed += 1;
        st.prompt_blocks += input.blocks.len() as u64;
        st.cached_blocks += u64::from(plan.cached_blocks);
        if let Some(pull) = plan.pull {
            st.pulls += 1;
            st.pulled_blocks += u64::from(pull.blocks);
        }
    }

    /// A replication hint when the request's longest cached prefix is hot, held by few
    /// nodes, and every prefill instance on those nodes is loaded while another is not.
    fn replication_hint(
        &mut self,
        s: &Scratch,
        input: &RouteInput<'_>,
        decision: &Decision,
        now_ms: f64,
    ) -> Option<HintPlan> {
        let bucket = input.bucket?;
        let (src, best) = s.matches.best_confirmed()?;
        let len = best.confirmed as usize;
        let last = *input.blocks.get(len.checked_sub(1)?)?;
        let heat = self.hot.touch(BlockKey { bucket, hash: last }, now_ms);
        let hot = &self.cfg.hot;
        if heat < hot.threshold {
            return None;
        }
        let holds_all = |n: NodeId| s.matches.node(n).confirmed >= best.confirmed;
        let holders = s
            .matches
            .holders()
            .iter()
            .filter(|n| holds_all(**n))
            .count();
        if holders >= hot.max_holders {
            return None;
        }
        let queue = |i: InstanceId| self.registry.get(i).prefill.queue_ms(now_ms);
        let node_of = |i: InstanceId| self.registry.get(i).node;
        let holder_queue = s
            .prefill
            .iter()
            .filter(|i| node_of(**i).is_some_and(holds_all))
            .map(|i| queue(*i))
            .min_by(f64::total_cmp)?;
        if holder_queue < hot.loaded_queue_ms {
            return None;
        }
        let chosen_node = node_of(decision.prefill);
        let target = s
            .prefill
            .iter()
            .filter(|i| {
                node_of(**i).is_some_and(|n| {
                    Some(n) != chosen_node && s.matches.node(n).any < best.confirmed
                })
            })
            .min_by(|a, b| queue(**a).total_cmp(&queue(**b)))?;
        if queue(*target) * 2.0 > holder_queue {
            return None;
        }
        let to = node_of(*target)?;
        let have = s.matches.node(to).any;
        let expires = now_ms + hot.replicate_ttl_ms;
        self.index
            .predict(to, bucket, &input.blocks[..len], expires.max(0.0) as u64);
        self.stats.hints += 1;
        Some(HintPlan {
            from: src,
            to,
            first_block: have,
            blocks: best.confirmed - have,
        })
    }

    /// Routes a request as `POST /v1/route` receives it.
    pub fn route_request(
        &mut self,
        req: &RouteRequest,
        now_ms: f64,
    ) -> Result<RouteDecision, RouteError> {
        let hasher = BlockHasher::new(self.cfg.block_tokens as usize);
        let prompt = req.resolve(&hasher)?;
        let bucket = self.buckets.intern(&req.bucket);
        let slo = Slo {
            ttft_ms: req.slo.and_then(|s| s.ttft_ms).or(self.cfg.ttft_slo_ms),
            tbt_ms: req.slo.and_then(|s| s.tbt_ms).or(self.cfg.tbt_slo_ms),
        };
        let input = RouteInput {
            bucket,
            blocks: &prompt.blocks,
            input_tokens: prompt.input_tokens,
            output_tokens: req.output_length.unwrap_or(self.cfg.default_output_tokens),
            slo,
        };
        match self.route(&input, now_ms, !req.dry_run) {
            Ok(d) => Ok(self.decision_to_wire(&d, req, &prompt.blocks)),
            Err(r) => Err(RouteError::Rejected(Box::new(reject_to_wire(&r, req)))),
        }
    }

    fn placement(&self, iid: InstanceId) -> Placement {
        let inst = self.registry.get(iid);
        Placement {
            instance: inst.id.clone(),
            node: inst.node.map(|n| self.nodes.name(n).to_owned()),
        }
    }

    fn decision_to_wire(
        &self,
        d: &Decision,
        req: &RouteRequest,
        blocks: &[BlockHash],
    ) -> RouteDecision {
        RouteDecision {
            request_id: req.request_id.clone(),
            policy: self.cfg.policy.name().to_owned(),
            prefill: self.placement(d.prefill),
            decode: self.placement(d.decode),
            blocks: blocks.len() as u32,
            cached_blocks: d.cached_blocks,
            pull: d.pull.map(|p| Pull {
                from_node: self.nodes.name(p.from).to_owned(),
                from_url: self.node_url(p.from).map(str::to_owned),
                first_block: p.first_block,
                blocks: p.blocks,
                tier: p.tier,
            }),
            predicted: d.prediction,
            replicate: d
                .hint
                .map(|h| ReplicationHint {
                    bucket: req.bucket.clone(),
                    from_node: self.nodes.name(h.from).to_owned(),
                    to_node: self.nodes.name(h.to).to_owned(),
                    blocks: blocks
                        .iter()
                        .skip(h.first_block as usize)
                        .take(h.blocks as usize)
                        .copied()
                        .collect(),
                })
                .into_iter()
                .collect(),
        }
    }
}

/// The 429/503 body for a refusal.
fn reject_to_wire(r: &Rejection, req: &RouteRequest) -> Reject {
    let message = match r.reason {
        RejectReason::TtftSlo => format!(
            "predicted time to first token {:.0} ms exceeds the objective of {:.0} ms on every prefill instance",
            r.ttft_ms.unwrap_or(f64::NAN),
            r.slo.ttft_ms.unwrap_or(f64::NAN)
        ),
        RejectReason::TbtSlo => format!(
            "predicted time between tokens {:.1} ms when the request reaches decode exceeds the objective of {:.1} ms",
            r.tbt_ms.unwrap_or(f64::NAN),
            r.slo.tbt_ms.unwrap_or(f64::NAN)
        ),
        RejectReason::NoPrefillInstance => "no live prefill instance is registered".to_owned(),
        RejectReason::NoDecodeInstance => "no live decode instance is registered".to_owned(),
    };
    Reject {
        request_id: req.request_id.clone(),
        reason: r.reason,
        message,
        predicted_ttft_ms: r.ttft_ms,
        predicted_tbt_ms: r.tbt_ms,
        ttft_slo_ms: r.slo.ttft_ms,
        tbt_slo_ms: r.slo.tbt_ms,
    }
}

#[cfg(test)]
#[path = "routing_tests.rs"]
mod tests;
