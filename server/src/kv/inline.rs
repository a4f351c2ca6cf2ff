//! Values carried in the call itself, for small blocks where a descriptor and a copy into
//! registered memory would cost more than the bytes: read whole on the owning shard within a
//! byte allowance, and stored whole as put-from stores them.

use std::rc::Rc;

use yutu_api::kv::EtagsResponse;
use yutu_api::kv_frame::{InlineValue, ReadRequest, ReadResponse, WriteRequest, MAX_INLINE};

use crate::kv::calls::{check_keys, check_lens, exists};
use crate::kv::error::KvError;
use crate::kv::owners::{pick, Owners};
use crate::model::conditions::ReadConditions;
use crate::model::read::GetResult;
use crate::model::StoreError;
use crate::node::Shard;
use crate::store::presence::MIRROR_VALUE_MAX;
use crate::tier::{PutResult, Step};

/// The values of `keys` on this (their owning) shard, in order: each whole while the answer
/// stays within `room` bytes and the value within `value_max`, [`InlineValue::TooLarge`]
/// past either. The size is looked up before
/// the value is read, so a large value is never copied only to be refused. Values in DRAM are
/// answered at once; from the first one that must come from NVMe on, in a task.
pub fn read(
    shard: &Rc<Shard>,
    bucket: &str,
    keys: Vec<String>,
    mut room: u64,
    value_max: u64,
) -> Step<Result<Vec<InlineValue>, StoreError>> {
    let mut out = Vec::with_capacity(keys.len());
    let mut keys = keys.into_iter();
    while let Some(key) = keys.next() {
        let size = shard.tier.stored_size(bucket, &key);
        if size > room.min(value_max) {
            out.push(InlineValue::TooLarge(size));
            continue;
        }
        let mirrored = (size <= MIRROR_VALUE_MAX as u64).then(|| key.clone());
        match get(shard, bucket, key) {
            Step::Done(r) => match value(r, &mut room) {
                Ok(v) => {
                    if let (InlineValue::Bytes(_), Some(k)) = (&v, mirrored) {
                        shard.tier.mirror_current(bucket, &k);
                    }
                    out.push(v)
                }
                Err(e) => return Step::Done(Err(e)),
            },
            Step::Wait(pending) => {
                let (shard, bucket) = (shard.clone(), bucket.to_string());
                return Step::Wait(Box::pin(async move {
                    out.push(value(pending.await, &mut room)?);
                    for key in keys {
                        let size = shard.tier.stored_size(&bucket, &key);
                        if size > room.min(value_max) {
                            out.push(InlineValue::TooLarge(size));
                            continue;
                        }
                        out.push(value(get(&shard, &bucket, key).get().await, &mut room)?);
                        glommio::yield_if_needed().await;
                    }
                    Ok(out)
                }));
            }
        }
    }
    Step::Done(Ok(out))
}

fn get(shard: &Rc<Shard>, bucket: &str, key: String) -> Step<GetResult> {
    shard.tier.get(
        bucket.to_string(),
        key,
        None,
        false,
        ReadConditions::default(),
    )
}

/// A read's answer as an inline value, taken out of `room`.
fn value(r: GetResult, room: &mut u64) -> Result<InlineValue, StoreError> {
    match r {
        Ok((_, _, data)) => {
            *room = room.saturating_sub(data.len() as u64);
            Ok(InlineValue::Bytes(data.to_vec()))
        }
        Err(StoreError::NoSuchKey) => Ok(InlineValue::Missing),
        Err(e) => Err(e),
    }
}

/// Stores each `(key, value)` whole on this (their owning) shard, within the bucket's quota:
/// one result per item, in order; the items before a failed one stay stored.
pub async fn write(
    shard: Rc<Shard>,
    bucket: String,
    items: Vec<(String, Vec<u8>)>,
) -> Vec<PutResult> {
    let mut out = Vec::with_capacity(items.len());
    for (key, value) in items {
        let len = value.len() as u64;
        let stored = super::direct::store_whole(&shard, &bucket, &key, len, |dst| {
            dst.copy_from_slice(&value);
            true
        });
        out.push(stored.await);
        glommio::yield_if_needed().await;
    }
    out
}

