//! The S3 `Client` with credentials: every request carries a SigV4 signature that verifies
//! the way a node verifies it (the shared canonical request of `yutu_api::sigv4`, from the
//! headers the `Authorization` header names and the target as sent), bodies unsigned.

mod common;

use common::{object_headers, FakeServer, Req, Resp};
use yutu_api::sigv4::{CanonicalHeaders, CanonicalRequest, Scope, UNSIGNED_PAYLOAD};
use yutu_client::{Client, ClientError, Credentials};

const ACCESS: &str = "AKIDYUTU";
const SECRET: &str = "the-secret/+key";

/// Verifies like a node: `Err(why)` unless the signature holds.
fn verify(r: &Req) -> Result<(), &'static str> {
    verify_behind(r, "")
}

/// Verifies like a node behind a proxy that strips `prefix` from the path.
fn verify_behind(r: &Req, prefix: &str) -> Result<(), &'static str> {
    let auth = r.header("authorization").ok_or("not signed")?;
    let rest = auth.strip_prefix("AWS4-HMAC-SHA256 ").ok_or("not SigV4")?;
    let field = |name: &str| {
        rest.split(',')
            .map(str::trim)
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
            .ok_or("malformed authorization")
    };
    let credential: Vec<&str> = field("Credential")?.split('/').collect();
    let [access, date, region, service, "aws4_request"] = credential[..] else {
        return Err("malformed credential");
    };
    if access != ACCESS {
        return Err("unknown access key");
    }
    let signed: Vec<&str> = field("SignedHeaders")?.split(';').collect();
    let headers = r.headers.iter().map(|(k, v)| (k.as_str(), v.as_bytes()));
    let headers =
        CanonicalHeaders::select(headers, &signed).map_err(|_| "a signed header is missing")?;
    let (path, query) = match r.target.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (r.target.as_str(), None),
    };
    let path = path.strip_prefix(prefix).ok_or("outside the prefix")?;
    let payload = r.header("x-amz-content-sha256").ok_or("no payload hash")?;
    let request = CanonicalRequest::new(&r.method, path, query, headers, payload);
    let amz_date = r.header("x-amz-date").ok_or("no x-amz-date")?;
    let scope = Scope::new(date, region, service);
    if request.sign(SECRET, &scope, amz_date).signature != field("Signature")? {
        return Err("signature mismatch");
    }
    Ok(())
}

const EMPTY_LISTING: &str = r#"<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><Name>b</Name><KeyCount>0</KeyCount><MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated></ListBucketResult>"#;

/// Answers like a node with one user: S3 errors for bad signatures.
fn signing_server() -> FakeServer {
    FakeServer::start(|r| match verify(r) {
        Err(why) => Resp::s3_error(403, "SignatureDoesNotMatch", why),
        Ok(()) if r.method == "GET" && r.target.contains("list-type=2") => {
            Resp::new(200).xml(EMPTY_LISTING)
        }
        Ok(()) if r.method == "GET" => object_headers(Resp::new(200).body("hello"), "\"e\""),
        Ok(()) => Resp::new(200).header("etag", "\"e\""),
    })
}

#[test]
fn every_request_is_signed_and_verifies() {
    let server = signing_server();
    let client =
        Client::with_credentials(&server.url, Some(Credentials::new(ACCESS, SECRET))).unwrap();
    let key = "dir/a b+c&d=é~(1).bin";
    client.create_bucket("b").unwrap();
    client.put_bytes("b", key, b"hello").unwrap();
    assert_eq!(client.get_bytes("b", key).unwrap(), b"hello");
    client
        .list_pages("b", Some("dir/a b"), Some("/"))
        .next()
        .unwrap()
        .unwrap();
    client.delete_object("b", key).unwrap();
    let reqs = server.requests();
    assert_eq!(reqs.len(), 5);
    for r in &reqs {
        assert_eq!(verify(r), Ok(()), "{} {}", r.method, r.target);
        assert_eq!(r.header("x-amz-content-sha256"), Some(UNSIGNED_PAYLOAD));
        let date = r.header("x-amz-date").unwrap();
        assert!(date.len() == 16 && date.ends_with('Z'), "{date}");
    }
    // The PUT body went out whole, unhashed.
    assert_eq!(reqs[1].body, b"hello");
}

#[test]
fn a_wrong_secret_is_the_servers_error() {
    let server = signing_server();
    let client = Client::with_credentials(
        &server.url,
        Some(Credentials::new(ACCESS, "not-the-secret")),
    )
    .unwrap();
    match client.create_bucket("b").unwrap_err() {
        ClientError::S3 {
            status,
            code,
            message,
        } => assert_eq!(
            (status, code.as_str(), message.as_str()),
            (403, "SignatureDoesNotMatch", "signature mismatch")
        ),
        other => panic!("{other:?}"),
    }
    // Without credentials nothing is signed.
    let unsigned = Client::new(&server.url).unwrap();
    let ClientError::S3 { message, .. } = unsigned.create_bucket("b").unwrap_err() else {
        panic!("expected an S3 error");
    };
    assert_eq!(message, "not signed");
    assert_eq!(server.requests()[1].header("authorization"), None);
}

/// With a base URL under a path prefix (a node mounted behind a proxy that strips it), the
/// signed path is the one the node receives: without the prefix.
#[test]
fn a_prefixed_base_url_signs_the_path_the_node_sees() {
    let server = FakeServer::start(|r| match verify_behind(r, "/s3") {
        Err(why) => Resp::s3_error(403, "SignatureDoesNotMatch", why),
        Ok(()) if r.method == "GET" => object_headers(Resp::new(200).body("hello"), "\"e\""),
        Ok(()) => Resp::new(200).header("etag", "\"e\""),
    });
    let base = format!("{}/s3", server.url);
    let client = Client::with_credentials(&base, Some(Credentials::new(ACCESS, SECRET))).unwrap();
    client.create_bucket("b").unwrap();
    client.put_bytes("b", "k", b"hello").unwrap();
    assert_eq!(client.get_bytes("b", "k").unwrap(), b"hello");
    assert!(server
        .requests()
        .iter()
        .all(|r| r.target.starts_with("/s3/")));
}
