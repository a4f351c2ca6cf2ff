//! What a request asks for, decided from its method, path, query and headers alone: no
//! authentication, no store, no cluster. Everything else derives from the [`Endpoint`]: the
//! operation its metrics count ([`Endpoint::op`]), the permission it needs ([`action`]),
//! whether it needs credentials whatever the ACLs say ([`Endpoint::needs_credentials`]), and
//! which handler serves it (`service.rs`).
//!
//! The order of the rules matters and is the one S3 clients rely on: the ops endpoints
//! (`/health`, `/ready`, `/metrics`) before anything else, a CORS preflight before the method
//! check, refused methods and sub-resources before authentication; then Yutu's own APIs under
//! the reserved names `v1` and `admin` (not valid bucket names, so they never shadow a
//! bucket) and Mooncake's master queries, and last the S3 operations on a bucket or an
//! object, chosen by method and sub-resource.

use http::{HeaderMap, Method};
use yutu_api::mooncake_master::{BATCH_QUERY_KEYS_PATH, GET_ALL_SEGMENTS_PATH, QUERY_KEY_PATH};
use yutu_api::S3ErrorCode;

use super::error::S3Error;
use super::target::Target;
use crate::auth::Action;

/// The operation a request is: what its metrics count it as (a variant's name is its label,
/// `op="GetObject"`), the permission and policy action it needs ([`action`],
/// [`policy_action`]) and the handler that serves it ([`Op::handler`]). Adding an S3
/// operation is a variant here, its rule in [`bucket_op`] or [`object_op`], its lines in
/// those tables, and its function in the handler file the table names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::VariantArray, strum::IntoStaticStr)]
pub enum Op {
    ListBuckets,
    CreateBucket,
    DeleteBucket,
    HeadBucket,
    ListObjects,
    PutObject,
    GetObject,
    HeadObject,
    DeleteObject,
    CopyObject,
    DeleteObjects,
    ListObjectVersions,
    GetBucketLocation,
    CreateMultipartUpload,
    UploadPart,
    UploadPartCopy,
    CompleteMultipartUpload,
    AbortMultipartUpload,
    ListParts,
    ListMultipartUploads,
    GetObjectAttributes,
    GetBucketAcl,
    PutBucketAcl,
    GetObjectAcl,
    PutObjectAcl,
    GetBucketCors,
    PutBucketCors,
    DeleteBucketCors,
    CorsPreflight,
    GetBucketPolicy,
    PutBucketPolicy,
    DeleteBucketPolicy,
    GetBucketPolicyStatus,
    GetPublicAccessBlock,
    PutPublicAccessBlock,
    DeletePublicAccessBlock,
    GetBucketOwnershipControls,
    PutBucketOwnershipControls,
    DeleteBucketOwnershipControls,
    PostObject,
    Admin,
    Kv,
    /// Mooncake master's query endpoints (`/get_all_segments`, `/query_key`,
    /// `/batch_query_keys`).
    MooncakeMaster,
    Ops,
    Unsupported,
}

impl Op {
    /// Every operation, in declaration order (the order of the metric arrays).
    pub const ALL: &'static [Op] = <Op as strum::VariantArray>::VARIANTS;

    /// The metric label: the variant's name.
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// Its number among the metrics' operations (`crate::metrics::MAX_OPS` at most).
    pub fn index(self) -> usize {
        self as usize
    }

