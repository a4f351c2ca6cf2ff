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
use std::sync::Arc;

use yutu_api::kv::{CopiedResponse, EtagsResponse, GetIntoRequest, GetIntoTargets, PutFromRequest};
use yutu_transfer::{
    DirectRange, NodeId, SegmentDescriptor, TransferEngine, TransferError, TransferRequest,
};

use crate::kv::calls::{
    check_keys, check_lens, end_puts, exists_by, lease, released, revoke_all, start_puts,
    DEFAULT_TTL,
};
use crate::kv::direct::{self, CallKey, Copied, Items, Ranges};
use crate::kv::error::KvError;
use crate::kv::ops;
use crate::kv::owners::{pick, Owners};
use crate::kv::sessions::{engine_call, session_peer};
use crate::kv::Caller;
use crate::node::Shard;
use crate::tier::Step;

/// A range of the client's memory: the descriptor that grants it and the part of it meant.
#[derive(Clone, Copy)]
struct Span {
    desc: SegmentDescriptor,
    offset: u64,
    len: u64,
}

/// A block's spans: one, unless the client scatters or gathers it (inline then, as
/// [`Ranges`]).
type Spans = smallvec::SmallVec<[Span; 1]>;

/// The targets of a get-into: per key, the spans its block is scattered over.
fn spans(req: &GetIntoRequest) -> Result<Vec<Spans>, KvError> {
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
            return Err(KvError::invalid(
                "Name the targets either as \"targets\" (a descriptor per key) or as \"buffer\" and \"ranges\".",
            ))
        }
    };
    let groups =
        yutu_api::kv::part_ranges(req.parts.as_deref(), out.len()).map_err(KvError::Invalid)?;
    if groups.len() != n {
        return Err(KvError::invalid(match req.parts {
            None => "Give one target per key.".to_string(),
            Some(_) => format!("parts name {} blocks for {n} keys.", groups.len()),
        }));
    }
    Ok(regroup(out, &groups))
}

/// `flat` cut into the groups `groups` (consecutive index ranges covering it).
fn regroup(flat: Vec<Span>, groups: &[std::ops::Range<usize>]) -> Vec<Spans> {
    groups
        .iter()
        .map(|g| Spans::from_slice(&flat[g.clone()]))
        .collect()
}

/// A block's spans' total length.
fn room(spans: &[Span]) -> u64 {
    spans.iter().map(|s| s.len).sum()
}

