//! The shm transport: same-host peers copy straight between mapped segments.
//!
//! The target's listener (`listener.rs`) checks descriptors and passes the memfds of the
//! segments they grant over a Unix socket (`SCM_RIGHTS`); the initiator maps each segment once
//! (`mapping.rs`) and from then on a transfer is a per-batch check round trip plus `memcpy`
//! (`lane.rs`). The kernel is not on the data path. Before a node uses a socket a client
//! named, it challenges the socket to prove whose it is (`prove.rs`).

use std::sync::Arc;
use std::time::Duration;

use crate::descriptor::NodeId;
use crate::transport::{Lane, Transport, TransportKind};

mod cross_memory;
mod direct;
pub mod fdpass;
mod lane;
pub(crate) mod listener;
mod mapping;
pub(crate) mod prove;
mod wire;

pub use direct::DirectRange;
use mapping::MappingCache;

/// The initiator side of shm: the mappings of peers' segments, shared by all workers.
pub(crate) struct ShmTransport {
    pub(crate) io_timeout: Duration,
    pub(crate) mappings: Arc<MappingCache>,
    /// Copies made by the caller's thread (see `direct.rs`).
    pub(crate) direct: direct::Direct,
}

impl ShmTransport {
    pub(crate) fn new(io_timeout: Duration) -> ShmTransport {
        let mappings = Arc::new(MappingCache::default());
        ShmTransport {
            io_timeout,
            direct: direct::Direct::new(Arc::clone(&mappings), io_timeout),
            mappings,
        }
    }

    /// Peer segments currently mapped.
    pub(crate) fn mapped(&self) -> usize {
        self.mappings.len()
    }
}

impl Transport for ShmTransport {
    fn kind(&self) -> TransportKind {
        TransportKind::Shm
    }

    fn forget_peer(&self, node: NodeId) {
        self.direct.forget(node);
        self.mappings.forget(node);
    }

    fn lane(&self) -> Box<dyn Lane> {
        Box::new(lane::ShmLane::new(
            Arc::clone(&self.mappings),
            self.io_timeout,
        ))
    }
}
