//! One module per suite; each turns its own options into a [`crate::report::Report`].

pub mod cluster;
pub mod conductor;
pub mod gpu;
pub mod kv;
pub mod nvme;
pub mod s3;
pub mod tenants;
pub mod transfer;
