//! Moving keys after the membership changes: re-replication, hand-off, drain.
//!
//! When the members change (a node's lease expired, a node joined or came back, a node is
//! being drained), each node walks the keys of cluster buckets it holds, shard by shard, and
//! compares each key's owners before and after ([`yutu_api::cluster::owners`]). Only keys
//! whose owners changed are touched:
//! - a new owner that did not hold the key gets a copy from the first old owner still alive
//!   (one sender per key, no coordination needed: every node computes the same order). A node
//!   holding a key it did not own before (a node that came back with data) copies it only to
//!   owners that do not hold it already;
//! - a node that is no longer an owner drops its copy once every owner confirms it holds the
//!   key: this is how a drained node empties and how a returning node keeps only what it owns.
//!
//! The copies are rate-limited (`--rereplicate-rate`, bytes per second for the node) and
//! counted in metrics and in the node's admin status. A pass that is overtaken by another
//! change, or that could not reach an owner, is run again; the membership it completed
//! against is what the next pass compares with.

use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use yutu_api::cluster::Member;

use super::{replica, Cluster, View};
use crate::model::conditions::ReadConditions;
use crate::model::listing::{ListItem, ListQuery};
use crate::node::Shard;

/// Keys read from the index per step of a walk.
const PAGE: usize = 256;
/// How often the rebalancer compares the membership with the last one it completed.
const CHECK_INTERVAL: Duration = Duration::from_millis(250);
/// How long after a failed pass the next one starts.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// How a pass over one shard ended.
#[derive(Debug, Default, Clone, Copy)]
struct Pass {
    /// The membership changed again meanwhile.
    overtaken: bool,
    /// Some copy or drop could not be done (an owner unreachable).
    failed: u64,
}

fn names(members: &[Member], idx: &[usize]) -> Vec<String> {
    idx.iter().map(|&i| members[i].name.clone()).collect()
}

/// Runs on shard 0 until the node stops.
pub async fn run(shard: Rc<Shard>, cluster: Arc<Cluster>) {
    // Before the first pass nothing was owned: every key held is checked once (the data a
    // node brings back after a restart).
    let mut done: Option<Vec<Member>> = None;
    loop {
        if shard.stop.sleep(CHECK_INTERVAL).await {
            return;
        }
        let target = cluster.view();
        if target.members.is_empty() {
            continue;
        }
        if done.as_ref() == Some(&target.members) {
            let digest = super::members_digest(&target.members);
            cluster.metrics.settled.store(digest, Ordering::Relaxed);
            continue;
        }
        cluster.metrics.settled.store(0, Ordering::Relaxed);
        // Only a node sure of its place moves keys.
        if cluster.writable().is_err() {
            continue;
        }
        let old = done.clone().unwrap_or_default();
        cluster.metrics.rebalancing.store(1, Ordering::Relaxed);
        let started = Instant::now();
        let mut total = Pass::default();
        for i in 0..shard.nshards {
            let (c, o, t) = (cluster.clone(), old.clone(), target.clone());
            match shard
                .run_async(i, move |s| async move { walk(&s, &c, &o, &t).await })
                .await
            {
                Ok(p) => {
                    total.overtaken |= p.overtaken;
                    total.failed += p.failed;
                }
                Err(_) => total.failed += 1,
            }
            if total.overtaken {
                break;
            }
        }
        cluster.metrics.rebalancing.store(0, Ordering::Relaxed);
        cluster
            .metrics
            .pending_moves
            .store(total.failed, Ordering::Relaxed);
        if !total.overtaken && total.failed == 0 {
            tracing::info!(
                members = target.members.len(),
                millis = started.elapsed().as_millis() as u64,
                "rebalanced after a membership change"
            );
            done = Some(target.members.clone());
        } else if total.failed > 0 {
            tracing::warn!(
                failed = total.failed,
                "some keys could not be moved; trying again"
            );
            glommio::timer::sleep(RETRY_AFTER).await;
        }
    }
}

/// One pass over this shard's keys of every cluster bucket.
async fn walk(shard: &Rc<Shard>, cluster: &Cluster, old: &[Member], target: &View) -> Pass {
    let mut pass = Pass::default();
    let me = cluster.node.as_str();
    for (bucket, config) in &target.buckets {
        let n = config.replicas as usize;
        let mut after: Option<String> = None;
        loop {
            let page = shard.tier.list(
                bucket,
                &ListQuery {
                    prefix: String::new(),
                    delimiter: None,
                    after: after.clone(),
                    limit: PAGE,
                },
            );
            let Ok(page) = page else { break };
            if page.is_empty() {
                break;
            }
            for item in &page {
                let ListItem::Object { key, .. } = item else {
                    continue;
                };
                after = Some(key.clone());
                if cluster.view().members != target.members {
                    pass.overtaken = true;
                    return pass;
                }
                let new_o = names(
                    &target.members,
                    &yutu_api::cluster::owners(bucket, key, &target.members, n),
                );
                let old_o = names(old, &yutu_api::cluster::owners(bucket, key, old, n));
                // Unchanged owners: nothing to do, unless this node holds a copy it does not
                // own (an extra copy, or a drain in progress), which goes once the owners
                // hold the key.
                if !old.is_empty() && new_o == old_o && new_o.iter().any(|o| o == me) {
                    continue;
                }
                if !move_key(shard, cluster, target, bucket, key, me, &old_o, &new_o).await {
                    pass.failed += 1;
                }
            }
            if page.len() < PAGE {
                break;
            }
        }
    }
    pass
}

