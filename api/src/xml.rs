//! S3 XML documents, serialized with `quick-xml`'s serde support.
//!
//! Field names are S3's element names (PascalCase), which is why the structs rename every
//! field. Every document carries S3's namespace so that strict XML clients accept it.

use serde::Serialize;

/// The namespace S3 puts on its response documents.
pub const S3_NS: &str = "http://s3.amazonaws.com/doc/2006-03-01/";

/// Renders a document with the XML declaration in front.
pub fn to_xml<T: Serialize>(root: &str, doc: &T) -> String {
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    // Serializing plain structs of strings and numbers into a String cannot fail; if it ever
    // did, an empty root element is still a well-formed answer.
    match quick_xml::se::to_string_with_root(root, doc) {
        Ok(body) => out.push_str(&body),
        Err(_) => out.push_str(&format!("<{root}/>")),
    }
    out
}

/// `<Error>`: the body of every failed request.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ErrorDoc<'a> {
    pub code: &'a str,
    pub message: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bucket_name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<&'a str>,
    pub resource: &'a str,
    pub request_id: &'a str,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct Owner {
    #[serde(rename = "ID")]
    pub id: String,
    pub display_name: String,
}

/// `<ListAllMyBucketsResult>`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ListAllMyBucketsResult {
    #[serde(rename = "@xmlns")]
    pub xmlns: &'static str,
    pub owner: Owner,
    pub buckets: Buckets,
    /// Present when `max-buckets` cut the list: pass it back for the next page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub continuation_token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct Buckets {
    #[serde(default)]
    pub bucket: Vec<BucketEntry>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct BucketEntry {
    pub name: String,
    pub creation_date: String,
}

/// One `<Contents>` entry of a listing.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ObjectEntry {
    pub key: String,
    pub last_modified: String,
    #[serde(rename = "ETag")]
    pub etag: String,
    pub size: u64,
    /// ListObjects (v1) always, ListObjectsV2 with `fetch-owner=true`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<Owner>,
    pub storage_class: &'static str,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct CommonPrefix {
    pub prefix: String,
}

/// `<ListBucketResult>` for ListObjectsV2 (`list-type=2`) and ListObjects (v1).
///
/// The v1-only (`Marker`, `NextMarker`) and v2-only (`KeyCount`, `ContinuationToken`,
/// `NextContinuationToken`, `StartAfter`) fields are options, left out when unset.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ListBucketResult {
    #[serde(rename = "@xmlns")]
    pub xmlns: &'static str,
    pub name: String,
    pub prefix: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub marker: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_marker: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_after: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub continuation_token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_continuation_token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_count: Option<usize>,
    pub max_keys: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delimiter: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encoding_type: Option<&'static str>,
    pub is_truncated: bool,
    pub contents: Vec<ObjectEntry>,
    pub common_prefixes: Vec<CommonPrefix>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_document_shape() {
        let xml = to_xml(
            "Error",
            &ErrorDoc {
                code: "NoSuchKey",
                message: "The specified key does not exist.",
                bucket_name: Some("b"),
                key: Some("a<b"),
                resource: "/b/a<b",
                request_id: "1",
            },
        );
        assert!(xml.starts_with("<?xml"));
        assert!(xml.contains("<Code>NoSuchKey</Code>"));
        assert!(xml.contains("<Key>a&lt;b</Key>"));
        assert!(xml.contains("<BucketName>b</BucketName>"));
    }

    #[test]
    fn listing_shape() {
        let doc = ListBucketResult {
            xmlns: S3_NS,
            name: "b".into(),
            key_count: Some(1),
            max_keys: 1000,
            contents: vec![ObjectEntry {
                key: "k".into(),
                last_modified: "2026-01-01T00:00:00.000Z".into(),
                etag: "\"x\"".into(),
                size: 3,
                owner: None,
                storage_class: "STANDARD",
            }],
            common_prefixes: vec![CommonPrefix {
                prefix: "p/".into(),
            }],
            ..Default::default()
        };
        let xml = to_xml("ListBucketResult", &doc);
        assert!(
            xml.contains(&format!("<ListBucketResult xmlns=\"{S3_NS}\">")),
            "{xml}"
        );
        assert!(xml.contains("<Contents><Key>k</Key>"), "{xml}");
        assert!(
            xml.contains("<CommonPrefixes><Prefix>p/</Prefix></CommonPrefixes>"),
            "{xml}"
        );
        assert!(xml.contains("<IsTruncated>false</IsTruncated>"), "{xml}");
        assert!(!xml.contains("Marker"), "{xml}");
    }
}

