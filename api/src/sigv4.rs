//! AWS Signature Version 4, the parts shared by the node (which verifies signatures) and the
//! client library (which makes them), so both build the same bytes one way: the canonical
//! request (URI, query, headers, payload hash), the string to sign, the key derivation and
//! the signature. Pure functions over strings: no clock, no I/O.
//!
//! A signer picks the headers it signs and builds:
//!
//! ```
//! use yutu_api::sigv4::{CanonicalHeaders, CanonicalRequest, Scope, EMPTY_SHA256};
//!
//! let headers = CanonicalHeaders::all([
//!     ("host", "127.0.0.1:9000"),
//!     ("x-amz-content-sha256", EMPTY_SHA256),
//!     ("x-amz-date", "20130524T000000Z"),
//! ]);
//! let request = CanonicalRequest::new("GET", "/bucket/a%20key", Some("list-type=2"), headers, EMPTY_SHA256);
//! let scope = Scope::new("20130524", "us-east-1", "s3");
//! let signed = request.sign("secret", &scope, "20130524T000000Z");
//! let authorization = signed.authorization("AKID", &scope);
//! assert!(authorization.starts_with("AWS4-HMAC-SHA256 Credential=AKID/20130524/us-east-1/s3/aws4_request, SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature="));
//! ```
//!
//! A verifier rebuilds the canonical request from what arrived, with the headers the
//! `Authorization` header names ([`CanonicalHeaders::select`]), and compares signatures.

use std::collections::BTreeMap;
use std::fmt;

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

/// The algorithm name of header and query SigV4.
pub const ALGORITHM: &str = "AWS4-HMAC-SHA256";

/// The payload hash of a body that is not hashed (streamed uploads, presigned URLs).
pub const UNSIGNED_PAYLOAD: &str = "UNSIGNED-PAYLOAD";

/// Hex SHA-256 of the empty string: the payload hash of a request without a body.
pub const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// HMAC-SHA256 of `data` under `key`.
pub fn hmac_sha256(key: &[u8], data: &[u8]) -> [u8; 32] {
    // HMAC takes keys of any length: `new_from_slice` cannot fail for it.
    let mut mac = match <Hmac<Sha256> as KeyInit>::new_from_slice(key) {
        Ok(m) => m,
        Err(_) => unreachable!("HMAC accepts keys of any length"),
    };
    mac.update(data);
    mac.finalize().into_bytes().into()
}

/// Lowercase hex SHA-256 of `data` (payload hashes, canonical request hashes).
pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// The key derived from a secret for one day (`YYYYMMDD`), region and service.
pub fn signing_key(secret: &str, date: &str, region: &str, service: &str) -> [u8; 32] {
    let k_date = hmac_sha256(format!("AWS4{secret}").as_bytes(), date.as_bytes());
    let k_region = hmac_sha256(&k_date, region.as_bytes());
    let k_service = hmac_sha256(&k_region, service.as_bytes());
    hmac_sha256(&k_service, b"aws4_request")
}

/// Hex HMAC of a string to sign under a derived key: the signature.
pub fn signature(key: &[u8; 32], string_to_sign: &str) -> String {
    hex::encode(hmac_sha256(key, string_to_sign.as_bytes()))
}

/// RFC 3986 percent-encoding as SigV4 wants it: unreserved characters stay, everything else
/// is `%XX` (upper case); `/` stays only when `keep_slash`.
pub fn uri_encode(s: &str, keep_slash: bool) -> String {
    uri_encode_bytes(s.as_bytes(), keep_slash)
}

/// [`uri_encode`] of raw bytes (a percent-decoded path segment need not be UTF-8).
pub fn uri_encode_bytes(bytes: &[u8], keep_slash: bool) -> String {
    use fmt::Write;
    let mut out = String::with_capacity(bytes.len());
    for &b in bytes {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(b as char)
            }
            b'/' if keep_slash => out.push('/'),
            _ => {
                let _ = write!(out, "%{b:02X}");
            }
        }
    }
    out
}

