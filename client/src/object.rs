//! What the server says about one object, read from response headers.
//!
//! HEAD and GET describe the object in headers only (`Content-Length`, `ETag`,
//! `Last-Modified`, `Content-Type`, and `Content-Range` for a partial GET). The required ones
//! are required here too: an answer without them is reported as
//! [`ClientError::InvalidResponse`] rather than papered over with zeros.

use std::time::SystemTime;

use ureq::http::header::{CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE, ETAG, LAST_MODIFIED};
use ureq::http::HeaderMap;

use crate::error::ClientError;
use crate::timestamp::parse_http_date;

/// Metadata of a stored object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    /// Size of the whole object in bytes (also for a ranged GET).
    pub size: u64,
    /// The ETag without its surrounding quotes; for single-part uploads, the hex MD5.
    pub etag: String,
    pub last_modified: SystemTime,
    pub content_type: Option<String>,
}

/// The answer to a PutObject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutResult {
    /// The new object's ETag without quotes.
    pub etag: String,
}

/// `Content-Range: bytes first-last/total` of a 206 answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ContentRange {
    pub first: u64,
    pub last: u64,
    pub total: u64,
}

/// Strips the quotes S3 puts around ETags (and a weak `W/` marker, should a proxy add one).
pub(crate) fn unquote_etag(etag: &str) -> &str {
    let e = etag.trim();
    let e = e.strip_prefix("W/").unwrap_or(e);
    e.strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(e)
}

/// Reads [`ObjectInfo`] from a HEAD (or 200 GET) answer, whose `Content-Length` is the
/// object size.
pub(crate) fn object_info(headers: &HeaderMap) -> Result<ObjectInfo, ClientError> {
    let size = content_length(headers)?;
    object_info_with_size(headers, size)
}

/// Reads [`ObjectInfo`] when the size comes from elsewhere (a 206's `Content-Range`).
pub(crate) fn object_info_with_size(
    headers: &HeaderMap,
    size: u64,
) -> Result<ObjectInfo, ClientError> {
    let etag = header(headers, ETAG.as_str())
        .map(|e| unquote_etag(e).to_string())
        .ok_or_else(|| missing("ETag"))?;
    let last_modified =
        header(headers, LAST_MODIFIED.as_str()).ok_or_else(|| missing("Last-Modified"))?;
    let last_modified = parse_http_date(last_modified).ok_or_else(|| {
        ClientError::InvalidResponse(format!("unreadable Last-Modified {last_modified:?}"))
    })?;
    Ok(ObjectInfo {
        size,
        etag,
        last_modified,
        content_type: header(headers, CONTENT_TYPE.as_str()).map(str::to_string),
    })
}

/// The `ETag` of a PUT answer.
pub(crate) fn put_result(headers: &HeaderMap) -> Result<PutResult, ClientError> {
    let etag = header(headers, ETAG.as_str()).ok_or_else(|| missing("ETag"))?;
    Ok(PutResult {
        etag: unquote_etag(etag).to_string(),
    })
}

pub(crate) fn content_length(headers: &HeaderMap) -> Result<u64, ClientError> {
    let v = header(headers, CONTENT_LENGTH.as_str()).ok_or_else(|| missing("Content-Length"))?;
    v.trim()
        .parse()
        .map_err(|_| ClientError::InvalidResponse(format!("unreadable Content-Length {v:?}")))
}

pub(crate) fn content_range(headers: &HeaderMap) -> Result<ContentRange, ClientError> {
    let v = header(headers, CONTENT_RANGE.as_str()).ok_or_else(|| missing("Content-Range"))?;
    parse_content_range(v)
        .ok_or_else(|| ClientError::InvalidResponse(format!("unreadable Content-Range {v:?}")))
}

/// Parses `bytes first-last/total` (RFC 9110 §14.4); an unknown total (`*`) is refused
/// because a 206 must state it.
fn parse_content_range(v: &str) -> Option<ContentRange> {
    let rest = v.trim().strip_prefix("bytes ")?;
    let (span, total) = rest.split_once('/')?;
    let (first, last) = span.split_once('-')?;
    let num = |s: &str| -> Option<u64> {
        let s = s.trim();
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        s.parse().ok()
    };
    let r = ContentRange {
        first: num(first)?,
        last: num(last)?,
        total: num(total)?,
    };
    (r.first <= r.last && r.last < r.total).then_some(r)
}

/// A header as text; non-ASCII values are treated as absent.
pub(crate) fn header<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn missing(name: &str) -> ClientError {
    ClientError::InvalidResponse(format!("the answer has no {name} header"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};
    use ureq::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn etags_lose_their_quotes() {
        assert_eq!(unquote_etag("\"abc\""), "abc");
        assert_eq!(unquote_etag("W/\"abc-3\""), "abc-3");
        assert_eq!(unquote_etag("abc"), "abc");
        assert_eq!(unquote_etag("\""), "\"");
        assert_eq!(unquote_etag(""), "");
    }

    #[test]
    fn reads_head_headers() {
        let h = headers(&[
            ("content-length", "1234"),
            ("etag", "\"d41d8cd98f00b204e9800998ecf8427e\""),
            ("last-modified", "Thu, 01 Jan 2026 00:00:00 GMT"),
            ("content-type", "text/plain"),
        ]);
        let info = object_info(&h).unwrap();
        assert_eq!(
            info,
            ObjectInfo {
                size: 1234,
                etag: "d41d8cd98f00b204e9800998ecf8427e".into(),
                last_modified: UNIX_EPOCH + Duration::from_secs(1_767_225_600),
                content_type: Some("text/plain".into()),
            }
        );
    }

    #[test]
    fn missing_or_bad_headers_are_errors() {
        let ok = [
            ("content-length", "1"),
            ("etag", "\"e\""),
            ("last-modified", "Thu, 01 Jan 2026 00:00:00 GMT"),
        ];
        assert!(object_info(&headers(&ok)).is_ok());
        for drop in 0..ok.len() {
            let partial: Vec<_> = ok
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != drop)
                .map(|(_, p)| *p)
                .collect();
            assert!(matches!(
                object_info(&headers(&partial)),
                Err(ClientError::InvalidResponse(_))
            ));
        }
        let mut bad = ok;
        bad[0].1 = "-1";
        assert!(object_info(&headers(&bad)).is_err());
        bad = ok;
        bad[2].1 = "yesterday";
        assert!(object_info(&headers(&bad)).is_err());
    }

    #[test]
    fn content_ranges() {
        let r = |s| parse_content_range(s);
        assert_eq!(
            r("bytes 0-9/100"),
            Some(ContentRange {
                first: 0,
                last: 9,
                total: 100
            })
        );
        assert_eq!(r("bytes 99-99/100").map(|c| c.total), Some(100));
        for bad in [
            "bytes 0-9/*",
            "bytes */100",
            "bytes 9-0/100",
            "bytes 0-100/100",
            "items 0-1/2",
            "bytes 0-1",
            "bytes -1-2/3",
        ] {
            assert_eq!(r(bad), None, "{bad}");
        }
    }

    #[test]
    fn put_needs_an_etag() {
        assert_eq!(
            put_result(&headers(&[("etag", "\"x\"")])).unwrap().etag,
            "x"
        );
        assert!(put_result(&headers(&[])).is_err());
    }
}
