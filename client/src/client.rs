//! [`Client`]: one blocking call per S3 operation, over a pooled HTTP/1.1 agent.
//!
//! Every call builds a path-style URL ([`crate::address`]), sends it with ureq, and turns
//! any non-2xx answer into [`ClientError::S3`] by reading the server's XML error body. The
//! agent is configured so that ureq hands us those answers instead of its own opaque
//! `StatusCode` error, and so that it never follows redirects (a PUT body cannot be replayed,
//! and an S3 redirect means the client is talking to the wrong place).

use std::io::Read;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use ureq::http::Response;
use ureq::{Agent, Body, SendBody};
use yutu_api::bucket::{DURABILITY_HEADER, QUOTA_HEADER, USAGE_HEADER};
use yutu_api::cluster::{MAX_REPLICAS, REPLICAS_HEADER};

use crate::address::BaseUrl;
use crate::download::{range_header, GetObject};
use crate::error::{error_from_response, ClientError, Resource};
use crate::listing::{BucketInfo, ListPage};
use crate::object::{self, header, ObjectInfo, PutResult};
use crate::sigv4::{Credentials, Signer};
use crate::upload::ExactLength;
use crate::xml;

/// The largest XML document we read into memory (a listing page of 1000 maximal keys is
/// about 1.5 MB); a bigger one means a broken or hostile server.
const XML_LIMIT: u64 = 64 * 1024 * 1024;

/// The largest JSON answer we read into memory (`/admin/v1/stats` of a large cluster is tens
/// of kilobytes); a bigger one means a broken or hostile server.
const JSON_LIMIT: u64 = 16 * 1024 * 1024;

/// How much of an error body we read; S3 error documents are a few hundred bytes.
const ERROR_BODY_LIMIT: u64 = 64 * 1024;

/// Uploads at least this large first ask the server with `Expect: 100-continue`, so that a
/// refusal (no such bucket, too large) arrives as an S3 error before we stream the body,
/// instead of as a reset connection halfway through it. Small bodies skip the extra round
/// trip.
const EXPECT_CONTINUE_FROM: u64 = 1024 * 1024;

/// Connect timeout. Nothing else has a timeout: a GiB transfer or a write-through PUT may
/// legitimately take long, and a stalled connection is the caller's to abandon.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A blocking client for one Yutu server (or any S3 server speaking path style).
///
/// Cheap to clone; clones share the connection pool.
#[derive(Debug, Clone)]
pub struct Client {
    agent: Agent,
    base: BaseUrl,
}

impl Client {
    /// Creates a client for `base_url`, e.g. `http://127.0.0.1:9000`, sending unsigned
    /// requests (a node started with `--no-auth`). Nothing is sent yet.
    pub fn new(base_url: &str) -> Result<Client, ClientError> {
        Self::with_credentials(base_url, None)
    }

    /// A client that signs every request with `credentials` (AWS SigV4, header form, the
    /// payload unsigned so streamed bodies are read once); `None`: unsigned.
    pub fn with_credentials(
        base_url: &str,
        credentials: Option<Credentials>,
    ) -> Result<Client, ClientError> {
        Self::build(base_url, credentials, None)
    }

    /// A client that sends `token` as `Authorization: Bearer` with every request.
    pub fn with_token(base_url: &str, token: &str) -> Result<Client, ClientError> {
        Self::build(base_url, None, Some(token))
    }

