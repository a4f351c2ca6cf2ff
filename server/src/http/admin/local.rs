//! This node's part of the storage admin calls (`/admin/v1/local/...`): its numbers, and
//! evicting, pinning and replicating the copies it holds itself.

use std::time::{Duration, Instant};

use yutu_api::admin::{
    EvictRequest, EvictResponse, LocalListEntry, LocalListRequest, NodeState, NodeStats,
    PinRequest, PinResponse, ReplicateRequest, ReplicateResponse, ShardStats, Usage,
};
use yutu_api::S3ErrorCode;

use crate::cluster::replica;
use crate::http::ctx::Ctx;
use crate::http::error::S3Error;
use crate::model::conditions::ReadConditions;
use crate::model::listing::{ListItem, ListQuery};
use crate::model::StoreError;
use crate::node::Shard;
use crate::store::pinning::{AdminPin, MAX_PINS};

/// Keys read from the index per step of a prefix walk.
const PAGE: usize = 512;

/// This node's numbers, per shard.
pub async fn stats(ctx: &Ctx) -> Result<NodeStats, S3Error> {
    let shards = ctx
        .shard
        .broadcast(|s| {
            let m = &s.metrics;
            ShardStats {
                shard: s.id,
                dram: Usage {
                    used: m.dram_used.get(),
                    capacity: m.dram_capacity.get(),
                },
                nvme: Usage {
                    used: m.nvme_used.get(),
                    capacity: m.nvme_capacity.get(),
                },
                objects: m.objects.get() + m.nvme_objects.get(),
                dram_hits: m.dram_hits.get(),
                nvme_hits: m.nvme_hits.get(),
                misses: m.misses.get(),
                evictions: m.evictions.get(),
                demotions: m.demotions.get(),
                pinned: s.tier.pin_count(),
            }
        })
        .await?;
    let settings = &ctx.shard.settings;
    let mut out = NodeStats {
        name: settings.node_name.clone(),
        url: settings.advertise_url.clone().unwrap_or_default(),
        zone: None,
        state: NodeState::Up,
        shards,
        rebalancing: false,
        settled: false,
        rereplicated_keys: 0,
        rereplicated_bytes: 0,
        under_replicated: 0,
        handed_off: 0,
        reason: None,
    };
    if let Some(cluster) = &ctx.cluster {
        use std::sync::atomic::Ordering::Relaxed;
        let view = cluster.view();
        if let Some(me) = view.member(&cluster.node) {
            out.url = me.url.clone();
            out.zone = me.zone.clone();
            if me.draining {
                out.state = if out.objects() == 0 {
                    NodeState::Drained
                } else {
                    NodeState::Draining
                };
            }
        }
        let m = &cluster.metrics;
        out.rebalancing = m.rebalancing.load(Relaxed) > 0;
        // Settled against the membership this answer reports, not an older one.
        // And caught up: anti-entropy has brought its copies to the other owners' versions.
        out.settled = !out.rebalancing
            && m.settled.load(Relaxed) == crate::cluster::members_digest(&view.members)
            && cluster.caught_up()
            && cluster.synced_with_members()
            && m.sync_pending.load(Relaxed) == 0
            && cluster.hints_pending() == 0;
        out.rereplicated_keys = m.rereplicated_keys.load(Relaxed);
        out.rereplicated_bytes = m.rereplicated_bytes.load(Relaxed);
        // Keys a copy to an owner is still owed for: moves the rebalancer retries, and keys
        // (or members) anti-entropy could not bring up to date yet.
        out.under_replicated =
            m.pending_moves.load(Relaxed) + m.sync_pending.load(Relaxed) + cluster.hints_pending();
        out.handed_off = m.handed_off.load(Relaxed);
    }
    Ok(out)
}

/// Every key of `bucket` under `prefix` that shard `s` holds (DRAM and NVMe), page by page.
fn page(s: &Shard, bucket: &str, prefix: &str, after: &Option<String>) -> Vec<(String, u64)> {
    s.tier
        .list(
            bucket,
            &ListQuery {
                prefix: prefix.to_string(),
                delimiter: None,
                after: after.clone(),
                limit: PAGE,
            },
        )
        .unwrap_or_default()
        .into_iter()
        .filter_map(|i| match i {
            ListItem::Object { key, size, .. } => Some((key, size)),
            _ => None,
        })
        .collect()
}

