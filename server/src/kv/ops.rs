//! The KV block operations as the owning shard runs them: leases with descriptors into its
//! arena, two-phase puts, and their publication (written through for `disk` buckets).

use std::rc::Rc;
use std::time::Duration;

use yutu_transfer::{Access, SegmentDescriptor};

use crate::engine::kv::BlockRef;
use crate::model::StoreError;
use crate::node::Shard;
use crate::tier::PutResult;

/// Per key, the leased block and its descriptor (`None`: not in DRAM).
pub type Leased = Vec<Option<(BlockRef, SegmentDescriptor)>>;

/// Leases `keys` of `bucket` for `holder` under `lease_id`, with descriptors of their ranges.
pub fn lease(
    shard: &Shard,
    lease_id: u64,
    holder: &str,
    bucket: &str,
    keys: &[String],
    ttl: Duration,
) -> Result<Leased, StoreError> {
    let found = shard
        .tier
        .store
        .borrow_mut()
        .lease(lease_id, holder, bucket, keys, ttl)?;
    // A block named several times gets one descriptor, minted once.
    let mut minted: std::collections::HashMap<u64, SegmentDescriptor> = Default::default();
    Ok(found
        .into_iter()
        .map(|b| {
            let b = b?;
            let (_, seg) = shard.transfer.as_ref()?;
            let d = match minted.get(&b.offset) {
                Some(d) => *d,
                None => {
                    let d = seg.grant(b.offset, b.len, Access::Read, b.grant).ok()?;
                    minted.insert(b.offset, d);
                    d
                }
            };
            Some((b, d))
        })
        .collect())
}

/// Starts a batch of puts on this shard, `(put id, key, length)` each: all or none. On an
/// error the ones already started are revoked and the failing index is returned.
pub fn put_start(
    shard: &Shard,
    holder: &str,
    bucket: &str,
    items: &[(u64, String, u64)],
    ttl: Duration,
) -> Result<Vec<SegmentDescriptor>, (usize, StoreError)> {
    // The bucket's quota is checked for the blocks together now; their bytes count once the
    // puts end (a put started and not ended holds DRAM, bounded by the per-user KV limits,
    // not quota).
    let writes: Vec<(&str, u64)> = items.iter().map(|(_, k, len)| (k.as_str(), *len)).collect();
    if let Err(e) = shard.admit(bucket, &writes) {
        return Err((0, e));
    }
    let mut out = Vec::with_capacity(items.len());
    for (i, (put_id, key, len)) in items.iter().enumerate() {
        let started = shard
            .tier
            .store
            .borrow_mut()
            .put_start(*put_id, holder, bucket, key, *len, ttl);
        let desc = started.and_then(|(offset, grant)| {
            shard
                .transfer
                .as_ref()
                .and_then(|(_, seg)| seg.grant(offset, *len, Access::Write, grant).ok())
                .ok_or(StoreError::Device("no transfer engine".into()))
        });
        match desc {
            Ok(d) => out.push(d),
            Err(e) => {
                let mut store = shard.tier.store.borrow_mut();
                for (put_id, _, _) in &items[..i] {
                    store.put_revoke(*put_id);
                }
                return Err((i, e));
            }
        }
    }
    Ok(out)
}

/// Publishes `holder`'s puts; a `disk` bucket's block is on NVMe before this answers.
pub async fn put_end(shard: Rc<Shard>, put_ids: Vec<u64>, holder: String) -> Vec<PutResult> {
    let ended: Vec<_> = put_ids
        .iter()
        .map(|id| shard.tier.store.borrow_mut().put_end_by(*id, &holder))
        .collect();
    let mut out = Vec::with_capacity(ended.len());
    let mut buckets = std::collections::BTreeSet::new();
    for r in ended {
        out.push(match r {
            Ok((bucket, key, staged)) => {
                let r = shard.tier.publish_staged(&bucket, &key, staged).await;
                buckets.insert(bucket);
                r
            }
            Err(e) => Err(e),
        });
    }
    // The other shards see these bytes at once, not at the next periodic publication.
    for b in buckets {
        shard.note_usage(&b);
    }
    out
}
