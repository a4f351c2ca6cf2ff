//! Rooms: ranges of a shard's arena the node reserved for this client's next puts, before
//! their keys are known (`yutu_api::kv::PublishRequest`). A put through arena views that
//! finds a room of its block's exact length on its key's shard writes into it and publishes
//! it in one call (publish), and that call asks for the room the next put will take; a put
//! that finds none starts its own (put-start), so it is two calls, as without rooms. On this
//! host's small puts a call is about as long as a 1 MiB copy, so the second call is a third of
//! such a put's time.
//!
//! Bounded on both sides: this pool keeps at most [`MAX_HELD`] rooms and [`MAX_HELD_BYTES`]
//! (rooms past that are revoked at once), only calls of at most [`ROOMS_PER_CALL`] blocks a
//! shard ask for rooms (a large batch spends little on its calls), and the node counts every
//! room against the caller's limit on unfinished puts and the bucket's quota. A room is
//! written only within half its ttl of being asked for, as a started put is (`view_calls`):
//! older ones are revoked, and the node takes back what is never published at its ttl.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use yutu_api::kv::{KvOp, PutIdsRequest, RevokeResponse, Room};
use yutu_api::kv_frame::{self, FrameOp};

use super::frames::Frames;

use super::arena::VIEW_TTL_MS;

/// Most rooms held at once.
pub(super) const MAX_HELD: usize = 16;

/// Most bytes of rooms held at once.
pub(super) const MAX_HELD_BYTES: u64 = 64 << 20;

/// A call asks for rooms only when a shard's part of it has at most this many blocks.
pub(super) const ROOMS_PER_CALL: usize = 4;

/// How many recent put lengths are remembered: rooms are asked for only for a length that
/// came before among them (a room fits one exact length).
const RECENT_LENS: usize = 8;

/// A room held here: its shard and bucket, and when it was asked for.
#[derive(Debug, Clone)]
pub(super) struct Held {
    pub shard: usize,
    pub bucket: String,
    pub room: Room,
    pub asked: Instant,
}

impl Held {
    /// Whether the room may still be written: within half its ttl of being asked for.
    pub fn fresh(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.asked) < Duration::from_millis(VIEW_TTL_MS / 2)
    }

    fn len(&self) -> u64 {
        self.room.descriptor.len
    }
}

/// The rooms a client holds, for all its threads.
#[derive(Debug, Default)]
pub(super) struct Rooms {
    held: Mutex<Vec<Held>>,
    /// Rooms taken for puts (each a put in one call).
    taken: AtomicU64,
    /// The last [`RECENT_LENS`] lengths put, newest last.
    recent: Mutex<Vec<u64>>,
}

impl Rooms {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Held>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A fresh room of exactly `len` bytes on `shard` for `bucket`, if one is held; the stale
    /// rooms found on the way go to `stale` (to revoke).
    pub fn take(
        &self,
        shard: usize,
        bucket: &str,
        len: u64,
        stale: &mut Vec<Held>,
    ) -> Option<Held> {
        let now = Instant::now();
        let mut held = self.lock();
        let mut i = 0;
        while i < held.len() {
            if !held[i].fresh(now) {
                stale.push(held.swap_remove(i));
                continue;
            }
            let h = &held[i];
            if h.shard == shard && h.len() == len && h.bucket == bucket {
                self.taken.fetch_add(1, Ordering::Relaxed);
                return Some(held.swap_remove(i));
            }
            i += 1;
        }
        None
    }

    /// Notes a put of `len` bytes; whether the length came before among the recent ones. A
    /// client whose lengths do not repeat would only fill the pool with rooms no put fits.
    pub fn repeats(&self, len: u64) -> bool {
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        let seen = recent.contains(&len);
        if recent.len() == RECENT_LENS {
            recent.remove(0);
        }
        recent.push(len);
        seen
    }

    /// How many rooms of `len` bytes a call may ask for, at most `want`: what fits under the
    /// bounds beside the rooms held now.
    pub fn room_for(&self, want: usize, len: u64) -> usize {
        let held = self.lock();
        let bytes: u64 = held.iter().map(Held::len).sum();
        let by_bytes = MAX_HELD_BYTES.saturating_sub(bytes) / len.max(1);
        want.min(MAX_HELD.saturating_sub(held.len()))
            .min(usize::try_from(by_bytes).unwrap_or(usize::MAX))
    }

    /// Keeps rooms a call was given (or gives back ones it did not use); those past the bounds
    /// come back, to revoke.
    pub fn keep(&self, rooms: impl IntoIterator<Item = Held>) -> Vec<Held> {
        let mut held = self.lock();
        let mut bytes: u64 = held.iter().map(Held::len).sum();
        let mut over = Vec::new();
        for r in rooms {
            if held.len() < MAX_HELD && bytes + r.len() <= MAX_HELD_BYTES {
                bytes += r.len();
                held.push(r);
            } else {
                over.push(r);
            }
        }
        over
    }

    /// Every room held, to revoke (the client is going away).
    pub fn drain(&self) -> Vec<Held> {
        std::mem::take(&mut *self.lock())
    }

