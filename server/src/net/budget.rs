//! The node-wide budget of request-body bytes held in memory at once.
//!
//! A body is received whole before it is verified and stored, so without a bound N clients
//! sending N large PUTs make the node hold N bodies (64 PUTs of 64 MiB once took a
//! `--memory 256MiB` node to 3.75 GiB). Every body reserves its size here before its first
//! byte is read and gives it back when the request is done with it; a body that cannot get
//! its bytes waits, in arrival order, until others give theirs back or the wait's deadline
//! passes (the caller's, see `http::body`).
//!
//! Three pools, so that neither a queue of large uploads nor anybody without credentials
//! stands in front of the rest:
//! - bodies of at most [`BodyBudget::small_max`] bytes (KV control calls, 4 KiB objects) draw
//!   from a quarter of the budget;
//! - bodies of anonymous callers (no credentials, or a form upload whose signature is not
//!   checked yet) from an eighth, whatever their size, so unauthenticated clients can hold
//!   no more than that however many connections they open;
//! - larger authenticated bodies from the rest, which also caps the largest body the node
//!   accepts ([`BodyBudget::largest`]).
//!
//! Within a pool, one client (a user or token by name, an anonymous caller by address) holds
//! at most half of it at once: a body that would take a client past its share waits for the
//! client's own bodies to end, not for everybody's, so one client's slow bodies cannot starve
//! the others. A client holding nothing may always queue for a body, however large, so one
//! large upload still works. `--no-auth` nodes have no tenants and no shares.
//!
//! The pools are `tokio::sync::Semaphore`s: fair (first come, first served) and safe to share
//! between the shards' threads, with permits of 1 KiB so that a `u32` count covers 4 TiB.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// Permits are counted in units of this many bytes.
const UNIT: u64 = 1024;

/// Who sends a body, for the pools and shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyClient {
    /// The name its share is kept under (`None`: no share, as on a `--no-auth` node).
    pub key: Option<String>,
    /// Its body draws from the anonymous pool.
    pub anonymous: bool,
}

impl BodyClient {
    /// A caller that no share limits (a `--no-auth` node, a peer node's replica copy).
    pub const UNLIMITED: BodyClient = BodyClient {
        key: None,
        anonymous: false,
    };
}

/// Which pool a body draws from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Pool {
    Small,
    Large,
    Anonymous,
}

/// Bytes of request bodies the node may hold at once, split into pools.
#[derive(Debug)]
pub struct BodyBudget {
    small_max: u64,
    small: Arc<Semaphore>,
    large: Arc<Semaphore>,
    anonymous: Arc<Semaphore>,
    small_bytes: u64,
    large_bytes: u64,
    anonymous_bytes: u64,
    shares: Arc<Shares>,
}

/// What each client holds, per pool.
#[derive(Debug, Default)]
struct Shares {
    held: Mutex<HashMap<(Pool, String), u64>>,
    /// Woken whenever a client gives bytes back.
    given_back: Notify,
}

/// A client's bytes counted against its share; given back when dropped.
#[derive(Debug)]
struct ShareHold {
    shares: Arc<Shares>,
    key: (Pool, String),
    bytes: u64,
}

impl Drop for ShareHold {
    fn drop(&mut self) {
        let mut held = self.shares.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(h) = held.get_mut(&self.key) {
            *h = h.saturating_sub(self.bytes);
            if *h == 0 {
                held.remove(&self.key);
            }
        }
        drop(held);
        self.shares.given_back.notify_waiters();
    }
}

