//! Multipart upload operations: CreateMultipartUpload, UploadPart, UploadPartCopy,
//! CompleteMultipartUpload, AbortMultipartUpload, ListParts, ListMultipartUploads.

use std::collections::BTreeMap;
use std::time::SystemTime;

use http::{Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use yutu_api::xml::{
    from_xml, to_xml, CompleteMultipartUploadResult, CompleteRequest, CopyResult,
    InitiateMultipartUploadResult, ListMultipartUploadsResult, ListPartsResult, PartEntry,
    UploadEntry, S3_NS,
};
use yutu_api::{parse_range, S3ErrorCode};

use super::copy::{fetch_source, invalid_source_range};
use super::objects::{bucket_must_exist, check_key, check_write_conditions};
use super::{meta, payload};
use crate::http::common::{empty, read_local};
use crate::http::ctx::Ctx;
use crate::http::error::S3Error;
use crate::http::{xml_response, Resp};
use crate::model::checksum::{md5, Algorithm, Checksum};
use crate::model::conditions::WriteConditions;
use crate::model::{ObjectMeta, StoreError};
use crate::node::quota::Admitted;
use crate::store::multipart::{
    multipart_etag, ClaimedChecksum, CompletePart, Upload, MAX_PART_NUMBER,
};
use crate::tier::Step;

/// Largest part (S3's limit), further bounded by a shard's DRAM.
pub const MAX_PART_SIZE: u64 = 5 << 30;
/// Largest CompleteMultipartUpload document: 10,000 parts and their markup.
const MAX_COMPLETE_BODY: u64 = 4 << 20;

fn invalid(m: &str) -> S3Error {
    S3Error::new(S3ErrorCode::InvalidArgument).msg(m)
}

fn upload_id(ctx: &Ctx) -> Result<String, S3Error> {
    ctx.target
        .param("uploadId")
        .filter(|id| !id.is_empty() && id.len() <= 128)
        .map(str::to_string)
        .ok_or_else(|| S3Error::new(S3ErrorCode::NoSuchUpload))
}

fn part_number(ctx: &Ctx) -> Result<u32, S3Error> {
    ctx.target
        .param("partNumber")
        .and_then(|n| n.parse::<u32>().ok())
        .filter(|n| (1..=MAX_PART_NUMBER).contains(n))
        .ok_or_else(|| invalid("Part number must be an integer between 1 and 10000, inclusive"))
}

/// An upload id that is unique across shards and restarts.
fn new_upload_id(ctx: &Ctx, bucket: &str, key: &str) -> String {
    let mut h = blake3::Hasher::new();
    h.update(ctx.shard.next_request_id().as_bytes());
    h.update(
        &SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos()
            .to_le_bytes(),
    );
    h.update(bucket.as_bytes());
    h.update(key.as_bytes());
    h.finalize().to_hex()[..32].to_string()
}

pub async fn create(ctx: &Ctx, bucket: &str, key: &str) -> Result<Resp, S3Error> {
    check_key(key)?;
    bucket_must_exist(ctx, bucket)?;
    let m = meta::from_request(&ctx.headers)?;
    let alg = match ctx.header("x-amz-checksum-algorithm") {
        None => None,
        Some(a) => {
            Some(Algorithm::from_name(a).ok_or_else(|| invalid("Invalid checksum algorithm."))?)
        }
    };
    let full_object = match ctx.header("x-amz-checksum-type") {
        Some(t) if t.eq_ignore_ascii_case("FULL_OBJECT") => {
            if !alg.is_some_and(Algorithm::is_crc) {
                return Err(invalid(
                    "The FULL_OBJECT checksum type needs a CRC algorithm.",
                ));
            }
            true
        }
        Some(t) if t.eq_ignore_ascii_case("COMPOSITE") => false,
        Some(_) => return Err(invalid("Invalid checksum type.")),
        // S3's default: CRC64NVME is always a full-object checksum, the others composite.
        None => alg == Some(Algorithm::Crc64Nvme),
    };
    let id = new_upload_id(ctx, bucket, key);
    let mut template = m.into_object_meta();
    super::acl::stamp_object(ctx, bucket, &mut template)?;
    let upload = Upload {
        bucket: bucket.to_string(),
        key: key.to_string(),
        initiated: SystemTime::now(),
        template,
        checksum: alg,
        full_object_checksum: full_object,
        parts: BTreeMap::new(),
        claimed: None,
    };
    let upload_id = id.clone();
    ctx.shard
        .run(ctx.shard.owner(bucket, key), move |s| {
            s.tier.create_upload(upload_id, upload)
        })
        .await??;
    let doc = InitiateMultipartUploadResult {
        xmlns: S3_NS,
        bucket: bucket.to_string(),
        key: key.to_string(),
        upload_id: id,
    };
    let mut resp = xml_response(
        StatusCode::OK,
        to_xml("InitiateMultipartUploadResult", &doc),
    );
    if let Some(a) = alg {
        if let Ok(v) = http::HeaderValue::from_str(a.name()) {
            resp.headers_mut().insert("x-amz-checksum-algorithm", v);
        }
        let t = if full_object {
            "FULL_OBJECT"
        } else {
            "COMPOSITE"
        };
        resp.headers_mut()
            .insert("x-amz-checksum-type", http::HeaderValue::from_static(t));
    }
    Ok(resp)
}

fn part_limit(ctx: &Ctx) -> u64 {
    MAX_PART_SIZE
        .min(ctx.shard.settings.max_object_size)
        .min(ctx.shard.tier.capacity())
}

async fn store_part(
    ctx: &Ctx,
    bucket: &str,
    key: &str,
    data: bytes::Bytes,
    checksum: Option<Checksum>,
) -> Result<String, S3Error> {
    let id = upload_id(ctx)?;
    let number = part_number(ctx)?;
    let etag = format!("\"{}\"", hex::encode(md5(&data)));
    let (b, k, e) = (bucket.to_string(), key.to_string(), etag.clone());
    ctx.shard
        .run(ctx.shard.owner(bucket, key), move |s| {
            s.tier.upload_part(&id, &b, &k, number, &data, e, checksum)
        })
        .await??;
    Ok(etag)
}

pub async fn upload_part(
    ctx: &Ctx,
    body: Incoming,
    bucket: &str,
    key: &str,
) -> Result<Resp, S3Error> {
    check_key(key)?;
    part_number(ctx)?;
    upload_id(ctx)?;
    let limit = part_limit(ctx);
    payload::precheck(ctx, limit, "the maximum part size")?;
    let received = payload::receive(ctx, body, limit).await?;
    let checksum = received.checksum.clone();
    let etag = store_part(ctx, bucket, key, received.data, checksum.clone()).await?;
    let mut resp = Response::builder()
        .status(StatusCode::OK)
        .header("etag", etag);
    if let Some(c) = checksum {
        resp = resp.header(c.algorithm.header(), c.value);
    }
    Ok(resp
        .body(Full::new(bytes::Bytes::new()))
        .unwrap_or_default())
}

/// `x-amz-copy-source-range`: exactly `bytes=first-last`. The open forms a GET's Range may
/// take (`bytes=first-`, `bytes=-suffix`) and several ranges are refused, as S3 refuses them
/// (InvalidArgument), rather than read as the whole object or its tail: a part must be the
/// bytes its client computed.
fn parse_copy_range(value: &str) -> Result<yutu_api::RangeSpec, S3Error> {
    match parse_range(value) {
        Some(r @ yutu_api::RangeSpec::FromTo(..)) => Ok(r),
        _ => Err(invalid("The x-amz-copy-source-range value must be of the form bytes=first-last where first and last are the zero-based offsets of the first and last bytes to copy")),
    }
}

pub async fn upload_part_copy(ctx: &Ctx, bucket: &str, key: &str) -> Result<Resp, S3Error> {
    check_key(key)?;
    part_number(ctx)?;
    upload_id(ctx)?;
    let range = match ctx.header("x-amz-copy-source-range") {
        None => None,
        Some(r) => Some(parse_copy_range(r)?),
    };
    let (source, data) = fetch_source(ctx, range).await?;
    // A range whose last byte lies past the end of the source is refused, not cut short (a
    // client computing part boundaries from a stale size would otherwise build a shorter
    // object than it meant to without being told).
    if let Some(yutu_api::RangeSpec::FromTo(_, last)) = range {
        if last >= source.size {
            return Err(invalid_source_range(source.size));
        }
    }
    if data.len() as u64 > part_limit(ctx) {
        return Err(S3Error::new(S3ErrorCode::EntityTooLarge));
    }
    let modified = SystemTime::now();
    let etag = store_part(ctx, bucket, key, data, None).await?;
    let doc = CopyResult {
        xmlns: S3_NS,
        last_modified: humantime::format_rfc3339_millis(modified).to_string(),
        etag,
        checksum_crc32: None,
    };
    Ok(xml_response(StatusCode::OK, to_xml("CopyPartResult", &doc)))
}

/// The object checksum a CompleteMultipartUpload names (`x-amz-checksum-<alg>`), if any.
fn claimed_checksum(ctx: &Ctx) -> Result<Option<ClaimedChecksum>, S3Error> {
    let mut claimed = ctx.headers.iter().filter_map(|(name, value)| {
        Algorithm::from_header(name.as_str()).map(|algorithm| ClaimedChecksum {
            algorithm,
            value: value.to_str().unwrap_or("").trim().to_string(),
        })
    });
    let first = claimed.next();
    if claimed.next().is_some() {
        return Err(S3Error::new(S3ErrorCode::InvalidRequest).msg(
            "Expecting a single x-amz-checksum- header. Multiple checksum types are not allowed.",
        ));
    }
    Ok(first)
}

/// Refuses a CompleteMultipartUpload whose checksum (or `x-amz-checksum-type`) is not of the
/// kind the upload was created with: the object's checksum is computed the upload's way,
/// so a value of another algorithm or type could never be checked (S3 answers
/// InvalidRequest).
fn check_claim_kind(
    ctx: &Ctx,
    claimed: Option<&ClaimedChecksum>,
    alg: Option<Algorithm>,
    full_object: bool,
) -> Result<(), S3Error> {
    let created = alg.map_or("no", Algorithm::name);
    if let Some(c) = claimed {
        if Some(c.algorithm) != alg {
            return Err(S3Error::new(S3ErrorCode::InvalidRequest).msg(format!(
                "The upload was created using the {created} checksum algorithm; the complete request must use the same one, not {}.",
                c.algorithm.name()
            )));
        }
    }
    if let Some(t) = ctx.header("x-amz-checksum-type") {
        let kind = if full_object {
            "FULL_OBJECT"
        } else {
            "COMPOSITE"
        };
        if alg.is_none() || !t.trim().eq_ignore_ascii_case(kind) {
            return Err(S3Error::new(S3ErrorCode::InvalidRequest).msg(format!(
                "The upload was created using the {} checksum type; the complete request must use the same one, not {t}.",
                if alg.is_none() { "no" } else { kind }
            )));
        }
    }
    Ok(())
}

/// The answer to a CompleteMultipartUpload that made (or, sent again, had made) `meta`.
fn completed(bucket: &str, key: &str, meta: &ObjectMeta) -> Resp {
    let mut doc = CompleteMultipartUploadResult {
        xmlns: S3_NS,
        location: format!("/{bucket}/{key}"),
        bucket: bucket.to_string(),
        key: key.to_string(),
        etag: meta.etag.clone(),
        checksum_crc32: None,
        checksum_crc32c: None,
        checksum_crc64nvme: None,
        checksum_sha1: None,
        checksum_sha256: None,
        checksum_type: None,
    };
    if let Some(c) = &meta.checksum {
        let value = Some(c.header_value());
        match c.algorithm {
            Algorithm::Crc32 => doc.checksum_crc32 = value,
            Algorithm::Crc32c => doc.checksum_crc32c = value,
            Algorithm::Crc64Nvme => doc.checksum_crc64nvme = value,
            Algorithm::Sha1 => doc.checksum_sha1 = value,
            Algorithm::Sha256 => doc.checksum_sha256 = value,
        }
        doc.checksum_type = Some(c.type_name());
    }
    let mut resp = xml_response(
        StatusCode::OK,
        to_xml("CompleteMultipartUploadResult", &doc),
    );
    if let Some(c) = &meta.checksum {
        if let Ok(v) = http::HeaderValue::from_str(&c.header_value()) {
            resp.headers_mut().insert(c.algorithm.header(), v);
        }
        resp.headers_mut().insert(
            "x-amz-checksum-type",
            http::HeaderValue::from_static(c.type_name()),
        );
    }
    resp
}

/// A CompleteMultipartUpload for an upload that is gone: when the key still holds the object
/// that upload made from this very part list, the request is a retry (its first answer was
/// lost, or the client completes twice, as ceph/s3-tests `test_multipart_upload` does) and
/// gets the first answer again, as from S3. Otherwise the upload is unknown: NoSuchUpload.
async fn complete_again(
    ctx: &Ctx,
    bucket: &str,
    key: &str,
    id: &str,
    parts: &[CompletePart],
    claimed: Option<&ClaimedChecksum>,
) -> Result<Resp, S3Error> {
    let no_such_upload = || S3Error::new(S3ErrorCode::NoSuchUpload);
    let meta = match read_local(ctx, bucket, key, true).await {
        Ok((meta, _)) => meta,
        Err(e) if e.code == S3ErrorCode::NoSuchKey => return Err(no_such_upload()),
        Err(e) => return Err(e),
    };
    let made_by_it = meta
        .parts
        .as_ref()
        .is_some_and(|p| !p.upload_id.is_empty() && p.upload_id == id);
    if !made_by_it || meta.etag != multipart_etag(parts) {
        return Err(no_such_upload());
    }
    if let Some(c) = claimed {
        if !meta.checksum.as_ref().is_some_and(|m| c.matches(m)) {
            return Err(S3Error::new(S3ErrorCode::BadDigest).msg(format!(
                "The {} you specified did not match the calculated checksum.",
                c.algorithm.name()
            )));
        }
    }
    Ok(completed(bucket, key, &meta))
}

/// CompleteMultipartUpload; `incarnation` is the bucket's as the permission check saw it.
pub async fn complete(
    ctx: &Ctx,
    body: Incoming,
    bucket: &str,
    key: &str,
    incarnation: Option<u64>,
) -> Result<Resp, S3Error> {
    check_key(key)?;
    check_write_conditions(ctx)?;
    let id = upload_id(ctx)?;
    let claimed = claimed_checksum(ctx)?;
    payload::precheck(
        ctx,
        MAX_COMPLETE_BODY,
        "the maximum CompleteMultipartUpload document size",
    )?;
    let received = payload::receive_document(ctx, body, MAX_COMPLETE_BODY).await?;
    let malformed = |m: String| S3Error::new(S3ErrorCode::MalformedXML).msg(m);
    let text = std::str::from_utf8(&received.data)
        .map_err(|_| malformed("The document is not UTF-8.".into()))?;
    let req: CompleteRequest = from_xml(text)
        .map_err(|e| malformed(format!("The XML you provided was not well-formed: {e}")))?;
    let parts: Vec<CompletePart> = req
        .parts
        .into_iter()
        .map(|p| CompletePart {
            number: p.part_number,
            etag: p.etag,
            checksum: p
                .checksum_crc32
                .or(p.checksum_crc32c)
                .or(p.checksum_crc64nvme)
                .or(p.checksum_sha1)
                .or(p.checksum_sha256),
        })
        .collect();
    let owner = ctx.shard.owner(bucket, key);
    let kind = {
        let (b, k, id) = (bucket.to_string(), key.to_string(), id.clone());
        ctx.shard
            .run(owner, move |s| s.tier.upload_checksum(&id, &b, &k))
            .await?
    };
    match kind {
        Ok((alg, full)) => check_claim_kind(ctx, claimed.as_ref(), alg, full)?,
        Err(StoreError::NoSuchUpload) => {
            return complete_again(ctx, bucket, key, &id, &parts, claimed.as_ref()).await
        }
        Err(e) => return Err(e.into()),
    }
    let cond = WriteConditions::for_bucket(&ctx.headers, incarnation);
    let (b, k) = (bucket.to_string(), key.to_string());
    let checked = !ctx.is_replica_copy();
    let (upload, listed, claim) = (id.clone(), parts.clone(), claimed.clone());
    let done = ctx
        .shard
        .run_step(owner, move |s| {
            let size = s.tier.completed_size(&upload, &listed);
            let admitted = if checked {
                match s.admit(&b, &[(&k, size)]) {
                    Ok(a) => a,
                    Err(e) => return Step::Done(Err(e)),
                }
            } else {
                Admitted::unchecked()
            };
            // In the step that completes, so no other completion sees this request's claim.
            s.tier.claim_checksum(&upload, claim);
            s.tier
                .complete_upload(upload, b, k, listed, cond)
                .holding(admitted)
        })
        .await?;
    match done {
        Ok(meta) => Ok(completed(bucket, key, &meta)),
        // Completed meanwhile by another request (a client retrying before its answer came).
        Err(StoreError::NoSuchUpload) => {
            complete_again(ctx, bucket, key, &id, &parts, claimed.as_ref()).await
        }
        Err(e) => Err(e.into()),
    }
}

pub async fn abort(ctx: &Ctx, bucket: &str, key: &str) -> Result<Resp, S3Error> {
    check_key(key)?;
    let id = upload_id(ctx)?;
    let (b, k) = (bucket.to_string(), key.to_string());
    ctx.shard
        .run(ctx.shard.owner(bucket, key), move |s| {
            s.tier.abort_upload(&id, &b, &k)
        })
        .await??;
    Ok(empty(StatusCode::NO_CONTENT))
}

pub async fn list_parts(ctx: &Ctx, bucket: &str, key: &str) -> Result<Resp, S3Error> {
    check_key(key)?;
    let id = upload_id(ctx)?;
    let marker = match ctx.target.param("part-number-marker") {
        None => 0,
        Some(m) => m
            .parse()
            .map_err(|_| invalid("Invalid part-number-marker."))?,
    };
    let max = match ctx.target.param("max-parts") {
        None => 1000,
        Some(m) => m
            .parse::<usize>()
            .map_err(|_| invalid("Invalid max-parts."))?
            .min(1000),
    };
    let (b, k, upload) = (bucket.to_string(), key.to_string(), id.clone());
    let (mut parts, initiator) = ctx
        .shard
        .run(ctx.shard.owner(bucket, key), move |s| {
            s.tier.list_parts(&upload, &b, &k, marker, max + 1)
        })
        .await??;
    let initiator = super::buckets::owner(initiator.as_deref().unwrap_or(""));
    let truncated = parts.len() > max;
    parts.truncate(max);
    let doc = ListPartsResult {
        xmlns: S3_NS,
        bucket: bucket.to_string(),
        key: key.to_string(),
        upload_id: id,
        part_number_marker: marker,
        next_part_number_marker: parts.last().map(|p| p.number).filter(|_| truncated),
        max_parts: max,
        is_truncated: truncated,
        part: parts
            .into_iter()
            .map(|p| PartEntry {
                part_number: p.number,
                last_modified: humantime::format_rfc3339_millis(p.last_modified).to_string(),
                etag: p.etag,
                size: p.size,
            })
            .collect(),
        owner: initiator.clone(),
        initiator,
        storage_class: "STANDARD",
    };
    Ok(xml_response(
        StatusCode::OK,
        to_xml("ListPartsResult", &doc),
    ))
}

pub async fn list_uploads(ctx: &Ctx, bucket: &str) -> Result<Resp, S3Error> {
    bucket_must_exist(ctx, bucket)?;
    let prefix = ctx.target.param("prefix").unwrap_or("").to_string();
    let key_marker = ctx.target.param("key-marker").unwrap_or("").to_string();
    let id_marker = ctx
        .target
        .param("upload-id-marker")
        .unwrap_or("")
        .to_string();
    let max = match ctx.target.param("max-uploads") {
        None => 1000,
        Some(m) => m
            .parse::<usize>()
            .map_err(|_| invalid("Invalid max-uploads."))?
            .min(1000),
    };
    let pages = ctx
        .shard
        .broadcast({
            let (bucket, prefix) = (bucket.to_string(), prefix.clone());
            move |s| s.tier.list_uploads(&bucket, &prefix)
        })
        .await?;
    let mut all: Vec<_> = pages
        .into_iter()
        .flatten()
        .filter(|u| {
            key_marker.is_empty()
                || u.key > key_marker
                || (u.key == key_marker && !id_marker.is_empty() && u.upload_id > id_marker)
        })
        .collect();
    all.sort_by(|a, b| (&a.key, &a.upload_id).cmp(&(&b.key, &b.upload_id)));
    let truncated = all.len() > max;
    all.truncate(max);
    let last = all.last().map(|u| (u.key.clone(), u.upload_id.clone()));
    let doc = ListMultipartUploadsResult {
        xmlns: S3_NS,
        bucket: bucket.to_string(),
        key_marker,
        upload_id_marker: id_marker,
        next_key_marker: last.as_ref().filter(|_| truncated).map(|l| l.0.clone()),
        next_upload_id_marker: last.filter(|_| truncated).map(|l| l.1),
        prefix,
        max_uploads: max,
        is_truncated: truncated,
        upload: all
            .into_iter()
            .map(|u| UploadEntry {
                key: u.key,
                upload_id: u.upload_id,
                initiated: humantime::format_rfc3339_millis(u.initiated).to_string(),
                initiator: super::buckets::owner(&u.owner),
                owner: super::buckets::owner(&u.owner),
                storage_class: "STANDARD",
            })
            .collect(),
    };
    Ok(xml_response(
        StatusCode::OK,
        to_xml("ListMultipartUploadsResult", &doc),
    ))
}

/// Serves this file's bucket operations (the table is
/// [`Op::handler`](crate::http::endpoint::Op::handler)), once the caller may
/// (`incarnation`: the bucket's, as the permission was checked against).
pub async fn serve_bucket(
    ctx: &Ctx,
    op: crate::http::endpoint::Op,
    b: &str,
    _body: Incoming,
    _incarnation: Option<u64>,
) -> Result<Resp, S3Error> {
    use crate::http::endpoint::Op;
    match op {
        Op::ListMultipartUploads => list_uploads(ctx, b).await,
        _ => Err(crate::http::endpoint::not_served(op)),
    }
}

/// Serves this file's object operations (the table is
/// [`Op::handler`](crate::http::endpoint::Op::handler)), once the caller may (`incarnation`
/// as for a bucket, `gate`: whether the object's ACL is still to be checked).
pub async fn serve_object(
    ctx: &Ctx,
    op: crate::http::endpoint::Op,
    b: &str,
    k: &str,
    body: Incoming,
    incarnation: Option<u64>,
    _gate: crate::auth::Gate,
) -> Result<Resp, S3Error> {
    use crate::http::endpoint::Op;
    match op {
        Op::UploadPartCopy => upload_part_copy(ctx, b, k).await,
        Op::UploadPart => upload_part(ctx, body, b, k).await,
        Op::CreateMultipartUpload => create(ctx, b, k).await,
        Op::CompleteMultipartUpload => complete(ctx, body, b, k, incarnation).await,
        Op::AbortMultipartUpload => abort(ctx, b, k).await,
        Op::ListParts => list_parts(ctx, b, k).await,
        _ => Err(crate::http::endpoint::not_served(op)),
    }
}