    /// How many rooms are held.
    pub fn count(&self) -> usize {
        self.lock().len()
    }

    /// How many rooms puts have taken.
    pub fn taken(&self) -> u64 {
        self.taken.load(Ordering::Relaxed)
    }
}

/// Best effort: revokes rooms this client will not use (stale, past the pool's bounds, or
/// all of them as it goes), as [`revoke_puts`] does, a bucket at a time.
pub(super) fn revoke_rooms(frames: &Frames, rooms: Vec<Held>, wait: bool) {
    let mut by: BTreeMap<String, BTreeMap<usize, Vec<u64>>> = BTreeMap::new();
    for h in rooms {
        by.entry(h.bucket)
            .or_default()
            .entry(h.shard)
            .or_default()
            .push(h.room.put_id);
    }
    for (bucket, by_shard) in by {
        revoke_puts(frames, &bucket, by_shard, wait);
    }
}

/// Best effort: revokes `bucket`'s started puts and rooms, given as (shard, put ids), one call
/// per shard (distinct shards), every call sent before any answer is read. With `wait` the
/// answers are read before this returns (the ranges are back in the user's limit by then);
/// without, their answers are read before the connections' next calls (a put does not wait
/// for a clean-up). What is not revoked ends at its ttl.
pub(super) fn revoke_puts(
    frames: &Frames,
    bucket: &str,
    by_shard: impl IntoIterator<Item = (usize, Vec<u64>)>,
    wait: bool,
) {
    let calls: Vec<(usize, Vec<u8>)> = by_shard
        .into_iter()
        .filter(|(_, put_ids)| !put_ids.is_empty())
        .filter_map(|(shard, put_ids)| {
            let body = kv_frame::encode_call(bucket, &PutIdsRequest { put_ids }).ok()?;
            Some((shard, body))
        })
        .collect();
    if calls.is_empty() {
        return;
    }
    let op = FrameOp::Kv(KvOp::Revoke);
    let sent = match wait {
        true => frames
            .call_each::<RevokeResponse>(op, &calls, false)
            .map(drop),
        false => frames.send_each(op, &calls),
    };
    if let Err(e) = sent {
        tracing::debug!(error = %e, "puts were not revoked: they expire");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use yutu_api::descriptor::{Access, AccessToken, GrantId, NodeId, SegmentId};
    use yutu_api::kv::SegmentDescriptor;

    fn held(shard: usize, len: u64, asked: Instant) -> Held {
        let descriptor = SegmentDescriptor {
            node: NodeId(1),
            segment: SegmentId(0),
            offset: 0,
            len,
            access: Access::Write,
            grant: GrantId(1),
            token: AccessToken([0; 16]),
        };
        Held {
            shard,
            bucket: "b".into(),
            room: Room {
                put_id: len,
                descriptor,
            },
            asked,
        }
    }

    #[test]
    fn a_room_is_taken_by_shard_bucket_and_exact_length_while_fresh() {
        let rooms = Rooms::default();
        let now = Instant::now();
        assert!(rooms.keep([held(0, 10, now), held(1, 10, now)]).is_empty());
        let mut stale = Vec::new();
        assert!(rooms.take(0, "b", 11, &mut stale).is_none());
        assert!(rooms.take(0, "other", 10, &mut stale).is_none());
        assert_eq!(rooms.take(1, "b", 10, &mut stale).map(|h| h.shard), Some(1));
        assert!(rooms.take(1, "b", 10, &mut stale).is_none());
        assert!(stale.is_empty());
        // Past half its ttl a room is never handed out: it goes to be revoked.
        let old = now - Duration::from_millis(VIEW_TTL_MS / 2 + 1);
        assert!(rooms.keep([held(1, 10, old)]).is_empty());
        assert!(rooms.take(1, "b", 10, &mut stale).is_none());
        assert_eq!(stale.len(), 1);
        assert_eq!(rooms.count(), 1);
    }

    #[test]
    fn rooms_are_for_lengths_that_repeat() {
        let rooms = Rooms::default();
        assert!(!rooms.repeats(10), "a first length");
        assert!(rooms.repeats(10));
        for len in 100..100 + RECENT_LENS as u64 {
            assert!(!rooms.repeats(len), "lengths that never repeat");
        }
        assert!(!rooms.repeats(10), "forgotten after {RECENT_LENS} others");
    }

    #[test]
    fn the_pool_is_bounded_by_count_and_bytes() {
        let rooms = Rooms::default();
        let now = Instant::now();
        assert_eq!(rooms.room_for(100, 1), MAX_HELD);
        assert_eq!(rooms.room_for(100, MAX_HELD_BYTES / 2), 2);
        let over = rooms.keep((0..MAX_HELD + 3).map(|_| held(0, 1, now)));
        assert_eq!((rooms.count(), over.len()), (MAX_HELD, 3));
        assert_eq!(rooms.room_for(1, 1), 0);
        assert_eq!(rooms.drain().len(), MAX_HELD);
        let over = rooms.keep([held(0, MAX_HELD_BYTES, now), held(0, 1, now)]);
        assert_eq!((rooms.count(), over.len()), (1, 1));
    }
}
