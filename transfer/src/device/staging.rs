//! The staging pipeline: KV blocks between device memory and the node, through a pinned host
//! buffer split in two halves.
//!
//! A batch is cut into chunks of consecutive blocks that fit one half. For a get, the node
//! fills half `k % 2` with chunk `k` (the caller's `fetch`, a blocking call that returns when
//! the bytes are there), and the device copies them to their places on stream `k % 2`
//! asynchronously, while the node already fills the other half with chunk `k + 1`. Before a
//! half is refilled, its stream is synchronized: the copies of chunk `k - 2` must have read
//! it. A put runs the other way: the device copies chunk `k + 1` into one half while the node
//! reads chunk `k` out of the other (`store`).
//!
//! Every block gets its own outcome. A failed device copy fails that block only; the rest of
//! the batch goes on and is right. A failed node call fails its chunk and everything after
//! it (the node is unlikely to answer the next chunk either, and each try would cost a
//! timeout). A cancelled pipeline stops between chunks, waits for the copies already
//! enqueued (the staging buffer must not be handed to anyone while a copy may still read or
//! write it), and reports the blocks it did not move as [`BlockError::Cancelled`].

use std::fmt;

use super::{CancelToken, Device, DeviceError, PinnedBuffer, Stream};

/// One block's place in device memory: its address and its length (for a get, the room the
/// block may fill).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceBlock {
    pub addr: u64,
    pub len: u64,
}

/// Why one block of a staged batch was not moved.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BlockError {
    /// Its copy between the staging buffer and the device failed.
    #[error("device copy failed: {0}")]
    Copy(DeviceError),
    /// The node call for its chunk failed (with the node's or the transport's message).
    #[error("{0}")]
    Node(String),
    /// The pipeline was cancelled before the block was moved.
    #[error("cancelled before the block was moved")]
    Cancelled,
}

/// What a chunk asks of the node: the batch indices of its blocks, where each lies in the
/// staging buffer, and its length (for a get, its room).
#[derive(Debug)]
pub struct ChunkRequest<'a> {
    pub blocks: &'a [usize],
    pub offsets: &'a [u64],
    pub lens: &'a [u64],
}

/// A pinned staging buffer and the two streams that copy out of and into its halves.
pub struct StagingSlot {
    pinned: PinnedBuffer,
    streams: [Box<dyn Stream>; 2],
}

impl fmt::Debug for StagingSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StagingSlot")
            .field("len", &self.pinned.len())
            .finish()
    }
}

impl StagingSlot {
    /// A slot whose halves hold `half` bytes each.
    pub fn new(device: &dyn Device, half: u64) -> Result<StagingSlot, DeviceError> {
        let len = half
            .checked_mul(2)
            .and_then(|l| usize::try_from(l).ok())
            .filter(|&l| l > 0)
            .ok_or(DeviceError::OutOfBounds {
                offset: 0,
                len: half,
                size: 0,
            })?;
        Ok(StagingSlot {
            pinned: device.alloc_pinned(len)?,
            streams: [device.stream()?, device.stream()?],
        })
    }

    /// The pinned buffer (for registering with the transfer engine).
    pub fn pinned(&self) -> &PinnedBuffer {
        &self.pinned
    }

    /// Bytes in each half: the largest block the slot stages, and the most bytes per chunk.
    pub fn half(&self) -> u64 {
        self.pinned.len() / 2
    }

    /// Host address of staging offset `off`; the caller checked `off + len <= 2 * half`.
    fn host(&self, off: u64) -> *mut u8 {
        // SAFETY (of the arithmetic): `off` is inside the region, which is one allocation.
        self.pinned.region().as_ptr().wrapping_add(off as usize)
    }

    /// Waits for both streams: nothing may still be copying when the slot goes back to its
    /// pool.
    fn settle_all<T>(&mut self, out: &mut [Option<Result<T, BlockError>>]) {
        self.settle(0, out);
        self.settle(1, out);
    }

    /// Waits for stream `h`'s copies; marks the blocks whose copy failed.
    fn settle<T>(&mut self, h: usize, out: &mut [Option<Result<T, BlockError>>]) {
        for (tag, err) in self.streams[h].synchronize() {
            if let Some(slot) = out.get_mut(tag) {
                *slot = Some(Err(BlockError::Copy(err)));
            }
        }
    }
}

