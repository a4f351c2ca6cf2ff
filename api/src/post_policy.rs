//! Browser-based uploads (S3's POST Object with an HTML form): the policy document, the
//! form's text fields, the signatures and the success responses. Pure functions over strings
//! and a caller-supplied clock: no I/O, so the node and its tests check one set of rules.
//!
//! A form upload carries its own authorisation instead of an `Authorization` header: a
//! base64 JSON *policy* saying what the form may contain and until when, signed with the
//! uploader's secret (SigV4 or the older SigV2). The node:
//!
//! 1. collects the text fields that come before the `file` part into [`FormFields`] (fields
//!    after the file are ignored, as S3 does) and sets `bucket` to the bucket of the URL;
//! 2. reads the credential ([`credential`]), looks up the access key's secret and checks the
//!    signature over the policy text exactly as sent ([`verify`]);
//! 3. parses the policy ([`PolicyDocument::parse`]) and checks the fields against it
//!    ([`PolicyDocument::check_fields`]) before taking the file, bounding the body with
//!    [`PolicyDocument::content_length_range`], then checks the size it got
//!    ([`PolicyDocument::check_content_length`]);
//! 4. stores the file under [`FormFields::resolve_key`] and answers with
//!    [`success_action_status`] or a redirect to [`success_redirect`].
//!
//! ```
//! use std::time::{Duration, SystemTime, UNIX_EPOCH};
//! use base64::Engine as _;
//! use yutu_api::post_policy::{credential, sign_v2, verify, FormFields, PolicyDocument};
//!
//! let json = r#"{"expiration": "2030-01-01T00:00:00.000Z",
//!                "conditions": [{"bucket": "photos"}, ["starts-with", "$key", "user/"]]}"#;
//! let policy = base64::engine::general_purpose::STANDARD.encode(json);
//! let mut fields = FormFields::new();
//! fields.push("key", "user/${filename}").unwrap();
//! fields.push("AWSAccessKeyId", "AKID").unwrap();
//! fields.push("policy", policy.as_str()).unwrap();
//! fields.push("signature", sign_v2("secret", &policy)).unwrap();
//! fields.set("bucket", "photos"); // from the URL, never from the form
//!
//! let cred = credential(&fields).unwrap();
//! assert_eq!(cred.access_key(), "AKID");
//! assert!(verify(&cred, "secret", &policy));
//! let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
//! let doc = PolicyDocument::parse(&policy, now).unwrap();
//! doc.check(&fields, 1234).unwrap();
//! assert_eq!(fields.resolve_key(Some("cat.jpg")).unwrap(), "user/cat.jpg");
//! ```

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use serde_json::Value;
use sha1::Sha1;
use subtle::ConstantTimeEq;

use crate::calendar::{days_from_civil, days_in_month};
use crate::key::{validate_object_key, KeyError};
use crate::sigv4::{self, Scope};
use crate::S3ErrorCode;

/// Longest policy accepted, in bytes of its base64 text (and so of its JSON). S3 bounds the
/// whole form's text at 20 KiB; bounding here keeps a hostile form from making the node
/// decode and parse megabytes before any signature is known to be good.
pub const MAX_POLICY_LEN: usize = 20 * 1024;

/// Most conditions a policy may hold (an object condition with several names counts once
/// per name): each is checked against the form, so the count bounds the work per upload.
pub const MAX_CONDITIONS: usize = 256;

/// Most text fields a form may carry: lookups are linear, so the count bounds their cost.
pub const MAX_FORM_FIELDS: usize = 1024;

/// Longest `success_action_redirect` accepted: it becomes a `Location` header, and every
/// header of the node's answer must stay within what clients and proxies accept.
pub const MAX_REDIRECT_LEN: usize = 2048;

/// Longest piece of a client's input quoted back in an error message, in bytes.
const MAX_QUOTE: usize = 64;

/// Why a form upload was refused. Each variant says which S3 error it becomes
/// ([`PostPolicyError::s3_code`]); the `Display` text is the message S3 would give where S3
/// has a fixed one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PostPolicyError {
    /// The base64 policy (or its JSON) is over [`MAX_POLICY_LEN`].
    #[error("the policy document is {len} bytes long; the maximum is {max}")]
    PolicyTooLarge { len: usize, max: usize },
    /// The `policy` field is not standard base64.
    #[error("the policy document is not valid base64")]
    Base64,
    /// The decoded policy is not UTF-8 JSON.
    #[error("the policy document is not valid JSON: {0}")]
    Json(String),
    /// The JSON is not a policy: a missing or bad `expiration`, a condition of an unknown
    /// shape or operator, a field name without `$`, a bad `content-length-range`.
    #[error("invalid policy document: {0}")]
    Malformed(String),
    /// More than [`MAX_CONDITIONS`] conditions.
    #[error("the policy document has more than {max} conditions")]
    TooManyConditions { max: usize },
    /// The policy's `expiration` is not after the request's time.
    #[error("Invalid according to Policy: Policy expired.")]
    Expired,
    /// A condition does not hold for the form; carries the condition as S3 prints it,
    /// `["eq", "$key", "v"]`.
    #[error("Invalid according to Policy: Policy Condition failed: {0}")]
    ConditionFailed(String),
    /// A form field that no condition names (S3 requires every field but the signature,
    /// the file, the policy and `x-ignore-*` to be in the policy, so a signer knows all a
    /// form can set).
    #[error("Invalid according to Policy: Extra input fields: {0}")]
    ExtraField(String),
    /// The file is over the policy's `content-length-range`.
    #[error("Your proposed upload exceeds the maximum allowed size")]
    EntityTooLarge { size: u64, max: u64 },
    /// The file is under the policy's `content-length-range`.
    #[error("Your proposed upload is smaller than the minimum allowed size")]
    EntityTooSmall { size: u64, min: u64 },
    /// A field name given twice (names compare case-insensitively): which one counts would
    /// be ambiguous, and the policy check and the upload could read different ones.
    #[error("the form field {0:?} appears more than once")]
    DuplicateField(String),
    /// More than [`MAX_FORM_FIELDS`] fields.
    #[error("the form has more than {max} fields")]
    TooManyFields { max: usize },
    /// A field the upload needs (`key`, `x-amz-credential`, ...) is absent or empty.
    #[error("the form has no {0} field")]
    MissingField(&'static str),
    /// The key uses `${filename}` and the file part named no file.
    #[error("the key uses ${{filename}} but the file part has no file name")]
    NoFilename,
    /// The key, after `${filename}`, is not a valid object key.
    #[error("invalid key: {0}")]
    InvalidKey(KeyError),
    /// Both SigV2 (`AWSAccessKeyId`, `signature`) and SigV4 (`x-amz-*`) credentials: which
    /// one authorises the upload would be ambiguous.
    #[error("the form mixes Signature Version 2 and Signature Version 4 fields")]
    MixedSignatures,
    /// No credential fields at all: an anonymous upload, which the caller may allow or not.
    #[error("the form carries no credentials")]
    NoCredentials,
    /// `x-amz-algorithm` is not `AWS4-HMAC-SHA256`.
    #[error("unsupported x-amz-algorithm {0:?}")]
    UnsupportedAlgorithm(String),
    /// `x-amz-credential` is not `KEY/YYYYMMDD/REGION/s3/aws4_request`, `x-amz-date` is not
    /// `YYYYMMDDTHHMMSSZ`, or their days differ.
    #[error("malformed credential: {0}")]
    MalformedCredential(String),
    /// `success_action_redirect` is not an absolute http(s) URL the node can put in a
    /// `Location` header. S3 then falls back to `success_action_status`.
    #[error("invalid success_action_redirect: {0}")]
    InvalidRedirect(&'static str),
}

impl PostPolicyError {
    /// The S3 error this refusal is answered with. S3's own codes for a bad policy
    /// (`InvalidPolicyDocument`) and a bad form (`MalformedPOSTRequest`) are not in
    /// [`S3ErrorCode`]; both are 400 like `InvalidArgument`, which stands in for them.
    pub fn s3_code(&self) -> S3ErrorCode {
        use PostPolicyError::*;
        match self {
            Expired | ConditionFailed(_) | ExtraField(_) | NoCredentials => {
                S3ErrorCode::AccessDenied
            }
            EntityTooLarge { .. } => S3ErrorCode::EntityTooLarge,
            EntityTooSmall { .. } => S3ErrorCode::EntityTooSmall,
            InvalidKey(KeyError::TooLong(_)) => S3ErrorCode::KeyTooLongError,
            PolicyTooLarge { .. }
            | Base64
            | Json(_)
            | Malformed(_)
            | TooManyConditions { .. }
            | DuplicateField(_)
            | TooManyFields { .. }
            | MissingField(_)
            | NoFilename
            | InvalidKey(_)
            | MixedSignatures
            | UnsupportedAlgorithm(_)
            | MalformedCredential(_)
            | InvalidRedirect(_) => S3ErrorCode::InvalidArgument,
        }
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

/// One condition of a policy. Field names are kept as the policy wrote them (without the
/// `$`) and compared with form field names ASCII-case-insensitively, as S3 does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    /// `{"field": "value"}` or `["eq", "$field", "value"]`: the field equals the value
    /// exactly (values are case-sensitive).
    Eq { field: String, value: String },
    /// `["starts-with", "$field", "prefix"]`: the field begins with the prefix; an empty
    /// prefix allows any value.
    StartsWith { field: String, prefix: String },
    /// `["content-length-range", min, max]`: the file is `min..=max` bytes.
    ContentLengthRange { min: u64, max: u64 },
}

impl Condition {
    /// The form field the condition is about (none for `content-length-range`).
    pub fn field(&self) -> Option<&str> {
        match self {
            Condition::Eq { field, .. } | Condition::StartsWith { field, .. } => Some(field),
            Condition::ContentLengthRange { .. } => None,
        }
    }

    /// Whether the condition names `name` (ASCII-case-insensitively).
    fn covers(&self, name: &str) -> bool {
        self.field().is_some_and(|f| f.eq_ignore_ascii_case(name))
    }
}

/// A JSON string literal (quoted and escaped); infallible, unlike `serde_json::to_string`.
fn json_str(s: &str) -> String {
    Value::String(s.to_owned()).to_string()
}

/// The condition as S3 quotes it in "Policy Condition failed" messages, in array form.
impl fmt::Display for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Condition::Eq { field, value } => write!(
                f,
                "[\"eq\", {}, {}]",
                json_str(&format!("${field}")),
                json_str(value)
            ),
            Condition::StartsWith { field, prefix } => write!(
                f,
                "[\"starts-with\", {}, {}]",
                json_str(&format!("${field}")),
                json_str(prefix)
            ),
            Condition::ContentLengthRange { min, max } => {
                write!(f, "[\"content-length-range\", {min}, {max}]")
            }
        }
    }
}