/// The canonical URI of S3 from a request path as sent: each `/`-separated segment
/// percent-decoded and encoded once with [`uri_encode`] (so `%2F` inside a segment stays
/// `%2F`, and a path a client encoded loosely, `/a+b` or `/test$file`, gets the encoding
/// AWS's signers give it). No dot-segment or slash normalisation: S3 signs the path as is.
/// An empty path is `/`.
pub fn canonical_uri(path: &str) -> String {
    if path.is_empty() {
        return "/".to_string();
    }
    path.split('/')
        .map(|segment| {
            let raw: Vec<u8> = percent_encoding::percent_decode_str(segment).collect();
            uri_encode_bytes(&raw, false)
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// The canonical query string from a raw query: pairs percent-decoded, re-encoded, sorted
/// by name then value; a name without `=` gets an empty value; `X-Amz-Signature` left out
/// (presigned URLs sign everything but it). `+` is a literal plus, as in AWS's signers.
pub fn canonical_query(raw: Option<&str>) -> String {
    let Some(raw) = raw else {
        return String::new();
    };
    let encode = |s: &str| {
        let bytes: Vec<u8> = percent_encoding::percent_decode_str(s).collect();
        uri_encode_bytes(&bytes, false)
    };
    let mut pairs: Vec<(String, String)> = raw
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")))
        .map(|(k, v)| (encode(k), encode(v)))
        .filter(|(k, _)| k != "X-Amz-Signature")
        .collect();
    pairs.sort();
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

/// A header value as SigV4 signs it: surrounding whitespace trimmed, inner runs of
/// whitespace (line folds included) collapsed to one space.
fn trim_value(value: &[u8]) -> String {
    String::from_utf8_lossy(value)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// A signed header was named but the request does not carry it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the signed header {0:?} is missing from the request")]
pub struct MissingHeader(pub String);

/// The canonical headers (`name:value\n` each) and the signed headers list
/// (`host;x-amz-date`) of a canonical request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanonicalHeaders {
    canonical: String,
    signed: String,
}

impl CanonicalHeaders {
    /// Signs every header given, as a client does with the headers it chose: names lower
    /// cased and sorted, values trimmed, the values of a repeated header joined by `,` in
    /// the order given.
    pub fn all<'a, V: AsRef<[u8]>>(headers: impl IntoIterator<Item = (&'a str, V)>) -> Self {
        let mut by_name: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (name, value) in headers {
            by_name
                .entry(name.trim().to_ascii_lowercase())
                .or_default()
                .push(trim_value(value.as_ref()));
        }
        Self::from_sorted(by_name.iter().map(|(n, v)| (n.as_str(), v.as_slice())))
    }

    /// The headers `signed` names (as an `Authorization` header's `SignedHeaders` lists
    /// them, kept in that order) out of all a request carries, as a verifier needs them.
    /// Header names match case-insensitively; a named header the request lacks is an error.
    pub fn select<'a, V: AsRef<[u8]>>(
        headers: impl IntoIterator<Item = (&'a str, V)>,
        signed: &[impl AsRef<str>],
    ) -> Result<Self, MissingHeader> {
        let wanted: Vec<String> = signed
            .iter()
            .map(|s| s.as_ref().to_ascii_lowercase())
            .collect();
        let mut values: Vec<Vec<String>> = vec![Vec::new(); wanted.len()];
        for (name, value) in headers {
            let name = name.trim();
            if let Some(i) = wanted.iter().position(|w| w.eq_ignore_ascii_case(name)) {
                values[i].push(trim_value(value.as_ref()));
            }
        }
        if let Some(i) = values.iter().position(Vec::is_empty) {
            return Err(MissingHeader(wanted[i].clone()));
        }
        Ok(Self::from_sorted(
            wanted
                .iter()
                .map(String::as_str)
                .zip(values.iter().map(Vec::as_slice)),
        ))
    }

    fn from_sorted<'a>(headers: impl Iterator<Item = (&'a str, &'a [String])>) -> Self {
        let mut canonical = String::new();
        let mut names = Vec::new();
        for (name, values) in headers {
            canonical.push_str(name);
            canonical.push(':');
            canonical.push_str(&values.join(","));
            canonical.push('\n');
            names.push(name);
        }
        CanonicalHeaders {
            canonical,
            signed: names.join(";"),
        }
    }

    /// `name:value\n` for each signed header.
    pub fn canonical(&self) -> &str {
        &self.canonical
    }

    /// The signed headers list, `;`-separated.
    pub fn signed(&self) -> &str {
        &self.signed
    }
}

/// What a signature is valid for: `DATE/REGION/SERVICE/aws4_request`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    /// `YYYYMMDD`, the day of the request's `x-amz-date`.
    pub date: String,
    pub region: String,
    pub service: String,
}