/// Copies one key to the new owners that need it and drops it here if this node is no
/// longer an owner; whether all of it was done.
#[allow(clippy::too_many_arguments)]
async fn move_key(
    shard: &Rc<Shard>,
    cluster: &Cluster,
    target: &View,
    bucket: &str,
    key: &str,
    me: &str,
    old_o: &[String],
    new_o: &[String],
) -> bool {
    let alive_old: Vec<&String> = old_o
        .iter()
        .filter(|o| target.member(o).is_some())
        .collect();
    let designated = alive_old.first().is_some_and(|o| *o == me);
    let stray = !old_o.iter().any(|o| o == me);
    let mut ok = true;
    // The version held here: an owner holding it or a newer one needs no copy. Copies are
    // sent whatever the owner holds and applied there only when newer ("last writer wins"),
    // so a copy never replaces a newer write the owner took meanwhile.
    let (b, k) = (bucket.to_string(), key.to_string());
    let mine = match shard
        .run_step(shard.id, move |s| {
            crate::tier::Step::Done(s.tier.version_of(&b, &k))
        })
        .await
    {
        Ok(Some((v, false))) => v,
        // Gone meanwhile (deleted or only a tombstone left): nothing to move.
        Ok(_) => return true,
        Err(_) => return false,
    };
    let mut data = None;
    for t in new_o.iter().filter(|t| *t != me && !alive_old.contains(t)) {
        if !designated && !stray {
            // Another old owner sends it.
            continue;
        }
        let Some(member) = target.member(t) else {
            continue;
        };
        if !designated {
            match replica::held_version(cluster, member, bucket, key).await {
                Ok(Some(v)) if v >= mine => continue,
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "cannot ask an owner");
                    ok = false;
                    continue;
                }
            }
        }
        if data.is_none() {
            let (b, k) = (bucket.to_string(), key.to_string());
            match shard
                .run_step(shard.id, move |s| {
                    s.tier.get(b, k, None, false, ReadConditions::default())
                })
                .await
            {
                Ok(Ok((meta, _, bytes))) => data = Some((meta, bytes)),
                // Gone meanwhile: nothing to move.
                _ => return true,
            }
        }
        let Some((meta, bytes)) = &data else {
            return true;
        };
        cluster.throttle(bytes.len() as u64).await;
        match replica::push(cluster, member, bucket, key, meta, bytes.clone(), false).await {
            Ok(false) => {}
            Ok(true) => {
                cluster
                    .metrics
                    .rereplicated_keys
                    .fetch_add(1, Ordering::Relaxed);
                cluster
                    .metrics
                    .rereplicated_bytes
                    .fetch_add(bytes.len() as u64, Ordering::Relaxed);
            }
            Err(e) => {
                tracing::debug!(error = %e, bucket, key, "re-replication failed");
                cluster
                    .metrics
                    .rereplication_failures
                    .fetch_add(1, Ordering::Relaxed);
                ok = false;
            }
        }
    }
    if new_o.iter().any(|o| o == me) || new_o.is_empty() || !ok {
        return ok;
    }
    // No longer an owner: drop the copy once every owner holds the key.
    for t in new_o {
        let Some(member) = target.member(t) else {
            return false;
        };
        match replica::held_version(cluster, member, bucket, key).await {
            Ok(Some(v)) if v >= mine => {}
            Ok(_) => {
                // Not there (this node was not the one to send it): send it now.
                let (b, k) = (bucket.to_string(), key.to_string());
                let Ok(Ok((meta, _, bytes))) = shard
                    .run_step(shard.id, move |s| {
                        s.tier.get(b, k, None, false, ReadConditions::default())
                    })
                    .await
                else {
                    return true;
                };
                cluster.throttle(bytes.len() as u64).await;
                if replica::push(cluster, member, bucket, key, &meta, bytes, false)
                    .await
                    .is_err()
                {
                    return false;
                }
            }
            Err(_) => return false,
        }
    }
    let (b, k) = (bucket.to_string(), key.to_string());
    // Only the version the owners confirmed: a newer write that reached this node meanwhile
    // stays until the next pass has its owners hold it.
    match shard
        .run_step(shard.id, move |s| s.tier.drop_copy(b, k, mine))
        .await
    {
        Ok(Ok(_)) => {
            cluster.metrics.handed_off.fetch_add(1, Ordering::Relaxed);
            true
        }
        _ => false,
    }
}
