//! The KV control calls over the shards that own their keys: existence, removal, leases
//! (`get`), two-phase puts (start, end, revoke) and releases. The request layer parses a
//! call and answers what these return; HTTP/JSON and binary frames share them.

use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use yutu_api::kv::{
    GetResponse, KeysRequest, LeasedBlock, PublishRequest, PublishResponse, PutIdsRequest,
    PutStartRequest, PutStartResponse, ReleaseRequest, ReleaseResponse, RevokeResponse, Room,
    StartedPut, DEFAULT_TTL_MS, MAX_BATCH, MAX_ROOMS, MAX_TTL_MS,
};
use yutu_api::validate_object_key;
use yutu_transfer::SegmentDescriptor;

use crate::kv::error::KvError;
use crate::kv::ops;
use crate::kv::owners::{pick, Owners};
use crate::kv::Caller;
use crate::model::StoreError;
use crate::node::Shard;
use crate::store::kv::BlockRef;
use crate::tier::Step;

/// [`DEFAULT_TTL_MS`]: the lifetime of the leases and puts the node takes for get-into and
/// put-from.
pub const DEFAULT_TTL: Duration = Duration::from_millis(DEFAULT_TTL_MS);

/// The lifetime a request asks (`ttl_ms`, [`DEFAULT_TTL_MS`] when absent), in milliseconds.
pub fn ttl_ms(ms: Option<u64>) -> Result<u64, KvError> {
    match ms.unwrap_or(DEFAULT_TTL_MS) {
        ms @ 1..=MAX_TTL_MS => Ok(ms),
        _ => Err(KvError::invalid(format!(
            "ttl_ms must be between 1 and {MAX_TTL_MS}."
        ))),
    }
}

/// A batch names 1 to [`MAX_BATCH`] valid object keys.
pub fn check_keys(keys: &[String]) -> Result<(), KvError> {
    if keys.is_empty() || keys.len() > MAX_BATCH {
        return Err(KvError::invalid(format!(
            "A batch names 1 to {MAX_BATCH} keys."
        )));
    }
    keys.iter()
        .try_for_each(|k| validate_object_key(k).map_err(KvError::from))
}

/// Refuses blocks (`(key, length)`) larger than an object may be.
pub fn check_lens<'a>(
    here: &Shard,
    blocks: impl IntoIterator<Item = (&'a str, u64)>,
) -> Result<(), KvError> {
    let (limit, what) = here.object_limit();
    match blocks.into_iter().find(|b| b.1 > limit) {
        Some((key, _)) => Err(KvError::TooLarge(format!(
            "Block {key} exceeds {what} of {limit} bytes."
        ))),
        None => Ok(()),
    }
}

/// Whether each of `keys` is stored.
pub async fn exists(here: &Rc<Shard>, bucket: &str, keys: &[String]) -> Result<Vec<bool>, KvError> {
    check_keys(keys)?;
    exists_by(here, bucket, keys, &Owners::of_keys(here, bucket, keys)).await
}

/// [`exists`] of keys already checked, whose `owners` the caller has found (a put of absent
/// keys goes on to store them with the same owners: each key is hashed once).
pub async fn exists_by(
    here: &Rc<Shard>,
    bucket: &str,
    keys: &[String],
    owners: &Owners,
) -> Result<Vec<bool>, KvError> {
    if owners.only(here.id) {
        // All here (a client that sends each call to its keys' shard): no job, no copies.
        return Ok(here.tier.exists(bucket, keys)?);
    }
    let b = bucket.to_string();
    let answers = owners
        .run(
            here,
            |idx| pick(keys, idx),
            move |s, ks| Step::Done(s.tier.exists(&b, &ks)),
        )
        .await;
    Ok(owners.gather(flatten(answers)?))
}

/// How many of `keys`, from the first, are stored.
pub async fn prefix(here: &Rc<Shard>, bucket: &str, keys: &[String]) -> Result<u64, KvError> {
    let found = exists(here, bucket, keys).await?;
    Ok(found.iter().take_while(|f| **f).count() as u64)
}

/// Removes `keys`; whether each was there.
pub async fn remove(here: &Rc<Shard>, bucket: &str, keys: &[String]) -> Result<Vec<bool>, KvError> {
    check_keys(keys)?;
    let owners = Owners::of_keys(here, bucket, keys);
    let b = bucket.to_string();
    let answers = owners
        .run(
            here,
            |idx| pick(keys, idx),
            move |s, ks| s.tier.delete(b, ks),
        )
        .await;
    Ok(owners.gather(flatten(answers)?))
}

