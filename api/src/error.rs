//! S3 error codes and the HTTP status each one carries.
//!
//! Clients (the AWS SDKs above all) branch on the `<Code>` string and the status together, so
//! the pair is fixed here once and both the server and the client crates use it.

/// An S3 error code. `code()` is the string in the XML `<Code>` element.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum S3ErrorCode {
    AuthorizationHeaderMalformed,
    AuthorizationQueryParametersError,
    EntityTooSmall,
    InvalidAccessKeyId,
    InvalidPart,
    InvalidPartOrder,
    MalformedXML,
    NoSuchUpload,
    RequestTimeTooSkewed,
    SignatureDoesNotMatch,
    XAmzContentSHA256Mismatch,
    InvalidObjectState,
    AccessDenied,
    BadDigest,
    BucketAlreadyExists,
    BucketAlreadyOwnedByYou,
    BucketNotEmpty,
    EntityTooLarge,
    IncompleteBody,
    InternalError,
    InvalidArgument,
    InvalidBucketName,
    InvalidDigest,
    InvalidRange,
    InvalidRequest,
    InvalidURI,
    KeyTooLongError,
    MetadataTooLarge,
    MethodNotAllowed,
    MissingContentLength,
    NoSuchBucket,
    NoSuchKey,
    NotImplemented,
    OperationAborted,
    ConditionalRequestConflict,
    InsufficientStorage,
    PreconditionFailed,
    RequestHeaderSectionTooLarge,
    /// A bearer token that is malformed, wrongly signed, or signed by an unknown key: 401.
    InvalidToken,
    /// A bearer token past its `exp` (or before its `nbf`): 401.
    ExpiredToken,
    /// The request body stopped arriving (or arrived too slowly) and was dropped: 400.
    RequestTimeout,
    ServiceUnavailable,
    SlowDown,
    /// A per-user limit (leased or reserved KV bytes, leases) is reached: 429, retry after
    /// releasing. Not an AWS code; AWS says SlowDown with 503 for its own throttling.
    TooManyRequests,
    /// A write would take a bucket past its quota (`x-yutu-quota`): 403, as Ceph RGW
    /// answers. Not an AWS code (S3 has no bucket quotas).
    QuotaExceeded,
    /// An ACL document or grant that cannot be read: 400.
    MalformedACLError,
    /// PutBucketAcl/PutObjectAcl with neither an ACL header nor a document: 400.
    MissingSecurityHeader,
    /// GetBucketCors of a bucket without a CORS configuration: 404.
    NoSuchCORSConfiguration,
    /// GetBucketPolicy of a bucket without a policy: 404.
    NoSuchBucketPolicy,
    /// A bucket policy that cannot be read or names what it may not: 400.
    MalformedPolicy,
    /// GetPublicAccessBlock of a bucket without one: 404.
    NoSuchPublicAccessBlockConfiguration,
    /// GetBucketOwnershipControls of a bucket without a setting: 404.
    OwnershipControlsNotFoundError,
    /// An ACL on a bucket whose ownership is BucketOwnerEnforced (ACLs are off): 400.
    AccessControlListNotSupported,
    /// BucketOwnerEnforced on a bucket whose ACL is not private: 400.
    InvalidBucketAclWithObjectOwnership,
    /// An ACL grant by an e-mail address no user has: 400.
    UnresolvableGrantByEmailAddress,
    /// A CORS request (preflight) no rule allows: 403.
    AccessForbidden,
    /// A POST Object whose body is not well-formed multipart/form-data: 400.
    MalformedPOSTRequest,
}

