//! GetObjectAttributes (`GET /bucket/key?attributes`): an object's ETag, checksum, parts,
//! storage class and size in one XML document, without its bytes.
//!
//! SDKs use it to verify a download or plan a ranged one; what it answers comes from the
//! object's metadata alone, read like a HEAD (so it finds objects in every tier).

use http::{Response, StatusCode};
use http_body_util::Full;
use yutu_api::xml::{to_xml, S3_NS};
use yutu_api::xml_attributes::{
    parse_object_attributes, AttributesChecksum, AttributesPart, AttributesParts,
    GetObjectAttributesResponse, ObjectAttribute,
};
use yutu_api::S3ErrorCode;

use super::objects::check_key;
use crate::http::ctx::Ctx;
use crate::http::error::S3Error;
use crate::http::Resp;
use crate::model::checksum::{Algorithm, Checksum};
use crate::model::object::{ObjectPart, PartLayout};
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

/// `x-amz-max-parts`: how many parts one page of `ObjectParts` lists.
fn max_parts(ctx: &Ctx) -> Result<u32, S3Error> {
    match ctx.header("x-amz-max-parts") {
        None => Ok(DEFAULT_MAX_PARTS),
        Some(v) => v.trim().parse::<u32>().map_err(|_| {
            S3Error::new(S3ErrorCode::InvalidArgument)
                .msg("x-amz-max-parts must be a non-negative integer.")
        }),
    }
}

/// `x-amz-part-number-marker`: the page of `ObjectParts` starts after this part.
fn part_number_marker(ctx: &Ctx) -> Result<u32, S3Error> {
    match ctx.header("x-amz-part-number-marker") {
        None => Ok(0),
        Some(v) => v.trim().parse::<u32>().map_err(|_| {
            S3Error::new(S3ErrorCode::InvalidArgument)
                .msg("x-amz-part-number-marker must be a non-negative integer.")
        }),
    }
}

