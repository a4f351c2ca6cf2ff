//! Answering a read of one object version: conditions first, then the range.

use std::sync::Arc;

use bytes::Bytes;
use yutu_api::{ByteRange, RangeSpec};

use super::conditions::{Failed, ReadConditions};
use super::error::StoreError;
use super::object::ObjectMeta;

/// What a GET or HEAD answers: the version's metadata, the resolved range, the bytes.
pub type GetResult = Result<(Arc<ObjectMeta>, Option<ByteRange>, Bytes), StoreError>;

/// Answers a read of `meta`/`all` (the whole object): conditions, then the range.
pub fn serve(
    meta: &Arc<ObjectMeta>,
    all: &[u8],
    range: Option<RangeSpec>,
    head_only: bool,
    cond: &ReadConditions,
) -> GetResult {
    match cond.check(&meta.etag, meta.last_modified) {
        Ok(()) => {}
        Err(Failed::NotModified) => return Err(StoreError::NotModified(meta.clone())),
        Err(Failed::Precondition) => return Err(StoreError::PreconditionFailed),
    }
    let size = meta.size;
    let range = match range {
        Some(spec) => Some(
            spec.resolve(size)
                .ok_or(StoreError::InvalidRange { size })?,
        ),
        None => None,
    };
    let data = if head_only {
        Bytes::new()
    } else {
        match range {
            Some(r) => Bytes::copy_from_slice(
                all.get(r.start as usize..r.end as usize)
                    .unwrap_or_default(),
            ),
            None => Bytes::copy_from_slice(all),
        }
    };
    Ok((meta.clone(), range, data))
}
