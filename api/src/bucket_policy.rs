//! S3 bucket policies (`PUT /bucket?policy`): parsing and validating the JSON document,
//! deciding what it says about one request, and whether it makes the bucket public.
//!
//! A policy is a list of statements, each of which *allows* or *denies* some actions on some
//! resources to some principals, optionally only under conditions on the request:
//!
//! ```json
//! {"Version": "2012-10-17",
//!  "Statement": [{"Sid": "PublicRead", "Effect": "Allow", "Principal": "*",
//!                 "Action": "s3:GetObject", "Resource": "arn:aws:s3:::photos/*",
//!                 "Condition": {"IpAddress": {"aws:SourceIp": "10.0.0.0/8"}}}]}
//! ```
//!
//! The node parses a policy once when it is put ([`BucketPolicy::parse`], which refuses what
//! S3 refuses with `MalformedPolicy`), keeps the text it was given for GetBucketPolicy
//! ([`BucketPolicy::text`]) and asks [`BucketPolicy::evaluate`] about each request. The answer
//! is a [`Decision`]: an explicit deny, which wins over every allow, an allow, or nothing
//! said (whether the bucket owner may do what a policy denies is the server's business). Mapping an S3 operation to its
//! action name, and filling the condition [`Context`] from the request, are the server's job;
//! [`actions`] and [`keys`] list the names this module expects.
//!
//! ```
//! use yutu_api::acl::Principal;
//! use yutu_api::bucket_policy::{object_arn, BucketPolicy, Context, Decision, Request};
//!
//! let policy = BucketPolicy::parse(
//!     r#"{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": "*",
//!         "Action": "s3:GetObject", "Resource": "arn:aws:s3:::photos/*"}]}"#,
//!     "photos",
//! )
//! .unwrap();
//! let context = Context::new().with("aws:SourceIp", "192.0.2.7");
//! let arn = object_arn("photos", "cat.jpg");
//! let request = Request {
//!     principal: Principal::Anonymous,
//!     action: "s3:GetObject",
//!     resource: &arn,
//!     context: &context,
//! };
//! assert_eq!(policy.evaluate(&request), Decision::Allow);
//! assert!(policy.is_public());
//! ```
//!
//! What is not supported (each is documented where it matters): principals other than users
//! and accounts (services, roles, federated users) are accepted but match no caller; policy
//! variables are `${key}`, `${key, 'default'}`, `${*}`, `${?}` and `${$}` in resources and in
//! string and ARN condition values of `2012-10-17` policies only; action names are checked
//! for shape (`s3:Name`), not against the list of S3's actions.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use serde_json::{Map, Value};

use crate::acl::Principal;
use crate::calendar::{days_from_civil, days_in_month};

/// Largest policy accepted, in bytes of its JSON text (S3's limit is 20 KiB). Bounding it
/// also bounds the work of evaluating one request against the policy.
pub const MAX_POLICY_LEN: usize = 20 * 1024;

/// The policy language version with policy variables.
pub const VERSION_2012_10_17: &str = "2012-10-17";
/// The older policy language version, and the one a policy without `Version` is read as.
pub const VERSION_2008_10_17: &str = "2008-10-17";

/// The S3 error code of every [`PolicyError`] (400), which `S3ErrorCode` does not list.
pub const MALFORMED_POLICY: &str = "MalformedPolicy";

/// The prefix of every S3 resource ARN a policy may name.
pub const ARN_PREFIX: &str = "arn:aws:s3:::";

/// Longest piece of a client's input quoted back in an error message, in bytes.
const MAX_QUOTE: usize = 64;

/// The action names the server asks about. S3's operations map onto them as in AWS: HeadObject
/// is [`GET_OBJECT`](actions::GET_OBJECT), HeadBucket and ListObjects(V2) are
/// [`LIST_BUCKET`](actions::LIST_BUCKET), CopyObject is `GET_OBJECT` on the source and
/// [`PUT_OBJECT`](actions::PUT_OBJECT) on the destination, CreateMultipartUpload, UploadPart
/// and CompleteMultipartUpload are `PUT_OBJECT`, DeleteObjects is
/// [`DELETE_OBJECT`](actions::DELETE_OBJECT) per key, DeleteBucketCors is
/// [`PUT_BUCKET_CORS`](actions::PUT_BUCKET_CORS) and DeletePublicAccessBlock is
/// [`PUT_BUCKET_PUBLIC_ACCESS_BLOCK`](actions::PUT_BUCKET_PUBLIC_ACCESS_BLOCK).
/// Matching is ASCII-case-insensitive, so the case here is only AWS's spelling.
pub mod actions {
    pub const GET_OBJECT: &str = "s3:GetObject";
    pub const GET_OBJECT_VERSION: &str = "s3:GetObjectVersion";
    pub const PUT_OBJECT: &str = "s3:PutObject";
    pub const DELETE_OBJECT: &str = "s3:DeleteObject";
    pub const DELETE_OBJECT_VERSION: &str = "s3:DeleteObjectVersion";
    pub const GET_OBJECT_ACL: &str = "s3:GetObjectAcl";
    pub const PUT_OBJECT_ACL: &str = "s3:PutObjectAcl";
    pub const GET_OBJECT_TAGGING: &str = "s3:GetObjectTagging";
    pub const PUT_OBJECT_TAGGING: &str = "s3:PutObjectTagging";
    pub const DELETE_OBJECT_TAGGING: &str = "s3:DeleteObjectTagging";
    pub const GET_OBJECT_ATTRIBUTES: &str = "s3:GetObjectAttributes";
    pub const ABORT_MULTIPART_UPLOAD: &str = "s3:AbortMultipartUpload";
    pub const LIST_MULTIPART_UPLOAD_PARTS: &str = "s3:ListMultipartUploadParts";
    pub const LIST_BUCKET: &str = "s3:ListBucket";
    pub const LIST_BUCKET_VERSIONS: &str = "s3:ListBucketVersions";
    pub const LIST_BUCKET_MULTIPART_UPLOADS: &str = "s3:ListBucketMultipartUploads";
    pub const LIST_ALL_MY_BUCKETS: &str = "s3:ListAllMyBuckets";
    pub const CREATE_BUCKET: &str = "s3:CreateBucket";
    pub const DELETE_BUCKET: &str = "s3:DeleteBucket";
    pub const GET_BUCKET_LOCATION: &str = "s3:GetBucketLocation";
    pub const GET_BUCKET_ACL: &str = "s3:GetBucketAcl";
    pub const PUT_BUCKET_ACL: &str = "s3:PutBucketAcl";
    pub const GET_BUCKET_CORS: &str = "s3:GetBucketCORS";
    pub const PUT_BUCKET_CORS: &str = "s3:PutBucketCORS";
    pub const GET_BUCKET_POLICY: &str = "s3:GetBucketPolicy";
    pub const PUT_BUCKET_POLICY: &str = "s3:PutBucketPolicy";
    pub const DELETE_BUCKET_POLICY: &str = "s3:DeleteBucketPolicy";
    pub const GET_BUCKET_POLICY_STATUS: &str = "s3:GetBucketPolicyStatus";
    pub const GET_BUCKET_PUBLIC_ACCESS_BLOCK: &str = "s3:GetBucketPublicAccessBlock";
    pub const PUT_BUCKET_PUBLIC_ACCESS_BLOCK: &str = "s3:PutBucketPublicAccessBlock";
    pub const GET_BUCKET_VERSIONING: &str = "s3:GetBucketVersioning";
    pub const PUT_BUCKET_VERSIONING: &str = "s3:PutBucketVersioning";
    pub const GET_BUCKET_TAGGING: &str = "s3:GetBucketTagging";
    pub const PUT_BUCKET_TAGGING: &str = "s3:PutBucketTagging";
    pub const GET_LIFECYCLE_CONFIGURATION: &str = "s3:GetLifecycleConfiguration";
    pub const PUT_LIFECYCLE_CONFIGURATION: &str = "s3:PutLifecycleConfiguration";
}

/// Condition keys the server may fill in a [`Context`]. Keys compare ASCII-case-insensitively
/// and are stored lowercased, as written here; any other key works the same way (a policy's
/// keys are opaque strings looked up in the context).
pub mod keys {
    /// The caller's IP address (`IpAddress`, `NotIpAddress`).
    pub const SOURCE_IP: &str = "aws:sourceip";
    /// `true` when the request came over TLS, else `false` (`Bool`).
    pub const SECURE_TRANSPORT: &str = "aws:securetransport";
    /// The request time, ISO 8601 (`Date*`).
    pub const CURRENT_TIME: &str = "aws:currenttime";
    /// The request time, seconds since the epoch (`Date*`, `Numeric*`).
    pub const EPOCH_TIME: &str = "aws:epochtime";
    /// The `Referer` header.
    pub const REFERER: &str = "aws:referer";
    /// The `User-Agent` header.
    pub const USER_AGENT: &str = "aws:useragent";
    /// The caller's user name (absent for anonymous callers); also `${aws:username}`.
    pub const USERNAME: &str = "aws:username";
    /// The caller's unique id.
    pub const USERID: &str = "aws:userid";
    /// ListObjects' `prefix`.
    pub const PREFIX: &str = "s3:prefix";
    /// ListObjects' `delimiter`.
    pub const DELIMITER: &str = "s3:delimiter";
    /// ListObjects' `max-keys` (`Numeric*`).
    pub const MAX_KEYS: &str = "s3:max-keys";
    /// The canned ACL of a write (`x-amz-acl`).
    pub const X_AMZ_ACL: &str = "s3:x-amz-acl";
    /// `x-amz-content-sha256`.
    pub const X_AMZ_CONTENT_SHA256: &str = "s3:x-amz-content-sha256";
    /// `x-amz-copy-source`.
    pub const X_AMZ_COPY_SOURCE: &str = "s3:x-amz-copy-source";
    /// `x-amz-metadata-directive`.
    pub const X_AMZ_METADATA_DIRECTIVE: &str = "s3:x-amz-metadata-directive";
    /// `x-amz-server-side-encryption`.
    pub const X_AMZ_SERVER_SIDE_ENCRYPTION: &str = "s3:x-amz-server-side-encryption";
    /// `x-amz-storage-class`.
    pub const X_AMZ_STORAGE_CLASS: &str = "s3:x-amz-storage-class";
    /// The `versionId` a request names.
    pub const VERSION_ID: &str = "s3:versionid";
    /// `AWS4-HMAC-SHA256` or `AWS` (SigV2).
    pub const SIGNATURE_VERSION: &str = "s3:signatureversion";
    /// `REST-HEADER`, `REST-QUERY-STRING` or `POST`.
    pub const AUTH_TYPE: &str = "s3:authtype";
    /// Followed by a tag key: the value of that tag of the object the request is about.
    pub const EXISTING_OBJECT_TAG_PREFIX: &str = "s3:existingobjecttag/";
}

/// The ARN of a bucket, as a [`Request`]'s resource for bucket operations.
pub fn bucket_arn(bucket: &str) -> String {
    format!("{ARN_PREFIX}{bucket}")
}

/// The ARN of an object, as a [`Request`]'s resource for object operations.
pub fn object_arn(bucket: &str, key: &str) -> String {
    format!("{ARN_PREFIX}{bucket}/{key}")
}

/// Why a policy was refused: every variant is S3's `MalformedPolicy` (400), and the text is
/// the message, saying what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// Over [`MAX_POLICY_LEN`].
    #[error("Policies must be at most {max} bytes; this one is {len}.")]
    TooLarge { len: usize, max: usize },
    /// Not JSON, or not a JSON object.
    #[error("Policies must be valid JSON and the first byte must be '{{': {0}")]
    Json(String),
    /// A statement (or the policy) lacks an element it must have.
    #[error("Missing required field {0}")]
    MissingField(&'static str),
    /// `Effect` is neither `Allow` nor `Deny`.
    #[error("Invalid effect: {0}")]
    InvalidEffect(String),
    /// A resource that is not an S3 ARN of the bucket the policy is put on.
    #[error("Policy has invalid resource: {0}")]
    InvalidResource(String),
    /// A principal that is not `*`, a user, an account or a known principal type.
    #[error("Invalid principal in policy: {0}")]
    InvalidPrincipal(String),
    /// An action that is not `*` nor `s3:Name` (with wildcards).
    #[error("Policy has invalid action: {0}")]
    InvalidAction(String),
    /// An unknown condition operator (or qualifier, or `IfExists` where it cannot be).
    #[error("Invalid Condition type : {0}")]
    UnknownOperator(String),
    /// A condition value of the wrong kind for its operator (a bad number, date, CIDR or
    /// boolean), or a condition block of the wrong shape.
    #[error("Invalid Condition: {0}")]
    InvalidCondition(String),
    /// Anything else: a bad `Version`, an unknown element, an element of the wrong type,
    /// both `Action` and `NotAction`, a repeated `Sid`.
    #[error("Invalid policy syntax: {0}")]
    Syntax(String),
}

impl PolicyError {
    /// The S3 error code, [`MALFORMED_POLICY`].
    pub fn code(&self) -> &'static str {
        MALFORMED_POLICY
    }

    /// The HTTP status, 400.
    pub fn status(&self) -> u16 {
        400
    }
}

/// At most [`MAX_QUOTE`] bytes of client input, cut on a character boundary, for messages.
fn quote(s: &str) -> String {
    if s.len() <= MAX_QUOTE {
        return s.to_owned();
    }
    let mut end = MAX_QUOTE;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

fn syntax(why: impl Into<String>) -> PolicyError {
    PolicyError::Syntax(why.into())
}

/// The condition values of a request: key (ASCII-lowercased) to its values. A key may have
/// several values (`ForAnyValue:`/`ForAllValues:` compare them as a set); a key the request
/// has no value for is simply absent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Context {
    values: BTreeMap<String, Vec<String>>,
}

impl Context {
    pub fn new() -> Context {
        Context::default()
    }

    /// Adds a value to `key` (after any it has).
    pub fn insert(&mut self, key: &str, value: impl Into<String>) {
        self.values
            .entry(key.to_ascii_lowercase())
            .or_default()
            .push(value.into());
    }

    /// Sets `key` to exactly `values` (none removes it).
    pub fn set(&mut self, key: &str, values: Vec<String>) {
        let key = key.to_ascii_lowercase();
        if values.is_empty() {
            self.values.remove(&key);
        } else {
            self.values.insert(key, values);
        }
    }

    /// [`insert`](Context::insert), by value, for building a context in one expression.
    pub fn with(mut self, key: &str, value: impl Into<String>) -> Context {
        self.insert(key, value);
        self
    }

    /// The values of `key` (any case); empty when the request has none.
    pub fn get(&self, key: &str) -> &[String] {
        if key.bytes().any(|b| b.is_ascii_uppercase()) {
            self.lookup(&key.to_ascii_lowercase())
        } else {
            self.lookup(key)
        }
    }

    /// The values of an already lowercased key.
    fn lookup(&self, key: &str) -> &[String] {
        self.values.get(key).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The one value of `key`, for a policy variable; `None` when it has none or several.
    fn single(&self, key: &str) -> Option<&str> {
        match self.get(key) {
            [one] => Some(one),
            _ => None,
        }
    }
}

/// What a policy is asked about: who does what to which resource, in what circumstances.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The caller. A bearer token is [`Principal::Authenticated`]: only `*` names it.
    pub principal: Principal<'a>,
    /// The action, such as `s3:GetObject` (any case); see [`actions`].
    pub action: &'a str,
    /// The resource ARN: [`bucket_arn`] or [`object_arn`].
    pub resource: &'a str,
    /// The condition values of the request.
    pub context: &'a Context,
}

