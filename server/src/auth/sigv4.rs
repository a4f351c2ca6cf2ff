//! AWS Signature Version 4, as a server verifies it.
//!
//! The canonical request, the string to sign, the key derivation and the signature are
//! `yutu_api::sigv4`, the same code the client library signs with. What is the server's own
//! is here: reading the `Authorization` header and the credential scope, comparing
//! signatures in constant time, and the string to sign of each chunk (and the trailer) of a
//! streaming (`aws-chunked`) upload, chained from the request's signature with the request's
//! signing key.

use yutu_api::sigv4::{sha256_hex, Scope, ALGORITHM, EMPTY_SHA256};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SigError {
    #[error("the authorization header is malformed: {0}")]
    Malformed(&'static str),
    #[error("the credential scope is malformed; expected ACCESS_KEY/DATE/REGION/s3/aws4_request")]
    BadCredential,
    #[error("unsupported signing algorithm {0}")]
    Algorithm(String),
}

/// `AKID/20130524/us-east-1/s3/aws4_request`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    pub access_key: String,
    pub date: String,
    pub region: String,
    pub service: String,
}

impl Credential {
    pub fn parse(s: &str) -> Result<Credential, SigError> {
        let mut parts = s.rsplitn(5, '/');
        let (Some(term), Some(service), Some(region), Some(date), Some(access_key)) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(SigError::BadCredential);
        };
        if term != "aws4_request" || date.len() != 8 || access_key.is_empty() {
            return Err(SigError::BadCredential);
        }
        Ok(Credential {
            access_key: access_key.to_string(),
            date: date.to_string(),
            region: region.to_string(),
            service: service.to_string(),
        })
    }

    /// What the signature is valid for (`DATE/REGION/SERVICE/aws4_request`).
    pub fn scope(&self) -> Scope {
        Scope::new(
            self.date.as_str(),
            self.region.as_str(),
            self.service.as_str(),
        )
    }
}

/// The parts of an `Authorization: AWS4-HMAC-SHA256 ...` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthHeader {
    pub credential: Credential,
    pub signed_headers: Vec<String>,
    pub signature: String,
}

pub fn parse_authorization(value: &str) -> Result<AuthHeader, SigError> {
    let (alg, rest) = value
        .trim()
        .split_once(' ')
        .ok_or(SigError::Malformed("no algorithm"))?;
    if alg != ALGORITHM {
        return Err(SigError::Algorithm(alg.to_string()));
    }
    let (mut cred, mut signed, mut sig) = (None, None, None);
    for field in rest.split(',') {
        let (k, v) = field
            .trim()
            .split_once('=')
            .ok_or(SigError::Malformed("a field has no '='"))?;
        match k {
            "Credential" => cred = Some(Credential::parse(v)?),
            "SignedHeaders" => signed = Some(v.split(';').map(str::to_string).collect()),
            "Signature" => sig = Some(v.to_string()),
            _ => return Err(SigError::Malformed("unknown field")),
        }
    }
    Ok(AuthHeader {
        credential: cred.ok_or(SigError::Malformed("no Credential"))?,
        signed_headers: signed.ok_or(SigError::Malformed("no SignedHeaders"))?,
        signature: sig.ok_or(SigError::Malformed("no Signature"))?,
    })
}