/// A parsed, unexpired POST policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyDocument {
    expiration: SystemTime,
    conditions: Vec<Condition>,
}

impl PolicyDocument {
    /// Parses the `policy` form field: base64 (ASCII whitespace inside it is skipped, since
    /// some encoders wrap lines) of `{"expiration": "...", "conditions": [...]}`. Refuses a
    /// policy whose expiration is at or before `now`, so a parsed document is always one
    /// that may still be used. Top-level members other than the two are ignored.
    pub fn parse(policy_b64: &str, now: SystemTime) -> Result<PolicyDocument, PostPolicyError> {
        if policy_b64.len() > MAX_POLICY_LEN {
            return Err(PostPolicyError::PolicyTooLarge {
                len: policy_b64.len(),
                max: MAX_POLICY_LEN,
            });
        }
        let compact: Vec<u8> = policy_b64
            .bytes()
            .filter(|b| !b.is_ascii_whitespace())
            .collect();
        let json = base64::engine::general_purpose::STANDARD
            .decode(&compact)
            .map_err(|_| PostPolicyError::Base64)?;
        PolicyDocument::from_json(&json, now)
    }

    /// [`PolicyDocument::parse`] of already decoded JSON.
    pub fn from_json(json: &[u8], now: SystemTime) -> Result<PolicyDocument, PostPolicyError> {
        if json.len() > MAX_POLICY_LEN {
            return Err(PostPolicyError::PolicyTooLarge {
                len: json.len(),
                max: MAX_POLICY_LEN,
            });
        }
        // serde_json bounds nesting (128 levels), so hostile input cannot exhaust the stack.
        let value: Value =
            serde_json::from_slice(json).map_err(|e| PostPolicyError::Json(e.to_string()))?;
        let Value::Object(top) = value else {
            return Err(malformed("the policy is not a JSON object"));
        };
        let expiration = match top.get("expiration") {
            Some(Value::String(s)) => parse_expiration(s).ok_or_else(|| {
                malformed(format!(
                    "expiration {:?} is not YYYY-MM-DDTHH:MM:SS[.sss]Z",
                    quote(s)
                ))
            })?,
            Some(_) => return Err(malformed("expiration is not a string")),
            None => return Err(malformed("the policy has no expiration")),
        };
        let list = match top.get("conditions") {
            Some(Value::Array(list)) => list,
            Some(_) => return Err(malformed("conditions is not an array")),
            None => return Err(malformed("the policy has no conditions")),
        };
        let too_many = PostPolicyError::TooManyConditions {
            max: MAX_CONDITIONS,
        };
        if list.len() > MAX_CONDITIONS {
            return Err(too_many);
        }
        let mut conditions = Vec::with_capacity(list.len());
        for item in list {
            match item {
                Value::Object(map) => {
                    if map.is_empty() {
                        return Err(malformed("an empty condition object"));
                    }
                    for (field, value) in map {
                        if field.is_empty() {
                            return Err(malformed("a condition on a field with no name"));
                        }
                        let Value::String(value) = value else {
                            return Err(malformed(format!(
                                "the condition on {:?} is not a string",
                                quote(field)
                            )));
                        };
                        conditions.push(Condition::Eq {
                            field: field.clone(),
                            value: value.clone(),
                        });
                    }
                }
                Value::Array(parts) => conditions.push(parse_array_condition(parts)?),
                _ => return Err(malformed("a condition is neither an object nor an array")),
            }
            if conditions.len() > MAX_CONDITIONS {
                return Err(too_many);
            }
        }
        if expiration <= now {
            return Err(PostPolicyError::Expired);
        }
        Ok(PolicyDocument {
            expiration,
            conditions,
        })
    }

    /// When the policy stops being valid.
    pub fn expiration(&self) -> SystemTime {
        self.expiration
    }

    /// The conditions, in the policy's order.
    pub fn conditions(&self) -> &[Condition] {
        &self.conditions
    }

    /// The file sizes every `content-length-range` allows together, `(min, max)`, or `None`
    /// without one; `min > max` when they exclude each other. Lets the node stop reading a
    /// file as soon as it is too large instead of after storing it.
    pub fn content_length_range(&self) -> Option<(u64, u64)> {
        self.conditions.iter().fold(None, |acc, c| match c {
            Condition::ContentLengthRange { min, max } => Some(match acc {
                None => (*min, *max),
                Some((lo, hi)) => (lo.max(*min), hi.min(*max)),
            }),
            _ => acc,
        })
    }

    /// Checks the text fields: every condition on a field holds, and every field that must
    /// be (all but `x-amz-signature`, `signature`, `AWSAccessKeyId`, `policy`, `file`,
    /// `bucket` and `x-ignore-*`) is named by some condition. A field the form lacks counts
    /// as empty, so `["starts-with", "$f", ""]` holds for it and `{"f": "v"}` does not.
    /// Conditions see the fields as sent, `key` with `${filename}` unreplaced, as S3 does
    /// (a signer's `{"key": "up/${filename}"}` must match the form's `key`).
    pub fn check_fields(&self, fields: &FormFields) -> Result<(), PostPolicyError> {
        for condition in &self.conditions {
            let holds = match condition {
                Condition::Eq { field, value } => fields.get(field).unwrap_or("") == value,
                Condition::StartsWith { field, prefix } => {
                    fields.get(field).unwrap_or("").starts_with(prefix.as_str())
                }
                Condition::ContentLengthRange { .. } => true,
            };
            if !holds {
                return Err(PostPolicyError::ConditionFailed(condition.to_string()));
            }
        }
        for (name, _) in fields.iter() {
            if exempt_from_policy(name) {
                continue;
            }
            if !self.conditions.iter().any(|c| c.covers(name)) {
                return Err(PostPolicyError::ExtraField(quote(name)));
            }
        }
        Ok(())
    }

    /// Checks the file's size against every `content-length-range` (bounds inclusive).
    pub fn check_content_length(&self, content_length: u64) -> Result<(), PostPolicyError> {
        for condition in &self.conditions {
            if let Condition::ContentLengthRange { min, max } = *condition {
                if content_length > max {
                    return Err(PostPolicyError::EntityTooLarge {
                        size: content_length,
                        max,
                    });
                }
                if content_length < min {
                    return Err(PostPolicyError::EntityTooSmall {
                        size: content_length,
                        min,
                    });
                }
            }
        }
        Ok(())
    }

    /// [`check_fields`](Self::check_fields) then
    /// [`check_content_length`](Self::check_content_length): the whole policy.
    pub fn check(&self, fields: &FormFields, content_length: u64) -> Result<(), PostPolicyError> {
        self.check_fields(fields)?;
        self.check_content_length(content_length)
    }
}

fn malformed(why: impl Into<String>) -> PostPolicyError {
    PostPolicyError::Malformed(why.into())
}

/// `["eq"|"starts-with", "$field", "value"]` or `["content-length-range", min, max]`.
/// Operators compare case-insensitively.
fn parse_array_condition(parts: &[Value]) -> Result<Condition, PostPolicyError> {
    let [op, a, b] = parts else {
        return Err(malformed(format!(
            "an array condition has {} elements, not 3",
            parts.len()
        )));
    };
    let Value::String(op) = op else {
        return Err(malformed("a condition's operator is not a string"));
    };
    if op.eq_ignore_ascii_case("content-length-range") {
        let (min, max) = (parse_length(a)?, parse_length(b)?);
        if min > max {
            return Err(malformed(format!(
                "content-length-range minimum {min} is above its maximum {max}"
            )));
        }
        return Ok(Condition::ContentLengthRange { min, max });
    }
    let eq = op.eq_ignore_ascii_case("eq");
    if !eq && !op.eq_ignore_ascii_case("starts-with") {
        return Err(malformed(format!(
            "unknown condition operator {:?}",
            quote(op)
        )));
    }
    let field = match a {
        Value::String(s) => match s.strip_prefix('$') {
            Some(name) if !name.is_empty() => name.to_owned(),
            _ => {
                return Err(malformed(format!(
                    "condition field {:?} does not start with $",
                    quote(s)
                )))
            }
        },
        _ => return Err(malformed("a condition's field is not a string")),
    };
    let Value::String(value) = b else {
        return Err(malformed(format!(
            "the condition on {:?} is not a string",
            quote(&field)
        )));
    };
    Ok(if eq {
        Condition::Eq {
            field,
            value: value.clone(),
        }
    } else {
        Condition::StartsWith {
            field,
            prefix: value.clone(),
        }
    })
}

/// A `content-length-range` bound: a non-negative JSON integer, or a string of digits (some
/// signers quote them).
fn parse_length(v: &Value) -> Result<u64, PostPolicyError> {
    let parsed = match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => {
            s.parse().ok()
        }
        _ => None,
    };
    parsed.ok_or_else(|| malformed("a content-length-range bound is not a non-negative integer"))
}

