//! Large get-into and put-from calls through arena views (see `arena.rs`): the node leases
//! or reserves the blocks, this process copies them.
//!
//! Each returns `None` when the call is not one for views (too small, a shard without a
//! view, an option the raw form does not carry) or the node would not lease or reserve the
//! blocks (a per-user limit, a full arena): the caller then makes the ordinary call, whose
//! answer is the authoritative one. Keys whose block the node does not lease (absent, only
//! on NVMe, larger than their room) go through an ordinary get-into too.

use yutu_api::kv::{
    CopiedResponse, EtagsResponse, GetIntoRequest, GetResponse, KeysRequest, KvOp, PutFromBlock,
    PutIdsRequest, PutStartBlock, PutStartRequest, PutStartResponse, ReleaseRequest,
    ReleaseResponse, RevokeResponse,
};
use yutu_api::kv_frame::{self, FrameOp};

use super::arena::{self, Piece, View, VIEW_MIN, VIEW_MIN_BLOCK, VIEW_TTL_MS};
use super::frames::Frames;
use super::node::NodeClient;
use super::{Buffer, KvError, PutMode, PutOptions};

/// About how many bytes a get-into of `ranges` moves, before the node says: the median
/// room times the keys. A room is only an upper bound (`batch_get_into` gives the last key
/// the rest of the buffer), and one large room must not make a batch of small blocks look
/// large.
fn likely_bytes(ranges: &[(u64, u64)]) -> u64 {
    large_enough(ranges.iter().map(|r| r.1).collect())
}