/// Every range must lie inside its descriptor and name the caller's own memory: a
/// descriptor of anything else (the node's own arena under a lease, another process's
/// buffer) is refused, so get-into can never write where a reader was only allowed to read.
fn check_spans(spans: &[Span], client: NodeId) -> Result<(), KvError> {
    for (i, s) in spans.iter().enumerate() {
        if s.desc.node != client {
            return Err(KvError::invalid(format!(
                "Range {i} names memory of node {}, not the client's ({client}).",
                s.desc.node
            )));
        }
        if s.offset
            .checked_add(s.len)
            .is_none_or(|end| end > s.desc.len)
        {
            return Err(KvError::invalid(format!(
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
) -> Result<Option<Vec<DirectRange>>, KvError> {
    // Most calls name one buffer for every span: a span like the one before it is neither
    // hashed nor looked up again (hashing a descriptor was 3% of a 4 KiB put on the node).
    let mut distinct: Vec<SegmentDescriptor> = Vec::new();
    let mut seen: HashSet<SegmentDescriptor> = HashSet::new();
    let mut mapped: HashMap<SegmentDescriptor, DirectRange> = HashMap::new();
    let mut previous: Option<&SegmentDescriptor> = None;
    for s in spans {
        if previous == Some(&s.desc) {
            continue;
        }
        previous = Some(&s.desc);
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
    let mut previous: Option<(&SegmentDescriptor, &DirectRange)> = None;
    for s in spans {
        let r = match previous {
            Some((d, r)) if *d == s.desc => r,
            _ => {
                let r = mapped
                    .get(&s.desc)
                    .ok_or(KvError::Internal("a span's descriptor was not mapped"))?;
                previous = Some((&s.desc, r));
                r
            }
        };
        out.push(r.sub(s.offset, s.len).map_err(|e| unreachable_buffer(&e))?);
    }
    Ok(Some(out))
}

/// [`map_spans`] over every block's spans, answered per block.
async fn map_blocks(
    engine: &TransferEngine,
    blocks: &[Spans],
) -> Result<Option<Vec<Ranges>>, KvError> {
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

fn unreachable_buffer(e: &TransferError) -> KvError {
    KvError::invalid(format!("Cannot reach the client's buffer: {e}."))
}

/// get-into: the blocks written into the client's registered memory.
pub async fn get_into(
    caller: &Caller<'_>,
    bucket: &str,
    req: GetIntoRequest,
) -> Result<CopiedResponse, KvError> {
    check_keys(&req.keys)?;
    let spans = spans(&req)?;
    let (engine, client) = session_peer(caller, &req.session)?;
    check_spans(&spans.concat(), client.node)?;
    let copied = match map_blocks(&engine, &spans).await? {
        Some(targets) => copy_out_direct(caller, bucket, req.keys.into(), targets).await?,
        None => {
            let _call = engine_call(caller)?;
            copy_out_engine(caller, &engine, bucket, &req.keys, &spans).await?
        }
    };
    Ok(CopiedResponse { copied })
}

/// Runs `op` on each owning shard with its keys and their mapped ranges, all shards at
/// once; per shard, the indices of its keys and its answer.
async fn on_owners<R, F>(
    caller: &Caller<'_>,
    bucket: &str,
    keys: &Arc<[String]>,
    owners: Owners,
    ranges: Vec<Ranges>,
    op: fn(Rc<Shard>, String, Items) -> F,
) -> Result<Vec<(Vec<usize>, R)>, KvError>
where
    R: Send + 'static,
    F: std::future::Future<Output = R> + 'static,
{
    let b = bucket.to_string();
    // Each index is in exactly one owner's group: its ranges move there, uncopied.
    let mut ranges = ranges;
    let answers = owners
        .run(
            caller.here,
            |idx| -> Items {
                idx.iter()
                    .map(|&i| {
                        (
                            CallKey::new(keys.clone(), i),
                            std::mem::take(&mut ranges[i]),
                        )
                    })
                    .collect()
            },
            move |s, items| Step::Wait(Box::pin(op(s.clone(), b, items))),
        )
        .await;
    let mut out = Vec::with_capacity(answers.len());
    for ((_, idx), answer) in owners.groups().iter().zip(answers) {
        out.push((idx.clone(), answer?));
    }
    Ok(out)
}

async fn copy_out_direct(
    caller: &Caller<'_>,
    bucket: &str,
    keys: Arc<[String]>,
    targets: Vec<Ranges>,
) -> Result<Vec<Option<u64>>, KvError> {
    let owners = Owners::of_keys(caller.here, bucket, &keys);
    let answers = on_owners(caller, bucket, &keys, owners, targets, direct::copy_out).await?;
    let mut copied = vec![None; keys.len()];
    for (idx, answer) in answers {
        for (i, c) in idx.into_iter().zip(answer?) {
            copied[i] = match c {
                Copied::Len(n) => Some(n),
                Copied::Missing => None,
                Copied::TooSmall { len, room } => {
                    return Err(KvError::invalid(format!(
                        "Target {i} has {room} bytes; block {} has {len}.",
                        keys[i]
                    )))
                }
                Copied::Unreachable(why) => {
                    return Err(KvError::invalid(format!(
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
    caller: &Caller<'_>,
    engine: &TransferEngine,
    bucket: &str,
    keys: &[String],
    spans: &[Spans],
) -> Result<Vec<Option<u64>>, KvError> {
    let (leases, found) = lease(caller, bucket, keys, DEFAULT_TTL).await?;
    let result = async {
        let mut requests = Vec::new();
        let mut copied = vec![None; found.len()];
        let mut segments = ShardSegments::default();
        for (i, f) in found.iter().enumerate() {
            let Some((shard, b, _)) = f else { continue };
            let parts = &spans[i];
            if room(parts) < b.len {
                return Err(KvError::invalid(format!(
                    "Target {i} has {} bytes; block {} has {}.",
                    room(parts),
                    keys[i],
                    b.len
                )));
            }
            let segment = segments.get(caller, *shard).await?;
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
    // Best effort: a lease not given back ends at its deadline.
    let _ = released(caller, &leases).await;
    result
}

/// The shards' arena segments, fetched once per call.
#[derive(Default)]
struct ShardSegments(BTreeMap<usize, yutu_transfer::LocalSegment>);

impl ShardSegments {
    async fn get(
        &mut self,
        caller: &Caller<'_>,
        shard: usize,
    ) -> Result<yutu_transfer::LocalSegment, KvError> {
        if let Some(s) = self.0.get(&shard) {
            return Ok(s.clone());
        }
        let s = caller
            .here
            .run(shard, |s| s.transfer.as_ref().map(|(_, seg)| seg.clone()))
            .await?
            .ok_or(KvError::NoEngine)?;
        self.0.insert(shard, s.clone());
        Ok(s)
    }
}

async fn run_batch(engine: &TransferEngine, requests: Vec<TransferRequest>) -> Result<(), KvError> {
    if requests.is_empty() {
        return Ok(());
    }
    let handle = engine
        .submit(requests)
        .map_err(|e| unreachable_buffer(&e))?;
    handle.await.into_result().map_err(|e| {
        KvError::Transfer(format!(
            "Moving bytes to or from the client's buffer failed: {e}."
        ))
    })?;
    Ok(())
}

/// Pins `keys` (by name, before they are stored, so no eviction comes in between).
async fn pin_blocks(
    caller: &Caller<'_>,
    bucket: &str,
    keys: &[String],
    pin: yutu_api::kv::BlockPin,
) -> Result<(), KvError> {
    use crate::store::pinning::AdminPin;
    let kind = match pin.soft_ttl_secs {
        None => AdminPin::Hard,
        Some(s @ 1..=yutu_api::kv::MAX_SOFT_PIN_SECS) => {
            AdminPin::Soft(std::time::Instant::now() + std::time::Duration::from_secs(s))
        }
        Some(_) => {
            return Err(KvError::invalid(format!(
                "pin.soft_ttl_secs must be 1 to {}.",
                yutu_api::kv::MAX_SOFT_PIN_SECS
            )))
        }
    };
    let owners = Owners::of_keys(caller.here, bucket, keys);
    let b = bucket.to_string();
    let answers = owners
        .run(
            caller.here,
            |idx| pick(keys, idx),
            move |s, ks| Step::Done(ops::pin(s, &b, &ks, kind)),
        )
        .await;
    for answer in answers {
        answer?.map_err(KvError::Pin)?;
    }
    Ok(())
}

/// put-from: the blocks read out of the client's registered memory and stored.
pub async fn put_from(
    caller: &Caller<'_>,
    bucket: &str,
    mut req: PutFromRequest,
) -> Result<EtagsResponse, KvError> {
    let groups = yutu_api::kv::part_ranges(req.parts.as_deref(), req.blocks.len())
        .map_err(KvError::Invalid)?;
    let requested = groups.len();
    let mut spans: Vec<Spans> = Vec::with_capacity(requested);
    let mut rooms = Vec::with_capacity(requested);
    // Each block's key moved out of the request (not copied: a 256-key batch of 4 KiB blocks
    // spends a good part of its time allocating).
    let mut keys: Vec<String> = Vec::with_capacity(requested);
    for g in groups {
        let entries = &mut req.blocks[g];
        let key = &entries[0].key;
        if let Some(other) = entries.iter().find(|b| &b.key != key) {
            return Err(KvError::invalid(format!(
                "The parts of block {key} name another key, {}.",
                other.key
            )));
        }
        let parts: Spans = entries
            .iter()
            .map(|b| Span {
                desc: req.buffer,
                offset: b.offset,
                len: b.len,
            })
            .collect();
        rooms.push(room(&parts));
        spans.push(parts);
        keys.push(std::mem::take(&mut entries[0].key));
    }
    check_keys(&keys)?;
    check_lens(
        caller.here,
        keys.iter().map(String::as_str).zip(rooms.iter().copied()),
    )?;
    let (engine, client) = session_peer(caller, &req.session)?;
    check_spans(&spans.concat(), client.node)?;
    if let Some(pin) = req.pin {
        pin_blocks(caller, bucket, &keys, pin).await?;
    }
    // With `if_absent`, the blocks whose key is present are left out here and answer an
    // empty ETag; `wanted` maps the blocks still to store back onto the request. The keys'
    // owners are found once, for the check and the direct store (the engine path's put-start
    // finds its own).
    let mut owners = None;
    let wanted: Vec<usize> = if req.if_absent {
        let found = owners.insert(Owners::of_keys(caller.here, bucket, &keys));
        let present = exists_by(caller.here, bucket, &keys, found).await?;
        (0..requested).filter(|&i| !present[i]).collect()
    } else {
        (0..requested).collect()
    };
    let mut etags = vec![String::new(); requested];
    if wanted.is_empty() {
        return Ok(EtagsResponse { etags });
    }
    let (keys, rooms, spans, owners) = if wanted.len() == requested {
        (keys, rooms, spans, owners)
    } else {
        (
            wanted.iter().map(|&i| keys[i].clone()).collect(),
            wanted.iter().map(|&i| rooms[i]).collect(),
            wanted.iter().map(|&i| spans[i].clone()).collect::<Vec<_>>(),
            None,
        )
    };
    let stored = match map_blocks(&engine, &spans).await? {
        Some(sources) => {
            let owners = owners.unwrap_or_else(|| Owners::of_keys(caller.here, bucket, &keys));
            put_from_direct(caller, bucket, keys.into(), owners, sources).await?
        }
        None => {
            let _call = engine_call(caller)?;
            let lens: Vec<(String, u64)> = keys.into_iter().zip(rooms).collect();
            put_from_engine(caller, &engine, bucket, &lens, &spans).await?
        }
    };
    for (i, etag) in wanted.into_iter().zip(stored) {
        etags[i] = etag;
    }
    Ok(EtagsResponse { etags })
}

async fn put_from_direct(
    caller: &Caller<'_>,
    bucket: &str,
    keys: Arc<[String]>,
    owners: Owners,
    sources: Vec<Ranges>,
) -> Result<Vec<String>, KvError> {
    let answers = on_owners(caller, bucket, &keys, owners, sources, direct::put_from).await?;
    let mut etags = vec![String::new(); keys.len()];
    for (idx, answer) in answers {
        for (i, r) in idx.into_iter().zip(answer) {
            etags[i] = r.map_err(|e| KvError::about(e, &keys[i]))?.etag.clone();
        }
    }
    Ok(etags)
}

/// put-from through the engine: put-start, one batch of one-sided reads from the client into
/// the reserved ranges, put-end (or revoke when the reads fail).
async fn put_from_engine(
    caller: &Caller<'_>,
    engine: &TransferEngine,
    bucket: &str,
    blocks: &[(String, u64)],
    spans: &[Spans],
) -> Result<Vec<String>, KvError> {
    let (ids, reserved) = start_puts(caller, bucket, blocks, DEFAULT_TTL).await?;
    let moved = async {
        let mut segments = ShardSegments::default();
        let mut requests = Vec::with_capacity(blocks.len());
        for ((key, len), (parts, desc)) in blocks.iter().zip(spans.iter().zip(&reserved)) {
            if *len == 0 {
                continue;
            }
            let shard = caller.here.owner(bucket, key);
            let segment = segments.get(caller, shard).await?;
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
        revoke_all(caller, bucket, &ids).await;
        return Err(e);
    }
    end_puts(caller, bucket, &ids).await
}