    fn build(
        base_url: &str,
        credentials: Option<Credentials>,
        token: Option<&str>,
    ) -> Result<Client, ClientError> {
        let base = BaseUrl::parse(base_url)?;
        let mut config = Agent::config_builder();
        if let Some(c) = credentials {
            config = config.middleware(Signer {
                credentials: c,
                prefix: base.path_prefix().to_string(),
            });
        }
        if let Some(token) = token {
            let bearer = crate::bearer::Bearer::new(token).ok_or_else(|| {
                ClientError::InvalidArgument("the token has characters a header cannot".into())
            })?;
            config = config.middleware(bearer);
        }
        let agent: Agent = config
            .http_status_as_error(false)
            .max_redirects(0)
            .max_redirects_will_error(false)
            .timeout_connect(Some(CONNECT_TIMEOUT))
            .user_agent(concat!("yutu-client/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Ok(Client { agent, base })
    }

    /// The base URL, without a trailing slash.
    pub fn base_url(&self) -> &str {
        self.base.as_str()
    }

    /// ListBuckets: every bucket on the server.
    pub fn list_buckets(&self) -> Result<Vec<BucketInfo>, ClientError> {
        let resp = self.agent.get(self.base.service()).call()?;
        let body = read_xml(check(resp, Resource::Service)?)?;
        xml::parse_list_buckets(&body)
    }

    /// CreateBucket.
    pub fn create_bucket(&self, bucket: &str) -> Result<(), ClientError> {
        self.create_bucket_with(bucket, &BucketOptions::default())
    }

    /// CreateBucket with Yutu's bucket settings, fixed at creation: the replica count
    /// (`x-yutu-replicas`, a cluster's copies of every object) and the durability
    /// (`x-yutu-durability`). Unset ones take the node's defaults. The replica count is
    /// checked here (1 to [`MAX_REPLICAS`]) so that a typo fails before anything is sent.
    pub fn create_bucket_with(
        &self,
        bucket: &str,
        options: &BucketOptions,
    ) -> Result<(), ClientError> {
        let mut req = self.agent.put(self.base.bucket(bucket, &[])?);
        if let Some(n) = options.replicas {
            if !(1..=MAX_REPLICAS).contains(&n) {
                return Err(ClientError::InvalidArgument(format!(
                    "replicas must be from 1 to {MAX_REPLICAS}, not {n}"
                )));
            }
            req = req.header(REPLICAS_HEADER, n.to_string());
        }
        if let Some(d) = options.durability {
            req = req.header(DURABILITY_HEADER, d.as_str());
        }
        if let Some(q) = options.quota {
            req = req.header(QUOTA_HEADER, q.to_string());
        }
        check(req.send_empty()?, Resource::Bucket).map(drop)
    }

    /// HeadBucket with what Yutu says of the bucket: its durability, quota and the bytes it
    /// holds. `None` when the bucket does not exist.
    pub fn bucket_status(&self, bucket: &str) -> Result<Option<BucketStatus>, ClientError> {
        let resp = self.agent.head(self.base.bucket(bucket, &[])?).call()?;
        if resp.status().as_u16() == 404 {
            return Ok(None);
        }
        let resp = check(resp, Resource::Bucket)?;
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let number = |name: &str| header(name).and_then(|v| v.parse::<u64>().ok());
        Ok(Some(BucketStatus {
            durability: header(DURABILITY_HEADER),
            quota: number(QUOTA_HEADER),
            usage: number(USAGE_HEADER),
        }))
    }

    /// DeleteBucket; S3 refuses (`BucketNotEmpty`) while the bucket holds objects.
    pub fn delete_bucket(&self, bucket: &str) -> Result<(), ClientError> {
        let resp = self.agent.delete(self.base.bucket(bucket, &[])?).call()?;
        check(resp, Resource::Bucket).map(drop)
    }

    /// HeadBucket: `true` if it exists, `false` on 404, an error for anything else (a 403
    /// says nothing about existence).
    pub fn head_bucket(&self, bucket: &str) -> Result<bool, ClientError> {
        let resp = self.agent.head(self.base.bucket(bucket, &[])?).call()?;
        if resp.status().as_u16() == 404 {
            return Ok(false);
        }
        check(resp, Resource::Bucket).map(|_| true)
    }

    /// PutObject, streaming exactly `content_length` bytes from `body`.
    ///
    /// S3 needs the length up front (it answers `MissingContentLength` otherwise), so the
    /// caller states it; if `body` ends early the request fails with an I/O error, and bytes
    /// past the length are not read.
    pub fn put_object<R: Read>(
        &self,
        bucket: &str,
        key: &str,
        body: R,
        content_length: u64,
        content_type: Option<&str>,
    ) -> Result<PutResult, ClientError> {
        let url = self.base.object(bucket, key)?;
        let mut req = self.agent.put(url).header("content-length", content_length);
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        if content_length >= EXPECT_CONTINUE_FROM {
            req = req.header("expect", "100-continue");
        }
        let mut reader = ExactLength::new(body, content_length);
        let resp = req.send(SendBody::from_reader(&mut reader))?;
        let resp = check(resp, Resource::Object)?;
        object::put_result(resp.headers())
    }

    /// PutObject from memory.
    pub fn put_bytes(
        &self,
        bucket: &str,
        key: &str,
        data: &[u8],
    ) -> Result<PutResult, ClientError> {
        self.put_object(bucket, key, data, data.len() as u64, None)
    }

    /// GetObject, optionally of a byte range `(first, last)` with `last` inclusive (`None`:
    /// to the end). The body is streamed: read the returned [`GetObject`].
    pub fn get_object(
        &self,
        bucket: &str,
        key: &str,
        range: Option<(u64, Option<u64>)>,
    ) -> Result<GetObject, ClientError> {
        let mut req = self.agent.get(self.base.object(bucket, key)?);
        if let Some(r) = range {
            req = req.header("range", range_header(r)?);
        }
        let resp = check(req.call()?, Resource::Object)?;
        let headers = resp.headers();
        let content_length = object::content_length(headers)?;
        let (info, range) = if resp.status().as_u16() == 206 {
            let cr = object::content_range(headers)?;
            if cr.last - cr.first + 1 != content_length {
                return Err(ClientError::InvalidResponse(format!(
                    "Content-Range covers {} bytes but Content-Length is {content_length}",
                    cr.last - cr.first + 1
                )));
            }
            let info = object::object_info_with_size(headers, cr.total)?;
            (info, Some((cr.first, cr.last)))
        } else {
            (
                object::object_info_with_size(headers, content_length)?,
                None,
            )
        };
        Ok(GetObject {
            info,
            content_length,
            range,
            body: resp.into_body().into_reader(),
        })
    }

    /// GetObject into memory. Only for objects known to be small enough to hold.
    pub fn get_bytes(&self, bucket: &str, key: &str) -> Result<Vec<u8>, ClientError> {
        let mut obj = self.get_object(bucket, key, None)?;
        // Cap the initial reservation: Content-Length comes from the server.
        let mut out = Vec::with_capacity(obj.content_length.min(64 * 1024 * 1024) as usize);
        obj.read_to_end(&mut out)?;
        Ok(out)
    }

    /// HeadObject. A missing object is `ClientError::S3` with code `NoSuchKey`, a missing
    /// bucket `NoSuchBucket`.
    ///
    /// A HEAD answer has no body to say which of the two is missing, so on a bare 404 this
    /// asks HeadBucket once more. That second request happens only on the miss path; use
    /// [`Client::object_exists`] where misses are frequent and the reason does not matter.
    pub fn head_object(&self, bucket: &str, key: &str) -> Result<ObjectInfo, ClientError> {
        let resp = self.agent.head(self.base.object(bucket, key)?).call()?;
        let bare_404 =
            resp.status().as_u16() == 404 && header(resp.headers(), "x-amz-error-code").is_none();
        match check(resp, Resource::Object) {
            Ok(resp) => object::object_info(resp.headers()),
            Err(_) if bare_404 && !self.head_bucket(bucket).unwrap_or(true) => {
                Err(error_from_response(404, "", None, None, Resource::Bucket))
            }
            Err(e) => Err(e),
        }
    }

    /// Whether `bucket/key` exists: one HEAD, `false` on any 404 (missing key or bucket).
    pub fn object_exists(&self, bucket: &str, key: &str) -> Result<bool, ClientError> {
        let resp = self.agent.head(self.base.object(bucket, key)?).call()?;
        if resp.status().as_u16() == 404 {
            return Ok(false);
        }
        check(resp, Resource::Object).map(|_| true)
    }

    /// DeleteObject. Like S3, deleting a missing key succeeds.
    pub fn delete_object(&self, bucket: &str, key: &str) -> Result<(), ClientError> {
        let resp = self.agent.delete(self.base.object(bucket, key)?).call()?;
        check(resp, Resource::Object).map(drop)
    }

    /// ListObjectsV2: one page. Unset parameters are left out of the request, so the
    /// server's defaults apply (no prefix, no delimiter, 1000 keys).
    pub fn list_objects_v2(
        &self,
        bucket: &str,
        prefix: Option<&str>,
        delimiter: Option<&str>,
        max_keys: Option<u32>,
        continuation_token: Option<&str>,
        start_after: Option<&str>,
    ) -> Result<ListPage, ClientError> {
        let max_keys = max_keys.map(|m| m.to_string());
        let query = list_query(
            prefix,
            delimiter,
            max_keys.as_deref(),
            continuation_token,
            start_after,
        );
        let resp = self.agent.get(self.base.bucket(bucket, &query)?).call()?;
        let body = read_xml(check(resp, Resource::Bucket)?)?;
        xml::parse_list_objects_v2(&body)
    }
}

impl Client {
    /// `GET {base}{path}` of one of Yutu's JSON APIs (`/admin/...`), signed or with the
    /// bearer token like every other call; the answer is decoded as `T`. Errors of those APIs
    /// are JSON documents, which [`check`] reads as it reads S3's XML.
    pub(crate) fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        let resp = self.agent.get(self.json_url(path)).call()?;
        read_json(check(resp, Resource::Service)?)
    }

    /// `POST {base}{path}` with `body` as JSON; the answer is decoded as `T`.
    pub(crate) fn post_json<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        let raw = serde_json::to_vec(body)
            .map_err(|e| ClientError::InvalidArgument(format!("cannot encode the request: {e}")))?;
        let resp = self
            .agent
            .post(self.json_url(path))
            .header("content-type", "application/json")
            .send(&raw[..])?;
        read_json(check(resp, Resource::Service)?)
    }

