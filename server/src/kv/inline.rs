//! Values carried in the call itself, for small blocks where a descriptor and a copy into
//! registered memory would cost more than the bytes: read whole on the owning shard within a
//! byte allowance, and stored whole as put-from stores them.

use std::rc::Rc;

use yutu_api::kv_frame::InlineValue;

use crate::model::conditions::ReadConditions;
use crate::model::read::GetResult;
use crate::model::StoreError;
use crate::node::Shard;
use crate::tier::{PutResult, Step};

/// The values of `keys` on this (their owning) shard, in order: each whole while the answer
/// stays within `room` bytes, [`InlineValue::TooLarge`] past it. The size is looked up before
/// the value is read, so a large value is never copied only to be refused. Values in DRAM are
/// answered at once; from the first one that must come from NVMe on, in a task.
pub fn read(
    shard: &Rc<Shard>,
    bucket: &str,
    keys: Vec<String>,
    mut room: u64,
) -> Step<Result<Vec<InlineValue>, StoreError>> {
    let mut out = Vec::with_capacity(keys.len());
    let mut keys = keys.into_iter();
    while let Some(key) = keys.next() {
        let size = shard.tier.stored_size(bucket, &key);
        if size > room {
            out.push(InlineValue::TooLarge(size));
            continue;
        }
        match get(shard, bucket, key) {
            Step::Done(r) => match value(r, &mut room) {
                Ok(v) => out.push(v),
                Err(e) => return Step::Done(Err(e)),
            },
            Step::Wait(pending) => {
                let (shard, bucket) = (shard.clone(), bucket.to_string());
                return Step::Wait(Box::pin(async move {
                    out.push(value(pending.await, &mut room)?);
                    for key in keys {
                        let size = shard.tier.stored_size(&bucket, &key);
                        if size > room {
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