/// The bytes of a call whose pieces are `sizes`, estimated as the median times the count;
/// 0 (not for views) when the median is below [`VIEW_MIN_BLOCK`]: a batch of small blocks
/// is one system call on the node, and a lease or reservation per block would cost more.
fn large_enough(mut sizes: Vec<u64>) -> u64 {
    if sizes.is_empty() {
        return 0;
    }
    let n = sizes.len() as u64;
    let mid = sizes.len() / 2;
    let (_, median, _) = sizes.select_nth_unstable(mid);
    if *median < VIEW_MIN_BLOCK {
        return 0;
    }
    median.saturating_mul(n)
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
        let mut idx: Vec<Vec<usize>> = vec![Vec::new(); frames.shards()];
        for (i, k) in keys.iter().enumerate() {
            idx[yutu_api::placement::shard_for(bucket, k, frames.shards())].push(i);
        }
        let mut out = Vec::new();
        for (shard, idx) in idx.into_iter().enumerate() {
            if !idx.is_empty() {
                let view = views.view(frames, shard)?;
                out.push(OnShard { shard, view, idx });
            }
        }
        Some((frames, out))
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
        if body.targets.is_some() || likely_bytes(ranges) < VIEW_MIN {
            return None;
        }
        // Key i's ranges: `spans[i]` of `ranges`.
        let counts: Vec<usize> = match &body.parts {
            Some(p) => p.iter().map(|&c| c as usize).collect(),
            None => vec![1; keys.len()],
        };
        if counts.len() != keys.len() || counts.iter().sum::<usize>() != ranges.len() {
            return None;
        }
        let mut spans = Vec::with_capacity(keys.len());
        let mut at = 0usize;
        for &c in &counts {
            spans.push(at..at + c);
            at += c;
        }
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
        let leased: Vec<GetResponse> = match frames.call_each(FrameOp::Kv(KvOp::Get), &calls, true)
        {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(error = %e, "no leases for a view get: the node copies");
                return None;
            }
        };
        let base = buf.segment.region().as_ptr();
        let mut out: Vec<Option<u64>> = vec![None; keys.len()];
        let mut rest = Vec::new();
        let mut pieces = Vec::new();
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
                    pieces.push(Piece {
                        src: from,
                        // The ranges were checked against `buf` by the caller.
                        dst: base.wrapping_add(offset as usize),
                        len: n as usize,
                    });
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
        unsafe { arena::copy(&pieces, false) };
        if let Some(views) = &self.views {
            views.count(bytes);
        }
        for (g, answer) in groups.iter().zip(&leased) {
            self.release_on(frames, g.shard, &answer.leases);
        }
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

    /// Ends leases on `shard`; a failure only leaves them to their ttl.
    fn release_on(&self, frames: &Frames, shard: usize, leases: &[u64]) {
        if leases.is_empty() {
            return;
        }
        let body = match kv_frame::encode(&ReleaseRequest {
            leases: leases.to_vec(),
        }) {
            Ok(b) => b,
            Err(_) => return,
        };
        if let Err(e) = frames.call::<ReleaseResponse>(shard, FrameOp::Release, &body, true) {
            tracing::debug!(error = %e, shard, "a view get's leases were not released: they expire");
        }
    }

    /// put-from through views: key `i` is the blocks `blocks[first_i..first_i + parts[i]]`
    /// of `buf` (one each without `parts`), gathered in order; `None` as the module docs
    /// say.
    pub(super) fn put_through_views(
        &self,
        bucket: &str,
        keys: &[String],
        buf: &Buffer,
        blocks: &[PutFromBlock<&str>],
        parts: Option<&[u32]>,
        options: &PutOptions,
    ) -> Option<Result<Vec<String>, KvError>> {
        if options.pin.is_some() {
            return None;
        }
        if large_enough(blocks.iter().map(|b| b.len).collect()) < VIEW_MIN {
            return None;
        }
        let counts: Vec<usize> = match parts {
            Some(p) => p.iter().map(|&c| c as usize).collect(),
            None => vec![1; keys.len()],
        };
        if counts.len() != keys.len() || counts.iter().sum::<usize>() != blocks.len() {
            return None;
        }
        let mut spans = Vec::with_capacity(keys.len());
        let mut at = 0usize;
        for &c in &counts {
            spans.push(at..at + c);
            at += c;
        }
        if options.mode == PutMode::IfAbsent {
            return self.put_absent_through_views(bucket, keys, buf, blocks, &spans);
        }
        let lens: Vec<u64> = spans
            .iter()
            .map(|s| blocks[s.clone()].iter().map(|b| b.len).sum())
            .collect();
        let (frames, groups) = self.on_views(bucket, keys)?;
        let calls = groups
            .iter()
            .map(|g| {
                let request = PutStartRequest {
                    blocks: g
                        .idx
                        .iter()
                        .map(|&i| PutStartBlock {
                            key: keys[i].clone(),
                            len: lens[i],
                        })
                        .collect(),
                    ttl_ms: Some(VIEW_TTL_MS),
                };
                kv_frame::encode_call(bucket, &request).map(|b| (g.shard, b))
            })
            .collect::<Result<Vec<_>, _>>()
            .ok()?;
        let started: Vec<PutStartResponse> =
            match frames.call_each(FrameOp::Kv(KvOp::PutStart), &calls, false) {
                Ok(s) => s,
                Err(e) => {
                    // Reservations made on the other shards expire with their short ttl.
                    tracing::debug!(error = %e, "no reservations for a view put: the node copies");
                    return None;
                }
            };
        let base = buf.segment.region().as_ptr();
        let mut pieces = Vec::new();
        let mut bad = None;
        for (g, answer) in groups.iter().zip(&started) {
            if answer.puts.len() != g.idx.len() {
                bad = Some(format!(
                    "put-start answered {} puts for {} blocks",
                    answer.puts.len(),
                    g.idx.len()
                ));
                break;
            }
            for (p, &i) in answer.puts.iter().zip(&g.idx) {
                let Some(dst) = g
                    .view
                    .place(&p.descriptor, lens[i])
                    .filter(|_| p.key == keys[i])
                else {
                    bad = Some(format!(
                        "put-start's answer for key {i} is not a range of its view"
                    ));
                    break;
                };
                let mut to = dst;
                for b in &blocks[spans[i].clone()] {
                    pieces.push(Piece {
                        // The blocks were checked against `buf` by the caller.
                        src: base.wrapping_add(b.offset as usize).cast_const(),
                        dst: to,
                        len: b.len as usize,
                    });
                    to = to.wrapping_add(b.len as usize);
                }
            }
        }
        if let Some(why) = bad {
            self.revoke_on(frames, bucket, &groups, &started);
            return Some(Err(KvError::InvalidResponse(why)));
        }
        // SAFETY: every destination lies in a view, inside a range reserved for this call and
        // not yet published; every source lies in `buf`, checked by the caller.
        unsafe { arena::copy(&pieces, true) };
        if let Some(views) = &self.views {
            views.count(lens.iter().sum());
        }
        let calls = groups
            .iter()
            .zip(&started)
            .map(|(g, s)| {
                let request = PutIdsRequest {
                    put_ids: s.puts.iter().map(|p| p.put_id).collect(),
                };
                kv_frame::encode_call(bucket, &request).map(|b| (g.shard, b))
            })
            .collect::<Result<Vec<_>, _>>();
        let ended: Result<Vec<EtagsResponse>, KvError> = calls
            .map_err(|e| KvError::InvalidArgument(e.to_string()))
            .and_then(|calls| frames.call_each(FrameOp::Kv(KvOp::PutEnd), &calls, false));
        let ended = match ended {
            Ok(e) => e,
            Err(e) => {
                self.revoke_on(frames, bucket, &groups, &started);
                return Some(Err(e));
            }
        };
        let mut etags = vec![String::new(); keys.len()];
        for (g, answer) in groups.iter().zip(ended) {
            if answer.etags.len() != g.idx.len() {
                return Some(Err(KvError::InvalidResponse(format!(
                    "put-end answered {} etags for {} blocks",
                    answer.etags.len(),
                    g.idx.len()
                ))));
            }
            for (&i, e) in g.idx.iter().zip(answer.etags) {
                etags[i] = e;
            }
        }
        Some(Ok(etags))
    }

    /// A put of the keys not stored yet: as the node's put-from does, the present keys are
    /// looked up first (in the presence tables where this client has them) and answer an
    /// empty ETag, and the others are stored (`spans[i]`: key `i`'s blocks).
    fn put_absent_through_views(
        &self,
        bucket: &str,
        keys: &[String],
        buf: &Buffer,
        blocks: &[PutFromBlock<&str>],
        spans: &[std::ops::Range<usize>],
    ) -> Option<Result<Vec<String>, KvError>> {
        let present = match self.batch_exists(bucket, keys) {
            Ok(p) if p.len() == keys.len() => p,
            Ok(_) => return None,
            Err(e) => return Some(Err(e)),
        };
        let wanted: Vec<usize> = (0..keys.len()).filter(|&i| !present[i]).collect();
        let mut etags = vec![String::new(); keys.len()];
        if wanted.is_empty() {
            return Some(Ok(etags));
        }
        let sub_keys: Vec<String> = wanted.iter().map(|&i| keys[i].clone()).collect();
        let sub_blocks: Vec<PutFromBlock<&str>> = wanted
            .iter()
            .flat_map(|&i| blocks[spans[i].clone()].iter().cloned())
            .collect();
        let counts: Vec<u32> = wanted.iter().map(|&i| spans[i].len() as u32).collect();
        let stored = match self.put_through_views(
            bucket,
            &sub_keys,
            buf,
            &sub_blocks,
            Some(&counts),
            &PutOptions::default(),
        )? {
            Ok(s) => s,
            Err(e) => return Some(Err(e)),
        };
        for (i, e) in wanted.into_iter().zip(stored) {
            etags[i] = e;
        }
        Some(Ok(etags))
    }

    /// Best effort: frees a failed view put's reservations now instead of at their ttl
    /// (puts already ended are not revoked; the node answers false for them).
    fn revoke_on(
        &self,
        frames: &Frames,
        bucket: &str,
        groups: &[OnShard<'_>],
        started: &[PutStartResponse],
    ) {
        for (g, s) in groups.iter().zip(started) {
            let request = PutIdsRequest {
                put_ids: s.puts.iter().map(|p| p.put_id).collect(),
            };
            if let Ok(body) = kv_frame::encode_call(bucket, &request) {
                let _ =
                    frames.call::<RevokeResponse>(g.shard, FrameOp::Kv(KvOp::Revoke), &body, false);
            }
        }
    }
}
