//! Authenticating a request: SigV4 in the `Authorization` header or in a presigned URL, and
//! how its payload is protected (`x-amz-content-sha256`).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::{HeaderMap, Method, Uri};
use yutu_api::S3ErrorCode;

use super::chunked::ChunkSigner;
use super::sigv4::{
    canonical_headers, canonical_query, canonical_request, parse_authorization, sign,
    signatures_match, signing_key, string_to_sign, uri_encode, Credential,
};
use super::{AuthError, Identity};
use crate::config::{Settings, User};

/// Largest difference between the client's clock and ours (S3's limit).
pub const MAX_SKEW: Duration = Duration::from_secs(15 * 60);
/// Longest validity of a presigned URL (S3's limit: 7 days).
pub const MAX_PRESIGN: u64 = 7 * 24 * 3600;

/// How the body of a request is protected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// No hash: `UNSIGNED-PAYLOAD`, presigned URLs, or no header at all.
    Unsigned,
    /// The hex SHA-256 the body must have.
    Sha256(String),
    /// `aws-chunked` framing (`STREAMING-*`), chunk signatures verified when `signed`.
    Chunked { signed: bool },
}

/// The outcome of authentication.
pub struct RequestAuth {
    pub identity: Identity,
    pub payload: Payload,
    /// For signed `aws-chunked` bodies: what verifies each chunk's signature.
    pub signer: Option<ChunkSigner>,
}

fn denied(code: S3ErrorCode, msg: impl Into<String>) -> AuthError {
    AuthError::new(code).msg(msg)
}

fn payload_mode(headers: &HeaderMap) -> Result<Payload, AuthError> {
    let Some(v) = headers.get("x-amz-content-sha256") else {
        return Ok(Payload::Unsigned);
    };
    let v = v.to_str().unwrap_or("");
    Ok(match v {
        "UNSIGNED-PAYLOAD" => Payload::Unsigned,
        "STREAMING-AWS4-HMAC-SHA256-PAYLOAD" | "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER" => {
            Payload::Chunked { signed: true }
        }
        "STREAMING-UNSIGNED-PAYLOAD-TRAILER" => Payload::Chunked { signed: false },
        v if v.starts_with("STREAMING-AWS4-ECDSA") => {
            return Err(denied(
                S3ErrorCode::NotImplemented,
                "SigV4a (ECDSA) streaming signatures are not implemented.",
            ))
        }
        v if v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()) => {
            Payload::Sha256(v.to_ascii_lowercase())
        }
        _ => return Err(denied(
            S3ErrorCode::InvalidArgument,
            "x-amz-content-sha256 must be a hex SHA-256, UNSIGNED-PAYLOAD or a STREAMING- value.",
        )),
    })
}

/// Parses `20130524T000000Z`.
pub fn parse_amz_date(s: &str) -> Option<SystemTime> {
    if s.len() != 16 || s.as_bytes()[8] != b'T' || !s.ends_with('Z') {
        return None;
    }
    let rfc3339 = format!(
        "{}-{}-{}T{}:{}:{}Z",
        &s[0..4],
        &s[4..6],
        &s[6..8],
        &s[9..11],
        &s[11..13],
        &s[13..15]
    );
    humantime::parse_rfc3339(&rfc3339).ok()
}

fn skew(t: SystemTime) -> Duration {
    let now = SystemTime::now();
    now.duration_since(t)
        .or_else(|_| t.duration_since(now))
        .unwrap_or_default()
}

