//! DeleteObjects: up to 1000 keys in one request, each answered on its own.

use std::collections::BTreeMap;

use http::StatusCode;
use hyper::body::Incoming;
use yutu_api::xml::{
    from_xml, to_xml, DeleteError, DeleteObject, DeleteRequest, DeleteResult, Deleted, S3_NS,
};
use yutu_api::S3ErrorCode;

use super::objects::{bucket_must_exist, check_key};
use crate::http::common::read_local;
use crate::http::ctx::Ctx;
use crate::http::error::S3Error;
use crate::http::{s3::payload, xml_response, Resp};
use crate::model::conditions::DeleteConditions;

/// Most keys per request (S3's limit).
pub const MAX_KEYS: usize = 1000;
/// Largest request document: 1000 keys of 1024 bytes plus their markup.
const MAX_BODY: u64 = 2 << 20;

/// A key's conditions (`ETag`, `LastModifiedTime`, `Size`), checked against the current
/// object: PreconditionFailed (that key's error) unless it passes; a missing key passes, its
/// delete being a no-op. Checked before the keys are deleted together, so a write landing
/// between the check and the delete is not seen (DeleteObject checks in the deleting step).
async fn check_conditions(ctx: &Ctx, bucket: &str, o: &DeleteObject) -> Result<(), S3Error> {
    let cond = DeleteConditions::parse(
        o.etag.as_deref(),
        o.last_modified_time.as_deref(),
        o.size.as_deref(),
    )
    .map_err(|e| S3Error::new(S3ErrorCode::InvalidArgument).msg(e.to_string()))?;
    if cond.is_empty() {
        return Ok(());
    }
    match read_local(ctx, bucket, &o.key, true).await {
        Ok((meta, _)) if !cond.check(&meta) => Err(S3Error::new(S3ErrorCode::PreconditionFailed)
            .msg("At least one of the preconditions you specified did not hold.")),
        Err(e) if e.code != S3ErrorCode::NoSuchKey => Err(e),
        _ => Ok(()),
    }
}

/// DeleteObjects; `incarnation` is the bucket's as the permission check saw it, so a slow
/// request never deletes from a bucket of the same name created after the check.
pub async fn delete_objects(
    ctx: &Ctx,
    body: Incoming,
    bucket: &str,
    incarnation: Option<u64>,
) -> Result<Resp, S3Error> {
    payload::precheck(ctx, MAX_BODY, "the maximum DeleteObjects document size")?;
    bucket_must_exist(ctx, bucket)?;
    let received = payload::receive(ctx, body, MAX_BODY).await?;
    let malformed = |m: String| S3Error::new(S3ErrorCode::MalformedXML).msg(m);
    let text = std::str::from_utf8(&received.data)
        .map_err(|_| malformed("The document is not UTF-8.".into()))?;
    let req: DeleteRequest = from_xml(text)
        .map_err(|e| malformed(format!("The XML you provided was not well-formed: {e}")))?;
    if req.objects.is_empty() || req.objects.len() > MAX_KEYS {
        return Err(malformed(format!(
            "A DeleteObjects request names between 1 and {MAX_KEYS} keys; this one names {}.",
            req.objects.len()
        )));
    }
    let mut result = DeleteResult {
        xmlns: S3_NS,
        ..Default::default()
    };
    // Valid keys grouped by owning shard, so each shard gets one message.
    let mut by_shard: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for o in &req.objects {
        let bad_version = o.version_id.as_deref().is_some_and(|v| v != "null");
        match check_key(&o.key) {
            Err(e) => result.error.push(DeleteError {
                key: o.key.clone(),
                code: e.code.code().to_string(),
                message: e.message,
            }),
            Ok(()) if bad_version => result.error.push(DeleteError {
                key: o.key.clone(),
                code: "NoSuchVersion".into(),
                message: "The specified version does not exist.".into(),
            }),
            Ok(()) => {
                if let Err(e) = check_conditions(ctx, bucket, o).await {
                    result.error.push(DeleteError {
                        key: o.key.clone(),
                        code: e.code.code().to_string(),
                        message: e.message,
                    });
                    continue;
                }
                by_shard
                    .entry(ctx.shard.owner(bucket, &o.key))
                    .or_default()
                    .push(o.key.clone())
            }
        }
    }
    // In a cluster the copies on the other owners go first: a key is reported deleted only
    // once no owner holds it.
    // One version for the whole request, the same on every owner.
    let version = ctx
        .replica_version()
        .unwrap_or_else(|| crate::model::version::CLOCK.now());
    let by_shard = match (&ctx.cluster, &ctx.peer) {
        (Some(cluster), None) => {
            crate::http::peer::cluster::delete_elsewhere(
                cluster,
                bucket,
                version,
                by_shard,
                &mut result.error,
            )
            .await
        }
        _ => by_shard,
    };
    for (shard, keys) in by_shard {
        let (b, k) = (bucket.to_string(), keys.clone());
        match ctx
            .shard
            .run_step(shard, move |s| {
                s.tier.delete_versioned(b, k, Some(version), incarnation)
            })
            .await
        {
            Ok(Ok(_)) => {
                if !req.quiet {
                    result
                        .deleted
                        .extend(keys.into_iter().map(|key| Deleted { key }));
                }
            }
            Ok(Err(e)) => {
                let e = S3Error::from(e);
                result.error.extend(keys.into_iter().map(|key| DeleteError {
                    key,
                    code: e.code.code().to_string(),
                    message: e.message.clone(),
                }));
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(xml_response(
        StatusCode::OK,
        to_xml("DeleteResult", &result),
    ))
}

/// Serves this file's bucket operations (the table is
/// [`Op::handler`](crate::http::endpoint::Op::handler)), once the caller may
/// (`incarnation`: the bucket's, as the permission was checked against).
pub async fn serve_bucket(
    ctx: &Ctx,
    op: crate::http::endpoint::Op,
    b: &str,
    body: Incoming,
    incarnation: Option<u64>,
) -> Result<Resp, S3Error> {
    use crate::http::endpoint::Op;
    match op {
        Op::DeleteObjects => delete_objects(ctx, body, b, incarnation).await,
        _ => Err(crate::http::endpoint::not_served(op)),
    }
}