    /// Every operation's metric label, by number.
    pub fn names() -> Vec<&'static str> {
        Op::ALL.iter().map(|o| o.name()).collect()
    }

    /// The handler file whose `serve_bucket` or `serve_object` answers this S3 operation
    /// (`None`: not one served through them).
    pub fn handler(self) -> Option<Handler> {
        use Handler as H;
        Some(match self {
            Op::CreateBucket
            | Op::DeleteBucket
            | Op::HeadBucket
            | Op::GetBucketLocation
            | Op::ListObjects
            | Op::ListObjectVersions => H::Buckets,
            Op::GetBucketAcl | Op::PutBucketAcl | Op::GetObjectAcl | Op::PutObjectAcl => H::Acl,
            Op::GetBucketCors | Op::PutBucketCors | Op::DeleteBucketCors => H::Cors,
            Op::GetBucketPolicy
            | Op::PutBucketPolicy
            | Op::DeleteBucketPolicy
            | Op::GetBucketPolicyStatus
            | Op::GetPublicAccessBlock
            | Op::PutPublicAccessBlock
            | Op::DeletePublicAccessBlock => H::BucketPolicy,
            Op::GetBucketOwnershipControls
            | Op::PutBucketOwnershipControls
            | Op::DeleteBucketOwnershipControls => H::Ownership,
            Op::DeleteObjects => H::DeleteMany,
            Op::ListMultipartUploads
            | Op::CreateMultipartUpload
            | Op::UploadPart
            | Op::UploadPartCopy
            | Op::CompleteMultipartUpload
            | Op::AbortMultipartUpload
            | Op::ListParts => H::Multipart,
            Op::PutObject | Op::GetObject | Op::HeadObject | Op::DeleteObject => H::Objects,
            Op::CopyObject => H::Copy,
            Op::GetObjectAttributes => H::Attributes,
            _ => return None,
        })
    }
}

/// An operation the handler it was sent to does not serve (a POST no operation matches, or
/// a table that disagrees with a handler's).
pub fn not_served(op: Op) -> S3Error {
    S3Error::new(S3ErrorCode::NotImplemented).msg(format!("{} is not implemented.", op.name()))
}

/// The handler files of the S3 API (`http/s3/`), each serving its operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handler {
    Buckets,
    Acl,
    Cors,
    BucketPolicy,
    Ownership,
    DeleteMany,
    Multipart,
    Objects,
    Copy,
    Attributes,
}

// The metrics count at most MAX_OPS operations.
const _: () = assert!(Op::ALL.len() <= crate::metrics::MAX_OPS);

/// One request's endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// `GET /health` or `GET /ready`: the node is up.
    Health,
    /// `GET /metrics`: Prometheus text.
    Metrics,
    /// `OPTIONS`: a CORS preflight (browsers send it without credentials).
    CorsPreflight,
    /// One of Mooncake master's query endpoints (`/get_all_segments`, ...).
    Mooncake(MooncakeEndpoint),
    /// `GET /v1/cluster`: the membership a client routes itself with.
    Membership,
    /// `/admin/...`: the admin API.
    Admin,
    /// `/v1/...` (but the membership): the KV control API.
    Kv,
    /// `GET /`: ListBuckets.
    ListBuckets,
    /// A method other than GET on `/`: refused once the caller is known.
    ServiceMethodNotAllowed,
    /// An S3 operation on a bucket (`Op::Unsupported`: a POST no operation matches).
    Bucket { bucket: String, op: Op },
    /// An S3 operation on an object (`Op::Unsupported`: a POST no operation matches).
    Object { bucket: String, key: String, op: Op },
}

impl Endpoint {
    /// The endpoint `method` on `target` addresses, or the error answered before the caller is
    /// even authenticated (a method or a sub-resource Yutu does not serve).
    pub fn parse(method: &Method, target: &Target, headers: &HeaderMap) -> Result<Self, S3Error> {
        if let Some(ops) = ops_endpoint(method, target) {
            return Ok(ops);
        }
        if method == Method::OPTIONS {
            return Ok(Endpoint::CorsPreflight);
        }
        if !matches!(
            *method,
            Method::GET | Method::HEAD | Method::PUT | Method::DELETE | Method::POST
        ) {
            return Err(S3Error::new(S3ErrorCode::MethodNotAllowed).msg(format!(
                "The method {method} is not allowed against this resource."
            )));
        }
        if let Some(sub) = target.unsupported_subresource() {
            return Err(S3Error::new(S3ErrorCode::NotImplemented)
                .msg(format!("The ?{sub} sub-resource is not implemented.")));
        }
        if let Some(m) = mooncake_endpoint(method, target) {
            return Ok(Endpoint::Mooncake(m));
        }
        if !target.virtual_host {
            match target.bucket.as_deref() {
                Some("v1") if method == Method::GET && target.key.as_deref() == Some("cluster") => {
                    return Ok(Endpoint::Membership)
                }
                Some("v1") => return Ok(Endpoint::Kv),
                Some("admin") => return Ok(Endpoint::Admin),
                _ => {}
            }
        }
        Ok(match (&target.bucket, &target.key) {
            (None, _) if method == Method::GET => Endpoint::ListBuckets,
            (None, _) => Endpoint::ServiceMethodNotAllowed,
            (Some(b), None) => Endpoint::Bucket {
                bucket: b.clone(),
                op: bucket_op(method, target, headers),
            },
            (Some(b), Some(k)) => Endpoint::Object {
                bucket: b.clone(),
                key: k.clone(),
                op: object_op(method, target, headers),
            },
        })
    }

