//! Reading the S3 XML documents the server answers with.
//!
//! `yutu-api` holds the server's (serialize-only) shapes; these are the client's reading of
//! the same documents, written to accept what any S3 server sends: every element may be
//! absent, repeated elements may be interleaved (quick-xml's `overlapped-lists`), unknown
//! elements and the `xmlns` attribute are ignored. Raw strings are checked and converted into
//! the public types here, so a garbled date or size is an error, never a panic or a default.

use percent_encoding::percent_decode_str;
use serde::Deserialize;

use crate::error::ClientError;
use crate::listing::{BucketInfo, ListPage, ObjectSummary};
use crate::object::unquote_etag;
use crate::timestamp::parse_iso8601;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ListAllMyBucketsResult {
    #[serde(default)]
    buckets: Buckets,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Buckets {
    #[serde(default)]
    bucket: Vec<BucketXml>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct BucketXml {
    name: String,
    creation_date: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ListBucketResult {
    #[serde(default)]
    key_count: Option<u64>,
    #[serde(default)]
    is_truncated: bool,
    #[serde(default)]
    next_continuation_token: Option<String>,
    #[serde(default)]
    encoding_type: Option<String>,
    #[serde(default)]
    contents: Vec<ContentsXml>,
    #[serde(default)]
    common_prefixes: Vec<CommonPrefixXml>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ContentsXml {
    key: String,
    last_modified: String,
    #[serde(rename = "ETag", default)]
    etag: String,
    size: u64,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct CommonPrefixXml {
    prefix: String,
}

/// Reads a `<ListAllMyBucketsResult>`.
pub(crate) fn parse_list_buckets(body: &str) -> Result<Vec<BucketInfo>, ClientError> {
    let doc: ListAllMyBucketsResult = from_xml(body, "ListAllMyBucketsResult")?;
    doc.buckets
        .bucket
        .into_iter()
        .map(|b| {
            let creation_date = parse_iso8601(&b.creation_date).ok_or_else(|| {
                invalid(format!(
                    "bucket {:?} has an unreadable CreationDate {:?}",
                    b.name, b.creation_date
                ))
            })?;
            Ok(BucketInfo {
                name: b.name,
                creation_date,
            })
        })
        .collect()
}

/// Reads a ListObjectsV2 `<ListBucketResult>`.
pub(crate) fn parse_list_objects_v2(body: &str) -> Result<ListPage, ClientError> {
    let doc: ListBucketResult = from_xml(body, "ListBucketResult")?;
    // With `encoding-type=url` (which S3 may echo even when it was not asked for by another
    // client library), keys and prefixes arrive percent-encoded.
    let url_encoded = doc
        .encoding_type
        .as_deref()
        .is_some_and(|e| e.eq_ignore_ascii_case("url"));
    let decode = |s: String| -> Result<String, ClientError> {
        if !url_encoded {
            return Ok(s);
        }
        percent_decode_str(&s)
            .decode_utf8()
            .map(|c| c.into_owned())
            .map_err(|_| invalid(format!("url-encoded name {s:?} is not UTF-8")))
    };
    let objects = doc
        .contents
        .into_iter()
        .map(|c| {
            let last_modified = parse_iso8601(&c.last_modified).ok_or_else(|| {
                invalid(format!(
                    "object {:?} has an unreadable LastModified {:?}",
                    c.key, c.last_modified
                ))
            })?;
            Ok(ObjectSummary {
                key: decode(c.key)?,
                size: c.size,
                etag: unquote_etag(&c.etag).to_string(),
                last_modified,
            })
        })
        .collect::<Result<Vec<_>, ClientError>>()?;
    let common_prefixes = doc
        .common_prefixes
        .into_iter()
        .map(|p| decode(p.prefix))
        .collect::<Result<Vec<_>, ClientError>>()?;
    let key_count = doc
        .key_count
        .unwrap_or((objects.len() + common_prefixes.len()) as u64);
    Ok(ListPage {
        objects,
        common_prefixes,
        is_truncated: doc.is_truncated,
        next_continuation_token: doc.next_continuation_token.filter(|t| !t.is_empty()),
        key_count,
    })
}

fn from_xml<T: serde::de::DeserializeOwned>(body: &str, what: &str) -> Result<T, ClientError> {
    quick_xml::de::from_str(body).map_err(|e| invalid(format!("unreadable <{what}>: {e}")))
}

fn invalid(msg: String) -> ClientError {
    ClientError::InvalidResponse(msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timestamp::format_iso8601;

    const NS: &str = "http://s3.amazonaws.com/doc/2006-03-01/";

    #[test]
    fn list_buckets_document() {
        let body = format!(
            r#"<?xml version="1.0" encoding="UTF-8"?>
<ListAllMyBucketsResult xmlns="{NS}"><Owner><ID>yutu</ID><DisplayName>yutu</DisplayName></Owner><Buckets><Bucket><Name>alpha</Name><CreationDate>2026-01-01T00:00:00.000Z</CreationDate></Bucket><Bucket><Name>beta</Name><CreationDate>2026-01-02T03:04:05.000Z</CreationDate></Bucket></Buckets></ListAllMyBucketsResult>"#
        );
        let buckets = parse_list_buckets(&body).unwrap();
        assert_eq!(buckets.len(), 2);
        assert_eq!(buckets[0].name, "alpha");
        assert_eq!(
            format_iso8601(buckets[1].creation_date),
            "2026-01-02T03:04:05Z"
        );
    }

    #[test]
    fn empty_bucket_lists() {
        for body in [
            "<ListAllMyBucketsResult><Owner><ID>x</ID></Owner><Buckets></Buckets></ListAllMyBucketsResult>",
            "<ListAllMyBucketsResult><Buckets/></ListAllMyBucketsResult>",
            "<ListAllMyBucketsResult/>",
        ] {
            assert_eq!(parse_list_buckets(body).unwrap(), vec![], "{body}");
        }
    }

    #[test]
    fn bad_bucket_date_is_an_error() {
        let body = "<ListAllMyBucketsResult><Buckets><Bucket><Name>a</Name><CreationDate>soon</CreationDate></Bucket></Buckets></ListAllMyBucketsResult>";
        assert!(matches!(
            parse_list_buckets(body),
            Err(ClientError::InvalidResponse(_))
        ));
        assert!(matches!(
            parse_list_buckets("<ListAllMyBucketsResult><Buckets>"),
            Err(ClientError::InvalidResponse(_))
        ));
    }

    #[test]
    fn list_objects_document() {
        let body = format!(
            r#"<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="{NS}"><Name>b</Name><Prefix>dir/</Prefix><KeyCount>3</KeyCount><MaxKeys>3</MaxKeys><Delimiter>/</Delimiter><IsTruncated>true</IsTruncated><Contents><Key>dir/a&amp;b.txt</Key><LastModified>2026-01-01T00:00:00.000Z</LastModified><ETag>"0cc175b9c0f1b6a831c399e269772661"</ETag><Size>1</Size><StorageClass>STANDARD</StorageClass></Contents><Contents><Key>dir/c</Key><LastModified>2026-01-01T00:00:01.000Z</LastModified><ETag>&quot;abc-2&quot;</ETag><Size>12345678901</Size><StorageClass>STANDARD</StorageClass></Contents><CommonPrefixes><Prefix>dir/sub/</Prefix></CommonPrefixes><NextContinuationToken>tok+/=</NextContinuationToken></ListBucketResult>"#
        );
        let page = parse_list_objects_v2(&body).unwrap();
        assert_eq!(page.key_count, 3);
        assert!(page.is_truncated);
        assert_eq!(page.next_continuation_token.as_deref(), Some("tok+/="));
        assert_eq!(page.common_prefixes, vec!["dir/sub/".to_string()]);
        assert_eq!(page.objects.len(), 2);
        assert_eq!(page.objects[0].key, "dir/a&b.txt");
        assert_eq!(page.objects[0].etag, "0cc175b9c0f1b6a831c399e269772661");
        assert_eq!(page.objects[0].size, 1);
        assert_eq!(page.objects[1].etag, "abc-2");
        assert_eq!(page.objects[1].size, 12_345_678_901);
        assert_eq!(
            format_iso8601(page.objects[1].last_modified),
            "2026-01-01T00:00:01Z"
        );
    }

    #[test]
    fn interleaved_and_missing_elements() {
        // Contents and CommonPrefixes interleaved, no KeyCount, no token, empty Prefix.
        let body = "<ListBucketResult><Name>b</Name><Prefix/><IsTruncated>false</IsTruncated>\
            <Contents><Key>a</Key><LastModified>2026-01-01T00:00:00Z</LastModified><Size>0</Size></Contents>\
            <CommonPrefixes><Prefix>p/</Prefix></CommonPrefixes>\
            <Contents><Key>b</Key><LastModified>2026-01-01T00:00:00Z</LastModified><ETag>\"e\"</ETag><Size>2</Size></Contents>\
            <CommonPrefixes><Prefix>q/</Prefix></CommonPrefixes>\
            <NextContinuationToken></NextContinuationToken></ListBucketResult>";
        let page = parse_list_objects_v2(body).unwrap();
        let keys: Vec<_> = page.objects.iter().map(|o| o.key.as_str()).collect();
        assert_eq!(keys, ["a", "b"]);
        assert_eq!(page.objects[0].etag, "");
        assert_eq!(page.common_prefixes, ["p/", "q/"]);
        assert_eq!(page.key_count, 4);
        assert!(!page.is_truncated);
        assert_eq!(page.next_continuation_token, None);
    }

    #[test]
    fn empty_listing() {
        let body = format!(
            r#"<ListBucketResult xmlns="{NS}"><Name>b</Name><Prefix></Prefix><KeyCount>0</KeyCount><MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated></ListBucketResult>"#
        );
        let page = parse_list_objects_v2(&body).unwrap();
        assert!(page.objects.is_empty() && page.common_prefixes.is_empty());
        assert_eq!(page.key_count, 0);
    }

    #[test]
    fn url_encoded_listing_is_decoded() {
        let body = "<ListBucketResult><EncodingType>url</EncodingType><IsTruncated>false</IsTruncated>\
            <Contents><Key>a%20b%2Fc</Key><LastModified>2026-01-01T00:00:00Z</LastModified><Size>1</Size></Contents>\
            <CommonPrefixes><Prefix>%C3%A9/</Prefix></CommonPrefixes></ListBucketResult>";
        let page = parse_list_objects_v2(body).unwrap();
        assert_eq!(page.objects[0].key, "a b/c");
        assert_eq!(page.common_prefixes, ["é/"]);
    }

    #[test]
    fn garbled_listing_is_an_error() {
        for body in [
            "<ListBucketResult><Contents><Key>a</Key><LastModified>x</LastModified><Size>1</Size></Contents></ListBucketResult>",
            "<ListBucketResult><Contents><Key>a</Key><LastModified>2026-01-01T00:00:00Z</LastModified><Size>-1</Size></Contents></ListBucketResult>",
            "<ListBucketResult><IsTruncated>maybe</IsTruncated></ListBucketResult>",
            "<ListBucketResult><Contents><Key>a</Key></Contents></ListBucketResult>",
            "",
        ] {
            assert!(
                matches!(parse_list_objects_v2(body), Err(ClientError::InvalidResponse(_))),
                "{body}"
            );
        }
    }
}
