//! The KV calls in which the node moves the bytes for the client: get-into (blocks written
//! into the client's registered buffer) and put-from (blocks read out of it). One HTTP round
//! trip per batch, no lease or put id for the client to manage.
//!
//! A client on the same host gets the fast path (`crate::kv::direct`): the node maps the
//! client's buffer once (the client's engine checks the descriptor), and each owning shard
//! copies its blocks directly, in parallel with the other shards. Any other client is served
//! through the transfer engine: leases (get-into) or two-phase puts (put-from) and one batch
//! of one-sided writes or reads over tcp or rdma.
//!
//! The buffer is named by descriptors the client minted: either one per key (`targets`) or
//! one for the whole buffer with `[offset, length]` ranges in it (`buffer` + `ranges`). Every
//! range is checked against its descriptor before anything moves. The request and answer
//! bodies are [`yutu_api::kv`]'s.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::rc::Rc;

use yutu_api::kv::{CopiedResponse, EtagsResponse, GetIntoRequest, GetIntoTargets, PutFromRequest};
use yutu_api::S3ErrorCode;
use yutu_transfer::{
    DirectRange, NodeId, SegmentDescriptor, TransferEngine, TransferError, TransferRequest,
};

use super::peers::session_peer;
use super::shards::{
    bad, by_shard, check_keys, check_lens, end_puts, lease, owner_of, revoke_all, start_puts,
    DEFAULT_TTL,
};
use crate::http::ctx::Ctx;
use crate::http::error::S3Error;
use crate::kv::direct::{self, Copied};
use crate::node::Shard;

/// A range of the client's memory: the descriptor that grants it and the part of it meant.
#[derive(Clone, Copy)]
struct Span {
    desc: SegmentDescriptor,
    offset: u64,
    len: u64,
}

/// The targets of a get-into: per key, the spans its block is scattered over.
fn spans(req: &GetIntoRequest) -> Result<Vec<Vec<Span>>, S3Error> {
    let n = req.keys.len();
    let out: Vec<Span> = match req.targets() {
        Some(GetIntoTargets::PerKey(targets)) => targets
            .iter()
            .map(|d| Span {
                desc: *d,
                offset: 0,
                len: d.len,
            })
            .collect(),
        Some(GetIntoTargets::Buffer { buffer, ranges }) => ranges
            .iter()
            .map(|&(offset, len)| Span {
                desc: *buffer,
                offset,
                len,
            })
            .collect(),
        None => {
            return Err(bad(
                "Name the targets either as \"targets\" (a descriptor per key) or as \"buffer\" and \"ranges\".",
            ))
        }
    };
    let groups = yutu_api::kv::part_ranges(req.parts.as_deref(), out.len()).map_err(bad)?;
    if groups.len() != n {
        return Err(bad(match req.parts {
            None => "Give one target per key.".to_string(),
            Some(_) => format!("parts name {} blocks for {n} keys.", groups.len()),
        }));
    }
    Ok(regroup(out, &groups))
}

/// `flat` cut into the groups `groups` (consecutive index ranges covering it).
fn regroup<T: Clone>(flat: Vec<T>, groups: &[std::ops::Range<usize>]) -> Vec<Vec<T>> {
    groups.iter().map(|g| flat[g.clone()].to_vec()).collect()
}

/// A block's spans' total length.
fn room(spans: &[Span]) -> u64 {
    spans.iter().map(|s| s.len).sum()
}

/// Every range must lie inside its descriptor and name the caller's own memory: a
/// descriptor of anything else (the node's own arena under a lease, another process's
/// buffer) is refused, so get-into can never write where a reader was only allowed to read.
fn check_spans(spans: &[Span], client: NodeId) -> Result<(), S3Error> {
    for (i, s) in spans.iter().enumerate() {
        if s.desc.node != client {
            return Err(bad(format!(
                "Range {i} names memory of node {}, not the client's ({client}).",
                s.desc.node
            )));
        }
        if s.offset
            .checked_add(s.len)
            .is_none_or(|end| end > s.desc.len)
        {
            return Err(bad(format!(
                "Range {i} ({} bytes at {}) lies outside its {}-byte descriptor.",
                s.len, s.offset, s.desc.len
            )));
        }
    }
    Ok(())
}