/// What a policy says about a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Decision {
    /// A `Deny` statement applies: refused, whatever else allows it.
    ExplicitDeny,
    /// An `Allow` statement applies and no `Deny` does.
    Allow,
    /// No statement applies: the policy neither allows nor denies.
    NotApplicable,
}

/// A policy's language version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Version {
    /// `2008-10-17`, also what a policy without `Version` is: no policy variables.
    V2008_10_17,
    /// `2012-10-17`: `${...}` in resources and condition values are policy variables.
    V2012_10_17,
}

/// A statement's effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Effect {
    Allow,
    Deny,
}

/// An element and its `Not` form: `Principal`/`NotPrincipal`, `Action`/`NotAction`,
/// `Resource`/`NotResource`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Targets<T> {
    /// The statement applies to what the list names.
    Only(T),
    /// The statement applies to everything the list does not name.
    Except(T),
}

/// Who a `Principal` element names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principals {
    /// `"*"`, `{"AWS": "*"}` or a list with `"*"` in it: every caller, anonymous included.
    Any,
    /// These principals.
    Some(Vec<PrincipalId>),
}

/// One principal of a `Principal` element.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PrincipalId {
    /// A user or account, by name: `alice` and `123456789012` as given,
    /// `arn:aws:iam::123456789012:user/alice` and `arn:aws:iam:::user/path/alice` as `alice`,
    /// `arn:aws:iam::123456789012:root` as `123456789012`; a `CanonicalUser` id as given
    /// (Yutu's canonical ids are user names). Matches [`Principal::User`] of that name.
    User(String),
    /// Any other principal S3 accepts (a role, a service, a federated user), kept as written
    /// with its type (`AWS`, `Service`, `Federated`): it matches no Yutu caller.
    Other { kind: String, id: String },
}

/// `ForAnyValue:` or `ForAllValues:` in front of a condition operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Qualifier {
    /// Some value of the key satisfies the operator (false when the key has none).
    ForAnyValue,
    /// Every value of the key satisfies the operator (true when the key has none).
    ForAllValues,
}

/// A condition operator, without its qualifier and `IfExists`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operator {
    StringEquals,
    StringNotEquals,
    StringEqualsIgnoreCase,
    StringNotEqualsIgnoreCase,
    /// Case-sensitive, with `*` and `?` wildcards.
    StringLike,
    StringNotLike,
    NumericEquals,
    NumericNotEquals,
    NumericLessThan,
    NumericLessThanEquals,
    NumericGreaterThan,
    NumericGreaterThanEquals,
    /// Dates are ISO 8601 (`2024-05-01`, `2024-05-01T12:00:00Z`, with a fraction or an
    /// offset) or seconds since the epoch, on both sides.
    DateEquals,
    DateNotEquals,
    DateLessThan,
    DateLessThanEquals,
    DateGreaterThan,
    DateGreaterThanEquals,
    /// `true` or `false`, ASCII-case-insensitively.
    Bool,
    /// Compared as text (the base64 of the bytes on both sides).
    BinaryEquals,
    /// The key's value is an IP address inside one of the CIDR blocks (or equal to one of the
    /// addresses); IPv4 blocks also hold IPv4-mapped IPv6 addresses.
    IpAddress,
    NotIpAddress,
    /// ARNs, like [`StringLike`](Operator::StringLike) (S3's ARN operators allow wildcards
    /// too; comparing by ARN segment would give the same answer for S3 ARNs).
    ArnEquals,
    ArnLike,
    ArnNotEquals,
    ArnNotLike,
    /// `true`: the key is absent; `false`: it is present.
    Null,
}

/// Every operator by its policy name.
const OPERATORS: [(&str, Operator); 27] = [
    ("StringEquals", Operator::StringEquals),
    ("StringNotEquals", Operator::StringNotEquals),
    ("StringEqualsIgnoreCase", Operator::StringEqualsIgnoreCase),
    (
        "StringNotEqualsIgnoreCase",
        Operator::StringNotEqualsIgnoreCase,
    ),
    ("StringLike", Operator::StringLike),
    ("StringNotLike", Operator::StringNotLike),
    ("NumericEquals", Operator::NumericEquals),
    ("NumericNotEquals", Operator::NumericNotEquals),
    ("NumericLessThan", Operator::NumericLessThan),
    ("NumericLessThanEquals", Operator::NumericLessThanEquals),
    ("NumericGreaterThan", Operator::NumericGreaterThan),
    (
        "NumericGreaterThanEquals",
        Operator::NumericGreaterThanEquals,
    ),
    ("DateEquals", Operator::DateEquals),
    ("DateNotEquals", Operator::DateNotEquals),
    ("DateLessThan", Operator::DateLessThan),
    ("DateLessThanEquals", Operator::DateLessThanEquals),
    ("DateGreaterThan", Operator::DateGreaterThan),
    ("DateGreaterThanEquals", Operator::DateGreaterThanEquals),
    ("Bool", Operator::Bool),
    ("BinaryEquals", Operator::BinaryEquals),
    ("IpAddress", Operator::IpAddress),
    ("NotIpAddress", Operator::NotIpAddress),
    ("ArnEquals", Operator::ArnEquals),
    ("ArnLike", Operator::ArnLike),
    ("ArnNotEquals", Operator::ArnNotEquals),
    ("ArnNotLike", Operator::ArnNotLike),
    ("Null", Operator::Null),
];

impl Operator {
    /// The operator's policy name.
    pub fn name(self) -> &'static str {
        OPERATORS
            .iter()
            .find(|(_, op)| *op == self)
            .map_or("", |(name, _)| name)
    }

    /// The operator named `name` (ASCII-case-insensitively).
    pub fn parse(name: &str) -> Option<Operator> {
        OPERATORS
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, op)| *op)
    }

    /// Whether the operator is the negation of another: it holds when the key's value
    /// matches *none* of the policy's values, and when the key is absent.
    pub fn negated(self) -> bool {
        use Operator::*;
        matches!(
            self,
            StringNotEquals
                | StringNotEqualsIgnoreCase
                | StringNotLike
                | NumericNotEquals
                | DateNotEquals
                | NotIpAddress
                | ArnNotEquals
                | ArnNotLike
        )
    }
}

impl fmt::Display for Operator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An IP address block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    /// The network address (host bits cleared).
    pub network: IpAddr,
    /// The prefix length: up to 32 for IPv4, 128 for IPv6.
    pub prefix: u8,
}

impl Cidr {
    /// `a.b.c.d/n`, `x:y::/n`, or a lone address (a block of one).
    pub fn parse(s: &str) -> Option<Cidr> {
        let s = s.trim();
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => {
                if p.is_empty() || p.len() > 3 || !p.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                (a, Some(p.parse::<u8>().ok()?))
            }
            None => (s, None),
        };
        let ip: IpAddr = addr.parse().ok()?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let prefix = prefix.unwrap_or(max);
        if prefix > max {
            return None;
        }
        Some(Cidr {
            network: mask(ip, prefix),
            prefix,
        })
    }

    /// Whether `ip` is in the block (an IPv4-mapped IPv6 address counts as its IPv4 one).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        ip.is_ipv4() == self.network.is_ipv4() && mask(ip, self.prefix) == self.network
    }
}

fn mask(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let m = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4((u32::from(v4) & m).into())
        }
        IpAddr::V6(v6) => {
            let m = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6((u128::from(v6) & m).into())
        }
    }
}

/// A condition's values, parsed once for the operators that compare other than as text.
#[derive(Debug, Clone, PartialEq)]
enum Parsed {
    Text,
    Numbers(Vec<f64>),
    Dates(Vec<i64>),
    Bools(Vec<bool>),
    Cidrs(Vec<Cidr>),
}

/// One test of a `Condition` element: `{"Operator": {"key": values}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    pub operator: Operator,
    pub qualifier: Option<Qualifier>,
    /// `...IfExists`: the condition also holds when the key is absent.
    pub if_exists: bool,
    /// The key, ASCII-lowercased.
    pub key: String,
    /// The values as written (JSON numbers and booleans as their text; `Bool` and `Null`
    /// values lowercased).
    pub values: Vec<String>,
    parsed: Parsed,
}

/// One statement.
#[derive(Debug, Clone, PartialEq)]
pub struct Statement {
    pub sid: Option<String>,
    pub effect: Effect,
    pub principal: Targets<Principals>,
    /// Action patterns, ASCII-lowercased.
    pub action: Targets<Vec<String>>,
    /// Resource ARN patterns, as written.
    pub resource: Targets<Vec<String>>,
    /// All must hold for the statement to apply.
    pub conditions: Vec<Condition>,
}

/// A parsed bucket policy and the text it was parsed from.
#[derive(Debug, Clone, PartialEq)]
pub struct BucketPolicy {
    text: String,
    version: Version,
    id: Option<String>,
    statements: Vec<Statement>,
}

impl BucketPolicy {
    /// Parses and validates a policy put on `bucket`. Refuses, as S3 does: text over
    /// [`MAX_POLICY_LEN`], anything but a JSON object, unknown elements, a bad `Version`, no
    /// statements, statements without `Effect`, `Principal`, `Action` or `Resource` (or
    /// their `Not` forms; both forms at once), an unknown effect, resources that are not ARNs
    /// of `bucket` or of its objects, unknown condition operators and condition values of the
    /// wrong kind, and a `Sid` used twice. Element names are case-sensitive, as in AWS.
    pub fn parse(text: &str, bucket: &str) -> Result<BucketPolicy, PolicyError> {
        if text.len() > MAX_POLICY_LEN {
            return Err(PolicyError::TooLarge {
                len: text.len(),
                max: MAX_POLICY_LEN,
            });
        }
        // serde_json bounds nesting (128 levels), so hostile input cannot exhaust the stack.
        let value: Value =
            serde_json::from_str(text).map_err(|e| PolicyError::Json(e.to_string()))?;
        let Value::Object(top) = value else {
            return Err(PolicyError::Json("the policy is not a JSON object".into()));
        };
        let mut version = Version::V2008_10_17;
        let mut id = None;
        let mut list = None;
        for (name, v) in &top {
            match name.as_str() {
                "Version" => {
                    version = match v.as_str() {
                        Some(VERSION_2012_10_17) => Version::V2012_10_17,
                        Some(VERSION_2008_10_17) => Version::V2008_10_17,
                        _ => {
                            let why = format!(
                                "Version must be {VERSION_2012_10_17:?} or {VERSION_2008_10_17:?}"
                            );
                            return Err(syntax(why));
                        }
                    }
                }
                "Id" => id = Some(string(v, "Id")?),
                "Statement" => list = Some(v),
                other => return Err(syntax(format!("unknown field {:?}", quote(other)))),
            }
        }
        let statements = match list {
            None => return Err(PolicyError::MissingField("Statement")),
            Some(Value::Object(one)) => vec![parse_statement(one, bucket)?],
            Some(Value::Array(many)) => many
                .iter()
                .map(|s| match s {
                    Value::Object(s) => parse_statement(s, bucket),
                    _ => Err(syntax("a statement is not a JSON object")),
                })
                .collect::<Result<Vec<_>, _>>()?,
            Some(_) => return Err(syntax("Statement is neither an object nor an array")),
        };
        if statements.is_empty() {
            return Err(syntax("the policy has no statements"));
        }
        // Some tools write `"Sid": ""` on every statement; only real ids must be unique.
        let mut sids: Vec<&str> = statements
            .iter()
            .filter_map(|s| s.sid.as_deref())
            .filter(|s| !s.is_empty())
            .collect();
        sids.sort_unstable();
        if let Some(w) = sids.windows(2).find(|w| w[0] == w[1]) {
            return Err(syntax(format!(
                "Statement IDs (SID) must be unique: {:?}",
                quote(w[0])
            )));
        }
        Ok(BucketPolicy {
            text: text.to_owned(),
            version,
            id,
            statements,
        })
    }

    /// The text the policy was parsed from, exactly: GetBucketPolicy's answer.
    pub fn text(&self) -> &str {
        &self.text
    }

    pub fn version(&self) -> Version {
        self.version
    }

    pub fn id(&self) -> Option<&str> {
        self.id.as_deref()
    }

    pub fn statements(&self) -> &[Statement] {
        &self.statements
    }

    /// What the policy says about `req`: [`Decision::ExplicitDeny`] if a `Deny` statement
    /// applies, else [`Decision::Allow`] if an `Allow` statement does, else
    /// [`Decision::NotApplicable`]. A statement applies when its principal, action and
    /// resource elements all match and all its conditions hold.
    pub fn evaluate(&self, req: &Request) -> Decision {
        let vars = (self.version == Version::V2012_10_17).then_some(req.context);
        let action = req.action.to_ascii_lowercase();
        let mut allowed = false;
        for s in &self.statements {
            if s.applies(req, &action, vars) {
                match s.effect {
                    Effect::Deny => return Decision::ExplicitDeny,
                    Effect::Allow => allowed = true,
                }
            }
        }
        if allowed {
            Decision::Allow
        } else {
            Decision::NotApplicable
        }
    }

    /// What the policy says about a request that names every object of a bucket at once (a
    /// KV call names its keys in its body, and a grant such as a presence table's covers
    /// them all): `req.resource` is the objects' common ARN prefix, [`object_arn`] of the
    /// bucket and `""`. A `Deny` statement applies when its resource could name *some*
    /// object of the bucket, an `Allow` statement only when it names *every* one; so a call
    /// is refused where a per-object check could refuse one of its keys, and admitted by the
    /// policy only where it would admit all of them (fail closed, where evaluating the
    /// request as the literal object `*` let a `Deny` on a prefix pass).
    pub fn evaluate_every_object(&self, req: &Request) -> Decision {
        let vars = (self.version == Version::V2012_10_17).then_some(req.context);
        let action = req.action.to_ascii_lowercase();
        let prefix: Vec<char> = req.resource.chars().collect();
        let mut allowed = false;
        for s in &self.statements {
            let common = s.principal_matches(req.principal)
                && s.action_matches(&action)
                && s.conditions.iter().all(|c| c.holds(req.context, vars));
            if !common {
                continue;
            }
            match s.effect {
                Effect::Deny if s.resource_reaches(&prefix, vars, Reach::Some) => {
                    return Decision::ExplicitDeny
                }
                Effect::Allow if s.resource_reaches(&prefix, vars, Reach::Every) => allowed = true,
                _ => {}
            }
        }
        if allowed {
            Decision::Allow
        } else {
            Decision::NotApplicable
        }
    }

