//! How to reach a node's transfer engine. [`NodeAddress`] is pure wire data (the storage node
//! serves it on the control plane as JSON) and lives in `yutu-api`
//! ([`yutu_api::descriptor`]); it is re-exported here unchanged. A client adds it with
//! [`crate::TransferEngine::add_peer`] and from then on resolves every descriptor's node id to
//! it.

pub use yutu_api::descriptor::{NodeAddress, RdmaEndpoint};
