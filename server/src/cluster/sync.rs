//! Anti-entropy: each node brings its copies of the keys it owns up to the newest version
//! any other owner holds.
//!
//! A pass asks every other member, bucket by bucket and page by page, for the versions it
//! holds (objects and tombstones, [`VersionEntry`]) of the keys both own, and pulls what is
//! newer there: the object (with its metadata and version) or the delete. Pulling only is
//! enough: every node runs its own pass against every other, so a copy only one owner holds
//! reaches the others through their passes. What is applied goes through the same "newer
//! wins" rule as every replica write, so a pass racing a client write can never undo it.
//!
//! A node runs a pass when it (re)joins the cluster, after every membership change (once its
//! rebalancer has moved the keys the change gave new owners) and once more shortly after
//! such a pass (a member that came back may apply copies queued for it only after the others
//! passed against it), and every `--sync-interval-secs`. Until a pass has completed under
//! its current lease, the node is not *caught up* ([`Cluster::caught_up`]): it sends reads of
//! keys it owns to the other owners first, so a node that comes back with old data (a
//! restart, a pause longer than its lease, an empty memory tier) never answers with it.
//!
//! Between passes, hints (`hints.rs`) carry what a write's coordinator knows it could not
//! copy; this module's loop delivers them every [`TICK`].
//!
//! KV blocks written through the KV API are left out: they are a cache, put on every owner
//! by the client itself (see `yutu_client::kv`), not versioned across owners.
//!
//! Each pass lists every shared key once; fine for the key counts a node holds in DRAM and on
//! NVMe today. A Merkle tree per bucket (as Garage and Dynamo keep) would make an idle pass
//! cost a few hashes instead: not built yet.

use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use yutu_api::admin::{VersionEntry, VersionsPage, VersionsRequest};
use yutu_api::cluster::Member;

use super::{replica, Cluster, View};
use crate::model::listing::{ListItem, ListQuery};
use crate::model::Version;
use crate::node::Shard;

/// Keys per page of a versions listing.
pub const PAGE: usize = 512;
/// How often the loop checks whether a pass is due.
const TICK: Duration = Duration::from_millis(200);
/// How long after a failed pass the next one starts.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// After a pass made for a membership change (or a new lease), one more this long after it.
/// A member that comes back from a pause or a cut applies what was queued for it (a request
/// in its socket, a hint another node delivers once it is a member again) only as it runs
/// again, possibly after the others' passes against it; this second pass pulls those copies
/// instead of leaving them to the periodic pass (`--sync-interval-secs`).
const AFTER_CHANGE: Duration = Duration::from_secs(2);

/// Whether `me` and `partner` both own `bucket/key` in `view`.
fn shared(view: &View, bucket: &str, key: &str, me: &str, partner: &str) -> bool {
    view.owners(bucket, key)
        .is_some_and(|o| o.iter().any(|m| m.name == me) && o.iter().any(|m| m.name == partner))
}