/// The client's memory mapped here, one range per span; `None` when the client is not
/// reachable that way (another host, no shm socket, its socket broken), so the caller falls
/// back to the transfer engine.
async fn map_spans(
    engine: &TransferEngine,
    spans: &[Span],
) -> Result<Option<Vec<DirectRange>>, S3Error> {
    let mut distinct: Vec<SegmentDescriptor> = Vec::new();
    let mut seen: HashSet<SegmentDescriptor> = HashSet::new();
    let mut mapped: HashMap<SegmentDescriptor, DirectRange> = HashMap::new();
    for s in spans {
        if !seen.insert(s.desc) {
            continue;
        }
        match engine.map_direct_cached(&s.desc) {
            Some(r) => {
                mapped.insert(s.desc, r);
            }
            None => distinct.push(s.desc),
        }
    }
    if !distinct.is_empty() {
        // A check round trip with the client: off the shard's thread.
        let e = engine.clone();
        let asked = distinct.clone();
        let answers = match glommio::executor()
            .spawn_blocking(move || e.map_direct(&asked))
            .await
        {
            Ok(a) => a,
            Err(TransferError::Unavailable { .. } | TransferError::UnknownPeer { .. }) => {
                return Ok(None)
            }
            Err(e) => return Err(unreachable_buffer(&e)),
        };
        for (desc, answer) in distinct.into_iter().zip(answers) {
            match answer {
                Ok(r) => {
                    mapped.insert(desc, r);
                }
                Err(e @ TransferError::Refused { .. }) => return Err(unreachable_buffer(&e)),
                // The client's socket broke: the engine's paths (with tcp) may still work.
                Err(_) => return Ok(None),
            }
        }
    }
    let mut out = Vec::with_capacity(spans.len());
    for s in spans {
        let r = mapped
            .get(&s.desc)
            .ok_or_else(|| S3Error::new(S3ErrorCode::InternalError))?;
        out.push(r.sub(s.offset, s.len).map_err(|e| unreachable_buffer(&e))?);
    }
    Ok(Some(out))
}

/// [`map_spans`] over every block's spans, answered per block.
async fn map_blocks(
    engine: &TransferEngine,
    blocks: &[Vec<Span>],
) -> Result<Option<Vec<Vec<DirectRange>>>, S3Error> {
    let flat: Vec<Span> = blocks.iter().flatten().copied().collect();
    let Some(mapped) = map_spans(engine, &flat).await? else {
        return Ok(None);
    };
    let mut mapped = mapped.into_iter();
    Ok(Some(
        blocks
            .iter()
            .map(|b| mapped.by_ref().take(b.len()).collect())
            .collect(),
    ))
}

fn unreachable_buffer(e: &TransferError) -> S3Error {
    bad(format!("Cannot reach the client's buffer: {e}."))
}

/// `POST /v1/kv/{bucket}/get-into`.
pub(in crate::http) async fn get_into(
    ctx: &Ctx,
    bucket: &str,
    req: GetIntoRequest,
) -> Result<CopiedResponse, S3Error> {
    check_keys(&req.keys)?;
    let spans = spans(&req)?;
    let (engine, client) = session_peer(ctx, &req.session)?;
    check_spans(&spans.concat(), client.node)?;
    let copied = match map_blocks(&engine, &spans).await? {
        Some(targets) => copy_out_direct(ctx, bucket, &req.keys, targets).await?,
        None => {
            let _call = super::peers::engine_call(ctx)?;
            copy_out_engine(ctx, &engine, bucket, &req.keys, &spans).await?
        }
    };
    Ok(CopiedResponse { copied })
}

/// A shard's keys with their mapped ranges (several when a block is scattered or gathered).
type Items = Vec<(String, Vec<DirectRange>)>;

/// Runs `op` on each owning shard with its keys and their mapped ranges, all shards at
/// once; per shard, the indices of its keys and its answer.
async fn on_owners<R, F>(
    ctx: &Ctx,
    bucket: &str,
    keys: &[String],
    ranges: Vec<Vec<DirectRange>>,
    op: fn(Rc<Shard>, String, Items) -> F,
) -> Result<Vec<(Vec<usize>, R)>, S3Error>
where
    R: Send + 'static,
    F: std::future::Future<Output = R> + 'static,
{
    let groups = by_shard(ctx, bucket, keys);
    let calls = groups.iter().map(|(shard, idx)| {
        let items: Items = idx
            .iter()
            .map(|&i| (keys[i].clone(), ranges[i].clone()))
            .collect();
        let b = bucket.to_string();
        ctx.shard.run_async(*shard, move |s| op(s, b, items))
    });
    let answers = futures::future::join_all(calls).await;
    let mut out = Vec::with_capacity(answers.len());
    for ((_, idx), answer) in groups.into_iter().zip(answers) {
        out.push((idx, answer?));
    }
    Ok(out)
}

async fn copy_out_direct(
    ctx: &Ctx,
    bucket: &str,
    keys: &[String],
    targets: Vec<Vec<DirectRange>>,
) -> Result<Vec<Option<u64>>, S3Error> {
    let answers = on_owners(ctx, bucket, keys, targets, direct::copy_out).await?;
    let mut copied = vec![None; keys.len()];
    for (idx, answer) in answers {
        for (i, c) in idx.into_iter().zip(answer?) {
            copied[i] = match c {
                Copied::Len(n) => Some(n),
                Copied::Missing => None,
                Copied::TooSmall { len, room } => {
                    return Err(bad(format!(
                        "Target {i} has {room} bytes; block {} has {len}.",
                        keys[i]
                    )))
                }
                Copied::Unreachable(why) => {
                    return Err(bad(format!(
                        "Cannot write into the client's buffer: {why}."
                    )))
                }
            };
        }
    }
    Ok(copied)
}