/// The object's checksum. A composite one keeps its `-N`, as S3 writes it in the header of a
/// GET and in CompleteMultipartUpload's answer, so that a client comparing what it was told
/// on completion with what it reads here finds the same string (ceph/s3-tests
/// `test_multipart_use_cksum_helper_sha256`); ChecksumType says COMPOSITE besides.
fn checksum_doc(c: &Checksum) -> AttributesChecksum {
    let value = Some(c.header_value());
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

/// One listed part; its checksum is of the object's algorithm.
fn part_doc(p: &ObjectPart, alg: Option<Algorithm>) -> AttributesPart {
    let mut doc = AttributesPart {
        part_number: p.number,
        size: p.size,
        ..Default::default()
    };
    let value = p.checksum.clone();
    match alg {
        Some(Algorithm::Crc32) => doc.crc32 = value,
        Some(Algorithm::Crc32c) => doc.crc32c = value,
        Some(Algorithm::Crc64Nvme) => doc.crc64nvme = value,
        Some(Algorithm::Sha1) => doc.sha1 = value,
        Some(Algorithm::Sha256) => doc.sha256 = value,
        None => {}
    }
    doc
}

/// `ObjectParts` of a multipart object: the parts after `marker`, at most `max_parts` of
/// them. An object whose part sizes are not recorded (completed before Yutu kept them)
/// reports its count and an empty page.
fn parts_doc(
    layout: &PartLayout,
    alg: Option<Algorithm>,
    marker: u32,
    max_parts: u32,
) -> AttributesParts {
    let all = layout.parts().unwrap_or_default();
    let after: Vec<&ObjectPart> = all.iter().filter(|p| p.number > marker).collect();
    let page: Vec<AttributesPart> = after
        .iter()
        .take(max_parts as usize)
        .map(|p| part_doc(p, alg))
        .collect();
    let truncated = after.len() > page.len();
    AttributesParts {
        parts_count: layout.count,
        part_number_marker: marker,
        next_part_number_marker: page.last().map_or(marker, |p| p.part_number),
        max_parts,
        is_truncated: truncated,
        parts: page,
    }
}

/// The document for `meta` with exactly the attributes asked for.
fn document(
    meta: &ObjectMeta,
    attrs: &[ObjectAttribute],
    max_parts: u32,
    marker: u32,
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
                let alg = meta.checksum.as_ref().map(|c| c.algorithm);
                doc.object_parts = meta
                    .parts
                    .as_ref()
                    .map(|l| parts_doc(l, alg, marker, max_parts))
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
    let marker = part_number_marker(ctx)?;
    if let Some(v) = ctx.target.param("versionId") {
        if v != "null" {
            return Err(
                S3Error::new(S3ErrorCode::InvalidArgument).msg("Invalid version id specified")
            );
        }
    }
    let (meta, _) = crate::http::common::read_local(ctx, bucket, key, true).await?;
    let xml = to_xml(
        "GetObjectAttributesResponse",
        &document(&meta, &attrs, max_parts, marker),
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

/// Serves this file's object operations (the table is
/// [`Op::handler`](crate::http::endpoint::Op::handler)), once the caller may (`incarnation`
/// as for a bucket, `gate`: whether the object's ACL is still to be checked).
pub async fn serve_object(
    ctx: &Ctx,
    op: crate::http::endpoint::Op,
    b: &str,
    k: &str,
    _body: hyper::body::Incoming,
    _incarnation: Option<u64>,
    _gate: crate::auth::Gate,
) -> Result<Resp, S3Error> {
    use crate::http::endpoint::Op;
    match op {
        Op::GetObjectAttributes => get_attributes(ctx, b, k).await,
        _ => Err(crate::http::endpoint::not_served(op)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_part_object_has_no_parts_and_an_unquoted_etag() {
        let mut meta = ObjectMeta::for_block(5);
        meta.etag = "\"abc\"".into();
        let all = ObjectAttribute::ALL;
        let doc = document(&meta, &all, 1000, 0);
        assert_eq!(doc.etag.as_deref(), Some("abc"));
        assert!(doc.object_parts.is_none() && doc.checksum.is_none());
        assert_eq!(
            (doc.storage_class, doc.object_size),
            (Some("STANDARD"), Some(5))
        );
        meta.parts = Some(PartLayout::new(
            "up",
            &[5, 5, 2],
            vec!["a".into(), "b".into(), "c".into()],
        ));
        meta.checksum = Some(Checksum {
            algorithm: Algorithm::Sha256,
            value: "v=".into(),
            composite_parts: Some(3),
        });
        let doc = document(
            &meta,
            &[ObjectAttribute::ObjectParts, ObjectAttribute::Checksum],
            7,
            0,
        );
        let parts = doc.object_parts.expect("parts");
        assert_eq!((parts.parts_count, parts.max_parts), (3, 7));
        let listed: Vec<(u32, u64, Option<&str>)> = parts
            .parts
            .iter()
            .map(|p| (p.part_number, p.size, p.sha256.as_deref()))
            .collect();
        assert_eq!(
            listed,
            [(1, 5, Some("a")), (2, 5, Some("b")), (3, 2, Some("c"))]
        );
        assert!(!parts.is_truncated);
        let c = doc.checksum.expect("checksum");
        assert_eq!(
            (c.sha256.as_deref(), c.checksum_type),
            (Some("v=-3"), "COMPOSITE")
        );
        assert!(doc.etag.is_none());
    }

    #[test]
    fn object_parts_page_after_the_marker() {
        let layout = PartLayout::new("up", &[5; 6], Vec::new());
        let page = parts_doc(&layout, None, 3, 1);
        assert_eq!(
            (
                page.part_number_marker,
                page.next_part_number_marker,
                page.is_truncated
            ),
            (3, 4, true)
        );
        assert_eq!(
            page.parts.iter().map(|p| p.part_number).collect::<Vec<_>>(),
            [4]
        );
        let page = parts_doc(&layout, None, 4, 10);
        assert_eq!(page.parts.len(), 2);
        assert!(!page.is_truncated);
        // Sizes unknown (an old record): the count, no page.
        let page = parts_doc(&PartLayout::count_only(2), None, 0, 10);
        assert_eq!((page.parts_count, page.parts.len()), (2, 0));
    }
}
