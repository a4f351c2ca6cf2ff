//! The client's error type, and how a failed HTTP answer becomes one.
//!
//! S3 reports failures as an HTTP status plus an XML `<Error>` body whose `<Code>` is what
//! callers branch on (`NoSuchKey`, `BucketNotEmpty`, ...). We keep status, code and message
//! together in [`ClientError::S3`] so that a caller (and the CLI) can print exactly what the
//! server said. HEAD answers carry no body, so for them the code is inferred from the status
//! and from which resource the request was about.

use serde::Deserialize;
use yutu_api::S3ErrorCode;

/// Everything that can go wrong in a client call.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with an S3 error.
    #[error("{code}: {message}")]
    S3 {
        /// HTTP status of the answer.
        status: u16,
        /// S3 error code, e.g. `NoSuchKey`.
        code: String,
        /// Human-readable explanation from the server (or a default one).
        message: String,
    },
    /// The base URL given to [`crate::Client::new`] cannot be used.
    #[error("invalid server URL {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },
    /// The caller asked for something that cannot be sent (empty key, inverted range, ...).
    /// Caught locally because some of these would silently address another resource: a PUT
    /// or DELETE with an empty key would hit the bucket itself.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The server answered with success, but with something this client cannot read
    /// (malformed XML, missing or garbled headers).
    #[error("invalid response from server: {0}")]
    InvalidResponse(String),
    /// Connecting, sending or receiving failed.
    #[error("HTTP transport error: {0}")]
    Transport(#[from] ureq::Error),
    /// Reading a request body or writing a response body failed.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

impl ClientError {
    /// The S3 error code, when the server sent one.
    pub fn code(&self) -> Option<&str> {
        match self {
            ClientError::S3 { code, .. } => Some(code),
            _ => None,
        }
    }

    /// The HTTP status, when the server answered with an error.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::S3 { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// True for `NoSuchKey` and `NoSuchBucket` (and any other 404).
    pub fn is_not_found(&self) -> bool {
        self.status() == Some(404)
    }
}

/// What a request was about; decides the code of a body-less 404.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resource {
    /// The service root (ListBuckets).
    Service,
    Bucket,
    Object,
}

/// The S3 `<Error>` document. Unknown elements (`Resource`, `RequestId`, ...) are ignored.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ErrorDoc {
    #[serde(default)]
    code: String,
    #[serde(default)]
    message: String,
}

/// Builds the error for a non-success answer.
///
/// `body` is the (possibly empty, possibly truncated) response body; `header_code` and
/// `header_message` are the `x-amz-error-code`/`x-amz-error-message` headers that some servers
/// add so that HEAD failures can be told apart. The body (S3's XML, or the JSON of Yutu's KV
/// and admin APIs) wins, then the headers, then a code inferred from the status.
pub(crate) fn error_from_response(
    status: u16,
    body: &str,
    header_code: Option<&str>,
    header_message: Option<&str>,
    resource: Resource,
) -> ClientError {
    let json = serde_json::from_str::<yutu_api::error::JsonError>(body)
        .ok()
        .filter(|e| !e.code.is_empty())
        .map(|e| (e.code, e.message));
    if let Some((code, message)) = parse_error_xml(body).or(json) {
        let message = if message.is_empty() {
            default_message(&code, status)
        } else {
            message
        };
        return ClientError::S3 {
            status,
            code,
            message,
        };
    }
    let code = match header_code {
        Some(c) if !c.is_empty() => c.to_string(),
        _ => code_for_status(status, resource).to_string(),
    };
    let message = match header_message {
        Some(m) if !m.is_empty() => m.to_string(),
        // A non-XML body (a proxy's HTML page, plain text) still says more than nothing.
        _ if !body.trim().is_empty() => truncate(body.trim(), 200),
        _ => default_message(&code, status),
    };
    ClientError::S3 {
        status,
        code,
        message,
    }
}

/// Reads `<Error><Code>..</Code><Message>..</Message></Error>`; `None` if the body is not
/// such a document or has no code.
pub(crate) fn parse_error_xml(body: &str) -> Option<(String, String)> {
    let body = body.trim_start();
    if !body.starts_with('<') {
        return None;
    }
    let doc: ErrorDoc = quick_xml::de::from_str(body).ok()?;
    if doc.code.is_empty() {
        return None;
    }
    Some((doc.code, doc.message))
}

/// The code S3 would have sent with this status, for answers that carry none (HEAD).
fn code_for_status(status: u16, resource: Resource) -> &'static str {
    match (status, resource) {
        (404, Resource::Object) => "NoSuchKey",
        (404, _) => "NoSuchBucket",
        (301 | 307, _) => "PermanentRedirect",
        (304, _) => "NotModified",
        (400, _) => "BadRequest",
        (403, _) => "AccessDenied",
        (405, _) => "MethodNotAllowed",
        (409, _) => "Conflict",
        (411, _) => "MissingContentLength",
        (412, _) => "PreconditionFailed",
        (416, _) => "InvalidRange",
        (500, _) => "InternalError",
        (501, _) => "NotImplemented",
        (503, _) => "ServiceUnavailable",
        _ => "UnknownError",
    }
}

