//! One module per suite; each turns its own options into a [`crate::report::Report`].

pub mod s3;
pub mod transfer;