    fn json_url(&self, path: &str) -> String {
        format!("{}{path}", self.base.as_str())
    }
}

/// Yutu's bucket settings at creation ([`Client::create_bucket_with`]); `None`: the node's
/// default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BucketOptions {
    /// Copies of every object in a cluster (1 to [`MAX_REPLICAS`]); more than 1 needs one.
    pub replicas: Option<u32>,
    pub durability: Option<Durability>,
    /// Most bytes of objects the bucket may hold (`x-yutu-quota`), whatever the replica
    /// count; writes past it are refused with `QuotaExceeded` (403).
    pub quota: Option<u64>,
}

/// What HeadBucket says of a bucket beyond its existence ([`Client::bucket_status`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BucketStatus {
    /// `memory` or `disk`.
    pub durability: Option<String>,
    /// The quota in bytes, if the bucket has one.
    pub quota: Option<u64>,
    /// Bytes of objects the bucket holds, as the answering node knows them.
    pub usage: Option<u64>,
}

/// Where a bucket's objects must be before a PUT is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// DRAM only: fastest; lost on restart unless demoted to NVMe meanwhile.
    Memory,
    /// Written through to NVMe and synced before the PUT is acknowledged: survives kill -9.
    Disk,
}

impl Durability {
    /// The value of `x-yutu-durability`.
    pub fn as_str(self) -> &'static str {
        match self {
            Durability::Memory => "memory",
            Durability::Disk => "disk",
        }
    }
}