/// The values of a read call: each owning shard reads its keys, within [`MAX_INLINE`] bytes
/// per call in all (so the shards go one after another, each with what the earlier ones
/// left).
pub async fn read_many(
    here: &Rc<Shard>,
    bucket: &str,
    req: ReadRequest,
) -> Result<ReadResponse, KvError> {
    check_keys(&req.keys)?;
    let owners = Owners::of_keys(here, bucket, &req.keys);
    let mut values = Vec::with_capacity(owners.groups().len());
    let mut room = MAX_INLINE;
    let value_max = req.value_max.unwrap_or(MAX_INLINE);
    for (shard, idx) in owners.groups() {
        let (keys, b) = (pick(&req.keys, idx), bucket.to_string());
        let got = here
            .run_step(*shard, move |s| read(s, &b, keys, room, value_max))
            .await??;
        for v in &got {
            if let InlineValue::Bytes(data) = v {
                room = room.saturating_sub(data.len() as u64);
            }
        }
        values.push(got);
    }
    let mut values = owners.gather(
        values
            .into_iter()
            .map(|v| v.into_iter().map(Some).collect()),
    );
    Ok(ReadResponse {
        values: values
            .iter_mut()
            .map(|v| v.take().unwrap_or(InlineValue::Missing))
            .collect(),
    })
}

/// A write call: each owning shard stores its blocks whole (all shards at once), as
/// put-from would; with `if_absent`, a present key is left out and answers an empty ETag.
pub async fn write_many(
    here: &Rc<Shard>,
    bucket: &str,
    req: WriteRequest,
) -> Result<EtagsResponse, KvError> {
    let keys: Vec<String> = req.blocks.iter().map(|b| b.key.clone()).collect();
    check_keys(&keys)?;
    let lens: Vec<(String, u64)> = req
        .blocks
        .iter()
        .map(|b| (b.key.clone(), b.value.len() as u64))
        .collect();
    check_lens(here, lens.iter().map(|(k, l)| (k.as_str(), *l)))?;
    let present = if req.if_absent {
        exists(here, bucket, &keys).await?
    } else {
        vec![false; keys.len()]
    };
    let mut values: Vec<Option<Vec<u8>>> = req.blocks.into_iter().map(|b| Some(b.value)).collect();
    let owners = Owners::of_keys(here, bucket, &keys);
    let b = bucket.to_string();
    let answers = owners
        .run(
            here,
            |idx| -> Vec<Option<(String, Vec<u8>)>> {
                idx.iter()
                    .map(|&i| match present[i] {
                        true => None,
                        false => Some((keys[i].clone(), values[i].take().unwrap_or_default())),
                    })
                    .collect()
            },
            move |s, items| Step::Wait(Box::pin(write_some(s.clone(), b, items))),
        )
        .await;
    let mut per_owner = Vec::with_capacity(answers.len());
    for ((_, idx), answer) in owners.groups().iter().zip(answers) {
        let mut etags = Vec::with_capacity(idx.len());
        for (i, r) in idx.iter().zip(answer?) {
            etags.push(match r {
                Some(r) => r.map_err(|e| KvError::about(e, &keys[*i]))?.etag.clone(),
                None => String::new(),
            });
        }
        per_owner.push(etags);
    }
    Ok(EtagsResponse {
        etags: owners.gather(per_owner),
    })
}

/// [`write`] of the items that are there; `None` for the ones left out.
async fn write_some(
    shard: Rc<Shard>,
    bucket: String,
    items: Vec<Option<(String, Vec<u8>)>>,
) -> Vec<Option<PutResult>> {
    let wanted: Vec<bool> = items.iter().map(Option::is_some).collect();
    let mut stored = write(shard, bucket, items.into_iter().flatten().collect())
        .await
        .into_iter();
    wanted
        .into_iter()
        .map(|w| if w { stored.next() } else { None })
        .collect()
}
