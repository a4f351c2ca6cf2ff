//! Hints: what a write's coordinator knows it could not copy. When an owner refuses or
//! misses a replica copy (the write is answered 503, but was applied on the coordinator), the
//! coordinator remembers (owner, key) and sends its current version of the key (object or
//! tombstone) again until the owner takes it, as Dynamo's hinted hand-off does; the
//! anti-entropy loop (`sync.rs`) calls [`deliver`] every tick. Hints are bounded
//! ([`HINTS_MAX`]); one dropped past the bound is repaired by the owner's next anti-entropy
//! pass.

use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use yutu_api::cluster::Member;

use super::{replica, Cluster};
use crate::node::Shard;

/// Most hints a node keeps.
pub const HINTS_MAX: usize = 65_536;

/// Copies owed to other owners: (member, bucket, key).
#[derive(Debug, Default)]
pub struct Hints {
    owed: std::collections::BTreeSet<(String, String, String)>,
}

impl Hints {
    /// Adds a hint; `false` when the limit is reached (the hint is dropped).
    pub fn add(&mut self, member: &str, bucket: &str, key: &str) -> bool {
        if self.owed.len() >= HINTS_MAX {
            return false;
        }
        self.owed
            .insert((member.to_string(), bucket.to_string(), key.to_string()));
        true
    }

    pub fn len(&self) -> usize {
        self.owed.len()
    }

    pub fn is_empty(&self) -> bool {
        self.owed.is_empty()
    }

    /// Up to `n` hints, in order.
    fn first(&self, n: usize) -> Vec<(String, String, String)> {
        self.owed.iter().take(n).cloned().collect()
    }

    fn remove(&mut self, hint: &(String, String, String)) {
        self.owed.remove(hint);
    }
}

/// Hints sent per tick at most.
const HINTS_PER_TICK: usize = 256;

/// Sends owed copies again; a member that fails one is left for the next tick.
pub(super) async fn deliver(shard: &Rc<Shard>, cluster: &Arc<Cluster>) {
    let batch = match cluster.hints.lock() {
        Ok(h) => h.first(HINTS_PER_TICK),
        Err(p) => p.into_inner().first(HINTS_PER_TICK),
    };
    if batch.is_empty() {
        return;
    }
    let view = cluster.view();
    let mut failed: Vec<String> = Vec::new();
    for hint in batch {
        let (member, bucket, key) = &hint;
        if failed.contains(member) {
            continue;
        }
        let done = match view.member(member) {
            // No longer a member: its keys have other owners now, which rebalancing and
            // anti-entropy serve.
            None => true,
            Some(to) => match resend(shard, cluster, to, bucket, key).await {
                Ok(()) => {
                    cluster
                        .metrics
                        .hints_delivered
                        .fetch_add(1, Ordering::Relaxed);
                    true
                }
                Err(e) => {
                    tracing::debug!(member, bucket, key, error = %e, "a hint could not be delivered yet");
                    failed.push(member.clone());
                    false
                }
            },
        };
        if done {
            match cluster.hints.lock() {
                Ok(mut h) => h.remove(&hint),
                Err(p) => p.into_inner().remove(&hint),
            }
        }
    }
}

/// Sends `to` this node's current version of `bucket/key`: the object, or its delete.
async fn resend(
    shard: &Rc<Shard>,
    cluster: &Arc<Cluster>,
    to: &Member,
    bucket: &str,
    key: &str,
) -> Result<(), replica::ReplicaError> {
    let owner = shard.owner(bucket, key);
    let (b, k) = (bucket.to_string(), key.to_string());
    let held = shard
        .run_step(owner, move |s| {
            crate::tier::Step::Done(s.tier.version_of(&b, &k))
        })
        .await
        .ok()
        .flatten();
    match held {
        None => Ok(()),
        Some((v, true)) => replica::remove(cluster, to, bucket, key, v).await,
        Some((_, false)) => {
            let (b, k) = (bucket.to_string(), key.to_string());
            let found = shard
                .run_step(owner, move |s| {
                    s.tier.get(
                        b,
                        k,
                        None,
                        false,
                        crate::model::conditions::ReadConditions::default(),
                    )
                })
                .await;
            match found {
                Ok(Ok((meta, _, data))) => {
                    replica::push(cluster, to, bucket, key, &meta, data, false)
                        .await
                        .map(|_| ())
                }
                // Gone meanwhile: the delete's own copies (or hints) cover it.
                _ => Ok(()),
            }
        }
    }
}