    /// Whether the policy makes the bucket public, as GetBucketPolicyStatus reports it. As in
    /// AWS, a policy is public when some `Allow` statement is granted to every caller
    /// (`Principal` `*`, or a `NotPrincipal` other than `*`) and none of its conditions pins
    /// it to fixed values of a key that names who or where the caller is. A condition pins
    /// when it is not `...IfExists` nor `ForAllValues:` (both hold when the key is absent)
    /// and is either `IpAddress` on `aws:SourceIp` with every block at least a /8 (IPv4) or
    /// a /32 (IPv6) — Yutu's line for "not the whole internet" — or `StringEquals`,
    /// `StringEqualsIgnoreCase`, `StringLike`, `ArnEquals` or `ArnLike` on one of
    /// `aws:SourceArn`, `aws:SourceVpc`, `aws:SourceVpce`, `aws:SourceAccount`,
    /// `aws:SourceOwner`, `aws:PrincipalOrgID`, `aws:PrincipalAccount`, `aws:PrincipalArn`,
    /// `aws:userid`, `aws:username`, `s3:DataAccessPointArn` or `s3:DataAccessPointAccount`
    /// with no value holding a wildcard (`*`, `?`) or a policy variable. `Deny` statements are
    /// not weighed (AWS's analysis may find a policy whose denies close what it allows
    /// non-public; here it is public), so the answer errs towards public.
    pub fn is_public(&self) -> bool {
        self.statements.iter().any(|s| {
            s.effect == Effect::Allow
                && matches!(
                    s.principal,
                    Targets::Only(Principals::Any) | Targets::Except(Principals::Some(_))
                )
                && !s.conditions.iter().any(Condition::pins)
        })
    }
}

impl Statement {
    fn applies(&self, req: &Request, action: &str, vars: Option<&Context>) -> bool {
        self.principal_matches(req.principal)
            && self.action_matches(action)
            && self.resource_matches(req.resource, vars)
            && self.conditions.iter().all(|c| c.holds(req.context, vars))
    }

    fn principal_matches(&self, who: Principal) -> bool {
        let named = |p: &Principals| match p {
            Principals::Any => true,
            Principals::Some(ids) => match who {
                Principal::User(name) => ids
                    .iter()
                    .any(|id| matches!(id, PrincipalId::User(u) if u == name)),
                Principal::Anonymous | Principal::Authenticated => false,
            },
        };
        match &self.principal {
            Targets::Only(p) => named(p),
            Targets::Except(p) => !named(p),
        }
    }

    fn action_matches(&self, action: &str) -> bool {
        let value: Vec<char> = action.chars().collect();
        let any = |list: &[String]| list.iter().any(|p| glob(&tokens(p), &value));
        match &self.action {
            Targets::Only(list) => any(list),
            Targets::Except(list) => !any(list),
        }
    }

    /// Whether the statement's resource element names some (`Reach::Some`) or every
    /// (`Reach::Every`) string that starts with `prefix` and goes on past it (an object ARN
    /// of the bucket whose ARN prefix it is). A `NotResource` names some where its patterns
    /// do not name every one, and every one where they name none.
    fn resource_reaches(&self, prefix: &[char], vars: Option<&Context>, reach: Reach) -> bool {
        let any = |list: &[String], reach: Reach| {
            list.iter().any(|p| {
                expand(p, vars, true).is_some_and(|toks| pattern_reaches(&toks, prefix, reach))
            })
        };
        match (&self.resource, reach) {
            (Targets::Only(list), _) => any(list, reach),
            (Targets::Except(list), Reach::Some) => !any(list, Reach::Every),
            (Targets::Except(list), Reach::Every) => !any(list, Reach::Some),
        }
    }

    fn resource_matches(&self, resource: &str, vars: Option<&Context>) -> bool {
        let value: Vec<char> = resource.chars().collect();
        let any = |list: &[String]| {
            list.iter()
                .any(|p| expand(p, vars, true).is_some_and(|toks| glob(&toks, &value)))
        };
        match &self.resource {
            Targets::Only(list) => any(list),
            Targets::Except(list) => !any(list),
        }
    }
}

impl Condition {
    /// Whether the condition holds for the request's `context`; `vars` is the context again
    /// when the policy has policy variables.
    fn holds(&self, context: &Context, vars: Option<&Context>) -> bool {
        let values = context.lookup(&self.key);
        if self.operator == Operator::Null {
            // Null's values are booleans: `true` wants the key absent.
            return match &self.parsed {
                Parsed::Bools(want) => want.contains(&values.is_empty()),
                _ => false,
            };
        }
        if values.is_empty() {
            if self.if_exists {
                return true;
            }
            return match self.qualifier {
                Some(Qualifier::ForAllValues) => true,
                Some(Qualifier::ForAnyValue) => false,
                None => self.operator.negated(),
            };
        }
        let negated = self.operator.negated();
        // Whether one value of the key satisfies the operator: a positive operator wants it
        // to match some policy value, a negated one to match none. A value that cannot be
        // read as the operator's kind (a number, a date, an address) satisfies neither.
        let satisfies = |v: &String| match self.matches_any(v, vars) {
            Some(m) => m != negated,
            None => false,
        };
        match self.qualifier {
            Some(Qualifier::ForAnyValue) => values.iter().any(satisfies),
            Some(Qualifier::ForAllValues) => values.iter().all(satisfies),
            // A plain positive operator holds if some value matches; a plain negated one if
            // none does (for a single-valued key, both are the obvious test).
            None if negated => values.iter().all(satisfies),
            None => values.iter().any(satisfies),
        }
    }

    /// Whether the request value `v` matches some policy value under the operator's positive
    /// form; `None` when `v` is not of the operator's kind.
    fn matches_any(&self, v: &str, vars: Option<&Context>) -> Option<bool> {
        use Operator::*;
        Some(match (&self.parsed, self.operator) {
            (Parsed::Numbers(ps), op) => {
                let x = parse_number(v)?;
                ps.iter().any(|p| compare(op, x.partial_cmp(p)))
            }
            (Parsed::Dates(ps), op) => {
                let x = parse_date(v)?;
                ps.iter().any(|p| compare(op, Some(x.cmp(p))))
            }
            (Parsed::Bools(ps), _) => {
                let x = parse_bool(v)?;
                ps.contains(&x)
            }
            (Parsed::Cidrs(ps), _) => {
                let ip: IpAddr = v.trim().parse().ok()?;
                ps.iter().any(|c| c.contains(ip))
            }
            (Parsed::Text, StringEquals | StringNotEquals | BinaryEquals) => self
                .values
                .iter()
                .any(|p| literal(p, vars).is_some_and(|p| p == v)),
            (Parsed::Text, StringEqualsIgnoreCase | StringNotEqualsIgnoreCase) => self
                .values
                .iter()
                .any(|p| literal(p, vars).is_some_and(|p| p.to_lowercase() == v.to_lowercase())),
            (Parsed::Text, _) => {
                let value: Vec<char> = v.chars().collect();
                self.values
                    .iter()
                    .any(|p| expand(p, vars, true).is_some_and(|toks| glob(&toks, &value)))
            }
        })
    }

    /// Whether the condition pins its statement to fixed callers or networks (see
    /// [`BucketPolicy::is_public`]).
    fn pins(&self) -> bool {
        const PINNING_KEYS: [&str; 12] = [
            "aws:sourcearn",
            "aws:sourcevpc",
            "aws:sourcevpce",
            "aws:sourceaccount",
            "aws:sourceowner",
            "aws:principalorgid",
            "aws:principalaccount",
            "aws:principalarn",
            "aws:userid",
            "aws:username",
            "s3:dataaccesspointarn",
            "s3:dataaccesspointaccount",
        ];
        use Operator::*;
        if self.if_exists || self.qualifier == Some(Qualifier::ForAllValues) {
            return false;
        }
        match (self.operator, &self.parsed) {
            (IpAddress, Parsed::Cidrs(blocks)) => {
                self.key == keys::SOURCE_IP
                    && blocks
                        .iter()
                        .all(|c| c.prefix >= if c.network.is_ipv4() { 8 } else { 32 })
            }
            (StringEquals | StringEqualsIgnoreCase | StringLike | ArnEquals | ArnLike, _) => {
                PINNING_KEYS.contains(&self.key.as_str())
                    && self
                        .values
                        .iter()
                        .all(|v| !v.is_empty() && !v.contains(['*', '?']) && !v.contains("${"))
            }
            _ => false,
        }
    }
}

/// Whether an ordering satisfies a numeric or date operator's positive form.
fn compare(op: Operator, ord: Option<std::cmp::Ordering>) -> bool {
    use std::cmp::Ordering::*;
    use Operator::*;
    match (op, ord) {
        (_, None) => false,
        (NumericEquals | NumericNotEquals | DateEquals | DateNotEquals, Some(o)) => o == Equal,
        (NumericLessThan | DateLessThan, Some(o)) => o == Less,
        (NumericLessThanEquals | DateLessThanEquals, Some(o)) => o != Greater,
        (NumericGreaterThan | DateGreaterThan, Some(o)) => o == Greater,
        (NumericGreaterThanEquals | DateGreaterThanEquals, Some(o)) => o != Less,
        _ => false,
    }
}

/// A string element (`Id`, `Sid`, `Effect`).
fn string(v: &Value, what: &str) -> Result<String, PolicyError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        _ => Err(syntax(format!("{what} is not a string"))),
    }
}

/// A string or a non-empty array of strings (`Action`, `Resource`, a principal type's ids).
fn string_list(v: &Value, what: &str) -> Result<Vec<String>, PolicyError> {
    let bad = || syntax(format!("{what} must be a string or an array of strings"));
    match v {
        Value::String(s) => Ok(vec![s.clone()]),
        Value::Array(items) if !items.is_empty() => items
            .iter()
            .map(|i| i.as_str().map(str::to_owned).ok_or_else(bad))
            .collect(),
        _ => Err(bad()),
    }
}

/// Exactly one of an element and its `Not` form.
fn one_of<'a>(
    s: &'a Map<String, Value>,
    name: &'static str,
    not_name: &'static str,
) -> Result<Targets<&'a Value>, PolicyError> {
    match (s.get(name), s.get(not_name)) {
        (Some(v), None) => Ok(Targets::Only(v)),
        (None, Some(v)) => Ok(Targets::Except(v)),
        (None, None) => Err(PolicyError::MissingField(name)),
        (Some(_), Some(_)) => Err(syntax(format!(
            "a statement has both {name} and {not_name}"
        ))),
    }
}

fn parse_statement(s: &Map<String, Value>, bucket: &str) -> Result<Statement, PolicyError> {
    const FIELDS: [&str; 9] = [
        "Sid",
        "Effect",
        "Principal",
        "NotPrincipal",
        "Action",
        "NotAction",
        "Resource",
        "NotResource",
        "Condition",
    ];
    if let Some(other) = s.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(syntax(format!(
            "unknown field {:?} in a statement",
            quote(other)
        )));
    }
    let sid = s.get("Sid").map(|v| string(v, "Sid")).transpose()?;
    let effect = match s.get("Effect") {
        None => return Err(PolicyError::MissingField("Effect")),
        Some(v) => match string(v, "Effect")?.as_str() {
            "Allow" => Effect::Allow,
            "Deny" => Effect::Deny,
            other => return Err(PolicyError::InvalidEffect(quote(other))),
        },
    };
    let principal = match one_of(s, "Principal", "NotPrincipal")? {
        Targets::Only(v) => Targets::Only(parse_principals(v)?),
        Targets::Except(v) => Targets::Except(parse_principals(v)?),
    };
    let parse_actions = |v: &Value, what| -> Result<Vec<String>, PolicyError> {
        let list = string_list(v, what)?;
        for a in &list {
            if !valid_action(a) {
                return Err(PolicyError::InvalidAction(quote(a)));
            }
        }
        Ok(list.iter().map(|a| a.to_ascii_lowercase()).collect())
    };
    let action = match one_of(s, "Action", "NotAction")? {
        Targets::Only(v) => Targets::Only(parse_actions(v, "Action")?),
        Targets::Except(v) => Targets::Except(parse_actions(v, "NotAction")?),
    };
    let parse_resources = |v: &Value, what| -> Result<Vec<String>, PolicyError> {
        let list = string_list(v, what)?;
        for r in &list {
            if !names_bucket(r, bucket) {
                return Err(PolicyError::InvalidResource(quote(r)));
            }
        }
        Ok(list)
    };
    let resource = match one_of(s, "Resource", "NotResource")? {
        Targets::Only(v) => Targets::Only(parse_resources(v, "Resource")?),
        Targets::Except(v) => Targets::Except(parse_resources(v, "NotResource")?),
    };
    let conditions = match s.get("Condition") {
        None => Vec::new(),
        Some(Value::Object(blocks)) => parse_conditions(blocks)?,
        Some(_) => return Err(syntax("Condition is not a JSON object")),
    };
    Ok(Statement {
        sid,
        effect,
        principal,
        action,
        resource,
        conditions,
    })
}

/// `*`, or `s3:` and a name of letters, digits and wildcards.
fn valid_action(a: &str) -> bool {
    if a == "*" {
        return true;
    }
    let Some(prefix) = a.get(..3) else {
        return false;
    };
    let name = &a[3..];
    prefix.eq_ignore_ascii_case("s3:")
        && !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'*' || b == b'?')
}

/// Whether `resource` is an S3 ARN whose bucket part (a pattern) matches `bucket`: the
/// bucket itself, its objects, or patterns over them; S3 refuses a policy about other
/// buckets with "Policy has invalid resource".
fn names_bucket(resource: &str, bucket: &str) -> bool {
    let Some(rest) = resource.strip_prefix(ARN_PREFIX) else {
        return false;
    };
    let bucket_part = rest.split('/').next().unwrap_or("");
    let value: Vec<char> = bucket.chars().collect();
    !bucket_part.is_empty() && glob(&tokens(bucket_part), &value)
}

fn parse_principals(v: &Value) -> Result<Principals, PolicyError> {
    let map = match v {
        Value::String(s) if s == "*" => return Ok(Principals::Any),
        Value::Object(map) if !map.is_empty() => map,
        _ => {
            return Err(PolicyError::InvalidPrincipal(
                "a principal is \"*\" or an object such as {\"AWS\": [...]}".into(),
            ))
        }
    };
    // The whole element is read (and so checked) even once a `*` makes it everyone.
    let mut any = false;
    let mut ids = Vec::new();
    for (kind, list) in map {
        let list = string_list(list, "a principal")
            .map_err(|_| PolicyError::InvalidPrincipal(quote(kind)))?;
        for id in list {
            let id = id.trim();
            // Wildcards are allowed only as the whole of an `AWS` principal, as in AWS.
            if id.is_empty()
                || id.contains(char::is_whitespace)
                || (id.contains(['*', '?']) && (kind != "AWS" || id != "*"))
            {
                return Err(PolicyError::InvalidPrincipal(quote(id)));
            }
            match kind.as_str() {
                "AWS" if id == "*" => any = true,
                "AWS" => ids.push(aws_principal(id)?),
                "CanonicalUser" => ids.push(PrincipalId::User(id.to_owned())),
                "Service" | "Federated" => ids.push(PrincipalId::Other {
                    kind: kind.clone(),
                    id: id.to_owned(),
                }),
                other => return Err(PolicyError::InvalidPrincipal(quote(other))),
            }
        }
    }
    Ok(if any {
        Principals::Any
    } else {
        Principals::Some(ids)
    })
}

/// An `AWS` principal: an IAM ARN or a bare user name or account id.
fn aws_principal(id: &str) -> Result<PrincipalId, PolicyError> {
    let bad = || PolicyError::InvalidPrincipal(quote(id));
    if !id.starts_with("arn:") {
        return Ok(PrincipalId::User(id.to_owned()));
    }
    // arn:PARTITION:iam::ACCOUNT:RESOURCE, ACCOUNT possibly empty.
    let parts: Vec<&str> = id.splitn(6, ':').collect();
    let [_, partition, service, region, account, resource] = parts[..] else {
        return Err(bad());
    };
    if !partition.starts_with("aws") || service != "iam" || !region.is_empty() {
        return Err(bad());
    }
    if resource == "root" {
        if account.is_empty() {
            return Err(bad());
        }
        return Ok(PrincipalId::User(account.to_owned()));
    }
    if let Some(path) = resource.strip_prefix("user/") {
        // A user's path comes before its name, which holds no '/'.
        return match path.rsplit('/').next() {
            Some(name) if !name.is_empty() => Ok(PrincipalId::User(name.to_owned())),
            _ => Err(bad()),
        };
    }
    if resource.contains('/') {
        return Ok(PrincipalId::Other {
            kind: "AWS".into(),
            id: id.to_owned(),
        });
    }
    Err(bad())
}

