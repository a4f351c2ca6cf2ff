//! Signing requests with AWS Signature Version 4 (header form), for nodes that run with
//! authentication. The canonical request, key derivation and signature are
//! `yutu_api::sigv4`, the same code the node verifies with; this file picks what the calls
//! of this crate sign: `host`, `x-amz-content-sha256` and `x-amz-date`.

use std::time::SystemTime;

use yutu_api::sigv4::{sha256_hex, CanonicalHeaders, CanonicalRequest, Scope, UNSIGNED_PAYLOAD};

/// A user's access key and secret (and the region to sign for; Yutu accepts any).
#[derive(Clone)]
pub struct Credentials {
    pub access_key: String,
    pub secret_key: String,
    pub region: String,
}

impl Credentials {
    /// Credentials for region `us-east-1`.
    pub fn new(access_key: impl Into<String>, secret_key: impl Into<String>) -> Credentials {
        Credentials {
            access_key: access_key.into(),
            secret_key: secret_key.into(),
            region: "us-east-1".into(),
        }
    }

    /// The headers that sign a request: `x-amz-date`, `x-amz-content-sha256` and
    /// `authorization`. `host` is the Host header the request carries, `path` the request
    /// path exactly as sent (percent-encoded), `query` its query string (raw or already
    /// canonical; empty for none). The body is hashed: for small bodies.
    pub fn sign(
        &self,
        method: &str,
        host: &str,
        path: &str,
        query: &str,
        body: &[u8],
        now: SystemTime,
    ) -> [(&'static str, String); 3] {
        self.sign_hashed(method, host, path, query, &sha256_hex(body), now)
    }

    /// [`Credentials::sign`] with the payload hash given: the hex SHA-256 of the body, or
    /// `UNSIGNED-PAYLOAD` for a body streamed without hashing it first.
    pub fn sign_hashed(
        &self,
        method: &str,
        host: &str,
        path: &str,
        query: &str,
        payload: &str,
        now: SystemTime,
    ) -> [(&'static str, String); 3] {
        let stamp = crate::timestamp::format_amz_date(now);
        let headers = CanonicalHeaders::all([
            ("host", host),
            ("x-amz-content-sha256", payload),
            ("x-amz-date", stamp.as_str()),
        ]);
        let query = (!query.is_empty()).then_some(query);
        let request = CanonicalRequest::new(method, path, query, headers, payload);
        let scope = Scope::new(&stamp[..8], self.region.as_str(), "s3");
        let authorization = request
            .sign(&self.secret_key, &scope, &stamp)
            .authorization(&self.access_key, &scope);
        [
            ("x-amz-date", stamp),
            ("x-amz-content-sha256", payload.to_string()),
            ("authorization", authorization),
        ]
    }
}

/// Signs every request an agent sends (the S3 [`crate::Client`]): header SigV4 with an
/// unsigned payload, so streamed uploads are not read twice (the node accepts
/// `UNSIGNED-PAYLOAD`, as S3 does).
/// Signs each request; `prefix` is the base URL's path prefix, left out of the signed path
/// (the node behind a proxy that strips it verifies the path it receives).
pub(crate) struct Signer {
    pub(crate) credentials: Credentials,
    pub(crate) prefix: String,
}

impl ureq::middleware::Middleware for Signer {
    fn handle(
        &self,
        mut request: ureq::http::Request<ureq::SendBody>,
        next: ureq::middleware::MiddlewareNext,
    ) -> Result<ureq::http::Response<ureq::Body>, ureq::Error> {
        let uri = request.uri().clone();
        let host = match (uri.host(), uri.port_u16()) {
            (Some(h), Some(p))
                if !matches!(
                    (uri.scheme_str(), p),
                    (Some("http"), 80) | (Some("https"), 443)
                ) =>
            {
                format!("{h}:{p}")
            }
            (Some(h), _) => h.to_string(),
            (None, _) => String::new(),
        };
        let path = uri
            .path()
            .strip_prefix(self.prefix.as_str())
            .filter(|p| p.starts_with('/'))
            .unwrap_or(uri.path());
        let headers = self.credentials.sign_hashed(
            request.method().as_str(),
            &host,
            path,
            uri.query().unwrap_or(""),
            UNSIGNED_PAYLOAD,
            SystemTime::now(),
        );
        let h = request.headers_mut();
        if let Ok(v) = ureq::http::HeaderValue::from_str(&host) {
            h.insert(ureq::http::header::HOST, v);
        }
        for (name, value) in headers {
            if let Ok(v) = ureq::http::HeaderValue::from_str(&value) {
                h.insert(name, v);
            }
        }
        next.handle(request)
    }
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secret.
        f.debug_struct("Credentials")
            .field("access_key", &self.access_key)
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

/// The Host header a client sends for `base_url` (`http://host:port`, default ports
/// dropped, as HTTP clients do).
pub(crate) fn host_of(base_url: &str) -> String {
    let rest = base_url
        .strip_prefix("http://")
        .map(|r| (r, ":80"))
        .or_else(|| base_url.strip_prefix("https://").map(|r| (r, ":443")));
    let Some((rest, default_port)) = rest else {
        return base_url.to_string();
    };
    let authority = rest.split('/').next().unwrap_or(rest);
    authority
        .strip_suffix(default_port)
        .unwrap_or(authority)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn signs_the_canonical_request() {
        let c = Credentials::new("AKIDEXAMPLE", "secret");
        let at = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let h = c.sign("POST", "127.0.0.1:9000", "/v1/kv/b/get", "", b"{}", at);
        assert_eq!(h[0], ("x-amz-date", "20231114T221320Z".to_string()));
        assert_eq!(h[1].1, sha256_hex(b"{}"));
        assert!(h[2]
            .1
            .starts_with("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20231114/us-east-1/s3/aws4_request, SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature="));
        // Any change to what is signed changes the signature.
        let other = c.sign("POST", "127.0.0.1:9000", "/v1/kv/b/put-end", "", b"{}", at);
        assert_ne!(h[2], other[2]);
        assert!(!format!("{c:?}").contains("secret"));
    }

    /// AWS's S3 GET Object example, through this signer: the canonical request is the
    /// shared one, so the published signature comes out.
    #[test]
    fn signs_like_the_aws_s3_example() {
        let c = Credentials::new(
            "AKIAIOSFODNN7EXAMPLE",
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        );
        let at = UNIX_EPOCH + Duration::from_secs(1_369_353_600); // 2013-05-24T00:00:00Z
        let h = c.sign(
            "GET",
            "examplebucket.s3.amazonaws.com",
            "/",
            "prefix=J&max-keys=2",
            b"",
            at,
        );
        assert!(h[2].1.ends_with(
            "Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"
        ));
        // Raw and canonical query strings sign the same.
        let canonical = c.sign(
            "GET",
            "examplebucket.s3.amazonaws.com",
            "/",
            "max-keys=2&prefix=J",
            b"",
            at,
        );
        assert_eq!(h, canonical);
    }

    #[test]
    fn host_headers() {
        assert_eq!(host_of("http://127.0.0.1:9000"), "127.0.0.1:9000");
        assert_eq!(host_of("http://example.com:80/"), "example.com");
        assert_eq!(host_of("https://example.com:443"), "example.com");
        assert_eq!(host_of("https://example.com:8443/x"), "example.com:8443");
    }
}
