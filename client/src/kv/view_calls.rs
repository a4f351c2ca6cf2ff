//! Large get-into calls through arena views (see `arena.rs`): the node leases the blocks,
//! this process copies them out of its mapping of the arena.
//!
//! `None` when the call is not one for views (too small, memory the node maps itself, a
//! shard without a view) or a shard would not lease its blocks (a per-user limit; the other
//! shards' leases are released at once): the caller then makes the ordinary call, whose
//! answer is the authoritative one. Keys whose block the node does not lease (absent, only
//! on NVMe, larger than their room) go through an ordinary get-into too.

use std::ops::Range;

use yutu_api::kv::{
    CopiedResponse, GetIntoRequest, GetResponse, KeysRequest, KvOp, ReleaseRequest, ReleaseResponse,
};
use yutu_api::kv_frame::{self, FrameOp};

use super::arena::{self, Piece, View, VIEW_MIN, VIEW_MIN_BLOCK, VIEW_TTL_MS};
use super::frames::Frames;
use super::node::{shard_groups, NodeClient};
use super::{Buffer, KvError};

/// Each key's ranges as a range of the call's `total`: `parts[i]` each,
/// one each without `parts`; `None` when the counts do not add up to `total`.
fn spans_of(parts: Option<&[u32]>, keys: usize, total: usize) -> Option<Vec<Range<usize>>> {
    let counts: Vec<usize> = match parts {
        Some(p) => p.iter().map(|&c| c as usize).collect(),
        None => vec![1; keys],
    };
    if counts.len() != keys || counts.iter().sum::<usize>() != total {
        return None;
    }
    let mut at = 0usize;
    Some(
        counts
            .into_iter()
            .map(|c| {
                at += c;
                at - c..at
            })
            .collect(),
    )
}

/// About how many bytes a get-into of `ranges` moves, before the node says: the median
/// room times the keys. A room is only an upper bound (`batch_get_into` gives the last key
/// the rest of the buffer), and one large room must not make a batch of small blocks look
/// large. 0 (not for views) when the median is below [`VIEW_MIN_BLOCK`]: a batch of small
/// blocks is one system call on the node, and a lease per block would cost more.
fn likely_bytes(ranges: &[(u64, u64)]) -> u64 {
    let mut rooms: Vec<u64> = ranges.iter().map(|r| r.1).collect();
    if rooms.is_empty() {
        return 0;
    }
    let mid = rooms.len() / 2;
    let (_, median, _) = rooms.select_nth_unstable(mid);
    if *median < VIEW_MIN_BLOCK {
        return 0;
    }
    median.saturating_mul(ranges.len() as u64)
}

/// The keys of a call on one shard: the shard, its view, and the call's indices of its keys.
struct OnShard<'v> {
    shard: usize,
    view: &'v View,
    idx: Vec<usize>,
}

