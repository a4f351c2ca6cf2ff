//! The same-host fast path of the KV API: the owning shard copies blocks straight between its
//! arena and the client's registered buffer, mapped into the node ([`DirectRange`]).
//!
//! With the client on the same host, a get-into or put-from needs no lease, no pending put
//! and no transfer thread: the owner looks the key up and `memcpy`s, in one step that does
//! not yield, so a reader sees the old block or the whole new one and nothing can evict the
//! bytes mid-copy. A get-into copies a run of blocks at once, and a put-from reserves room
//! for a run and fills it at once (one system call for the run when the client's memory is
//! reached by cross-memory attach); long batches yield between runs, so one client cannot
//! hold a shard for the length of a 64 MiB batch. Blocks only on
//! NVMe are read (and promoted) as a GET would. A large copy is shared with copy helpers while
//! a core is idle, and a shard done with its part of a batch sends one to the other shards'
//! copies (`yutu_transfer::split_copy`).

use std::rc::Rc;
use std::sync::Arc;

use yutu_transfer::DirectRange;

use crate::model::conditions::ReadConditions;
use crate::model::StoreError;
use crate::node::Shard;
use crate::tier::PutResult;

/// One key of a call as a shard's part of it names it: the call's keys are shared by all of
/// its owners rather than copied for each (a batch of 4 KiB blocks spends a good part of its
/// time allocating).
#[derive(Debug, Clone)]
pub struct CallKey {
    keys: Arc<[String]>,
    i: usize,
}

impl CallKey {
    /// Key `i` of `keys`.
    pub fn new(keys: Arc<[String]>, i: usize) -> CallKey {
        debug_assert!(i < keys.len());
        CallKey { keys, i }
    }

    fn as_str(&self) -> &str {
        &self.keys[self.i]
    }
}

impl std::ops::Deref for CallKey {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

/// A block's mapped ranges: one, unless the client scattered or gathered the block (kept
/// inline then: a batch of 4 KiB blocks otherwise allocates and frees a list per block).
pub type Ranges = smallvec::SmallVec<[DirectRange; 1]>;

/// A shard's keys of a call, each with its mapped ranges.
pub type Items = Vec<(CallKey, Ranges)>;

/// What a get-into did for one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Copied {
    /// The block's bytes are in the client's buffer.
    Len(u64),
    /// No such key in any tier.
    Missing,
    /// The block did not fit the room the client gave it; nothing was written for it.
    TooSmall { len: u64, room: u64 },
    /// The client's memory could not be written (its process exited, the range was
    /// unmapped): why. The call fails; the node does not.
    Unreachable(String),
}

/// Scatters `bytes` over the ranges of `target`, in order (one range unless the client
/// split the block's room): runs of ranges in one client process go in one system call.
fn copy_into(target: &[DirectRange], bytes: &[u8]) -> Copied {
    let (len, room) = (bytes.len() as u64, total(target));
    if len > room {
        return Copied::TooSmall { len, room };
    }
    match DirectRange::scatter(target, bytes) {
        Ok(()) => Copied::Len(len),
        Err(e) => Copied::Unreachable(e.to_string()),
    }
}

/// Bytes in `ranges` together.
fn total(ranges: &[DirectRange]) -> u64 {
    ranges.iter().map(DirectRange::len).sum()
}

/// Gathers the ranges of `source`, in order, into `dst` (their total length).
fn gather(source: &[DirectRange], dst: &mut [u8]) -> bool {
    DirectRange::gather(source, dst).is_ok()
}

/// Most keys one batched copy of a get-into covers.
const RUN_KEYS: usize = 256;
/// Most bytes of room one batched copy covers past its first key: the shard yields between
/// runs, so one client's 64 MiB batch does not hold it for the whole copy.
const RUN_BYTES: u64 = 4 << 20;

/// get-into for a same-host client: each key's block copied into its target range. The keys
/// go in runs (at most [`RUN_KEYS`], [`RUN_BYTES`] of room): a run's blocks are looked up
/// together and copied together, one system call for a run of small blocks when the client's
/// memory is reached by cross-memory attach (it was three a block).
pub async fn copy_out(
    shard: Rc<Shard>,
    bucket: String,
    items: Items,
) -> Result<Vec<Copied>, StoreError> {
    let working = yutu_transfer::split_copy::working();
    let mut out = Vec::with_capacity(items.len());
    let mut start = 0;
    while start < items.len() {
        let end = run_end(&items, start);
        let run = &items[start..end];
        let keys: Vec<&str> = run.iter().map(|(k, _)| k.as_str()).collect();
        let copied = shard
            .tier
            .read_many_with(&bucket, &keys, |found| copy_run(run, found))?;
        for ((key, target), copied) in run.iter().zip(copied) {
            let copied = match copied {
                Some(c) => {
                    shard.metrics.dram_hits.inc();
                    c
                }
                None => copy_out_nvme(&shard, &bucket, key, target).await?,
            };
            out.push(copied);
        }
        start = end;
        glommio::yield_if_needed().await;
    }
    working.offer_help();
    Ok(out)
}

