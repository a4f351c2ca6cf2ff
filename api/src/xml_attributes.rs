//! `<GetObjectAttributesResponse>`: the answer of GetObjectAttributes
//! (`GET /bucket/key?attributes`), and the attribute names a client may ask for.
//!
//! Only the attributes named in `x-amz-object-attributes` are present in the document, so every
//! element is optional. Element names follow botocore's model of the operation (the part count
//! of `ObjectParts` is the element `PartsCount`, which SDKs read as `TotalPartsCount`).

use serde::Serialize;

/// An attribute a client may name in `x-amz-object-attributes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectAttribute {
    ETag,
    Checksum,
    ObjectParts,
    StorageClass,
    ObjectSize,
}

impl ObjectAttribute {
    pub const ALL: [ObjectAttribute; 5] = [
        ObjectAttribute::ETag,
        ObjectAttribute::Checksum,
        ObjectAttribute::ObjectParts,
        ObjectAttribute::StorageClass,
        ObjectAttribute::ObjectSize,
    ];

    /// The name as S3 spells it in the header.
    pub fn name(self) -> &'static str {
        match self {
            ObjectAttribute::ETag => "ETag",
            ObjectAttribute::Checksum => "Checksum",
            ObjectAttribute::ObjectParts => "ObjectParts",
            ObjectAttribute::StorageClass => "StorageClass",
            ObjectAttribute::ObjectSize => "ObjectSize",
        }
    }

    /// Parses one name. S3 matches them exactly, but SDKs and tools send S3's spelling, so a
    /// case-insensitive match only forgives hand-written requests.
    pub fn from_name(name: &str) -> Option<ObjectAttribute> {
        ObjectAttribute::ALL
            .into_iter()
            .find(|a| a.name().eq_ignore_ascii_case(name.trim()))
    }
}

/// Why an `x-amz-object-attributes` header is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttributesError {
    #[error("The x-amz-object-attributes header specifying the attributes to be retrieved is either missing or empty")]
    Missing,
    #[error("Invalid attribute name specified: {0}")]
    Unknown(String),
}

/// The attributes a header value names (comma-separated, possibly repeated headers joined),
/// without duplicates, in the order first named.
pub fn parse_object_attributes<'a>(
    values: impl IntoIterator<Item = &'a str>,
) -> Result<Vec<ObjectAttribute>, AttributesError> {
    let mut out = Vec::new();
    for name in values
        .into_iter()
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|n| !n.is_empty())
    {
        let a = ObjectAttribute::from_name(name)
            .ok_or_else(|| AttributesError::Unknown(name.to_string()))?;
        if !out.contains(&a) {
            out.push(a);
        }
    }
    if out.is_empty() {
        return Err(AttributesError::Missing);
    }
    Ok(out)
}

/// `<GetObjectAttributesResponse>`.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct GetObjectAttributesResponse {
    #[serde(rename = "@xmlns")]
    pub xmlns: &'static str,
    /// Unquoted, unlike the `ETag` header (S3 writes it so in this document).
    #[serde(rename = "ETag", skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checksum: Option<AttributesChecksum>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object_parts: Option<AttributesParts>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub storage_class: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object_size: Option<u64>,
}

/// `<Checksum>`: the object's stored checksum (one algorithm) and its type.
#[derive(Debug, Default, Serialize)]
pub struct AttributesChecksum {
    #[serde(rename = "ChecksumCRC32", skip_serializing_if = "Option::is_none")]
    pub crc32: Option<String>,
    #[serde(rename = "ChecksumCRC32C", skip_serializing_if = "Option::is_none")]
    pub crc32c: Option<String>,
    #[serde(rename = "ChecksumCRC64NVME", skip_serializing_if = "Option::is_none")]
    pub crc64nvme: Option<String>,
    #[serde(rename = "ChecksumSHA1", skip_serializing_if = "Option::is_none")]
    pub sha1: Option<String>,
    #[serde(rename = "ChecksumSHA256", skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// `COMPOSITE` or `FULL_OBJECT`.
    #[serde(rename = "ChecksumType")]
    pub checksum_type: &'static str,
}

/// `<ObjectParts>` of a multipart object: its part count and one page of its parts
/// (`x-amz-max-parts` of them after part `x-amz-part-number-marker`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct AttributesParts {
    pub parts_count: u32,
    pub part_number_marker: u32,
    pub next_part_number_marker: u32,
    pub max_parts: u32,
    pub is_truncated: bool,
    #[serde(rename = "Part")]
    pub parts: Vec<AttributesPart>,
}

/// One `<Part>` of `<ObjectParts>`: its number, size and, where the object has a checksum
/// algorithm, the part's checksum.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct AttributesPart {
    pub part_number: u32,
    pub size: u64,
    #[serde(rename = "ChecksumCRC32", skip_serializing_if = "Option::is_none")]
    pub crc32: Option<String>,
    #[serde(rename = "ChecksumCRC32C", skip_serializing_if = "Option::is_none")]
    pub crc32c: Option<String>,
    #[serde(rename = "ChecksumCRC64NVME", skip_serializing_if = "Option::is_none")]
    pub crc64nvme: Option<String>,
    #[serde(rename = "ChecksumSHA1", skip_serializing_if = "Option::is_none")]
    pub sha1: Option<String>,
    #[serde(rename = "ChecksumSHA256", skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xml::{to_xml, S3_NS};

    #[test]
    fn parses_attribute_lists() {
        assert_eq!(
            parse_object_attributes(["ETag, ObjectSize", "etag"]),
            Ok(vec![ObjectAttribute::ETag, ObjectAttribute::ObjectSize])
        );
        assert_eq!(
            parse_object_attributes(["ETag,Size"]),
            Err(AttributesError::Unknown("Size".into()))
        );
        assert_eq!(
            parse_object_attributes([" , "]),
            Err(AttributesError::Missing)
        );
        assert_eq!(
            parse_object_attributes(std::iter::empty()),
            Err(AttributesError::Missing)
        );
    }

    #[test]
    fn renders_only_what_was_asked() {
        let doc = GetObjectAttributesResponse {
            xmlns: S3_NS,
            etag: Some("abc-2".into()),
            checksum: Some(AttributesChecksum {
                crc32: Some("AAAAAA==".into()),
                checksum_type: "COMPOSITE",
                ..Default::default()
            }),
            object_parts: Some(AttributesParts {
                parts_count: 2,
                part_number_marker: 0,
                next_part_number_marker: 0,
                max_parts: 1000,
                is_truncated: false,
                parts: vec![AttributesPart {
                    part_number: 1,
                    size: 5,
                    sha256: Some("v=".into()),
                    ..Default::default()
                }],
            }),
            storage_class: None,
            object_size: Some(7),
        };
        let xml = to_xml("GetObjectAttributesResponse", &doc);
        assert!(xml.contains("<ETag>abc-2</ETag>"), "{xml}");
        assert!(xml.contains("<Checksum><ChecksumCRC32>AAAAAA==</ChecksumCRC32><ChecksumType>COMPOSITE</ChecksumType></Checksum>"), "{xml}");
        assert!(xml.contains("<PartsCount>2</PartsCount>"), "{xml}");
        assert!(
            xml.contains("<Part><PartNumber>1</PartNumber><Size>5</Size><ChecksumSHA256>v=</ChecksumSHA256></Part>"),
            "{xml}"
        );
        assert!(xml.contains("<ObjectSize>7</ObjectSize>"), "{xml}");
        assert!(!xml.contains("StorageClass"), "{xml}");
    }
}
