//! GetObjectAttributes (`GET /bucket/key?attributes`): an object's ETag, checksum, part
//! count, storage class and size in one XML document, without its bytes.
//!
//! SDKs use it to verify a download or plan a ranged one; what it answers comes from the
//! object's metadata alone, read like a HEAD (so it finds objects in every tier).

use http::{Response, StatusCode};
use http_body_util::Full;
use yutu_api::xml::{to_xml, S3_NS};
use yutu_api::xml_attributes::{
    parse_object_attributes, AttributesChecksum, AttributesParts, GetObjectAttributesResponse,
    ObjectAttribute,
};
use yutu_api::S3ErrorCode;

use super::ctx::Ctx;
use super::error::S3Error;
use super::objects::check_key;
use super::Resp;
use crate::model::checksum::{Algorithm, Checksum};
use crate::model::ObjectMeta;

/// The only storage class Yutu has; S3 names it so for objects of the default class.
const STORAGE_CLASS: &str = "STANDARD";
/// The page size S3 reports for `ObjectParts` when the client sets no `x-amz-max-parts`.
const DEFAULT_MAX_PARTS: u32 = 1000;

/// The request's `x-amz-object-attributes`, each refused name or a missing header being
/// `InvalidArgument` as S3 answers it.
fn requested(ctx: &Ctx) -> Result<Vec<ObjectAttribute>, S3Error> {
    let values: Vec<&str> = ctx
        .headers
        .get_all("x-amz-object-attributes")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    parse_object_attributes(values)
        .map_err(|e| S3Error::new(S3ErrorCode::InvalidArgument).msg(e.to_string()))
}

/// `x-amz-max-parts`: accepted for SDK compatibility; only echoed, as no part is listed.
fn max_parts(ctx: &Ctx) -> Result<u32, S3Error> {
    match ctx.header("x-amz-max-parts") {
        None => Ok(DEFAULT_MAX_PARTS),
        Some(v) => v.trim().parse::<u32>().map_err(|_| {
            S3Error::new(S3ErrorCode::InvalidArgument)
                .msg("x-amz-max-parts must be a non-negative integer.")
        }),
    }
}

fn checksum_doc(c: &Checksum) -> AttributesChecksum {
    // The bare value: the `-N` suffix of a composite checksum is header syntax; the
    // document says COMPOSITE in ChecksumType instead.
    let value = Some(c.value.clone());
    let mut doc = AttributesChecksum {
        checksum_type: c.type_name(),
        ..Default::default()
    };
    match c.algorithm {
        Algorithm::Crc32 => doc.crc32 = value,
        Algorithm::Crc32c => doc.crc32c = value,
        Algorithm::Crc64Nvme => doc.crc64nvme = value,
        Algorithm::Sha1 => doc.sha1 = value,
        Algorithm::Sha256 => doc.sha256 = value,
    }
    doc
}

/// The document for `meta` with exactly the attributes asked for.
fn document(
    meta: &ObjectMeta,
    attrs: &[ObjectAttribute],
    max_parts: u32,
) -> GetObjectAttributesResponse {
    let mut doc = GetObjectAttributesResponse {
        xmlns: S3_NS,
        ..Default::default()
    };
    for a in attrs {
        match a {
            ObjectAttribute::ETag => doc.etag = Some(meta.etag.trim_matches('"').to_string()),
            ObjectAttribute::Checksum => doc.checksum = meta.checksum.as_ref().map(checksum_doc),
            // Only a multipart object has parts (S3 leaves the element out otherwise).
            ObjectAttribute::ObjectParts => {
                doc.object_parts = meta.parts.map(|n| AttributesParts {
                    parts_count: n,
                    part_number_marker: 0,
                    next_part_number_marker: 0,
                    max_parts,
                    is_truncated: false,
                })
            }
            ObjectAttribute::StorageClass => doc.storage_class = Some(STORAGE_CLASS),
            ObjectAttribute::ObjectSize => doc.object_size = Some(meta.size),
        }
    }
    doc
}

/// GetObjectAttributes on this node's copy of the key.
pub async fn get_attributes(ctx: &Ctx, bucket: &str, key: &str) -> Result<Resp, S3Error> {
    check_key(key)?;
    let attrs = requested(ctx)?;
    let max_parts = max_parts(ctx)?;
    if let Some(v) = ctx.target.param("versionId") {
        if v != "null" {
            return Err(
                S3Error::new(S3ErrorCode::InvalidArgument).msg("Invalid version id specified")
            );
        }
    }
    let (meta, _) = super::objects::read_local(ctx, bucket, key, true).await?;
    let xml = to_xml(
        "GetObjectAttributesResponse",
        &document(&meta, &attrs, max_parts),
    );
    Response::builder()
        .status(StatusCode::OK)
        .header(http::header::CONTENT_TYPE, "application/xml")
        .header(
            http::header::LAST_MODIFIED,
            httpdate::fmt_http_date(meta.last_modified),
        )
        .body(Full::new(bytes::Bytes::from(xml)))
        .map_err(|e| {
            tracing::error!(error = %e, "cannot build a GetObjectAttributes response");
            S3Error::new(S3ErrorCode::InternalError)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_part_object_has_no_parts_and_an_unquoted_etag() {
        let mut meta = ObjectMeta::for_block(5);
        meta.etag = "\"abc\"".into();
        let all = ObjectAttribute::ALL;
        let doc = document(&meta, &all, 1000);
        assert_eq!(doc.etag.as_deref(), Some("abc"));
        assert!(doc.object_parts.is_none() && doc.checksum.is_none());
        assert_eq!(
            (doc.storage_class, doc.object_size),
            (Some("STANDARD"), Some(5))
        );
        meta.parts = Some(3);
        meta.checksum = Some(Checksum {
            algorithm: Algorithm::Sha256,
            value: "v=".into(),
            composite_parts: Some(3),
        });
        let doc = document(
            &meta,
            &[ObjectAttribute::ObjectParts, ObjectAttribute::Checksum],
            7,
        );
        assert_eq!(
            doc.object_parts.map(|p| (p.parts_count, p.max_parts)),
            Some((3, 7))
        );
        let c = doc.checksum.expect("checksum");
        assert_eq!(
            (c.sha256.as_deref(), c.checksum_type),
            (Some("v="), "COMPOSITE")
        );
        assert!(doc.etag.is_none());
    }
}