pub async fn evict(ctx: &Ctx, req: EvictRequest) -> Result<EvictResponse, S3Error> {
    let mut out = EvictResponse::default();
    if let Some(bytes) = req.free_bytes {
        let share = bytes.div_ceil(ctx.shard.nshards as u64);
        let freed = ctx
            .shard
            .broadcast(move |s| s.tier.free_bytes(share))
            .await?;
        for (objects, b) in freed {
            out.objects += objects;
            out.bytes += b;
        }
        return Ok(out);
    }
    let Some(bucket) = req.bucket else {
        return Ok(out);
    };
    if !ctx.shard.tier.bucket_exists(&bucket) {
        return Ok(out);
    }
    let prefix = req.prefix.unwrap_or_default();
    for shard in 0..ctx.shard.nshards {
        if let Some(k) = &req.key {
            if ctx.shard.owner(&bucket, k) != shard {
                continue;
            }
        }
        let (b, key, p) = (bucket.clone(), req.key.clone(), prefix.clone());
        let part = ctx
            .shard
            .run_async(shard, move |s| async move {
                let mut part = EvictResponse::default();
                let mut after = None;
                loop {
                    let keys = match &key {
                        Some(k) => page(&s, &b, k, &None)
                            .into_iter()
                            .filter(|(x, _)| x == k)
                            .collect(),
                        None => page(&s, &b, &p, &after),
                    };
                    let Some(last) = keys.last() else { break };
                    after = Some(last.0.clone());
                    let done = key.is_some() || keys.len() < PAGE;
                    let (pinned, free): (Vec<_>, Vec<_>) = keys
                        .into_iter()
                        .partition(|(k, _)| s.tier.hard_pinned(&b, k));
                    part.pinned_skipped += pinned.len() as u64;
                    let names: Vec<String> = free.iter().map(|(k, _)| k.clone()).collect();
                    if !names.is_empty() {
                        let removed = s.tier.delete(b.clone(), names).get().await;
                        if let Ok(removed) = removed {
                            for ((_, size), r) in free.iter().zip(removed) {
                                if r {
                                    part.objects += 1;
                                    part.bytes += size;
                                }
                            }
                        }
                    }
                    if done {
                        break;
                    }
                }
                part
            })
            .await?;
        out.objects += part.objects;
        out.bytes += part.bytes;
        out.pinned_skipped += part.pinned_skipped;
    }
    Ok(out)
}

pub async fn pin(ctx: &Ctx, req: PinRequest, pinning: bool) -> Result<PinResponse, S3Error> {
    let kind = match req.ttl_secs {
        Some(secs) => AdminPin::Soft(Instant::now() + Duration::from_secs(secs)),
        None => AdminPin::Hard,
    };
    let mut out = PinResponse::default();
    for shard in 0..ctx.shard.nshards {
        if let Some(k) = &req.key {
            if ctx.shard.owner(&req.bucket, k) != shard {
                continue;
            }
        }
        let (b, key, prefix) = (req.bucket.clone(), req.key.clone(), req.prefix.clone());
        let n = ctx
            .shard
            .run(shard, move |s| {
                let pin = pinning.then_some(kind);
                s.tier
                    .pin_or_unpin(&b, key.as_deref(), prefix.as_deref(), pin, MAX_PINS)
            })
            .await?;
        out.keys += n.map_err(|e: StoreError| {
            S3Error::new(S3ErrorCode::InvalidRequest).msg(e.to_string())
        })?;
    }
    Ok(out)
}