/// S3's wording for the codes `yutu-api` knows, else a generic line with the status.
fn default_message(code: &str, status: u16) -> String {
    KNOWN_CODES
        .iter()
        .find(|c| c.code() == code)
        .map(|c| c.default_message().to_string())
        .unwrap_or_else(|| format!("HTTP status {status}"))
}

const KNOWN_CODES: &[S3ErrorCode] = &[
    S3ErrorCode::AccessDenied,
    S3ErrorCode::BadDigest,
    S3ErrorCode::BucketAlreadyExists,
    S3ErrorCode::BucketAlreadyOwnedByYou,
    S3ErrorCode::BucketNotEmpty,
    S3ErrorCode::EntityTooLarge,
    S3ErrorCode::IncompleteBody,
    S3ErrorCode::InternalError,
    S3ErrorCode::InvalidArgument,
    S3ErrorCode::InvalidBucketName,
    S3ErrorCode::InvalidRange,
    S3ErrorCode::InvalidRequest,
    S3ErrorCode::InvalidURI,
    S3ErrorCode::KeyTooLongError,
    S3ErrorCode::MetadataTooLarge,
    S3ErrorCode::MethodNotAllowed,
    S3ErrorCode::MissingContentLength,
    S3ErrorCode::NoSuchBucket,
    S3ErrorCode::NoSuchKey,
    S3ErrorCode::NotImplemented,
    S3ErrorCode::OperationAborted,
    S3ErrorCode::PreconditionFailed,
    S3ErrorCode::RequestHeaderSectionTooLarge,
    S3ErrorCode::ServiceUnavailable,
    S3ErrorCode::SlowDown,
];

/// Cuts `s` to at most `max` bytes on a character boundary.
fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s3(e: ClientError) -> (u16, String, String) {
        match e {
            ClientError::S3 {
                status,
                code,
                message,
            } => (status, code, message),
            other => panic!("not an S3 error: {other:?}"),
        }
    }

    #[test]
    fn parses_s3_error_document() {
        let body = r#"<?xml version="1.0" encoding="UTF-8"?>
<Error><Code>NoSuchKey</Code><Message>The specified key does not exist.</Message><BucketName>b</BucketName><Key>a&lt;b</Key><Resource>/b/a&lt;b</Resource><RequestId>1</RequestId></Error>"#;
        let (status, code, message) =
            s3(error_from_response(404, body, None, None, Resource::Object));
        assert_eq!(status, 404);
        assert_eq!(code, "NoSuchKey");
        assert_eq!(message, "The specified key does not exist.");
    }

    #[test]
    fn xml_wins_over_status_inference() {
        let body = "<Error><Code>NoSuchBucket</Code><Message>gone</Message></Error>";
        let (_, code, message) = s3(error_from_response(404, body, None, None, Resource::Object));
        assert_eq!((code.as_str(), message.as_str()), ("NoSuchBucket", "gone"));
    }

    #[test]
    fn empty_message_gets_default() {
        let body = "<Error><Code>BucketNotEmpty</Code></Error>";
        let (_, code, message) = s3(error_from_response(409, body, None, None, Resource::Bucket));
        assert_eq!(code, "BucketNotEmpty");
        assert_eq!(message, "The bucket you tried to delete is not empty.");
    }

    #[test]
    fn head_404_depends_on_resource() {
        let (_, code, message) = s3(error_from_response(404, "", None, None, Resource::Object));
        assert_eq!(code, "NoSuchKey");
        assert_eq!(message, "The specified key does not exist.");
        let (_, code, _) = s3(error_from_response(404, "", None, None, Resource::Bucket));
        assert_eq!(code, "NoSuchBucket");
    }

    #[test]
    fn headers_name_the_code_when_there_is_no_body() {
        let e = error_from_response(
            404,
            "",
            Some("NoSuchBucket"),
            Some("no bucket"),
            Resource::Object,
        );
        let (_, code, message) = s3(e);
        assert_eq!(
            (code.as_str(), message.as_str()),
            ("NoSuchBucket", "no bucket")
        );
    }

    #[test]
    fn non_xml_body_becomes_the_message() {
        let (status, code, message) = s3(error_from_response(
            502,
            "Bad gateway\n",
            None,
            None,
            Resource::Object,
        ));
        assert_eq!((status, code.as_str()), (502, "UnknownError"));
        assert_eq!(message, "Bad gateway");
    }

    #[test]
    fn garbage_xml_falls_back() {
        assert_eq!(parse_error_xml("<Error><Code>x</Cod"), None);
        assert_eq!(parse_error_xml("<Error></Error>"), None);
        assert_eq!(parse_error_xml("not xml"), None);
        let (_, code, _) = s3(error_from_response(
            500,
            "<html>oops</html>",
            None,
            None,
            Resource::Service,
        ));
        assert_eq!(code, "InternalError");
    }

    #[test]
    fn truncates_on_char_boundary() {
        assert_eq!(truncate("ééé", 3), "é...");
        assert_eq!(truncate("abc", 3), "abc");
    }

    #[test]
    fn accessors() {
        let e = error_from_response(404, "", None, None, Resource::Object);
        assert_eq!(e.code(), Some("NoSuchKey"));
        assert!(e.is_not_found());
        let e = ClientError::InvalidArgument("x".into());
        assert_eq!(e.code(), None);
        assert!(!e.is_not_found());
    }
}