/// Every owner's answer, or the first failure.
fn flatten<T, E: Into<KvError>>(
    answers: Vec<Result<Result<T, E>, crate::node::ShardError>>,
) -> Result<Vec<T>, KvError> {
    answers
        .into_iter()
        .map(|a| a?.map_err(Into::into))
        .collect()
}

/// Reserves the blocks of a put-start request; the put ids and descriptors.
pub async fn put_start(
    caller: &Caller<'_>,
    bucket: &str,
    req: PutStartRequest,
) -> Result<PutStartResponse, KvError> {
    let ttl_ms = ttl_ms(req.ttl_ms)?;
    let blocks: Vec<(String, u64)> = req.blocks.into_iter().map(|b| (b.key, b.len)).collect();
    let (ids, descriptors) =
        start_puts(caller, bucket, &blocks, Duration::from_millis(ttl_ms)).await?;
    let puts: Vec<StartedPut> = blocks
        .into_iter()
        .zip(ids)
        .zip(descriptors)
        .map(|(((key, _), put_id), descriptor)| StartedPut {
            key,
            put_id,
            descriptor,
        })
        .collect();
    Ok(PutStartResponse { puts, ttl_ms })
}

/// Reserves `(key, len)` blocks on their shards (one job per shard, all at once); all or
/// none. Returns the put ids and the descriptors of the reserved ranges, in order.
pub async fn start_puts(
    caller: &Caller<'_>,
    bucket: &str,
    blocks: &[(String, u64)],
    ttl: Duration,
) -> Result<(Vec<u64>, Vec<SegmentDescriptor>), KvError> {
    let here = caller.here;
    let keys: Vec<String> = blocks.iter().map(|b| b.0.clone()).collect();
    check_keys(&keys)?;
    check_lens(here, blocks.iter().map(|(k, l)| (k.as_str(), *l)))?;
    let owners = Owners::of_keys(here, bucket, &keys);
    let ids: Vec<u64> = keys
        .iter()
        .map(|k| here.kv_id_for(here.owner(bucket, k)))
        .collect();
    let (b, holder) = (bucket.to_string(), caller.holder.clone());
    let answers = owners
        .run(
            here,
            |idx| -> Vec<(u64, String, u64)> {
                idx.iter()
                    .map(|&i| (ids[i], blocks[i].0.clone(), blocks[i].1))
                    .collect()
            },
            move |s, items| Step::Done(ops::put_start(s, &holder, &b, &items, ttl)),
        )
        .await;
    let mut descriptors: Vec<Option<SegmentDescriptor>> = vec![None; keys.len()];
    let mut failure = None;
    for ((_, idx), answer) in owners.groups().iter().zip(answers) {
        match answer {
            Ok(Ok(ds)) => {
                for (i, d) in idx.iter().zip(ds) {
                    descriptors[*i] = Some(d);
                }
            }
            Ok(Err((at, e))) => {
                failure = Some(KvError::about(e, &keys[idx[at.min(idx.len() - 1)]]))
            }
            Err(e) => failure = Some(e.into()),
        }
    }
    if let Some(e) = failure {
        // All or none: revoke what the other shards started.
        let started: Vec<u64> = descriptors
            .iter()
            .zip(&ids)
            .filter(|(d, _)| d.is_some())
            .map(|(_, id)| *id)
            .collect();
        revoke_all(caller, bucket, &started).await;
        return Err(e);
    }
    Ok((ids, descriptors.into_iter().flatten().collect()))
}

/// Best effort: abandons started puts (the reaper would take them at their deadline anyway).
pub async fn revoke_all(caller: &Caller<'_>, bucket: &str, put_ids: &[u64]) {
    let _ = revoked(caller, bucket, put_ids).await;
}

/// Revokes the caller's puts; whether each was still open.
pub async fn revoke(
    caller: &Caller<'_>,
    bucket: &str,
    req: PutIdsRequest,
) -> Result<RevokeResponse, KvError> {
    let revoked = revoked(caller, bucket, &req.put_ids).await?;
    Ok(RevokeResponse { revoked })
}

async fn revoked(caller: &Caller<'_>, bucket: &str, put_ids: &[u64]) -> Result<Vec<bool>, KvError> {
    let owners = Owners::of_ids(caller.here, put_ids)?;
    let (b, holder) = (bucket.to_string(), caller.holder.clone());
    let answers = owners
        .run(
            caller.here,
            |idx| pick(put_ids, idx),
            move |s, ids| {
                Step::Done(
                    ids.iter()
                        .map(|id| ops::put_revoke(s, *id, &holder, &b))
                        .collect::<Vec<bool>>(),
                )
            },
        )
        .await;
    let answers = answers.into_iter().collect::<Result<Vec<_>, _>>()?;
    Ok(owners.gather(answers))
}