    /// The operation the request is counted as.
    pub fn op(&self) -> Op {
        match self {
            Endpoint::Health | Endpoint::Metrics => Op::Ops,
            Endpoint::CorsPreflight => Op::CorsPreflight,
            Endpoint::Mooncake(_) => Op::MooncakeMaster,
            Endpoint::Membership | Endpoint::Admin => Op::Admin,
            Endpoint::Kv => Op::Kv,
            Endpoint::ListBuckets => Op::ListBuckets,
            Endpoint::ServiceMethodNotAllowed => Op::Unsupported,
            Endpoint::Bucket { op, .. } | Endpoint::Object { op, .. } => *op,
        }
    }

    /// Yutu's own APIs (KV, cluster, admin) always need credentials: ACLs open S3 buckets and
    /// objects only.
    pub fn needs_credentials(&self) -> bool {
        matches!(self, Endpoint::Membership | Endpoint::Admin | Endpoint::Kv)
    }
}

/// Which of Mooncake master's query endpoints a request is (`mooncake.rs` serves them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MooncakeEndpoint {
    Segments,
    QueryKey,
    BatchQueryKeys,
}

/// A GET of exactly `/get_all_segments`, `/query_key` or `/batch_query_keys` (no valid bucket
/// name holds `_`, so no bucket is shadowed).
fn mooncake_endpoint(method: &Method, target: &Target) -> Option<MooncakeEndpoint> {
    if method != Method::GET || target.virtual_host || target.key.is_some() {
        return None;
    }
    let path = format!("/{}", target.bucket.as_deref()?);
    match path.as_str() {
        GET_ALL_SEGMENTS_PATH => Some(MooncakeEndpoint::Segments),
        QUERY_KEY_PATH => Some(MooncakeEndpoint::QueryKey),
        BATCH_QUERY_KEYS_PATH => Some(MooncakeEndpoint::BatchQueryKeys),
        _ => None,
    }
}

/// `GET /health`, `/ready`, `/metrics` with no key and no query. Their names are reserved
/// bucket names, so they never shadow a bucket.
fn ops_endpoint(method: &Method, target: &Target) -> Option<Endpoint> {
    if method != Method::GET || target.key.is_some() || !target.query.is_empty() {
        return None;
    }
    match target.bucket.as_deref()? {
        "health" | "ready" => Some(Endpoint::Health),
        "metrics" => Some(Endpoint::Metrics),
        _ => None,
    }
}

/// Whether the request body is an HTML form upload (POST Object).
pub fn is_form(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|c| c.to_str().ok())
        .is_some_and(|c| {
            c.trim_start()
                .to_ascii_lowercase()
                .starts_with("multipart/form-data")
        })
}

/// The S3 operation on a bucket that `method` and the sub-resource name.
fn bucket_op(method: &Method, t: &Target, headers: &HeaderMap) -> Op {
    let sub = |name| t.has(name);
    match *method {
        Method::PUT if sub("acl") => Op::PutBucketAcl,
        Method::GET if sub("acl") => Op::GetBucketAcl,
        Method::PUT if sub("cors") => Op::PutBucketCors,
        Method::GET if sub("cors") => Op::GetBucketCors,
        Method::DELETE if sub("cors") => Op::DeleteBucketCors,
        Method::GET if sub("policy") => Op::GetBucketPolicy,
        Method::PUT if sub("policy") => Op::PutBucketPolicy,
        Method::DELETE if sub("policy") => Op::DeleteBucketPolicy,
        Method::GET if sub("policyStatus") => Op::GetBucketPolicyStatus,
        Method::GET if sub("publicAccessBlock") => Op::GetPublicAccessBlock,
        Method::PUT if sub("publicAccessBlock") => Op::PutPublicAccessBlock,
        Method::DELETE if sub("publicAccessBlock") => Op::DeletePublicAccessBlock,
        Method::GET if sub("ownershipControls") => Op::GetBucketOwnershipControls,
        Method::PUT if sub("ownershipControls") => Op::PutBucketOwnershipControls,
        Method::DELETE if sub("ownershipControls") => Op::DeleteBucketOwnershipControls,
        Method::PUT => Op::CreateBucket,
        Method::DELETE => Op::DeleteBucket,
        Method::HEAD => Op::HeadBucket,
        Method::POST if sub("delete") => Op::DeleteObjects,
        Method::POST if is_form(headers) => Op::PostObject,
        Method::POST => Op::Unsupported,
        _ if sub("location") => Op::GetBucketLocation,
        _ if sub("uploads") => Op::ListMultipartUploads,
        _ if sub("versions") => Op::ListObjectVersions,
        _ => Op::ListObjects,
    }
}