/// Where the run of `items` that starts at `start` ends: at most [`RUN_KEYS`] keys, and
/// [`RUN_BYTES`] of room past the first.
fn run_end(items: &[(CallKey, Ranges)], start: usize) -> usize {
    let mut end = start + 1;
    let mut room = total(&items[start].1);
    while end < items.len() && end - start < RUN_KEYS {
        room = room.saturating_add(total(&items[end].1));
        if room > RUN_BYTES {
            break;
        }
        end += 1;
    }
    end
}

/// The copies of one run of keys whose blocks DRAM holds (`found`, in the run's order), all
/// in one [`DirectRange::scatter_each`]; `None` for the keys DRAM lacks.
fn copy_run(run: &[(CallKey, Ranges)], found: &[Option<&[u8]>]) -> Vec<Option<Copied>> {
    let mut out: Vec<Option<Copied>> = vec![None; run.len()];
    let mut batch = Vec::with_capacity(run.len());
    let mut lens = Vec::with_capacity(run.len());
    for (i, ((_, target), bytes)) in run.iter().zip(found).enumerate() {
        let Some(bytes) = *bytes else { continue };
        let (len, room) = (bytes.len() as u64, total(target));
        if len > room {
            out[i] = Some(Copied::TooSmall { len, room });
            continue;
        }
        batch.push((&target[..], bytes));
        lens.push((i, len));
    }
    for ((i, len), done) in lens.into_iter().zip(DirectRange::scatter_each(&batch)) {
        out[i] = Some(match done {
            Ok(()) => Copied::Len(len),
            Err(e) => Copied::Unreachable(e.to_string()),
        });
    }
    out
}

/// A DRAM miss: read from NVMe (promoting it, as a GET does), or report it missing.
async fn copy_out_nvme(
    shard: &Rc<Shard>,
    bucket: &str,
    key: &str,
    target: &[DirectRange],
) -> Result<Copied, StoreError> {
    if shard.tier.nvme.is_none() {
        shard.metrics.misses.inc();
        return Ok(Copied::Missing);
    }
    let got = shard
        .tier
        .get(
            bucket.to_string(),
            key.to_string(),
            None,
            false,
            ReadConditions::default(),
        )
        .get()
        .await;
    match got {
        Ok((_, _, data)) => Ok(copy_into(target, &data)),
        Err(StoreError::NoSuchKey) => Ok(Copied::Missing),
        Err(e) => Err(e),
    }
}

/// put-from for a same-host client: each block copied out of the client's buffer and
/// stored (written through for a `disk` bucket). One result per item, in order; a failed
/// item leaves the others stored. The keys of a `memory` bucket go in runs, as a get-into's
/// do: room for a run's blocks is reserved together and filled by one copy (one system call
/// for a run of small blocks when the client's memory is reached by cross-memory attach).
pub async fn put_from(shard: Rc<Shard>, bucket: String, items: Items) -> Vec<PutResult> {
    let working = yutu_transfer::split_copy::working();
    let mut out = Vec::with_capacity(items.len());
    let mut start = 0;
    while start < items.len() {
        let end = run_end(&items, start);
        out.extend(put_run(&shard, &bucket, &items[start..end]).await);
        start = end;
        glommio::yield_if_needed().await;
    }
    working.offer_help();
    out
}

/// Stores one run of put-from items: together when the bucket is a `memory` one and the
/// quota admits the whole run, else block by block (so that only the blocks past the quota
/// fail).
async fn put_run(shard: &Shard, bucket: &str, run: &[(CallKey, Ranges)]) -> Vec<PutResult> {
    let blocks: Vec<(&str, u64)> = run.iter().map(|(k, s)| (k.as_str(), total(s))).collect();
    if let Ok(_admitted) = shard.admit(bucket, &blocks) {
        let together = shard
            .tier
            .put_many_filled(bucket, &blocks, |dst| gather_run(run, dst))
            .await;
        if let Some(stored) = together {
            return stored;
        }
    }
    let mut out = Vec::with_capacity(run.len());
    for ((key, source), &(_, len)) in run.iter().zip(&blocks) {
        out.push(store_whole(shard, bucket, key, len, |dst| gather(source, dst)).await);
    }
    out
}

/// Fills the arena ranges of a run's blocks (`None`: the block found no room) from the
/// client's memory, all in one [`DirectRange::gather_each`]; whether each was filled.
fn gather_run(run: &[(CallKey, Ranges)], dst: &mut [Option<&mut [u8]>]) -> Vec<bool> {
    let mut filled = vec![false; dst.len()];
    let mut batch: Vec<(&[DirectRange], &mut [u8])> = Vec::with_capacity(dst.len());
    let mut which = Vec::with_capacity(dst.len());
    for (i, (room, (_, source))) in dst.iter_mut().zip(run).enumerate() {
        if let Some(room) = room.take() {
            batch.push((&source[..], room));
            which.push(i);
        }
    }
    for (i, done) in which.into_iter().zip(DirectRange::gather_each(&mut batch)) {
        filled[i] = done.is_ok();
    }
    filled
}

/// Stores one block of `len` bytes that `fill` writes, within the bucket's quota: what
/// put-from and an inline write do for each block on its owning shard.
pub async fn store_whole(
    shard: &Shard,
    bucket: &str,
    key: &str,
    len: u64,
    fill: impl FnOnce(&mut [u8]) -> bool,
) -> PutResult {
    let _admitted = shard.admit(bucket, &[(key, len)])?;
    shard.tier.put_filled(bucket, key, len, fill).await
}
