//! Conditional requests: `If-Match`, `If-None-Match`, `If-Modified-Since`,
//! `If-Unmodified-Since` on reads (and their `x-amz-copy-source-if-*` forms on a copy
//! source), `If-None-Match: *` and `If-Match` on writes.
//!
//! Read conditions follow RFC 9110 §13.2.2 as S3 applies it: a matching `If-Match` makes
//! `If-Unmodified-Since` irrelevant, and a non-matching `If-None-Match` makes
//! `If-Modified-Since` irrelevant. Dates compare at whole seconds, the precision of HTTP dates.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::HeaderMap;

/// Preconditions on reading an object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadConditions {
    pub if_match: Option<String>,
    pub if_none_match: Option<String>,
    pub if_modified_since: Option<SystemTime>,
    pub if_unmodified_since: Option<SystemTime>,
}

/// Why a read precondition stopped the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failed {
    /// 304: the client's copy is current.
    NotModified,
    /// 412.
    Precondition,
}

/// Preconditions on writing an object (PutObject, CompleteMultipartUpload, CopyObject).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteConditions {
    /// `If-None-Match: *`: only create, never overwrite.
    pub if_none_match_any: bool,
    /// `If-Match`: only overwrite this ETag (or any object, for `*`).
    pub if_match: Option<String>,
    /// The incarnation of the bucket the request was authorised against: the owner refuses
    /// the write when the bucket was deleted and created again meanwhile.
    pub incarnation: Option<u64>,
}

fn header(h: &HeaderMap, name: &str) -> Option<String> {
    h.get(name)
        .and_then(|v| v.to_str().ok())
        .map(|s| s.trim().to_string())
}

fn date(h: &HeaderMap, name: &str) -> Option<SystemTime> {
    // An unparsable date is ignored, as RFC 9110 requires.
    header(h, name).and_then(|v| httpdate::parse_http_date(&v).ok())
}

impl ReadConditions {
    /// Reads the conditions; `prefix` is `""` for a GET/HEAD, `"x-amz-copy-source-"` for a copy
    /// source.
    pub fn from_headers(h: &HeaderMap, prefix: &str) -> ReadConditions {
        ReadConditions {
            if_match: header(h, &format!("{prefix}if-match")),
            if_none_match: header(h, &format!("{prefix}if-none-match")),
            if_modified_since: date(h, &format!("{prefix}if-modified-since")),
            if_unmodified_since: date(h, &format!("{prefix}if-unmodified-since")),
        }
    }

    pub fn is_empty(&self) -> bool {
        *self == ReadConditions::default()
    }

    /// Checks the conditions against an object's ETag and modification time.
    pub fn check(&self, etag: &str, modified: SystemTime) -> Result<(), Failed> {
        let modified = whole_seconds(modified);
        match &self.if_match {
            Some(list) => {
                if !etag_matches(list, etag) {
                    return Err(Failed::Precondition);
                }
            }
            None => {
                if self
                    .if_unmodified_since
                    .is_some_and(|t| modified > whole_seconds(t))
                {
                    return Err(Failed::Precondition);
                }
            }
        }
        match &self.if_none_match {
            Some(list) => {
                if etag_matches(list, etag) {
                    return Err(Failed::NotModified);
                }
            }
            None => {
                if self
                    .if_modified_since
                    .is_some_and(|t| modified <= whole_seconds(t))
                {
                    return Err(Failed::NotModified);
                }
            }
        }
        Ok(())
    }
}

/// A write condition S3 does not implement, refused before the body is read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnsupportedCondition {
    /// `If-None-Match` naming an ETag: S3 writes accept only `*` ("expects the '*'
    /// character") and answer anything else `501 NotImplemented`. Ignoring it would turn a
    /// conditional write into an unconditional overwrite.
    #[error("A header you provided implies functionality that is not implemented: If-None-Match on a write accepts only \"*\", not {0}.")]
    IfNoneMatchEtag(String),
}

impl WriteConditions {
    /// Refuses condition headers a write cannot honour (see [`UnsupportedCondition`]).
    pub fn supported(h: &HeaderMap) -> Result<(), UnsupportedCondition> {
        match header(h, "if-none-match") {
            Some(v) if v != "*" => Err(UnsupportedCondition::IfNoneMatchEtag(v)),
            _ => Ok(()),
        }
    }

    pub fn from_headers(h: &HeaderMap) -> WriteConditions {
        WriteConditions {
            if_none_match_any: header(h, "if-none-match").as_deref() == Some("*"),
            if_match: header(h, "if-match"),
            incarnation: None,
        }
    }