/// Authenticates a request; with `--no-auth` only the payload mode is read.
pub fn authenticate(
    settings: &Settings,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    virtual_bucket: Option<&str>,
) -> Result<RequestAuth, AuthError> {
    let mut payload = payload_mode(headers)?;
    if settings.no_auth {
        return Ok(RequestAuth {
            identity: Identity::Open,
            payload,
            signer: None,
        });
    }
    let query = uri.query();
    if let Some(user) = authenticate_v2(settings, method, uri, headers, virtual_bucket)? {
        return Ok(RequestAuth {
            identity: Identity::User(user),
            payload,
            signer: None,
        });
    }
    let presigned = query.is_some_and(|q| q.contains("X-Amz-Algorithm="));
    let (cred, signed_headers, signature, amz_date, payload_hash) = if let Some(auth) =
        headers.get(http::header::AUTHORIZATION)
    {
        let auth = parse_authorization(auth.to_str().unwrap_or("")).map_err(|e| {
            if e.to_string().contains("algorithm") {
                denied(
                    S3ErrorCode::InvalidArgument,
                    format!("{e}; only AWS4-HMAC-SHA256 (SigV4) is supported."),
                )
            } else {
                denied(S3ErrorCode::AuthorizationHeaderMalformed, e.to_string())
            }
        })?;
        let amz_date = headers
            .get("x-amz-date")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .ok_or_else(|| {
                denied(
                    S3ErrorCode::AccessDenied,
                    "AWS authentication requires a valid x-amz-date header.",
                )
            })?;
        let hash = headers
            .get("x-amz-content-sha256")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("UNSIGNED-PAYLOAD")
            .to_string();
        (
            auth.credential,
            auth.signed_headers,
            auth.signature,
            amz_date,
            hash,
        )
    } else if presigned {
        let params: Vec<(String, String)> = form_urlencoded::parse(query.unwrap_or("").as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        let get = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let bad = |m: &str| denied(S3ErrorCode::AuthorizationQueryParametersError, m);
        if get("X-Amz-Algorithm").as_deref() != Some(super::sigv4::ALGORITHM) {
            return Err(bad("X-Amz-Algorithm only supports \"AWS4-HMAC-SHA256\"."));
        }
        let cred = Credential::parse(&get("X-Amz-Credential").unwrap_or_default())
            .map_err(|e| bad(&e.to_string()))?;
        let amz_date = get("X-Amz-Date").ok_or_else(|| bad("X-Amz-Date is missing."))?;
        let expires: u64 = get("X-Amz-Expires")
            .and_then(|e| e.parse().ok())
            .ok_or_else(|| bad("X-Amz-Expires must be a number of seconds."))?;
        if expires == 0 || expires > MAX_PRESIGN {
            return Err(bad(
                "X-Amz-Expires must be between 1 and 604800 seconds (7 days).",
            ));
        }
        let signed_at = parse_amz_date(&amz_date).ok_or_else(|| bad("X-Amz-Date is malformed."))?;
        let now = SystemTime::now();
        if now > signed_at + Duration::from_secs(expires) {
            return Err(denied(S3ErrorCode::AccessDenied, "Request has expired"));
        }
        if signed_at > now + MAX_SKEW {
            return Err(denied(
                S3ErrorCode::RequestTimeTooSkewed,
                "The request was signed in the future.",
            ));
        }
        let signed: Vec<String> = get("X-Amz-SignedHeaders")
            .unwrap_or_default()
            .split(';')
            .map(str::to_string)
            .collect();
        let signature = get("X-Amz-Signature").ok_or_else(|| bad("X-Amz-Signature is missing."))?;
        payload = Payload::Unsigned;
        (
            cred,
            signed,
            signature,
            amz_date,
            "UNSIGNED-PAYLOAD".to_string(),
        )
    } else {
        return Err(denied(
            S3ErrorCode::AccessDenied,
            "Anonymous access is not allowed; sign the request with SigV4.",
        ));
    };

    let user = user_by_key(settings, &cred.access_key)?;
    if cred.service != "s3" {
        return Err(denied(
            S3ErrorCode::AuthorizationHeaderMalformed,
            "The credential scope must name the service s3.",
        ));
    }
    let signed_at = parse_amz_date(&amz_date)
        .ok_or_else(|| denied(S3ErrorCode::AccessDenied, "x-amz-date is malformed."))?;
    if !presigned && skew(signed_at) > MAX_SKEW {
        return Err(AuthError::new(S3ErrorCode::RequestTimeTooSkewed));
    }
    if !amz_date.starts_with(&cred.date) {
        return Err(denied(
            S3ErrorCode::SignatureDoesNotMatch,
            "The credential date does not match x-amz-date.",
        ));
    }
    if !signed_headers.iter().any(|h| h == "host") {
        return Err(denied(
            S3ErrorCode::AuthorizationHeaderMalformed,
            "The host header must be signed.",
        ));
    }
    let canon_headers = canonical_headers(headers, &signed_headers).ok_or_else(|| {
        denied(
            S3ErrorCode::AccessDenied,
            "A signed header is missing from the request.",
        )
    })?;
    let key = signing_key(&user.secret_key, &cred);
    let scope = cred.scope();
    let canon_query = canonical_query(query);
    // Clients sign the path as they send it; a few re-encode it canonically. Accept either.
    let raw_path = uri.path().to_string();
    let decoded = percent_encoding::percent_decode_str(&raw_path).decode_utf8_lossy();
    let reencoded = uri_encode(&decoded, true);
    let matches = |path: &str| {
        let creq = canonical_request(
            method.as_str(),
            path,
            &canon_query,
            &canon_headers,
            &signed_headers,
            &payload_hash,
        );
        signatures_match(
            &sign(&key, &string_to_sign(&amz_date, &scope, &creq)),
            &signature,
        )
    };
    if !(matches(&raw_path) || (reencoded != raw_path && matches(&reencoded))) {
        return Err(AuthError::new(S3ErrorCode::SignatureDoesNotMatch));
    }
    let signer = matches!(payload, Payload::Chunked { signed: true }).then(|| ChunkSigner {
        key,
        amz_date: amz_date.clone(),
        scope,
        previous: signature.clone(),
    });
    Ok(RequestAuth {
        identity: Identity::User(user),
        payload,
        signer,
    })
}

fn user_by_key(settings: &Settings, access_key: &str) -> Result<Arc<User>, AuthError> {
    settings
        .users
        .iter()
        .find(|u| u.access_key == access_key)
        .cloned()
        .ok_or_else(|| AuthError::new(S3ErrorCode::InvalidAccessKeyId))
}

/// SigV2: `Authorization: AWS KEY:SIG`, or a presigned URL with `AWSAccessKeyId`,
/// `Expires` and `Signature`. `Ok(None)` when the request uses neither.
fn authenticate_v2(
    settings: &Settings,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    virtual_bucket: Option<&str>,
) -> Result<Option<Arc<User>>, AuthError> {
    use super::sigv2;
    let resource = || sigv2::canonical_resource(uri.path(), virtual_bucket, uri.query());
    let header = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("AWS "));
    if let Some(cred) = header {
        let (key, sig) = cred.split_once(':').ok_or_else(|| {
            denied(
                S3ErrorCode::AuthorizationHeaderMalformed,
                "Expected AWS KEY:SIGNATURE.",
            )
        })?;
        let user = user_by_key(settings, key)?;
        let amz_date = headers.get("x-amz-date").and_then(|v| v.to_str().ok());
        let date_text = amz_date
            .or_else(|| {
                headers
                    .get(http::header::DATE)
                    .and_then(|v| v.to_str().ok())
            })
            .ok_or_else(|| {
                denied(
                    S3ErrorCode::AccessDenied,
                    "A Date or x-amz-date header is required.",
                )
            })?;
        let when = httpdate::parse_http_date(date_text)
            .ok()
            .or_else(|| parse_amz_date(date_text))
            .ok_or_else(|| denied(S3ErrorCode::AccessDenied, "The request date is malformed."))?;
        if skew(when) > MAX_SKEW {
            return Err(AuthError::new(S3ErrorCode::RequestTimeTooSkewed));
        }
        // With x-amz-date the Date line of the string to sign is empty.
        let date_line = if amz_date.is_some() { "" } else { date_text };
        let sts = sigv2::string_to_sign(method.as_str(), headers, date_line, &resource());
        if !signatures_match(&sigv2::sign(&user.secret_key, &sts), sig) {
            return Err(AuthError::new(S3ErrorCode::SignatureDoesNotMatch));
        }
        return Ok(Some(user));
    }
    let Some(query) = uri.query().filter(|q| q.contains("AWSAccessKeyId=")) else {
        return Ok(None);
    };
    let params: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let get = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let bad = |m: &str| denied(S3ErrorCode::AuthorizationQueryParametersError, m);
    let key = get("AWSAccessKeyId").unwrap_or_default();
    let sig = get("Signature").ok_or_else(|| bad("Signature is missing."))?;
    let expires_text = get("Expires").ok_or_else(|| bad("Expires is missing."))?;
    let expires: u64 = expires_text
        .parse()
        .map_err(|_| bad("Expires must be a Unix time in seconds."))?;
    let user = user_by_key(settings, &key)?;
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    if now > expires {
        return Err(denied(S3ErrorCode::AccessDenied, "Request has expired"));
    }
    if expires > now + MAX_PRESIGN {
        return Err(bad(
            "A presigned URL may be valid for at most 7 days (604800 seconds).",
        ));
    }
    let sts = sigv2::string_to_sign(method.as_str(), headers, &expires_text, &resource());
    if !signatures_match(&sigv2::sign(&user.secret_key, &sts), &sig) {
        return Err(AuthError::new(S3ErrorCode::SignatureDoesNotMatch));
    }
    Ok(Some(user))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amz_dates() {
        let t = parse_amz_date("20130524T000000Z").unwrap();
        assert_eq!(
            humantime::format_rfc3339(t).to_string(),
            "2013-05-24T00:00:00Z"
        );
        assert!(parse_amz_date("2013-05-24").is_none());
        assert!(parse_amz_date("20131324T000000Z").is_none());
    }
}
