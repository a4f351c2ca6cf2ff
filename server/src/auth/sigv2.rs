//! AWS Signature Version 2, which S3 still accepts and which boto3 uses by default for
//! presigned URLs (`AWSAccessKeyId`, `Expires`, `Signature` query parameters) and some older
//! tools use in the `Authorization: AWS KEY:SIGNATURE` header.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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

/// The time of a SigV2 request's `Date` or `x-amz-date`: any HTTP date httpdate reads, or an
/// RFC 1123 date whose weekday is wrong or whose zone is written `+0000` or `UTC`, as S3
/// reads them (its SigV2 example writes `+0000`; clients that build a date by hand get the
/// weekday wrong, and such a request must still be judged by its time, so that a date too
/// far off answers RequestTimeTooSkewed, not AccessDenied). `None` for text that is no date
/// and for dates before 1970, which no clock is set to.
pub fn parse_date(text: &str) -> Option<SystemTime> {
    if let Ok(t) = httpdate::parse_http_date(text) {
        return Some(t);
    }
    // `[Www, ]DD Mon YYYY HH:MM:SS GMT`
    let rest = match text.split_once(',') {
        Some((_, rest)) => rest,
        None => text,
    };
    let mut it = rest.split_ascii_whitespace();
    let (day, month, year, time, zone) =
        (it.next()?, it.next()?, it.next()?, it.next()?, it.next()?);
    if it.next().is_some() || !matches!(zone, "GMT" | "UTC" | "+0000" | "Z") {
        return None;
    }
    let number = |s: &str, digits: std::ops::RangeInclusive<usize>| -> Option<u64> {
        (digits.contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    let day = number(day, 1..=2)?;
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month = MONTHS.iter().position(|m| *m == month)? as u64 + 1;
    let year = number(year, 4..=4)?;
    let mut hms = time.split(':');
    let (h, m, sec) = (
        number(hms.next()?, 2..=2)?,
        number(hms.next()?, 2..=2)?,
        number(hms.next()?, 2..=2)?,
    );
    if hms.next().is_some() || year < 1970 || h > 23 || m > 59 || sec > 60 {
        return None;
    }
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let month_days = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if day == 0 || day > month_days[month as usize - 1] {
        return None;
    }
    let days = days_since_epoch(year, month, day);
    Some(UNIX_EPOCH + Duration::from_secs(days * 86_400 + h * 3600 + m * 60 + sec))
}

/// Days from 1970-01-01 to a date of 1970 or later (Howard Hinnant's `days_from_civil`).
fn days_since_epoch(year: u64, month: u64, day: u64) -> u64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
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

    #[test]
    fn dates_are_read_whatever_their_weekday() {
        let at = |t: &str| parse_date(t).map(|t| t.duration_since(UNIX_EPOCH).unwrap().as_secs());
        // 2010-07-07 was a Wednesday: the weekday is wrong, the date still reads.
        assert_eq!(at("Wed, 07 Jul 2010 21:53:04 GMT"), Some(1_278_539_584));
        assert_eq!(at("Tue, 07 Jul 2010 21:53:04 GMT"), Some(1_278_539_584));
        assert_eq!(at("Tue, 27 Mar 2007 19:36:42 +0000"), Some(1_175_024_202));
        assert_eq!(at("Thu, 01 Jan 1970 00:00:00 GMT"), Some(0));
        assert_eq!(at("Tue, 29 Feb 2000 00:00:00 GMT"), Some(951_782_400));
        assert!(at("Tue, 07 Jul 9999 21:53:04 GMT").is_some());
        for bad in [
            "Bad Date",
            "",
            "Tue, 07 Jul 1950 21:53:04 GMT",
            "Tue, 31 Feb 2010 21:53:04 GMT",
            "Tue, 07 Jul 2010 25:53:04 GMT",
            "Tue, 07 Foo 2010 21:53:04 GMT",
            "Tue, 07 Jul 2010 21:53:04 CET",
        ] {
            assert_eq!(at(bad), None, "{bad}");
        }
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