/// Bytes reserved for one body; given back when dropped.
#[derive(Debug)]
pub struct BodyPermit {
    _permit: OwnedSemaphorePermit,
    _share: Option<ShareHold>,
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
    /// `total / 64` bytes, an eighth for anonymous bodies, the rest for larger ones.
    pub fn new(total: u64) -> BodyBudget {
        let total = total.clamp(1 << 20, u32::MAX as u64 * UNIT);
        let small_bytes = total / 4;
        let anonymous_bytes = total / 8;
        let large_bytes = total - small_bytes - anonymous_bytes;
        let sem = |bytes| Arc::new(Semaphore::new(units(bytes) as usize));
        BodyBudget {
            small_max: total / 64,
            small: sem(small_bytes),
            large: sem(large_bytes),
            anonymous: sem(anonymous_bytes),
            small_bytes,
            large_bytes,
            anonymous_bytes,
            shares: Arc::default(),
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

    /// The largest body an anonymous caller can ever reserve.
    pub fn largest_anonymous(&self) -> u64 {
        self.anonymous_bytes
    }

    /// The pool `bytes` of `client` draw from, its size, and their permit count.
    fn pool(&self, client: &BodyClient, bytes: u64) -> Result<(Pool, u32), TooLarge> {
        let (pool, size) = if client.anonymous {
            (Pool::Anonymous, self.anonymous_bytes)
        } else if bytes <= self.small_max {
            (Pool::Small, self.small_bytes)
        } else {
            (Pool::Large, self.large_bytes)
        };
        if bytes > size {
            return Err(TooLarge {
                bytes,
                largest: size,
            });
        }
        // `units` is at most `u32::MAX` here: `bytes <= size <= u32::MAX * UNIT`.
        Ok((pool, units(bytes).min(u32::MAX as u64) as u32))
    }

    fn semaphore(&self, pool: Pool) -> &Arc<Semaphore> {
        match pool {
            Pool::Small => &self.small,
            Pool::Large => &self.large,
            Pool::Anonymous => &self.anonymous,
        }
    }

    fn share_of(&self, pool: Pool) -> u64 {
        let size = match pool {
            Pool::Small => self.small_bytes,
            Pool::Large => self.large_bytes,
            Pool::Anonymous => self.anonymous_bytes,
        };
        size / 2
    }

    /// Counts `bytes` against `client`'s share of `pool` if that leaves it within the share
    /// (or it holds nothing yet); `None` when it must wait for its own bodies to end.
    fn take_share(&self, client: &BodyClient, pool: Pool, bytes: u64) -> Option<Option<ShareHold>> {
        let Some(name) = &client.key else {
            return Some(None);
        };
        let key = (pool, name.clone());
        // A poisoned lock still holds correct counts (no update panics half-way).
        let mut held = self.shares.held.lock().unwrap_or_else(|e| e.into_inner());
        let now = held.get(&key).copied().unwrap_or(0);
        if now > 0 && now + bytes > self.share_of(pool) {
            return None;
        }
        *held.entry(key.clone()).or_insert(0) += bytes;
        Some(Some(ShareHold {
            shares: self.shares.clone(),
            key,
            bytes,
        }))
    }

    /// Reserves `bytes` for `client` if they are free now, within its share, and nobody waits
    /// for them: `Ok(None)` when the caller has to wait ([`BodyBudget::reserve`]).
    pub fn try_reserve(
        &self,
        client: &BodyClient,
        bytes: u64,
    ) -> Result<Option<BodyPermit>, TooLarge> {
        let (pool, n) = self.pool(client, bytes)?;
        let Some(share) = self.take_share(client, pool, bytes) else {
            return Ok(None);
        };
        Ok(self
            .semaphore(pool)
            .clone()
            .try_acquire_many_owned(n)
            .ok()
            .map(|permit| BodyPermit {
                _permit: permit,
                _share: share,
            }))
    }

    /// Reserves `bytes` for `client`: first within its share (waiting for its own bodies to
    /// end), then in line for the pool. An error at once when they can never be had. The
    /// caller bounds the wait (drop the future to give up its place).
    pub async fn reserve(&self, client: &BodyClient, bytes: u64) -> Result<BodyPermit, TooLarge> {
        let (pool, n) = self.pool(client, bytes)?;
        let share = loop {
            let mut notified = std::pin::pin!(self.shares.given_back.notified());
            // Registered before the check, so a give-back between the two is not missed.
            notified.as_mut().enable();
            if let Some(share) = self.take_share(client, pool, bytes) {
                break share;
            }
            notified.await;
        };
        let permit = self
            .semaphore(pool)
            .clone()
            .acquire_many_owned(n)
            .await
            .expect("the body budget's semaphores are never closed");
        Ok(BodyPermit {
            _permit: permit,
            _share: share,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_lite::future::{block_on, poll_once};

    fn user(name: &str) -> BodyClient {
        BodyClient {
            key: Some(name.into()),
            anonymous: false,
        }
    }

    const OPEN: BodyClient = BodyClient::UNLIMITED;

    #[test]
    fn bodies_wait_for_bytes_given_back_and_small_ones_never_queue_behind_large_ones() {
        let b = BodyBudget::new(64 << 20);
        assert_eq!((b.small_max(), b.largest()), (1 << 20, 40 << 20));
        assert_eq!(
            block_on(b.reserve(&OPEN, 41 << 20)).unwrap_err(),
            TooLarge {
                bytes: 41 << 20,
                largest: 40 << 20
            }
        );
        let first = b.try_reserve(&OPEN, 32 << 20).unwrap().expect("free");
        assert!(
            b.try_reserve(&OPEN, 16 << 20).unwrap().is_none(),
            "not free"
        );
        // The next large body waits...
        let mut second = Box::pin(b.reserve(&OPEN, 16 << 20));
        assert!(block_on(poll_once(second.as_mut())).is_none());
        // ...while small ones still get through.
        let smalls: Vec<_> = (0..16)
            .map(|_| block_on(b.reserve(&OPEN, 1 << 20)).unwrap())
            .collect();
        let mut seventeenth = Box::pin(b.reserve(&OPEN, 4096));
        assert!(
            block_on(poll_once(seventeenth.as_mut())).is_none(),
            "the small pool is a quarter"
        );
        drop(smalls);
        assert!(block_on(poll_once(seventeenth.as_mut())).is_some());
        drop(first);
        assert!(block_on(poll_once(second.as_mut())).is_some());
    }

    #[test]
    fn one_client_holds_at_most_half_a_pool_and_waits_for_its_own_bodies_only() {
        let b = BodyBudget::new(64 << 20);
        let a = user("a");
        // The large pool is 40 MiB: a share of 20.
        let a1 = b.try_reserve(&a, 12 << 20).unwrap().expect("free");
        assert!(
            b.try_reserve(&a, 12 << 20).unwrap().is_none(),
            "past a's share"
        );
        let mut a2 = Box::pin(b.reserve(&a, 12 << 20));
        assert!(block_on(poll_once(a2.as_mut())).is_none());
        // Another client is not held up by a's queue.
        let c = b
            .try_reserve(&user("c"), 12 << 20)
            .unwrap()
            .expect("c's share");
        drop(a1);
        let a2 = block_on(poll_once(a2.as_mut()))
            .expect("a's own body ended")
            .unwrap();
        drop((a2, c));
        // A client holding nothing may queue for a body larger than its share.
        assert!(b.try_reserve(&user("a"), 30 << 20).unwrap().is_some());
        assert!(
            b.shares.held.lock().unwrap().is_empty(),
            "nothing is left counted"
        );
    }

    #[test]
    fn anonymous_bodies_draw_from_their_own_eighth() {
        let b = BodyBudget::new(64 << 20);
        let anon = |ip: &str| BodyClient {
            key: Some(ip.into()),
            anonymous: true,
        };
        assert_eq!(b.largest_anonymous(), 8 << 20);
        assert!(b.try_reserve(&anon("ip1"), 9 << 20).is_err());
        let x = b.try_reserve(&anon("ip1"), 4 << 20).unwrap().expect("free");
        let y = b.try_reserve(&anon("ip2"), 4 << 20).unwrap().expect("free");
        assert!(b.try_reserve(&anon("ip3"), 1024).unwrap().is_none(), "full");
        // Anonymous bodies hold none of what authenticated ones draw from.
        assert!(b.try_reserve(&user("u"), 20 << 20).unwrap().is_some());
        assert!(b.try_reserve(&user("v"), 1024).unwrap().is_some());
        drop((x, y));
    }
}