impl Scope {
    pub fn new(
        date: impl Into<String>,
        region: impl Into<String>,
        service: impl Into<String>,
    ) -> Scope {
        Scope {
            date: date.into(),
            region: region.into(),
            service: service.into(),
        }
    }

    /// The key a secret derives for this scope.
    pub fn signing_key(&self, secret: &str) -> [u8; 32] {
        signing_key(secret, &self.date, &self.region, &self.service)
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{}/aws4_request",
            self.date, self.region, self.service
        )
    }
}

/// The canonical request of SigV4. Its `Display` is the exact text that is hashed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanonicalRequest {
    pub method: String,
    /// The canonical URI (see [`canonical_uri`]).
    pub uri: String,
    /// The canonical query string (see [`canonical_query`]).
    pub query: String,
    pub headers: CanonicalHeaders,
    /// Hex SHA-256 of the body, [`UNSIGNED_PAYLOAD`] or a `STREAMING-…` value: whatever the
    /// request's `x-amz-content-sha256` says (presigned URLs: [`UNSIGNED_PAYLOAD`]).
    pub payload_hash: String,
}

impl CanonicalRequest {
    /// From a request as sent: `path` as it appears on the request line (percent-encoded),
    /// `query` raw (without `?`).
    pub fn new(
        method: &str,
        path: &str,
        query: Option<&str>,
        headers: CanonicalHeaders,
        payload_hash: &str,
    ) -> CanonicalRequest {
        CanonicalRequest {
            method: method.to_string(),
            uri: canonical_uri(path),
            query: canonical_query(query),
            headers,
            payload_hash: payload_hash.to_string(),
        }
    }

    /// The same request with another canonical URI (a verifier that also accepts the path
    /// exactly as sent, for clients that sign it without canonicalising).
    pub fn with_uri(&self, uri: impl Into<String>) -> CanonicalRequest {
        CanonicalRequest {
            uri: uri.into(),
            ..self.clone()
        }
    }

    /// `AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{hex sha256 of the canonical request}`.
    pub fn string_to_sign(&self, amz_date: &str, scope: &Scope) -> String {
        string_to_sign(amz_date, &scope.to_string(), &self.to_string())
    }

    /// Signs with a secret key (derives the key for `scope`, then [`Self::sign_with_key`]).
    pub fn sign(&self, secret: &str, scope: &Scope, amz_date: &str) -> Signed {
        self.sign_with_key(&scope.signing_key(secret), scope, amz_date)
    }

    /// Signs with a key already derived for `scope` (a verifier keeps it for the chunk
    /// signatures of a streaming upload).
    pub fn sign_with_key(&self, key: &[u8; 32], scope: &Scope, amz_date: &str) -> Signed {
        let to_sign = self.string_to_sign(amz_date, scope);
        Signed {
            signature: signature(key, &to_sign),
            signed_headers: self.headers.signed.clone(),
            string_to_sign: to_sign,
        }
    }
}

impl fmt::Display for CanonicalRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}\n{}\n{}\n{}\n{}\n{}",
            self.method,
            self.uri,
            self.query,
            self.headers.canonical,
            self.headers.signed,
            self.payload_hash
        )
    }
}

/// `AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{hex sha256 of canonical_request}`.
pub fn string_to_sign(amz_date: &str, scope: &str, canonical_request: &str) -> String {
    format!(
        "{ALGORITHM}\n{amz_date}\n{scope}\n{}",
        sha256_hex(canonical_request.as_bytes())
    )
}

/// The outcome of signing a canonical request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed {
    /// Hex HMAC-SHA256 of the string to sign.
    pub signature: String,
    pub signed_headers: String,
    pub string_to_sign: String,
}