/// `<CopyObjectResult>` and `<CopyPartResult>`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct CopyResult {
    #[serde(rename = "@xmlns")]
    pub xmlns: &'static str,
    pub last_modified: String,
    #[serde(rename = "ETag")]
    pub etag: String,
    #[serde(rename = "ChecksumCRC32", skip_serializing_if = "Option::is_none")]
    pub checksum_crc32: Option<String>,
}

/// `<Delete>`: the body of DeleteObjects.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct DeleteRequest {
    #[serde(default)]
    pub quiet: bool,
    #[serde(default, rename = "Object")]
    pub objects: Vec<DeleteObject>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct DeleteObject {
    pub key: String,
    #[serde(default)]
    pub version_id: Option<String>,
    /// Delete only if the object still has this ETag.
    #[serde(default, rename = "ETag")]
    pub etag: Option<String>,
    /// Delete only if the object was last modified at this time (an HTTP date).
    #[serde(default)]
    pub last_modified_time: Option<String>,
    /// Delete only if the object has this many bytes (kept as text: a bad value is the
    /// key's error, not the document's).
    #[serde(default)]
    pub size: Option<String>,
}

/// `<DeleteResult>`.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct DeleteResult {
    #[serde(rename = "@xmlns")]
    pub xmlns: &'static str,
    pub deleted: Vec<Deleted>,
    pub error: Vec<DeleteError>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct Deleted {
    pub key: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct DeleteError {
    pub key: String,
    pub code: String,
    pub message: String,
}

/// `<InitiateMultipartUploadResult>`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct InitiateMultipartUploadResult {
    #[serde(rename = "@xmlns")]
    pub xmlns: &'static str,
    pub bucket: String,
    pub key: String,
    pub upload_id: String,
}

/// `<CompleteMultipartUpload>`: the body of CompleteMultipartUpload.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct CompleteRequest {
    #[serde(default, rename = "Part")]
    pub parts: Vec<CompletePart>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct CompletePart {
    pub part_number: u32,
    #[serde(rename = "ETag")]
    pub etag: String,
    #[serde(default, rename = "ChecksumCRC32")]
    pub checksum_crc32: Option<String>,
    #[serde(default, rename = "ChecksumCRC32C")]
    pub checksum_crc32c: Option<String>,
    #[serde(default, rename = "ChecksumCRC64NVME")]
    pub checksum_crc64nvme: Option<String>,
    #[serde(default, rename = "ChecksumSHA1")]
    pub checksum_sha1: Option<String>,
    #[serde(default, rename = "ChecksumSHA256")]
    pub checksum_sha256: Option<String>,
}

/// `<CompleteMultipartUploadResult>`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct CompleteMultipartUploadResult {
    #[serde(rename = "@xmlns")]
    pub xmlns: &'static str,
    pub location: String,
    pub bucket: String,
    pub key: String,
    #[serde(rename = "ETag")]
    pub etag: String,
    /// The object's checksum, if it has one. SDKs read it from this document, not from a
    /// header: a composite one is written `value-N`, as in the header of a GET.
    #[serde(rename = "ChecksumCRC32", skip_serializing_if = "Option::is_none")]
    pub checksum_crc32: Option<String>,
    #[serde(rename = "ChecksumCRC32C", skip_serializing_if = "Option::is_none")]
    pub checksum_crc32c: Option<String>,
    #[serde(rename = "ChecksumCRC64NVME", skip_serializing_if = "Option::is_none")]
    pub checksum_crc64nvme: Option<String>,
    #[serde(rename = "ChecksumSHA1", skip_serializing_if = "Option::is_none")]
    pub checksum_sha1: Option<String>,
    #[serde(rename = "ChecksumSHA256", skip_serializing_if = "Option::is_none")]
    pub checksum_sha256: Option<String>,
    /// `COMPOSITE` or `FULL_OBJECT`, with a checksum.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checksum_type: Option<&'static str>,
}

/// One `<Part>` of ListParts.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct PartEntry {
    pub part_number: u32,
    pub last_modified: String,
    #[serde(rename = "ETag")]
    pub etag: String,
    pub size: u64,
}

