//! Large get-into and put-from calls through arena views (see `arena.rs`): the node leases
//! or reserves the blocks, this process copies them out of or into its mapping of the arena.
//!
//! Each returns `None` when the call is not one for views (too small, memory the node maps
//! itself, a shard without a view, a pin) or a shard would not lease or reserve its blocks
//! (a per-user limit, a full arena; what the other shards granted ends at once), or a
//! reserved range is not resident yet: the caller then makes the ordinary call, whose
//! answer is the authoritative one. Keys whose block the node does not lease (absent, only
//! on NVMe, larger than their room) go through an ordinary get-into too.

use std::ops::Range;
use std::time::{Duration, Instant};

use yutu_api::kv::{
    CopiedResponse, EtagsResponse, GetIntoRequest, GetResponse, KeysRequest, KvOp, PublishPut,
    PublishRequest, PublishResponse, PutFromBlock, PutIdsRequest, PutStartBlock, PutStartRequest,
    PutStartResponse, ReleaseRequest,
};
use yutu_api::kv_frame::{self, FrameOp};

use super::arena::{self, Piece, View, VIEW_MIN, VIEW_MIN_BLOCK, VIEW_TTL_MS};
use super::frames::Frames;
use super::node::{shard_groups, NodeClient};
use super::rooms::{revoke_puts, revoke_rooms, Held, ROOMS_PER_CALL};
use super::{Buffer, KvError, PutMode, PutOptions};

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

