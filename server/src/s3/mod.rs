//! S3 protocol pieces that are not HTTP routing: checksums, aws-chunked bodies, SigV4.

pub mod authenticate;
pub mod checksum;
pub mod chunked;
pub mod conditions;
pub mod sigv2;
pub mod sigv4;