/// get-into through the engine: lease, one batch of one-sided writes, release.
async fn copy_out_engine(
    ctx: &Ctx,
    engine: &TransferEngine,
    bucket: &str,
    keys: &[String],
    spans: &[Vec<Span>],
) -> Result<Vec<Option<u64>>, S3Error> {
    let (leases, found) = lease(ctx, bucket, keys, DEFAULT_TTL).await?;
    let result = async {
        let mut requests = Vec::new();
        let mut copied = vec![None; found.len()];
        let mut segments = ShardSegments::default();
        for (i, f) in found.iter().enumerate() {
            let Some((shard, b, _)) = f else { continue };
            let parts = &spans[i];
            if room(parts) < b.len {
                return Err(bad(format!(
                    "Target {i} has {} bytes; block {} has {}.",
                    room(parts),
                    keys[i],
                    b.len
                )));
            }
            let segment = segments.get(ctx, *shard).await?;
            // Scatter: each span takes the block's next bytes until the block is out.
            let mut done = 0;
            for span in parts {
                let take = span.len.min(b.len - done);
                if take == 0 {
                    break;
                }
                requests.push(
                    TransferRequest::write(&segment, b.offset + done, &span.desc)
                        .range(span.offset, take),
                );
                done += take;
            }
            copied[i] = Some(b.len);
        }
        run_batch(engine, requests).await?;
        Ok(copied)
    }
    .await;
    for id in leases {
        let shard = owner_of(ctx, id)?;
        let holder = ctx.holder();
        let _ = ctx
            .shard
            .run(shard, move |s| {
                s.tier.store.borrow_mut().release_lease_by(id, &holder)
            })
            .await;
    }
    result
}

/// The shards' arena segments, fetched once per call.
#[derive(Default)]
struct ShardSegments(BTreeMap<usize, yutu_transfer::LocalSegment>);

impl ShardSegments {
    async fn get(
        &mut self,
        ctx: &Ctx,
        shard: usize,
    ) -> Result<yutu_transfer::LocalSegment, S3Error> {
        if let Some(s) = self.0.get(&shard) {
            return Ok(s.clone());
        }
        let s = ctx
            .shard
            .run(shard, |s| s.transfer.as_ref().map(|(_, seg)| seg.clone()))
            .await?
            .ok_or_else(|| S3Error::new(S3ErrorCode::ServiceUnavailable))?;
        self.0.insert(shard, s.clone());
        Ok(s)
    }
}

async fn run_batch(engine: &TransferEngine, requests: Vec<TransferRequest>) -> Result<(), S3Error> {
    if requests.is_empty() {
        return Ok(());
    }
    let handle = engine
        .submit(requests)
        .map_err(|e| unreachable_buffer(&e))?;
    handle.await.into_result().map_err(|e| {
        S3Error::new(S3ErrorCode::InternalError).msg(format!(
            "Moving bytes to or from the client's buffer failed: {e}."
        ))
    })?;
    Ok(())
}

/// Pins `keys` (by name, before they are stored, so no eviction comes in between).
async fn pin_blocks(
    ctx: &Ctx,
    bucket: &str,
    keys: &[String],
    pin: yutu_api::kv::BlockPin,
) -> Result<(), S3Error> {
    use crate::engine::pinning::AdminPin;
    let kind = match pin.soft_ttl_secs {
        None => AdminPin::Hard,
        Some(s @ 1..=yutu_api::kv::MAX_SOFT_PIN_SECS) => {
            AdminPin::Soft(std::time::Instant::now() + std::time::Duration::from_secs(s))
        }
        Some(_) => {
            return Err(super::shards::bad(format!(
                "pin.soft_ttl_secs must be 1 to {}.",
                yutu_api::kv::MAX_SOFT_PIN_SECS
            )))
        }
    };
    for (shard, idx) in super::shards::by_shard(ctx, bucket, keys) {
        let (b, ks): (String, Vec<String>) = (
            bucket.to_string(),
            idx.iter().map(|&i| keys[i].clone()).collect(),
        );
        ctx.shard
            .run(shard, move |s| {
                s.tier.store.borrow_mut().pin_keys(&b, &ks, kind)
            })
            .await?
            .map_err(|e| S3Error::new(S3ErrorCode::InvalidRequest).msg(e.to_string()))?;
    }
    Ok(())
}