/// Publishes the caller's puts into `bucket` on their shards (all shards at once); their
/// ETags, in order. A put of another holder or another bucket is unknown.
pub async fn end_puts(
    caller: &Caller<'_>,
    bucket: &str,
    put_ids: &[u64],
) -> Result<Vec<String>, KvError> {
    let puts: Vec<(u64, Option<String>)> = put_ids.iter().map(|id| (*id, None)).collect();
    end_puts_as(caller, bucket, &puts).await
}

/// publish: ends the caller's puts and rooms under the keys they name, then reserves the
/// rooms asked for on this shard (see [`PublishRequest`]).
pub async fn publish(
    caller: &Caller<'_>,
    bucket: &str,
    req: PublishRequest,
) -> Result<PublishResponse, KvError> {
    let ttl_ms = ttl_ms(req.ttl_ms)?;
    if req.puts.len() > MAX_BATCH || req.rooms.len() > MAX_ROOMS {
        return Err(KvError::invalid(format!(
            "A publish names at most {MAX_BATCH} puts and {MAX_ROOMS} rooms."
        )));
    }
    if req.puts.is_empty() && req.rooms.is_empty() {
        return Err(KvError::invalid("A publish names a put or a room."));
    }
    for p in &req.puts {
        validate_object_key(&p.key)?;
    }
    let puts: Vec<(u64, Option<String>)> = req
        .puts
        .into_iter()
        .map(|p| (p.put_id, Some(p.key)))
        .collect();
    let here = caller.here;
    check_lens(here, req.rooms.iter().map(|len| ("(a room)", *len)))?;
    let etags = if puts.is_empty() {
        Vec::new()
    } else {
        end_puts_as(caller, bucket, &puts).await?
    };
    let ttl = Duration::from_millis(ttl_ms);
    let rooms = ops::reserve_rooms(here, &caller.holder, bucket, &req.rooms, ttl)
        .into_iter()
        .map(|(put_id, descriptor)| Room { put_id, descriptor })
        .collect();
    Ok(PublishResponse {
        etags,
        rooms,
        ttl_ms,
    })
}

/// [`end_puts`] of puts each under the key it names, when it names one.
async fn end_puts_as(
    caller: &Caller<'_>,
    bucket: &str,
    puts: &[(u64, Option<String>)],
) -> Result<Vec<String>, KvError> {
    if puts.is_empty() || puts.len() > MAX_BATCH {
        return Err(KvError::invalid(format!(
            "A batch names 1 to {MAX_BATCH} puts."
        )));
    }
    let put_ids: Vec<u64> = puts.iter().map(|p| p.0).collect();
    let owners = Owners::of_ids(caller.here, &put_ids)?;
    let (b, holder) = (bucket.to_string(), caller.holder.clone());
    let answers = owners
        .run(
            caller.here,
            |idx| pick(puts, idx),
            move |s, items| Step::Wait(Box::pin(ops::put_end(s.clone(), items, holder, b))),
        )
        .await;
    let mut per_owner = Vec::with_capacity(answers.len());
    for ((_, idx), answer) in owners.groups().iter().zip(answers) {
        let mut etags = Vec::with_capacity(idx.len());
        for (i, r) in idx.iter().zip(answer?) {
            let id = put_ids[*i];
            let meta = r.map_err(|e| match e {
                StoreError::NoSuchUpload => KvError::invalid(format!(
                    "Put {id} is unknown, already ended, revoked or expired."
                )),
                e => e.into(),
            })?;
            etags.push(meta.etag.clone());
        }
        per_owner.push(etags);
    }
    Ok(owners.gather(per_owner))
}

/// Per key, the leased block, its descriptor and its shard (`None`: not in DRAM).
pub type Found = Vec<Option<(usize, BlockRef, SegmentDescriptor)>>;

