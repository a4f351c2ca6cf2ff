//! The node-wide budget of request-body bytes held in memory at once.
//!
//! A body is received whole before it is verified and stored, so without a bound N clients
//! sending N large PUTs make the node hold N bodies (64 PUTs of 64 MiB once took a
//! `--memory 256MiB` node to 3.75 GiB). Every body reserves its size here before its first
//! byte is read and gives it back when the request is done with it; a body that cannot get
//! its bytes waits, in arrival order, until others give theirs back or the wait's deadline
//! passes (the caller's, see `http::body`).
//!
//! Two pools, so a queue of large uploads never stands in front of small ones: bodies of at
//! most [`BodyBudget::small_max`] bytes (KV control calls, 4 KiB objects) draw from a quarter
//! of the budget, larger ones from the rest, which also caps the largest body the node
//! accepts ([`BodyBudget::largest`]).
//!
//! The pools are `tokio::sync::Semaphore`s: fair (first come, first served) and safe to share
//! between the shards' threads, with permits of 1 KiB so that a `u32` count covers 4 TiB.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Permits are counted in units of this many bytes.
const UNIT: u64 = 1024;

/// Bytes of request bodies the node may hold at once, split into a pool for small bodies and
/// one for the rest.
#[derive(Debug)]
pub struct BodyBudget {
    small_max: u64,
    small: Arc<Semaphore>,
    large: Arc<Semaphore>,
    large_bytes: u64,
}

/// Bytes reserved for one body; given back when dropped.
#[derive(Debug)]
pub struct BodyPermit {
    _permit: OwnedSemaphorePermit,
}

/// Why a body cannot be reserved at all (waiting would not help).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a body of {bytes} bytes is larger than the {largest} bytes the node holds for one body")]
pub struct TooLarge {
    pub bytes: u64,
    pub largest: u64,
}

fn units(bytes: u64) -> u64 {
    bytes.div_ceil(UNIT).max(1)
}

impl BodyBudget {
    /// A budget of `total` bytes (at least 1 MiB): a quarter for bodies of at most
    /// `total / 64` bytes, the rest for larger ones.
    pub fn new(total: u64) -> BodyBudget {
        let total = total.clamp(1 << 20, u32::MAX as u64 * UNIT);
        let small_bytes = total / 4;
        let large_bytes = total - small_bytes;
        BodyBudget {
            small_max: total / 64,
            small: Arc::new(Semaphore::new(units(small_bytes) as usize)),
            large: Arc::new(Semaphore::new(units(large_bytes) as usize)),
            large_bytes,
        }
    }

    /// Bodies up to this size draw from the small pool.
    pub fn small_max(&self) -> u64 {
        self.small_max
    }

    /// The largest body that can ever be reserved.
    pub fn largest(&self) -> u64 {
        self.large_bytes
    }

    /// The pool `bytes` draw from and their permit count.
    fn pool(&self, bytes: u64) -> Result<(&Arc<Semaphore>, u32), TooLarge> {
        let pool = if bytes <= self.small_max {
            &self.small
        } else if bytes <= self.large_bytes {
            &self.large
        } else {
            return Err(TooLarge {
                bytes,
                largest: self.large_bytes,
            });
        };
        // `units` is at most `u32::MAX` here: `bytes <= large_bytes <= u32::MAX * UNIT`.
        Ok((pool, units(bytes).min(u32::MAX as u64) as u32))
    }

    /// Reserves `bytes` if they are free now and nobody waits for them: `Ok(None)` when the
    /// caller has to wait ([`BodyBudget::reserve`]).
    pub fn try_reserve(&self, bytes: u64) -> Result<Option<BodyPermit>, TooLarge> {
        let (pool, n) = self.pool(bytes)?;
        Ok(pool
            .clone()
            .try_acquire_many_owned(n)
            .ok()
            .map(|permit| BodyPermit { _permit: permit }))
    }

    /// Reserves `bytes`, waiting in line for them; an error at once when they can never be
    /// had. The caller bounds the wait (drop the future to give up its place).
    pub async fn reserve(&self, bytes: u64) -> Result<BodyPermit, TooLarge> {
        let (pool, n) = self.pool(bytes)?;
        let permit = pool
            .clone()
            .acquire_many_owned(n)
            .await
            .expect("the body budget's semaphores are never closed");
        Ok(BodyPermit { _permit: permit })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_lite::future::{block_on, poll_once};

    #[test]
    fn bodies_wait_for_bytes_given_back_and_small_ones_never_queue_behind_large_ones() {
        let b = BodyBudget::new(64 << 20);
        assert_eq!((b.small_max(), b.largest()), (1 << 20, 48 << 20));
        assert_eq!(
            block_on(b.reserve(49 << 20)).unwrap_err(),
            TooLarge {
                bytes: 49 << 20,
                largest: 48 << 20
            }
        );
        let first = b.try_reserve(40 << 20).unwrap().expect("free");
        assert!(b.try_reserve(16 << 20).unwrap().is_none(), "not free");
        // The next large body waits...
        let mut second = Box::pin(b.reserve(16 << 20));
        assert!(block_on(poll_once(second.as_mut())).is_none());
        // ...while small ones still get through.
        let smalls: Vec<_> = (0..16)
            .map(|_| block_on(b.reserve(1 << 20)).unwrap())
            .collect();
        let mut seventeenth = Box::pin(b.reserve(4096));
        assert!(
            block_on(poll_once(seventeenth.as_mut())).is_none(),
            "the small pool is a quarter"
        );
        drop(smalls);
        assert!(block_on(poll_once(seventeenth.as_mut())).is_some());
        drop(first);
        assert!(block_on(poll_once(second.as_mut())).is_some());
    }
}
