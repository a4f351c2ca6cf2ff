//! Plain types every layer shares: object and bucket metadata, the storage error, durability,
//! checksums, read/write conditions and listing pages. No I/O, no runtime, no shard.

pub mod checksum;
pub mod conditions;
pub mod durability;
pub mod error;
pub mod listing;
pub mod object;
pub mod read;
pub mod version;

pub use durability::Durability;
pub use error::StoreError;
pub use object::{BucketInfo, ListedMeta, ObjectMeta};
pub use read::{serve, GetResult};
pub use version::Version;
