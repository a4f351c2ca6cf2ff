//! The metadata blob stored with each NVMe record: what the object's HTTP face needs (ETag,
//! content type, user metadata, checksum) and whether it belongs to a `disk` bucket.
//!
//! It is kept in the NVMe index in DRAM, so HEAD and LIST never read the device.

use std::time::{Duration, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::model::checksum::{Algorithm, Checksum};
use crate::model::object::PartLayout;
use crate::model::{ObjectMeta, StoreError, Version};

/// The metadata blob of an NVMe record.
#[derive(Serialize, Deserialize)]
pub(crate) struct StoredMeta {
    etag: String,
    modified_ms: u64,
    #[serde(default)]
    content_type: Option<String>,
    #[serde(default)]
    headers: Vec<(String, String)>,
    #[serde(default)]
    user_meta: Vec<(String, String)>,
    #[serde(default)]
    checksum: Option<(String, String, Option<u32>)>,
    /// The part count of a multipart object.
    #[serde(default)]
    parts: Option<u32>,
    /// Its part sizes, run-length ([`PartLayout::sizes`]); absent in records
    /// written before they were kept, which read as a layout of unknown sizes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    part_sizes: Vec<(u64, u32)>,
    /// Its part checksums, in order (absent: none kept).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    part_checksums: Vec<String>,
    /// The upload that made it (absent in records written before it was kept).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    upload_id: String,
    /// The object belongs to a `disk` bucket: region reclamation must rewrite it, not drop it.
    #[serde(default)]
    disk: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    owner: String,
    #[serde(default, skip_serializing_if = "yutu_api::acl::Acl::is_empty")]
    acl: yutu_api::acl::Acl,
    /// Written through the KV API: a KV block whatever its key (absent, i.e. false, in
    /// records written before this field existed and in every S3-written record).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    kv: bool,
    /// The write's version (absent in records written before versions existed: zero).
    #[serde(default, skip_serializing_if = "Version::is_zero")]
    version: Version,
}

pub fn encode_meta(m: &ObjectMeta, disk: bool) -> Result<Vec<u8>, StoreError> {
    let stored = StoredMeta {
        etag: m.etag.clone(),
        modified_ms: m
            .last_modified
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
        content_type: m.content_type.clone(),
        headers: m.headers.clone(),
        user_meta: m.user_meta.clone(),
        checksum: m.checksum.as_ref().map(|c| {
            (
                c.algorithm.name().to_string(),
                c.value.clone(),
                c.composite_parts,
            )
        }),
        parts: m.parts.as_ref().map(|p| p.count),
        part_sizes: m
            .parts
            .as_ref()
            .map(|p| p.sizes.clone())
            .unwrap_or_default(),
        part_checksums: m
            .parts
            .as_ref()
            .map(|p| p.checksums.clone())
            .unwrap_or_default(),
        upload_id: m
            .parts
            .as_ref()
            .map(|p| p.upload_id.clone())
            .unwrap_or_default(),
        disk,
        owner: m.owner.clone(),
        acl: m.acl.clone(),
        kv: m.kv,
        version: m.version,
    };
    serde_json::to_vec(&stored)
        .map_err(|e| StoreError::Device(format!("cannot encode the object's metadata: {e}")))
}

/// Whether a metadata blob marks a `disk` object (reclamation rewrites it, never drops it).
pub fn is_durable(blob: &[u8]) -> bool {
    serde_json::from_slice::<StoredMeta>(blob).is_ok_and(|m| m.disk)
}

/// Decodes a metadata blob; `size` is the record's value length.
pub fn decode_meta(blob: &[u8], size: u64) -> Option<ObjectMeta> {
    let s: StoredMeta = serde_json::from_slice(blob).ok()?;
    Some(ObjectMeta {
        size,
        etag: s.etag,
        last_modified: UNIX_EPOCH + Duration::from_millis(s.modified_ms),
        content_type: s.content_type,
        headers: s.headers,
        user_meta: s.user_meta,
        checksum: s.checksum.and_then(|(alg, value, composite_parts)| {
            Some(Checksum {
                algorithm: Algorithm::from_name(&alg)?,
                value,
                composite_parts,
            })
        }),
        parts: s.parts.map(|count| PartLayout {
            count,
            sizes: s.part_sizes,
            checksums: s.part_checksums,
            upload_id: s.upload_id,
        }),
        owner: s.owner,
        acl: s.acl,
        kv: s.kv,
        version: s.version,
    })
}

/// Whether a metadata blob marks an object written through the KV API (a KV block whatever
/// its key). Parsed only for keys that are not block hashes.
pub fn is_kv(blob: &[u8]) -> bool {
    serde_json::from_slice::<StoredMeta>(blob).is_ok_and(|m| m.kv)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_durable_flag() {
        let m = ObjectMeta::for_block(7);
        let blob = encode_meta(&m, true).unwrap();
        assert!(is_durable(&blob));
        assert!(!is_durable(&encode_meta(&m, false).unwrap()));
        let back = decode_meta(&blob, 7).unwrap();
        assert_eq!(back.size, 7);
        assert_eq!(back.etag, m.etag);
        assert!(back.kv, "a KV block stays one on NVMe");
        assert!(is_kv(&blob));
        assert!(decode_meta(b"{", 7).is_none());
        // S3 objects and records written before the flag existed are not KV blocks.
        let s3 = ObjectMeta {
            kv: false,
            ..ObjectMeta::for_block(7)
        };
        let blob = encode_meta(&s3, false).unwrap();
        assert!(!is_kv(&blob));
        assert!(!String::from_utf8_lossy(&blob).contains("kv"));
        assert!(
            !decode_meta(br#"{"etag": "e", "modified_ms": 1}"#, 1)
                .unwrap()
                .kv
        );
    }

    #[test]
    fn part_layouts_round_trip_and_old_records_keep_their_count() {
        let mut m = ObjectMeta {
            kv: false,
            ..ObjectMeta::for_block(11)
        };
        m.parts = Some(PartLayout::new(
            "up1",
            &[5, 5, 1],
            vec!["a".into(), "b".into(), "c".into()],
        ));
        let back = decode_meta(&encode_meta(&m, false).unwrap(), 11).unwrap();
        assert_eq!(back.parts, m.parts);
        assert_eq!(
            back.parts.unwrap().part(3).map(|p| (p.offset, p.size)),
            Some((10, 1))
        );
        // A record from before part sizes were kept: the count alone, sizes unknown.
        let old = decode_meta(br#"{"etag": "e", "modified_ms": 1, "parts": 3}"#, 9).unwrap();
        let layout = old.parts.expect("a multipart object");
        assert_eq!(layout, PartLayout::count_only(3));
        assert!(!layout.sizes_known() && layout.part(1).is_none());
        // A single-part object's record has none of the new fields.
        let plain = encode_meta(&ObjectMeta::for_block(1), false).unwrap();
        let text = String::from_utf8_lossy(&plain);
        assert!(
            !text.contains("part_sizes") && !text.contains("upload_id"),
            "{text}"
        );
    }
}
