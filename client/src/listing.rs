//! What listings return: buckets, one page of ListObjectsV2, and a whole listing.
//!
//! Plain data, read from the server's XML by `xml.rs` and returned by [`crate::Client`]'s
//! listing calls; walking the pages of a listing is `paging.rs`.

use std::time::SystemTime;

/// One bucket from ListBuckets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketInfo {
    pub name: String,
    pub creation_date: SystemTime,
}

/// One object (`<Contents>`) of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectSummary {
    pub key: String,
    pub size: u64,
    /// The ETag without its surrounding quotes (empty if the server sent none).
    pub etag: String,
    pub last_modified: SystemTime,
}

/// One ListObjectsV2 answer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ListPage {
    pub objects: Vec<ObjectSummary>,
    /// Rolled-up "folders" (`<CommonPrefixes>`), each ending with the delimiter.
    pub common_prefixes: Vec<String>,
    pub is_truncated: bool,
    /// Pass to the next call to continue; `None` on the last page.
    pub next_continuation_token: Option<String>,
    /// Objects plus common prefixes in this page.
    pub key_count: u64,
}

/// A whole listing, every page collected.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Listing {
    pub objects: Vec<ObjectSummary>,
    pub common_prefixes: Vec<String>,
}
