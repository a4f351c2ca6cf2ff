//! Following continuation tokens: the pages of a listing, lazily or all at once.
//!
//! S3 returns at most `max-keys` (1000 by default) entries per answer and a token to ask for
//! the next page. [`ListPages`] walks the pages lazily, so the CLI can print a bucket of a
//! million keys without holding it; [`Listing`] is the collected form for callers that want
//! everything at once. The [`Client`] methods that start a walk live here with the walker,
//! which calls back into [`Client::list_objects_v2`] for each page.

use crate::client::Client;
use crate::error::ClientError;
use crate::listing::{ListPage, Listing};

impl Client {
    /// Every page of a listing, fetched lazily as the iterator advances.
    pub fn list_pages(
        &self,
        bucket: &str,
        prefix: Option<&str>,
        delimiter: Option<&str>,
    ) -> ListPages<'_> {
        ListPages::new(self, bucket, prefix, delimiter, None)
    }

    /// The whole listing, following continuation tokens to the end.
    pub fn list_all(
        &self,
        bucket: &str,
        prefix: Option<&str>,
        delimiter: Option<&str>,
    ) -> Result<Listing, ClientError> {
        let mut all = Listing::default();
        for page in self.list_pages(bucket, prefix, delimiter) {
            let page = page?;
            all.objects.extend(page.objects);
            all.common_prefixes.extend(page.common_prefixes);
        }
        Ok(all)
    }
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
    fn new(
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
