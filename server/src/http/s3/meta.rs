//! Object metadata carried in headers: what a PUT stores and a GET/HEAD returns.

use http::response::Builder;
use http::HeaderMap;
use yutu_api::S3ErrorCode;

use crate::http::error::S3Error;
use crate::model::ObjectMeta;

/// Most bytes of `x-amz-meta-*` names and values one object may carry (S3's limit).
pub const MAX_USER_METADATA: usize = 2048;

/// Response headers stored with an object and returned on GET/HEAD (besides Content-Type).
pub const STORED_HEADERS: &[&str] = &[
    "cache-control",
    "content-disposition",
    "content-encoding",
    "content-language",
    "expires",
];

/// The parts of an object's metadata a request sets.
pub struct RequestMeta {
    pub content_type: Option<String>,
    pub headers: Vec<(String, String)>,
    pub user_meta: Vec<(String, String)>,
}

fn text(name: &str, v: &http::HeaderValue) -> Result<String, S3Error> {
    v.to_str().map(str::to_string).map_err(|_| {
        S3Error::new(S3ErrorCode::InvalidArgument)
            .msg(format!("The value of {name} is not printable ASCII."))
    })
}

impl RequestMeta {
    /// An object's metadata with these headers; size, ETag and checksum are filled in later.
    pub fn into_object_meta(self) -> ObjectMeta {
        ObjectMeta {
            size: 0,
            etag: String::new(),
            last_modified: std::time::SystemTime::now(),
            content_type: self.content_type,
            headers: self.headers,
            user_meta: self.user_meta,
            checksum: None,
            parts: None,
            owner: String::new(),
            acl: Default::default(),
            kv: false,
            version: crate::model::Version::ZERO,
        }
    }
}

/// Reads Content-Type, the stored headers and `x-amz-meta-*` from a request.
pub fn from_request(h: &HeaderMap) -> Result<RequestMeta, S3Error> {
    let mut user_meta = Vec::new();
    let mut total = 0;
    for (name, value) in h {
        if let Some(suffix) = name.as_str().strip_prefix("x-amz-meta-") {
            let value = text(name.as_str(), value)?;
            total += suffix.len() + value.len();
            user_meta.push((suffix.to_string(), value));
        }
    }
    if total > MAX_USER_METADATA {
        return Err(S3Error::new(S3ErrorCode::MetadataTooLarge).msg(format!(
            "Your metadata headers are {total} bytes; the maximum is {MAX_USER_METADATA}."
        )));
    }
    let mut headers = Vec::new();
    for name in STORED_HEADERS {
        if let Some(v) = h.get(*name) {
            let mut v = text(name, v)?;
            if *name == "content-encoding" {
                // aws-chunked is the framing of this upload (or, on a body sent whole, a name
                // for none), never a property of the object: dropped wherever it is listed,
                // as often as it is, in any case (encodings are case-insensitive).
                v = v
                    .split(',')
                    .map(str::trim)
                    .filter(|e| !e.is_empty() && !e.eq_ignore_ascii_case("aws-chunked"))
                    .collect::<Vec<_>>()
                    .join(", ");
                if v.is_empty() {
                    continue;
                }
            }
            headers.push((name.to_string(), v));
        }
    }
    let content_type = h
        .get("content-type")
        .map(|v| text("content-type", v))
        .transpose()?;
    Ok(RequestMeta {
        content_type,
        headers,
        user_meta,
    })
}

/// Adds an object's metadata headers to a GET/HEAD (or 304) response. The stored checksum is
/// returned when asked for, and never on a partial read, where it would not describe the bytes.
pub fn to_response(
    mut b: Builder,
    meta: &ObjectMeta,
    checksum_mode: bool,
    partial: bool,
) -> Builder {
    b = b
        .header("etag", &meta.etag)
        .header("last-modified", httpdate::fmt_http_date(meta.last_modified))
        .header(
            "content-type",
            meta.content_type
                .as_deref()
                .unwrap_or("binary/octet-stream"),
        );
    for (name, value) in &meta.headers {
        b = b.header(name.as_str(), value.as_str());
    }
    for (name, value) in &meta.user_meta {
        b = b.header(format!("x-amz-meta-{name}"), value.as_str());
    }
    if let Some(p) = &meta.parts {
        b = b.header("x-amz-mp-parts-count", p.count);
    }
    if checksum_mode && !partial {
        if let Some(c) = &meta.checksum {
            b = b
                .header(c.algorithm.header(), c.header_value())
                .header("x-amz-checksum-type", c.type_name());
        }
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored_encoding(value: &str) -> Option<String> {
        let mut h = HeaderMap::new();
        h.insert("content-encoding", value.parse().unwrap());
        let m = from_request(&h).unwrap();
        m.headers
            .into_iter()
            .find(|(n, _)| n == "content-encoding")
            .map(|(_, v)| v)
    }

    #[test]
    fn aws_chunked_is_never_stored() {
        assert_eq!(stored_encoding("aws-chunked"), None);
        assert_eq!(stored_encoding("aws-chunked, aws-chunked"), None);
        assert_eq!(stored_encoding("AWS-Chunked"), None);
        assert_eq!(stored_encoding("aws-chunked,gzip").as_deref(), Some("gzip"));
        assert_eq!(stored_encoding("gzip,aws-chunked").as_deref(), Some("gzip"));
        assert_eq!(stored_encoding("gzip, br").as_deref(), Some("gzip, br"));
    }
}