/// The ListObjectsV2 query, in a fixed order with only the parameters that are set.
fn list_query<'a>(
    prefix: Option<&'a str>,
    delimiter: Option<&'a str>,
    max_keys: Option<&'a str>,
    continuation_token: Option<&'a str>,
    start_after: Option<&'a str>,
) -> Vec<(&'static str, &'a str)> {
    let mut q = vec![("list-type", "2")];
    let optional = [
        ("prefix", prefix),
        ("delimiter", delimiter),
        ("max-keys", max_keys),
        ("continuation-token", continuation_token),
        ("start-after", start_after),
    ];
    q.extend(optional.into_iter().filter_map(|(k, v)| v.map(|v| (k, v))));
    q
}

/// Passes a 2xx answer through; turns anything else into the server's S3 error.
fn check(mut resp: Response<Body>, resource: Resource) -> Result<Response<Body>, ClientError> {
    let status = resp.status().as_u16();
    if (200..300).contains(&status) {
        return Ok(resp);
    }
    let header_code = header(resp.headers(), "x-amz-error-code").map(str::to_string);
    let header_message = header(resp.headers(), "x-amz-error-message").map(str::to_string);
    // The body only refines the error; if it cannot be read, the status still can.
    let mut raw = Vec::new();
    let _ = resp
        .body_mut()
        .as_reader()
        .take(ERROR_BODY_LIMIT)
        .read_to_end(&mut raw);
    let body = String::from_utf8_lossy(&raw);
    Err(error_from_response(
        status,
        &body,
        header_code.as_deref(),
        header_message.as_deref(),
        resource,
    ))
}

/// Reads a JSON answer, refusing absurd sizes; a body that is not the expected document is
/// [`ClientError::InvalidResponse`] (an older node, or something else at that URL).
fn read_json<T: DeserializeOwned>(mut resp: Response<Body>) -> Result<T, ClientError> {
    let raw = resp
        .body_mut()
        .with_config()
        .limit(JSON_LIMIT)
        .read_to_vec()?;
    serde_json::from_slice(&raw)
        .map_err(|e| ClientError::InvalidResponse(format!("unexpected JSON answer: {e}")))
}

/// Reads an XML answer into a string, refusing absurd sizes.
fn read_xml(mut resp: Response<Body>) -> Result<String, ClientError> {
    Ok(resp
        .body_mut()
        .with_config()
        .limit(XML_LIMIT)
        .read_to_string()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_query_has_only_what_is_set() {
        assert_eq!(
            list_query(None, None, None, None, None),
            vec![("list-type", "2")]
        );
        assert_eq!(
            list_query(Some("p/"), Some("/"), Some("10"), Some("t"), Some("s")),
            vec![
                ("list-type", "2"),
                ("prefix", "p/"),
                ("delimiter", "/"),
                ("max-keys", "10"),
                ("continuation-token", "t"),
                ("start-after", "s"),
            ]
        );
        assert_eq!(
            list_query(None, Some("/"), None, Some("t"), None),
            vec![
                ("list-type", "2"),
                ("delimiter", "/"),
                ("continuation-token", "t")
            ]
        );
    }

    #[test]
    fn new_checks_the_url() {
        assert!(Client::new("http://127.0.0.1:9000").is_ok());
        assert_eq!(
            Client::new("http://127.0.0.1:9000/").unwrap().base_url(),
            "http://127.0.0.1:9000"
        );
        assert!(matches!(
            Client::new("127.0.0.1:9000"),
            Err(ClientError::InvalidUrl { .. })
        ));
    }
}
