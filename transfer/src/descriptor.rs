//! Segment descriptors: the capability a peer needs to read or write a range of registered
//! memory. The types are pure wire data and live in `yutu-api` ([`yutu_api::descriptor`]), so
//! the KV control messages there can embed them; they are re-exported here unchanged.
//! Minting and checking tokens, which needs the segments' secret keys, is `crate::token`.

pub use yutu_api::descriptor::{
    Access, AccessToken, DescriptorError, GrantId, NodeId, SegmentDescriptor, SegmentId,
};
