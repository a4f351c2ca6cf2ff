//! AWS Signature Version 4, as a server verifies it.
//!
//! The `aws-sigv4` crate signs outgoing requests inside the AWS SDK; a server needs the other
//! half: rebuild the canonical request from what arrived, derive the signing key from the
//! stored secret, compare signatures in constant time, and keep the key and the running
//! signature to verify the chunk signatures of a streaming (`aws-chunked`) upload. That is a
//! few pure functions over strings, written here.

use http::HeaderMap;

use crate::model::checksum::sha256_hex;

pub const ALGORITHM: &str = "AWS4-HMAC-SHA256";

/// Hex SHA-256 of the empty string: the "previous chunk hash" term of chunk signatures.
pub const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

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

    pub fn scope(&self) -> String {
        format!(
            "{}/{}/{}/aws4_request",
            self.date, self.region, self.service
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

fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    yutu_api::sigv4::hmac_sha256(key, data)
}

/// The key derived from a secret for one day, region and service.
pub fn signing_key(secret: &str, cred: &Credential) -> [u8; 32] {
    yutu_api::sigv4::signing_key(secret, &cred.date, &cred.region, &cred.service)
}

/// Hex HMAC of a string to sign.
pub fn sign(key: &[u8; 32], string_to_sign: &str) -> String {
    hex::encode(hmac(key, string_to_sign.as_bytes()))
}

/// Compares two hex signatures without leaking where they differ.
pub fn signatures_match(a: &str, b: &str) -> bool {
    use subtle::ConstantTimeEq;
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

pub use yutu_api::sigv4::{canonical_query, uri_encode};

/// `name:value\n` for each signed header, values trimmed and inner runs of spaces collapsed.
pub fn canonical_headers(headers: &HeaderMap, signed: &[String]) -> Option<String> {
    let mut out = String::new();
    for name in signed {
        let values: Vec<String> = headers
            .get_all(name.as_str())
            .iter()
            .map(|v| {
                String::from_utf8_lossy(v.as_bytes())
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        if values.is_empty() {
            return None;
        }
        out.push_str(name);
        out.push(':');
        out.push_str(&values.join(","));
        out.push('\n');
    }
    Some(out)
}

/// The canonical request of SigV4.
pub fn canonical_request(
    method: &str,
    canonical_uri: &str,
    canonical_query: &str,
    canonical_headers: &str,
    signed_headers: &[String],
    payload_hash: &str,
) -> String {
    format!(
        "{method}\n{canonical_uri}\n{canonical_query}\n{canonical_headers}\n{}\n{payload_hash}",
        signed_headers.join(";")
    )
}

pub fn string_to_sign(amz_date: &str, scope: &str, canonical_request: &str) -> String {
    format!(
        "{ALGORITHM}\n{amz_date}\n{scope}\n{}",
        sha256_hex(canonical_request.as_bytes())
    )
}

/// What the signature of one `aws-chunked` chunk covers.
pub fn chunk_string_to_sign(amz_date: &str, scope: &str, previous: &str, chunk: &[u8]) -> String {
    format!(
        "AWS4-HMAC-SHA256-PAYLOAD\n{amz_date}\n{scope}\n{previous}\n{EMPTY_SHA256}\n{}",
        sha256_hex(chunk)
    )
}

/// What the signature of the trailer of a signed `aws-chunked` upload covers.
pub fn trailer_string_to_sign(
    amz_date: &str,
    scope: &str,
    previous: &str,
    trailer: &str,
) -> String {
    format!(
        "AWS4-HMAC-SHA256-TRAILER\n{amz_date}\n{scope}\n{previous}\n{}",
        sha256_hex(trailer.as_bytes())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";

    /// The GetObject example of the S3 SigV4 documentation.
    #[test]
    fn documented_get_object_example() {
        let auth = parse_authorization(
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41",
        )
        .unwrap();
        let mut headers = HeaderMap::new();
        headers.insert("host", "examplebucket.s3.amazonaws.com".parse().unwrap());
        headers.insert("range", "bytes=0-9".parse().unwrap());
        headers.insert("x-amz-content-sha256", EMPTY_SHA256.parse().unwrap());
        headers.insert("x-amz-date", "20130524T000000Z".parse().unwrap());
        let ch = canonical_headers(&headers, &auth.signed_headers).unwrap();
        let creq = canonical_request(
            "GET",
            "/test.txt",
            "",
            &ch,
            &auth.signed_headers,
            EMPTY_SHA256,
        );
        let sts = string_to_sign("20130524T000000Z", &auth.credential.scope(), &creq);
        let key = signing_key(SECRET, &auth.credential);
        assert!(signatures_match(&sign(&key, &sts), &auth.signature));
    }

    /// The streaming (aws-chunked) example of the S3 SigV4 documentation.
    #[test]
    fn documented_chunk_signatures() {
        let cred =
            Credential::parse("AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request").unwrap();
        let key = signing_key(SECRET, &cred);
        let seed = "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9";
        let date = "20130524T000000Z";
        let c1 = sign(
            &key,
            &chunk_string_to_sign(date, &cred.scope(), seed, &[b'a'; 65536]),
        );
        assert_eq!(
            c1,
            "ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648"
        );
        let c2 = sign(
            &key,
            &chunk_string_to_sign(date, &cred.scope(), &c1, &[b'a'; 1024]),
        );
        assert_eq!(
            c2,
            "0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497"
        );
        let c3 = sign(&key, &chunk_string_to_sign(date, &cred.scope(), &c2, b""));
        assert_eq!(
            c3,
            "b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9"
        );
    }

    #[test]
    fn query_canonicalisation() {
        assert_eq!(
            canonical_query(Some("prefix=a%20b&list-type=2&X-Amz-Signature=x&acl")),
            "acl=&list-type=2&prefix=a%20b"
        );
        assert_eq!(uri_encode("a b/c~d+é", true), "a%20b/c~d%2B%C3%A9");
        assert_eq!(uri_encode("a/b", false), "a%2Fb");
        assert!(Credential::parse("AKID/2013/us-east-1/s3/aws4_request").is_err());
        assert!(parse_authorization("AWS4-HMAC-SHA512 Credential=x").is_err());
    }
}
