//! Turning (bucket, key, query) into the URL of a path-style S3 request.
//!
//! Path style means `{base}/{bucket}/{key}`. Keys are arbitrary UTF-8, so every byte outside
//! RFC 3986's unreserved set is percent-encoded, except `/`: S3 keys use it as a folder
//! separator and servers (and SigV4's canonical URI) expect it literal. Query values are
//! encoded the same way, `/` included, so that a prefix like `a/b&c` cannot split a parameter.

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use ureq::http::Uri;

use crate::error::ClientError;

/// Everything except RFC 3986 unreserved characters (`A-Z a-z 0-9 - . _ ~`).
const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Like [`COMPONENT`] but keeps `/`, for object keys in the path.
const KEY: &AsciiSet = &COMPONENT.remove(b'/');

/// The server's base URL, checked once and kept without a trailing slash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BaseUrl(String);

impl BaseUrl {
    /// Accepts `http://host[:port][/path-prefix]` (and `https://` when built with `tls`).
    /// A path prefix is kept, so a server mounted behind a proxy under `/s3` still works.
    pub(crate) fn parse(url: &str) -> Result<BaseUrl, ClientError> {
        let bad = |reason: &str| ClientError::InvalidUrl {
            url: url.to_string(),
            reason: reason.to_string(),
        };
        let uri: Uri = url.parse().map_err(|_| bad("not a valid URL"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") if cfg!(feature = "tls") => {}
            Some("https") => {
                return Err(bad("https needs yutu-client built with the `tls` feature"))
            }
            Some(_) => return Err(bad("scheme must be http or https")),
            None => return Err(bad("missing scheme (expected http://host:port)")),
        }
        if uri.authority().is_none_or(|a| a.host().is_empty()) {
            return Err(bad("missing host"));
        }
        if uri.query().is_some() {
            return Err(bad("must not have a query string"));
        }
        if url.contains('#') {
            return Err(bad("must not have a fragment"));
        }
        Ok(BaseUrl(url.trim_end_matches('/').to_string()))
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    /// The path prefix (`/s3` of `http://proxy/s3`; empty without one). A proxy that mounts
    /// a node under it strips it, so the node sees, and verifies signatures over, the path
    /// after it.
    pub(crate) fn path_prefix(&self) -> &str {
        let rest = self.0.split_once("://").map_or("", |(_, r)| r);
        rest.find('/').map_or("", |i| &rest[i..])
    }

    /// `{base}/` — the service root (ListBuckets).
    pub(crate) fn service(&self) -> String {
        format!("{}/", self.0)
    }

    /// `{base}/{bucket}`, with an optional query.
    pub(crate) fn bucket(
        &self,
        bucket: &str,
        query: &[(&str, &str)],
    ) -> Result<String, ClientError> {
        check_bucket(bucket)?;
        let mut url = format!("{}/{}", self.0, utf8_percent_encode(bucket, COMPONENT));
        push_query(&mut url, query);
        Ok(url)
    }

    /// `{base}/{bucket}/{key}`.
    pub(crate) fn object(&self, bucket: &str, key: &str) -> Result<String, ClientError> {
        check_bucket(bucket)?;
        if key.is_empty() {
            // `/{bucket}/` would address the bucket itself: a DELETE would delete the bucket.
            return Err(ClientError::InvalidArgument(
                "object key must not be empty".into(),
            ));
        }
        Ok(format!(
            "{}/{}/{}",
            self.0,
            utf8_percent_encode(bucket, COMPONENT),
            encode_key(key)
        ))
    }
}

/// Percent-encodes a key for the path, keeping `/`.
pub fn encode_key(key: &str) -> String {
    utf8_percent_encode(key, KEY).to_string()
}

/// Only what would make the URL address something else is refused here; the full naming
/// rules are the server's to enforce, so its `InvalidBucketName` reaches the user unchanged.
fn check_bucket(bucket: &str) -> Result<(), ClientError> {
    if bucket.is_empty() {
        return Err(ClientError::InvalidArgument(
            "bucket name must not be empty".into(),
        ));
    }
    if bucket.contains('/') {
        return Err(ClientError::InvalidArgument(format!(
            "bucket name {bucket:?} must not contain '/'"
        )));
    }
    Ok(())
}

/// Appends `?k=v&k2=v2`, encoding names and values. An empty value is written as `k=`, which
/// S3 reads the same as a present-but-empty parameter.
fn push_query(url: &mut String, query: &[(&str, &str)]) {
    for (i, (name, value)) in query.iter().enumerate() {
        url.push(if i == 0 { '?' } else { '&' });
        url.extend(utf8_percent_encode(name, COMPONENT));
        url.push('=');
        url.extend(utf8_percent_encode(value, COMPONENT));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> BaseUrl {
        BaseUrl::parse("http://127.0.0.1:9000").unwrap()
    }

    #[test]
    fn base_url_is_checked_and_trimmed() {
        assert_eq!(base().as_str(), "http://127.0.0.1:9000");
        assert_eq!(
            BaseUrl::parse("http://h:1/").unwrap().service(),
            "http://h:1/"
        );
        assert_eq!(
            BaseUrl::parse("http://h/s3/")
                .unwrap()
                .object("b", "k")
                .unwrap(),
            "http://h/s3/b/k"
        );
        for bad in [
            "127.0.0.1:9000",
            "ftp://h",
            "http://h/?x=1",
            "",
            "http://h/#f",
            "not a url",
        ] {
            assert!(
                matches!(BaseUrl::parse(bad), Err(ClientError::InvalidUrl { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn https_needs_the_tls_feature() {
        assert_eq!(BaseUrl::parse("https://h").is_ok(), cfg!(feature = "tls"));
    }

    #[test]
    fn keys_keep_slashes_and_unreserved() {
        assert_eq!(encode_key("a/b/c.txt"), "a/b/c.txt");
        assert_eq!(encode_key("A-z_0.9~"), "A-z_0.9~");
        assert_eq!(
            encode_key("a b+c&d=e?f#g%h"),
            "a%20b%2Bc%26d%3De%3Ff%23g%25h"
        );
        assert_eq!(encode_key("é/日本"), "%C3%A9/%E6%97%A5%E6%9C%AC");
        assert_eq!(encode_key("//x//"), "//x//");
    }

    #[test]
    fn object_urls() {
        assert_eq!(
            base().object("bkt", "dir/a b.txt").unwrap(),
            "http://127.0.0.1:9000/bkt/dir/a%20b.txt"
        );
        assert!(matches!(
            base().object("bkt", ""),
            Err(ClientError::InvalidArgument(_))
        ));
        assert!(matches!(
            base().object("", "k"),
            Err(ClientError::InvalidArgument(_))
        ));
        assert!(matches!(
            base().object("a/b", "k"),
            Err(ClientError::InvalidArgument(_))
        ));
    }

    #[test]
    fn bucket_urls_with_query() {
        assert_eq!(
            base().bucket("bkt", &[]).unwrap(),
            "http://127.0.0.1:9000/bkt"
        );
        assert_eq!(
            base()
                .bucket(
                    "bkt",
                    &[
                        ("list-type", "2"),
                        ("prefix", "a/b&c=d"),
                        ("delimiter", "/")
                    ]
                )
                .unwrap(),
            "http://127.0.0.1:9000/bkt?list-type=2&prefix=a%2Fb%26c%3Dd&delimiter=%2F"
        );
        assert_eq!(
            base().bucket("bkt", &[("start-after", "")]).unwrap(),
            "http://127.0.0.1:9000/bkt?start-after="
        );
    }

    #[test]
    fn built_urls_parse_as_uris() {
        let url = base().object("bkt", "weird key/ü?#[]@!$&'()*+,;=").unwrap();
        let uri: Uri = url.parse().unwrap();
        assert_eq!(
            uri.path(),
            "/bkt/weird%20key/%C3%BC%3F%23%5B%5D%40%21%24%26%27%28%29%2A%2B%2C%3B%3D"
        );
        assert_eq!(uri.query(), None);
    }
}
