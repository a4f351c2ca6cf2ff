//! How to reach a node's transfer engine: what one engine publishes about itself and another
//! one needs before it can move bytes to or from that node.
//!
//! The storage node serves its [`NodeAddress`] on the control plane (JSON); a client adds it
//! with [`crate::TransferEngine::add_peer`] and from then on resolves every descriptor's node id
//! to it. Only what the node actually offers is present: a missing `shm` socket or `rdma`
//! endpoint removes that path from selection.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::descriptor::{hex_u64, NodeId};

/// A node's transfer endpoints.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAddress {
    pub node: NodeId,
    /// Random per engine start. A peer that restarted under the same node id gets a new one,
    /// which drops whatever was cached for the old process (shm mappings, connections).
    #[serde(with = "hex_u64")]
    pub incarnation: u64,
    /// Kernel boot id of the node's host: shm is only tried between equal hosts.
    pub host: String,
    /// Unix socket that hands out memfds of registered segments (same host only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shm: Option<PathBuf>,
    /// The tcp transfer listener.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp: Option<SocketAddr>,
    /// RDMA, when the node has a device and was built with the `rdma` feature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma: Option<RdmaEndpoint>,
}

/// Where a peer exchanges queue-pair numbers and memory keys with a node before one-sided RDMA.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RdmaEndpoint {
    /// TCP address of the queue-pair handshake listener.
    pub handshake: SocketAddr,
    /// The device the node registered its memory with (for diagnostics).
    pub device: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_round_trip_leaves_out_missing_paths() {
        let addr = NodeAddress {
            node: NodeId(42),
            incarnation: u64::MAX,
            host: "b00t".into(),
            shm: None,
            tcp: Some("127.0.0.1:7000".parse().unwrap()),
            rdma: None,
        };
        let json = serde_json::to_string(&addr).unwrap();
        assert_eq!(
            json,
            r#"{"node":"000000000000002a","incarnation":"ffffffffffffffff","host":"b00t","tcp":"127.0.0.1:7000"}"#
        );
        assert_eq!(serde_json::from_str::<NodeAddress>(&json).unwrap(), addr);
        let full = NodeAddress {
            shm: Some("/run/yutu/x.sock".into()),
            rdma: Some(RdmaEndpoint {
                handshake: "127.0.0.1:7001".parse().unwrap(),
                device: "mlx5_0".into(),
            }),
            ..addr
        };
        let back: NodeAddress =
            serde_json::from_str(&serde_json::to_string(&full).unwrap()).unwrap();
        assert_eq!(back, full);
    }
}