impl S3ErrorCode {
    /// The `<Code>` string.
    pub fn code(self) -> &'static str {
        use S3ErrorCode::*;
        match self {
            AuthorizationHeaderMalformed => "AuthorizationHeaderMalformed",
            AuthorizationQueryParametersError => "AuthorizationQueryParametersError",
            EntityTooSmall => "EntityTooSmall",
            InvalidAccessKeyId => "InvalidAccessKeyId",
            InvalidPart => "InvalidPart",
            InvalidPartOrder => "InvalidPartOrder",
            MalformedXML => "MalformedXML",
            NoSuchUpload => "NoSuchUpload",
            RequestTimeTooSkewed => "RequestTimeTooSkewed",
            SignatureDoesNotMatch => "SignatureDoesNotMatch",
            XAmzContentSHA256Mismatch => "XAmzContentSHA256Mismatch",
            InvalidObjectState => "InvalidObjectState",
            AccessDenied => "AccessDenied",
            BadDigest => "BadDigest",
            BucketAlreadyExists => "BucketAlreadyExists",
            BucketAlreadyOwnedByYou => "BucketAlreadyOwnedByYou",
            BucketNotEmpty => "BucketNotEmpty",
            EntityTooLarge => "EntityTooLarge",
            IncompleteBody => "IncompleteBody",
            InternalError => "InternalError",
            InvalidArgument => "InvalidArgument",
            InvalidBucketName => "InvalidBucketName",
            InvalidDigest => "InvalidDigest",
            InvalidRange => "InvalidRange",
            InvalidRequest => "InvalidRequest",
            InvalidURI => "InvalidURI",
            KeyTooLongError => "KeyTooLongError",
            MetadataTooLarge => "MetadataTooLarge",
            MethodNotAllowed => "MethodNotAllowed",
            MissingContentLength => "MissingContentLength",
            NoSuchBucket => "NoSuchBucket",
            NoSuchKey => "NoSuchKey",
            NotImplemented => "NotImplemented",
            OperationAborted => "OperationAborted",
            ConditionalRequestConflict => "ConditionalRequestConflict",
            InsufficientStorage => "InsufficientStorage",
            TooManyRequests => "TooManyRequests",
            QuotaExceeded => "QuotaExceeded",
            MalformedACLError => "MalformedACLError",
            MissingSecurityHeader => "MissingSecurityHeader",
            NoSuchCORSConfiguration => "NoSuchCORSConfiguration",
            NoSuchBucketPolicy => "NoSuchBucketPolicy",
            MalformedPolicy => "MalformedPolicy",
            NoSuchPublicAccessBlockConfiguration => "NoSuchPublicAccessBlockConfiguration",
            OwnershipControlsNotFoundError => "OwnershipControlsNotFoundError",
            AccessControlListNotSupported => "AccessControlListNotSupported",
            InvalidBucketAclWithObjectOwnership => "InvalidBucketAclWithObjectOwnership",
            UnresolvableGrantByEmailAddress => "UnresolvableGrantByEmailAddress",
            AccessForbidden => "AccessForbidden",
            MalformedPOSTRequest => "MalformedPOSTRequest",
            PreconditionFailed => "PreconditionFailed",
            RequestHeaderSectionTooLarge => "RequestHeaderSectionTooLarge",
            ServiceUnavailable => "ServiceUnavailable",
            SlowDown => "SlowDown",
            RequestTimeout => "RequestTimeout",
            InvalidToken => "InvalidToken",
            ExpiredToken => "ExpiredToken",
        }
    }

    /// The HTTP status S3 answers with.
    pub fn status(self) -> u16 {
        use S3ErrorCode::*;
        match self {
            AuthorizationHeaderMalformed => 400,
            AuthorizationQueryParametersError => 400,
            EntityTooSmall => 400,
            InvalidAccessKeyId => 403,
            InvalidPart => 400,
            InvalidPartOrder => 400,
            MalformedXML => 400,
            NoSuchUpload => 404,
            RequestTimeTooSkewed => 403,
            SignatureDoesNotMatch => 403,
            XAmzContentSHA256Mismatch => 400,
            InvalidObjectState => 403,
            QuotaExceeded => 403,
            MalformedACLError | MissingSecurityHeader => 400,
            NoSuchCORSConfiguration => 404,
            NoSuchBucketPolicy | NoSuchPublicAccessBlockConfiguration => 404,
            OwnershipControlsNotFoundError => 404,
            AccessControlListNotSupported | InvalidBucketAclWithObjectOwnership => 400,
            UnresolvableGrantByEmailAddress => 400,
            MalformedPolicy => 400,
            MalformedPOSTRequest => 400,
            AccessForbidden => 403,
            AccessDenied => 403,
            BucketAlreadyExists
            | BucketAlreadyOwnedByYou
            | BucketNotEmpty
            | OperationAborted
            | ConditionalRequestConflict => 409,
            InternalError => 500,
            InvalidRange => 416,
            MethodNotAllowed => 405,
            MissingContentLength => 411,
            NoSuchBucket | NoSuchKey => 404,
            NotImplemented => 501,
            PreconditionFailed => 412,
            ServiceUnavailable | SlowDown => 503,
            InsufficientStorage => 507,
            TooManyRequests => 429,
            InvalidToken | ExpiredToken => 401,
            BadDigest
            | EntityTooLarge
            | IncompleteBody
            | InvalidArgument
            | InvalidBucketName
            | InvalidDigest
            | InvalidRequest
            | InvalidURI
            | KeyTooLongError
            | MetadataTooLarge
            | RequestHeaderSectionTooLarge
            | RequestTimeout => 400,
        }
    }

    /// A default human-readable message, worded after S3's.
    pub fn default_message(self) -> &'static str {
        use S3ErrorCode::*;
        match self {
            AuthorizationHeaderMalformed => "The authorization header is malformed.",
            AuthorizationQueryParametersError => "Error parsing the X-Amz-Credential parameter.",
            EntityTooSmall => "Your proposed upload is smaller than the minimum allowed object size.",
            InvalidAccessKeyId => "The AWS access key Id you provided does not exist in our records.",
            InvalidPart => "One or more of the specified parts could not be found. The part may not have been uploaded, or the specified entity tag may not match the part's entity tag.",
            InvalidPartOrder => "The list of parts was not in ascending order. Parts must be ordered by part number.",
            MalformedXML => "The XML you provided was not well-formed or did not validate against our published schema.",
            NoSuchUpload => "The specified upload does not exist. The upload ID may be invalid, or the upload may have been aborted or completed.",
            RequestTimeTooSkewed => "The difference between the request time and the server's time is too large.",
            SignatureDoesNotMatch => "The request signature we calculated does not match the signature you provided. Check your key and signing method.",
            XAmzContentSHA256Mismatch => "The provided 'x-amz-content-sha256' header does not match what was computed.",
            InvalidObjectState => "The operation is not valid for the object's state.",
            AccessDenied => "Access Denied",
            BadDigest => "The Content-MD5 or checksum you specified did not match what we received.",
            BucketAlreadyExists => "The requested bucket name is not available.",
            BucketAlreadyOwnedByYou => {
                "Your previous request to create the named bucket succeeded and you already own it."
            }
            BucketNotEmpty => "The bucket you tried to delete is not empty.",
            EntityTooLarge => "Your proposed upload exceeds the maximum allowed object size.",
            IncompleteBody => "You did not provide the number of bytes specified by the Content-Length HTTP header.",
            InternalError => "We encountered an internal error. Please try again.",
            InvalidArgument => "Invalid Argument",
            InvalidBucketName => "The specified bucket is not valid.",
            InvalidDigest => "The Content-MD5 you specified is not valid.",
            InvalidRange => "The requested range is not satisfiable",
            InvalidRequest => "Invalid Request",
            InvalidURI => "Couldn't parse the specified URI.",
            KeyTooLongError => "Your key is too long.",
            MetadataTooLarge => "Your metadata headers exceed the maximum allowed metadata size.",
            MethodNotAllowed => "The specified method is not allowed against this resource.",
            MissingContentLength => "You must provide the Content-Length HTTP header.",
            NoSuchBucket => "The specified bucket does not exist.",
            NoSuchKey => "The specified key does not exist.",
            NotImplemented => "A header or query you provided implies functionality that is not implemented.",
            OperationAborted => "A conflicting conditional operation is currently in progress against this resource. Please try again.",
            PreconditionFailed => "At least one of the preconditions you specified did not hold.",
            RequestHeaderSectionTooLarge => "Your request header section exceeds the maximum allowed size.",
            ServiceUnavailable => "Please reduce your request rate.",
            SlowDown => "Please reduce your request rate.",
            InvalidToken => "The provided token is malformed or otherwise invalid.",
            ExpiredToken => "The provided token has expired.",
            RequestTimeout => "Your socket connection to the server was not read from or written to within the timeout period.",
            ConditionalRequestConflict => "A conflicting operation occurred. If using PutObject you can retry the request.",
            InsufficientStorage => "There is not enough storage space to keep the object durably.",
            TooManyRequests => "A per-user limit is reached; release what you hold and retry.",
            QuotaExceeded => "The bucket's quota does not leave room for this write.",
            MalformedACLError => "The XML you provided was not well-formed or did not validate against our published schema.",
            MissingSecurityHeader => "Your request was missing a required header.",
            NoSuchCORSConfiguration => "The CORS configuration does not exist",
            NoSuchBucketPolicy => "The bucket policy does not exist",
            MalformedPolicy => "Policies must be valid JSON and the first byte must be '{'",
            NoSuchPublicAccessBlockConfiguration => "The public access block configuration was not found",
            OwnershipControlsNotFoundError => "The bucket ownership controls were not found",
            AccessControlListNotSupported => "The bucket does not allow ACLs",
            InvalidBucketAclWithObjectOwnership => "Bucket cannot have ACLs set with ObjectOwnership's BucketOwnerEnforced setting",
            UnresolvableGrantByEmailAddress => "The e-mail address you provided does not match any account on record.",
            MalformedPOSTRequest => "The body of your POST request is not well-formed multipart/form-data.",
            AccessForbidden => "CORSResponse: This CORS request is not allowed. This is usually because the evalution of Origin, request method / Access-Control-Request-Method or Access-Control-Request-Headers are not whitelisted by the resource's CORS spec.",
        }
    }
}

impl std::fmt::Display for S3ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.code())
    }
}

/// The error body of the JSON APIs (`/v1/...`, `/admin/...`): the same codes and statuses as
/// the S3 API's XML `<Error>`, as JSON, which is what the clients of those APIs parse anyway.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct JsonError {
    pub code: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default)]
    pub resource: String,
    #[serde(default)]
    pub request_id: String,
}

/// Whether the answers under `path` are JSON (their errors included): the KV API and the
/// admin API.
pub fn json_api(path: &str) -> bool {
    path.starts_with("/v1/") || path.starts_with("/admin/")
}
