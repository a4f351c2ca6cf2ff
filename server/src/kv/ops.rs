//! The KV block operations as the owning shard runs them: leases with descriptors into its
//! arena, two-phase puts, and their publication (written through for `disk` buckets).

use std::rc::Rc;
use std::time::Duration;

use yutu_transfer::{Access, SegmentDescriptor};

use crate::model::StoreError;
use crate::node::Shard;
use crate::store::kv::BlockRef;
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
    let found = shard.tier.lease(lease_id, holder, bucket, keys, ttl)?;
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
    let mut out = Vec::with_capacity(items.len());
    for (i, (put_id, key, len)) in items.iter().enumerate() {
        // Each block's quota is held from its start to its end, so that the blocks of one
        // batch (on this shard and on the others) and of concurrent batches count together.
        let admitted = match shard.admit(bucket, &[(key, *len)]) {
            Ok(a) => a,
            Err(e) => {
                abandon(shard, &items[..i]);
                return Err((i, e));
            }
        };
        let started = shard
            .tier
            .put_start(*put_id, holder, bucket, key, *len, ttl);
        let desc = started.and_then(|(offset, grant)| {
            shard
                .transfer
                .as_ref()
                .and_then(|(_, seg)| seg.grant(offset, *len, Access::Write, grant).ok())
                .ok_or(StoreError::Device("no transfer engine".into()))
        });
        match desc {
            Ok(d) => {
                out.push(d);
                if admitted.holds() {
                    shard.kv_admitted.borrow_mut().insert(*put_id, admitted);
                }
            }
            Err(e) => {
                abandon(shard, &items[..i]);
                return Err((i, e));
            }
        }
    }
    Ok(out)
}

/// Pins `keys` of `bucket` by name (before they are stored, so no eviction comes in
/// between); why not, when the store refuses.
pub fn pin(
    shard: &Shard,
    bucket: &str,
    keys: &[String],
    kind: crate::store::pinning::AdminPin,
) -> Result<(), String> {
    shard
        .tier
        .pin_keys(bucket, keys, kind)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Gives back `holder`'s lease `lease_id`; whether it was still held.
pub fn release(shard: &Shard, lease_id: u64, holder: &str) -> bool {
    shard.tier.release_lease(lease_id, holder)
}

/// Revokes `holder`'s put `put_id` and gives back its quota; whether it was pending.
pub fn put_revoke(shard: &Shard, put_id: u64, holder: &str, bucket: &str) -> bool {
    let revoked = shard.tier.put_revoke_by(put_id, holder, bucket);
    if revoked {
        let released = shard.kv_admitted.borrow_mut().remove(&put_id);
        drop(released);
    }
    revoked
}

/// Revokes the puts of a batch started before one of its blocks failed, and gives back
/// their quota.
fn abandon(shard: &Shard, started: &[(u64, String, u64)]) {
    shard
        .tier
        .put_revoke_all(started.iter().map(|(id, _, _)| *id));
    // Dropped after the store's borrow ends: an admission reads the store when it goes.
    let released: Vec<_> = {
        let mut held = shard.kv_admitted.borrow_mut();
        started
            .iter()
            .filter_map(|(id, _, _)| held.remove(id))
            .collect()
    };
    drop(released);
}

/// Publishes `holder`'s puts into `bucket`, each under the key it names (a room's, which
/// this shard must own) or the one it started with; a `disk` bucket's block is on NVMe before
/// this answers.
pub async fn put_end(
    shard: Rc<Shard>,
    puts: Vec<(u64, Option<String>)>,
    holder: String,
    bucket: String,
) -> Vec<PutResult> {
    let ended: Vec<_> = puts
        .iter()
        .map(|(id, key)| match key {
            Some(k) if shard.owner(&bucket, k) != shard.id => Err(StoreError::PutKey(format!(
                "Key {k} belongs to shard {} of the node, not to the shard of put {id}: publish it through a room of its own shard.",
                shard.owner(&bucket, k)
            ))),
            _ => shard.tier.put_end(*id, &holder, &bucket, key.as_deref()),
        })
        .collect();
    let mut out = Vec::with_capacity(ended.len());
    for ((id, _), r) in puts.iter().zip(ended) {
        out.push(match r {
            Ok((bucket, key, staged)) => shard.tier.publish_staged(&bucket, &key, staged).await,
            Err(e) => Err(e),
        });
        // Published (or failed): the bytes count as stored now, or never; dropping the
        // admission republishes this shard's figure, then gives back the held bytes.
        let admitted = shard.kv_admitted.borrow_mut().remove(id);
        drop(admitted);
    }
    out
}

/// Reserves rooms of `lens` bytes for `holder` in `bucket` on this shard (puts started with
/// an empty key, which no object key is): as many as it can, in order, stopping at the first
/// refusal (a limit, the quota, a full arena).
pub fn reserve_rooms(
    shard: &Shard,
    holder: &str,
    bucket: &str,
    lens: &[u64],
    ttl: Duration,
) -> Vec<(u64, SegmentDescriptor)> {
    let mut rooms = Vec::with_capacity(lens.len());
    for &len in lens {
        let id = shard.kv_id_for(shard.id);
        match put_start(shard, holder, bucket, &[(id, String::new(), len)], ttl) {
            Ok(d) => match d.into_iter().next() {
                Some(d) => rooms.push((id, d)),
                None => break,
            },
            Err((_, e)) => {
                tracing::debug!(error = %e, "a room was not reserved");
                break;
            }
        }
    }
    rooms
}
