//! Behaviour of routing, the cost model in use, and admission.

use yutu_api::block_hash::BlockHash;
use yutu_api::events::{KvEvent, KvEventBatch, KvEventKind, Tier};
use yutu_api::route::{InstanceRegistration, LoadReport, RejectReason, Role, RouteRequest, Slo};

use super::*;
use crate::config::ConductorConfig;
use crate::cost::{decode_poly, CostModel};

const BUCKET: &str = "llama";

fn prefix(n: u64, salt: u64) -> Vec<BlockHash> {
    (0..n)
        .map(|i| BlockHash::from_id(salt * 1_000_000 + i))
        .collect()
}

/// A conductor with prefill instances `p0..` on nodes `n0..` and decode instances `d0..`.
fn cluster(cfg: ConductorConfig, prefill: usize, decode: usize) -> Conductor {
    let mut c = Conductor::new(cfg);
    for i in 0..prefill {
        c.register_instance(
            &InstanceRegistration {
                id: format!("p{i}"),
                role: Role::Prefill,
                node: Some(format!("n{i}")),
                node_url: None,
            },
            0.0,
        )
        .expect("registers");
    }
    for i in 0..decode {
        c.register_instance(
            &InstanceRegistration {
                id: format!("d{i}"),
                role: Role::Decode,
                node: None,
                node_url: None,
            },
            0.0,
        )
        .expect("registers");
    }
    c
}

/// Defaults, with `p`, and instances that never time out (tests pick their own times).
fn policy(p: Policy) -> ConductorConfig {
    ConductorConfig {
        policy: p,
        instance_ttl_ms: None,
        ..ConductorConfig::default()
    }
}

/// Node `node` publishes that it stores `blocks` (one event, next seq).
fn store(c: &mut Conductor, node: &str, seq: u64, blocks: &[BlockHash]) {
    let out = c
        .ingest(&KvEventBatch {
            node: node.into(),
            epoch: 1,
            events: vec![KvEvent {
                seq,
                kind: KvEventKind::Stored {
                    bucket: BUCKET.into(),
                    tier: Tier::Dram,
                    blocks: blocks.to_vec(),
                },
            }],
        })
        .expect("valid events");
    assert_eq!(out.batch.applied, 1);
}

fn input<'a>(c: &mut Conductor, blocks: &'a [BlockHash]) -> RouteInput<'a> {
    RouteInput {
        bucket: c.bucket(BUCKET),
        blocks,
        input_tokens: blocks.len() as u64 * 512 + 100,
        output_tokens: 100,
        slo: Slo::default(),
    }
}

fn prefill_name(c: &Conductor, d: &Decision) -> String {
    c.instance_name(d.prefill).to_owned()
}

fn report_queue(c: &mut Conductor, id: &str, ms: f64, now: f64) {
    c.report_load(
        id,
        &LoadReport {
            queued_prefill_ms: Some(ms),
            ..LoadReport::default()
        },
        now,
    )
    .expect("known instance");
}

#[test]
fn routes_to_the_node_holding_the_prefix_and_not_after_removal() {
    let mut c = cluster(policy(Policy::GlobalCacheAware), 3, 1);
    let p = prefix(20, 1);
    store(&mut c, "n2", 1, &p);
    let inp = input(&mut c, &p);
    let d = c.route(&inp, 0.0, false).expect("routed");
    assert_eq!(prefill_name(&c, &d), "p2");
    assert_eq!(d.cached_blocks, 20);
    assert!(d.pull.is_none());
    // Cached, the prediction is close to the one-token cost; uncached it is the full prefill.
    let cost = CostModel::default();
    assert!(d.prediction.prefill_ms < cost.prefill_ms(10_340, 0) / 10.0);
    c.ingest(&KvEventBatch {
        node: "n2".into(),
        epoch: 1,
        events: vec![KvEvent {
            seq: 2,
            kind: KvEventKind::Removed {
                bucket: BUCKET.into(),
                blocks: p.clone(),
            },
        }],
    })
    .expect("valid");
    let d = c.route(&inp, 0.0, false).expect("routed");
    assert_eq!(d.cached_blocks, 0);
    assert_eq!(
        d.prediction.prefill_ms,
        cost.prefill_ms(inp.input_tokens, 0)
    );
}

