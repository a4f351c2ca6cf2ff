//! Lanes: one connection per shard of the node, for the calls whose keys one shard owns.
//!
//! A node is a set of shards that each own their keys; a connection lands on whichever shard
//! the kernel picks (the shards share the listening port), and a call for a key another shard
//! owns hops there and back. For a single-key call that hop is about half of its time on a
//! small VM (two thread wake-ups). Every answer names the shard that served it
//! ([`SHARD_HEADER`]), and placement is a public function of bucket and key
//! ([`shard_for`]), so the client keeps one agent per shard whose connection is known to end
//! there, found by opening connections until each shard has one (bounded), and checks every
//! answer: a lane whose connection was replaced and now ends elsewhere is dropped and found
//! again later. A call whose keys span shards, or whose lane is not found, takes the client's
//! ordinary agent. Nothing here changes what a call does, only which connection carries it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ureq::Agent;
use yutu_api::kv::{parse_shard_header, SHARD_HEADER};
use yutu_api::placement::shard_for;

/// Most shards given lanes: beyond that many connections per client the hop is the lesser
/// cost (and a node with more shards still serves every call through the ordinary agent).
pub(super) const MAX_LANES: usize = 64;
/// Connections opened in search of lanes, per shard, over the client's life: the kernel
/// spreads connections evenly, so a few per shard find them all.
const PROBES_PER_SHARD: usize = 8;
/// Connections opened in search of a lane by one call, at most.
const PROBES_PER_CALL: usize = 2;
/// How often the search budget is renewed: lanes are lost when the node closes an idle
/// connection, and a client lives for days.
const PROBE_REFILL: Duration = Duration::from_secs(60);

/// The lanes of one client.
pub(super) struct Lanes {
    shards: usize,
    slots: Mutex<Vec<Option<Agent>>>,
    probes_left: AtomicUsize,
    refilled: Mutex<Instant>,
}

/// The shard an answer came from, and the node's shard count, from its [`SHARD_HEADER`].
pub(super) fn served_by<B>(resp: &ureq::http::Response<B>) -> Option<(usize, usize)> {
    resp.headers()
        .get(SHARD_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(parse_shard_header)
}

impl Lanes {
    /// Lanes for a node of `shards` shards; `None` when there is one shard (no hop to save)
    /// or too many.
    pub(super) fn new(shards: usize) -> Option<Lanes> {
        (2..=MAX_LANES).contains(&shards).then(|| Lanes {
            shards,
            slots: Mutex::new(vec![None; shards]),
            probes_left: AtomicUsize::new(shards * PROBES_PER_SHARD),
            refilled: Mutex::new(Instant::now()),
        })
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, Vec<Option<Agent>>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The shard that owns every one of `keys`, if one does.
    pub(super) fn owner(&self, bucket: &str, keys: &[String]) -> Option<usize> {
        let first = shard_for(bucket, keys.first()?, self.shards);
        keys[1..]
            .iter()
            .all(|k| shard_for(bucket, k, self.shards) == first)
            .then_some(first)
    }

    /// The agent of `shard`'s lane. When there is none yet, opens up to
    /// [`PROBES_PER_CALL`] connections with `open` (which makes an agent, calls the node on
    /// it and answers the shard that served the call), keeping each in the lane of the shard
    /// it reached.
    pub(super) fn agent(
        &self,
        shard: usize,
        open: impl Fn() -> Option<(Agent, usize)>,
    ) -> Option<Agent> {
        if let Some(a) = self.slots().get(shard).cloned().flatten() {
            return Some(a);
        }
        if self.probes_left.load(Ordering::Relaxed) == 0 {
            let mut refilled = self.refilled.lock().unwrap_or_else(|p| p.into_inner());
            if refilled.elapsed() >= PROBE_REFILL {
                *refilled = Instant::now();
                self.probes_left
                    .store(self.shards * PROBES_PER_SHARD, Ordering::Relaxed);
            }
        }
        for _ in 0..PROBES_PER_CALL {
            let left = self.probes_left.load(Ordering::Relaxed);
            if left == 0
                || self
                    .probes_left
                    .compare_exchange(left, left - 1, Ordering::Relaxed, Ordering::Relaxed)
                    .is_err()
            {
                return None;
            }
            let (agent, reached) = open()?;
            let mut slots = self.slots();
            if let Some(slot @ None) = slots.get_mut(reached) {
                *slot = Some(agent.clone());
            }
            if reached == shard {
                return Some(agent);
            }
        }
        None
    }

    /// Checks the shard that answered a call sent on `shard`'s lane: when it is another, the
    /// lane's connection was replaced (the node closed an idle one), so the lane is dropped.
    pub(super) fn answered(&self, shard: usize, served: Option<(usize, usize)>) {
        if served.map(|(s, _)| s) != Some(shard) {
            if let Some(slot) = self.slots().get_mut(shard) {
                *slot = None;
            }
        }
    }

    /// Lanes that have a connection (for tests and diagnostics).
    pub(super) fn found(&self) -> usize {
        self.slots().iter().filter(|s| s.is_some()).count()
    }
}
