//! POST Object: a browser uploads a file with an HTML form (`multipart/form-data`) to
//! `POST /bucket`, authorised by a policy document its form carries, signed with SigV4 or
//! SigV2 (`yutu_api::post_policy` decides the rules).
//!
//! The body is read whole under the same limits as a PUT (the object limit, plus room for the
//! form's fields), then parsed with `multer`. The signer named by the form becomes the
//! request's identity, so the same permission check as every other write applies (with the
//! bucket's ACL: a form without a signature writes only where `AllUsers` may). Any policy
//! violation is refused before anything is stored.

use std::time::SystemTime;

use bytes::Bytes;
use http::{header, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use yutu_api::post_policy::{
    credential, success_action_status, success_redirect, verify, FormFields, PolicyDocument,
    PostPolicyError,
};
use yutu_api::xml::{to_xml, PostResponse, S3_NS};
use yutu_api::S3ErrorCode;

use super::body;
use super::ctx::Ctx;
use super::error::S3Error;
use super::meta::STORED_HEADERS;
use super::objects::store;
use super::Resp;
use crate::auth::{authorize_with_acl, Action, Identity};
use crate::model::checksum::md5;
use crate::model::conditions::WriteConditions;
use crate::model::ObjectMeta;

/// Room for the form's text fields besides the file (S3 limits them to 20 KiB).
const FORM_OVERHEAD: u64 = 64 * 1024;

fn policy_error(e: PostPolicyError) -> S3Error {
    S3Error::new(e.s3_code()).msg(e.to_string())
}

/// Whether a request is a form upload: `POST /bucket` with a multipart/form-data body.
pub fn is_form(ctx: &Ctx) -> bool {
    ctx.header("content-type").is_some_and(|c| {
        c.trim_start()
            .to_ascii_lowercase()
            .starts_with("multipart/form-data")
    })
}

/// The form's text fields, and the file's name, content type and bytes.
struct Form {
    fields: FormFields,
    filename: Option<String>,
    file_type: Option<String>,
    file: Bytes,
}

async fn parse_form(ctx: &Ctx, body_in: Incoming) -> Result<Form, S3Error> {
    let malformed = |m: String| S3Error::new(S3ErrorCode::MalformedPOSTRequest).msg(m);
    let boundary = ctx
        .header("content-type")
        .and_then(|c| multer::parse_boundary(c).ok())
        .ok_or_else(|| {
            malformed(
                "The body of your POST request is not well-formed multipart/form-data.".into(),
            )
        })?;
    let (limit, _) = super::objects::object_limit(ctx);
    let whole = body::read_limited(ctx, body_in, limit.saturating_add(FORM_OVERHEAD)).await?;
    let data = whole.data.clone();
    let stream = futures::stream::once(async move { Ok::<Bytes, std::io::Error>(data) });
    let mut multipart = multer::Multipart::new(stream, boundary);
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
            let filename = field.file_name().map(str::to_string);
            let file_type = field.content_type().map(|m| m.to_string());
            let bytes = field
                .bytes()
                .await
                .map_err(|e| malformed(format!("The file cannot be read: {e}.")))?;
            file = Some((filename, file_type, bytes));
            break;
        }
        let value = field
            .text()
            .await
            .map_err(|e| malformed(format!("The field {name} cannot be read: {e}.")))?;
        fields.push(name, value).map_err(policy_error)?;
    }
    let (filename, file_type, file) = file.ok_or_else(|| {
        S3Error::new(S3ErrorCode::InvalidArgument)
            .msg("POST requires exactly one file upload per request.")
    })?;
    Ok(Form {
        fields,
        filename,
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

/// `POST /bucket` with a form.
pub async fn post_object(ctx: &Ctx, body_in: Incoming, bucket: &str) -> Result<Resp, S3Error> {
    let form = parse_form(ctx, body_in).await?;
    // The form's signer, not the (unsigned) request, is who writes.
    let (identity, policy) = signer(ctx, &form.fields)?;
    let key = form
        .fields
        .resolve_key(form.filename.as_deref())
        .map_err(policy_error)?;
    if let Some(policy) = &policy {
        let mut checked = form.fields.clone();
        // The bucket is a condition like any field, though the form names it in the URL.
        checked.set("bucket", bucket);
        checked.set("key", key.clone());
        policy
            .check(&checked, form.file.len() as u64)
            .map_err(policy_error)?;
    }
    let incarnation = {
        let store = ctx.shard.tier.store.borrow();
        let found = store.bucket_access(bucket);
        authorize_with_acl(
            &identity,
            Action::Write,
            Some(bucket),
            found.map(|(o, _, _)| o),
            found.map(|(_, _, a)| a),
        )?;
        found.map(|(_, i, _)| i)
    };
    super::objects::bucket_must_exist(ctx, bucket)?;
    let (limit, what) = super::objects::object_limit(ctx);
    if form.file.len() as u64 > limit {
        return Err(S3Error::new(S3ErrorCode::EntityTooLarge).msg(format!(
            "Your proposed upload exceeds {what} of {limit} bytes."
        )));
    }
    let mut meta = form_meta(&form)?;
    // The form's `acl` field is its x-amz-acl.
    let owner = identity.name().to_string();
    let bucket_owner = ctx
        .shard
        .tier
        .store
        .borrow()
        .bucket_access(bucket)
        .map(|(o, _, _)| o.to_string())
        .unwrap_or_default();
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
    meta.size = form.file.len() as u64;
    meta.etag = format!("\"{}\"", hex::encode(md5(&form.file)));
    let cond = WriteConditions {
        incarnation,
        ..WriteConditions::default()
    };
    let stored = store(ctx, bucket, &key, form.file.clone(), meta, cond).await?;
    let location = format!("/{bucket}/{}", key);
    if let Some(url) = form.fields.get("success_action_redirect") {
        if let Ok(to) = success_redirect(url, bucket, &key, &stored.etag) {
            return Ok(Response::builder()
                .status(StatusCode::SEE_OTHER)
                .header(header::LOCATION, to)
                .header(header::ETAG, &stored.etag)
                .body(Full::new(Bytes::new()))
                .unwrap_or_default());
        }
    }
    let status = success_action_status(form.fields.get("success_action_status"));
    let builder = Response::builder()
        .header(header::ETAG, &stored.etag)
        .header(header::LOCATION, &location);
    Ok(match status {
        201 => {
            let doc = PostResponse {
                xmlns: S3_NS,
                location,
                bucket: bucket.to_string(),
                key,
                etag: stored.etag.clone(),
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
    })
}