/// The S3 operation on an object that `method`, the sub-resource and a copy source name.
fn object_op(method: &Method, t: &Target, headers: &HeaderMap) -> Op {
    let sub = |name| t.has(name);
    let copy = headers.contains_key("x-amz-copy-source");
    match *method {
        Method::PUT if sub("acl") => Op::PutObjectAcl,
        Method::GET if sub("acl") => Op::GetObjectAcl,
        Method::PUT if sub("uploadId") && copy => Op::UploadPartCopy,
        Method::PUT if sub("uploadId") => Op::UploadPart,
        Method::PUT if copy => Op::CopyObject,
        Method::PUT => Op::PutObject,
        Method::POST if sub("uploads") => Op::CreateMultipartUpload,
        Method::POST if sub("uploadId") => Op::CompleteMultipartUpload,
        Method::POST => Op::Unsupported,
        Method::DELETE if sub("uploadId") => Op::AbortMultipartUpload,
        Method::DELETE => Op::DeleteObject,
        Method::HEAD => Op::HeadObject,
        _ if sub("uploadId") => Op::ListParts,
        _ if sub("attributes") => Op::GetObjectAttributes,
        _ => Op::GetObject,
    }
}

/// The permission an operation needs on its bucket (or object).
pub fn action(op: Op) -> Action {
    match op {
        Op::ListBuckets | Op::PostObject => Action::ListBuckets,
        Op::CreateBucket => Action::CreateBucket,
        Op::DeleteBucket => Action::DeleteBucket,
        Op::PutBucketAcl | Op::PutObjectAcl => Action::WriteAcl,
        Op::GetBucketAcl | Op::GetObjectAcl => Action::ReadAcl,
        Op::GetBucketCors
        | Op::PutBucketCors
        | Op::DeleteBucketCors
        | Op::GetBucketPolicy
        | Op::PutBucketPolicy
        | Op::DeleteBucketPolicy
        | Op::GetBucketPolicyStatus
        | Op::GetPublicAccessBlock
        | Op::PutPublicAccessBlock
        | Op::DeletePublicAccessBlock
        | Op::GetBucketOwnershipControls
        | Op::PutBucketOwnershipControls
        | Op::DeleteBucketOwnershipControls => Action::Configure,
        Op::HeadBucket
        | Op::ListObjects
        | Op::ListObjectVersions
        | Op::ListMultipartUploads
        | Op::GetBucketLocation
        | Op::ListParts => Action::List,
        Op::DeleteObjects | Op::DeleteObject => Action::Delete,
        // GetObjectAttributes reads metadata only: the permission of GetObject, as S3 asks.
        Op::GetObject | Op::HeadObject | Op::GetObjectAttributes => Action::Read,
        Op::PutObject
        | Op::CopyObject
        | Op::UploadPart
        | Op::UploadPartCopy
        | Op::CreateMultipartUpload
        | Op::CompleteMultipartUpload
        | Op::AbortMultipartUpload => Action::Write,
        Op::CorsPreflight | Op::Admin | Op::Kv | Op::MooncakeMaster | Op::Ops | Op::Unsupported => {
            Action::Write
        }
    }
}