#[test]
fn pulls_a_longer_prefix_when_its_holder_is_busy() {
    let mut c = cluster(policy(Policy::GlobalCacheAware), 2, 1);
    let p = prefix(30, 2);
    store(&mut c, "n0", 1, &p);
    store(&mut c, "n1", 1, &p[..5]);
    report_queue(&mut c, "p0", 20_000.0, 0.0);
    let inp = input(&mut c, &p);
    let d = c.route(&inp, 0.0, false).expect("routed");
    assert_eq!(prefill_name(&c, &d), "p1");
    let pull = d.pull.expect("pulls the rest of the prefix");
    assert_eq!(c.node_name(pull.from), "n0");
    assert_eq!((pull.first_block, pull.blocks), (5, 25));
    assert_eq!(d.cached_blocks, 5);
    let cost = CostModel::default();
    let expect = cost.transfer_ms(25 * 512, Tier::Dram, true);
    assert!((d.prediction.transfer_ms - expect).abs() < 1e-9);
    assert!(d.prediction.ttft_ms < cost.prefill_ms(inp.input_tokens, 5 * 512));
}

#[test]
fn recomputes_when_the_network_is_slower_than_the_gpu() {
    let mut cfg = policy(Policy::GlobalCacheAware);
    cfg.cost.network_gb_per_s = 0.001;
    let mut c = cluster(cfg, 2, 1);
    let p = prefix(30, 3);
    store(&mut c, "n0", 1, &p);
    report_queue(&mut c, "p0", 60_000.0, 0.0);
    let inp = input(&mut c, &p);
    let d = c.route(&inp, 0.0, false).expect("routed");
    assert_eq!(prefill_name(&c, &d), "p1");
    assert!(d.pull.is_none());
    assert_eq!(d.prediction.transfer_ms, 0.0);
}

#[test]
fn local_nvme_blocks_cost_a_load() {
    let mut c = cluster(policy(Policy::GlobalCacheAware), 1, 1);
    let p = prefix(4, 4);
    c.ingest(&KvEventBatch {
        node: "n0".into(),
        epoch: 1,
        events: vec![KvEvent {
            seq: 1,
            kind: KvEventKind::Stored {
                bucket: BUCKET.into(),
                tier: Tier::Nvme,
                blocks: p.clone(),
            },
        }],
    })
    .expect("valid");
    let inp = input(&mut c, &p);
    let d = c.route(&inp, 0.0, false).expect("routed");
    let expect = CostModel::default().transfer_ms(4 * 512, Tier::Nvme, false);
    assert!((d.prediction.transfer_ms - expect).abs() < 1e-9);
}

#[test]
fn predicted_entries_keep_a_burst_on_one_instance_until_events_arrive() {
    let mut c = cluster(policy(Policy::GlobalCacheAware), 4, 1);
    let p = prefix(32, 5);
    let inp = input(&mut c, &p);
    let first = c.route(&inp, 0.0, true).expect("routed");
    // No event yet: the blocks exist only as predictions on the first instance's node.
    for t in [0.0, 10.0, 500.0] {
        let d = c.route(&inp, t, true).expect("routed");
        assert_eq!(d.prefill, first.prefill, "at {t} ms");
        assert_eq!(d.cached_blocks, 32);
    }
    assert_eq!(c.index().predicted_total(), 32);
    // A different prefix still spreads to an idle instance.
    let q = prefix(32, 6);
    let other = input(&mut c, &q);
    let d = c.route(&other, 500.0, true).expect("routed");
    assert_ne!(d.prefill, first.prefill);
    // The event confirms the prediction; later the unconfirmed one for `q` lapses.
    let node = c
        .registry()
        .get(first.prefill)
        .node
        .map(|n| c.node_name(n).to_owned());
    store(&mut c, &node.unwrap_or_default(), 1, &p);
    assert_eq!(c.index().predicted_total(), 32);
    c.maintain(1e9);
    assert_eq!(
        c.index().predicted_total(),
        0,
        "the unconfirmed prediction lapsed"
    );
    assert_eq!(c.index().len(), 32, "the confirmed blocks stay");
}