impl Signed {
    /// The `Authorization` header value.
    pub fn authorization(&self, access_key: &str, scope: &Scope) -> String {
        format!(
            "{ALGORITHM} Credential={access_key}/{scope}, SignedHeaders={}, Signature={}",
            self.signed_headers, self.signature
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_aws_documented_signing_key() {
        // From AWS's "Deriving the signing key" example.
        let key = signing_key(
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            "20120215",
            "us-east-1",
            "iam",
        );
        assert_eq!(
            hex::encode(key),
            "f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d"
        );
        assert_eq!(sha256_hex(b""), EMPTY_SHA256);
    }

    /// The AWS SigV4 test suite (aws-c-auth `tests/aws-signing-test-suite/v4`): service
    /// `service`, host `example.amazonaws.com`, 2015-08-30 12:36:00 UTC. Only cases whose
    /// paths need no normalisation, since S3 (and so Yutu) signs paths as they are.
    mod aws_test_suite {
        use super::*;

        const SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
        const DATE: &str = "20150830T123600Z";

        fn sign(
            method: &str,
            path: &str,
            query: Option<&str>,
            extra: &[(&str, &str)],
            payload: &str,
        ) -> (CanonicalRequest, String) {
            let mut headers = vec![("Host", "example.amazonaws.com"), ("X-Amz-Date", DATE)];
            headers.extend_from_slice(extra);
            let creq =
                CanonicalRequest::new(method, path, query, CanonicalHeaders::all(headers), payload);
            let scope = Scope::new("20150830", "us-east-1", "service");
            let signed = creq.sign(SECRET, &scope, DATE);
            let auth = signed.authorization("AKIDEXAMPLE", &scope);
            let expected_prefix = format!(
                "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders={}, Signature=",
                creq.headers.signed()
            );
            assert!(auth.starts_with(&expected_prefix), "{auth}");
            (creq, signed.signature)
        }

        #[test]
        fn get_vanilla() {
            let (creq, sig) = sign("GET", "/", None, &[], EMPTY_SHA256);
            assert_eq!(
                creq.to_string(),
                "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
            );
            assert_eq!(
                creq.string_to_sign(DATE, &Scope::new("20150830", "us-east-1", "service")),
                "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\nbb579772317eb040ac9ed261061d46c1f17a8133879d6129b6e1c25292927e63"
            );
            assert_eq!(
                sig,
                "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
            );
        }

        #[test]
        fn post_vanilla() {
            let (_, sig) = sign("POST", "/", None, &[], EMPTY_SHA256);
            assert_eq!(
                sig,
                "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b"
            );
        }

        #[test]
        fn get_vanilla_query_order_key_case() {
            let (creq, sig) = sign(
                "GET",
                "/",
                Some("Param2=value2&Param1=value1"),
                &[],
                EMPTY_SHA256,
            );
            assert_eq!(creq.query, "Param1=value1&Param2=value2");
            assert_eq!(
                sig,
                "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500"
            );
        }

        #[test]
        fn get_vanilla_query_order_key() {
            // A repeated name: sorted by value too (byte order, so `V` before `v`).
            let (creq, sig) = sign(
                "GET",
                "/",
                Some("Param1=value2&Param1=Value1"),
                &[],
                EMPTY_SHA256,
            );
            assert_eq!(creq.query, "Param1=Value1&Param1=value2");
            assert_eq!(
                sig,
                "eedbc4e291e521cf13422ffca22be7d2eb8146eecf653089df300a15b2382bd1"
            );
        }

        #[test]
        fn get_vanilla_query_unreserved() {
            let u = "-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
            let (creq, sig) = sign("GET", "/", Some(&format!("{u}={u}")), &[], EMPTY_SHA256);
            assert_eq!(creq.query, format!("{u}={u}"));
            assert_eq!(
                sig,
                "9c3e54bfcdf0b19771a7f523ee5669cdf59bc7cc0884027167c21bb143a40197"
            );
        }

        #[test]
        fn get_header_value_trim() {
            let (creq, sig) = sign(
                "GET",
                "/",
                None,
                &[("My-Header1", " value1"), ("My-Header2", " \"a   b   c\"")],
                EMPTY_SHA256,
            );
            assert!(creq
                .headers
                .canonical()
                .contains("my-header1:value1\nmy-header2:\"a b c\"\n"));
            assert_eq!(
                sig,
                "acc3ed3afb60bb290fc8d2dd0098b9911fcaa05412b367055dee359757a9c736"
            );
        }

        #[test]
        fn get_header_key_duplicate() {
            let (creq, sig) = sign(
                "GET",
                "/",
                None,
                &[
                    ("My-Header1", "value2"),
                    ("My-Header1", "value2"),
                    ("My-Header1", "value1"),
                ],
                EMPTY_SHA256,
            );
            assert!(creq
                .headers
                .canonical()
                .contains("my-header1:value2,value2,value1\n"));
            assert_eq!(
                sig,
                "c9d5ea9f3f72853aea855b47ea873832890dbdd183b4468f858259531a5138ea"
            );
        }

        #[test]
        fn post_x_www_form_urlencoded() {
            let body_hash = sha256_hex(b"Param1=value1");
            assert_eq!(
                body_hash,
                "9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e"
            );
            let (creq, sig) = sign(
                "POST",
                "/",
                None,
                &[
                    ("Content-Type", "application/x-www-form-urlencoded"),
                    ("Content-Length", "13"),
                    ("x-amz-content-sha256", &body_hash),
                ],
                &body_hash,
            );
            assert_eq!(
                creq.headers.signed(),
                "content-length;content-type;host;x-amz-content-sha256;x-amz-date"
            );
            assert_eq!(
                sig,
                "d3875051da38690788ef43de4db0d8f280229d82040bfac253562e56c3f20e0b"
            );
        }
    }

    /// The examples of AWS's "Signature Calculations for the Authorization Header" (S3):
    /// bucket `examplebucket`, 2013-05-24, region us-east-1.
    mod s3_examples {
        use super::*;

        const SECRET: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
        const DATE: &str = "20130524T000000Z";
        const HOST: &str = "examplebucket.s3.amazonaws.com";

        fn scope() -> Scope {
            Scope::new("20130524", "us-east-1", "s3")
        }

        fn sign(
            method: &str,
            path: &str,
            query: Option<&str>,
            extra: &[(&str, &str)],
            payload: &str,
        ) -> (CanonicalRequest, Signed) {
            let mut headers = vec![
                ("Host", HOST),
                ("x-amz-date", DATE),
                ("x-amz-content-sha256", payload),
            ];
            headers.extend_from_slice(extra);
            let creq =
                CanonicalRequest::new(method, path, query, CanonicalHeaders::all(headers), payload);
            let signed = creq.sign(SECRET, &scope(), DATE);
            (creq, signed)
        }

        #[test]
        fn get_object() {
            let (creq, signed) = sign(
                "GET",
                "/test.txt",
                None,
                &[("Range", "bytes=0-9")],
                EMPTY_SHA256,
            );
            assert_eq!(
                creq.to_string(),
                "GET\n/test.txt\n\nhost:examplebucket.s3.amazonaws.com\nrange:bytes=0-9\nx-amz-content-sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\nx-amz-date:20130524T000000Z\n\nhost;range;x-amz-content-sha256;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
            );
            assert_eq!(
                signed.string_to_sign,
                "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972"
            );
            assert_eq!(
                signed.authorization("AKIAIOSFODNN7EXAMPLE", &scope()),
                "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
            );
        }

        #[test]
        fn put_object() {
            // The path as a loose client sends it; `$` is encoded in the canonical URI.
            let body_hash = sha256_hex(b"Welcome to Amazon S3.");
            let (creq, signed) = sign(
                "PUT",
                "/test$file.text",
                None,
                &[
                    ("Date", "Fri, 24 May 2013 00:00:00 GMT"),
                    ("x-amz-storage-class", "REDUCED_REDUNDANCY"),
                ],
                &body_hash,
            );
            assert_eq!(creq.uri, "/test%24file.text");
            assert_eq!(
                signed.signature,
                "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd"
            );
            // The same path sent encoded signs the same.
            let encoded = CanonicalRequest::new(
                "PUT",
                "/test%24file.text",
                None,
                creq.headers.clone(),
                &body_hash,
            );
            assert_eq!(encoded, creq);
        }

        #[test]
        fn get_bucket_lifecycle() {
            let (creq, signed) = sign("GET", "/", Some("lifecycle"), &[], EMPTY_SHA256);
            assert_eq!(creq.query, "lifecycle=");
            assert_eq!(
                signed.signature,
                "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543"
            );
        }

        #[test]
        fn list_objects() {
            let (creq, signed) = sign("GET", "/", Some("prefix=J&max-keys=2"), &[], EMPTY_SHA256);
            assert_eq!(creq.query, "max-keys=2&prefix=J");
            assert_eq!(
                signed.signature,
                "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"
            );
        }

        /// "Authenticating Requests: Using Query Parameters": a presigned GET, verified the
        /// way a node does (everything in the query but the signature is signed).
        #[test]
        fn presigned_url() {
            let query = "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-SignedHeaders=host&X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404";
            let headers =
                CanonicalHeaders::select([("host", HOST), ("user-agent", "x")], &["host"]).unwrap();
            let creq =
                CanonicalRequest::new("GET", "/test.txt", Some(query), headers, UNSIGNED_PAYLOAD);
            assert!(!creq.query.contains("Signature"));
            let signed = creq.sign(SECRET, &scope(), DATE);
            assert_eq!(
                signed.signature,
                "aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404"
            );
        }
    }

    #[test]
    fn select_keeps_the_signed_order_and_needs_every_header() {
        let arrived = [
            ("Host", "h"),
            ("X-Amz-Date", "d"),
            ("x-amz-meta-a", " 1 "),
            ("X-Amz-Meta-A", "2"),
            ("unsigned", "u"),
        ];
        let h = CanonicalHeaders::select(arrived, &["host", "x-amz-date", "x-amz-meta-a"]).unwrap();
        assert_eq!(h.canonical(), "host:h\nx-amz-date:d\nx-amz-meta-a:1,2\n");
        assert_eq!(h.signed(), "host;x-amz-date;x-amz-meta-a");
        assert_eq!(
            CanonicalHeaders::select(arrived, &["host", "range"]),
            Err(MissingHeader("range".into()))
        );
        // Values need not be UTF-8 or free of folds.
        let h = CanonicalHeaders::all([("a", &b"x\r\n  y\xff"[..])]);
        assert_eq!(h.canonical(), "a:x y\u{fffd}\n");
    }

    #[test]
    fn canonical_uris() {
        assert_eq!(canonical_uri(""), "/");
        assert_eq!(canonical_uri("/"), "/");
        assert_eq!(canonical_uri("/b/a%20b/c~d"), "/b/a%20b/c~d");
        assert_eq!(canonical_uri("/b/a b+c"), "/b/a%20b%2Bc");
        assert_eq!(canonical_uri("/b/x%2Fy//z/"), "/b/x%2Fy//z/");
        assert_eq!(canonical_uri("/b/%e1%88%b4"), "/b/%E1%88%B4");
        assert_eq!(canonical_uri("/b/%FF"), "/b/%FF");
    }

    #[test]
    fn canonical_queries() {
        assert_eq!(canonical_query(None), "");
        assert_eq!(canonical_query(Some("")), "");
        assert_eq!(
            canonical_query(Some("list-type=2&prefix=a%2Fb&delimiter=/&max-keys=1")),
            "delimiter=%2F&list-type=2&max-keys=1&prefix=a%2Fb"
        );
        assert_eq!(
            canonical_query(Some("prefix=a%20b&list-type=2&X-Amz-Signature=x&acl")),
            "acl=&list-type=2&prefix=a%20b"
        );
        assert_eq!(canonical_query(Some("uploads")), "uploads=");
        assert_eq!(canonical_query(Some("k=a b~+")), "k=a%20b~%2B");
        assert_eq!(uri_encode("a b/c~d+é", true), "a%20b/c~d%2B%C3%A9");
        assert_eq!(uri_encode("a/b", false), "a%2Fb");
    }
}
