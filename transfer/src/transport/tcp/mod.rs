//! The tcp transport: the fallback every node has.
//!
//! The target runs a listener (`listener.rs`) that serves one-sided reads and writes of its
//! registered segments, checking every request's token and bounds; initiators keep one
//! pipelined connection per peer per worker (`lane.rs`), so large transfers, sliced by the
//! engine, travel over several connections at once. Before a node uses an address a client
//! named, it challenges the listener there to prove whose it is (`prove.rs`).

use std::time::Duration;

use crate::transport::{Lane, Transport, TransportKind};

mod lane;
pub(crate) mod listener;
pub(crate) mod prove;
pub mod wire;

/// The initiator side of tcp.
pub(crate) struct TcpTransport {
    pub(crate) io_timeout: Duration,
}

impl Transport for TcpTransport {
    fn kind(&self) -> TransportKind {
        TransportKind::Tcp
    }

    fn lane(&self) -> Box<dyn Lane> {
        Box::new(lane::TcpLane::new(self.io_timeout))
    }
}