    /// The request's conditions, for a write into the bucket incarnation it was authorised
    /// against.
    pub fn for_bucket(h: &HeaderMap, incarnation: Option<u64>) -> WriteConditions {
        WriteConditions {
            incarnation,
            ..WriteConditions::from_headers(h)
        }
    }

    /// Whether any ETag condition is set (a conditional write).
    pub fn is_conditional(&self) -> bool {
        self.if_none_match_any || self.if_match.is_some()
    }

    /// The same write with its ETag conditions already decided (only the bucket check is left).
    pub fn decided(&self) -> WriteConditions {
        WriteConditions {
            incarnation: self.incarnation,
            ..WriteConditions::default()
        }
    }

    /// Checks against the current object (its ETag), if any. `Err(true)` means "no such key"
    /// (If-Match on a missing object), `Err(false)` a failed precondition.
    pub fn check(&self, current: Option<&str>) -> Result<(), bool> {
        match current {
            Some(etag) => {
                if self.if_none_match_any {
                    return Err(false);
                }
                if let Some(m) = &self.if_match {
                    if !etag_matches(m, etag) {
                        return Err(false);
                    }
                }
                Ok(())
            }
            None if self.if_match.is_some() => Err(true),
            None => Ok(()),
        }
    }
}

/// The conditions of a DeleteObject (`If-Match`, `x-amz-if-match-last-modified-time`,
/// `x-amz-if-match-size`) or of one key of DeleteObjects (its `ETag`, `LastModifiedTime`,
/// `Size`): the object is deleted only if it is still the one the client saw. A missing key
/// passes them (the delete is a no-op), as S3 answers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeleteConditions {
    pub if_match: Option<String>,
    pub last_modified: Option<SystemTime>,
    pub size: Option<u64>,
}

/// A delete condition that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadDeleteCondition {
    #[error("The last-modified time {0:?} to match is not an HTTP date.")]
    Time(String),
    #[error("The size {0:?} to match is not a non-negative integer.")]
    Size(String),
}

impl DeleteConditions {
    /// From the values as sent: an ETag list, an HTTP date, a decimal size.
    pub fn parse(
        if_match: Option<&str>,
        last_modified: Option<&str>,
        size: Option<&str>,
    ) -> Result<DeleteConditions, BadDeleteCondition> {
        fn nonempty(v: Option<&str>) -> Option<&str> {
            v.map(str::trim).filter(|v| !v.is_empty())
        }
        Ok(DeleteConditions {
            if_match: nonempty(if_match).map(str::to_string),
            last_modified: nonempty(last_modified)
                .map(|t| {
                    httpdate::parse_http_date(t)
                        .or_else(|_| humantime::parse_rfc3339_weak(t))
                        .map_err(|_| BadDeleteCondition::Time(t.to_string()))
                })
                .transpose()?,
            size: nonempty(size)
                .map(|n| {
                    n.parse::<u64>()
                        .map_err(|_| BadDeleteCondition::Size(n.to_string()))
                })
                .transpose()?,
        })
    }

    /// A DeleteObject's condition headers.
    pub fn from_headers(h: &HeaderMap) -> Result<DeleteConditions, BadDeleteCondition> {
        DeleteConditions::parse(
            header(h, "if-match").as_deref(),
            header(h, "x-amz-if-match-last-modified-time").as_deref(),
            header(h, "x-amz-if-match-size").as_deref(),
        )
    }

    pub fn is_empty(&self) -> bool {
        *self == DeleteConditions::default()
    }

    /// Whether the current object passes (times compare at whole seconds, the precision of
    /// the HTTP dates a client learns them from).
    pub fn check(&self, meta: &crate::model::ObjectMeta) -> bool {
        self.if_match
            .as_deref()
            .is_none_or(|m| etag_matches(m, &meta.etag))
            && self
                .last_modified
                .is_none_or(|t| whole_seconds(t) == whole_seconds(meta.last_modified))
            && self.size.is_none_or(|n| n == meta.size)
    }
}

fn whole_seconds(t: SystemTime) -> SystemTime {
    let secs = t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    UNIX_EPOCH + Duration::from_secs(secs)
}