#[test]
fn rejects_when_the_predicted_ttft_misses_the_objective() {
    let mut c = cluster(policy(Policy::GlobalCacheAware), 2, 1);
    report_queue(&mut c, "p0", 30_000.0, 0.0);
    report_queue(&mut c, "p1", 12_000.0, 0.0);
    let p = prefix(8, 8);
    let mut inp = input(&mut c, &p);
    inp.slo = Slo {
        ttft_ms: Some(10_000.0),
        tbt_ms: None,
    };
    let r = c.route(&inp, 0.0, true).expect_err("rejected");
    assert_eq!(r.reason, RejectReason::TtftSlo);
    assert!(r.ttft_ms.is_some_and(|t| t > 12_000.0));
    assert_eq!(c.stats().rejected(RejectReason::TtftSlo), 1);
    // Nothing was booked for the rejected request.
    assert_eq!(c.index().predicted_total(), 0);
    // A looser objective admits it, on the shorter queue.
    inp.slo.ttft_ms = Some(20_000.0);
    let d = c.route(&inp, 0.0, true).expect("admitted");
    assert_eq!(prefill_name(&c, &d), "p1");
    // Baselines admit everything by default.
    let mut b = cluster(policy(Policy::LeastLoaded), 1, 1);
    report_queue(&mut b, "p0", 30_000.0, 0.0);
    let mut inp = input(&mut b, &p);
    inp.slo.ttft_ms = Some(1.0);
    assert!(b.route(&inp, 0.0, true).is_ok());
}

#[test]
fn an_idle_instance_serves_a_prompt_too_long_for_its_objective() {
    let mut c = cluster(policy(Policy::GlobalCacheAware), 1, 1);
    let p = prefix(64, 17);
    let mut inp = input(&mut c, &p);
    // About 4.3 s of prefill against a 1 s objective: unattainable even with no queue.
    inp.slo.ttft_ms = Some(1_000.0);
    let d = c
        .route(&inp, 0.0, true)
        .expect("served while the instance is idle");
    assert!(d.prediction.ttft_ms > 1_000.0);
    // The next one would wait behind it: refused.
    let q = prefix(64, 18);
    let mut next = input(&mut c, &q);
    next.slo.ttft_ms = Some(1_000.0);
    let r = c
        .route(&next, 1.0, true)
        .expect_err("queued behind the first");
    assert_eq!(r.reason, RejectReason::TtftSlo);
    // And without the rule, even the first is refused.
    let mut cfg = policy(Policy::GlobalCacheAware);
    cfg.serve_unattainable_when_idle = false;
    let mut strict = cluster(cfg, 1, 1);
    let mut inp = input(&mut strict, &p);
    inp.slo.ttft_ms = Some(1_000.0);
    assert!(strict.route(&inp, 0.0, true).is_err());
}

#[test]
fn tbt_admission_uses_decode_load_when_the_request_arrives_there() {
    let mut cfg = policy(Policy::GlobalCacheAware);
    // A step costs 10 ms plus 10 ms per running request; at most two fit a 35 ms objective.
    cfg.cost.decode_step = decode_poly("10 + 10*b").expect("parses");
    cfg.tbt_slo_ms = Some(35.0);
    let mut c = cluster(cfg, 1, 1);
    let slo = Slo {
        ttft_ms: None,
        tbt_ms: Some(35.0),
    };
    let short = prefix(1, 9);
    let req = |c: &mut Conductor, blocks: &[BlockHash], tokens: u64| {
        let inp = RouteInput {
            bucket: c.bucket(BUCKET),
            blocks,
            input_tokens: tokens,
            output_tokens: 101,
            slo,
        };
        c.route(&inp, 0.0, true)
    };
    let a = req(&mut c, &short, 512).expect("first fits");
    assert_eq!(a.prediction.decode_batch, 1);
    let b = req(&mut c, &prefix(1, 10), 512).expect("second fits");
    assert_eq!(b.prediction.decode_batch, 2);
    let third = req(&mut c, &prefix(1, 11), 512).expect_err("a third would slow decode");
    assert_eq!(third.reason, RejectReason::TbtSlo);
    assert_eq!(third.tbt_ms, Some(40.0));
    // A long prompt reaches decode after the first two have left: admitted.
    let long = req(&mut c, &prefix(1, 12), 40_000).expect("arrives when decode is free");
    assert!(long.prediction.ttft_ms > b.prediction.ttft_ms + 100.0 * 30.0);
    assert_eq!(long.prediction.decode_batch, 1);
}