/// `<PostResponse>`: a form upload's answer with `success_action_status` 201. Without a
/// namespace, as S3 writes it (clients find `Key` by its bare name).
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct PostResponse {
    pub location: String,
    pub bucket: String,
    pub key: String,
    #[serde(rename = "ETag")]
    pub etag: String,
}

/// `<ListPartsResult>`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ListPartsResult {
    #[serde(rename = "@xmlns")]
    pub xmlns: &'static str,
    pub bucket: String,
    pub key: String,
    pub upload_id: String,
    pub part_number_marker: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_part_number_marker: Option<u32>,
    pub max_parts: usize,
    pub is_truncated: bool,
    pub part: Vec<PartEntry>,
    pub initiator: Owner,
    pub owner: Owner,
    pub storage_class: &'static str,
}

/// One `<Upload>` of ListMultipartUploads.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct UploadEntry {
    pub key: String,
    pub upload_id: String,
    pub initiated: String,
    pub initiator: Owner,
    pub owner: Owner,
    pub storage_class: &'static str,
}

/// `<ListMultipartUploadsResult>`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ListMultipartUploadsResult {
    #[serde(rename = "@xmlns")]
    pub xmlns: &'static str,
    pub bucket: String,
    pub key_marker: String,
    pub upload_id_marker: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_key_marker: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_upload_id_marker: Option<String>,
    pub prefix: String,
    pub max_uploads: usize,
    pub is_truncated: bool,
    pub upload: Vec<UploadEntry>,
}

/// One `<Version>` of ListObjectVersions.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct VersionEntry {
    pub key: String,
    pub version_id: &'static str,
    pub is_latest: bool,
    pub last_modified: String,
    #[serde(rename = "ETag")]
    pub etag: String,
    pub size: u64,
    pub storage_class: &'static str,
    pub owner: Owner,
}

/// `<ListVersionsResult>`: Yutu keeps no history, so every object is its one current
/// version with version id `null`, as in an S3 bucket that never had versioning enabled.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ListVersionsResult {
    #[serde(rename = "@xmlns")]
    pub xmlns: &'static str,
    pub name: String,
    pub prefix: String,
    pub key_marker: String,
    pub version_id_marker: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_key_marker: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_version_id_marker: Option<String>,
    pub max_keys: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delimiter: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encoding_type: Option<&'static str>,
    pub is_truncated: bool,
    pub version: Vec<VersionEntry>,
    pub common_prefixes: Vec<CommonPrefix>,
}

/// Parses a request document (DeleteObjects, CompleteMultipartUpload).
pub fn from_xml<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, String> {
    quick_xml::de::from_str(text).map_err(|e| e.to_string())
}

#[cfg(test)]
mod request_tests {
    use super::*;

    #[test]
    fn parses_delete_and_complete() {
        let d: DeleteRequest = from_xml(
            r#"<?xml version="1.0"?><Delete xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Object><Key>a</Key></Object><Object><Key>b&amp;c</Key></Object><Quiet>true</Quiet></Delete>"#,
        )
        .unwrap();
        assert!(d.quiet);
        assert_eq!(d.objects.len(), 2);
        assert_eq!(d.objects[1].key, "b&c");
        let d: DeleteRequest = from_xml(
            r#"<Delete><Object><Key>a</Key><ETag>"e"</ETag><LastModifiedTime>Thu, 01 Jan 2015 00:00:00 GMT</LastModifiedTime><Size>0</Size></Object></Delete>"#,
        )
        .unwrap();
        let o = &d.objects[0];
        assert_eq!(o.etag.as_deref(), Some("\"e\""));
        assert_eq!(
            o.last_modified_time.as_deref(),
            Some("Thu, 01 Jan 2015 00:00:00 GMT")
        );
        assert_eq!(o.size.as_deref(), Some("0"));
        let c: CompleteRequest = from_xml(
            r#"<CompleteMultipartUpload><Part><ETag>"x"</ETag><PartNumber>1</PartNumber><ChecksumCRC32>AAAAAA==</ChecksumCRC32></Part><Part><PartNumber>2</PartNumber><ETag>y</ETag></Part></CompleteMultipartUpload>"#,
        )
        .unwrap();
        assert_eq!(c.parts.len(), 2);
        assert_eq!(c.parts[0].checksum_crc32.as_deref(), Some("AAAAAA=="));
        assert!(from_xml::<CompleteRequest>("<CompleteMultipartUpload><Part>").is_err());
        assert!(from_xml::<DeleteRequest>("not xml").is_err());
    }
}