/// Runs of consecutive blocks of at most `half` bytes and `max_keys` blocks each (a block
/// larger than `half` is a run of its own, refused later).
pub fn plan(lens: &[u64], half: u64, max_keys: usize) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut sum = 0u64;
    for (i, &l) in lens.iter().enumerate() {
        if i > start && (sum.saturating_add(l) > half || i - start >= max_keys.max(1)) {
            out.push(start..i);
            start = i;
            sum = 0;
        }
        sum = sum.saturating_add(l);
    }
    if start < lens.len() {
        out.push(start..lens.len());
    }
    out
}

/// Staging offsets of a chunk's blocks, packed from the start of half `h`.
fn packed(lens: &[u64], h: usize, half: u64) -> Vec<u64> {
    let mut at = h as u64 * half;
    lens.iter()
        .map(|&l| {
            let o = at;
            at += l;
            o
        })
        .collect()
}

fn finish<T>(out: Vec<Option<Result<T, BlockError>>>) -> Vec<Result<T, BlockError>> {
    out.into_iter()
        .map(|o| o.unwrap_or(Err(BlockError::Cancelled)))
        .collect()
}

fn fail_from<T>(out: &mut [Option<Result<T, BlockError>>], from: usize, err: &BlockError) {
    for o in &mut out[from..] {
        if o.is_none() {
            *o = Some(Err(err.clone()));
        }
    }
}

fn too_large(len: u64, half: u64) -> BlockError {
    BlockError::Node(format!(
        "a {len}-byte block does not fit the {half}-byte staging half"
    ))
}