/// The text of a condition value: strings as they are, numbers and booleans as JSON writes
/// them.
fn condition_value(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn parse_conditions(blocks: &Map<String, Value>) -> Result<Vec<Condition>, PolicyError> {
    let mut out = Vec::new();
    for (name, block) in blocks {
        let unknown = || PolicyError::UnknownOperator(quote(name));
        let (qualifier, rest) = match name.split_once(':') {
            None => (None, name.as_str()),
            Some((q, rest)) if q.eq_ignore_ascii_case("ForAnyValue") => {
                (Some(Qualifier::ForAnyValue), rest)
            }
            Some((q, rest)) if q.eq_ignore_ascii_case("ForAllValues") => {
                (Some(Qualifier::ForAllValues), rest)
            }
            Some(_) => return Err(unknown()),
        };
        let (base, if_exists) = match rest.len().checked_sub(8).and_then(|i| {
            rest.get(i..)
                .filter(|s| s.eq_ignore_ascii_case("IfExists"))
                .map(|_| &rest[..i])
        }) {
            Some(base) => (base, true),
            None => (rest, false),
        };
        let operator = Operator::parse(base).ok_or_else(unknown)?;
        // AWS allows neither `NullIfExists` nor a set qualifier on `Null`.
        if operator == Operator::Null && (if_exists || qualifier.is_some()) {
            return Err(unknown());
        }
        let Value::Object(tests) = block else {
            return Err(PolicyError::InvalidCondition(format!(
                "{} must be an object of condition keys",
                quote(name)
            )));
        };
        for (key, v) in tests {
            if key.is_empty() {
                return Err(PolicyError::InvalidCondition(format!(
                    "{} names an empty condition key",
                    quote(name)
                )));
            }
            let bad_value = || {
                PolicyError::InvalidCondition(format!(
                    "the values of {} in {} must be strings, numbers or booleans",
                    quote(key),
                    quote(name)
                ))
            };
            let values: Vec<String> = match v {
                Value::Array(items) if !items.is_empty() => items
                    .iter()
                    .map(|i| condition_value(i).ok_or_else(bad_value))
                    .collect::<Result<_, _>>()?,
                Value::Array(_) => return Err(bad_value()),
                single => vec![condition_value(single).ok_or_else(bad_value)?],
            };
            let (values, parsed) = parse_values(operator, key, values)?;
            out.push(Condition {
                operator,
                qualifier,
                if_exists,
                key: key.to_ascii_lowercase(),
                values,
                parsed,
            });
        }
    }
    Ok(out)
}

/// Reads a condition's values as its operator compares them.
fn parse_values(
    op: Operator,
    key: &str,
    values: Vec<String>,
) -> Result<(Vec<String>, Parsed), PolicyError> {
    use Operator::*;
    let all = |kind: &str, f: &dyn Fn(&str) -> bool| -> Result<(), PolicyError> {
        match values.iter().find(|v| !f(v)) {
            Some(v) => Err(PolicyError::InvalidCondition(format!(
                "{op} on {} needs {kind}, not {:?}",
                quote(key),
                quote(v)
            ))),
            None => Ok(()),
        }
    };
    let parsed = match op {
        NumericEquals
        | NumericNotEquals
        | NumericLessThan
        | NumericLessThanEquals
        | NumericGreaterThan
        | NumericGreaterThanEquals => {
            all("numbers", &|v| parse_number(v).is_some())?;
            Parsed::Numbers(values.iter().filter_map(|v| parse_number(v)).collect())
        }
        DateEquals
        | DateNotEquals
        | DateLessThan
        | DateLessThanEquals
        | DateGreaterThan
        | DateGreaterThanEquals => {
            all("dates", &|v| parse_date(v).is_some())?;
            Parsed::Dates(values.iter().filter_map(|v| parse_date(v)).collect())
        }
        Bool | Null => {
            all("true or false", &|v| parse_bool(v).is_some())?;
            let bools: Vec<bool> = values.iter().filter_map(|v| parse_bool(v)).collect();
            let lower = bools.iter().map(|b| b.to_string()).collect();
            return Ok((lower, Parsed::Bools(bools)));
        }
        IpAddress | NotIpAddress => {
            all("IP addresses or CIDR blocks", &|v| Cidr::parse(v).is_some())?;
            Parsed::Cidrs(values.iter().filter_map(|v| Cidr::parse(v)).collect())
        }
        StringEquals
        | StringNotEquals
        | StringEqualsIgnoreCase
        | StringNotEqualsIgnoreCase
        | StringLike
        | StringNotLike
        | BinaryEquals
        | ArnEquals
        | ArnLike
        | ArnNotEquals
        | ArnNotLike => Parsed::Text,
    };
    Ok((values, parsed))
}

fn parse_number(s: &str) -> Option<f64> {
    let s = s.trim();
    // Rust also reads "inf" and "NaN", which are not numbers to a policy.
    if s.is_empty()
        || !s
            .bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.' | b'e' | b'E'))
    {
        return None;
    }
    s.parse::<f64>().ok().filter(|x| x.is_finite())
}

fn parse_bool(s: &str) -> Option<bool> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("true") {
        Some(true)
    } else if s.eq_ignore_ascii_case("false") {
        Some(false)
    } else {
        None
    }
}

/// The decimal value of 1 to 9 ASCII digits; `None` on anything else.
fn digits(b: &[u8]) -> Option<u32> {
    if b.is_empty() || b.len() > 9 {
        return None;
    }
    b.iter().try_fold(0u32, |acc, &c| {
        c.is_ascii_digit().then(|| acc * 10 + u32::from(c - b'0'))
    })
}

/// Milliseconds since the epoch of a date: whole seconds since the epoch, or ISO 8601
/// `YYYY-MM-DD[THH:MM[:SS[.fraction]]][Z|+HH:MM|-HH:MM|+HHMM|-HHMM]` (UTC when no offset).
fn parse_date(s: &str) -> Option<i64> {
    let s = s.trim();
    if !s.is_empty() && s.len() <= 15 && s.bytes().all(|b| b.is_ascii_digit()) {
        return s.parse::<i64>().ok()?.checked_mul(1000);
    }
    let b = s.as_bytes();
    if b.len() < 10 || b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let (y, mo, d) = (digits(&b[0..4])?, digits(&b[5..7])?, digits(&b[8..10])?);
    let (mut h, mut mi, mut sec, mut ms) = (0, 0, 0, 0);
    let mut rest = &b[10..];
    if let [b'T' | b't', time @ ..] = rest {
        let [h1, h2, b':', m1, m2, tail @ ..] = time else {
            return None;
        };
        h = digits(&[*h1, *h2])?;
        mi = digits(&[*m1, *m2])?;
        rest = tail;
        if let [b':', s1, s2, tail @ ..] = rest {
            sec = digits(&[*s1, *s2])?;
            rest = tail;
            if let [b'.', tail @ ..] = rest {
                let n = tail.iter().take_while(|c| c.is_ascii_digit()).count();
                if n == 0 {
                    return None;
                }
                let kept = n.min(3);
                ms = digits(&tail[..kept])? * 10u32.pow(3 - kept as u32);
                rest = &tail[n..];
            }
        }
    }
    let offset: i64 = match rest {
        [] | [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] | [sign @ (b'+' | b'-'), h1, h2, m1, m2] => {
            let (oh, om) = (digits(&[*h1, *h2])?, digits(&[*m1, *m2])?);
            if oh > 23 || om > 59 {
                return None;
            }
            let secs = i64::from(oh) * 3600 + i64::from(om) * 60;
            if *sign == b'+' {
                secs
            } else {
                -secs
            }
        }
        _ => return None,
    };
    if !(1..=12).contains(&mo)
        || d == 0
        || d > days_in_month(y, mo)
        || h > 23
        || mi > 59
        || sec > 59
    {
        return None;
    }
    let days = days_from_civil(i64::from(y), i64::from(mo), i64::from(d));
    let secs = days * 86_400 + i64::from(h) * 3600 + i64::from(mi) * 60 + i64::from(sec) - offset;
    Some(secs * 1000 + i64::from(ms))
}

/// One element of a wildcard pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tok {
    Lit(char),
    /// `*`: any run of characters, `/` included.
    Star,
    /// `?`: any one character.
    One,
}

/// A pattern's elements, without policy variables.
fn tokens(pattern: &str) -> Vec<Tok> {
    pattern
        .chars()
        .map(|c| match c {
            '*' => Tok::Star,
            '?' => Tok::One,
            c => Tok::Lit(c),
        })
        .collect()
}

/// A pattern's elements with its policy variables replaced from `vars` (when the policy has
/// them): `${key}` by the key's one value, `${key, 'default'}` by it or the default, and
/// `${*}`, `${?}`, `${$}` by a literal `*`, `?`, `$`. A replaced value is literal text, so
/// its own `*` matches only `*`. `None` when a variable has no value (or several) and no
/// default: the pattern then matches nothing, as in AWS. `wild` false reads `*` and `?` as
/// themselves.
fn expand(pattern: &str, vars: Option<&Context>, wild: bool) -> Option<Vec<Tok>> {
    let plain = |s: &str, out: &mut Vec<Tok>| {
        out.extend(s.chars().map(|c| match c {
            '*' if wild => Tok::Star,
            '?' if wild => Tok::One,
            c => Tok::Lit(c),
        }))
    };
    let mut out = Vec::with_capacity(pattern.len());
    let Some(ctx) = vars else {
        plain(pattern, &mut out);
        return Some(out);
    };
    let mut rest = pattern;
    while let Some(start) = rest.find("${") {
        let Some(len) = rest[start + 2..].find('}') else {
            break;
        };
        plain(&rest[..start], &mut out);
        let inner = &rest[start + 2..start + 2 + len];
        rest = &rest[start + 2 + len + 1..];
        let (name, default) = match inner.split_once(',') {
            Some((n, d)) => {
                let d = d.trim();
                let d = d
                    .strip_prefix('\'')
                    .and_then(|d| d.strip_suffix('\''))
                    .unwrap_or(d);
                (n.trim(), Some(d))
            }
            None => (inner.trim(), None),
        };
        let value = match name {
            "*" | "?" | "$" => Some(name),
            key => ctx.single(key).or(default),
        };
        out.extend(value?.chars().map(Tok::Lit));
    }
    plain(rest, &mut out);
    Some(out)
}

/// A condition value with its policy variables replaced, as plain text.
fn literal(pattern: &str, vars: Option<&Context>) -> Option<String> {
    if vars.is_none() || !pattern.contains("${") {
        return Some(pattern.to_owned());
    }
    Some(
        expand(pattern, vars, false)?
            .into_iter()
            .map(|t| match t {
                Tok::Lit(c) => c,
                Tok::Star => '*',
                Tok::One => '?',
            })
            .collect(),
    )
}