/// Fields S3 does not require the policy to name: the signature and SigV2's access key
/// (they cannot sign themselves), the policy, the file, `x-ignore-*`, and `bucket`, which the
/// node takes from the URL; a policy that restricts the bucket does so with a condition.
fn exempt_from_policy(name: &str) -> bool {
    const EXEMPT: [&str; 6] = [
        "x-amz-signature",
        "signature",
        "awsaccesskeyid",
        "policy",
        "file",
        "bucket",
    ];
    let starts = |prefix: &[u8]| {
        name.as_bytes()
            .get(..prefix.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(prefix))
    };
    // A checksum field is checked against the file itself, not by the policy (as S3 does).
    EXEMPT.iter().any(|e| name.eq_ignore_ascii_case(e))
        || starts(b"x-ignore-")
        || starts(b"x-amz-checksum-")
}

/// The decimal value of ASCII digits; `None` on anything else.
fn digits(b: &[u8]) -> Option<u32> {
    if b.is_empty() {
        return None;
    }
    b.iter().try_fold(0u32, |acc, &c| {
        c.is_ascii_digit().then(|| acc * 10 + u32::from(c - b'0'))
    })
}

/// Seconds since the epoch of a checked UTC date and time.
fn civil_seconds(y: u32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> Option<i64> {
    if !(1..=12).contains(&mo) || d == 0 || d > days_in_month(y, mo) || h > 23 || mi > 59 || s > 59
    {
        return None;
    }
    let days = days_from_civil(i64::from(y), i64::from(mo), i64::from(d));
    Some(days * 86_400 + i64::from(h) * 3600 + i64::from(mi) * 60 + i64::from(s))
}

/// `YYYY-MM-DDTHH:MM:SS[.fraction]Z` (ISO 8601 in UTC, as S3 wants the expiration; the
/// fraction has 1 to 9 digits).
fn parse_expiration(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b'T'
        || b[13] != b':'
        || b[16] != b':'
        || b[b.len() - 1] != b'Z'
    {
        return None;
    }
    let nanos = match &b[19..b.len() - 1] {
        [] => 0,
        [b'.', frac @ ..] if (1..=9).contains(&frac.len()) => {
            digits(frac)? * 10u32.pow(9 - frac.len() as u32)
        }
        _ => return None,
    };
    let secs = civil_seconds(
        digits(&b[0..4])?,
        digits(&b[5..7])?,
        digits(&b[8..10])?,
        digits(&b[11..13])?,
        digits(&b[14..16])?,
        digits(&b[17..19])?,
    )?;
    let base = if secs >= 0 {
        UNIX_EPOCH.checked_add(Duration::from_secs(secs.unsigned_abs()))?
    } else {
        UNIX_EPOCH.checked_sub(Duration::from_secs(secs.unsigned_abs()))?
    };
    base.checked_add(Duration::from_nanos(u64::from(nanos)))
}

/// Whether `s` is an `x-amz-date`, `YYYYMMDDTHHMMSSZ`, of a real day and time.
fn valid_amz_date(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 16
        && b[8] == b'T'
        && b[15] == b'Z'
        && (|| {
            civil_seconds(
                digits(&b[0..4])?,
                digits(&b[4..6])?,
                digits(&b[6..8])?,
                digits(&b[9..11])?,
                digits(&b[11..13])?,
                digits(&b[13..15])?,
            )
        })()
        .is_some()
}

/// The text fields of a form, in the order they came, with names compared
/// ASCII-case-insensitively (S3: "the post parameters are case insensitive"). Each name
/// appears once: a repeated name is refused rather than one copy silently winning.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FormFields {
    fields: Vec<(String, String)>,
}

impl FormFields {
    pub fn new() -> FormFields {
        FormFields::default()
    }

    /// Fields from `(name, value)` pairs, refused as [`push`](Self::push) refuses them.
    pub fn from_pairs<N: Into<String>, V: Into<String>>(
        pairs: impl IntoIterator<Item = (N, V)>,
    ) -> Result<FormFields, PostPolicyError> {
        let mut fields = FormFields::new();
        for (name, value) in pairs {
            fields.push(name, value)?;
        }
        Ok(fields)
    }

    /// Adds a field from the form. Refuses a name already present (in any case) and a field
    /// past [`MAX_FORM_FIELDS`].
    pub fn push(
        &mut self,
        name: impl Into<String>,
        value: impl Into<String>,
    ) -> Result<(), PostPolicyError> {
        let name = name.into();
        if self.position(&name).is_some() {
            return Err(PostPolicyError::DuplicateField(quote(&name)));
        }
        if self.fields.len() >= MAX_FORM_FIELDS {
            return Err(PostPolicyError::TooManyFields {
                max: MAX_FORM_FIELDS,
            });
        }
        self.fields.push((name, value.into()));
        Ok(())
    }

    /// Sets a field, replacing one of the same name (in any case) in place or appending it.
    /// For values the node itself decides: `bucket`, from the request's URL, which must win
    /// over anything the form says.
    pub fn set(&mut self, name: impl Into<String>, value: impl Into<String>) {
        let (name, value) = (name.into(), value.into());
        match self.position(&name) {
            Some(i) => self.fields[i] = (name, value),
            None => self.fields.push((name, value)),
        }
    }

    /// Removes a field, returning its value.
    pub fn remove(&mut self, name: &str) -> Option<String> {
        let i = self.position(name)?;
        Some(self.fields.remove(i).1)
    }

    /// The value of a field, its name matched ASCII-case-insensitively.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.position(name).map(|i| self.fields[i].1.as_str())
    }

    /// The fields as `(name, value)`, names as the form spelled them, in the form's order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.fields.iter().map(|(n, v)| (n.as_str(), v.as_str()))
    }

    pub fn len(&self) -> usize {
        self.fields.len()
    }

    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    fn position(&self, name: &str) -> Option<usize> {
        self.fields
            .iter()
            .position(|(n, _)| n.eq_ignore_ascii_case(name))
    }

    /// A non-empty field, or `MissingField`.
    fn required(&self, name: &'static str) -> Result<&str, PostPolicyError> {
        match self.get(name) {
            Some(v) if !v.is_empty() => Ok(v),
            _ => Err(PostPolicyError::MissingField(name)),
        }
    }

    /// The object key: the `key` field with every `${filename}` replaced by the file part's
    /// file name, as S3 does (the name as the browser sent it; `None` when the part had
    /// none). Checked as an object key, since this is what gets stored.
    pub fn resolve_key(&self, filename: Option<&str>) -> Result<String, PostPolicyError> {
        const VAR: &str = "${filename}";
        let key = self.required("key")?;
        let key = if key.contains(VAR) {
            key.replace(VAR, filename.ok_or(PostPolicyError::NoFilename)?)
        } else {
            key.to_owned()
        };
        validate_object_key(&key).map_err(PostPolicyError::InvalidKey)?;
        Ok(key)
    }
}

/// Which signature a form carries, and what checking it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PostCredential {
    /// `x-amz-algorithm`, `x-amz-credential`, `x-amz-date`, `x-amz-signature`: hex
    /// HMAC-SHA256 of the base64 policy under the key derived for `scope`.
    V4 {
        access_key: String,
        /// From `x-amz-credential`; its day is `x-amz-date`'s and its service `s3`.
        scope: Scope,
        /// `x-amz-date`, `YYYYMMDDTHHMMSSZ`.
        amz_date: String,
        signature: String,
    },
    /// `AWSAccessKeyId`, `signature`: base64 HMAC-SHA1 of the base64 policy under the
    /// secret itself.
    V2 {
        access_key: String,
        signature: String,
    },
}

impl PostCredential {
    /// The access key whose secret must have signed the policy.
    pub fn access_key(&self) -> &str {
        match self {
            PostCredential::V4 { access_key, .. } | PostCredential::V2 { access_key, .. } => {
                access_key
            }
        }
    }

    /// The signature the form carries.
    pub fn signature(&self) -> &str {
        match self {
            PostCredential::V4 { signature, .. } | PostCredential::V2 { signature, .. } => {
                signature
            }
        }
    }
}

/// Reads the credential fields of a form. SigV4 when any of `x-amz-algorithm`,
/// `x-amz-credential`, `x-amz-signature` is present, SigV2 when `AWSAccessKeyId` or
/// `signature` is; both is refused, neither is [`PostPolicyError::NoCredentials`]. For
/// SigV4, checks the algorithm, the credential's shape, that its service is `s3` and that
/// its day is `x-amz-date`'s (the day the signing key was derived for). Nothing here is
/// trusted until [`verify`] succeeds with the access key's secret.
pub fn credential(fields: &FormFields) -> Result<PostCredential, PostPolicyError> {
    let v4 = ["x-amz-algorithm", "x-amz-credential", "x-amz-signature"]
        .iter()
        .any(|n| fields.get(n).is_some());
    let v2 = ["awsaccesskeyid", "signature"]
        .iter()
        .any(|n| fields.get(n).is_some());
    match (v4, v2) {
        (true, true) => Err(PostPolicyError::MixedSignatures),
        (false, false) => Err(PostPolicyError::NoCredentials),
        (false, true) => Ok(PostCredential::V2 {
            access_key: fields.required("AWSAccessKeyId")?.to_owned(),
            signature: fields.required("signature")?.to_owned(),
        }),
        (true, false) => {
            let algorithm = fields.required("x-amz-algorithm")?;
            if algorithm != sigv4::ALGORITHM {
                return Err(PostPolicyError::UnsupportedAlgorithm(quote(algorithm)));
            }
            let credential = fields.required("x-amz-credential")?;
            let amz_date = fields.required("x-amz-date")?;
            let signature = fields.required("x-amz-signature")?;
            let bad = |why: &str| PostPolicyError::MalformedCredential(why.to_owned());
            let parts: Vec<&str> = credential.split('/').collect();
            let [access_key, date, region, service, terminal] = parts[..] else {
                return Err(bad(
                    "x-amz-credential is not KEY/YYYYMMDD/REGION/s3/aws4_request",
                ));
            };
            if access_key.is_empty() || region.is_empty() || terminal != "aws4_request" {
                return Err(bad(
                    "x-amz-credential is not KEY/YYYYMMDD/REGION/s3/aws4_request",
                ));
            }
            if service != "s3" {
                return Err(bad("the credential's service is not s3"));
            }
            if !valid_amz_date(amz_date) {
                return Err(bad("x-amz-date is not YYYYMMDDTHHMMSSZ"));
            }
            if amz_date.get(..8) != Some(date) {
                return Err(bad("the credential's date is not x-amz-date's day"));
            }
            Ok(PostCredential::V4 {
                access_key: access_key.to_owned(),
                scope: Scope::new(date, region, service),
                amz_date: amz_date.to_owned(),
                signature: signature.to_owned(),
            })
        }
    }
}