/// About how many bytes a call of these blocks (or rooms) moves: the median length times
/// the count. A get-into's room is only an upper bound (`batch_get_into` gives the last key
/// the rest of the buffer), and one large room must not make a batch of small blocks look
/// large. 0 (not for views) when the median is below [`VIEW_MIN_BLOCK`]: a batch of small
/// blocks is one system call on the node, and a lease or reservation per block would cost
/// more.
fn likely_bytes(lens: impl Iterator<Item = u64>) -> u64 {
    let mut rooms: Vec<u64> = lens.collect();
    if rooms.is_empty() {
        return 0;
    }
    let mid = rooms.len() / 2;
    let (_, median, _) = rooms.select_nth_unstable(mid);
    if *median < VIEW_MIN_BLOCK {
        return 0;
    }
    median.saturating_mul(rooms.len() as u64)
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
        if body.targets.is_some() || likely_bytes(ranges.iter().map(|r| r.1)) < VIEW_MIN {
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
                // A block whose pages are not all the node's (swapped out) is the node's to
                // copy: read here, they would be charged to this process.
                let ready = |(len, src): &(u64, *mut u8)| {
                    *len <= room && g.view.prepare(*src, *len as usize)
                };
                let Some((len, src)) = place.filter(ready) else {
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
        unsafe { arena::copy(&pieces, false) };
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

    /// put-from through views: key `i` is the blocks `blocks[spans[i]]` of `buf` (one each
    /// without `parts`), gathered in order; `None` as the module docs say.
    pub(super) fn put_through_views(
        &self,
        bucket: &str,
        keys: &[String],
        buf: &Buffer,
        blocks: &[PutFromBlock<&str>],
        parts: Option<&[u32]>,
        options: &PutOptions,
    ) -> Option<Result<Vec<String>, KvError>> {
        // As for gets: memory the node maps it copies faster itself.
        if !buf.segment.region().process() || options.pin.is_some() {
            return None;
        }
        if likely_bytes(blocks.iter().map(|b| b.len)) < VIEW_MIN {
            return None;
        }
        let spans = spans_of(parts, keys.len(), blocks.len())?;
        if options.mode == PutMode::IfAbsent {
            return self.put_absent_through_views(bucket, keys, buf, blocks, &spans);
        }
        let lens: Vec<u64> = spans
            .iter()
            .map(|s| blocks[s.clone()].iter().map(|b| b.len).sum())
            .collect();
        let (frames, groups) = self.on_views(bucket, keys)?;
        let slots = match self.reserve_for_views(frames, bucket, keys, &groups, &lens)? {
            Ok(slots) => slots,
            Err(e) => return Some(Err(e)),
        };
        let base = buf.segment.region().as_ptr();
        let mut pieces: Vec<Piece> = Vec::new();
        let mut cold = false;
        let mut bad = None;
        'groups: for g in &groups {
            for &i in &g.idx {
                let slot = &slots[i];
                let Some(dst) = g
                    .view
                    .place(&slot.descriptor, lens[i])
                    .filter(|_| slot.descriptor.len == lens[i])
                else {
                    bad = Some(format!("the range for key {i} is not a range of its view"));
                    break 'groups;
                };
                if !g.view.prepare(dst, lens[i] as usize) {
                    cold = true;
                    break 'groups;
                }
                let mut to = dst;
                for b in &blocks[spans[i].clone()] {
                    // The blocks were checked against `buf` by the caller.
                    pieces.push((
                        base.wrapping_add(b.offset as usize).cast_const(),
                        to,
                        b.len as usize,
                    ));
                    to = to.wrapping_add(b.len as usize);
                }
            }
        }
        // A range that ran out is the node's to give to another put, so nothing is written
        // through one that has run half its time (a stalled process).
        let oldest = slots.iter().map(|s| s.asked).min()?;
        let late = oldest.elapsed() > Duration::from_millis(VIEW_TTL_MS / 2);
        if cold || late || bad.is_some() {
            // A range the node never wrote would be allocated, and charged, to this process
            // if written from here. Either way the node makes the put.
            revoke_slots(frames, bucket, &groups, &slots);
            return bad.map(|why| Err(KvError::InvalidResponse(why)));
        }
        // SAFETY: every destination lies in a view, inside a range reserved for this call (a
        // put it started or a room it took, not yet published: no one else reads or writes
        // it); every source lies in `buf`, checked by the caller, and the ranges of a call do
        // not overlap the arena.
        unsafe { arena::copy(&pieces, true) };
        if let Some(views) = &self.views {
            views.count(lens.iter().sum());
        }
        let published = self.publish(frames, bucket, keys, &groups, &slots, &lens);
        if published.is_err() {
            // What did end stays (a revoke of it answers false); the rest is abandoned.
            revoke_slots(frames, bucket, &groups, &slots);
        }
        Some(published)
    }

    /// A range for each key of a view put (`lens[i]` bytes for key `i`, on its group's
    /// shard): a room held for its shard and length, or a put started now, one put-start per
    /// shard for the keys without a room. `None` when a shard would not reserve (a per-user
    /// limit, a full arena): what the others reserved is revoked, and so is every room held,
    /// since rooms count against the limit the node's own copy of the put needs. An answer
    /// that does not fit the request is an error, its reservations revoked.
    fn reserve_for_views(
        &self,
        frames: &Frames,
        bucket: &str,
        keys: &[String],
        groups: &[OnShard<'_>],
        lens: &[u64],
    ) -> Option<Result<Vec<Slot>, KvError>> {
        let mut stale = Vec::new();
        let mut slots: Vec<Option<Slot>> = vec![None; keys.len()];
        for g in groups {
            for &i in &g.idx {
                slots[i] = self
                    .rooms
                    .take(g.shard, bucket, lens[i], &mut stale)
                    .map(Slot::room);
            }
        }
        revoke_rooms(frames, stale, false);
        let starts: Vec<(usize, Vec<usize>)> = groups
            .iter()
            .map(|g| {
                let idx: Vec<usize> = g
                    .idx
                    .iter()
                    .copied()
                    .filter(|&i| slots[i].is_none())
                    .collect();
                (g.shard, idx)
            })
            .filter(|(_, idx)| !idx.is_empty())
            .collect();
        let took = |slots: Vec<Option<Slot>>| slots.into_iter().flatten().filter_map(|s| s.room);
        if starts.is_empty() {
            return Some(Ok(slots.into_iter().flatten().collect()));
        }
        let calls = starts
            .iter()
            .map(|(shard, idx)| {
                let request = PutStartRequest {
                    blocks: idx
                        .iter()
                        .map(|&i| PutStartBlock {
                            key: keys[i].clone(),
                            len: lens[i],
                        })
                        .collect(),
                    ttl_ms: Some(VIEW_TTL_MS),
                };
                kv_frame::encode_call(bucket, &request).map(|b| (*shard, b))
            })
            .collect::<Result<Vec<_>, _>>();
        let asked = Instant::now();
        let answers: Vec<Result<PutStartResponse, KvError>> = match calls
            .map_err(|e| KvError::InvalidArgument(e.to_string()))
            .and_then(|calls| frames.call_each_kept(FrameOp::Kv(KvOp::PutStart), &calls, false))
        {
            Ok(a) => a,
            Err(e) => {
                // Nothing was reserved: the rooms go back for later puts.
                tracing::debug!(error = %e, "no reservations for a view put: the node copies");
                revoke_rooms(frames, self.rooms.keep(took(slots)), false);
                return None;
            }
        };
        let granted = || {
            starts
                .iter()
                .map(|(shard, _)| *shard)
                .zip(&answers)
                .filter_map(|(s, a)| Some((s, a.as_ref().ok()?)))
        };
        if let Some(Err(e)) = answers.iter().find(|a| a.is_err()) {
            tracing::debug!(error = %e, "no reservations for a view put: the node copies");
            revoke(frames, bucket, granted());
            revoke_rooms(
                frames,
                took(slots).chain(self.rooms.drain()).collect(),
                true,
            );
            return None;
        }
        let mut bad = None;
        for ((_, idx), (_, answer)) in starts.iter().zip(granted()) {
            if answer.puts.len() != idx.len() {
                bad = Some(format!(
                    "put-start answered {} puts for {} blocks",
                    answer.puts.len(),
                    idx.len()
                ));
            }
            for (p, &i) in answer.puts.iter().zip(idx) {
                if p.key != keys[i] {
                    bad = Some(format!("put-start's answer for key {i} names another key"));
                }
                slots[i] = Some(Slot {
                    put_id: p.put_id,
                    descriptor: p.descriptor,
                    asked,
                    room: None,
                });
            }
        }
        match (bad, slots.iter().all(Option::is_some)) {
            (None, true) => Some(Ok(slots.into_iter().flatten().collect())),
            (why, _) => {
                revoke(frames, bucket, granted());
                revoke_rooms(frames, took(slots).collect(), false);
                let why = why.unwrap_or_else(|| "put-start left a key without a range".into());
                Some(Err(KvError::InvalidResponse(why)))
            }
        }
    }

    /// Publishes a view put's written ranges (`slots`, key `i`'s in `slots[i]`), one publish
    /// per shard, each asking for rooms for the next puts of the same lengths where the
    /// shard's part is small; the ETags in key order. A node that does not know publish (an
    /// older one, see `Welcome::publish`) gets put-end, and no room is ever taken from it.
    fn publish(
        &self,
        frames: &Frames,
        bucket: &str,
        keys: &[String],
        groups: &[OnShard<'_>],
        slots: &[Slot],
        lens: &[u64],
    ) -> Result<Vec<String>, KvError> {
        let mut etags = vec![String::new(); keys.len()];
        if !frames.publishes() {
            let calls = groups
                .iter()
                .map(|g| {
                    let put_ids = g.idx.iter().map(|&i| slots[i].put_id).collect();
                    let body = kv_frame::encode_call(bucket, &PutIdsRequest { put_ids })
                        .map_err(|e| KvError::InvalidArgument(e.to_string()))?;
                    Ok((g.shard, body))
                })
                .collect::<Result<Vec<_>, KvError>>()?;
            let ended: Vec<EtagsResponse> =
                frames.call_each(FrameOp::Kv(KvOp::PutEnd), &calls, false)?;
            for (g, answer) in groups.iter().zip(ended) {
                place_etags(&mut etags, &g.idx, answer.etags, "put-end")?;
            }
            return Ok(etags);
        }
        let calls = groups
            .iter()
            .map(|g| {
                let puts = g
                    .idx
                    .iter()
                    .map(|&i| PublishPut {
                        put_id: slots[i].put_id,
                        key: keys[i].clone(),
                    })
                    .collect();
                // Rooms for the lengths of a small call that came before: what the next puts
                // of the same shape take.
                let rooms = if g.idx.len() <= ROOMS_PER_CALL {
                    let again: Vec<u64> = g
                        .idx
                        .iter()
                        .map(|&i| lens[i])
                        .filter(|&len| self.rooms.repeats(len))
                        .collect();
                    let n = again
                        .first()
                        .map_or(0, |&len| self.rooms.room_for(again.len(), len));
                    again.into_iter().take(n).collect()
                } else {
                    Vec::new()
                };
                let request = PublishRequest {
                    puts,
                    rooms,
                    ttl_ms: Some(VIEW_TTL_MS),
                };
                let body = kv_frame::encode_call(bucket, &request)
                    .map_err(|e| KvError::InvalidArgument(e.to_string()))?;
                Ok((g.shard, body))
            })
            .collect::<Result<Vec<_>, KvError>>()?;
        let asked = Instant::now();
        let answers: Vec<PublishResponse> =
            frames.call_each(FrameOp::Kv(KvOp::Publish), &calls, false)?;
        let mut given = Vec::new();
        let mut failure = None;
        for (g, answer) in groups.iter().zip(answers) {
            given.extend(answer.rooms.into_iter().map(|room| Held {
                shard: g.shard,
                bucket: bucket.to_string(),
                room,
                asked,
            }));
            if let Err(e) = place_etags(&mut etags, &g.idx, answer.etags, "publish") {
                failure = Some(e);
            }
        }
        revoke_rooms(frames, self.rooms.keep(given), false);
        match failure {
            Some(e) => Err(e),
            None => Ok(etags),
        }
    }

    /// A put of the keys not stored yet: as the node's put-from does, the present keys are
    /// looked up first (in the presence tables where this client has them) and answer an
    /// empty ETag, and the others are stored (`spans[i]`: key `i`'s blocks). Two such puts of
    /// one new key racing each other may both store it, as with put-from.
    fn put_absent_through_views(
        &self,
        bucket: &str,
        keys: &[String],
        buf: &Buffer,
        blocks: &[PutFromBlock<&str>],
        spans: &[Range<usize>],
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
        let options = PutOptions::default();
        let stored = match self.put_through_views(
            bucket,
            &sub_keys,
            buf,
            &sub_blocks,
            Some(&counts),
            &options,
        ) {
            Some(Ok(s)) => s,
            Some(Err(e)) => return Some(Err(e)),
            // The node makes the put of the keys that were absent, still if absent.
            None => {
                let absent = PutOptions {
                    mode: PutMode::IfAbsent,
                    ..options
                };
                let parts = Some(counts);
                match self.put_from_plain(bucket, &sub_keys, buf, sub_blocks, &absent, parts) {
                    Ok(s) => s,
                    Err(e) => return Some(Err(e)),
                }
            }
        };
        for (i, e) in wanted.into_iter().zip(stored) {
            etags[i] = e;
        }
        Some(Ok(etags))
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
    // Not waited for: the copies are done, and a release that fails leaves leases that
    // expire by themselves (`VIEW_TTL_MS`). Its answer is read before the connection's next
    // call.
    if let Err(e) = frames.send_each(FrameOp::Release, &calls) {
        tracing::debug!(error = %e, "a view get's leases were not released: they expire");
    }
}

/// Best effort: frees a view put's reservations now instead of at their ttl (puts already
/// ended are not revoked; the node answers false for them).
fn revoke<'a>(
    frames: &Frames,
    bucket: &str,
    started: impl Iterator<Item = (usize, &'a PutStartResponse)>,
) {
    let by_shard = started.map(|(shard, s)| (shard, s.puts.iter().map(|p| p.put_id).collect()));
    revoke_puts(frames, bucket, by_shard, true);
}

/// Where a key's bytes go in a view put: a put it started or a room it took.
#[derive(Debug, Clone)]
struct Slot {
    put_id: u64,
    descriptor: yutu_api::kv::SegmentDescriptor,
    /// When the range was asked for: it is written within half its ttl of that.
    asked: Instant,
    /// The room, when the range is one (given back to the pool if the call goes no further).
    room: Option<Held>,
}

impl Slot {
    fn room(h: Held) -> Slot {
        Slot {
            put_id: h.room.put_id,
            descriptor: h.room.descriptor,
            asked: h.asked,
            room: Some(h),
        }
    }
}

/// Best effort: revokes every range of a view put (started puts and rooms alike), by shard.
fn revoke_slots(frames: &Frames, bucket: &str, groups: &[OnShard<'_>], slots: &[Slot]) {
    let by_shard = groups
        .iter()
        .map(|g| (g.shard, g.idx.iter().map(|&i| slots[i].put_id).collect()));
    revoke_puts(frames, bucket, by_shard, true);
}

/// Puts one shard's ETags (`answer`, for the keys `idx` of the call) in their places.
fn place_etags(
    etags: &mut [String],
    idx: &[usize],
    answer: Vec<String>,
    call: &str,
) -> Result<(), KvError> {
    if answer.len() != idx.len() {
        return Err(KvError::InvalidResponse(format!(
            "{call} answered {} etags for {} blocks",
            answer.len(),
            idx.len()
        )));
    }
    for (&i, e) in idx.iter().zip(answer) {
        etags[i] = e;
    }
    Ok(())
}