/// Compares two hex signatures without leaking where they differ.
pub fn signatures_match(a: &str, b: &str) -> bool {
    use subtle::ConstantTimeEq;
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// What the signature of one `aws-chunked` chunk covers: the previous signature (the
/// request's for the first chunk), the hash of nothing and the hash of the chunk.
pub fn chunk_string_to_sign(amz_date: &str, scope: &Scope, previous: &str, chunk: &[u8]) -> String {
    format!(
        "{ALGORITHM}-PAYLOAD\n{amz_date}\n{scope}\n{previous}\n{EMPTY_SHA256}\n{}",
        sha256_hex(chunk)
    )
}

/// What the signature of the trailer of a signed `aws-chunked` upload covers.
pub fn trailer_string_to_sign(
    amz_date: &str,
    scope: &Scope,
    previous: &str,
    trailer: &str,
) -> String {
    format!(
        "{ALGORITHM}-TRAILER\n{amz_date}\n{scope}\n{previous}\n{}",
        sha256_hex(trailer.as_bytes())
    )
}

/// When a header-signed request was signed, written as the string to sign writes it
/// (`YYYYMMDDTHHMMSSZ`): its `x-amz-date`, or, without one, its `Date`. SigV4 allows either,
/// and botocore signs with `Date` alone whenever a request carries one (it then drops
/// `X-Amz-Date`): `Date: Fri, 27 Nov 2026 01:45:13 -0000` (RFC 2822, as Python's
/// `formatdate` writes it) or an HTTP date. `None` when neither header is there or readable.
pub fn signed_date(headers: &http::HeaderMap) -> Option<String> {
    if let Some(v) = headers.get("x-amz-date") {
        return v.to_str().ok().map(str::to_string);
    }
    let date = headers.get(http::header::DATE)?.to_str().ok()?.trim();
    // The UTC spellings of RFC 2822 (`-0000`, `+0000`, `UT`, `UTC`) as the HTTP date's `GMT`.
    let utc = ["-0000", "+0000", "UTC", "UT"]
        .iter()
        .find_map(|z| date.strip_suffix(z))
        .map(|rest| format!("{}GMT", rest));
    let when = httpdate::parse_http_date(utc.as_deref().unwrap_or(date)).ok()?;
    let iso = humantime::format_rfc3339_seconds(when).to_string();
    Some(iso.replace(['-', ':'], ""))
}

#[cfg(test)]
mod tests {
    use super::*;
    use yutu_api::sigv4::{signature, CanonicalHeaders, CanonicalRequest};

    #[test]
    fn the_signing_date_comes_from_x_amz_date_or_else_date() {
        let mut h = http::HeaderMap::new();
        assert_eq!(signed_date(&h), None);
        h.insert("date", "Fri, 27 Nov 2026 01:45:13 -0000".parse().unwrap());
        assert_eq!(signed_date(&h).as_deref(), Some("20261127T014513Z"));
        h.insert("date", "Fri, 27 Nov 2026 01:45:13 GMT".parse().unwrap());
        assert_eq!(signed_date(&h).as_deref(), Some("20261127T014513Z"));
        h.insert("date", "Fri, 27 Nov 2026 01:45:13 +0100".parse().unwrap());
        assert_eq!(signed_date(&h), None, "only UTC is read");
        h.insert("x-amz-date", "20130524T000000Z".parse().unwrap());
        assert_eq!(signed_date(&h).as_deref(), Some("20130524T000000Z"));
    }

    const SECRET: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";

    /// The GetObject example of the S3 SigV4 documentation, read the way the node reads it:
    /// the `Authorization` header names the signed headers, the shared builder does the rest.
    #[test]
    fn documented_get_object_example() {
        let auth = parse_authorization(
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41",
        )
        .unwrap();
        let mut headers = http::HeaderMap::new();
        headers.insert("host", "examplebucket.s3.amazonaws.com".parse().unwrap());
        headers.insert("range", "bytes=0-9".parse().unwrap());
        headers.insert("x-amz-content-sha256", EMPTY_SHA256.parse().unwrap());
        headers.insert("x-amz-date", "20130524T000000Z".parse().unwrap());
        headers.insert("user-agent", "not signed".parse().unwrap());
        let arrived = headers.iter().map(|(n, v)| (n.as_str(), v.as_bytes()));
        let ch = CanonicalHeaders::select(arrived, &auth.signed_headers).unwrap();
        let creq = CanonicalRequest::new("GET", "/test.txt", None, ch, EMPTY_SHA256);
        let scope = auth.credential.scope();
        assert_eq!(scope.to_string(), "20130524/us-east-1/s3/aws4_request");
        let key = scope.signing_key(SECRET);
        let signed = creq.sign_with_key(&key, &scope, "20130524T000000Z");
        assert!(signatures_match(&signed.signature, &auth.signature));
        assert!(!signatures_match(&signed.signature, &auth.signature[1..]));
    }

    /// The streaming (aws-chunked) example of the S3 SigV4 documentation.
    #[test]
    fn documented_chunk_signatures() {
        let cred =
            Credential::parse("AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request").unwrap();
        let scope = cred.scope();
        let key = scope.signing_key(SECRET);
        let seed = "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9";
        let date = "20130524T000000Z";
        let c1 = signature(
            &key,
            &chunk_string_to_sign(date, &scope, seed, &[b'a'; 65536]),
        );
        assert_eq!(
            c1,
            "ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648"
        );
        let c2 = signature(
            &key,
            &chunk_string_to_sign(date, &scope, &c1, &[b'a'; 1024]),
        );
        assert_eq!(
            c2,
            "0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497"
        );
        let c3 = signature(&key, &chunk_string_to_sign(date, &scope, &c2, b""));
        assert_eq!(
            c3,
            "b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9"
        );
    }

    #[test]
    fn credentials_and_headers_are_checked() {
        assert!(Credential::parse("AKID/2013/us-east-1/s3/aws4_request").is_err());
        assert!(Credential::parse("AKID/20130524/us-east-1/s3/aws5_request").is_err());
        assert!(parse_authorization("AWS4-HMAC-SHA512 Credential=x").is_err());
        assert_eq!(
            parse_authorization("AWS4-HMAC-SHA256 Credential=AKID/20130524/r/s3/aws4_request"),
            Err(SigError::Malformed("no SignedHeaders"))
        );
    }
}
