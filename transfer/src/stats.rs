//! Counters the engine keeps, for metrics and for tests that check what a path did.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::kind::TransportKind;

/// A snapshot of [`crate::TransferEngine::stats`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// What this engine initiated, per transport.
    pub rdma: TransportStats,
    pub shm: TransportStats,
    pub tcp: TransportStats,
    /// What this engine's listeners served to peers.
    pub tcp_listener: ListenerStats,
    pub shm_listener: ListenerStats,
    pub rdma_listener: ListenerStats,
}

impl EngineStats {
    pub fn transport(&self, kind: TransportKind) -> &TransportStats {
        match kind {
            TransportKind::Rdma => &self.rdma,
            TransportKind::Shm => &self.shm,
            TransportKind::Tcp => &self.tcp,
        }
    }
}

/// Initiator-side counters of one transport.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TransportStats {
    /// Slices completed on this path.
    pub ops: u64,
    pub bytes: u64,
    /// Slices that failed on this path (retried elsewhere or reported).
    pub failures: u64,
    /// Slices that reached this path after failing on another.
    pub retries_here: u64,
}

/// Target-side counters of one listener.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListenerStats {
    /// Connections accepted since start.
    pub accepted: u64,
    /// Connections open now.
    pub active: u64,
    /// Connections closed at once because `max_connections` were open.
    pub rejected: u64,
    /// Requests (tcp) or descriptors (shm, rdma) checked.
    pub requests: u64,
    /// Requests refused (bad token, out of bounds, ...).
    pub refused: u64,
    /// Payload bytes received into (writes) and sent from (reads) registered segments.
    pub bytes_in: u64,
    pub bytes_out: u64,
}

#[derive(Default)]
pub(crate) struct TransportCounters {
    pub(crate) ops: AtomicU64,
    pub(crate) bytes: AtomicU64,
    pub(crate) failures: AtomicU64,
    pub(crate) retries_here: AtomicU64,
}

impl TransportCounters {
    pub(crate) fn snapshot(&self) -> TransportStats {
        TransportStats {
            ops: self.ops.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
            retries_here: self.retries_here.load(Ordering::Relaxed),
        }
    }
}

#[derive(Default)]
pub(crate) struct ListenerCounters {
    pub(crate) accepted: AtomicU64,
    pub(crate) active: AtomicU64,
    pub(crate) rejected: AtomicU64,
    pub(crate) requests: AtomicU64,
    pub(crate) refused: AtomicU64,
    pub(crate) bytes_in: AtomicU64,
    pub(crate) bytes_out: AtomicU64,
}

impl ListenerCounters {
    pub(crate) fn snapshot(&self) -> ListenerStats {
        ListenerStats {
            accepted: self.accepted.load(Ordering::Relaxed),
            active: self.active.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
            requests: self.requests.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            bytes_in: self.bytes_in.load(Ordering::Relaxed),
            bytes_out: self.bytes_out.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// Counts a connection as active for as long as it lives.
pub(crate) struct ActiveGuard(Arc<ListenerCounters>);

impl ActiveGuard {
    pub(crate) fn new(counters: Arc<ListenerCounters>) -> Self {
        counters.accepted.fetch_add(1, Ordering::Relaxed);
        counters.active.fetch_add(1, Ordering::Relaxed);
        ActiveGuard(counters)
    }
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}
