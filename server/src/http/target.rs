//! What a request addresses: bucket, key and query parameters, from a path-style URI
//! (`host/bucket/key`) or a virtual-host-style one (`bucket.domain/key`).

use http::Uri;
use percent_encoding::percent_decode_str;
use yutu_api::S3ErrorCode;

use super::error::S3Error;

/// `/{bucket}/{key}?{query}`, decoded.
#[derive(Debug, Default)]
pub struct Target {
    pub bucket: Option<String>,
    pub key: Option<String>,
    pub query: Vec<(String, String)>,
    /// Whether the bucket came from the Host header (virtual-host style).
    pub virtual_host: bool,
}

impl Target {
    /// Parses a path-style target.
    pub fn parse(uri: &Uri) -> Result<Target, S3Error> {
        Self::parse_with_host(uri, None, &[])
    }

    /// Parses a target; when `host` is `BUCKET.DOMAIN` for one of `domains`, the bucket comes
    /// from the host and the whole path is the key.
    pub fn parse_with_host(
        uri: &Uri,
        host: Option<&str>,
        domains: &[String],
    ) -> Result<Target, S3Error> {
        let path = uri.path();
        let rest = path.strip_prefix('/').unwrap_or(path);
        let host_bucket = host.and_then(|h| {
            // Strip a port; IPv6 literals never name a bucket.
            let name = if h.starts_with('[') {
                return None;
            } else {
                h.split(':').next().unwrap_or(h)
            };
            domains.iter().find_map(|d| {
                name.strip_suffix(d.as_str())
                    .and_then(|b| b.strip_suffix('.'))
                    .filter(|b| !b.is_empty())
            })
        });
        let (bucket, key) = match host_bucket {
            Some(b) => (b, Some(rest)),
            None => match rest.split_once('/') {
                Some((b, k)) => (b, Some(k)),
                None => (rest, None),
            },
        };
        let decode = |s: &str| -> Result<String, S3Error> {
            percent_decode_str(s)
                .decode_utf8()
                .map(|c| c.into_owned())
                .map_err(|_| {
                    S3Error::new(S3ErrorCode::InvalidURI)
                        .msg("The request path is not valid percent-encoded UTF-8.")
                })
        };
        let bucket = if bucket.is_empty() {
            None
        } else {
            Some(decode(bucket)?)
        };
        let key = match key {
            Some(k) if !k.is_empty() => Some(decode(k)?),
            _ => None,
        };
        let query = uri
            .query()
            .map(|q| {
                form_urlencoded::parse(q.as_bytes())
                    .map(|(k, v)| (k.into_owned(), v.into_owned()))
                    .collect()
            })
            .unwrap_or_default();
        Ok(Target {
            bucket,
            key,
            query,
            virtual_host: host_bucket.is_some(),
        })
    }

    pub fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn has(&self, name: &str) -> bool {
        self.query.iter().any(|(k, _)| k == name)
    }

    /// The first S3 sub-resource in the query that Yutu does not implement, if any.
    pub fn unsupported_subresource(&self) -> Option<&str> {
        const UNSUPPORTED: &[&str] = &[
            "accelerate",
            "analytics",
            "encryption",
            "intelligent-tiering",
            "inventory",
            "legal-hold",
            "lifecycle",
            "logging",
            "metrics",
            "notification",
            "object-lock",
            "replication",
            "requestPayment",
            "restore",
            "retention",
            "select",
            "tagging",
            "torrent",
            "versioning",
            "website",
        ];
        self.query
            .iter()
            .map(|(k, _)| k.as_str())
            .find(|k| UNSUPPORTED.contains(k))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_and_decodes() {
        let t = Target::parse(&"/b/a%20b/c+d?prefix=x%2Fy&list-type=2".parse().unwrap()).unwrap();
        assert_eq!(t.bucket.as_deref(), Some("b"));
        assert_eq!(t.key.as_deref(), Some("a b/c+d"));
        assert_eq!(t.param("prefix"), Some("x/y"));
        assert_eq!(t.param("list-type"), Some("2"));
        let t = Target::parse(&"/".parse().unwrap()).unwrap();
        assert!(t.bucket.is_none() && t.key.is_none());
        let t = Target::parse(&"/b/".parse().unwrap()).unwrap();
        assert_eq!(t.bucket.as_deref(), Some("b"));
        assert!(t.key.is_none());
        assert!(Target::parse(&"/b/%FF".parse().unwrap()).is_err());
        let t = Target::parse(&"/b?website".parse().unwrap()).unwrap();
        assert_eq!(t.unsupported_subresource(), Some("website"));
    }

    #[test]
    fn virtual_host_style() {
        let domains = vec!["localhost".to_string(), "s3.example.com".to_string()];
        let t = Target::parse_with_host(
            &"/dir/k".parse().unwrap(),
            Some("photos.localhost:9000"),
            &domains,
        )
        .unwrap();
        assert_eq!(
            (t.bucket.as_deref(), t.key.as_deref()),
            (Some("photos"), Some("dir/k"))
        );
        let t =
            Target::parse_with_host(&"/".parse().unwrap(), Some("a.b.s3.example.com"), &domains)
                .unwrap();
        assert_eq!((t.bucket.as_deref(), t.key), (Some("a.b"), None));
        // The bare domain and other hosts are path style.
        let t = Target::parse_with_host(&"/b/k".parse().unwrap(), Some("localhost:9000"), &domains)
            .unwrap();
        assert_eq!(
            (t.bucket.as_deref(), t.key.as_deref()),
            (Some("b"), Some("k"))
        );
        let t = Target::parse_with_host(&"/b/k".parse().unwrap(), Some("127.0.0.1:9000"), &domains)
            .unwrap();
        assert_eq!(t.bucket.as_deref(), Some("b"));
    }
}