impl NodeClient {
    /// Groups `keys` by owning shard, each with its view; `None` unless every owning shard
    /// has one.
    fn on_views<'s>(
        &'s self,
        bucket: &str,
        keys: &[String],
    ) -> Option<(&'s Frames, Vec<OnShard<'s>>)> {
        let (frames, views) = (self.frames.as_ref()?, self.views.as_ref()?);
        let groups = shard_groups(bucket, keys, frames.shards())
            .into_iter()
            .map(|(shard, idx)| {
                Some(OnShard {
                    shard,
                    view: views.view(frames, shard)?,
                    idx,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some((frames, groups))
    }

    /// get-into through views: `body` names ranges of `buf` (the buffer form); `None` as the
    /// module docs say.
    pub(super) fn get_through_views(
        &self,
        bucket: &str,
        keys: &[String],
        buf: &Buffer,
        body: &GetIntoRequest<&str>,
    ) -> Option<Result<Vec<Option<u64>>, KvError>> {
        let ranges = body.ranges.as_ref()?;
        // Memory the node maps (a memfd) it copies with `memcpy` on every shard at once,
        // faster than this process alone: views are for memory the node reaches through the
        // kernel.
        if !buf.segment.region().process() {
            return None;
        }
        if body.targets.is_some() || likely_bytes(ranges) < VIEW_MIN {
            return None;
        }
        // Key i's ranges: `spans[i]` of `ranges`.
        let spans = spans_of(body.parts.as_deref(), keys.len(), ranges.len())?;
        let (frames, groups) = self.on_views(bucket, keys)?;
        let calls = groups
            .iter()
            .map(|g| {
                let request = KeysRequest {
                    keys: g.idx.iter().map(|&i| keys[i].clone()).collect(),
                    ttl_ms: Some(VIEW_TTL_MS),
                };
                kv_frame::encode_call(bucket, &request).map(|b| (g.shard, b))
            })
            .collect::<Result<Vec<_>, _>>()
            .ok()?;
        let answers: Vec<Result<GetResponse, KvError>> =
            match frames.call_each_kept(FrameOp::Kv(KvOp::Get), &calls, true) {
                Ok(a) => a,
                Err(e) => {
                    tracing::debug!(error = %e, "no leases for a view get: the node copies");
                    return None;
                }
            };
        if let Some(Err(e)) = answers.iter().find(|a| a.is_err()) {
            // A shard would not lease (a per-user limit): the others' leases end now, and the
            // node copies the whole call.
            tracing::debug!(error = %e, "no leases for a view get: the node copies");
            let granted = groups.iter().map(|g| g.shard).zip(&answers);
            release(
                frames,
                granted.filter_map(|(s, a)| Some((s, a.as_ref().ok()?))),
            );
            return None;
        }
        let leased: Vec<GetResponse> = answers.into_iter().filter_map(Result::ok).collect();
        let base = buf.segment.region().as_ptr();
        let mut out: Vec<Option<u64>> = vec![None; keys.len()];
        let mut rest = Vec::new();
        let mut pieces: Vec<Piece> = Vec::new();
        let mut bytes = 0u64;
        for (g, answer) in groups.iter().zip(&leased) {
            for (j, &i) in g.idx.iter().enumerate() {
                let block = answer.block(j);
                let place =
                    block.and_then(|b| Some((b.len, g.view.place(b.descriptor.as_ref()?, b.len)?)));
                let room: u64 = ranges[spans[i].clone()].iter().map(|r| r.1).sum();
                let Some((len, src)) = place.filter(|(len, _)| *len <= room) else {
                    rest.push(i);
                    continue;
                };
                // The block's bytes, in order, over the key's ranges.
                let mut left = len;
                let mut from = src.cast_const();
                for &(offset, room) in &ranges[spans[i].clone()] {
                    if left == 0 {
                        break;
                    }
                    let n = left.min(room);
                    // The ranges were checked against `buf` by the caller.
                    pieces.push((from, base.wrapping_add(offset as usize), n as usize));
                    from = from.wrapping_add(n as usize);
                    left -= n;
                }
                bytes += len;
                out[i] = Some(len);
            }
        }
        // SAFETY: every source lies in a view, inside a block this call holds a lease on (its
        // bytes stay put until the release below); every destination lies in `buf`, checked
        // by the caller, and the ranges of a call do not overlap the arena.
        unsafe { arena::copy(&pieces) };
        if let Some(views) = &self.views {
            views.count(bytes);
        }
        release(frames, groups.iter().map(|g| g.shard).zip(&leased));
        if !rest.is_empty() {
            let Some(sub) = body.subset(&rest) else {
                return Some(Err(KvError::InvalidArgument(
                    "the get-into request's spans do not fit its keys".into(),
                )));
            };
            let sub_keys: Vec<String> = rest.iter().map(|&i| keys[i].clone()).collect();
            let copied =
                self.call_kv::<CopiedResponse>(bucket, KvOp::GetInto, Some(&sub_keys), &sub);
            match copied {
                Ok(c) if c.copied.len() == rest.len() => {
                    for (&i, c) in rest.iter().zip(c.copied) {
                        out[i] = c;
                    }
                }
                Ok(c) => {
                    return Some(Err(KvError::InvalidResponse(format!(
                        "get-into answered {} results for {} keys",
                        c.copied.len(),
                        rest.len()
                    ))))
                }
                Err(e) => return Some(Err(e)),
            }
        }
        Some(Ok(out))
    }
}

/// Ends each shard's leases, every shard's call sent before any answer is read; a failure
/// only leaves them to their ttl.
fn release<'a>(frames: &Frames, leased: impl Iterator<Item = (usize, &'a GetResponse)>) {
    let calls: Vec<(usize, Vec<u8>)> = leased
        .filter(|(_, a)| !a.leases.is_empty())
        .filter_map(|(shard, a)| {
            let request = ReleaseRequest {
                leases: a.leases.clone(),
            };
            Some((shard, kv_frame::encode(&request).ok()?))
        })
        .collect();
    if calls.is_empty() {
        return;
    }
    if let Err(e) = frames.call_each::<ReleaseResponse>(FrameOp::Release, &calls, true) {
        tracing::debug!(error = %e, "a view get's leases were not released: they expire");
    }
}