/// Whether `value` matches the pattern `p`. Greedy, backtracking only to the last `*`: at
/// most pattern x value steps, whatever the input.
fn glob(p: &[Tok], value: &[char]) -> bool {
    let (mut pi, mut vi) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while vi < value.len() {
        match p.get(pi) {
            Some(Tok::Star) => {
                star = Some((pi, vi));
                pi += 1;
            }
            Some(Tok::One) => {
                pi += 1;
                vi += 1;
            }
            Some(Tok::Lit(c)) if *c == value[vi] => {
                pi += 1;
                vi += 1;
            }
            _ => match star {
                Some((sp, sv)) => {
                    pi = sp + 1;
                    vi = sv + 1;
                    star = Some((sp, sv + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|t| *t == Tok::Star)
}

/// How many of the strings past a prefix a pattern must match ([`Statement::resource_reaches`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reach {
    Some,
    Every,
}

/// Whether `p` matches some (`Reach::Some`) or every (`Reach::Every`) string made of `prefix`
/// and at least one more character. The pattern is run over the prefix as over the start
/// of a value, keeping every position it can be at; then some such string matches when a
/// position has pattern left to match (whatever is left, some nonempty rest fits it), and
/// every one does when what is left is `*` alone (a rest such as `?*` also matches every
/// nonempty one but is not recognised: for `Every` the answer errs towards no).
fn pattern_reaches(p: &[Tok], prefix: &[char], reach: Reach) -> bool {
    // Positions in `p` reachable after the characters read so far; a `*` may match nothing,
    // so a position at a `*` also reaches the one after it.
    let close = |mut at: Vec<bool>| {
        for i in 0..p.len() {
            if at[i] && p[i] == Tok::Star {
                at[i + 1] = true;
            }
        }
        at
    };
    let mut at = vec![false; p.len() + 1];
    at[0] = true;
    at = close(at);
    for &c in prefix {
        let mut next = vec![false; p.len() + 1];
        for i in 0..p.len() {
            if !at[i] {
                continue;
            }
            match p[i] {
                Tok::Star => next[i] = true,
                Tok::One => next[i + 1] = true,
                Tok::Lit(l) if l == c => next[i + 1] = true,
                Tok::Lit(_) => {}
            }
        }
        at = close(next);
        if !at.iter().any(|&a| a) {
            return false;
        }
    }
    (0..p.len()).any(|i| {
        at[i]
            && match reach {
                Reach::Some => true,
                Reach::Every => p[i..].iter().all(|t| *t == Tok::Star),
            }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUCKET: &str = "photos";

    /// A 2012-10-17 policy on [`BUCKET`] with these statements (a JSON object or array).
    fn policy(statements: &str) -> BucketPolicy {
        let text = format!(r#"{{"Version": "2012-10-17", "Statement": {statements}}}"#);
        match BucketPolicy::parse(&text, BUCKET) {
            Ok(p) => p,
            Err(e) => panic!("{text}: {e}"),
        }
    }

    /// One statement with these extra elements, allowing everything on the bucket unless
    /// they say otherwise.
    fn allow(extra: &str) -> BucketPolicy {
        policy(&format!(
            r#"{{"Effect": "Allow", "Principal": "*", "Action": "*",
                 "Resource": ["arn:aws:s3:::photos", "arn:aws:s3:::photos/*"] {extra}}}"#
        ))
    }

    fn parse_err(text: &str) -> PolicyError {
        match BucketPolicy::parse(text, BUCKET) {
            Ok(p) => panic!("{text} parsed: {p:?}"),
            Err(e) => e,
        }
    }

    /// The error of one statement's JSON inside a well-formed policy.
    fn statement_err(statement: &str) -> PolicyError {
        parse_err(&format!(
            r#"{{"Version": "2012-10-17", "Statement": [{statement}]}}"#
        ))
    }

    fn ask(
        p: &BucketPolicy,
        who: Principal,
        action: &str,
        resource: &str,
        c: &Context,
    ) -> Decision {
        p.evaluate(&Request {
            principal: who,
            action,
            resource,
            context: c,
        })
    }

    /// Anonymous GetObject of `photos/k` in context `c`.
    fn get(p: &BucketPolicy, c: &Context) -> Decision {
        ask(
            p,
            Principal::Anonymous,
            "s3:GetObject",
            "arn:aws:s3:::photos/k",
            c,
        )
    }

    /// Whether a single condition block (`{"Op": {...}}`) lets an anonymous GetObject
    /// through in context `c`.
    fn cond(block: &str, c: &Context) -> bool {
        get(&allow(&format!(r#", "Condition": {block}"#)), c) == Decision::Allow
    }

    fn ctx(pairs: &[(&str, &str)]) -> Context {
        pairs.iter().fold(Context::new(), |c, (k, v)| c.with(k, *v))
    }

    /// A request for every object of [`BUCKET`] (a KV call) by user `bob`.
    fn every(p: &BucketPolicy, action: &str) -> Decision {
        p.evaluate_every_object(&Request {
            principal: Principal::User("bob"),
            action,
            resource: &object_arn(BUCKET, ""),
            context: &Context::new(),
        })
    }

    fn statement(effect: &str, resource: &str) -> BucketPolicy {
        policy(&format!(
            r#"{{"Effect": "{effect}", "Principal": {{"AWS": "bob"}}, "Action": "s3:GetObject",
                 "Resource": {resource}}}"#
        ))
    }

    /// A call that names every object is refused by a deny that reaches any one of them, and
    /// admitted by an allow only if it reaches all of them; where the literal object `*` was
    /// evaluated, a deny of a prefix let it through.
    #[test]
    fn a_request_for_every_object_is_denied_by_any_deny_and_allowed_only_by_a_whole_allow() {
        use Decision::*;
        let cases = [
            ("Deny", r#""arn:aws:s3:::photos/secret/*""#, ExplicitDeny),
            ("Deny", r#""arn:aws:s3:::photos/one-key""#, ExplicitDeny),
            ("Deny", r#""arn:aws:s3:::photos/?ecret""#, ExplicitDeny),
            ("Deny", r#""arn:aws:s3:::pho*""#, ExplicitDeny),
            ("Deny", r#""arn:aws:s3:::photos""#, NotApplicable),
            ("Allow", r#""arn:aws:s3:::photos/*""#, Allow),
            ("Allow", r#""arn:aws:s3:::*""#, Allow),
            ("Allow", r#""arn:aws:s3:::photos/public/*""#, NotApplicable),
            ("Allow", r#""arn:aws:s3:::photos/?""#, NotApplicable),
            ("Allow", r#""arn:aws:s3:::photos""#, NotApplicable),
        ];
        for (effect, resource, want) in cases {
            let p = statement(effect, resource);
            assert_eq!(every(&p, "s3:GetObject"), want, "{effect} {resource}");
            assert_eq!(every(&p, "s3:PutObject"), NotApplicable, "another action");
        }
        // The hole this closes: the literal object `*` passed a deny of a prefix.
        let deny = statement("Deny", r#""arn:aws:s3:::photos/secret/*""#);
        let literal = ask(
            &deny,
            Principal::User("bob"),
            "s3:GetObject",
            &object_arn(BUCKET, "*"),
            &Context::new(),
        );
        assert_eq!(literal, NotApplicable);
        // NotResource: a deny of all but a prefix reaches some object; an allow of all but a
        // prefix does not reach every one, and one of all but the bucket itself does.
        let not = |effect: &str, resource: &str| {
            policy(&format!(
                r#"{{"Effect": "{effect}", "Principal": {{"AWS": "bob"}}, "Action": "s3:GetObject",
                     "NotResource": {resource}}}"#
            ))
        };
        assert_eq!(
            every(
                &not("Deny", r#""arn:aws:s3:::photos/public/*""#),
                "s3:GetObject"
            ),
            ExplicitDeny
        );
        assert_eq!(
            every(&not("Deny", r#""arn:aws:s3:::photos/*""#), "s3:GetObject"),
            NotApplicable
        );
        assert_eq!(
            every(
                &not("Allow", r#""arn:aws:s3:::photos/public/*""#),
                "s3:GetObject"
            ),
            NotApplicable
        );
        assert_eq!(
            every(&not("Allow", r#""arn:aws:s3:::photos""#), "s3:GetObject"),
            Allow
        );
        // Another principal is not concerned.
        let alice = policy(
            r#"{"Effect": "Deny", "Principal": {"AWS": "alice"}, "Action": "*",
                "Resource": "arn:aws:s3:::photos/secret/*"}"#,
        );
        assert_eq!(every(&alice, "s3:GetObject"), NotApplicable);
    }

    #[test]
    fn a_policy_parses_and_keeps_its_text() {
        let text = r#"{
  "Version": "2012-10-17",
  "Id": "PolicyForPhotos",
  "Statement": {"Sid": "Read", "Effect": "Allow", "Principal": {"AWS": "alice"},
                "Action": ["s3:GetObject", "s3:ListBucket"],
                "Resource": ["arn:aws:s3:::photos", "arn:aws:s3:::photos/*"]}
}"#;
        let p = BucketPolicy::parse(text, BUCKET).unwrap();
        assert_eq!(p.text(), text);
        assert_eq!(p.id(), Some("PolicyForPhotos"));
        assert_eq!(p.version(), Version::V2012_10_17);
        let [s] = p.statements() else {
            panic!("{:?}", p.statements())
        };
        assert_eq!(s.sid.as_deref(), Some("Read"));
        assert_eq!(s.effect, Effect::Allow);
        assert_eq!(
            s.principal,
            Targets::Only(Principals::Some(vec![PrincipalId::User("alice".into())]))
        );
        assert_eq!(
            s.action,
            Targets::Only(vec!["s3:getobject".into(), "s3:listbucket".into()])
        );
        assert!(s.conditions.is_empty());
        // Without Version, a policy is 2008-10-17; an array of statements works too.
        let old = BucketPolicy::parse(
            r#"{"Statement": [{"Effect": "Deny", "Principal": "*", "Action": "s3:*",
                               "Resource": "arn:aws:s3:::photos/*"},
                              {"Effect": "Allow", "Principal": "*", "Action": "s3:*",
                               "Resource": "arn:aws:s3:::photos"}]}"#,
            BUCKET,
        )
        .unwrap();
        assert_eq!(old.version(), Version::V2008_10_17);
        assert_eq!(old.statements().len(), 2);
        assert_eq!(old.id(), None);
        let v2008 = r#"{"Version": "2008-10-17", "Statement": {"Effect": "Allow",
            "Principal": "*", "Action": "*", "Resource": "arn:aws:s3:::photos"}}"#;
        assert_eq!(
            BucketPolicy::parse(v2008, BUCKET).unwrap().version(),
            Version::V2008_10_17
        );
    }

    #[test]
    fn bad_json_is_refused() {
        for text in [
            "",
            "{",
            "not json",
            "[]",
            "\"text\"",
            "42",
            "{\"Statement\": [}",
        ] {
            let e = parse_err(text);
            assert!(matches!(e, PolicyError::Json(_)), "{text}: {e:?}");
            assert_eq!(e.code(), "MalformedPolicy");
            assert_eq!(e.status(), 400);
        }
    }

    #[test]
    fn oversize_policies_are_refused() {
        let pad = " ".repeat(MAX_POLICY_LEN);
        let text = format!(
            r#"{{"Statement": {{"Effect": "Allow", "Principal": "*", "Action": "*", "Resource": "arn:aws:s3:::photos"}}{pad}}}"#
        );
        assert!(matches!(
            parse_err(&text),
            PolicyError::TooLarge {
                max: MAX_POLICY_LEN,
                ..
            }
        ));
        // Just at the limit is fine.
        let body = r#"{"Statement": {"Effect": "Allow", "Principal": "*", "Action": "*", "Resource": "arn:aws:s3:::photos"}}"#;
        let exact = format!("{body}{}", " ".repeat(MAX_POLICY_LEN - body.len()));
        assert!(BucketPolicy::parse(&exact, BUCKET).is_ok());
    }

    #[test]
    fn missing_elements_are_refused() {
        assert_eq!(
            parse_err(r#"{"Version": "2012-10-17"}"#),
            PolicyError::MissingField("Statement")
        );
        let cases = [
            (
                r#"{"Principal": "*", "Action": "*", "Resource": "arn:aws:s3:::photos"}"#,
                "Effect",
            ),
            (
                r#"{"Effect": "Allow", "Action": "*", "Resource": "arn:aws:s3:::photos"}"#,
                "Principal",
            ),
            (
                r#"{"Effect": "Allow", "Principal": "*", "Resource": "arn:aws:s3:::photos"}"#,
                "Action",
            ),
            (
                r#"{"Effect": "Allow", "Principal": "*", "Action": "*"}"#,
                "Resource",
            ),
        ];
        for (statement, field) in cases {
            let e = statement_err(statement);
            assert_eq!(e, PolicyError::MissingField(field), "{statement}");
            assert_eq!(e.to_string(), format!("Missing required field {field}"));
        }
        assert!(matches!(
            parse_err(r#"{"Statement": []}"#),
            PolicyError::Syntax(_)
        ));
    }

    #[test]
    fn bad_elements_are_refused() {
        let base = |extra: &str| {
            format!(
                r#"{{"Effect": "Allow", "Principal": "*", "Resource": "arn:aws:s3:::photos", {extra}}}"#
            )
        };
        // Effects are case-sensitive.
        for effect in ["allow", "Permit", ""] {
            let e = statement_err(&format!(
                r#"{{"Effect": "{effect}", "Principal": "*", "Action": "*", "Resource": "arn:aws:s3:::photos"}}"#
            ));
            assert_eq!(e, PolicyError::InvalidEffect(effect.into()));
        }
        assert!(matches!(
            statement_err(
                r#"{"Effect": true, "Principal": "*", "Action": "*", "Resource": "arn:aws:s3:::photos"}"#
            ),
            PolicyError::Syntax(_)
        ));
        for action in [
            r#""iam:CreateUser""#,
            r#""s3:""#,
            r#""s3:Get Object""#,
            r#""GetObject""#,
            r#"["s3:GetObject", "ec2:*"]"#,
        ] {
            assert!(
                matches!(
                    statement_err(&base(&format!(r#""Action": {action}"#))),
                    PolicyError::InvalidAction(_)
                ),
                "{action}"
            );
        }
        for action in [r#"[]"#, r#"42"#, r#"["s3:GetObject", 1]"#, r#"{"a": 1}"#] {
            assert!(
                matches!(
                    statement_err(&base(&format!(r#""Action": {action}"#))),
                    PolicyError::Syntax(_)
                ),
                "{action}"
            );
        }
        assert!(matches!(
            statement_err(&base(r#""Action": "*", "NotAction": "s3:GetObject""#)),
            PolicyError::Syntax(_)
        ));
        assert!(matches!(
            statement_err(&base(r#""Action": "*", "Sids": "x""#)),
            PolicyError::Syntax(_)
        ));
        assert!(matches!(
            statement_err(&base(r#""Action": "*", "Condition": []"#)),
            PolicyError::Syntax(_)
        ));
        assert!(matches!(
            statement_err(&base(r#""Action": "*", "Sid": 7"#)),
            PolicyError::Syntax(_)
        ));
        let e = statement_err(
            r#"{"Effect": "Allow", "Principal": "*", "NotPrincipal": {"AWS": "a"}, "Action": "*", "Resource": "arn:aws:s3:::photos"}"#,
        );
        assert!(matches!(e, PolicyError::Syntax(_)), "{e:?}");
        let e = statement_err(
            r#"{"Effect": "Allow", "Principal": "*", "Action": "*", "Resource": "arn:aws:s3:::photos", "NotResource": "arn:aws:s3:::photos/x"}"#,
        );
        assert!(matches!(e, PolicyError::Syntax(_)), "{e:?}");
        // Top level: unknown fields, bad versions, a statement that is not an object.
        let st = r#"{"Effect": "Allow", "Principal": "*", "Action": "*", "Resource": "arn:aws:s3:::photos"}"#;
        for text in [
            format!(r#"{{"Statement": {st}, "Statements": []}}"#),
            format!(r#"{{"Version": "2012-10-18", "Statement": {st}}}"#),
            format!(r#"{{"Version": 2012, "Statement": {st}}}"#),
            format!(r#"{{"Id": 5, "Statement": {st}}}"#),
            r#"{"Statement": "allow all"}"#.to_string(),
            r#"{"Statement": ["allow all"]}"#.to_string(),
        ] {
            assert!(matches!(parse_err(&text), PolicyError::Syntax(_)), "{text}");
        }
        // Element names are case-sensitive.
        assert!(matches!(
            statement_err(
                r#"{"effect": "Allow", "Principal": "*", "Action": "*", "Resource": "arn:aws:s3:::photos"}"#
            ),
            PolicyError::Syntax(_)
        ));
    }

    #[test]
    fn sids_must_be_unique() {
        let st = |sid: &str| {
            format!(
                r#"{{"Sid": "{sid}", "Effect": "Allow", "Principal": "*", "Action": "*", "Resource": "arn:aws:s3:::photos"}}"#
            )
        };
        let e = parse_err(&format!(
            r#"{{"Statement": [{}, {}, {}]}}"#,
            st("a"),
            st("b"),
            st("a")
        ));
        assert!(e.to_string().contains("unique"), "{e}");
        assert!(BucketPolicy::parse(
            &format!(
                r#"{{"Statement": [{}, {}, {}, {}]}}"#,
                st("a"),
                st("A"),
                st(""),
                st("")
            ),
            BUCKET
        )
        .is_ok());
    }

    #[test]
    fn resources_must_name_the_bucket() {
        let with = |r: &str| {
            BucketPolicy::parse(
                &format!(
                    r#"{{"Statement": {{"Effect": "Allow", "Principal": "*", "Action": "*", "Resource": {r}}}}}"#
                ),
                BUCKET,
            )
        };
        for ok in [
            r#""arn:aws:s3:::photos""#,
            r#""arn:aws:s3:::photos/*""#,
            r#""arn:aws:s3:::photos/a/b/c.jpg""#,
            r#""arn:aws:s3:::pho*/*""#,
            r#""arn:aws:s3:::phot?s""#,
            r#""arn:aws:s3:::*""#,
            r#"["arn:aws:s3:::photos", "arn:aws:s3:::photos/*"]"#,
        ] {
            assert!(with(ok).is_ok(), "{ok}");
        }
        for bad in [
            r#""arn:aws:s3:::other""#,
            r#""arn:aws:s3:::other/*""#,
            r#""arn:aws:s3:::photos2""#,
            r#""arn:aws:s3:::""#,
            r#""arn:aws:s3:::/photos""#,
            r#""*""#,
            r#""photos""#,
            r#""arn:aws:s3:us-east-1::photos""#,
            r#""arn:aws:iam:::photos""#,
            r#"["arn:aws:s3:::photos", "arn:aws:s3:::other/*"]"#,
        ] {
            let e = with(bad).unwrap_err();
            assert!(matches!(e, PolicyError::InvalidResource(_)), "{bad}: {e:?}");
            assert!(e.to_string().starts_with("Policy has invalid resource"));
        }
        // NotResource is held to the same rule.
        let e = BucketPolicy::parse(
            r#"{"Statement": {"Effect": "Deny", "Principal": "*", "Action": "*", "NotResource": "arn:aws:s3:::other/*"}}"#,
            BUCKET,
        )
        .unwrap_err();
        assert!(matches!(e, PolicyError::InvalidResource(_)));
    }

    #[test]
    fn bad_principals_are_refused() {
        for principal in [
            r#""alice""#,
            r#""""#,
            r#"{}"#,
            r#"{"AWS": []}"#,
            r#"{"AWS": ""}"#,
            r#"{"AWS": "al ice"}"#,
            r#"{"AWS": 12}"#,
            r#"{"Group": "everyone"}"#,
            r#"{"AWS": "arn:aws:s3:::photos"}"#,
            r#"{"AWS": "arn:aws:iam::123:"}"#,
            r#"{"AWS": "arn:aws:iam:::root"}"#,
            r#"{"AWS": "arn:aws:iam::123:user/"}"#,
            r#"{"AWS": "arn:aws:iam"}"#,
            r#"{"AWS": "arn:aws:iam::*:root"}"#,
            r#"{"AWS": "al*"}"#,
            r#"{"CanonicalUser": "*"}"#,
            r#"{"AWS": "*", "Group": "everyone"}"#,
            r#"{"AWS": ["*", "arn:aws:s3:::x"]}"#,
            r#"["*"]"#,
            r#"42"#,
        ] {
            let e = statement_err(&format!(
                r#"{{"Effect": "Allow", "Principal": {principal}, "Action": "*", "Resource": "arn:aws:s3:::photos"}}"#
            ));
            assert!(
                matches!(e, PolicyError::InvalidPrincipal(_)),
                "{principal}: {e:?}"
            );
        }
    }

    #[test]
    fn principals_name_users_accounts_and_everyone() {
        let p = allow("").statements()[0].principal.clone();
        assert_eq!(p, Targets::Only(Principals::Any));
        let named = policy(
            r#"{"Effect": "Allow", "Action": "*", "Resource": "arn:aws:s3:::photos/*",
                "Principal": {"AWS": ["alice", "arn:aws:iam::123456789012:user/bob",
                                      "arn:aws:iam:::user/team/carol",
                                      "arn:aws:iam::123456789012:root", "210987654321",
                                      "arn:aws:iam::123456789012:role/reader"],
                              "CanonicalUser": "dave",
                              "Service": "logging.s3.amazonaws.com"}}"#,
        );
        let ids = match &named.statements()[0].principal {
            Targets::Only(Principals::Some(ids)) => ids.clone(),
            other => panic!("{other:?}"),
        };
        for name in [
            "alice",
            "bob",
            "carol",
            "123456789012",
            "210987654321",
            "dave",
        ] {
            assert!(ids.contains(&PrincipalId::User(name.into())), "{name}");
        }
        assert!(ids.contains(&PrincipalId::Other {
            kind: "Service".into(),
            id: "logging.s3.amazonaws.com".into()
        }));
        assert!(ids.contains(&PrincipalId::Other {
            kind: "AWS".into(),
            id: "arn:aws:iam::123456789012:role/reader".into()
        }));
        let c = Context::new();
        let r = "arn:aws:s3:::photos/k";
        let user = |n| ask(&named, Principal::User(n), "s3:GetObject", r, &c);
        for name in ["alice", "bob", "carol", "123456789012", "dave"] {
            assert_eq!(user(name), Decision::Allow, "{name}");
        }
        assert_eq!(user("eve"), Decision::NotApplicable);
        assert_eq!(user("Alice"), Decision::NotApplicable);
        assert_eq!(user("logging.s3.amazonaws.com"), Decision::NotApplicable);
        assert_eq!(user("reader"), Decision::NotApplicable);
        for who in [Principal::Anonymous, Principal::Authenticated] {
            assert_eq!(
                ask(&named, who, "s3:GetObject", r, &c),
                Decision::NotApplicable
            );
        }
        // "*" in any form is everyone, tokens and anonymous callers included.
        for principal in [r#""*""#, r#"{"AWS": "*"}"#, r#"{"AWS": ["alice", "*"]}"#] {
            let p = policy(&format!(
                r#"{{"Effect": "Allow", "Principal": {principal}, "Action": "*", "Resource": "arn:aws:s3:::photos/*"}}"#
            ));
            assert_eq!(
                p.statements()[0].principal,
                Targets::Only(Principals::Any),
                "{principal}"
            );
            for who in [
                Principal::Anonymous,
                Principal::Authenticated,
                Principal::User("zed"),
            ] {
                assert_eq!(ask(&p, who, "s3:PutObject", r, &c), Decision::Allow);
            }
        }
    }

    #[test]
    fn action_wildcards_and_case() {
        let c = Context::new();
        let r = "arn:aws:s3:::photos/k";
        let decide = |pattern: &str, action: &str| {
            let p = policy(&format!(
                r#"{{"Effect": "Allow", "Principal": "*", "Action": "{pattern}", "Resource": "arn:aws:s3:::photos/*"}}"#
            ));
            ask(&p, Principal::Anonymous, action, r, &c) == Decision::Allow
        };
        assert!(decide("s3:GetObject", "s3:GetObject"));
        assert!(decide("S3:GETOBJECT", "s3:getobject"));
        assert!(decide("s3:getobject", "s3:GetObject"));
        assert!(!decide("s3:GetObject", "s3:GetObjectAcl"));
        assert!(!decide("s3:GetObject", "s3:PutObject"));
        assert!(decide("s3:Get*", "s3:GetObjectAcl"));
        assert!(decide("s3:Get*", "s3:GetObject"));
        assert!(!decide("s3:Get*", "s3:PutObject"));
        assert!(decide("s3:*", "s3:DeleteObject"));
        assert!(decide("*", "s3:DeleteObject"));
        assert!(decide("s3:?etObject", "s3:GetObject"));
        assert!(!decide("s3:?etObject", "s3:GGetObject"));
        assert!(decide("s3:*Object*", "s3:PutObjectTagging"));
        assert!(!decide("s3:List*", "s3:GetObject"));
    }

    #[test]
    fn resource_wildcards() {
        let p = policy(
            r#"{"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject",
                "Resource": ["arn:aws:s3:::photos/public/*.jpg", "arn:aws:s3:::photos/v?/index"]}"#,
        );
        let c = Context::new();
        let key = |k: &str| {
            ask(
                &p,
                Principal::Anonymous,
                "s3:GetObject",
                &object_arn(BUCKET, k),
                &c,
            )
        };
        assert_eq!(key("public/cat.jpg"), Decision::Allow);
        // `*` crosses `/`.
        assert_eq!(key("public/a/b/cat.jpg"), Decision::Allow);
        assert_eq!(key("public/.jpg"), Decision::Allow);
        assert_eq!(key("public/cat.png"), Decision::NotApplicable);
        // ARNs and keys are case-sensitive.
        assert_eq!(key("Public/cat.jpg"), Decision::NotApplicable);
        assert_eq!(key("public/cat.JPG"), Decision::NotApplicable);
        assert_eq!(key("v1/index"), Decision::Allow);
        assert_eq!(key("v12/index"), Decision::NotApplicable);
        assert_eq!(key("v/index"), Decision::NotApplicable);
        // Keys with non-ASCII characters: `?` is one character, not one byte.
        assert_eq!(key("vé/index"), Decision::Allow);
        assert_eq!(
            ask(
                &p,
                Principal::Anonymous,
                "s3:GetObject",
                &bucket_arn(BUCKET),
                &c
            ),
            Decision::NotApplicable
        );
        // The bucket ARN does not cover its objects, nor `bucket/*` the bucket.
        let bucket_only = allow("");
        assert_eq!(
            ask(
                &bucket_only,
                Principal::Anonymous,
                "s3:ListBucket",
                "arn:aws:s3:::photos",
                &c
            ),
            Decision::Allow
        );
        let objects = policy(
            r#"{"Effect": "Allow", "Principal": "*", "Action": "*", "Resource": "arn:aws:s3:::photos/*"}"#,
        );
        assert_eq!(
            ask(
                &objects,
                Principal::Anonymous,
                "s3:ListBucket",
                "arn:aws:s3:::photos",
                &c
            ),
            Decision::NotApplicable
        );
    }

    #[test]
    fn deny_wins_over_allow() {
        let p = policy(
            r#"[{"Effect": "Allow", "Principal": "*", "Action": "s3:*", "Resource": "arn:aws:s3:::photos/*"},
                {"Effect": "Deny", "Principal": {"AWS": "mallory"}, "Action": "s3:*", "Resource": "arn:aws:s3:::photos/*"},
                {"Effect": "Allow", "Principal": {"AWS": "mallory"}, "Action": "s3:GetObject", "Resource": "arn:aws:s3:::photos/*"},
                {"Effect": "Deny", "Principal": "*", "Action": "s3:DeleteObject", "Resource": "arn:aws:s3:::photos/keep/*"}]"#,
        );
        let c = Context::new();
        let r = "arn:aws:s3:::photos/keep/a";
        assert_eq!(
            ask(&p, Principal::User("mallory"), "s3:GetObject", r, &c),
            Decision::ExplicitDeny
        );
        assert_eq!(
            ask(&p, Principal::User("alice"), "s3:GetObject", r, &c),
            Decision::Allow
        );
        assert_eq!(
            ask(&p, Principal::User("alice"), "s3:DeleteObject", r, &c),
            Decision::ExplicitDeny
        );
        assert_eq!(
            ask(
                &p,
                Principal::User("alice"),
                "s3:DeleteObject",
                "arn:aws:s3:::photos/other",
                &c
            ),
            Decision::Allow
        );
        // A deny that does not apply leaves nothing said.
        let deny_only = policy(
            r#"{"Effect": "Deny", "Principal": "*", "Action": "s3:DeleteObject", "Resource": "arn:aws:s3:::photos/*"}"#,
        );
        assert_eq!(get(&deny_only, &c), Decision::NotApplicable);
    }

    #[test]
    fn not_principal_not_action_not_resource() {
        let c = Context::new();
        let r = "arn:aws:s3:::photos/k";
        // Deny everyone but alice.
        let p = policy(
            r#"{"Effect": "Deny", "NotPrincipal": {"AWS": "alice"}, "Action": "*", "Resource": "arn:aws:s3:::photos/*"}"#,
        );
        assert_eq!(
            ask(&p, Principal::User("alice"), "s3:GetObject", r, &c),
            Decision::NotApplicable
        );
        for who in [
            Principal::User("bob"),
            Principal::Anonymous,
            Principal::Authenticated,
        ] {
            assert_eq!(ask(&p, who, "s3:GetObject", r, &c), Decision::ExplicitDeny);
        }
        // NotPrincipal "*" excludes everyone.
        let p = policy(
            r#"{"Effect": "Deny", "NotPrincipal": "*", "Action": "*", "Resource": "arn:aws:s3:::photos/*"}"#,
        );
        assert_eq!(get(&p, &c), Decision::NotApplicable);
        // Allow everything but deleting.
        let p = policy(
            r#"{"Effect": "Allow", "Principal": "*", "NotAction": ["s3:Delete*", "s3:PutObjectAcl"], "Resource": "arn:aws:s3:::photos/*"}"#,
        );
        let act = |a: &str| ask(&p, Principal::Anonymous, a, r, &c);
        assert_eq!(act("s3:GetObject"), Decision::Allow);
        assert_eq!(act("s3:PutObject"), Decision::Allow);
        assert_eq!(act("s3:DeleteObject"), Decision::NotApplicable);
        assert_eq!(act("s3:deleteobjectversion"), Decision::NotApplicable);
        assert_eq!(act("s3:PutObjectAcl"), Decision::NotApplicable);
        // Everything in the bucket but the private/ prefix.
        let p = policy(
            r#"{"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject", "NotResource": "arn:aws:s3:::photos/private/*"}"#,
        );
        let key = |k: &str| {
            ask(
                &p,
                Principal::Anonymous,
                "s3:GetObject",
                &object_arn(BUCKET, k),
                &c,
            )
        };
        assert_eq!(key("public/a"), Decision::Allow);
        assert_eq!(key("private/a"), Decision::NotApplicable);
    }

    #[test]
    fn string_operators() {
        let c = ctx(&[("aws:Referer", "http://www.example.com/page")]);
        let on = |op: &str, v: &str| cond(&format!(r#"{{"{op}": {{"aws:Referer": {v}}}}}"#), &c);
        assert!(on("StringEquals", r#""http://www.example.com/page""#));
        assert!(!on("StringEquals", r#""http://www.example.com/PAGE""#));
        assert!(on(
            "StringEquals",
            r#"["x", "http://www.example.com/page"]"#
        ));
        assert!(!on("StringEquals", r#""http://www.example.com/*""#));
        assert!(on("StringNotEquals", r#""http://other""#));
        assert!(!on("StringNotEquals", r#""http://www.example.com/page""#));
        // A negated operator holds when the value matches none of the list.
        assert!(!on(
            "StringNotEquals",
            r#"["x", "http://www.example.com/page"]"#
        ));
        assert!(on("StringNotEquals", r#"["x", "y"]"#));
        assert!(on(
            "StringEqualsIgnoreCase",
            r#""HTTP://WWW.EXAMPLE.COM/PAGE""#
        ));
        assert!(!on("StringEqualsIgnoreCase", r#""http://www.example.com""#));
        assert!(on(
            "StringNotEqualsIgnoreCase",
            r#""http://www.example.com""#
        ));
        assert!(!on(
            "StringNotEqualsIgnoreCase",
            r#""HTTP://www.example.com/Page""#
        ));
        assert!(on("StringLike", r#""http://www.example.com/*""#));
        assert!(on("StringLike", r#""http://???.example.com/*""#));
        assert!(!on("StringLike", r#""http://*.example.org/*""#));
        assert!(!on("StringLike", r#""HTTP://www.example.com/*""#));
        assert!(on("StringNotLike", r#""http://*.example.org/*""#));
        assert!(!on("StringNotLike", r#"["x", "*example*"]"#));
        // Operator names are read case-insensitively; keys always are.
        assert!(on("stringequals", r#""http://www.example.com/page""#));
        assert!(cond(
            r#"{"StringEquals": {"AWS:REFERER": "http://www.example.com/page"}}"#,
            &c
        ));
        // Several keys in a block, and several blocks, must all hold.
        let c = ctx(&[("s3:prefix", "home/"), ("s3:delimiter", "/")]);
        assert!(cond(
            r#"{"StringEquals": {"s3:prefix": "home/", "s3:delimiter": "/"}}"#,
            &c
        ));
        assert!(!cond(
            r#"{"StringEquals": {"s3:prefix": "home/", "s3:delimiter": "-"}}"#,
            &c
        ));
        assert!(cond(
            r#"{"StringEquals": {"s3:prefix": "home/"}, "StringLike": {"s3:delimiter": "*"}}"#,
            &c
        ));
        assert!(!cond(
            r#"{"StringEquals": {"s3:prefix": "home/"}, "StringNotEquals": {"s3:delimiter": "/"}}"#,
            &c
        ));
    }

    #[test]
    fn numeric_operators() {
        let c = ctx(&[("s3:max-keys", "10")]);
        let on = |op: &str, v: &str| cond(&format!(r#"{{"{op}": {{"s3:max-keys": {v}}}}}"#), &c);
        assert!(on("NumericEquals", "10"));
        assert!(on("NumericEquals", r#""10""#));
        assert!(on("NumericEquals", r#""10.0""#));
        assert!(!on("NumericEquals", "11"));
        assert!(on("NumericNotEquals", "11"));
        assert!(!on("NumericNotEquals", "10"));
        assert!(on("NumericLessThan", "11"));
        assert!(!on("NumericLessThan", "10"));
        assert!(on("NumericLessThanEquals", "10"));
        assert!(!on("NumericLessThanEquals", "9.5"));
        assert!(on("NumericGreaterThan", "9"));
        assert!(!on("NumericGreaterThan", "10"));
        assert!(on("NumericGreaterThanEquals", "10"));
        assert!(!on("NumericGreaterThanEquals", "1e3"));
        assert!(!on("NumericLessThan", "-1e-3"));
        // A request value that is not a number satisfies no numeric operator.
        let c = ctx(&[("s3:max-keys", "ten")]);
        for op in ["NumericEquals", "NumericNotEquals", "NumericLessThan"] {
            assert!(
                !cond(&format!(r#"{{"{op}": {{"s3:max-keys": "10"}}}}"#), &c),
                "{op}"
            );
        }
        // A policy value that is not a number is refused.
        for v in [r#""ten""#, r#""""#, r#""NaN""#, r#""inf""#, "true"] {
            let e = statement_err(&format!(
                r#"{{"Effect": "Allow", "Principal": "*", "Action": "*", "Resource": "arn:aws:s3:::photos",
                     "Condition": {{"NumericLessThan": {{"s3:max-keys": {v}}}}}}}"#
            ));
            assert!(matches!(e, PolicyError::InvalidCondition(_)), "{v}: {e:?}");
        }
    }

    #[test]
    fn date_operators() {
        let c = ctx(&[("aws:CurrentTime", "2024-06-01T12:00:00Z")]);
        let on =
            |op: &str, v: &str| cond(&format!(r#"{{"{op}": {{"aws:CurrentTime": "{v}"}}}}"#), &c);
        assert!(on("DateLessThan", "2024-06-01T12:00:01Z"));
        assert!(!on("DateLessThan", "2024-06-01T12:00:00Z"));
        assert!(on("DateLessThanEquals", "2024-06-01T12:00:00Z"));
        assert!(on("DateGreaterThan", "2024-06-01"));
        assert!(!on("DateGreaterThan", "2024-06-02"));
        assert!(on("DateGreaterThanEquals", "2024-06-01T12:00:00.000Z"));
        assert!(on("DateEquals", "2024-06-01T14:00:00+02:00"));
        assert!(on("DateEquals", "2024-06-01T07:00:00-0500"));
        assert!(on("DateEquals", "1717243200"));
        assert!(!on("DateEquals", "1717243201"));
        assert!(on("DateNotEquals", "2024-06-01T12:00:00.5Z"));
        assert!(!on("DateNotEquals", "2024-06-01T12:00Z"));
        // Epoch seconds on the request side too.
        let c = ctx(&[("aws:EpochTime", "1717243200")]);
        assert!(cond(
            r#"{"DateLessThan": {"aws:EpochTime": "2025-01-01T00:00:00Z"}}"#,
            &c
        ));
        for v in [
            "yesterday",
            "2024-13-01",
            "2024-02-30",
            "2024-06-01T25:00:00Z",
            "2024-06-01T12:00:00+24:00",
            "",
        ] {
            let e = statement_err(&format!(
                r#"{{"Effect": "Allow", "Principal": "*", "Action": "*", "Resource": "arn:aws:s3:::photos",
                     "Condition": {{"DateLessThan": {{"aws:CurrentTime": "{v}"}}}}}}"#
            ));
            assert!(matches!(e, PolicyError::InvalidCondition(_)), "{v}: {e:?}");
        }
    }

    #[test]
    fn dates_parse() {
        assert_eq!(parse_date("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_date("1970-01-01"), Some(0));
        assert_eq!(parse_date("1970-01-01T00:00:01.250Z"), Some(1250));
        assert_eq!(parse_date("1970-01-01T00:00:01.2509999Z"), Some(1250));
        assert_eq!(parse_date("1970-01-01T01:00:00+01:00"), Some(0));
        assert_eq!(parse_date("42"), Some(42_000));
        assert_eq!(parse_date("2000-02-29T00:00:00Z"), Some(951_782_400_000));
        for bad in [
            "1900-02-29",
            "1970-01-01T",
            "1970-01-01T00",
            "1970-01-01T00:00:00.Z",
            "1970-01-01X",
            "1970-1-1",
            "99999999999999999999",
            "-5",
        ] {
            assert_eq!(parse_date(bad), None, "{bad}");
        }
    }

    #[test]
    fn bool_and_null_operators() {
        let tls = ctx(&[("aws:SecureTransport", "true")]);
        let plain = ctx(&[("aws:SecureTransport", "false")]);
        let none = Context::new();
        let deny_plain = policy(
            r#"[{"Effect": "Allow", "Principal": "*", "Action": "*", "Resource": "arn:aws:s3:::photos/*"},
                {"Effect": "Deny", "Principal": "*", "Action": "*", "Resource": "arn:aws:s3:::photos/*",
                 "Condition": {"Bool": {"aws:SecureTransport": "false"}}}]"#,
        );
        assert_eq!(get(&deny_plain, &tls), Decision::Allow);
        assert_eq!(get(&deny_plain, &plain), Decision::ExplicitDeny);
        assert_eq!(get(&deny_plain, &none), Decision::Allow);
        assert!(cond(r#"{"Bool": {"aws:SecureTransport": true}}"#, &tls));
        assert!(cond(r#"{"Bool": {"aws:SecureTransport": "TRUE"}}"#, &tls));
        assert!(!cond(r#"{"Bool": {"aws:SecureTransport": true}}"#, &plain));
        assert!(!cond(
            r#"{"Bool": {"aws:SecureTransport": true}}"#,
            &ctx(&[("aws:SecureTransport", "yes")])
        ));
        assert!(matches!(
            statement_err(
                r#"{"Effect": "Allow", "Principal": "*", "Action": "*", "Resource": "arn:aws:s3:::photos",
                    "Condition": {"Bool": {"aws:SecureTransport": "sometimes"}}}"#
            ),
            PolicyError::InvalidCondition(_)
        ));
        // Null: true wants the key absent, false present.
        assert!(cond(r#"{"Null": {"aws:SecureTransport": "true"}}"#, &none));
        assert!(!cond(r#"{"Null": {"aws:SecureTransport": "true"}}"#, &tls));
        assert!(cond(r#"{"Null": {"aws:SecureTransport": false}}"#, &plain));
        assert!(!cond(
            r#"{"Null": {"aws:SecureTransport": "false"}}"#,
            &none
        ));
        let p = allow(r#", "Condition": {"Null": {"s3:x-amz-acl": "TRUE"}}"#);
        assert_eq!(p.statements()[0].conditions[0].values, vec!["true"]);
    }

    #[test]
    fn ip_operators() {
        let from = |ip: &str| ctx(&[("aws:SourceIp", ip)]);
        let inside = |block: &str, ip: &str| {
            cond(
                &format!(r#"{{"IpAddress": {{"aws:SourceIp": {block}}}}}"#),
                &from(ip),
            )
        };
        assert!(inside(r#""10.0.0.0/8""#, "10.1.2.3"));
        assert!(!inside(r#""10.0.0.0/8""#, "11.1.2.3"));
        assert!(inside(r#""10.1.2.3""#, "10.1.2.3"));
        assert!(!inside(r#""10.1.2.3/32""#, "10.1.2.4"));
        assert!(inside(r#""10.1.2.99/24""#, "10.1.2.4"));
        assert!(inside(r#""0.0.0.0/0""#, "203.0.113.9"));
        assert!(inside(r#"["192.0.2.0/24", "10.0.0.0/8"]"#, "10.9.9.9"));
        assert!(inside(r#""2001:db8::/32""#, "2001:db8:1::5"));
        assert!(!inside(r#""2001:db8::/32""#, "2001:db9::5"));
        assert!(inside(r#""::/0""#, "::1"));
        // IPv4 blocks hold IPv4-mapped IPv6 addresses; families do not mix otherwise.
        assert!(inside(r#""10.0.0.0/8""#, "::ffff:10.0.0.1"));
        assert!(!inside(r#""10.0.0.0/8""#, "2001:db8::1"));
        assert!(!inside(r#""::/0""#, "10.0.0.1"));
        assert!(!inside(r#""10.0.0.0/8""#, "not an address"));
        let outside = |block: &str, ip: &str| {
            cond(
                &format!(r#"{{"NotIpAddress": {{"aws:SourceIp": {block}}}}}"#),
                &from(ip),
            )
        };
        assert!(outside(r#""10.0.0.0/8""#, "11.0.0.1"));
        assert!(!outside(r#""10.0.0.0/8""#, "10.0.0.1"));
        assert!(!outside(r#"["11.0.0.0/8", "10.0.0.0/8"]"#, "10.0.0.1"));
        assert!(!outside(r#""10.0.0.0/8""#, "garbage"));
        // No address at all: NotIpAddress holds (negated), IpAddress does not.
        assert!(cond(
            r#"{"NotIpAddress": {"aws:SourceIp": "10.0.0.0/8"}}"#,
            &Context::new()
        ));
        assert!(!cond(
            r#"{"IpAddress": {"aws:SourceIp": "10.0.0.0/8"}}"#,
            &Context::new()
        ));
        for bad in [
            "10.0.0.0/33",
            "10.0.0/8",
            "::/129",
            "10.0.0.0/",
            "10.0.0.0/-1",
            "host",
            "10.0.0.0/0008",
        ] {
            let e = statement_err(&format!(
                r#"{{"Effect": "Allow", "Principal": "*", "Action": "*", "Resource": "arn:aws:s3:::photos",
                     "Condition": {{"IpAddress": {{"aws:SourceIp": "{bad}"}}}}}}"#
            ));
            assert!(
                matches!(e, PolicyError::InvalidCondition(_)),
                "{bad}: {e:?}"
            );
        }
    }

    #[test]
    fn cidrs_parse_and_mask() {
        let c = Cidr::parse("192.168.1.77/24").unwrap();
        assert_eq!(c.network, "192.168.1.0".parse::<IpAddr>().unwrap());
        assert_eq!(c.prefix, 24);
        assert_eq!(Cidr::parse("::1").unwrap().prefix, 128);
        assert_eq!(Cidr::parse("1.2.3.4").unwrap().prefix, 32);
        let all = Cidr::parse("0.0.0.0/0").unwrap();
        assert!(all.contains("255.255.255.255".parse().unwrap()));
        assert!(Cidr::parse("1.2.3.4/32")
            .unwrap()
            .contains("1.2.3.4".parse().unwrap()));
        assert!(Cidr::parse("1.2.3.4/24 x").is_none());
    }

    #[test]
    fn arn_and_binary_operators() {
        let c = ctx(&[
            ("aws:SourceArn", "arn:aws:s3:::photos"),
            ("s3:x-amz-content-sha256", "AAEC"),
        ]);
        assert!(cond(
            r#"{"ArnEquals": {"aws:SourceArn": "arn:aws:s3:::photos"}}"#,
            &c
        ));
        assert!(cond(
            r#"{"ArnLike": {"aws:SourceArn": "arn:aws:s3:::pho*"}}"#,
            &c
        ));
        assert!(!cond(
            r#"{"ArnLike": {"aws:SourceArn": "arn:aws:s3:::x*"}}"#,
            &c
        ));
        assert!(cond(
            r#"{"ArnNotEquals": {"aws:SourceArn": "arn:aws:s3:::other"}}"#,
            &c
        ));
        assert!(!cond(
            r#"{"ArnNotLike": {"aws:SourceArn": "arn:aws:s3:::*"}}"#,
            &c
        ));
        assert!(cond(
            r#"{"BinaryEquals": {"s3:x-amz-content-sha256": "AAEC"}}"#,
            &c
        ));
        assert!(!cond(
            r#"{"BinaryEquals": {"s3:x-amz-content-sha256": "aaec"}}"#,
            &c
        ));
    }

    #[test]
    fn absent_keys() {
        let none = Context::new();
        // Positive operators fail, negated ones hold.
        assert!(!cond(r#"{"StringEquals": {"s3:prefix": "a"}}"#, &none));
        assert!(!cond(r#"{"StringLike": {"s3:prefix": "*"}}"#, &none));
        assert!(cond(r#"{"StringNotEquals": {"s3:prefix": "a"}}"#, &none));
        assert!(cond(r#"{"StringNotLike": {"s3:prefix": "*"}}"#, &none));
        assert!(!cond(r#"{"NumericLessThan": {"s3:max-keys": 5}}"#, &none));
        assert!(cond(r#"{"NumericNotEquals": {"s3:max-keys": 5}}"#, &none));
        assert!(!cond(r#"{"Bool": {"aws:SecureTransport": true}}"#, &none));
        // Set qualifiers: "all of nothing" holds, "any of nothing" does not.
        assert!(cond(
            r#"{"ForAllValues:StringEquals": {"s3:prefix": "a"}}"#,
            &none
        ));
        assert!(!cond(
            r#"{"ForAnyValue:StringEquals": {"s3:prefix": "a"}}"#,
            &none
        ));
        assert!(!cond(
            r#"{"ForAnyValue:StringNotEquals": {"s3:prefix": "a"}}"#,
            &none
        ));
    }

    #[test]
    fn if_exists_variants() {
        let none = Context::new();
        let small = ctx(&[("s3:max-keys", "5")]);
        let big = ctx(&[("s3:max-keys", "5000")]);
        let block = r#"{"NumericLessThanEqualsIfExists": {"s3:max-keys": 100}}"#;
        assert!(cond(block, &none));
        assert!(cond(block, &small));
        assert!(!cond(block, &big));
        let c = ctx(&[("aws:SourceIp", "10.0.0.1")]);
        for (op, present, absent) in [
            ("StringEqualsIfExists", r#""x""#, true),
            ("StringLikeIfExists", r#""*""#, true),
            ("BoolIfExists", "true", true),
            ("DateLessThanIfExists", r#""2030-01-01""#, true),
            ("ArnLikeIfExists", r#""arn:*""#, true),
        ] {
            assert_eq!(
                cond(&format!(r#"{{"{op}": {{"k": {present}}}}}"#), &none),
                absent,
                "{op}"
            );
        }
        assert!(cond(
            r#"{"IpAddressIfExists": {"aws:SourceIp": "10.0.0.0/8"}}"#,
            &c
        ));
        assert!(!cond(
            r#"{"IpAddressIfExists": {"aws:SourceIp": "11.0.0.0/8"}}"#,
            &c
        ));
        assert!(cond(
            r#"{"IpAddressIfExists": {"aws:SourceIp": "11.0.0.0/8"}}"#,
            &none
        ));
        assert!(cond(
            r#"{"StringEqualsIgnoreCaseIfExists": {"s3:x-amz-acl": "PRIVATE"}}"#,
            &ctx(&[("s3:x-amz-acl", "private")])
        ));
        let p = allow(r#", "Condition": {"ForAnyValue:StringLikeIfExists": {"k": "a*"}}"#);
        let c0 = &p.statements()[0].conditions[0];
        assert_eq!(c0.operator, Operator::StringLike);
        assert_eq!(c0.qualifier, Some(Qualifier::ForAnyValue));
        assert!(c0.if_exists);
    }

    #[test]
    fn set_qualifiers_compare_multivalued_keys() {
        let tags = Context::new()
            .with("aws:TagKeys", "env")
            .with("aws:TagKeys", "team");
        let on = |block: &str| cond(block, &tags);
        assert!(on(
            r#"{"ForAnyValue:StringEquals": {"aws:TagKeys": ["team", "cost"]}}"#
        ));
        assert!(!on(
            r#"{"ForAnyValue:StringEquals": {"aws:TagKeys": ["cost"]}}"#
        ));
        assert!(on(
            r#"{"ForAllValues:StringEquals": {"aws:TagKeys": ["env", "team", "cost"]}}"#
        ));
        assert!(!on(
            r#"{"ForAllValues:StringEquals": {"aws:TagKeys": ["env"]}}"#
        ));
        assert!(on(
            r#"{"ForAnyValue:StringNotEquals": {"aws:TagKeys": ["env"]}}"#
        ));
        assert!(!on(
            r#"{"ForAllValues:StringNotEquals": {"aws:TagKeys": ["env"]}}"#
        ));
        assert!(on(
            r#"{"ForAllValues:StringNotEquals": {"aws:TagKeys": ["cost"]}}"#
        ));
        assert!(on(
            r#"{"forallvalues:StringLike": {"aws:TagKeys": ["e*", "t*"]}}"#
        ));
        // Without a qualifier: a positive operator wants some value to match, a negated one
        // none.
        assert!(on(r#"{"StringEquals": {"aws:TagKeys": "env"}}"#));
        assert!(!on(r#"{"StringNotEquals": {"aws:TagKeys": "env"}}"#));
        assert!(on(r#"{"StringNotEquals": {"aws:TagKeys": "cost"}}"#));
    }

    #[test]
    fn unknown_operators_are_refused() {
        for op in [
            "StringEqualz",
            "ForSomeValues:StringEquals",
            "StringEqualsIfExist",
            "IfExists",
            "NullIfExists",
            "ForAnyValue:Null",
            "ForAnyValue:",
            ":StringEquals",
            "",
        ] {
            let e = statement_err(&format!(
                r#"{{"Effect": "Allow", "Principal": "*", "Action": "*", "Resource": "arn:aws:s3:::photos",
                     "Condition": {{"{op}": {{"s3:prefix": "a"}}}}}}"#
            ));
            assert!(matches!(e, PolicyError::UnknownOperator(_)), "{op}: {e:?}");
            assert!(e.to_string().starts_with("Invalid Condition type"));
        }
        for block in [
            r#"{"StringEquals": "a"}"#,
            r#"{"StringEquals": {"": "a"}}"#,
            r#"{"StringEquals": {"k": []}}"#,
            r#"{"StringEquals": {"k": null}}"#,
            r#"{"StringEquals": {"k": {"a": 1}}}"#,
            r#"{"StringEquals": {"k": ["a", ["b"]]}}"#,
        ] {
            let e = statement_err(&format!(
                r#"{{"Effect": "Allow", "Principal": "*", "Action": "*", "Resource": "arn:aws:s3:::photos", "Condition": {block}}}"#
            ));
            assert!(
                matches!(e, PolicyError::InvalidCondition(_)),
                "{block}: {e:?}"
            );
        }
        for (name, op) in OPERATORS {
            assert_eq!(Operator::parse(name), Some(op));
            assert_eq!(op.name(), name);
            assert_eq!(op.to_string(), name);
        }
    }

    #[test]
    fn condition_values_may_be_numbers_and_booleans() {
        let p = allow(r#", "Condition": {"StringEquals": {"s3:max-keys": [10, true, "x"]}}"#);
        assert_eq!(
            p.statements()[0].conditions[0].values,
            vec!["10", "true", "x"]
        );
        assert!(cond(
            r#"{"StringEquals": {"s3:max-keys": 10}}"#,
            &ctx(&[("s3:max-keys", "10")])
        ));
        // An empty Condition object is no condition.
        assert_eq!(
            get(&allow(r#", "Condition": {}"#), &Context::new()),
            Decision::Allow
        );
    }

    #[test]
    fn context_keys_are_case_insensitive() {
        let mut c = Context::new();
        c.insert("S3:ExistingObjectTag/Color", "red");
        assert_eq!(c.get("s3:existingobjecttag/color"), ["red"]);
        assert_eq!(c.get("S3:EXISTINGOBJECTTAG/COLOR"), ["red"]);
        assert!(cond(
            r#"{"StringEquals": {"s3:ExistingObjectTag/color": "red"}}"#,
            &c
        ));
        c.set(
            "s3:existingObjectTag/color",
            vec!["blue".into(), "green".into()],
        );
        assert_eq!(c.get("s3:existingobjecttag/color").len(), 2);
        c.set("s3:ExistingObjectTag/Color", vec![]);
        assert!(c.get("s3:existingobjecttag/color").is_empty());
        assert_eq!(c, Context::new());
    }

    #[test]
    fn policy_variables() {
        let p = policy(
            r#"{"Effect": "Allow", "Principal": "*", "Action": "s3:*",
                "Resource": "arn:aws:s3:::photos/home/${aws:username}/*"}"#,
        );
        let alice = ctx(&[("aws:username", "alice")]);
        let at = |k: &str, c: &Context| {
            ask(
                &p,
                Principal::User("alice"),
                "s3:PutObject",
                &object_arn(BUCKET, k),
                c,
            )
        };
        assert_eq!(at("home/alice/a.txt", &alice), Decision::Allow);
        assert_eq!(at("home/bob/a.txt", &alice), Decision::NotApplicable);
        // No value: the resource matches nothing (not even the literal text).
        assert_eq!(
            at("home/${aws:username}/a", &Context::new()),
            Decision::NotApplicable
        );
        // A substituted value is literal: a user named "*" gets only "home/*/...".
        let star = ctx(&[("aws:username", "*")]);
        assert_eq!(at("home/*/a", &star), Decision::Allow);
        assert_eq!(at("home/bob/a", &star), Decision::NotApplicable);
        // In condition values too, with defaults and the escapes.
        let c = ctx(&[("aws:username", "alice"), ("s3:prefix", "home/alice/")]);
        assert!(cond(
            r#"{"StringEquals": {"s3:prefix": "home/${aws:username}/"}}"#,
            &c
        ));
        assert!(cond(
            r#"{"StringLike": {"s3:prefix": "home/${aws:username}/*"}}"#,
            &c
        ));
        assert!(cond(
            r#"{"StringEquals": {"s3:prefix": "${aws:nothing, 'home'}/alice/"}}"#,
            &c
        ));
        assert!(!cond(
            r#"{"StringEquals": {"s3:prefix": "${aws:nothing}"}}"#,
            &c
        ));
        let c = ctx(&[("s3:prefix", "a*?$")]);
        assert!(cond(
            r#"{"StringEquals": {"s3:prefix": "a${*}${?}${$}"}}"#,
            &c
        ));
        assert!(cond(
            r#"{"StringLike": {"s3:prefix": "a${*}${?}${$}"}}"#,
            &c
        ));
        assert!(!cond(
            r#"{"StringLike": {"s3:prefix": "a${*}${?}${$}"}}"#,
            &ctx(&[("s3:prefix", "ab?$")])
        ));
        // An unterminated variable is text.
        assert!(cond(
            r#"{"StringEquals": {"s3:prefix": "a${b"}}"#,
            &ctx(&[("s3:prefix", "a${b")])
        ));
        // 2008-10-17 has no variables: the text is literal.
        let old = BucketPolicy::parse(
            r#"{"Version": "2008-10-17", "Statement": {"Effect": "Allow", "Principal": "*", "Action": "s3:*",
                "Resource": "arn:aws:s3:::photos/home/${aws:username}/*"}}"#,
            BUCKET,
        )
        .unwrap();
        let ask_old = |k: &str| {
            ask(
                &old,
                Principal::User("alice"),
                "s3:GetObject",
                &object_arn(BUCKET, k),
                &alice,
            )
        };
        assert_eq!(ask_old("home/alice/a"), Decision::NotApplicable);
        assert_eq!(ask_old("home/${aws:username}/a"), Decision::Allow);
    }

    #[test]
    fn public_policies() {
        let public = |statements: &str| policy(statements).is_public();
        let st = |principal: &str, condition: &str| {
            format!(
                r#"{{"Effect": "Allow", {principal}, "Action": "s3:GetObject", "Resource": "arn:aws:s3:::photos/*" {condition}}}"#
            )
        };
        let any = r#""Principal": "*""#;
        assert!(public(&st(any, "")));
        assert!(public(&st(r#""Principal": {"AWS": "*"}"#, "")));
        assert!(public(&st(r#""Principal": {"AWS": ["alice", "*"]}"#, "")));
        assert!(public(&st(r#""NotPrincipal": {"AWS": "alice"}"#, "")));
        assert!(!public(&st(r#""NotPrincipal": "*""#, "")));
        assert!(!public(&st(r#""Principal": {"AWS": "alice"}"#, "")));
        assert!(!public(&st(
            r#""Principal": {"AWS": ["arn:aws:iam::123456789012:root"]}"#,
            ""
        )));
        // A deny never makes a bucket public.
        assert!(!public(
            r#"{"Effect": "Deny", "Principal": "*", "Action": "*", "Resource": "arn:aws:s3:::photos/*"}"#
        ));
        // Pinned to fixed networks or callers: not public.
        let pinned = |condition: &str| !public(&st(any, &format!(r#", "Condition": {condition}"#)));
        assert!(pinned(r#"{"IpAddress": {"aws:SourceIp": "10.0.0.0/8"}}"#));
        assert!(pinned(
            r#"{"IpAddress": {"aws:SourceIp": ["192.0.2.0/24", "2001:db8::/48"]}}"#
        ));
        assert!(pinned(
            r#"{"StringEquals": {"aws:SourceVpc": "vpc-1a2b3c"}}"#
        ));
        assert!(pinned(
            r#"{"StringEquals": {"aws:SourceVpce": "vpce-1a2b3c"}}"#
        ));
        assert!(pinned(
            r#"{"ArnEquals": {"aws:SourceArn": "arn:aws:cloudfront::1:distribution/X"}}"#
        ));
        assert!(pinned(
            r#"{"StringEquals": {"aws:SourceAccount": "123456789012"}}"#
        ));
        assert!(pinned(
            r#"{"StringEquals": {"aws:PrincipalOrgID": "o-abc"}}"#
        ));
        assert!(pinned(
            r#"{"StringEquals": {"aws:username": ["alice", "bob"]}}"#
        ));
        assert!(pinned(
            r#"{"StringLike": {"aws:SourceArn": "arn:aws:s3:::logs"}}"#
        ));
        // Other conditions alongside do not undo the pin.
        assert!(pinned(
            r#"{"IpAddress": {"aws:SourceIp": "10.0.0.0/8"}, "Bool": {"aws:SecureTransport": true}}"#
        ));
        // Not pinned: wildcards, variables, wide blocks, IfExists, ForAllValues, keys that say
        // nothing of who or where the caller is, negated operators.
        let open = |condition: &str| public(&st(any, &format!(r#", "Condition": {condition}"#)));
        assert!(open(r#"{"IpAddress": {"aws:SourceIp": "0.0.0.0/0"}}"#));
        assert!(open(r#"{"IpAddress": {"aws:SourceIp": "0.0.0.0/1"}}"#));
        assert!(open(
            r#"{"IpAddress": {"aws:SourceIp": ["10.0.0.0/8", "::/0"]}}"#
        ));
        assert!(open(r#"{"IpAddress": {"aws:SourceIp": "2001::/16"}}"#));
        assert!(open(r#"{"NotIpAddress": {"aws:SourceIp": "10.0.0.0/8"}}"#));
        assert!(open(
            r#"{"IpAddressIfExists": {"aws:SourceIp": "10.0.0.0/8"}}"#
        ));
        assert!(open(r#"{"StringLike": {"aws:SourceVpc": "vpc-*"}}"#));
        assert!(open(
            r#"{"StringEquals": {"aws:SourceVpc": ["vpc-1", "vpc-?"]}}"#
        ));
        assert!(open(
            r#"{"StringEquals": {"aws:username": "${aws:username}"}}"#
        ));
        assert!(open(r#"{"StringNotEquals": {"aws:SourceVpc": "vpc-1"}}"#));
        assert!(open(
            r#"{"ForAllValues:StringEquals": {"aws:SourceVpc": "vpc-1"}}"#
        ));
        assert!(open(
            r#"{"StringEquals": {"aws:Referer": "http://example.com/"}}"#
        ));
        assert!(open(r#"{"Bool": {"aws:SecureTransport": true}}"#));
        assert!(open(r#"{"StringEquals": {"aws:SourceIp": "10.0.0.1"}}"#));
        // One public statement among private ones is enough.
        assert!(public(&format!(
            "[{}, {}]",
            st(r#""Principal": {"AWS": "alice"}"#, ""),
            st(any, "")
        )));
    }

    #[test]
    fn globs_match_and_stay_fast() {
        let m = |p: &str, v: &str| glob(&tokens(p), &v.chars().collect::<Vec<_>>());
        assert!(m("", ""));
        assert!(!m("", "a"));
        assert!(m("*", ""));
        assert!(m("*", "anything/at/all"));
        assert!(m("a*b*c", "aXXbYYc"));
        assert!(m("a*b*c", "abc"));
        assert!(!m("a*b*c", "acb"));
        assert!(m("*.jpg", "x.jpg.jpg"));
        assert!(!m("?", ""));
        assert!(m("??", "éa"));
        assert!(m("a**b", "ab"));
        // A pathological pattern against a long value finishes quickly (quadratic at worst).
        let value = "a".repeat(5000);
        let pattern = format!("{}b", "*a".repeat(200));
        assert!(!m(&pattern, &value));
    }

    #[test]
    fn long_client_input_is_quoted_short() {
        let long = "x".repeat(1000);
        let e = statement_err(&format!(
            r#"{{"Effect": "{long}", "Principal": "*", "Action": "*", "Resource": "arn:aws:s3:::photos"}}"#
        ));
        assert!(e.to_string().len() < 200, "{e}");
        let e = statement_err(&format!(
            r#"{{"Effect": "Allow", "Principal": "*", "Action": "*", "Resource": "arn:aws:s3:::é{long}"}}"#
        ));
        assert!(e.to_string().len() < 200, "{e}");
    }

    #[test]
    fn a_typical_website_policy() {
        // The policy of S3's static website walkthrough, plus an HTTPS-only deny.
        let p = BucketPolicy::parse(
            r#"{
              "Version": "2012-10-17",
              "Statement": [
                {"Sid": "PublicReadGetObject", "Effect": "Allow", "Principal": "*",
                 "Action": ["s3:GetObject"], "Resource": ["arn:aws:s3:::photos/*"]},
                {"Sid": "HttpsOnly", "Effect": "Deny", "Principal": {"AWS": "*"}, "Action": "s3:*",
                 "Resource": ["arn:aws:s3:::photos", "arn:aws:s3:::photos/*"],
                 "Condition": {"Bool": {"aws:SecureTransport": "false"}}}
              ]
            }"#,
            BUCKET,
        )
        .unwrap();
        assert!(p.is_public());
        let https = ctx(&[(keys::SECURE_TRANSPORT, "true")]);
        let http = ctx(&[(keys::SECURE_TRANSPORT, "false")]);
        assert_eq!(get(&p, &https), Decision::Allow);
        assert_eq!(get(&p, &http), Decision::ExplicitDeny);
        assert_eq!(
            ask(
                &p,
                Principal::Anonymous,
                actions::LIST_BUCKET,
                &bucket_arn(BUCKET),
                &https
            ),
            Decision::NotApplicable
        );
    }
}
