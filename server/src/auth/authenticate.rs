//! Authenticating a request: a bearer token, SigV4 or SigV2 in the `Authorization` header or
//! in a presigned URL, and how its payload is protected (`x-amz-content-sha256`).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::{HeaderMap, Method, Uri};
use yutu_api::sigv4::{CanonicalHeaders, CanonicalRequest, ALGORITHM, UNSIGNED_PAYLOAD};
use yutu_api::token::BEARER;
use yutu_api::S3ErrorCode;

use super::chunked::ChunkSigner;
use super::sigv4::{parse_authorization, signatures_match, Credential};
use super::tokens::TokenVerifier;
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
        UNSIGNED_PAYLOAD => Payload::Unsigned,
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
    tokens: &TokenVerifier,
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
    let bearer = headers
        .get(http::header::AUTHORIZATION)
        .map(|v| v.as_bytes())
        .filter(|v| {
            v.len() >= BEARER.len() && v[..BEARER.len()].eq_ignore_ascii_case(BEARER.as_bytes())
        });
    if let Some(value) = bearer {
        let token = std::str::from_utf8(&value[BEARER.len()..])
            .map_err(|_| denied(S3ErrorCode::InvalidToken, "The token is not text."))?;
        // A token signs no payload: an x-amz-content-sha256 given is still checked.
        return Ok(RequestAuth {
            identity: Identity::Token(tokens.verify(token.trim())?),
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
        // `x-amz-date`, or else a `Date` header (SigV4 allows either), as the signer used it.
        let amz_date = super::sigv4::signed_date(headers).ok_or_else(|| {
            denied(
                S3ErrorCode::AccessDenied,
                "AWS authentication requires a valid x-amz-date or Date header.",
            )
        })?;
        let hash = headers
            .get("x-amz-content-sha256")
            .and_then(|v| v.to_str().ok())
            .unwrap_or(UNSIGNED_PAYLOAD)
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
        if get("X-Amz-Algorithm").as_deref() != Some(ALGORITHM) {
            return Err(bad("X-Amz-Algorithm only supports \"AWS4-HMAC-SHA256\"."));
        }
        let cred = Credential::parse(&get("X-Amz-Credential").unwrap_or_default())
            .map_err(|e| bad(&e.to_string()))?;
        let amz_date = get("X-Amz-Date").ok_or_else(|| bad("X-Amz-Date is missing."))?;
        let expires: i64 = get("X-Amz-Expires")
            .and_then(|e| e.parse().ok())
            .ok_or_else(|| bad("X-Amz-Expires must be a number of seconds."))?;
        // A URL valid for no time, for less than none, or for longer than S3 allows can never
        // be used: refused as an expired one is (403), which is what S3 and Ceph RGW answer
        // a GET or PUT through it with (ceph/s3-tests test_object_raw_get_x_amz_expires_*).
        let expires = u64::try_from(expires)
            .ok()
            .filter(|e| (1..=MAX_PRESIGN).contains(e))
            .ok_or_else(|| {
                denied(
                    S3ErrorCode::AccessDenied,
                    "X-Amz-Expires must be between 1 and 604800 seconds (7 days).",
                )
            })?;
        let signed_at = parse_amz_date(&amz_date).ok_or_else(|| bad("X-Amz-Date is malformed."))?;
        let now = SystemTime::now();
        if now >= signed_at + Duration::from_secs(expires) {
            return Err(denied(S3ErrorCode::AccessDenied, "Request has expired"));
        }
        if signed_at > now + MAX_SKEW {
            // S3 answers a presigned URL that is not valid yet like an expired one.
            return Err(denied(
                S3ErrorCode::AccessDenied,
                "Request is not valid yet",
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
            UNSIGNED_PAYLOAD.to_string(),
        )
    } else {
        // No credentials: an anonymous caller, allowed only what ACLs grant everyone.
        return Ok(RequestAuth {
            identity: Identity::Anonymous,
            payload,
            signer: None,
        });
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
    let arrived = headers.iter().map(|(n, v)| (n.as_str(), v.as_bytes()));
    let canon_headers = CanonicalHeaders::select(arrived, &signed_headers).map_err(|_| {
        denied(
            S3ErrorCode::AccessDenied,
            "A signed header is missing from the request.",
        )
    })?;
    let scope = cred.scope();
    let key = scope.signing_key(&user.secret_key);
    let request = CanonicalRequest::new(
        method.as_str(),
        uri.path(),
        query,
        canon_headers,
        &payload_hash,
    );
    let verifies = |request: &CanonicalRequest| {
        let expected = request.sign_with_key(&key, &scope, &amz_date).signature;
        signatures_match(&expected, &signature)
    };
    // The canonical URI is the path with each segment encoded once, as AWS's signers make
    // it; a few clients sign the path exactly as they send it instead. Accept either.
    let raw_path = uri.path();
    if !(verifies(&request) || (request.uri != raw_path && verifies(&request.with_uri(raw_path)))) {
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
    let resources = sigv2::canonical_resources(uri.path(), virtual_bucket, uri.query());
    // Whether `sig` signs the request with `date` under any resource the client may have used.
    let signed = |secret: &str, date: &str, sig: &str| {
        resources.iter().any(|resource| {
            let sts = sigv2::string_to_sign(method.as_str(), headers, date, resource);
            signatures_match(&sigv2::sign(secret, &sts), sig)
        })
    };
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
        let date_header = headers
            .get(http::header::DATE)
            .and_then(|v| v.to_str().ok());
        let date_text = amz_date.or(date_header).ok_or_else(|| {
            denied(
                S3ErrorCode::AccessDenied,
                "A Date or x-amz-date header is required.",
            )
        })?;
        let when = sigv2::parse_date(date_text)
            .or_else(|| parse_amz_date(date_text))
            .ok_or_else(|| denied(S3ErrorCode::AccessDenied, "The request date is malformed."))?;
        if skew(when) > MAX_SKEW {
            return Err(AuthError::new(S3ErrorCode::RequestTimeTooSkewed));
        }
        // With x-amz-date the Date line of the string to sign is empty, as S3 documents; botocore
        // (boto3's `signature_version="s3"`) puts its own Date header there all the same, and
        // S3 takes that too. x-amz-date is among the signed amz headers either way.
        let date_lines = match amz_date {
            Some(_) => vec!["", date_header.unwrap_or("")],
            None => vec![date_text],
        };
        if !date_lines
            .iter()
            .any(|line| signed(&user.secret_key, line, sig))
        {
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
    // `Expires` is the first second the URL is no longer valid in (boto3's ExpiresIn=0 names
    // the current second).
    if now >= expires {
        return Err(denied(S3ErrorCode::AccessDenied, "Request has expired"));
    }
    // Refused as an expired URL is, as SigV4's X-Amz-Expires past 7 days is.
    if expires > now + MAX_PRESIGN {
        return Err(denied(
            S3ErrorCode::AccessDenied,
            "A presigned URL may be valid for at most 7 days (604800 seconds).",
        ));
    }
    if !signed(&user.secret_key, &expires_text, &sig) {
        return Err(AuthError::new(S3ErrorCode::SignatureDoesNotMatch));
    }
    Ok(Some(user))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Flags;
    use yutu_api::sigv4::{Scope, EMPTY_SHA256};

    const ACCESS: &str = "AKIDTEST";
    const SECRET: &str = "test-secret/+key";
    const HOST: &str = "127.0.0.1:9000";

    fn settings() -> Settings {
        let mut s = Settings::resolve(Flags {
            shards: Some(1),
            ..Flags::default()
        })
        .unwrap();
        s.users = vec![Arc::new(User {
            name: "tester".into(),
            access_key: ACCESS.into(),
            secret_key: SECRET.into(),
            admin: true,
            read: vec![],
            write: vec![],
        })];
        s
    }

    fn amz_date(t: SystemTime) -> String {
        humantime::format_rfc3339_seconds(t)
            .to_string()
            .replace(['-', ':'], "")
    }

    /// A request signed in the header the way AWS's signers do it, with `sign_path` as the
    /// canonical URI (`None`: the canonical URI of the path sent).
    fn signed(
        method: &str,
        target: &str,
        payload: &str,
        sign_path: Option<&str>,
        secret: &str,
        at: SystemTime,
    ) -> (Method, Uri, HeaderMap) {
        let uri: Uri = target.parse().unwrap();
        let date = amz_date(at);
        let mut headers = HeaderMap::new();
        headers.insert("host", HOST.parse().unwrap());
        headers.insert("x-amz-content-sha256", payload.parse().unwrap());
        headers.insert("x-amz-date", date.parse().unwrap());
        let arrived = headers.iter().map(|(n, v)| (n.as_str(), v.as_bytes()));
        let mut request = CanonicalRequest::new(
            method,
            uri.path(),
            uri.query(),
            CanonicalHeaders::all(arrived),
            payload,
        );
        if let Some(p) = sign_path {
            request = request.with_uri(p);
        }
        let scope = Scope::new(&date[..8], "us-east-1", "s3");
        let auth = request
            .sign(secret, &scope, &date)
            .authorization(ACCESS, &scope);
        headers.insert(http::header::AUTHORIZATION, auth.parse().unwrap());
        headers.insert("user-agent", "unsigned".parse().unwrap());
        (method.parse().unwrap(), uri, headers)
    }

    fn check(req: &(Method, Uri, HeaderMap)) -> Result<RequestAuth, S3ErrorCode> {
        let tokens = TokenVerifier::new(yutu_api::token::Keyring::default());
        authenticate(&settings(), &tokens, &req.0, &req.1, &req.2, None).map_err(|e| e.code)
    }

    #[test]
    fn header_signatures_verify_over_the_canonical_or_the_raw_path() {
        let now = SystemTime::now();
        // Sent loosely encoded: AWS's signers sign `/b/a%2Bb%20c`, a few clients `/b/a+b%20c`.
        let target = "/b/a+b%20c?list-type=2&prefix=x%2Fy";
        let canonical = signed("GET", target, EMPTY_SHA256, None, SECRET, now);
        let auth = check(&canonical).unwrap();
        assert!(matches!(auth.identity, Identity::User(u) if u.access_key == ACCESS));
        assert_eq!(auth.payload, Payload::Sha256(EMPTY_SHA256.into()));
        assert!(auth.signer.is_none());
        let raw = signed("GET", target, EMPTY_SHA256, Some("/b/a+b%20c"), SECRET, now);
        assert!(check(&raw).is_ok());
        for other in ["/b/a+b c", "/b/a%2Bb%20c/", "/b/a%2bb%20c"] {
            let req = signed("GET", target, EMPTY_SHA256, Some(other), SECRET, now);
            assert_eq!(
                check(&req).err(),
                Some(S3ErrorCode::SignatureDoesNotMatch),
                "{other}"
            );
        }
        let wrong = signed("GET", target, EMPTY_SHA256, None, "not-the-secret", now);
        assert_eq!(
            check(&wrong).err(),
            Some(S3ErrorCode::SignatureDoesNotMatch)
        );
        // What is signed cannot be changed: the method, the query, a signed header.
        let mut moved = canonical.clone();
        moved.0 = Method::HEAD;
        assert_eq!(
            check(&moved).err(),
            Some(S3ErrorCode::SignatureDoesNotMatch)
        );
        let mut moved = canonical.clone();
        moved.1 = "/b/a+b%20c?list-type=2&prefix=x".parse().unwrap();
        assert_eq!(
            check(&moved).err(),
            Some(S3ErrorCode::SignatureDoesNotMatch)
        );
        let mut moved = canonical.clone();
        moved.2.insert("host", "example.com".parse().unwrap());
        assert_eq!(
            check(&moved).err(),
            Some(S3ErrorCode::SignatureDoesNotMatch)
        );
        // An unsigned header may change; a signed one may not go missing.
        let mut extra = canonical.clone();
        extra.2.insert("user-agent", "other".parse().unwrap());
        assert!(check(&extra).is_ok());
        let mut missing = canonical.clone();
        missing.2.remove("x-amz-content-sha256");
        assert_eq!(check(&missing).err(), Some(S3ErrorCode::AccessDenied));
    }

    #[test]
    fn header_auth_refusals_keep_their_codes() {
        let now = SystemTime::now();
        let (m, u, mut h) = signed("PUT", "/b/k", EMPTY_SHA256, None, SECRET, now);
        let auth = h
            .get("authorization")
            .unwrap()
            .to_str()
            .unwrap()
            .to_string();
        let with_auth = |h: &mut HeaderMap, a: &str| {
            h.insert(http::header::AUTHORIZATION, a.parse().unwrap());
        };
        with_auth(&mut h, &auth.replace(ACCESS, "AKIDOTHER"));
        assert_eq!(
            check(&(m.clone(), u.clone(), h.clone())).err(),
            Some(S3ErrorCode::InvalidAccessKeyId)
        );
        with_auth(
            &mut h,
            &auth.replace("SignedHeaders=host;", "SignedHeaders="),
        );
        assert_eq!(
            check(&(m.clone(), u.clone(), h.clone())).err(),
            Some(S3ErrorCode::AuthorizationHeaderMalformed)
        );
        with_auth(&mut h, &auth.replace("/s3/", "/sqs/"));
        assert_eq!(
            check(&(m.clone(), u.clone(), h.clone())).err(),
            Some(S3ErrorCode::AuthorizationHeaderMalformed)
        );
        with_auth(
            &mut h,
            &auth.replace("AWS4-HMAC-SHA256", "AWS4-ECDSA-P256-SHA256"),
        );
        assert_eq!(
            check(&(m.clone(), u.clone(), h.clone())).err(),
            Some(S3ErrorCode::InvalidArgument)
        );
        // The credential's day must be the day of x-amz-date.
        let date = amz_date(now);
        with_auth(
            &mut h,
            &auth.replace(&format!("/{}/", &date[..8]), "/20000101/"),
        );
        assert_eq!(
            check(&(m.clone(), u.clone(), h.clone())).err(),
            Some(S3ErrorCode::SignatureDoesNotMatch)
        );
        // Clock skew, either way, beyond 15 minutes.
        for at in [now - 2 * MAX_SKEW, now + 2 * MAX_SKEW] {
            let req = signed("PUT", "/b/k", EMPTY_SHA256, None, SECRET, at);
            assert_eq!(check(&req).err(), Some(S3ErrorCode::RequestTimeTooSkewed));
        }
        let req = signed(
            "PUT",
            "/b/k",
            EMPTY_SHA256,
            None,
            SECRET,
            now - MAX_SKEW / 2,
        );
        assert!(check(&req).is_ok());
        // No signature at all: an anonymous caller (what it may do is the ACLs' call).
        let anonymous = (m, u, HeaderMap::new());
        assert!(matches!(
            check(&anonymous).map(|a| a.identity),
            Ok(Identity::Anonymous)
        ));
    }

    #[test]
    fn streaming_uploads_get_a_chunk_signer_chained_from_the_seed() {
        let now = SystemTime::now();
        let payload = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD";
        let req = signed("PUT", "/b/k", payload, None, SECRET, now);
        let auth = check(&req).unwrap();
        assert_eq!(auth.payload, Payload::Chunked { signed: true });
        let signer = auth.signer.unwrap();
        let header = req.2.get("authorization").unwrap().to_str().unwrap();
        assert!(header.ends_with(&format!("Signature={}", signer.previous)));
        let date = amz_date(now);
        assert_eq!(signer.amz_date, date);
        let scope = Scope::new(&date[..8], "us-east-1", "s3");
        assert_eq!(signer.key, scope.signing_key(SECRET));
        assert_eq!(signer.scope, scope);
        let unsigned = signed(
            "PUT",
            "/b/k",
            "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
            None,
            SECRET,
            now,
        );
        let auth = check(&unsigned).unwrap();
        assert_eq!(auth.payload, Payload::Chunked { signed: false });
        assert!(auth.signer.is_none());
    }

    /// A presigned GET: everything in the query but the signature is signed, the payload is
    /// `UNSIGNED-PAYLOAD`.
    fn presigned(
        target: &str,
        signed_at: SystemTime,
        expires: u64,
        secret: &str,
    ) -> (Method, Uri, HeaderMap) {
        let date = amz_date(signed_at);
        let scope = Scope::new(&date[..8], "us-east-1", "s3");
        let credential = format!("{ACCESS}/{scope}").replace('/', "%2F");
        let query = format!(
            "X-Amz-Algorithm={ALGORITHM}&X-Amz-Credential={credential}&X-Amz-Date={date}&X-Amz-Expires={expires}&X-Amz-SignedHeaders=host"
        );
        let mut headers = HeaderMap::new();
        headers.insert("host", HOST.parse().unwrap());
        let arrived = headers.iter().map(|(n, v)| (n.as_str(), v.as_bytes()));
        let request = CanonicalRequest::new(
            "GET",
            target,
            Some(&query),
            CanonicalHeaders::select(arrived, &["host"]).unwrap(),
            UNSIGNED_PAYLOAD,
        );
        let signature = request.sign(secret, &scope, &date).signature;
        let uri = format!("{target}?{query}&X-Amz-Signature={signature}");
        (Method::GET, uri.parse().unwrap(), headers)
    }

    #[test]
    fn presigned_urls_verify_until_they_expire() {
        let now = SystemTime::now();
        let ok = presigned("/b/a%20key", now, 60, SECRET);
        let auth = check(&ok).unwrap();
        assert_eq!(auth.payload, Payload::Unsigned);
        assert!(auth.signer.is_none());
        let wrong = presigned("/b/a%20key", now, 60, "not-the-secret");
        assert_eq!(
            check(&wrong).err(),
            Some(S3ErrorCode::SignatureDoesNotMatch)
        );
        let mut moved = ok.clone();
        moved.1 =
            ok.1.to_string()
                .replace("/b/a%20key", "/b/other")
                .parse()
                .unwrap();
        assert_eq!(
            check(&moved).err(),
            Some(S3ErrorCode::SignatureDoesNotMatch)
        );
        let expired = presigned("/b/k", now - Duration::from_secs(120), 60, SECRET);
        assert_eq!(check(&expired).err(), Some(S3ErrorCode::AccessDenied));
        let future = presigned("/b/k", now + 2 * MAX_SKEW, 60, SECRET);
        assert_eq!(check(&future).err(), Some(S3ErrorCode::AccessDenied));
        // Out of range, either way: refused as expired ones are.
        for expires in ["0", "-7", &(MAX_PRESIGN + 1).to_string()] {
            let mut req = presigned("/b/k", now, 60, SECRET);
            req.1 = req
                .1
                .to_string()
                .replace("X-Amz-Expires=60", &format!("X-Amz-Expires={expires}"))
                .parse()
                .unwrap();
            assert_eq!(
                check(&req).err(),
                Some(S3ErrorCode::AccessDenied),
                "{expires}"
            );
        }
        let mut req = presigned("/b/k", now, 60, SECRET);
        req.1 = req
            .1
            .to_string()
            .replace("X-Amz-Expires=60", "X-Amz-Expires=soon")
            .parse()
            .unwrap();
        assert_eq!(
            check(&req).err(),
            Some(S3ErrorCode::AuthorizationQueryParametersError)
        );
    }

    /// A SigV2 header-signed GET of `/b/k` with `x-amz-date: amz` and `Date: date`, signed
    /// with `date_line` as the Date line (S3's empty one, or botocore's Date header).
    fn signed_v2(amz: &str, date: &str, date_line: &str) -> (Method, Uri, HeaderMap) {
        let mut headers = HeaderMap::new();
        headers.insert("host", HOST.parse().unwrap());
        headers.insert("x-amz-date", amz.parse().unwrap());
        headers.insert("date", date.parse().unwrap());
        let sts = super::super::sigv2::string_to_sign("GET", &headers, date_line, "/b/k");
        let sig = super::super::sigv2::sign(SECRET, &sts);
        let auth = format!("AWS {ACCESS}:{sig}");
        headers.insert(http::header::AUTHORIZATION, auth.parse().unwrap());
        (Method::GET, "/b/k".parse().unwrap(), headers)
    }

    #[test]
    fn sigv2_dates_skewed_malformed_and_signed_either_way() {
        let now = httpdate::fmt_http_date(SystemTime::now());
        assert!(check(&signed_v2(&now, &now, "")).is_ok());
        assert!(
            check(&signed_v2(&now, &now, &now)).is_ok(),
            "botocore's Date line"
        );
        assert_eq!(
            check(&signed_v2(&now, &now, "Thu, 01 Jan 2026 00:00:00 GMT")).err(),
            Some(S3ErrorCode::SignatureDoesNotMatch)
        );
        // Far off, with a weekday that does not match the date: skewed, not malformed.
        for far in [
            "Tue, 07 Jul 2010 21:53:04 GMT",
            "Tue, 07 Jul 2030 21:53:04 GMT",
            "Tue, 07 Jul 9999 21:53:04 GMT",
        ] {
            assert_eq!(
                check(&signed_v2(far, &now, "")).err(),
                Some(S3ErrorCode::RequestTimeTooSkewed),
                "{far}"
            );
        }
        for bad in ["Bad Date", "", "Tue, 07 Jul 1950 21:53:04 GMT"] {
            assert_eq!(
                check(&signed_v2(bad, &now, "")).err(),
                Some(S3ErrorCode::AccessDenied),
                "{bad}"
            );
        }
    }

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