#[test]
fn decode_reports_count_requests_the_conductor_did_not_route() {
    let mut cfg = policy(Policy::GlobalCacheAware);
    cfg.cost.decode_step = decode_poly("10 + 10*b").expect("parses");
    let mut c = cluster(cfg, 1, 2);
    c.report_load(
        "d0",
        &LoadReport {
            running_requests: Some(5),
            running_tokens: Some(1000),
            ..LoadReport::default()
        },
        0.0,
    )
    .expect("known");
    let p = prefix(1, 13);
    let inp = input(&mut c, &p);
    let d = c.route(&inp, 0.0, true).expect("routed");
    assert_eq!(c.instance_name(d.decode), "d1");
}

#[test]
fn baselines_spread_or_follow_their_rule() {
    // Round-robin cycles.
    let mut c = cluster(policy(Policy::RoundRobin), 3, 2);
    let p = prefix(2, 14);
    let inp = input(&mut c, &p);
    let names: Vec<String> = (0..4)
        .map(|_| {
            let d = c.route(&inp, 0.0, true).expect("routed");
            prefill_name(&c, &d)
        })
        .collect();
    assert_eq!(names, ["p0", "p1", "p2", "p0"]);
    // Random is seeded and uses every instance eventually.
    let mut c = cluster(policy(Policy::Random), 3, 1);
    let inp = input(&mut c, &p);
    let mut seen = std::collections::HashSet::new();
    for _ in 0..50 {
        let d = c.route(&inp, 0.0, true).expect("routed");
        seen.insert(d.prefill);
    }
    assert_eq!(seen.len(), 3);
    // Least-loaded takes the shortest queue, whatever is cached.
    let mut c = cluster(policy(Policy::LeastLoaded), 2, 1);
    store(&mut c, "n0", 1, &p);
    report_queue(&mut c, "p0", 100.0, 0.0);
    let inp = input(&mut c, &p);
    let d = c.route(&inp, 0.0, false).expect("routed");
    assert_eq!(prefill_name(&c, &d), "p1");
    // Local cache-aware follows its cache while under the load limit...
    let mut c = cluster(policy(Policy::LocalCacheAware), 2, 1);
    store(&mut c, "n0", 1, &p);
    report_queue(&mut c, "p0", 100.0, 0.0);
    let inp = input(&mut c, &p);
    let d = c.route(&inp, 0.0, false).expect("routed");
    assert_eq!(prefill_name(&c, &d), "p0");
    // ...and leaves it above the limit, without pulling.
    report_queue(&mut c, "p0", 5_000.0, 0.0);
    let d = c.route(&inp, 0.0, false).expect("routed");
    assert_eq!(prefill_name(&c, &d), "p1");
    assert!(d.pull.is_none());
}

#[test]
fn hot_prefixes_on_loaded_holders_get_replication_hints() {
    let mut cfg = policy(Policy::GlobalCacheAware);
    cfg.hot.threshold = 3.0;
    cfg.ttft_slo_ms = None;
    // A network slower than recomputing: requests do not pull the prefix, so only a
    // background copy (the hint) can spread it.
    cfg.cost.network_gb_per_s = 1.0;
    let mut c = cluster(cfg, 3, 1);
    // Long enough that the instance computing it first stays the fastest for the requests
    // that follow (they wait for it instead of recomputing).
    let p = prefix(64, 15);
    store(&mut c, "n0", 1, &p);
    report_queue(&mut c, "p0", 8_000.0, 0.0);
    let inp = input(&mut c, &p);
    let mut hints = Vec::new();
    for i in 0..4 {
        let d = c.route(&inp, f64::from(i), true).expect("routed");
        if let Some(h) = d.hint {
            hints.push((h, d.prefill));
        }
    }
    let (hint, chosen) = hints.first().copied().expect("the prefix turned hot");
    assert_eq!(c.node_name(hint.from), "n0");
    let to = c.node_name(hint.to).to_owned();
    assert_eq!(to, "n2", "the idle node without the prefix");
    let chosen_node = c
        .registry()
        .get(chosen)
        .node
        .map(|n| c.node_name(n).to_owned());
    assert_ne!(
        Some(to),
        chosen_node,
        "the chosen instance gets the blocks anyway"
    );
    assert_eq!((hint.first_block, hint.blocks), (0, 64));
    assert_eq!(
        hints.len(),
        1,
        "the copy is predicted, so it is hinted once"
    );
    assert_eq!(c.stats().hints, 1);
}