/// The bucket-policy action an S3 operation is evaluated as (`s3:GetObject`...); `None` for
/// calls outside the S3 operations (KV, Mooncake's queries, admin), which are evaluated as
/// the permission they need.
pub fn policy_action(op: Op) -> Option<&'static str> {
    use yutu_api::bucket_policy::actions::*;
    match op {
        Op::ListObjects | Op::HeadBucket => Some(LIST_BUCKET),
        Op::ListObjectVersions => Some(LIST_BUCKET_VERSIONS),
        Op::ListMultipartUploads => Some(LIST_BUCKET_MULTIPART_UPLOADS),
        Op::GetBucketLocation => Some(GET_BUCKET_LOCATION),
        Op::ListBuckets => Some(LIST_ALL_MY_BUCKETS),
        Op::CreateBucket => Some(CREATE_BUCKET),
        Op::DeleteBucket => Some(DELETE_BUCKET),
        Op::GetObject | Op::HeadObject => Some(GET_OBJECT),
        Op::GetObjectAttributes => Some(GET_OBJECT_ATTRIBUTES),
        Op::PutObject
        | Op::CopyObject
        | Op::PostObject
        | Op::CreateMultipartUpload
        | Op::UploadPart
        | Op::UploadPartCopy
        | Op::CompleteMultipartUpload => Some(PUT_OBJECT),
        Op::DeleteObject | Op::DeleteObjects => Some(DELETE_OBJECT),
        Op::AbortMultipartUpload => Some(ABORT_MULTIPART_UPLOAD),
        Op::ListParts => Some(LIST_MULTIPART_UPLOAD_PARTS),
        Op::GetBucketAcl => Some(GET_BUCKET_ACL),
        Op::PutBucketAcl => Some(PUT_BUCKET_ACL),
        Op::GetObjectAcl => Some(GET_OBJECT_ACL),
        Op::PutObjectAcl => Some(PUT_OBJECT_ACL),
        Op::GetBucketCors => Some(GET_BUCKET_CORS),
        Op::PutBucketCors | Op::DeleteBucketCors => Some(PUT_BUCKET_CORS),
        Op::GetBucketPolicy => Some(GET_BUCKET_POLICY),
        Op::PutBucketPolicy => Some(PUT_BUCKET_POLICY),
        Op::DeleteBucketPolicy => Some(DELETE_BUCKET_POLICY),
        Op::GetBucketPolicyStatus => Some(GET_BUCKET_POLICY_STATUS),
        Op::GetPublicAccessBlock => Some(GET_BUCKET_PUBLIC_ACCESS_BLOCK),
        Op::PutPublicAccessBlock | Op::DeletePublicAccessBlock => {
            Some(PUT_BUCKET_PUBLIC_ACCESS_BLOCK)
        }
        Op::GetBucketOwnershipControls => Some("s3:GetBucketOwnershipControls"),
        Op::PutBucketOwnershipControls | Op::DeleteBucketOwnershipControls => {
            Some("s3:PutBucketOwnershipControls")
        }
        Op::CorsPreflight | Op::Admin | Op::Kv | Op::MooncakeMaster | Op::Ops | Op::Unsupported => {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(method: Method, uri: &str, headers: &[(&str, &str)]) -> Result<Endpoint, S3Error> {
        let uri: http::Uri = uri.parse().expect("a uri");
        let target = Target::parse_with_host(&uri, None, &[]).expect("a target");
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.insert(
                http::HeaderName::from_bytes(k.as_bytes()).expect("a name"),
                v.parse().expect("a value"),
            );
        }
        Endpoint::parse(&method, &target, &map)
    }

    fn op(method: Method, uri: &str) -> Op {
        parse(method, uri, &[]).expect("an endpoint").op()
    }

    #[test]
    fn only_a_get_of_exactly_the_three_paths_is_mooncake() {
        let get = Method::GET;
        assert_eq!(
            mooncake_endpoint(
                &get,
                &Target::parse(&"/get_all_segments".parse().unwrap()).unwrap()
            ),
            Some(MooncakeEndpoint::Segments)
        );
        assert_eq!(
            mooncake_endpoint(
                &get,
                &Target::parse(&"/query_key?key=a".parse().unwrap()).unwrap()
            ),
            Some(MooncakeEndpoint::QueryKey)
        );
        assert_eq!(
            mooncake_endpoint(
                &get,
                &Target::parse(&"/batch_query_keys?keys=a,b&bucket=x".parse().unwrap()).unwrap()
            ),
            Some(MooncakeEndpoint::BatchQueryKeys)
        );
        assert_eq!(
            mooncake_endpoint(
                &Method::HEAD,
                &Target::parse(&"/query_key?key=a".parse().unwrap()).unwrap()
            ),
            None
        );
        assert_eq!(
            mooncake_endpoint(
                &Method::PUT,
                &Target::parse(&"/get_all_segments".parse().unwrap()).unwrap()
            ),
            None
        );
        assert_eq!(
            mooncake_endpoint(
                &get,
                &Target::parse(&"/query_key/k".parse().unwrap()).unwrap()
            ),
            None
        );
        assert_eq!(
            mooncake_endpoint(
                &get,
                &Target::parse(&"/query-key?key=a".parse().unwrap()).unwrap()
            ),
            None
        );
        assert_eq!(
            mooncake_endpoint(&get, &Target::parse(&"/".parse().unwrap()).unwrap()),
            None
        );
        let domains = vec!["localhost".to_string()];
        let vhost = Target::parse_with_host(
            &"/query_key".parse().unwrap(),
            Some("query.localhost"),
            &domains,
        )
        .unwrap();
        assert_eq!(mooncake_endpoint(&get, &vhost), None);
    }

    #[test]
    fn ops_endpoints_come_first_and_take_no_query() {
        assert_eq!(
            parse(Method::GET, "/health", &[]).ok(),
            Some(Endpoint::Health)
        );
        assert_eq!(
            parse(Method::GET, "/metrics", &[]).ok(),
            Some(Endpoint::Metrics)
        );
        assert_eq!(op(Method::GET, "/metrics?list-type=2"), Op::ListObjects);
    }

    #[test]
    fn refused_methods_and_sub_resources_fail_before_authentication() {
        let e = parse(Method::PATCH, "/b/k", &[]).expect_err("refused");
        assert_eq!(e.code, S3ErrorCode::MethodNotAllowed);
        let e = parse(Method::GET, "/b?website", &[]).expect_err("refused");
        assert_eq!(e.code, S3ErrorCode::NotImplemented);
        assert_eq!(op(Method::OPTIONS, "/b/k"), Op::CorsPreflight);
    }

    #[test]
    fn reserved_names_are_yutus_own_apis() {
        assert_eq!(
            parse(Method::GET, "/v1/cluster", &[]).ok(),
            Some(Endpoint::Membership)
        );
        assert_eq!(
            parse(Method::POST, "/v1/cluster", &[]).ok(),
            Some(Endpoint::Kv)
        );
        assert_eq!(
            parse(Method::POST, "/v1/kv/b/get", &[]).ok(),
            Some(Endpoint::Kv)
        );
        assert_eq!(
            parse(Method::GET, "/admin/v1/status", &[]).ok(),
            Some(Endpoint::Admin)
        );
        assert!(Endpoint::Kv.needs_credentials());
        assert!(!Endpoint::ListBuckets.needs_credentials());
    }

    #[test]
    fn s3_operations_follow_method_and_sub_resource() {
        assert_eq!(op(Method::GET, "/"), Op::ListBuckets);
        assert_eq!(op(Method::PUT, "/"), Op::Unsupported);
        assert_eq!(op(Method::PUT, "/b"), Op::CreateBucket);
        assert_eq!(op(Method::GET, "/b?uploads"), Op::ListMultipartUploads);
        assert_eq!(op(Method::POST, "/b?delete"), Op::DeleteObjects);
        assert_eq!(op(Method::PUT, "/b/k"), Op::PutObject);
        assert_eq!(
            op(Method::PUT, "/b/k?uploadId=1&partNumber=1"),
            Op::UploadPart
        );
        assert_eq!(op(Method::GET, "/b/k?attributes"), Op::GetObjectAttributes);
        let copy = parse(Method::PUT, "/b/k", &[("x-amz-copy-source", "/a/b")]);
        assert_eq!(copy.ok().map(|e| e.op()), Some(Op::CopyObject));
        let form = parse(
            Method::POST,
            "/b",
            &[("content-type", "multipart/form-data; boundary=x")],
        );
        assert_eq!(form.ok().map(|e| e.op()), Some(Op::PostObject));
        assert_eq!(action(Op::GetObjectAttributes), Action::Read);
        assert_eq!(action(Op::HeadBucket), Action::List);
    }
}
