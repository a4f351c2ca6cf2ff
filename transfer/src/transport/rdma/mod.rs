//! The rdma transport (cargo feature `rdma`, rdma-sys): one-sided READ and WRITE over
//! reliable-connected queue pairs.
//!
//! - Device discovery picks the requested device, or the first with an active port, and
//!   allocates one protection domain for the engine (`verbs::Device`).
//! - Every registered segment is registered with the NIC (`ibv_reg_mr`, local write + remote
//!   read/write); the registrations are shared by the initiator lanes (their `lkey`) and the
//!   handshake listener (the `rkey` it grants).
//! - A peer's queue pair is connected over a TCP handshake (`handshake.rs`); the same connection
//!   then checks each batch's descriptors (token, bounds) and returns address and `rkey`, so
//!   the target vets every request even though its CPU never sees the bytes.
//!
//! Without the feature, or without a device, starting returns the reason as an
//! [`RdmaError`] and the engine uses the other paths. The message encodings are compiled and
//! tested either way.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::address::RdmaEndpoint;
use crate::descriptor::NodeId;
use crate::transport::Transport;

mod handshake;
#[cfg(feature = "rdma")]
mod lane;
#[cfg(feature = "rdma")]
mod listener;
#[cfg(feature = "rdma")]
mod verbs;

pub use crate::error::rdma::RdmaError;

/// What the engine passes to [`start`].
#[cfg_attr(not(feature = "rdma"), allow(dead_code))]
pub(crate) struct RdmaOptions {
    pub(crate) node: NodeId,
    pub(crate) incarnation: u64,
    pub(crate) device: Option<String>,
    pub(crate) listen: SocketAddr,
    pub(crate) io_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) max_connections: usize,
}

/// A running rdma transport and its handshake listener (stopped when dropped).
pub(crate) struct Started {
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) endpoint: RdmaEndpoint,
    pub(crate) _listener: Box<dyn Send + Sync>,
}

/// Opens the device and starts the handshake listener.
#[cfg(not(feature = "rdma"))]
pub(crate) fn start(
    _opts: RdmaOptions,
    _segments: Arc<crate::segment::SegmentTable>,
    _counters: Arc<crate::stats::ListenerCounters>,
) -> Result<Started, RdmaError> {
    Err(RdmaError::NotCompiled)
}

#[cfg(feature = "rdma")]
pub(crate) use enabled::start;

#[cfg(feature = "rdma")]
pub(crate) use enabled::RdmaShared;

#[cfg(feature = "rdma")]
mod enabled {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::listener::{RdmaListener, Target};
    use super::verbs::{Device, Mr};
    use super::{RdmaError, RdmaOptions, Started};
    use crate::address::RdmaEndpoint;
    use crate::descriptor::SegmentId;
    use crate::error::TransferError;
    use crate::segment::{LocalSegment, SegmentTable};
    use crate::stats::ListenerCounters;
    use crate::transport::{Lane, Transport, TransportKind};

    /// The device and the registrations of this engine's segments.
    pub(crate) struct RdmaShared {
        pub(crate) device: Arc<Device>,
        mrs: Mutex<HashMap<SegmentId, Arc<Mr>>>,
    }

    impl RdmaShared {
        pub(crate) fn mr(&self, segment: SegmentId) -> Option<Arc<Mr>> {
            self.lock().get(&segment).cloned()
        }

        fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SegmentId, Arc<Mr>>> {
            self.mrs.lock().unwrap_or_else(|p| p.into_inner())
        }
    }

    struct RdmaTransport {
        shared: Arc<RdmaShared>,
        io_timeout: Duration,
    }

    impl Transport for RdmaTransport {
        fn kind(&self) -> TransportKind {
            TransportKind::Rdma
        }

        fn register(&self, segment: &LocalSegment) -> Result<(), TransferError> {
            let mr = self.shared.device.register(segment.region())?;
            self.shared.lock().insert(segment.id(), Arc::new(mr));
            Ok(())
        }

        fn unregister(&self, segment: SegmentId) {
            // The registration is released when the last in-flight user drops it; from then on
            // the NIC refuses the rkey.
            self.shared.lock().remove(&segment);
        }

        fn lane(&self) -> Box<dyn Lane> {
            Box::new(super::lane::RdmaLane::new(
                Arc::clone(&self.shared),
                self.io_timeout,
            ))
        }
    }

    pub(crate) fn start(
        opts: RdmaOptions,
        segments: Arc<SegmentTable>,
        counters: Arc<ListenerCounters>,
    ) -> Result<Started, RdmaError> {
        let device = Arc::new(Device::open(opts.device.as_deref())?);
        let shared = Arc::new(RdmaShared {
            device: Arc::clone(&device),
            mrs: Mutex::new(HashMap::new()),
        });
        let listener = RdmaListener::start(
            opts.listen,
            Arc::clone(&shared),
            segments,
            Target {
                node: opts.node,
                incarnation: opts.incarnation,
                idle_timeout: opts.idle_timeout,
            },
            opts.max_connections,
            counters,
        )?;
        Ok(Started {
            endpoint: RdmaEndpoint {
                handshake: listener.addr,
                device: device.name.clone(),
            },
            transport: Arc::new(RdmaTransport {
                shared,
                io_timeout: opts.io_timeout,
            }),
            _listener: Box::new(listener),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine without an RDMA device (CI, this one) starting fails with a typed reason,
    /// never a panic; with the feature off the reason says so.
    #[test]
    fn start_without_a_device_says_why() {
        let opts = RdmaOptions {
            node: NodeId(1),
            incarnation: 1,
            device: None,
            listen: "127.0.0.1:0".parse().unwrap(),
            io_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(1),
            max_connections: 4,
        };
        let segments = Arc::new(crate::segment::SegmentTable::new(NodeId(1), 1));
        let result = start(opts, segments, Arc::default());
        if cfg!(not(feature = "rdma")) {
            assert_eq!(result.err(), Some(RdmaError::NotCompiled));
        } else if !has_rdma_device() {
            assert_eq!(result.err(), Some(RdmaError::NoDevice));
        }
    }

    #[cfg(feature = "rdma")]
    #[test]
    fn a_named_device_that_does_not_exist_is_reported_by_name() {
        let err = verbs::Device::open(Some("no-such-device")).err();
        if has_rdma_device() {
            assert_eq!(
                err,
                Some(RdmaError::DeviceNotFound("no-such-device".into()))
            );
        } else {
            assert_eq!(err, Some(RdmaError::NoDevice));
        }
    }

    /// Whether the kernel exposes any verbs device.
    pub(crate) fn has_rdma_device() -> bool {
        std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some())
    }
}