/// The SigV4 POST signature: hex HMAC-SHA256 of the base64 policy text under the key
/// `secret` derives for `scope` (the policy text itself is the string to sign).
pub fn sign_v4(secret: &str, scope: &Scope, policy_b64: &str) -> String {
    sigv4::signature(&scope.signing_key(secret), policy_b64)
}

/// The SigV2 POST signature: base64 HMAC-SHA1 of the base64 policy text under the secret.
pub fn sign_v2(secret: &str, policy_b64: &str) -> String {
    // HMAC takes keys of any length, so this never fails; an empty answer never verifies.
    let Ok(mut mac) = <Hmac<Sha1> as KeyInit>::new_from_slice(secret.as_bytes()) else {
        return String::new();
    };
    mac.update(policy_b64.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
}

/// Whether the form's signature is the one `secret` makes over `policy_b64` (the `policy`
/// field exactly as sent). Compared in constant time, so a forger learns nothing from how
/// long a wrong guess takes.
pub fn verify(credential: &PostCredential, secret: &str, policy_b64: &str) -> bool {
    let expected = match credential {
        PostCredential::V4 { scope, .. } => sign_v4(secret, scope, policy_b64),
        PostCredential::V2 { .. } => sign_v2(secret, policy_b64),
    };
    let given = credential.signature().as_bytes();
    !expected.is_empty()
        && expected.len() == given.len()
        && bool::from(expected.as_bytes().ct_eq(given))
}

/// The status of a successful upload without a redirect: `success_action_status` when it is
/// `200`, `201` or `204`, else 204, as S3 does (201 also makes S3 answer with a
/// `PostResponse` XML document).
pub fn success_action_status(value: Option<&str>) -> u16 {
    match value {
        Some("200") => 200,
        Some("201") => 201,
        _ => 204,
    }
}

/// The `Location` of a successful upload with `success_action_redirect`: the URL with
/// `bucket`, `key` and `etag` query parameters appended (percent-encoded; `etag` as the
/// node's `ETag` header gives it, quotes included), before any `#fragment`. Only absolute
/// `http`/`https` URLs of printable ASCII without backslashes are accepted, so the node
/// never sends a browser to `javascript:` or to a URL browsers read differently; S3 answers
/// with `success_action_status` instead when the URL is unusable.
pub fn success_redirect(
    url: &str,
    bucket: &str,
    key: &str,
    etag: &str,
) -> Result<String, PostPolicyError> {
    let bad = PostPolicyError::InvalidRedirect;
    if url.len() > MAX_REDIRECT_LEN {
        return Err(bad("the URL is too long"));
    }
    if !url.bytes().all(|b| b.is_ascii_graphic() && b != b'\\') {
        return Err(bad(
            "the URL holds spaces, control, non-ASCII or backslash characters",
        ));
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(bad("the URL is not absolute"));
    };
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return Err(bad("the URL is not http or https"));
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.is_empty() {
        return Err(bad("the URL has no host"));
    }
    let (base, fragment) = match url.split_once('#') {
        Some((base, fragment)) => (base, Some(fragment)),
        None => (url, None),
    };
    let separator = match base.find('?') {
        None => "?",
        Some(_) if base.ends_with('?') || base.ends_with('&') => "",
        Some(_) => "&",
    };
    let mut out = format!(
        "{base}{separator}bucket={}&key={}&etag={}",
        sigv4::uri_encode(bucket, false),
        sigv4::uri_encode(key, false),
        sigv4::uri_encode(etag, false)
    );
    if let Some(fragment) = fragment {
        out.push('#');
        out.push_str(fragment);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> SystemTime {
        match parse_expiration(s) {
            Some(t) => t,
            None => panic!("bad test time {s}"),
        }
    }

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    fn fields(pairs: &[(&str, &str)]) -> FormFields {
        FormFields::from_pairs(pairs.iter().copied()).expect("test fields")
    }

    /// A policy with the given conditions, valid until 2030, parsed at 2026.
    fn doc(conditions: &str) -> PolicyDocument {
        let json =
            format!(r#"{{"expiration": "2030-01-01T00:00:00Z", "conditions": [{conditions}]}}"#);
        PolicyDocument::parse(&b64(&json), at("2026-01-01T00:00:00Z")).expect("test policy")
    }

    fn parse_err(json: &str) -> PostPolicyError {
        PolicyDocument::parse(&b64(json), at("2026-01-01T00:00:00Z")).expect_err(json)
    }

    /// AWS's "Example: Browser-Based Upload using HTTP POST (Using AWS Signature Version
    /// 4)" (sigv4-post-example): the published policy (CRLF line ends), its base64 and the
    /// signature made with the documented example credentials.
    mod aws_sigv4_example {
        use super::*;

        pub const POLICY: &str = "eyAiZXhwaXJhdGlvbiI6ICIyMDE1LTEyLTMwVDEyOjAwOjAwLjAwMFoiLA0KICAiY29uZGl0aW9ucyI6IFsNCiAgICB7ImJ1Y2tldCI6ICJzaWd2NGV4YW1wbGVidWNrZXQifSwNCiAgICBbInN0YXJ0cy13aXRoIiwgIiRrZXkiLCAidXNlci91c2VyMS8iXSwNCiAgICB7ImFjbCI6ICJwdWJsaWMtcmVhZCJ9LA0KICAgIHsic3VjY2Vzc19hY3Rpb25fcmVkaXJlY3QiOiAiaHR0cDovL3NpZ3Y0ZXhhbXBsZWJ1Y2tldC5zMy5hbWF6b25hd3MuY29tL3N1Y2Nlc3NmdWxfdXBsb2FkLmh0bWwifSwNCiAgICBbInN0YXJ0cy13aXRoIiwgIiRDb250ZW50LVR5cGUiLCAiaW1hZ2UvIl0sDQogICAgeyJ4LWFtei1tZXRhLXV1aWQiOiAiMTQzNjUxMjM2NTEyNzQifSwNCiAgICB7IngtYW16LXNlcnZlci1zaWRlLWVuY3J5cHRpb24iOiAiQUVTMjU2In0sDQogICAgWyJzdGFydHMtd2l0aCIsICIkeC1hbXotbWV0YS10YWciLCAiIl0sDQoNCiAgICB7IngtYW16LWNyZWRlbnRpYWwiOiAiQUtJQUlPU0ZPRE5ON0VYQU1QTEUvMjAxNTEyMjkvdXMtZWFzdC0xL3MzL2F3czRfcmVxdWVzdCJ9LA0KICAgIHsieC1hbXotYWxnb3JpdGhtIjogIkFXUzQtSE1BQy1TSEEyNTYifSwNCiAgICB7IngtYW16LWRhdGUiOiAiMjAxNTEyMjlUMDAwMDAwWiIgfQ0KICBdDQp9";
        pub const SIGNATURE: &str =
            "8afdbf4008c03f22c2cd3cdb72e4afbb1f6a588f3255ac628749a66d7f09699e";
        pub const SECRET: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";

        /// The example form's fields before the file, with the bucket from the URL.
        pub fn form() -> FormFields {
            let mut f = fields(&[
                ("key", "user/user1/${filename}"),
                ("acl", "public-read"),
                (
                    "success_action_redirect",
                    "http://sigv4examplebucket.s3.amazonaws.com/successful_upload.html",
                ),
                ("Content-Type", "image/jpeg"),
                ("x-amz-meta-uuid", "14365123651274"),
                ("x-amz-server-side-encryption", "AES256"),
                (
                    "X-Amz-Credential",
                    "AKIAIOSFODNN7EXAMPLE/20151229/us-east-1/s3/aws4_request",
                ),
                ("X-Amz-Algorithm", "AWS4-HMAC-SHA256"),
                ("X-Amz-Date", "20151229T000000Z"),
                ("x-amz-meta-tag", ""),
                ("Policy", POLICY),
                ("X-Amz-Signature", SIGNATURE),
            ]);
            f.set("bucket", "sigv4examplebucket");
            f
        }

        #[test]
        fn signature_matches_the_published_one() {
            let scope = Scope::new("20151229", "us-east-1", "s3");
            assert_eq!(sign_v4(SECRET, &scope, POLICY), SIGNATURE);
        }

        #[test]
        fn the_example_form_is_accepted() {
            let form = form();
            let cred = credential(&form).expect("credential");
            assert_eq!(
                cred,
                PostCredential::V4 {
                    access_key: "AKIAIOSFODNN7EXAMPLE".into(),
                    scope: Scope::new("20151229", "us-east-1", "s3"),
                    amz_date: "20151229T000000Z".into(),
                    signature: SIGNATURE.into(),
                }
            );
            assert!(verify(&cred, SECRET, form.get("policy").unwrap_or("")));
            assert!(!verify(
                &cred,
                "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEZ",
                POLICY
            ));
            // The signature covers the policy text exactly as sent.
            assert!(!verify(&cred, SECRET, &format!("{POLICY}\n")));

            let doc = PolicyDocument::parse(POLICY, at("2015-12-29T00:00:00Z")).expect("policy");
            assert_eq!(doc.conditions().len(), 11);
            assert_eq!(doc.expiration(), at("2015-12-30T12:00:00.000Z"));
            assert_eq!(doc.content_length_range(), None);
            doc.check(&form, 117_108)
                .expect("the example form fits its policy");
            assert_eq!(
                form.resolve_key(Some("MyPhoto.jpg")).as_deref(),
                Ok("user/user1/MyPhoto.jpg")
            );
        }

        #[test]
        fn the_example_policy_expires_at_noon() {
            assert!(PolicyDocument::parse(POLICY, at("2015-12-30T11:59:59.999Z")).is_ok());
            assert_eq!(
                PolicyDocument::parse(POLICY, at("2015-12-30T12:00:00Z")),
                Err(PostPolicyError::Expired)
            );
            assert_eq!(
                PolicyDocument::parse(POLICY, at("2016-01-01T00:00:00Z")),
                Err(PostPolicyError::Expired)
            );
        }

        #[test]
        fn the_example_form_with_other_values_is_refused() {
            let doc = PolicyDocument::parse(POLICY, at("2015-12-29T00:00:00Z")).expect("policy");
            let mut form = form();
            form.set("Content-Type", "text/html");
            assert_eq!(
                doc.check(&form, 1),
                Err(PostPolicyError::ConditionFailed(
                    r#"["starts-with", "$Content-Type", "image/"]"#.into()
                ))
            );
            let mut form = self::form();
            form.set("key", "user/user2/x");
            assert!(matches!(
                doc.check(&form, 1),
                Err(PostPolicyError::ConditionFailed(_))
            ));
            let mut form = self::form();
            form.set("bucket", "otherbucket");
            assert_eq!(
                doc.check(&form, 1),
                Err(PostPolicyError::ConditionFailed(
                    r#"["eq", "$bucket", "sigv4examplebucket"]"#.into()
                ))
            );
            let mut form = self::form();
            form.push("x-amz-meta-extra", "1").expect("push");
            assert_eq!(
                doc.check(&form, 1),
                Err(PostPolicyError::ExtraField("x-amz-meta-extra".into()))
            );
        }
    }

    /// AWS's SigV2 POST example ("Browser-Based Uploads Using POST (AWS Signature Version
    /// 2)"): the published policy and signature `0RavWzkygo6QX9caELEqKi9kDbU=`, which the
    /// secret of AWS's old SigV2 examples (`uV3F3Ylu...`) makes.
    mod aws_sigv2_example {
        use super::*;

        const POLICY: &str = "eyAiZXhwaXJhdGlvbiI6ICIyMDA3LTEyLTAxVDEyOjAwOjAwLjAwMFoiLAogICJjb25kaXRpb25zIjogWwogICAgeyJidWNrZXQiOiAiam9obnNtaXRoIn0sCiAgICBbInN0YXJ0cy13aXRoIiwgIiRrZXkiLCAidXNlci9lcmljLyJdLAogICAgeyJhY2wiOiAicHVibGljLXJlYWQifSwKICAgIHsic3VjY2Vzc19hY3Rpb25fcmVkaXJlY3QiOiAiaHR0cDovL2pvaG5zbWl0aC5zMy5hbWF6b25hd3MuY29tL3N1Y2Nlc3NmdWxfdXBsb2FkLmh0bWwifSwKICAgIFsic3RhcnRzLXdpdGgiLCAiJENvbnRlbnQtVHlwZSIsICJpbWFnZS8iXSwKICAgIHsieC1hbXotbWV0YS11dWlkIjogIjE0MzY1MTIzNjUxMjc0In0sCiAgICBbInN0YXJ0cy13aXRoIiwgIiR4LWFtei1tZXRhLXRhZyIsICIiXQogIF0KfQo=";
        const SIGNATURE: &str = "0RavWzkygo6QX9caELEqKi9kDbU=";
        const SECRET: &str = "uV3F3YluFJax1cknvbcGwgjvx4QpvB+leU8dUj2o";

        fn form() -> FormFields {
            let mut f = fields(&[
                ("key", "user/eric/MyPicture.jpg"),
                ("acl", "public-read"),
                (
                    "success_action_redirect",
                    "http://johnsmith.s3.amazonaws.com/successful_upload.html",
                ),
                ("Content-Type", "image/jpeg"),
                ("x-amz-meta-uuid", "14365123651274"),
                ("x-amz-meta-tag", "Some,Tag,For,Picture"),
                ("AWSAccessKeyId", "AKIAIOSFODNN7EXAMPLE"),
                ("Policy", POLICY),
                ("Signature", SIGNATURE),
            ]);
            f.set("bucket", "johnsmith");
            f
        }

        #[test]
        fn signature_matches_the_published_one() {
            assert_eq!(sign_v2(SECRET, POLICY), SIGNATURE);
        }

        #[test]
        fn the_example_form_is_accepted() {
            let form = form();
            let cred = credential(&form).expect("credential");
            assert_eq!(
                cred,
                PostCredential::V2 {
                    access_key: "AKIAIOSFODNN7EXAMPLE".into(),
                    signature: SIGNATURE.into()
                }
            );
            assert!(verify(&cred, SECRET, POLICY));
            assert!(!verify(
                &cred,
                "uV3F3YluFJax1cknvbcGwgjvx4QpvB+leU8dUj2p",
                POLICY
            ));
            assert!(!verify(&cred, "", POLICY));
            let doc = PolicyDocument::parse(POLICY, at("2007-12-01T11:00:00Z")).expect("policy");
            doc.check(&form, 117_108).expect("fits");
            assert_eq!(
                form.resolve_key(None).as_deref(),
                Ok("user/eric/MyPicture.jpg")
            );
        }
    }

    /// Forms made by botocore 1.44.8's `generate_presigned_post` (clock fixed at
    /// 2026-03-04T05:06:07Z, access key `AKIDPOSTEXAMPLE`, secret `post/secret+example`,
    /// region eu-west-1, bucket `photos`, key `uploads/${filename}`, fields acl,
    /// Content-Type and x-amz-meta-owner, a content-length-range of 1..=1048576), pasted as
    /// botocore printed them. botocore writes the expiration without milliseconds.
    mod botocore {
        use super::*;

        const SECRET: &str = "post/secret+example";
        const V4_POLICY: &str = "eyJleHBpcmF0aW9uIjogIjIwMjYtMDMtMDRUMDY6MDY6MDdaIiwgImNvbmRpdGlvbnMiOiBbeyJhY2wiOiAicHJpdmF0ZSJ9LCBbInN0YXJ0cy13aXRoIiwgIiRDb250ZW50LVR5cGUiLCAiaW1hZ2UvIl0sIHsieC1hbXotbWV0YS1vd25lciI6ICJ5dXR1In0sIFsiY29udGVudC1sZW5ndGgtcmFuZ2UiLCAxLCAxMDQ4NTc2XSwgeyJidWNrZXQiOiAicGhvdG9zIn0sIFsic3RhcnRzLXdpdGgiLCAiJGtleSIsICJ1cGxvYWRzLyJdLCB7IngtYW16LWFsZ29yaXRobSI6ICJBV1M0LUhNQUMtU0hBMjU2In0sIHsieC1hbXotY3JlZGVudGlhbCI6ICJBS0lEUE9TVEVYQU1QTEUvMjAyNjAzMDQvZXUtd2VzdC0xL3MzL2F3czRfcmVxdWVzdCJ9LCB7IngtYW16LWRhdGUiOiAiMjAyNjAzMDRUMDUwNjA3WiJ9XX0=";
        const V2_POLICY: &str = "eyJleHBpcmF0aW9uIjogIjIwMjYtMDMtMDRUMDY6MDY6MDdaIiwgImNvbmRpdGlvbnMiOiBbeyJhY2wiOiAicHJpdmF0ZSJ9LCBbInN0YXJ0cy13aXRoIiwgIiRDb250ZW50LVR5cGUiLCAiaW1hZ2UvIl0sIHsieC1hbXotbWV0YS1vd25lciI6ICJ5dXR1In0sIFsiY29udGVudC1sZW5ndGgtcmFuZ2UiLCAxLCAxMDQ4NTc2XSwgeyJidWNrZXQiOiAicGhvdG9zIn0sIFsic3RhcnRzLXdpdGgiLCAiJGtleSIsICJ1cGxvYWRzLyJdXX0=";

        fn v4_form() -> FormFields {
            let mut f = fields(&[
                ("acl", "private"),
                ("Content-Type", "image/png"),
                ("x-amz-meta-owner", "yutu"),
                ("key", "uploads/${filename}"),
                ("x-amz-algorithm", "AWS4-HMAC-SHA256"),
                (
                    "x-amz-credential",
                    "AKIDPOSTEXAMPLE/20260304/eu-west-1/s3/aws4_request",
                ),
                ("x-amz-date", "20260304T050607Z"),
                ("policy", V4_POLICY),
                (
                    "x-amz-signature",
                    "3a86bfc6e5f17176745d45365544d31333fafff76df01e8ef539ef0bdd5523c1",
                ),
            ]);
            f.set("bucket", "photos");
            f
        }

        fn v2_form() -> FormFields {
            let mut f = fields(&[
                ("acl", "private"),
                ("Content-Type", "image/png"),
                ("x-amz-meta-owner", "yutu"),
                ("key", "uploads/${filename}"),
                ("AWSAccessKeyId", "AKIDPOSTEXAMPLE"),
                ("policy", V2_POLICY),
                ("signature", "yZOuNPBEPWjkdoMxiW0+NcxnUcY="),
            ]);
            f.set("bucket", "photos");
            f
        }

        #[test]
        fn sigv4_form_verifies_and_fits() {
            let form = v4_form();
            let cred = credential(&form).expect("credential");
            assert_eq!(cred.access_key(), "AKIDPOSTEXAMPLE");
            assert!(verify(&cred, SECRET, V4_POLICY));
            assert!(!verify(&cred, "post/secret+exampl", V4_POLICY));
            let now = at("2026-03-04T05:06:07Z");
            let doc = PolicyDocument::parse(V4_POLICY, now).expect("policy");
            assert_eq!(doc.expiration(), at("2026-03-04T06:06:07Z"));
            assert_eq!(doc.content_length_range(), Some((1, 1_048_576)));
            doc.check(&form, 1).expect("smallest");
            doc.check(&form, 1_048_576).expect("largest");
            assert_eq!(
                doc.check(&form, 0),
                Err(PostPolicyError::EntityTooSmall { size: 0, min: 1 })
            );
            assert_eq!(
                doc.check(&form, 1_048_577),
                Err(PostPolicyError::EntityTooLarge {
                    size: 1_048_577,
                    max: 1_048_576
                })
            );
            assert_eq!(
                form.resolve_key(Some("cat.png")).as_deref(),
                Ok("uploads/cat.png")
            );
            assert_eq!(
                PolicyDocument::parse(V4_POLICY, at("2026-03-04T06:06:07Z")),
                Err(PostPolicyError::Expired)
            );
        }

        #[test]
        fn sigv2_form_verifies_and_fits() {
            let form = v2_form();
            let cred = credential(&form).expect("credential");
            assert!(matches!(cred, PostCredential::V2 { .. }));
            assert!(verify(&cred, SECRET, V2_POLICY));
            assert!(!verify(&cred, "other", V2_POLICY));
            let doc = PolicyDocument::parse(V2_POLICY, at("2026-03-04T05:06:07Z")).expect("p");
            doc.check(&form, 10).expect("fits");
        }
    }

    #[test]
    fn eq_conditions_pass_and_fail() {
        let d = doc(r#"{"acl": "private"}, ["eq", "$x-amz-meta-a", "1"]"#);
        d.check(&fields(&[("acl", "private"), ("x-amz-meta-a", "1")]), 0)
            .expect("equal");
        assert_eq!(
            d.check(&fields(&[("acl", "Private"), ("x-amz-meta-a", "1")]), 0),
            Err(PostPolicyError::ConditionFailed(
                r#"["eq", "$acl", "private"]"#.into()
            ))
        );
        assert_eq!(
            d.check(&fields(&[("acl", "private"), ("x-amz-meta-a", "12")]), 0),
            Err(PostPolicyError::ConditionFailed(
                r#"["eq", "$x-amz-meta-a", "1"]"#.into()
            ))
        );
        // A missing field is empty, which "private" is not.
        assert!(matches!(
            d.check(&fields(&[("x-amz-meta-a", "1")]), 0),
            Err(PostPolicyError::ConditionFailed(_))
        ));
        // An object condition may name several fields.
        let d = doc(r#"{"acl": "private", "x-amz-meta-a": "1"}"#);
        assert_eq!(d.conditions().len(), 2);
        d.check(&fields(&[("acl", "private"), ("x-amz-meta-a", "1")]), 0)
            .expect("both");
    }

    #[test]
    fn starts_with_conditions_pass_and_fail() {
        let d = doc(r#"["starts-with", "$key", "user/"], ["STARTS-WITH", "$x-amz-meta-t", ""]"#);
        d.check(
            &fields(&[("key", "user/a"), ("x-amz-meta-t", "anything")]),
            0,
        )
        .expect("prefix");
        d.check(&fields(&[("key", "user/")]), 0)
            .expect("the prefix itself; a missing field for an empty prefix");
        assert_eq!(
            d.check(&fields(&[("key", "other/user/a")]), 0),
            Err(PostPolicyError::ConditionFailed(
                r#"["starts-with", "$key", "user/"]"#.into()
            ))
        );
        assert!(d.check(&fields(&[("key", "User/a")]), 0).is_err());
    }

    #[test]
    fn field_names_compare_case_insensitively() {
        let d = doc(r#"{"Bucket": "b"}, ["starts-with", "$KEY", "k"], {"content-type": "t"}"#);
        let mut f = fields(&[("key", "kk"), ("Content-Type", "t")]);
        f.set("BUCKET", "b");
        d.check(&f, 0).expect("names in any case");
        assert_eq!(f.get("bucket"), Some("b"));
        assert_eq!(f.get("CONTENT-TYPE"), Some("t"));
    }

    #[test]
    fn content_length_range_bounds_the_file() {
        let d = doc(r#"["content-length-range", 10, 20]"#);
        let f = FormFields::new();
        d.check(&f, 10).expect("min is inclusive");
        d.check(&f, 20).expect("max is inclusive");
        assert_eq!(
            d.check(&f, 9),
            Err(PostPolicyError::EntityTooSmall { size: 9, min: 10 })
        );
        assert_eq!(
            d.check(&f, 21),
            Err(PostPolicyError::EntityTooLarge { size: 21, max: 20 })
        );
        assert_eq!(
            d.check(&f, 21).map_err(|e| e.s3_code()),
            Err(S3ErrorCode::EntityTooLarge)
        );
        assert_eq!(
            d.check(&f, 9).map_err(|e| e.s3_code()),
            Err(S3ErrorCode::EntityTooSmall)
        );
        // Quoted bounds, and two ranges that both apply.
        let d = doc(r#"["content-length-range", "5", "100"], ["content-length-range", 0, 50]"#);
        assert_eq!(d.content_length_range(), Some((5, 50)));
        d.check(&f, 50).expect("in both");
        assert!(d.check(&f, 51).is_err());
        assert!(d.check(&f, 4).is_err());
        // Without a range any size goes.
        doc(r#"{"acl": "x"}"#)
            .check(&fields(&[("acl", "x")]), u64::MAX)
            .expect("no range");
    }

    #[test]
    fn uncovered_fields_are_refused_and_exempt_ones_allowed() {
        let d = doc(r#"{"key": "k"}"#);
        assert_eq!(
            d.check(&fields(&[("key", "k"), ("acl", "public-read")]), 0),
            Err(PostPolicyError::ExtraField("acl".into()))
        );
        assert_eq!(
            d.check(&fields(&[("key", "k"), ("acl", "x")]), 0)
                .map_err(|e| e.to_string()),
            Err("Invalid according to Policy: Extra input fields: acl".into())
        );
        let mut f = fields(&[
            ("key", "k"),
            ("x-ignore-note", "free text"),
            ("X-Ignore-Other", ""),
            ("Policy", "p"),
            ("X-Amz-Signature", "s"),
            ("signature", "s"),
            ("AWSAccessKeyId", "a"),
            ("file", "f"),
        ]);
        f.set("bucket", "any");
        d.check(&f, 0).expect("exempt fields need no condition");
        // `x-ignore` without the dash is an ordinary field.
        assert_eq!(
            d.check(&fields(&[("key", "k"), ("x-ignore", "1")]), 0),
            Err(PostPolicyError::ExtraField("x-ignore".into()))
        );
        assert_eq!(
            d.check(&fields(&[("key", "k"), ("x-amz-credential", "c")]), 0),
            Err(PostPolicyError::ExtraField("x-amz-credential".into()))
        );
        assert_eq!(
            PostPolicyError::ExtraField("a".into()).s3_code(),
            S3ErrorCode::AccessDenied
        );
    }

    #[test]
    fn expiration_formats() {
        let t = |e: &str| parse_expiration(e);
        assert_eq!(t("1970-01-01T00:00:00Z"), Some(UNIX_EPOCH));
        assert_eq!(
            t("2026-01-01T00:00:00.000Z"),
            Some(UNIX_EPOCH + Duration::from_secs(1_767_225_600))
        );
        assert_eq!(
            t("2000-02-29T23:59:59.5Z"),
            Some(UNIX_EPOCH + Duration::from_millis(951_868_799_500))
        );
        assert_eq!(
            t("2026-01-01T00:00:00.000000001Z"),
            Some(UNIX_EPOCH + Duration::new(1_767_225_600, 1))
        );
        assert!(t("1969-12-31T23:59:59Z").is_some());
        for bad in [
            "2026-01-01",
            "2026-01-01T00:00:00",
            "2026-01-01T00:00:00+00:00",
            "2026-01-01 00:00:00Z",
            "2026-13-01T00:00:00Z",
            "2026-02-29T00:00:00Z",
            "1900-02-29T00:00:00Z",
            "2026-01-01T24:00:00Z",
            "2026-01-01T00:60:00Z",
            "2026-01-01T00:00:60Z",
            "2026-01-01T00:00:00.Z",
            "2026-01-01T00:00:00.0000000001Z",
            "2026-01-01T00:00:00.00aZ",
            "+026-01-01T00:00:00Z",
            "2026-1-01T00:00:00Z",
            "2026-01-01t00:00:00z",
            "２０２6-01-01T00:00:00Z",
        ] {
            assert_eq!(t(bad), None, "{bad}");
        }
    }

    #[test]
    fn expired_policies_are_refused() {
        let json = r#"{"expiration": "2026-01-01T00:00:00Z", "conditions": []}"#;
        assert_eq!(
            PolicyDocument::parse(&b64(json), at("2026-01-01T00:00:00Z")),
            Err(PostPolicyError::Expired)
        );
        assert!(PolicyDocument::parse(&b64(json), at("2025-12-31T23:59:59Z")).is_ok());
        let old = r#"{"expiration": "1960-01-01T00:00:00Z", "conditions": []}"#;
        assert_eq!(
            PolicyDocument::parse(&b64(old), at("2026-01-01T00:00:00Z")),
            Err(PostPolicyError::Expired)
        );
        assert_eq!(
            PostPolicyError::Expired.s3_code(),
            S3ErrorCode::AccessDenied
        );
        assert_eq!(
            PostPolicyError::Expired.to_string(),
            "Invalid according to Policy: Policy expired."
        );
    }

    #[test]
    fn bad_base64_and_bad_json_are_refused() {
        let now = at("2026-01-01T00:00:00Z");
        for bad in [
            "!!!!",
            "eyJ",
            "eyJhIjoxfQ=x",
            "ey J",
            "eyJhIjo",
            "eyJhIjoxfQ===",
        ] {
            assert_eq!(
                PolicyDocument::parse(bad, now),
                Err(PostPolicyError::Base64),
                "{bad}"
            );
        }
        assert!(matches!(
            PolicyDocument::parse(&b64("{\"expiration\": "), now),
            Err(PostPolicyError::Json(_))
        ));
        assert!(matches!(
            PolicyDocument::parse(
                &base64::engine::general_purpose::STANDARD.encode([0xff, 0xfe]),
                now
            ),
            Err(PostPolicyError::Json(_))
        ));
        assert!(matches!(
            PolicyDocument::parse(&b64(&"[".repeat(5000)), now),
            Err(PostPolicyError::Json(_))
        ));
        assert!(matches!(
            PolicyDocument::parse("", now),
            Err(PostPolicyError::Json(_))
        ));
        assert_eq!(
            PostPolicyError::Base64.s3_code(),
            S3ErrorCode::InvalidArgument
        );
    }

    #[test]
    fn line_wrapped_base64_is_accepted() {
        let json = r#"{"expiration": "2030-01-01T00:00:00Z", "conditions": [{"key": "k"}]}"#;
        let text = b64(json);
        let wrapped: String = text
            .as_bytes()
            .chunks(20)
            .map(|c| String::from_utf8_lossy(c).into_owned())
            .collect::<Vec<_>>()
            .join("\r\n");
        let d = PolicyDocument::parse(&wrapped, at("2026-01-01T00:00:00Z")).expect("wrapped");
        assert_eq!(d.conditions().len(), 1);
    }

    #[test]
    fn malformed_policies_are_refused() {
        for json in [
            r#"[]"#,
            r#""text""#,
            r#"{"conditions": []}"#,
            r#"{"expiration": 5, "conditions": []}"#,
            r#"{"expiration": "tomorrow", "conditions": []}"#,
            r#"{"expiration": "2030-01-01T00:00:00Z"}"#,
            r#"{"expiration": "2030-01-01T00:00:00Z", "conditions": {}}"#,
            r#"{"expiration": "2030-01-01T00:00:00Z", "conditions": [5]}"#,
            r#"{"expiration": "2030-01-01T00:00:00Z", "conditions": ["eq"]}"#,
            r#"{"expiration": "2030-01-01T00:00:00Z", "conditions": [{}]}"#,
            r#"{"expiration": "2030-01-01T00:00:00Z", "conditions": [{"key": 5}]}"#,
            r#"{"expiration": "2030-01-01T00:00:00Z", "conditions": [{"key": null}]}"#,
            r#"{"expiration": "2030-01-01T00:00:00Z", "conditions": [{"": "v"}]}"#,
            r#"{"expiration": "2030-01-01T00:00:00Z", "conditions": [[]]}"#,
            r#"{"expiration": "2030-01-01T00:00:00Z", "conditions": [["eq", "$key"]]}"#,
            r#"{"expiration": "2030-01-01T00:00:00Z", "conditions": [["eq", "$key", "a", "b"]]}"#,
            r#"{"expiration": "2030-01-01T00:00:00Z", "conditions": [["eq", "key", "a"]]}"#,
            r#"{"expiration": "2030-01-01T00:00:00Z", "conditions": [["eq", "$", "a"]]}"#,
            r#"{"expiration": "2030-01-01T00:00:00Z", "conditions": [["eq", 1, "a"]]}"#,
            r#"{"expiration": "2030-01-01T00:00:00Z", "conditions": [["eq", "$key", 1]]}"#,
            r#"{"expiration": "2030-01-01T00:00:00Z", "conditions": [[1, "$key", "a"]]}"#,
            r#"{"expiration": "2030-01-01T00:00:00Z", "conditions": [["ends-with", "$key", "a"]]}"#,
            r#"{"expiration": "2030-01-01T00:00:00Z", "conditions": [["content-length-range", -1, 5]]}"#,
            r#"{"expiration": "2030-01-01T00:00:00Z", "conditions": [["content-length-range", 1.5, 5]]}"#,
            r#"{"expiration": "2030-01-01T00:00:00Z", "conditions": [["content-length-range", "", 5]]}"#,
            r#"{"expiration": "2030-01-01T00:00:00Z", "conditions": [["content-length-range", "+1", 5]]}"#,
            r#"{"expiration": "2030-01-01T00:00:00Z", "conditions": [["content-length-range", 6, 5]]}"#,
            r#"{"expiration": "2030-01-01T00:00:00Z", "conditions": [["content-length-range", 1]]}"#,
            r#"{"expiration": "2030-01-01T00:00:00Z", "conditions": [["content-length-range", 1, 99999999999999999999999]]}"#,
        ] {
            let err = parse_err(json);
            assert!(
                matches!(err, PostPolicyError::Malformed(_)),
                "{json}: {err:?}"
            );
            assert_eq!(err.s3_code(), S3ErrorCode::InvalidArgument);
        }
        // Other top-level members are ignored.
        let d = PolicyDocument::parse(
            &b64(r#"{"expiration": "2030-01-01T00:00:00Z", "conditions": [], "note": 1}"#),
            at("2026-01-01T00:00:00Z"),
        );
        assert!(d.is_ok());
    }

    #[test]
    fn oversize_input_is_refused() {
        let now = at("2026-01-01T00:00:00Z");
        let big = "A".repeat(MAX_POLICY_LEN + 4);
        assert_eq!(
            PolicyDocument::parse(&big, now),
            Err(PostPolicyError::PolicyTooLarge {
                len: MAX_POLICY_LEN + 4,
                max: MAX_POLICY_LEN
            })
        );
        assert!(matches!(
            PolicyDocument::from_json(big.as_bytes(), now),
            Err(PostPolicyError::PolicyTooLarge { .. })
        ));
        let conditions = |n: usize| {
            let list = vec![r#"{"a":"b"}"#; n].join(",");
            b64(&format!(
                r#"{{"expiration": "2030-01-01T00:00:00Z", "conditions": [{list}]}}"#
            ))
        };
        assert_eq!(
            PolicyDocument::parse(&conditions(MAX_CONDITIONS), now).map(|d| d.conditions().len()),
            Ok(MAX_CONDITIONS)
        );
        assert_eq!(
            PolicyDocument::parse(&conditions(MAX_CONDITIONS + 1), now),
            Err(PostPolicyError::TooManyConditions {
                max: MAX_CONDITIONS
            })
        );
        // Names in one object count one by one.
        let names: Vec<String> = (0..=MAX_CONDITIONS)
            .map(|i| format!(r#""f{i}":"v""#))
            .collect();
        let json = format!(
            r#"{{"expiration": "2030-01-01T00:00:00Z", "conditions": [{{{}}}]}}"#,
            names.join(",")
        );
        assert_eq!(
            PolicyDocument::parse(&b64(&json), now),
            Err(PostPolicyError::TooManyConditions {
                max: MAX_CONDITIONS
            })
        );
    }

    #[test]
    fn form_fields_are_ordered_and_unique() {
        let mut f = FormFields::new();
        assert!(f.is_empty());
        f.push("Key", "a").expect("push");
        f.push("acl", "b").expect("push");
        assert_eq!(
            f.push("KEY", "c"),
            Err(PostPolicyError::DuplicateField("KEY".into()))
        );
        f.set("key", "d");
        f.set("bucket", "e");
        assert_eq!(
            f.iter().collect::<Vec<_>>(),
            [("key", "d"), ("acl", "b"), ("bucket", "e")]
        );
        assert_eq!(f.remove("ACL"), Some("b".into()));
        assert_eq!(f.len(), 2);
        assert_eq!(f.get("acl"), None);

        let mut f = FormFields::new();
        for i in 0..MAX_FORM_FIELDS {
            f.push(format!("f{i}"), "").expect("within bounds");
        }
        assert_eq!(
            f.push("one-more", ""),
            Err(PostPolicyError::TooManyFields {
                max: MAX_FORM_FIELDS
            })
        );
    }

    #[test]
    fn filename_substitution() {
        let f = fields(&[("key", "up/${filename}")]);
        assert_eq!(f.resolve_key(Some("a b.txt")).as_deref(), Ok("up/a b.txt"));
        assert_eq!(f.resolve_key(None), Err(PostPolicyError::NoFilename));
        let f = fields(&[("key", "${filename}/${filename}")]);
        assert_eq!(f.resolve_key(Some("x")).as_deref(), Ok("x/x"));
        // A file name that spells the variable is not substituted again.
        assert_eq!(
            f.resolve_key(Some("${filename}")).as_deref(),
            Ok("${filename}/${filename}")
        );
        assert_eq!(
            fields(&[("key", "plain")]).resolve_key(None).as_deref(),
            Ok("plain")
        );
        assert_eq!(
            FormFields::new().resolve_key(Some("x")),
            Err(PostPolicyError::MissingField("key"))
        );
        assert_eq!(
            fields(&[("key", "")]).resolve_key(Some("x")),
            Err(PostPolicyError::MissingField("key"))
        );
        assert_eq!(
            fields(&[("key", "${filename}")]).resolve_key(Some("")),
            Err(PostPolicyError::InvalidKey(KeyError::Empty))
        );
        let long = "k".repeat(1025);
        let err = fields(&[("key", "${filename}")]).resolve_key(Some(&long));
        assert_eq!(
            err.map_err(|e| e.s3_code()),
            Err(S3ErrorCode::KeyTooLongError)
        );
        assert!(fields(&[("key", "a${filename}")])
            .resolve_key(Some("\n"))
            .is_err());
    }

    #[test]
    fn own_signatures_verify_and_wrong_secrets_fail() {
        let policy = b64(r#"{"expiration": "2030-01-01T00:00:00Z", "conditions": []}"#);
        let scope = Scope::new("20260101", "us-east-1", "s3");
        let f = fields(&[
            ("x-amz-algorithm", "AWS4-HMAC-SHA256"),
            ("x-amz-credential", "AK/20260101/us-east-1/s3/aws4_request"),
            ("x-amz-date", "20260101T120000Z"),
            ("x-amz-signature", &sign_v4("s3cret", &scope, &policy)),
        ]);
        let cred = credential(&f).expect("v4");
        assert!(verify(&cred, "s3cret", &policy));
        assert!(!verify(&cred, "s3cret!", &policy));
        assert!(!verify(&cred, "s3cret", &b64("{}")));
        // An upper-case hex signature is not the one S3 computes.
        let upper = fields(&[
            ("x-amz-algorithm", "AWS4-HMAC-SHA256"),
            ("x-amz-credential", "AK/20260101/us-east-1/s3/aws4_request"),
            ("x-amz-date", "20260101T120000Z"),
            (
                "x-amz-signature",
                &sign_v4("s3cret", &scope, &policy).to_uppercase(),
            ),
        ]);
        assert!(!verify(&credential(&upper).expect("v4"), "s3cret", &policy));
        // A truncated signature fails without panicking.
        let short = PostCredential::V2 {
            access_key: "AK".into(),
            signature: sign_v2("s3cret", &policy)[..10].into(),
        };
        assert!(!verify(&short, "s3cret", &policy));
        let v2 = PostCredential::V2 {
            access_key: "AK".into(),
            signature: sign_v2("s3cret", &policy),
        };
        assert!(verify(&v2, "s3cret", &policy));
        assert!(!verify(&v2, "S3cret", &policy));
    }

    #[test]
    fn credential_fields_are_checked() {
        let v4 = |cred: &str, date: &str| {
            credential(&fields(&[
                ("x-amz-algorithm", "AWS4-HMAC-SHA256"),
                ("x-amz-credential", cred),
                ("x-amz-date", date),
                ("x-amz-signature", "00"),
            ]))
        };
        let good = v4("AK/20260101/eu-west-1/s3/aws4_request", "20260101T235959Z");
        assert!(
            matches!(good, Ok(PostCredential::V4 { ref scope, .. }) if scope.region == "eu-west-1")
        );
        for (cred, date) in [
            ("AK/20260101/eu-west-1/s3", "20260101T000000Z"),
            (
                "AK/20260101/eu-west-1/s3/aws4_request/x",
                "20260101T000000Z",
            ),
            ("/20260101/eu-west-1/s3/aws4_request", "20260101T000000Z"),
            ("AK/20260101//s3/aws4_request", "20260101T000000Z"),
            ("AK/20260101/eu-west-1/s3/aws5_request", "20260101T000000Z"),
            ("AK/20260101/eu-west-1/iam/aws4_request", "20260101T000000Z"),
            ("AK/20260101/eu-west-1/S3/aws4_request", "20260101T000000Z"),
            ("AK/20260102/eu-west-1/s3/aws4_request", "20260101T000000Z"),
            ("AK/20260101/eu-west-1/s3/aws4_request", "20260101"),
            ("AK/20260101/eu-west-1/s3/aws4_request", "20260101T250000Z"),
            (
                "AK/20260101/eu-west-1/s3/aws4_request",
                "2026-01-01T00:00:00Z",
            ),
            ("AK/2026011/eu-west-1/s3/aws4_request", "20260101T000000Z"),
        ] {
            assert!(
                matches!(v4(cred, date), Err(PostPolicyError::MalformedCredential(_))),
                "{cred} {date}"
            );
        }
        assert_eq!(
            credential(&fields(&[
                ("x-amz-algorithm", "AWS4-HMAC-SHA1"),
                ("x-amz-credential", "AK/20260101/eu-west-1/s3/aws4_request"),
                ("x-amz-date", "20260101T000000Z"),
                ("x-amz-signature", "00"),
            ])),
            Err(PostPolicyError::UnsupportedAlgorithm(
                "AWS4-HMAC-SHA1".into()
            ))
        );
        assert_eq!(
            credential(&fields(&[("x-amz-signature", "00")])),
            Err(PostPolicyError::MissingField("x-amz-algorithm"))
        );
        assert_eq!(
            credential(&fields(&[
                ("x-amz-algorithm", "AWS4-HMAC-SHA256"),
                ("x-amz-credential", "AK/20260101/eu-west-1/s3/aws4_request"),
                ("x-amz-date", "20260101T000000Z"),
            ])),
            Err(PostPolicyError::MissingField("x-amz-signature"))
        );
        assert_eq!(
            credential(&fields(&[("AWSAccessKeyId", "AK")])),
            Err(PostPolicyError::MissingField("signature"))
        );
        assert_eq!(
            credential(&fields(&[("Signature", "s")])),
            Err(PostPolicyError::MissingField("AWSAccessKeyId"))
        );
        assert_eq!(
            credential(&fields(&[
                ("AWSAccessKeyId", "AK"),
                ("signature", "s"),
                ("x-amz-signature", "00")
            ])),
            Err(PostPolicyError::MixedSignatures)
        );
        assert_eq!(
            credential(&fields(&[("key", "k")])),
            Err(PostPolicyError::NoCredentials)
        );
        assert_eq!(
            PostPolicyError::NoCredentials.s3_code(),
            S3ErrorCode::AccessDenied
        );
    }

    #[test]
    fn success_status() {
        assert_eq!(success_action_status(Some("200")), 200);
        assert_eq!(success_action_status(Some("201")), 201);
        assert_eq!(success_action_status(Some("204")), 204);
        assert_eq!(success_action_status(None), 204);
        for other in ["", "302", "404", " 201", "201 ", "0201", "abc"] {
            assert_eq!(success_action_status(Some(other)), 204, "{other}");
        }
    }

    #[test]
    fn success_redirects() {
        let r = |url: &str| success_redirect(url, "b", "dir/a b+c.txt", "\"abc\"");
        assert_eq!(
            r("http://example.com/done.html").as_deref(),
            Ok("http://example.com/done.html?bucket=b&key=dir%2Fa%20b%2Bc.txt&etag=%22abc%22")
        );
        assert_eq!(
            r("HTTPS://example.com/done?x=1").as_deref(),
            Ok("HTTPS://example.com/done?x=1&bucket=b&key=dir%2Fa%20b%2Bc.txt&etag=%22abc%22")
        );
        assert_eq!(
            r("https://example.com?").as_deref(),
            Ok("https://example.com?bucket=b&key=dir%2Fa%20b%2Bc.txt&etag=%22abc%22")
        );
        assert_eq!(
            r("https://example.com/p?x=1&#top").as_deref(),
            Ok("https://example.com/p?x=1&bucket=b&key=dir%2Fa%20b%2Bc.txt&etag=%22abc%22#top")
        );
        assert_eq!(
            success_redirect("http://h/", "b", "ключ", "e").as_deref(),
            Ok("http://h/?bucket=b&key=%D0%BA%D0%BB%D1%8E%D1%87&etag=e")
        );
        for bad in [
            "",
            "/relative",
            "example.com/x",
            "ftp://example.com/",
            "javascript://%0aalert(1)",
            "javascript:alert(1)",
            "http://",
            "http:///path",
            "http://?q",
            "http://exa mple.com/",
            "http://example.com/\r\nSet-Cookie:x",
            "http://\\evil.com/",
            "http://example.com/é",
        ] {
            assert!(r(bad).is_err(), "{bad}");
        }
        let long = format!("http://example.com/{}", "a".repeat(MAX_REDIRECT_LEN));
        assert_eq!(
            r(&long),
            Err(PostPolicyError::InvalidRedirect("the URL is too long"))
        );
    }

    #[test]
    fn conditions_display_as_s3_quotes_them() {
        let d = doc(
            r#"["eq", "$x-amz-meta-q", "say \"hi\""], {"acl": "a"}, ["content-length-range", 1, 2]"#,
        );
        let shown: Vec<String> = d.conditions().iter().map(|c| c.to_string()).collect();
        assert_eq!(
            shown,
            [
                r#"["eq", "$x-amz-meta-q", "say \"hi\""]"#,
                r#"["eq", "$acl", "a"]"#,
                r#"["content-length-range", 1, 2]"#
            ]
        );
        assert_eq!(d.conditions()[2].field(), None);
        assert_eq!(
            PostPolicyError::ConditionFailed(shown[1].clone()).to_string(),
            r#"Invalid according to Policy: Policy Condition failed: ["eq", "$acl", "a"]"#
        );
    }

    #[test]
    fn long_client_input_is_quoted_short() {
        let name = format!("x-{}", "é".repeat(100));
        let err = doc(r#"{"key": "k"}"#)
            .check(&fields(&[("key", "k"), (&name, "")]), 0)
            .expect_err("extra");
        let PostPolicyError::ExtraField(shown) = err else {
            panic!("{err:?}")
        };
        assert!(shown.len() <= MAX_QUOTE + 3 && shown.ends_with("..."));
    }
}
