//! Yutu's transfer engine: KV-cache bytes move by one-sided reads and writes between
//! registered memory, not through HTTP bodies.
//!
//! # The model
//!
//! A process registers memory once ([`MemoryRegion`] → [`TransferEngine::register`] →
//! [`LocalSegment`]) and hands out [`SegmentDescriptor`]s for ranges of it: node, segment id,
//! offset, length and an [`AccessToken`] that authorises exactly that range. A peer that holds a
//! descriptor submits a batch of [`TransferRequest`]s (read the remote range into a local one,
//! or write a local range into it) and polls or awaits the [`BatchHandle`]. The owner of the
//! memory does nothing per transfer: its listeners (or its NIC) serve the bytes.
//!
//! # Transports and path selection
//!
//! - [`TransportKind::Rdma`] (cargo feature `rdma`): RC queue pairs, `ibv_reg_mr`, one-sided
//!   READ/WRITE. Without a device the engine says why ([`RdmaError::NoDevice`]) and goes on
//!   without it.
//! - [`TransportKind::Shm`]: peers on the same host receive the segment's memfd over a Unix
//!   socket (`SCM_RIGHTS`) once, map it, and copy with `memcpy`: no kernel on the data path.
//! - [`TransportKind::Tcp`]: a listener per node serves reads and writes of registered
//!   segments; large transfers are sliced over several connections.
//!
//! Each request goes over the fastest transport both ends share (rdma > shm on the same host >
//! tcp, see [`select`]); a request that fails on one path for a reason another path may not
//! share (an I/O error, an unreachable socket) is retried on the next before it is reported.
//!
//! # GPU memory
//!
//! Device memory is reached by staging, not registered as a segment: [`device::staging`]
//! moves blocks between a GPU (`device::CudaDevice`, feature `cuda`) or its host-memory
//! stand-in ([`device::HostDevice`]) and a pinned host buffer registered like any region,
//! double-buffered so device copies overlap the node's.
//!
//! # Proving an address
//!
//! An engine never has to take a peer's word for where it listens: before a node uses an
//! address a client names, [`TransferEngine::verify_peer`] challenges each of its paths, and
//! only a listener of the claimed engine that shares a secret with the challenger can answer
//! ([`TransferEngine::trust`] gives it that secret; it travels over the authenticated control
//! plane, never over the path being proven). Nothing but the challenge is ever sent to an
//! address before it has answered.
//!
//! # Threads, not executors
//!
//! Everything here runs on plain std threads: a pool of workers that initiate transfers, and
//! one accept thread plus one thread per connection for each listener. The storage node's
//! shards are glommio executors whose futures are `!Send`; the engine never needs their
//! threads, because the bytes live in process-shared mappings. A shard awaits a
//! [`BatchHandle`] (it is a `Send` future woken from a worker thread) or a blocking client calls
//! [`BatchHandle::wait`]. No async runtime is pulled in.
//!
//! # The safety contract with the memory's owner
//!
//! The engine reads and writes registered memory behind its owner's back. It only ever
//! touches bytes inside a registered segment, and only for a request whose descriptor's token
//! verifies and whose range lies inside both the descriptor and the segment; every request is
//! checked, on every transport (by the target's listener for tcp, by a per-batch validation
//! round trip with the target for shm and rdma). What it cannot know is whether the owner still
//! considers those bytes live: that is the owner's job. The storage node hands out a
//! descriptor only together with a lease (for reads) or a pending two-phase put (for writes),
//! and does not reuse the range until the lease expires or the put ends. Until then, bytes
//! under a descriptor may be read or written by peers at any moment, so the owner must not
//! expect them to be stable, and must not free or unmap a registered region before
//! [`TransferEngine::unregister`] and the drop of every [`LocalSegment`] handle.
//!
//! A same-host peer that received a memfd keeps its mapping until it drops it: shm grants a
//! peer process the whole segment, which is why the shm socket is reachable only by the
//! node's own user (mode `0600` by default) and why descriptors are validated per batch by an
//! honest engine even so. Unregistering stops new validations, not existing mappings.

mod address;
mod batch;
pub mod cold_copy;
mod descriptor;
pub mod device;
mod engine;
mod error;
pub mod huge_backing;
mod kind;
mod proof;
mod region;
mod request;
mod segment;
pub mod select;
pub mod split_copy;
mod stats;
mod sys;
mod token;
pub mod transport;
mod worker;

pub use address::{NodeAddress, RdmaEndpoint};
pub use batch::{BatchHandle, BatchResult, Completion};
pub use descriptor::{
    Access, AccessToken, DescriptorError, GrantId, NodeId, SegmentDescriptor, SegmentId,
};
pub use engine::{EngineConfig, RdmaMode, TransferEngine};
pub use error::{Refusal, Side, TransferError};
pub use kind::TransportKind;
pub use region::{HugePages, MemoryRegion, RegionError};
pub use request::{TransferOp, TransferRequest};
pub use segment::{LocalSegment, RangeGuard};
pub use stats::{EngineStats, ListenerStats, TransportStats};
pub use transport::rdma::RdmaError;
pub use transport::shm::{fdpass, DirectRange};
