//! AWS Signature Version 2, which S3 still accepts and which boto3 uses by default for
//! presigned URLs (`AWSAccessKeyId`, `Expires`, `Signature` query parameters) and some older
//! tools use in the `Authorization: AWS KEY:SIGNATURE` header.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use http::HeaderMap;
use sha1::Sha1;

/// Query parameters that are part of the signed resource (S3's list).
const SUBRESOURCES: &[&str] = &[
    "acl",
    "cors",
    "delete",
    "lifecycle",
    "location",
    "logging",
    "notification",
    "partNumber",
    "policy",
    "requestPayment",
    "response-cache-control",
    "response-content-disposition",
    "response-content-encoding",
    "response-content-language",
    "response-content-type",
    "response-expires",
    "restore",
    "tagging",
    "torrent",
    "uploadId",
    "uploads",
    "versionId",
    "versioning",
    "versions",
    "website",
];

/// The canonicalized resource: `/bucket/key` (as sent) and the signed sub-resources.
pub fn canonical_resource(path: &str, virtual_bucket: Option<&str>, query: Option<&str>) -> String {
    let mut out = match virtual_bucket {
        Some(b) => format!("/{b}{path}"),
        None => path.to_string(),
    };
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8_lossy()
            .into_owned()
    };
    let mut subs: Vec<(String, Option<String>)> = query
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (decode(k), Some(decode(v))),
            None => (decode(p), None),
        })
        .filter(|(k, _)| SUBRESOURCES.contains(&k.as_str()))
        .collect();
    subs.sort();
    for (i, (k, v)) in subs.iter().enumerate() {
        out.push(if i == 0 { '?' } else { '&' });
        out.push_str(k);
        if let Some(v) = v {
            out.push('=');
            out.push_str(v);
        }
    }
    out
}

/// The resources a client may have signed for this request: the canonical resource, and for a
/// bucket addressed path-style without a trailing slash (`/bucket`) also `/bucket/`, which is
/// what botocore signs for every bucket-level call (its `auth_path`) while it sends `/bucket`,
/// and what S3 accepts.
pub fn canonical_resources(
    path: &str,
    virtual_bucket: Option<&str>,
    query: Option<&str>,
) -> Vec<String> {
    let mut out = vec![canonical_resource(path, virtual_bucket, query)];
    let bare_bucket = virtual_bucket.is_none() && path.len() > 1 && !path[1..].contains('/');
    if bare_bucket {
        out.push(canonical_resource(&format!("{path}/"), None, query));
    }
    out
}

/// The string to sign; `date` is the Date header, or `Expires` for a presigned URL (and empty
/// when `x-amz-date` is sent, which then appears among the amz headers).
pub fn string_to_sign(method: &str, headers: &HeaderMap, date: &str, resource: &str) -> String {
    let get = |n: &str| headers.get(n).and_then(|v| v.to_str().ok()).unwrap_or("");
    let mut amz: Vec<(String, String)> = headers
        .iter()
        .filter(|(k, _)| k.as_str().starts_with("x-amz-"))
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).trim().to_string(),
            )
        })
        .collect();
    amz.sort();
    let mut joined: Vec<(String, String)> = Vec::new();
    for (k, v) in amz {
        match joined.last_mut() {
            Some((lk, lv)) if *lk == k => {
                lv.push(',');
                lv.push_str(&v);
            }
            _ => joined.push((k, v)),
        }
    }
    let amz_text: String = joined.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
    format!(
        "{method}\n{}\n{}\n{date}\n{amz_text}{resource}",
        get("content-md5"),
        get("content-type")
    )
}

pub fn sign(secret: &str, string_to_sign: &str) -> String {
    let mut mac = <Hmac<Sha1> as KeyInit>::new_from_slice(secret.as_bytes())
        .expect("HMAC accepts keys of any length");
    mac.update(string_to_sign.as_bytes());
    B64.encode(mac.finalize().into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The GET example of the S3 SigV2 documentation.
    #[test]
    fn documented_example() {
        let mut h = HeaderMap::new();
        h.insert("date", "Tue, 27 Mar 2007 19:36:42 +0000".parse().unwrap());
        let resource = canonical_resource("/photos/puppy.jpg", Some("awsexamplebucket1"), None);
        let sts = string_to_sign("GET", &h, "Tue, 27 Mar 2007 19:36:42 +0000", &resource);
        assert_eq!(
            sign("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", &sts),
            "qgk2+6Sv9/oM7G3qLEjTH1a1l1g="
        );
        assert_eq!(
            canonical_resource("/b/k", None, Some("uploadId=x&partNumber=2&foo=1")),
            "/b/k?partNumber=2&uploadId=x"
        );
    }

    /// botocore signs `/bucket/` for bucket-level calls sent to `/bucket`.
    #[test]
    fn a_bare_bucket_path_may_be_signed_with_its_slash() {
        assert_eq!(
            canonical_resources("/b", None, Some("encoding-type=url&uploads")),
            ["/b?uploads", "/b/?uploads"]
        );
        assert_eq!(canonical_resources("/b/", None, None), ["/b/"]);
        assert_eq!(canonical_resources("/b/k", None, None), ["/b/k"]);
        assert_eq!(canonical_resources("/", Some("b"), None), ["/b/"]);
        assert_eq!(canonical_resources("/", None, None), ["/"]);
    }
}