/// One shard's part of a versions page: the entries (in key order) of keys after `after` it
/// holds, owned by both this node and `partner`, and the last key it looked at when it has
/// more after it (`None`: nothing more here).
pub fn shard_versions(
    shard: &Shard,
    view: &View,
    me: &str,
    req: &VersionsRequest,
) -> (Vec<VersionEntry>, Option<String>) {
    let limit = req.limit.clamp(1, PAGE);
    let objects: Vec<String> = shard
        .tier
        .list(
            &req.bucket,
            &ListQuery {
                prefix: String::new(),
                delimiter: None,
                after: req.after.clone(),
                limit,
            },
        )
        .unwrap_or_default()
        .into_iter()
        .filter_map(|i| match i {
            ListItem::Object { key, .. } => Some(key),
            ListItem::Prefix(_) => None,
        })
        .collect();
    let tombs = shard
        .tier
        .tombstones_after(&req.bucket, req.after.as_deref(), limit);
    // Each list stops at `limit`: keys past the first full list's last key are not known
    // to be complete, so the page ends there.
    let mut bound: Option<String> = None;
    if objects.len() >= limit {
        bound = objects.last().cloned();
    }
    if tombs.len() >= limit {
        let t = tombs.last().map(|(k, _)| k.clone());
        bound = match (bound, t) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    let within = |k: &str| bound.as_deref().is_none_or(|b| k <= b);
    let mut entries: Vec<VersionEntry> = Vec::new();
    for key in objects.into_iter().filter(|k| within(k)) {
        // KV blocks are cache entries their clients put on every owner themselves, each
        // owner stamping its own version: comparing them would copy every block once more.
        if !shared(view, &req.bucket, &key, me, &req.partner)
            || shard.tier.is_kv_block(&req.bucket, &key)
        {
            continue;
        }
        if let Some((version, deleted)) = shard.tier.version_of(&req.bucket, &key) {
            entries.push(VersionEntry {
                key,
                version,
                deleted,
            });
        }
    }
    for (key, version) in tombs.into_iter().filter(|(k, _)| within(k)) {
        if !shared(view, &req.bucket, &key, me, &req.partner) {
            continue;
        }
        match entries.iter_mut().find(|e| e.key == key) {
            Some(e) if e.version < version => {
                e.version = version;
                e.deleted = true;
            }
            Some(_) => {}
            None => entries.push(VersionEntry {
                key,
                version,
                deleted: true,
            }),
        }
    }
    entries.sort_by(|a, b| a.key.cmp(&b.key));
    (entries, bound)
}

/// Merges the shards' parts into the node's page: entries up to the smallest bound any shard
/// gave (beyond it some shard has not been read).
pub fn merge_pages(parts: Vec<(Vec<VersionEntry>, Option<String>)>) -> VersionsPage {
    let next = parts.iter().filter_map(|(_, b)| b.clone()).min();
    let mut entries: Vec<VersionEntry> = parts
        .into_iter()
        .flat_map(|(e, _)| e)
        .filter(|e| next.as_deref().is_none_or(|b| e.key.as_str() <= b))
        .collect();
    entries.sort_by(|a, b| a.key.cmp(&b.key));
    VersionsPage { entries, next }
}

/// How a pass ended.
#[derive(Debug, Default)]
struct Pass {
    /// Keys brought up to date (objects pulled, deletes applied).
    repaired: u64,
    /// Keys that could not be (a member unreachable, a copy refused): retried.
    failed: u64,
}

/// Runs on shard 0 until the node stops.
pub async fn run(shard: Rc<Shard>, cluster: Arc<Cluster>) {
    let interval = cluster.settings.sync_interval;
    let mut last_members: Option<Vec<Member>> = None;
    let mut last_pass: Option<Instant> = None;
    let mut last_epoch = 0;
    let mut again: Option<Instant> = None;
    loop {
        if shard.stop.sleep(TICK).await {
            return;
        }
        if cluster.writable().is_ok() {
            super::hints::deliver(&shard, &cluster).await;
        }
        let view = cluster.view();
        let epoch = cluster.lease_epoch();
        // A view without this node (read before it registered) owns it nothing: a pass then
        // would pull nothing and count as caught up.
        if view.member(&cluster.node).is_none() || cluster.writable().is_err() {
            continue;
        }
        // After a membership change the pass waits for the rebalancer to have moved the keys
        // (both walk every key, on the same cores; copies to new owners first). A node that
        // joined again (a new epoch) is not kept waiting: it catches up at once.
        let rebalanced =
            cluster.metrics.settled.load(Ordering::Relaxed) == super::members_digest(&view.members);
        let changed =
            (last_members.as_ref() != Some(&view.members) && rebalanced) || epoch != last_epoch;
        let due = changed
            || last_pass.is_none_or(|t| t.elapsed() >= interval)
            || again.is_some_and(|t| Instant::now() >= t);
        if !due {
            continue;
        }
        let started = Instant::now();
        let pass = pass(&shard, &cluster, &view).await;
        cluster
            .metrics
            .sync_pending
            .store(pass.failed, Ordering::Relaxed);
        cluster
            .metrics
            .synced_keys
            .fetch_add(pass.repaired, Ordering::Relaxed);
        let unchanged = cluster.view().members == view.members && cluster.lease_epoch() == epoch;
        if pass.failed == 0 && unchanged {
            if pass.repaired > 0 {
                tracing::info!(
                    repaired = pass.repaired,
                    millis = started.elapsed().as_millis() as u64,
                    "anti-entropy brought keys up to date"
                );
            }
            cluster.set_caught_up(epoch, super::members_digest(&view.members));
            last_members = Some(view.members.clone());
            last_epoch = epoch;
            last_pass = Some(Instant::now());
            again = changed.then(|| Instant::now() + AFTER_CHANGE);
        } else if pass.failed > 0 {
            tracing::warn!(
                failed = pass.failed,
                "anti-entropy could not bring every key up to date; trying again"
            );
            glommio::timer::sleep(RETRY_AFTER).await;
        }
    }
}

/// One pass against every other member, for every bucket with more than one replica.
async fn pass(shard: &Rc<Shard>, cluster: &Arc<Cluster>, view: &Arc<View>) -> Pass {
    let mut pass = Pass::default();
    let me = cluster.node.clone();
    for partner in view.members.iter().filter(|m| m.name != me) {
        for (bucket, config) in &view.buckets {
            if config.replicas < 2 {
                continue;
            }
            let mut after: Option<String> = None;
            loop {
                let req = VersionsRequest {
                    bucket: bucket.clone(),
                    after: after.clone(),
                    limit: PAGE,
                    partner: me.clone(),
                    revision: view.revision,
                };
                let page = match replica::versions(cluster, partner, &req).await {
                    Ok(p) => p,
                    Err(e) => {
                        tracing::debug!(partner = %partner.name, bucket, error = %e, "cannot list a member's versions");
                        pass.failed += 1;
                        break;
                    }
                };
                for entry in &page.entries {
                    if !shared(view, bucket, &entry.key, &me, &partner.name) {
                        continue;
                    }
                    match pull(shard, cluster, partner, bucket, entry).await {
                        Ok(true) => pass.repaired += 1,
                        Ok(false) => {}
                        Err(e) => {
                            tracing::debug!(key = %entry.key, error = %e, "anti-entropy could not pull a key");
                            pass.failed += 1;
                        }
                    }
                }
                match page.next {
                    Some(n) if after.as_deref() != Some(n.as_str()) => after = Some(n),
                    _ => break,
                }
            }
        }
    }
    pass
}

/// Brings one key up to `entry` when that is newer than the local copy; whether it did.
async fn pull(
    shard: &Rc<Shard>,
    cluster: &Arc<Cluster>,
    partner: &Member,
    bucket: &str,
    entry: &VersionEntry,
) -> Result<bool, replica::ReplicaError> {
    let owner = shard.owner(bucket, &entry.key);
    let (b, k) = (bucket.to_string(), entry.key.clone());
    let local: Option<(Version, bool)> = shard
        .run_step(owner, move |s| {
            crate::tier::Step::Done(s.tier.version_of(&b, &k))
        })
        .await
        .ok()
        .flatten();
    if local.is_some_and(|(v, _)| v >= entry.version) {
        return Ok(false);
    }
    let (b, k) = (bucket.to_string(), entry.key.clone());
    if entry.deleted {
        let v = entry.version;
        let applied = shard
            .run_step(owner, move |s| {
                s.tier.delete_versioned(b, vec![k], Some(v), None)
            })
            .await;
        return match applied {
            Ok(Ok(_)) => {
                cluster
                    .metrics
                    .synced_deletes
                    .fetch_add(1, Ordering::Relaxed);
                Ok(true)
            }
            _ => Err(replica::ReplicaError::Meta(
                "the local delete was refused".into(),
            )),
        };
    }
    let Some((meta, data)) = replica::fetch(cluster, partner, bucket, &entry.key).await? else {
        // Deleted there meanwhile: the next pass sees the tombstone.
        return Ok(false);
    };
    if local.is_some_and(|(v, _)| v >= meta.version) {
        return Ok(false);
    }
    cluster.throttle(data.len() as u64).await;
    let len = data.len() as u64;
    let applied = shard
        .run_step(owner, move |s| {
            s.tier.put(
                b,
                k,
                data,
                meta,
                crate::model::conditions::WriteConditions::default(),
            )
        })
        .await;
    match applied {
        Ok(Ok(_)) => {
            cluster
                .metrics
                .synced_bytes
                .fetch_add(len, Ordering::Relaxed);
            Ok(true)
        }
        Ok(Err(e)) => Err(replica::ReplicaError::Meta(format!(
            "the local copy was refused: {e}"
        ))),
        Err(e) => Err(replica::ReplicaError::Meta(format!(
            "the local copy failed: {e}"
        ))),
    }
}