/// Fetches blocks into device memory: `fetch` has the node write chunk `k` into the staging
/// buffer at the offsets it is given and returns each block's length (`None` where the key is
/// absent); the device then copies each block to `blocks[i].addr`. Returns one outcome per
/// block.
///
/// # Safety
///
/// Every `blocks[i]` must be device memory of the slot's device that the caller may write
/// for `blocks[i].len` bytes (checked with [`Device::check`]), and stay so until this returns.
pub unsafe fn get_into<E: fmt::Display>(
    slot: &mut StagingSlot,
    blocks: &[DeviceBlock],
    max_keys: usize,
    cancel: Option<&CancelToken>,
    mut fetch: impl FnMut(&ChunkRequest<'_>) -> Result<Vec<Option<u64>>, E>,
) -> Vec<Result<Option<u64>, BlockError>> {
    let half = slot.half();
    let lens: Vec<u64> = blocks.iter().map(|b| b.len).collect();
    let mut out: Vec<Option<Result<Option<u64>, BlockError>>> = vec![None; blocks.len()];
    for (k, chunk) in plan(&lens, half, max_keys).into_iter().enumerate() {
        let h = k % 2;
        // The copies of chunk k - 2 read this half: they finish before the node refills it.
        slot.settle(h, &mut out);
        if cancel.is_some_and(|c| c.is_cancelled()) {
            break;
        }
        let chunk_lens = &lens[chunk.clone()];
        if let Some(&big) = chunk_lens.iter().find(|&&l| l > half) {
            fail_from(&mut out, chunk.start, &too_large(big, half));
            break;
        }
        let indices: Vec<usize> = chunk.clone().collect();
        let offsets = packed(chunk_lens, h, half);
        let request = ChunkRequest {
            blocks: &indices,
            offsets: &offsets,
            lens: chunk_lens,
        };
        let got = match fetch(&request) {
            Ok(got) if got.len() == indices.len() => got,
            Ok(got) => {
                let err = BlockError::Node(format!(
                    "the node answered {} blocks for {}",
                    got.len(),
                    indices.len()
                ));
                fail_from(&mut out, chunk.start, &err);
                break;
            }
            Err(e) => {
                fail_from(&mut out, chunk.start, &BlockError::Node(e.to_string()));
                break;
            }
        };
        for ((&i, &off), n) in indices.iter().zip(&offsets).zip(got) {
            let Some(n) = n else {
                out[i] = Some(Ok(None));
                continue;
            };
            if n > lens[i] {
                out[i] = Some(Err(BlockError::Node(format!(
                    "the node claims {n} bytes for a block with room for {}",
                    lens[i]
                ))));
                continue;
            }
            if n == 0 {
                out[i] = Some(Ok(Some(0)));
                continue;
            }
            // SAFETY: the staging range [off, off + n) lies in half h (packed offsets of
            // blocks no longer than their room, which fits the half); nothing writes it until
            // this stream is synchronized (the next fetch into half h comes after `settle`).
            // The device range is the caller's, per this function's contract.
            let enqueued = unsafe {
                slot.streams[h].copy_to_device(i, blocks[i].addr, slot.host(off), n as usize)
            };
            out[i] = Some(match enqueued {
                Ok(()) => Ok(Some(n)),
                Err(e) => Err(BlockError::Copy(e)),
            });
        }
    }
    slot.settle_all(&mut out);
    finish(out)
}

/// Stores blocks from device memory: the device copies chunk `k` into half `k % 2` of the
/// staging buffer, and `store` has the node read the blocks of the chunk whose copies
/// succeeded from the offsets it is given, returning one result (an ETag) per block it was
/// given. Returns one outcome per block.
///
/// # Safety
///
/// Every `blocks[i]` must be device memory of the slot's device that the caller may read for
/// `blocks[i].len` bytes, and stay so until this returns.
pub unsafe fn put_from<T, E: fmt::Display>(
    slot: &mut StagingSlot,
    blocks: &[DeviceBlock],
    max_keys: usize,
    cancel: Option<&CancelToken>,
    mut store: impl FnMut(&ChunkRequest<'_>) -> Result<Vec<T>, E>,
) -> Vec<Result<T, BlockError>> {
    let half = slot.half();
    let lens: Vec<u64> = blocks.iter().map(|b| b.len).collect();
    let chunks = plan(&lens, half, max_keys);
    let mut out: Vec<Option<Result<T, BlockError>>> = (0..blocks.len()).map(|_| None).collect();
    let offsets: Vec<Vec<u64>> = chunks
        .iter()
        .enumerate()
        .map(|(k, r)| packed(&lens[r.clone()], k % 2, half))
        .collect();
    // Enqueues the device-to-host copies of chunk k into its half; false if it cannot be
    // staged at all (a block larger than a half).
    let stage = |slot: &mut StagingSlot,
                 k: usize,
                 out: &mut Vec<Option<Result<T, BlockError>>>|
     -> bool {
        let h = k % 2;
        if let Some(&big) = lens[chunks[k].clone()].iter().find(|&&l| l > half) {
            fail_from(out, chunks[k].start, &too_large(big, half));
            return false;
        }
        for (i, &off) in chunks[k].clone().zip(&offsets[k]) {
            if lens[i] == 0 {
                continue;
            }
            // SAFETY: [off, off + len) is in half h, which no node call uses until this
            // stream is synchronized; the device range is the caller's, per the contract.
            let enqueued = unsafe {
                slot.streams[h].copy_to_host(i, slot.host(off), blocks[i].addr, lens[i] as usize)
            };
            match enqueued {
                Ok(()) => {}
                Err(e) => out[i] = Some(Err(BlockError::Copy(e))),
            }
        }
        true
    };
    let mut staged = !chunks.is_empty() && stage(slot, 0, &mut out);
    for k in 0..chunks.len() {
        if !staged {
            break;
        }
        let h = k % 2;
        // Chunk k's bytes must be in the half before the node reads them.
        slot.settle(h, &mut out);
        if cancel.is_some_and(|c| c.is_cancelled()) {
            break;
        }
        // The next chunk's copies run while the node reads this one (the other half's last
        // reader, chunk k - 1's store, has returned).
        let next_ok = k + 1 >= chunks.len() || stage(slot, k + 1, &mut out);
        let survivors: Vec<(usize, u64)> = chunks[k]
            .clone()
            .zip(offsets[k].iter().copied())
            .filter(|&(i, _)| out[i].is_none())
            .collect();
        if !survivors.is_empty() {
            let indices: Vec<usize> = survivors.iter().map(|&(i, _)| i).collect();
            let offs: Vec<u64> = survivors.iter().map(|&(_, o)| o).collect();
            let ls: Vec<u64> = indices.iter().map(|&i| lens[i]).collect();
            let request = ChunkRequest {
                blocks: &indices,
                offsets: &offs,
                lens: &ls,
            };
            match store(&request) {
                Ok(results) if results.len() == indices.len() => {
                    for (i, r) in indices.into_iter().zip(results) {
                        out[i] = Some(Ok(r));
                    }
                }
                Ok(results) => {
                    let err = BlockError::Node(format!(
                        "the node answered {} blocks for {}",
                        results.len(),
                        indices.len()
                    ));
                    fail_from(&mut out, chunks[k].start, &err);
                    break;
                }
                Err(e) => {
                    fail_from(&mut out, chunks[k].start, &BlockError::Node(e.to_string()));
                    break;
                }
            }
        }
        staged = next_ok;
    }
    slot.settle_all(&mut out);
    // Blocks copied into a half but never stored (a cancel, or a failed chunk before them)
    // were settled as successful copies: they are still not stored.
    finish(out)
}