/// `POST /v1/kv/{bucket}/put-from`.
pub(in crate::http) async fn put_from(
    ctx: &Ctx,
    bucket: &str,
    req: PutFromRequest,
) -> Result<EtagsResponse, S3Error> {
    let groups = yutu_api::kv::part_ranges(req.parts.as_deref(), req.blocks.len()).map_err(bad)?;
    let requested = groups.len();
    let mut spans: Vec<Vec<Span>> = Vec::with_capacity(requested);
    let mut lens = Vec::with_capacity(requested);
    for g in groups {
        let entries = &req.blocks[g];
        let key = &entries[0].key;
        if let Some(other) = entries.iter().find(|b| &b.key != key) {
            return Err(bad(format!(
                "The parts of block {key} name another key, {}.",
                other.key
            )));
        }
        let parts: Vec<Span> = entries
            .iter()
            .map(|b| Span {
                desc: req.buffer,
                offset: b.offset,
                len: b.len,
            })
            .collect();
        lens.push((key.clone(), room(&parts)));
        spans.push(parts);
    }
    let keys: Vec<String> = lens.iter().map(|(k, _)| k.clone()).collect();
    check_keys(&keys)?;
    check_lens(ctx, &lens)?;
    let (engine, client) = session_peer(ctx, &req.session)?;
    check_spans(&spans.concat(), client.node)?;
    if let Some(pin) = req.pin {
        pin_blocks(ctx, bucket, &keys, pin).await?;
    }
    // With `if_absent`, the blocks whose key is present are left out here and answer an
    // empty ETag; `wanted` maps the blocks still to store back onto the request.
    let wanted: Vec<usize> = if req.if_absent {
        let present = super::shards::exists(ctx, bucket, &keys).await?;
        (0..requested).filter(|&i| !present[i]).collect()
    } else {
        (0..requested).collect()
    };
    let mut etags = vec![String::new(); requested];
    if wanted.is_empty() {
        return Ok(EtagsResponse { etags });
    }
    let (keys, lens, spans) = if wanted.len() == requested {
        (keys, lens, spans)
    } else {
        (
            wanted.iter().map(|&i| keys[i].clone()).collect(),
            wanted.iter().map(|&i| lens[i].clone()).collect(),
            wanted.iter().map(|&i| spans[i].clone()).collect::<Vec<_>>(),
        )
    };
    let stored = match map_blocks(&engine, &spans).await? {
        Some(sources) => put_from_direct(ctx, bucket, &keys, sources).await?,
        None => {
            let _call = super::peers::engine_call(ctx)?;
            put_from_engine(ctx, &engine, bucket, &lens, &spans).await?
        }
    };
    for (i, etag) in wanted.into_iter().zip(stored) {
        etags[i] = etag;
    }
    Ok(EtagsResponse { etags })
}

async fn put_from_direct(
    ctx: &Ctx,
    bucket: &str,
    keys: &[String],
    sources: Vec<Vec<DirectRange>>,
) -> Result<Vec<String>, S3Error> {
    let answers = on_owners(ctx, bucket, keys, sources, direct::put_from).await?;
    let mut etags = vec![String::new(); keys.len()];
    for (idx, answer) in answers {
        for (i, r) in idx.into_iter().zip(answer) {
            etags[i] = r.map_err(|e| S3Error::from(e).key(&keys[i]))?.etag.clone();
        }
    }
    Ok(etags)
}

/// put-from through the engine: put-start, one batch of one-sided reads from the client into
/// the reserved ranges, put-end (or revoke when the reads fail).
async fn put_from_engine(
    ctx: &Ctx,
    engine: &TransferEngine,
    bucket: &str,
    blocks: &[(String, u64)],
    spans: &[Vec<Span>],
) -> Result<Vec<String>, S3Error> {
    let (ids, reserved) = start_puts(ctx, bucket, blocks, DEFAULT_TTL).await?;
    let moved = async {
        let mut segments = ShardSegments::default();
        let mut requests = Vec::with_capacity(blocks.len());
        for ((key, len), (parts, desc)) in blocks.iter().zip(spans.iter().zip(&reserved)) {
            if *len == 0 {
                continue;
            }
            let shard = ctx.shard.owner(bucket, key);
            let segment = segments.get(ctx, shard).await?;
            // Gather: each span fills the reserved range's next bytes.
            let mut done = 0;
            for span in parts.iter().filter(|s| s.len > 0) {
                requests.push(
                    TransferRequest::read(&segment, desc.offset + done, &span.desc)
                        .range(span.offset, span.len),
                );
                done += span.len;
            }
        }
        run_batch(engine, requests).await
    }
    .await;
    if let Err(e) = moved {
        revoke_all(ctx, bucket, &ids).await;
        return Err(e);
    }
    end_puts(ctx, bucket, &ids).await
}
