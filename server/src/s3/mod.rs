//! S3 protocol pieces that are not HTTP routing: checksums, aws-chunked bodies, SigV4.

pub mod checksum;
pub mod sigv4;
pub mod chunked;
pub mod authenticate;
pub mod conditions;
