//! Path selection: which transports to try for a peer, in which order.
//!
//! The order is fixed by speed: rdma (NIC does the copy, no CPU), then shm when both ends run
//! under the same kernel (one `memcpy`), then tcp (two copies and the kernel). A path is a
//! candidate only when both ends have it: the local engine can initiate it and the peer's
//! [`NodeAddress`] offers it. A path that failed recently for this peer is not dropped but
//! moved to the end, so a broken socket directory or a flapping NIC does not cost every batch a
//! failed attempt, and the path is back in front once it has been quiet for the cool-down.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::address::NodeAddress;
use crate::kind::TransportKind;

/// What this engine can initiate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalPaths {
    /// This engine's host id (same form as [`NodeAddress::host`]).
    pub host: String,
    pub rdma: bool,
    pub shm: bool,
    pub tcp: bool,
}

/// The transports to try for `peer`, best first. `allowed` restricts them (e.g. a benchmark
/// forcing one path); `demoted` are moved to the end, in their usual relative order.
pub fn candidates(
    local: &LocalPaths,
    peer: &NodeAddress,
    allowed: Option<&[TransportKind]>,
    demoted: &[TransportKind],
) -> Vec<TransportKind> {
    let shared = |kind: TransportKind| match kind {
        TransportKind::Rdma => local.rdma && peer.rdma.is_some(),
        TransportKind::Shm => local.shm && peer.shm.is_some() && peer.host == local.host,
        TransportKind::Tcp => local.tcp && peer.tcp.is_some(),
    };
    let usable: Vec<TransportKind> = TransportKind::ALL
        .into_iter()
        .filter(|k| shared(*k))
        .filter(|k| allowed.is_none_or(|a| a.contains(k)))
        .collect();
    let (fresh, stale): (Vec<_>, Vec<_>) = usable.into_iter().partition(|k| !demoted.contains(k));
    fresh.into_iter().chain(stale).collect()
}

/// Recent failures of each path to one peer.
#[derive(Default)]
pub(crate) struct PathHealth {
    failed: Mutex<HashMap<TransportKind, Instant>>,
}

impl PathHealth {
    pub(crate) fn failed(&self, kind: TransportKind) {
        self.lock().insert(kind, Instant::now());
    }

    pub(crate) fn succeeded(&self, kind: TransportKind) {
        let mut failed = self.lock();
        if !failed.is_empty() {
            failed.remove(&kind);
        }
    }

    /// Paths that failed within `cooldown`.
    pub(crate) fn demoted(&self, cooldown: Duration) -> Vec<TransportKind> {
        let mut failed = self.lock();
        failed.retain(|_, at| at.elapsed() < cooldown);
        failed.keys().copied().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<TransportKind, Instant>> {
        self.failed.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::address::RdmaEndpoint;
    use crate::descriptor::NodeId;
    use TransportKind::{Rdma, Shm, Tcp};

    fn local(rdma: bool) -> LocalPaths {
        LocalPaths {
            host: "h1".into(),
            rdma,
            shm: true,
            tcp: true,
        }
    }

    fn peer(host: &str, rdma: bool, shm: bool) -> NodeAddress {
        NodeAddress {
            node: NodeId(2),
            incarnation: 1,
            host: host.into(),
            shm: shm.then(|| "/tmp/x.sock".into()),
            tcp: Some("127.0.0.1:1".parse().unwrap()),
            rdma: rdma.then(|| RdmaEndpoint {
                handshake: "127.0.0.1:2".parse().unwrap(),
                device: "mlx5_0".into(),
            }),
        }
    }

    #[test]
    fn fastest_shared_path_first() {
        assert_eq!(
            candidates(&local(true), &peer("h1", true, true), None, &[]),
            [Rdma, Shm, Tcp]
        );
        // No local device (or no `rdma` feature): rdma is not a candidate even if offered.
        assert_eq!(
            candidates(&local(false), &peer("h1", true, true), None, &[]),
            [Shm, Tcp]
        );
        // Another host: shm is impossible whatever the peer offers.
        assert_eq!(
            candidates(&local(true), &peer("h2", true, true), None, &[]),
            [Rdma, Tcp]
        );
        assert_eq!(
            candidates(&local(false), &peer("h2", false, true), None, &[]),
            [Tcp]
        );
        // The peer has no shm socket.
        assert_eq!(
            candidates(&local(false), &peer("h1", false, false), None, &[]),
            [Tcp]
        );
    }

    #[test]
    fn allowed_and_demoted_paths() {
        let p = peer("h1", true, true);
        assert_eq!(candidates(&local(true), &p, Some(&[Tcp]), &[]), [Tcp]);
        assert_eq!(
            candidates(&local(true), &p, Some(&[Tcp, Shm]), &[]),
            [Shm, Tcp]
        );
        assert_eq!(candidates(&local(true), &p, None, &[Shm]), [Rdma, Tcp, Shm]);
        assert_eq!(
            candidates(&local(true), &p, None, &[Rdma, Shm]),
            [Tcp, Rdma, Shm]
        );
        let no_tcp = NodeAddress {
            tcp: None,
            ..peer("h2", false, false)
        };
        assert!(candidates(&local(true), &no_tcp, None, &[]).is_empty());
    }

    #[test]
    fn health_forgets_after_success_or_cooldown() {
        let health = PathHealth::default();
        health.failed(Shm);
        assert_eq!(health.demoted(Duration::from_secs(60)), [Shm]);
        assert!(health.demoted(Duration::ZERO).is_empty());
        health.failed(Shm);
        health.succeeded(Shm);
        assert!(health.demoted(Duration::from_secs(60)).is_empty());
    }
}