/// Leases the blocks on their shards (all at once); the lease ids (one per owner) and what
/// was found. The caller has checked the keys ([`check_keys`]).
pub async fn lease(
    caller: &Caller<'_>,
    bucket: &str,
    keys: &[String],
    ttl: Duration,
) -> Result<(Vec<u64>, Found), KvError> {
    let here = caller.here;
    let owners = Owners::of_keys(here, bucket, keys);
    let leases: Vec<u64> = owners
        .groups()
        .iter()
        .map(|(shard, _)| here.kv_id_for(*shard))
        .collect();
    let (b, holder) = (bucket.to_string(), caller.holder.clone());
    let mut next = leases.iter();
    let answers = owners
        .run(
            here,
            |idx| (next.next().copied().unwrap_or_default(), pick(keys, idx)),
            move |s, (id, ks)| Step::Done(ops::lease(s, id, &holder, &b, &ks, ttl)),
        )
        .await;
    let mut per_owner = Vec::with_capacity(answers.len());
    for ((shard, _), answer) in owners.groups().iter().zip(answers) {
        let found: Found = answer??
            .into_iter()
            .map(|f| f.map(|(b, d)| (*shard, b, d)))
            .collect();
        per_owner.push(found);
    }
    Ok((leases, owners.gather(per_owner)))
}

/// Leases a get request's blocks: each distinct key once (see `GetResponse::positions`).
pub async fn get(
    caller: &Caller<'_>,
    bucket: &str,
    req: KeysRequest,
) -> Result<GetResponse, KvError> {
    let ttl_ms = ttl_ms(req.ttl_ms)?;
    check_keys(&req.keys)?;
    let mut first: HashMap<&str, u32> = HashMap::with_capacity(req.keys.len());
    let mut distinct: Vec<String> = Vec::with_capacity(req.keys.len());
    let mut positions = Vec::with_capacity(req.keys.len());
    for key in &req.keys {
        let next = distinct.len() as u32;
        let at = *first.entry(key.as_str()).or_insert(next);
        if at == next {
            distinct.push(key.clone());
        }
        positions.push(at);
    }
    let repeated = distinct.len() < req.keys.len();
    let (leases, found) = lease(caller, bucket, &distinct, Duration::from_millis(ttl_ms)).await?;
    let blocks = distinct
        .into_iter()
        .zip(found)
        .map(|(key, f)| match f {
            Some((_, b, d)) => LeasedBlock {
                key,
                descriptor: Some(d),
                len: b.len,
                etag: Some(b.etag),
            },
            None => LeasedBlock {
                key,
                descriptor: None,
                len: 0,
                etag: None,
            },
        })
        .collect();
    Ok(GetResponse {
        leases,
        blocks,
        positions: repeated.then_some(positions),
        ttl_ms,
    })
}

/// Gives the caller's leases back; how many were still held.
pub async fn release(caller: &Caller<'_>, req: ReleaseRequest) -> Result<ReleaseResponse, KvError> {
    let released = released(caller, &req.leases).await?;
    Ok(ReleaseResponse {
        released: released.into_iter().filter(|r| *r).count() as _,
    })
}

/// Releases the caller's `leases`; whether each was still held.
pub async fn released(caller: &Caller<'_>, leases: &[u64]) -> Result<Vec<bool>, KvError> {
    let owners = Owners::of_ids(caller.here, leases)?;
    let holder = caller.holder.clone();
    let answers = owners
        .run(
            caller.here,
            |idx| pick(leases, idx),
            move |s, ids| {
                Step::Done(
                    ids.iter()
                        .map(|id| ops::release(s, *id, &holder))
                        .collect::<Vec<bool>>(),
                )
            },
        )
        .await;
    let answers = answers.into_iter().collect::<Result<Vec<_>, _>>()?;
    Ok(owners.gather(answers))
}

/// The sizes of `keys` this node holds (`None`: not here), one job per owning shard; a
/// bucket deleted meanwhile holds nothing.
pub async fn sizes(
    here: &Rc<Shard>,
    bucket: &str,
    keys: &[String],
) -> Result<Vec<Option<u64>>, KvError> {
    let owners = Owners::of_keys(here, bucket, keys);
    let b = bucket.to_string();
    let answers = owners
        .run(
            here,
            |idx| pick(keys, idx),
            move |s, ks| {
                Step::Done(s.tier.exists(&b, &ks).map(|found| {
                    found
                        .into_iter()
                        .zip(&ks)
                        .map(|(f, k)| f.then(|| s.tier.stored_size(&b, k)))
                        .collect::<Vec<_>>()
                }))
            },
        )
        .await;
    let mut per_owner = Vec::with_capacity(answers.len());
    for answer in answers {
        per_owner.push(match answer? {
            Ok(sizes) => sizes,
            Err(StoreError::NoSuchBucket) => Vec::new(),
            Err(e) => return Err(e.into()),
        });
    }
    Ok(owners.gather(per_owner))
}