pub async fn replicate(ctx: &Ctx, req: ReplicateRequest) -> Result<ReplicateResponse, S3Error> {
    let Some(cluster) = ctx.cluster.clone() else {
        return Ok(ReplicateResponse::default());
    };
    if !ctx.shard.tier.bucket_exists(&req.bucket) {
        return Ok(ReplicateResponse::default());
    }
    let view = cluster.view();
    let mut out = ReplicateResponse::default();
    let prefix = req.prefix.clone().unwrap_or_default();
    for shard in 0..ctx.shard.nshards {
        if let Some(k) = &req.key {
            if ctx.shard.owner(&req.bucket, k) != shard {
                continue;
            }
        }
        let (req, prefix, cluster, view) =
            (req.clone(), prefix.clone(), cluster.clone(), view.clone());
        let part = ctx
            .shard
            .run_async(shard, move |s| async move {
                let mut part = ReplicateResponse::default();
                let b = &req.bucket;
                let mut after = None;
                loop {
                    let keys: Vec<(String, u64)> = match &req.key {
                        Some(k) => page(&s, b, k, &None)
                            .into_iter()
                            .filter(|(x, _)| x == k)
                            .collect(),
                        None => page(&s, b, &prefix, &after),
                    };
                    let Some(last) = keys.last() else { break };
                    after = Some(last.0.clone());
                    let done = req.key.is_some() || keys.len() < PAGE;
                    for (key, _) in &keys {
                        // A key held on several nodes is counted once: by the first of its
                        // owners that holds it here (or by any holder when no owner is up).
                        let order =
                            yutu_api::cluster::owners(b, key, &view.members, view.members.len());
                        let first_owner = order.first().map(|&i| view.members[i].name.as_str());
                        if first_owner == Some(cluster.node.as_str()) || first_owner.is_none() {
                            part.keys += 1;
                        }
                        let targets: Vec<usize> = match (&req.node, req.replicas) {
                            (Some(node), _) => view
                                .members
                                .iter()
                                .position(|m| &m.name == node)
                                .into_iter()
                                .collect(),
                            (None, Some(n)) => {
                                yutu_api::cluster::owners(b, key, &view.members, view.members.len())
                                    .into_iter()
                                    .take(n as usize)
                                    .collect()
                            }
                            (None, None) => Vec::new(),
                        };
                        let mut data = None;
                        for t in targets {
                            let member = &view.members[t];
                            if member.name == cluster.node {
                                continue;
                            }
                            if matches!(replica::holds(&cluster, member, b, key).await, Ok(true)) {
                                continue;
                            }
                            if data.is_none() {
                                let (bb, kk) = (b.clone(), key.clone());
                                let got = s
                                    .run_step(s.id, move |s| {
                                        s.tier.get(bb, kk, None, false, ReadConditions::default())
                                    })
                                    .await;
                                match got {
                                    Ok(Ok((meta, _, bytes))) => data = Some((meta, bytes)),
                                    _ => break,
                                }
                            }
                            if let Some((meta, bytes)) = &data {
                                // Counted only where this call made the copy (another holder
                                // may have made it first).
                                let made = replica::push(
                                    &cluster,
                                    member,
                                    b,
                                    key,
                                    meta,
                                    bytes.clone(),
                                    true,
                                )
                                .await;
                                if let Ok(true) = made {
                                    part.copies += 1;
                                    part.bytes += bytes.len() as u64;
                                }
                            }
                        }
                    }
                    if done {
                        break;
                    }
                }
                part
            })
            .await?;
        out.keys += part.keys;
        out.copies += part.copies;
        out.bytes += part.bytes;
    }
    Ok(out)
}

/// This node's page of a bucket listing.
pub async fn list(ctx: &Ctx, req: LocalListRequest) -> Result<Vec<LocalListEntry>, S3Error> {
    if !ctx.shard.tier.bucket_exists(&req.bucket) {
        return Err(S3Error::new(S3ErrorCode::NoSuchBucket));
    }
    let query = ListQuery {
        prefix: req.prefix,
        delimiter: req.delimiter,
        after: req.after,
        limit: req.limit.min(crate::http::s3::buckets::MAX_KEYS),
    };
    let limit = query.limit;
    let bucket = req.bucket;
    let pages = ctx
        .shard
        .broadcast(move |s| s.tier.list(&bucket, &query))
        .await?;
    let pages = pages.into_iter().collect::<Result<Vec<_>, _>>()?;
    let (items, _) = crate::model::listing::merge(pages, limit + 1);
    Ok(items
        .into_iter()
        .map(|i| match i {
            ListItem::Object {
                key,
                size,
                etag,
                last_modified,
            } => LocalListEntry {
                name: key,
                prefix: false,
                size,
                etag,
                modified_ms: last_modified
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64),
            },
            ListItem::Prefix(p) => LocalListEntry {
                name: p,
                prefix: true,
                ..LocalListEntry::default()
            },
        })
        .collect())
}

/// The versions this node holds of a page of keys it owns with the node asking
/// (anti-entropy, [`crate::cluster::sync`]).
pub async fn versions(
    ctx: &Ctx,
    req: yutu_api::admin::VersionsRequest,
) -> Result<yutu_api::admin::VersionsPage, S3Error> {
    let Some(cluster) = ctx.cluster.clone() else {
        return Err(S3Error::new(S3ErrorCode::InvalidRequest)
            .msg("Versions are compared between the nodes of a cluster."));
    };
    if !ctx.shard.tier.bucket_exists(&req.bucket) {
        return Err(S3Error::new(S3ErrorCode::NoSuchBucket));
    }
    let view = cluster.view();
    // The asker pulls what it is shown: shown less than what it owns (this node's view not
    // having it as a member yet, or another member less), it would count itself caught up
    // with keys still old.
    if view.revision < req.revision || view.member(&req.partner).is_none() {
        return Err(S3Error::new(S3ErrorCode::ServiceUnavailable).msg(format!(
            "This node's view of the cluster (etcd revision {}) is older than {}'s ({}); ask again.",
            view.revision, req.partner, req.revision
        )));
    }
    let me = cluster.node.clone();
    let parts = ctx
        .shard
        .broadcast(move |s| crate::cluster::sync::shard_versions(s, &view, &me, &req))
        .await?;
    Ok(crate::cluster::sync::merge_pages(parts))
}
