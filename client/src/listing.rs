//! Listings: buckets, one page of ListObjectsV2, and following continuation tokens.
//!
//! S3 returns at most `max-keys` (1000 by default) entries per answer and a token to ask for
//! the next page. [`ListPages`] walks the pages lazily, so the CLI can print a bucket of a
//! million keys without holding it; [`Listing`] is the collected form for callers that want
//! everything at once.

use std::time::SystemTime;

use crate::client::Client;
use crate::error::ClientError;

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

/// Iterator over the pages of a listing; yields an error at most once, then stops.
///
/// Created by [`Client::list_pages`].
pub struct ListPages<'a> {
    client: &'a Client,
    bucket: String,
    prefix: Option<String>,
    delimiter: Option<String>,
    max_keys: Option<u32>,
    token: Option<String>,
    done: bool,
}

impl<'a> ListPages<'a> {
    pub(crate) fn new(
        client: &'a Client,
        bucket: &str,
        prefix: Option<&str>,
        delimiter: Option<&str>,
        max_keys: Option<u32>,
    ) -> Self {
        ListPages {
            client,
            bucket: bucket.to_string(),
            prefix: prefix.map(str::to_string),
            delimiter: delimiter.map(str::to_string),
            max_keys,
            token: None,
            done: false,
        }
    }

    /// Fetches the next page and decides whether there is one after it.
    fn fetch(&mut self) -> Result<ListPage, ClientError> {
        let page = self.client.list_objects_v2(
            &self.bucket,
            self.prefix.as_deref(),
            self.delimiter.as_deref(),
            self.max_keys,
            self.token.as_deref(),
            None,
        )?;
        if !page.is_truncated {
            self.done = true;
            return Ok(page);
        }
        // A truncated page without a fresh token would make us ask for the same page forever.
        match &page.next_continuation_token {
            None => Err(ClientError::InvalidResponse(
                "listing is truncated but has no NextContinuationToken".into(),
            )),
            Some(t) if self.token.as_ref() == Some(t) => Err(ClientError::InvalidResponse(
                "listing returned the same continuation token twice".into(),
            )),
            Some(t) => {
                self.token = Some(t.clone());
                Ok(page)
            }
        }
    }
}

impl Iterator for ListPages<'_> {
    type Item = Result<ListPage, ClientError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let result = self.fetch();
        if result.is_err() {
            self.done = true;
        }
        Some(result)
    }
}

impl std::iter::FusedIterator for ListPages<'_> {}