/// Whether a comma-separated list of entity tags (or `*`) names `etag`. Weak tags compare by
/// their opaque value, quotes are optional.
pub fn etag_matches(list: &str, etag: &str) -> bool {
    let bare = |s: &str| -> String {
        s.trim()
            .trim_start_matches("W/")
            .trim_matches('"')
            .to_string()
    };
    let want = bare(etag);
    list.split(',').any(|t| t.trim() == "*" || bare(t) == want)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn read_rules() {
        let etag = "\"abc\"";
        let m = at(1_000_000) + Duration::from_millis(500);
        let c = |f: fn(&mut ReadConditions)| {
            let mut c = ReadConditions::default();
            f(&mut c);
            c.check(etag, m)
        };
        assert_eq!(c(|c| c.if_match = Some("\"abc\"".into())), Ok(()));
        assert_eq!(c(|c| c.if_match = Some("abc, x".into())), Ok(()));
        assert_eq!(c(|c| c.if_match = Some("*".into())), Ok(()));
        assert_eq!(
            c(|c| c.if_match = Some("\"zzz\"".into())),
            Err(Failed::Precondition)
        );
        assert_eq!(
            c(|c| c.if_none_match = Some("\"abc\"".into())),
            Err(Failed::NotModified)
        );
        assert_eq!(c(|c| c.if_none_match = Some("\"zzz\"".into())), Ok(()));
        assert_eq!(
            c(|c| c.if_modified_since = Some(at(1_000_000))),
            Err(Failed::NotModified)
        );
        assert_eq!(c(|c| c.if_modified_since = Some(at(999_999))), Ok(()));
        assert_eq!(
            c(|c| c.if_unmodified_since = Some(at(999_999))),
            Err(Failed::Precondition)
        );
        assert_eq!(c(|c| c.if_unmodified_since = Some(at(1_000_000))), Ok(()));
        // A matching If-Match overrides a failing If-Unmodified-Since (S3's rule).
        assert_eq!(
            c(|c| {
                c.if_match = Some("abc".into());
                c.if_unmodified_since = Some(at(1));
            }),
            Ok(())
        );
        // A non-matching If-None-Match overrides If-Modified-Since.
        assert_eq!(
            c(|c| {
                c.if_none_match = Some("zzz".into());
                c.if_modified_since = Some(at(2_000_000));
            }),
            Ok(())
        );
    }

    #[test]
    fn write_rules() {
        let create = WriteConditions {
            if_none_match_any: true,
            if_match: None,
            incarnation: None,
        };
        assert_eq!(create.check(None), Ok(()));
        assert_eq!(create.check(Some("\"a\"")), Err(false));
        let swap = WriteConditions {
            if_none_match_any: false,
            if_match: Some("\"a\"".into()),
            incarnation: None,
        };
        assert_eq!(swap.check(Some("\"a\"")), Ok(()));
        assert_eq!(swap.check(Some("\"b\"")), Err(false));
        assert_eq!(swap.check(None), Err(true));
    }

    #[test]
    fn delete_conditions_match_the_current_object() {
        let mut meta = crate::model::ObjectMeta::for_block(4);
        meta.etag = "\"abc\"".into();
        meta.last_modified = at(1_000_000) + Duration::from_millis(700);
        let c = |e: Option<&str>, t: Option<&str>, n: Option<&str>| {
            DeleteConditions::parse(e, t, n).unwrap()
        };
        assert!(c(None, None, None).is_empty());
        assert!(c(Some("\"abc\""), None, None).check(&meta));
        assert!(c(Some("*"), None, None).check(&meta));
        assert!(!c(Some("badetag"), None, None).check(&meta));
        let when = httpdate::fmt_http_date(at(1_000_000));
        assert!(c(None, Some(&when), None).check(&meta));
        assert!(!c(None, Some("Thu, 01 Jan 2015 00:00:00 GMT"), None).check(&meta));
        assert!(c(None, None, Some("4")).check(&meta));
        assert!(!c(None, None, Some("9999")).check(&meta));
        assert!(
            !c(Some("abc"), None, Some("5")).check(&meta),
            "every condition must hold"
        );
        assert_eq!(
            DeleteConditions::parse(None, Some("yesterday"), None),
            Err(BadDeleteCondition::Time("yesterday".into()))
        );
        assert_eq!(
            DeleteConditions::parse(None, None, Some("-1")),
            Err(BadDeleteCondition::Size("-1".into()))
        );
    }

    #[test]
    fn a_write_if_none_match_takes_only_the_asterisk() {
        let mut h = HeaderMap::new();
        assert_eq!(WriteConditions::supported(&h), Ok(()));
        h.insert("if-none-match", " * ".parse().unwrap());
        assert_eq!(WriteConditions::supported(&h), Ok(()));
        h.insert("if-none-match", "\"abc\"".parse().unwrap());
        assert_eq!(
            WriteConditions::supported(&h),
            Err(UnsupportedCondition::IfNoneMatchEtag("\"abc\"".into()))
        );
    }
}