#[test]
fn no_instances_is_503_not_429() {
    let mut c = cluster(policy(Policy::GlobalCacheAware), 0, 1);
    let inp = RouteInput {
        bucket: None,
        blocks: &[],
        input_tokens: 10,
        output_tokens: 1,
        slo: Slo::default(),
    };
    let r = c.route(&inp, 0.0, true).expect_err("nothing to route to");
    assert_eq!(r.reason, RejectReason::NoPrefillInstance);
    assert_eq!(r.reason.status(), 503);
    let mut c = cluster(policy(Policy::GlobalCacheAware), 1, 0);
    let r = c.route(&inp, 0.0, true).expect_err("nothing to decode on");
    assert_eq!(r.reason, RejectReason::NoDecodeInstance);
}

#[test]
fn silent_instances_are_not_routed_to() {
    let mut cfg = policy(Policy::GlobalCacheAware);
    cfg.instance_ttl_ms = Some(30_000.0);
    let mut c = cluster(cfg, 2, 1);
    let p = prefix(2, 16);
    store(&mut c, "n0", 1, &p);
    let inp = input(&mut c, &p);
    // p0 holds the prefix, but only p1 and d0 keep sending heartbeats.
    c.heartbeat("p1", 40_000.0).expect("known");
    c.heartbeat("d0", 40_000.0).expect("known");
    let d = c.route(&inp, 40_000.0, false).expect("routed");
    assert_eq!(prefill_name(&c, &d), "p1");
}

#[test]
fn wire_requests_hash_tokens_and_dry_runs_book_nothing() {
    let mut cfg = policy(Policy::GlobalCacheAware);
    cfg.block_tokens = 4;
    let mut c = cluster(cfg, 2, 1);
    let tokens: Vec<u32> = (0..10).collect();
    let hashes = yutu_api::block_hash::BlockHasher::new(4).hash_tokens(&tokens);
    store(&mut c, "n1", 1, &hashes);
    let req = RouteRequest {
        request_id: Some("r1".into()),
        bucket: BUCKET.into(),
        token_ids: Some(tokens),
        dry_run: true,
        ..RouteRequest::default()
    };
    let d = c.route_request(&req, 0.0).expect("routed");
    assert_eq!(d.request_id.as_deref(), Some("r1"));
    assert_eq!(d.prefill.instance, "p1");
    assert_eq!(d.prefill.node.as_deref(), Some("n1"));
    assert_eq!((d.blocks, d.cached_blocks), (2, 2));
    assert_eq!(d.policy, "global-cache-aware");
    assert_eq!(c.stats().routed, 0);
    assert_eq!(c.index().predicted_total(), 0);
    let bad = RouteRequest {
        bucket: BUCKET.into(),
        ..RouteRequest::default()
    };
    assert!(matches!(
        c.route_request(&bad, 0.0),
        Err(RouteError::BadRequest(_))
    ));
    // A rejection carries the reason, the prediction and the objective.
    report_queue(&mut c, "p0", 50_000.0, 0.0);
    report_queue(&mut c, "p1", 50_000.0, 0.0);
    let slow = RouteRequest {
        bucket: BUCKET.into(),
        input_length: Some(100),
        slo: Some(Slo {
            ttft_ms: Some(1_000.0),
            tbt_ms: None,
        }),
        ..RouteRequest::default()
    };
    match c.route_request(&slow, 0.0) {
        Err(RouteError::Rejected(r)) => {
            assert_eq!(r.reason, RejectReason::TtftSlo);
            assert_eq!(r.ttft_slo_ms, Some(1_000.0));
            assert!(r.message.contains("time to first token"));
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
}
