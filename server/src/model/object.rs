//! What the node knows about a stored object and a bucket besides their bytes.

use std::sync::Arc;
use std::time::SystemTime;

use super::checksum::Checksum;
use super::durability::Durability;
use super::listing::Listable;

/// What the server knows about a stored object besides its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectMeta {
    pub size: u64,
    /// Quoted, as in the `ETag` header.
    pub etag: String,
    pub last_modified: SystemTime,
    pub content_type: Option<String>,
    /// Other stored response headers: Content-Disposition, Content-Encoding,
    /// Content-Language, Cache-Control, Expires (names lowercase).
    pub headers: Vec<(String, String)>,
    /// `x-amz-meta-*` pairs, names lowercased without the prefix.
    pub user_meta: Vec<(String, String)>,
    pub checksum: Option<Checksum>,
    /// Number of parts, for an object made by a multipart upload.
    pub parts: Option<u32>,
    /// Who wrote it (a user or token subject; empty on an open node and for KV blocks): it
    /// has full control of the object's ACL.
    pub owner: String,
    /// The object's grants beyond its owner's (`x-amz-acl`, PutObjectAcl).
    pub acl: yutu_api::acl::Acl,
    /// Written through the KV API (put-from, put-start/put-end): a KV block whatever its key,
    /// published to the conductor under [`yutu_api::block_hash::BlockHash::of_key`]. Objects
    /// written through S3 are KV blocks only when their key is a block hash.
    pub kv: bool,
}

/// The id a KV event names `key` by: any key of a block written through the KV API
/// ([`yutu_api::block_hash::BlockHash::of_key`]), otherwise only a key that is a block hash.
pub fn block_id(kv: bool, key: &str) -> Option<yutu_api::block_hash::BlockHash> {
    use yutu_api::block_hash::BlockHash;
    if kv {
        Some(BlockHash::of_key(key))
    } else {
        BlockHash::from_key(key)
    }
}

impl ObjectMeta {
    /// Metadata of a block written through the KV path (its ETag is set once the bytes are
    /// in).
    pub fn for_block(len: u64) -> ObjectMeta {
        ObjectMeta {
            size: len,
            etag: String::new(),
            last_modified: SystemTime::now(),
            content_type: None,
            headers: Vec::new(),
            user_meta: Vec::new(),
            checksum: None,
            parts: None,
            owner: String::new(),
            acl: Default::default(),
            kv: true,
        }
    }

    /// The id this object is published to the conductor under, if it is a KV block at all.
    pub fn block_id(&self, key: &str) -> Option<yutu_api::block_hash::BlockHash> {
        block_id(self.kv, key)
    }

    /// Bytes of index memory the metadata takes beyond the fixed entry overhead.
    pub fn footprint(&self) -> u64 {
        let meta: usize = self
            .user_meta
            .iter()
            .chain(self.headers.iter())
            .map(|(k, v)| k.len() + v.len())
            .sum();
        (meta + self.etag.len() + self.content_type.as_ref().map_or(0, |c| c.len())) as u64
    }
}

/// A bucket as every shard knows it.
#[derive(Debug, Clone)]
pub struct BucketInfo {
    pub name: String,
    pub created: SystemTime,
    pub owner: String,
    pub durability: Durability,
    /// Distinguishes this bucket from an earlier one of the same name (deleted and created
    /// again): a request authorised against one incarnation never writes into another.
    pub incarnation: u64,
    /// Most bytes of objects the bucket may hold; `None`: no quota.
    pub quota: Option<u64>,
    /// Grants beyond the owner's.
    pub acl: yutu_api::acl::Acl,
    pub cors: Option<Arc<yutu_api::cors::CorsConfiguration>>,
    pub policy: Option<Arc<yutu_api::bucket_policy::BucketPolicy>>,
    pub public_access_block: Option<yutu_api::public_access_block::PublicAccessBlock>,
    pub ownership: Option<yutu_api::ownership::ObjectOwnership>,
}

/// Object metadata as a listing sees it (for objects outside the DRAM index).
pub struct ListedMeta(pub Arc<ObjectMeta>);

impl Listable for ListedMeta {
    fn size(&self) -> u64 {
        self.0.size
    }
    fn etag(&self) -> &str {
        &self.0.etag
    }
    fn last_modified(&self) -> SystemTime {
        self.0.last_modified
    }
}
