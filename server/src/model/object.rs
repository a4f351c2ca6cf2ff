//! What the node knows about a stored object and a bucket besides their bytes.

use std::sync::Arc;
use std::time::SystemTime;

use super::checksum::Checksum;
use super::durability::Durability;
use super::listing::Listable;
use super::version::Version;

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
    /// How a multipart upload made the object: its parts, for `?partNumber=` reads,
    /// GetObjectAttributes and a repeated CompleteMultipartUpload. `None` for any other object.
    pub parts: Option<PartLayout>,
    /// Who wrote it (a user or token subject; empty on an open node and for KV blocks): it
    /// has full control of the object's ACL.
    pub owner: String,
    /// The object's grants beyond its owner's (`x-amz-acl`, PutObjectAcl).
    pub acl: yutu_api::acl::Acl,
    /// Written through the KV API (put-from, put-start/put-end): a KV block whatever its key,
    /// published to the conductor under [`yutu_api::block_hash::BlockHash::of_key`]. Objects
    /// written through S3 are KV blocks only when their key is a block hash.
    pub kv: bool,
    /// The write's place among the writes of this key ([`crate::model::version`]): replicas
    /// keep the newest. [`Version::ZERO`] until the write is applied, and in records written
    /// before versions existed.
    pub version: Version,
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
        ObjectMeta::for_block_at(len, SystemTime::now())
    }

    /// [`ObjectMeta::for_block`] written at `last_modified` (one clock read for a batch).
    pub fn for_block_at(len: u64, last_modified: SystemTime) -> ObjectMeta {
        ObjectMeta {
            size: len,
            etag: String::new(),
            last_modified,
            content_type: None,
            headers: Vec::new(),
            user_meta: Vec::new(),
            checksum: None,
            parts: None,
            owner: String::new(),
            acl: Default::default(),
            kv: true,
            version: Version::ZERO,
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
        let parts = self.parts.as_ref().map_or(0, PartLayout::footprint);
        (meta + parts + self.etag.len() + self.content_type.as_ref().map_or(0, |c| c.len())) as u64
    }
}

/// Most bytes a [`PartLayout`] may add to an object's stored metadata. The metadata travels
/// in an NVMe record (at most 64 KiB of it) and, between cluster nodes, base64-encoded in one
/// request header of a 16 KiB header section, next to up to 2 KiB of user metadata: a
/// layout that would not leave room for that keeps less (see [`PartLayout::new`]).
pub const MAX_LAYOUT_BYTES: usize = 4096;

/// The parts of an object made by CompleteMultipartUpload, in the order it lists them. Part
/// `n` of the object (`?partNumber=n`, GetObjectAttributes) is the `n`-th listed, as in S3.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PartLayout {
    /// How many parts the object has.
    pub count: u32,
    /// The part sizes in order, run-length encoded as (size, how many parts in a row have
    /// it): all parts but the last are usually one size, so this is one or two runs. Empty
    /// where the sizes are unknown: a record written before they were kept, or a layout too
    /// varied to fit [`MAX_LAYOUT_BYTES`].
    pub sizes: Vec<(u64, u32)>,
    /// Each part's checksum (base64, the object's checksum algorithm), in order; empty where
    /// the upload had no algorithm or the list does not fit [`MAX_LAYOUT_BYTES`] (SHA-256
    /// values fit for some 80 parts, CRC32 ones for some 300).
    pub checksums: Vec<String>,
    /// The upload that made the object: CompleteMultipartUpload sent again for it answers
    /// from the object rather than NoSuchUpload, as S3 does. Empty in records written before.
    pub upload_id: String,
}

/// One part of a multipart object, as a part read or GetObjectAttributes reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectPart {
    /// 1-based.
    pub number: u32,
    /// Offset of its first byte in the object.
    pub offset: u64,
    pub size: u64,
    pub checksum: Option<String>,
}

