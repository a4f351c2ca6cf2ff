//! POST Object: a browser uploads a file with an HTML form (`multipart/form-data`) to
//! `POST /bucket`, authorised by a policy document its form carries, signed with SigV4 or
//! SigV2 (`yutu_api::post_policy` decides the rules).
//!
//! Anybody may send a form, so nothing of its body is held before it is known to be worth
//! holding: the bucket must exist before a byte is read; the form's fields (at most
//! [`FORM_OVERHEAD`] bytes, counted as an anonymous body) are read up to the file part; then
//! the signature, the policy's field conditions and the permission are checked; only then is
//! the file reserved, against the signer's share of the body budget (an unsigned form's
//! against the anonymous pool), and read under the same limits as a PUT.
//!
//! The signer named by the form becomes the request's identity, so the same permission check
//! as every other write applies (with the bucket's ACL: a form without a signature writes
//! only where `AllUsers` may). Any policy violation is refused before anything is stored.

use std::time::SystemTime;

use bytes::{Bytes, BytesMut};
use http::{header, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use yutu_api::post_policy::{
    credential, success_action_status, success_redirect, verify, FormFields, PolicyDocument,
    PostPolicyError,
};
use yutu_api::xml::{to_xml, PostResponse};
use yutu_api::S3ErrorCode;

use super::meta::STORED_HEADERS;
use super::objects::store;
use crate::auth::{authorize_with_acl, Action, Identity};
use crate::http::body;
use crate::http::ctx::Ctx;
use crate::http::error::S3Error;
use crate::http::Resp;
use crate::model::checksum::{md5, Algorithm, Checksum};
use crate::model::conditions::WriteConditions;
use crate::model::ObjectMeta;
use crate::store::bucket_settings::BucketSettings;

/// Room for the form's text fields besides the file (S3 limits them to 20 KiB).
const FORM_OVERHEAD: u64 = 64 * 1024;

fn malformed(m: String) -> S3Error {
    S3Error::new(S3ErrorCode::MalformedPOSTRequest).msg(m)
}

fn no_file() -> S3Error {
    S3Error::new(S3ErrorCode::InvalidArgument)
        .msg("POST requires exactly one file upload per request.")
}

fn policy_error(e: PostPolicyError) -> S3Error {
    S3Error::new(e.s3_code()).msg(e.to_string())
}

/// The form's text fields, and the file's content type and bytes.
struct Form {
    fields: FormFields,
    file_type: Option<String>,
    file: Bytes,
}

/// The form's boundary, from its Content-Type.
fn boundary(ctx: &Ctx) -> Result<String, S3Error> {
    ctx.header("content-type")
        .and_then(|c| multer::parse_boundary(c).ok())
        .ok_or_else(|| {
            malformed(
                "The body of your POST request is not well-formed multipart/form-data.".into(),
            )
        })
}

/// Whether multer stopped only because its input ended (more of the body may complete it).
fn incomplete(e: &multer::Error) -> bool {
    matches!(
        e,
        multer::Error::IncompleteStream
            | multer::Error::IncompleteHeaders
            | multer::Error::IncompleteFieldData { .. }
    )
}

/// What precedes the file: the text fields and the file part's name.
struct Head {
    fields: FormFields,
    filename: Option<String>,
}

/// The form's fields up to the file part, once `head` (the body so far) holds them all;
/// `None` while more of the body is needed.
async fn fields_before_file(head: &[u8], boundary: &str) -> Result<Option<Head>, S3Error> {
    let data = Bytes::copy_from_slice(head);
    let stream = futures::stream::once(async move { Ok::<Bytes, std::io::Error>(data) });
    let mut multipart = multer::Multipart::new(stream, boundary.to_string());
    let mut fields = FormFields::new();
    loop {
        let field = match multipart.next_field().await {
            Ok(Some(field)) => field,
            Ok(None) => return Err(no_file()),
            Err(e) if incomplete(&e) => return Ok(None),
            Err(e) => {
                return Err(malformed(format!(
                    "The multipart/form-data body cannot be read: {e}."
                )))
            }
        };
        let name = field.name().unwrap_or_default().to_string();
        if name.eq_ignore_ascii_case("file") {
            return Ok(Some(Head {
                fields,
                filename: field.file_name().map(str::to_string),
            }));
        }
        match field.text().await {
            Ok(value) => fields.push(name, value).map_err(policy_error)?,
            Err(e) if incomplete(&e) => return Ok(None),
            Err(e) => return Err(malformed(format!("The field {name} cannot be read: {e}."))),
        }
    }
}

/// Parses a whole form body.
async fn parse_form(data: Bytes, boundary: &str) -> Result<Form, S3Error> {
    let stream = futures::stream::once(async move { Ok::<Bytes, std::io::Error>(data) });
    let mut multipart = multer::Multipart::new(stream, boundary.to_string());
    let mut fields = FormFields::new();
    let mut file = None;
    while let Some(field) = multipart
        .next_field()
        .await
        .map_err(|e| malformed(format!("The multipart/form-data body cannot be read: {e}.")))?
    {
        let name = field.name().unwrap_or_default().to_string();
        if name.eq_ignore_ascii_case("file") {
            // S3 ignores the fields after the file.
            let file_type = field.content_type().map(|m| m.to_string());
            let bytes = field
                .bytes()
                .await
                .map_err(|e| malformed(format!("The file cannot be read: {e}.")))?;
            file = Some((file_type, bytes));
            break;
        }
        let value = field
            .text()
            .await
            .map_err(|e| malformed(format!("The field {name} cannot be read: {e}.")))?;
        fields.push(name, value).map_err(policy_error)?;
    }
    let (file_type, file) = file.ok_or_else(no_file)?;
    Ok(Form {
        fields,
        file_type,
        file,
    })
}

/// Who signed the form (checked against the policy), or anonymous for a form without a
/// signature or policy.
fn signer(ctx: &Ctx, fields: &FormFields) -> Result<(Identity, Option<PolicyDocument>), S3Error> {
    let Some(policy_b64) = fields.get("policy") else {
        return match credential(fields) {
            Err(PostPolicyError::NoCredentials) => Ok((Identity::Anonymous, None)),
            _ => Err(S3Error::new(S3ErrorCode::InvalidArgument)
                .msg("Bucket POST must contain a field named 'policy' when it is signed.")),
        };
    };
    let policy = PolicyDocument::parse(policy_b64, SystemTime::now()).map_err(policy_error)?;
    let cred = credential(fields).map_err(policy_error)?;
    let user = ctx
        .shard
        .settings
        .users
        .iter()
        .find(|u| u.access_key == cred.access_key())
        .cloned()
        .ok_or_else(|| S3Error::new(S3ErrorCode::InvalidAccessKeyId))?;
    if !verify(&cred, &user.secret_key, policy_b64) {
        return Err(S3Error::new(S3ErrorCode::SignatureDoesNotMatch).msg(
            "The request signature we calculated does not match the signature you provided.",
        ));
    }
    Ok((Identity::User(user), Some(policy)))
}

/// The object's metadata from the form: Content-Type (the field, else the file part's), the
/// stored headers and `x-amz-meta-*`.
fn form_meta(form: &Form) -> Result<ObjectMeta, S3Error> {
    let mut headers = http::HeaderMap::new();
    for (name, value) in form.fields.iter() {
        let lower = name.to_ascii_lowercase();
        let keep = lower == "content-type"
            || STORED_HEADERS.contains(&lower.as_str())
            || lower.starts_with("x-amz-meta-");
        if keep {
            let (Ok(n), Ok(v)) = (
                header::HeaderName::from_bytes(lower.as_bytes()),
                header::HeaderValue::from_str(value),
            ) else {
                return Err(S3Error::new(S3ErrorCode::InvalidArgument)
                    .msg(format!("The field {name} is not a valid header.")));
            };
            headers.insert(n, v);
        }
    }
    if !headers.contains_key(header::CONTENT_TYPE) {
        if let Some(v) = form
            .file_type
            .as_deref()
            .and_then(|t| header::HeaderValue::from_str(t).ok())
        {
            headers.insert(header::CONTENT_TYPE, v);
        }
    }
    Ok(super::meta::from_request(&headers)?.into_object_meta())
}

/// The form's `x-amz-checksum-<algorithm>` field, if any, checked against the file: a
/// mismatch is `400 BadDigest` and nothing is stored. At most one such field.
fn form_checksum(form: &Form) -> Result<Option<Checksum>, S3Error> {
    let mut found = None;
    for (name, value) in form.fields.iter() {
        let Some(alg) = name
            .to_ascii_lowercase()
            .strip_prefix("x-amz-checksum-")
            .map(str::to_string)
        else {
            continue;
        };
        if alg == "algorithm" || alg == "type" {
            continue;
        }
        let algorithm = Algorithm::from_name(&alg).ok_or_else(|| {
            S3Error::new(S3ErrorCode::InvalidRequest).msg(format!(
                "The field {name} names no checksum algorithm Yutu knows."
            ))
        })?;
        if found.is_some() {
            return Err(
                S3Error::new(S3ErrorCode::InvalidRequest).msg("A form names at most one checksum.")
            );
        }
        let computed = algorithm.digest(&form.file);
        if computed != value.trim() {
            return Err(S3Error::new(S3ErrorCode::BadDigest).msg(format!(
                "The {} you specified did not match the calculated checksum.",
                algorithm.name()
            )));
        }
        found = Some(Checksum {
            algorithm,
            value: computed,
            composite_parts: None,
        });
    }
    Ok(found)
}

/// `POST /bucket` with a form.
pub async fn post_object(ctx: &Ctx, mut body_in: Incoming, bucket: &str) -> Result<Resp, S3Error> {
    // Nothing of the body is read or held before the bucket is known to exist...
    super::objects::bucket_must_exist(ctx, bucket)?;
    let boundary = boundary(ctx)?;
    let (limit, what) = super::objects::object_limit(ctx);
    let most = limit.saturating_add(FORM_OVERHEAD);
    let expected = body::content_length(ctx)?;
    body::check_announced(expected, most)?;
    // ...and then only the fields, as an anonymous body: nobody is known to have signed yet.
    let anonymous = ctx.body_client_as(&Identity::Anonymous);
    let fields_reserved = body::reserve_for(ctx, &anonymous, FORM_OVERHEAD).await?;
    let mut reader = body::BodyReader::new(ctx, &mut body_in);
    let mut all = BytesMut::new();
    let head = read_fields(&mut reader, &mut all, &boundary).await?;
    // The form's signer, not the (unsigned) request, is who writes.
    let (identity, policy) = signer(ctx, &head.fields)?;
    let key = head
        .fields
        .resolve_key(head.filename.as_deref())
        .map_err(policy_error)?;
    let mut checked = head.fields.clone();
    // The bucket is a condition like any field, though the form names it in the URL.
    checked.set("bucket", bucket);
    checked.set("key", key.clone());
    if let Some(policy) = &policy {
        policy.check_fields(&checked).map_err(policy_error)?;
    }
    let incarnation = authorize_signer(ctx, &identity, bucket, &key)?;
    // Now the file: reserved against the signer (an unsigned form: the anonymous pool).
    let client = ctx.body_client_as(&identity);
    let (rest, cap) = match expected {
        Some(n) => (n.saturating_sub(reader.received()), most),
        // No length announced: as much as the client's pool holds for one body, at most.
        None => {
            let budget = &ctx.shard.body_budget;
            let pool = if client.anonymous {
                budget.largest_anonymous()
            } else {
                budget.largest()
            };
            let rest = most.min(pool);
            (rest, reader.received().saturating_add(rest))
        }
    };
    let _file_reserved = body::reserve_for(ctx, &client, rest).await?;
    reader.resume();
    drop(fields_reserved);
    all.reserve(rest as usize);
    reader.read_to_end(&mut all, cap).await?;
    if expected.is_some_and(|n| n != all.len() as u64) {
        return Err(S3Error::new(S3ErrorCode::IncompleteBody));
    }
    let form = parse_form(all.freeze(), &boundary).await?;
    if let Some(policy) = &policy {
        policy
            .check_content_length(form.file.len() as u64)
            .map_err(policy_error)?;
    }
    if form.file.len() as u64 > limit {
        return Err(S3Error::new(S3ErrorCode::EntityTooLarge).msg(format!(
            "Your proposed upload exceeds {what} of {limit} bytes."
        )));
    }
    let meta = object_meta(ctx, &form, &identity, bucket)?;
    let cond = WriteConditions {
        incarnation,
        ..WriteConditions::default()
    };
    let stored = store(ctx, bucket, &key, form.file.clone(), meta, cond).await?;
    Ok(success(&form, bucket, key, &stored.etag))
}

/// Reads the form up to its file part (parsed again at every KiB received, not at every
/// frame: a form sent a byte at a time costs no more than 64 parses of at most 64 KiB): its
/// fields, at most [`FORM_OVERHEAD`] bytes of them.
async fn read_fields(
    reader: &mut body::BodyReader<'_>,
    all: &mut BytesMut,
    boundary: &str,
) -> Result<Head, S3Error> {
    let mut parsed_at = 0;
    loop {
        match reader.next().await? {
            Some(data) => all.extend_from_slice(&data),
            None => match fields_before_file(all, boundary).await? {
                Some(head) => return Ok(head),
                // The body ended before its file: the whole parse says what is wrong.
                None => {
                    return Err(parse_form(all.split().freeze(), boundary)
                        .await
                        .err()
                        .unwrap_or_else(no_file))
                }
            },
        }
        if all.len() < parsed_at + 1024 {
            continue;
        }
        parsed_at = all.len();
        if let Some(head) = fields_before_file(all, boundary).await? {
            return Ok(head);
        }
        if all.len() as u64 > FORM_OVERHEAD {
            return Err(malformed(format!(
                "The form's fields before its file exceed {FORM_OVERHEAD} bytes."
            )));
        }
    }
}

/// Whether the form's signer may write `key` into `bucket` (bucket policy, then ACL), and
/// the incarnation of the bucket it was checked against.
fn authorize_signer(
    ctx: &Ctx,
    identity: &Identity,
    bucket: &str,
    key: &str,
) -> Result<Option<u64>, S3Error> {
    ctx.shard.tier.with_bucket(bucket, |found| {
        authorize_signer_in(ctx, identity, bucket, key, found)
    })
}

/// [`authorize_signer`] on this shard's copy of the bucket's settings.
fn authorize_signer_in(
    ctx: &Ctx,
    identity: &Identity,
    bucket: &str,
    key: &str,
    found: Option<(&BucketSettings, u64)>,
) -> Result<Option<u64>, S3Error> {
    let owner = found.map(|(s, _)| s.owner.as_str());
    let guards = found.map(|(s, _)| s.guards()).unwrap_or_default();
    let asked = crate::http::permission::Asked {
        who: identity,
        op: crate::http::endpoint::Op::PostObject,
        action: Action::Write,
        bucket,
        key: Some(key),
        prefix: None,
    };
    let decision =
        crate::http::permission::decide(&asked, owner, &guards, |p| ctx.policy_context(p));
    authorize_with_acl(
        identity,
        Action::Write,
        Some(bucket),
        owner,
        found.map(|(s, _)| &s.acl),
        decision,
    )?;
    Ok(found.map(|(_, i)| i))
}

/// The stored object's metadata: the form's headers, its `acl` field as x-amz-acl, the
/// signer as owner, checksum, size and ETag.
fn object_meta(
    ctx: &Ctx,
    form: &Form,
    identity: &Identity,
    bucket: &str,
) -> Result<ObjectMeta, S3Error> {
    let mut meta = form_meta(form)?;
    let owner = identity.name().to_string();
    let bucket_owner = ctx.shard.tier.bucket_owner(bucket).unwrap_or_default();
    let acl_field = form.fields.get("acl").map(str::to_string);
    meta.acl = yutu_api::acl::Acl::from_headers(
        |name| {
            (name == yutu_api::acl::ACL_HEADER)
                .then_some(acl_field.as_deref())
                .flatten()
        },
        &owner,
        &bucket_owner,
    )
    .map_err(|e| S3Error::new(S3ErrorCode::InvalidArgument).msg(e.to_string()))?
    .unwrap_or_default();
    meta.owner = owner;
    meta.checksum = form_checksum(form)?;
    meta.size = form.file.len() as u64;
    meta.etag = format!("\"{}\"", hex::encode(md5(&form.file)));
    Ok(meta)
}

/// The answer to a stored upload: the redirect the form asks for, or the status it asks for
/// (201 with a PostResponse document, 200, or 204 by default).
fn success(form: &Form, bucket: &str, key: String, etag: &str) -> Resp {
    let location = format!("/{bucket}/{}", key);
    if let Some(url) = form.fields.get("success_action_redirect") {
        if let Ok(to) = success_redirect(url, bucket, &key, etag) {
            return Response::builder()
                .status(StatusCode::SEE_OTHER)
                .header(header::LOCATION, to)
                .header(header::ETAG, etag)
                .body(Full::new(Bytes::new()))
                .unwrap_or_default();
        }
    }
    let status = success_action_status(form.fields.get("success_action_status"));
    let builder = Response::builder()
        .header(header::ETAG, etag)
        .header(header::LOCATION, &location);
    match status {
        201 => {
            let doc = PostResponse {
                location,
                bucket: bucket.to_string(),
                key,
                etag: etag.to_string(),
            };
            builder
                .status(StatusCode::CREATED)
                .header(header::CONTENT_TYPE, "application/xml")
                .body(Full::new(Bytes::from(to_xml("PostResponse", &doc))))
                .unwrap_or_default()
        }
        200 => builder
            .status(StatusCode::OK)
            .body(Full::new(Bytes::new()))
            .unwrap_or_default(),
        _ => builder
            .status(StatusCode::NO_CONTENT)
            .body(Full::new(Bytes::new()))
            .unwrap_or_default(),
    }
}