impl PartLayout {
    /// The layout of an object completed from parts of `sizes`, with `checksums` (one per
    /// part, or none), kept within [`MAX_LAYOUT_BYTES`]: the checksums are dropped first,
    /// then the sizes; the count and upload id always stay.
    pub fn new(upload_id: &str, sizes: &[u64], checksums: Vec<String>) -> PartLayout {
        let mut runs: Vec<(u64, u32)> = Vec::new();
        for &s in sizes {
            match runs.last_mut() {
                Some((size, n)) if *size == s => *n += 1,
                _ => runs.push((s, 1)),
            }
        }
        let mut layout = PartLayout {
            count: sizes.len() as u32,
            sizes: runs,
            checksums: if checksums.len() == sizes.len() {
                checksums
            } else {
                Vec::new()
            },
            upload_id: upload_id.to_string(),
        };
        if layout.encoded_len() > MAX_LAYOUT_BYTES {
            layout.checksums = Vec::new();
        }
        if layout.encoded_len() > MAX_LAYOUT_BYTES {
            layout.sizes = Vec::new();
        }
        layout
    }

    /// A layout of which only the part count is known (records written before sizes were
    /// kept).
    pub fn count_only(count: u32) -> PartLayout {
        PartLayout {
            count,
            ..PartLayout::default()
        }
    }

    /// About what the layout takes in the stored (JSON) metadata: digits, quotes, commas.
    fn encoded_len(&self) -> usize {
        self.sizes.len() * 32
            + self.checksums.iter().map(|c| c.len() + 3).sum::<usize>()
            + self.upload_id.len()
            + 64
    }

    fn footprint(&self) -> usize {
        self.sizes.len() * 12
            + self.checksums.iter().map(String::len).sum::<usize>()
            + self.upload_id.len()
    }

    /// Whether each part's size is known (see [`PartLayout::sizes`]).
    pub fn sizes_known(&self) -> bool {
        self.sizes.iter().map(|(_, n)| u64::from(*n)).sum::<u64>() == u64::from(self.count)
            && self.count > 0
    }

    /// Every part in order, when the sizes are known.
    pub fn parts(&self) -> Option<Vec<ObjectPart>> {
        if !self.sizes_known() {
            return None;
        }
        let mut out = Vec::with_capacity(self.count as usize);
        let mut offset = 0u64;
        for &(size, n) in &self.sizes {
            for _ in 0..n {
                let i = out.len();
                out.push(ObjectPart {
                    number: i as u32 + 1,
                    offset,
                    size,
                    checksum: self.checksums.get(i).cloned(),
                });
                offset += size;
            }
        }
        Some(out)
    }

    /// Part `number` (1-based), when the sizes are known and it exists.
    pub fn part(&self, number: u32) -> Option<ObjectPart> {
        if number == 0 || number > self.count {
            return None;
        }
        self.parts()?.into_iter().nth(number as usize - 1)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layout_runs_its_sizes_and_finds_each_part() {
        let l = PartLayout::new("u", &[5, 5, 5, 2], vec!["a".into(); 4]);
        assert_eq!(l.sizes, [(5, 3), (2, 1)]);
        assert!(l.sizes_known());
        let p = l.part(4).expect("part 4");
        assert_eq!((p.number, p.offset, p.size), (4, 15, 2));
        assert!(l.part(0).is_none() && l.part(5).is_none());
        // Checksums come whole or not at all.
        assert!(PartLayout::new("u", &[1, 2], vec!["a".into()])
            .checksums
            .is_empty());
    }

    #[test]
    fn a_layout_stays_within_its_budget() {
        // 10,000 SHA-256 part checksums cannot travel in a record: they go, sizes stay.
        let sizes = vec![5 << 20; 10_000];
        let sums = vec!["x".repeat(44); 10_000];
        let l = PartLayout::new("u", &sizes, sums);
        assert!(l.checksums.is_empty() && l.sizes_known());
        assert!(l.encoded_len() <= MAX_LAYOUT_BYTES);
        // As many distinct sizes as parts: only the count is left.
        let sizes: Vec<u64> = (0..10_000).map(|i| (5 << 20) + i).collect();
        let l = PartLayout::new("u", &sizes, Vec::new());
        assert_eq!((l.count, l.sizes_known()), (10_000, false));
        assert_eq!(l.upload_id, "u");
    }
}
