//! The two timestamp formats S3 uses, read into [`SystemTime`].
//!
//! XML documents carry ISO 8601 in UTC (`2026-01-01T12:00:00.000Z`, RFC 3339, read and
//! written by `humantime`); response headers carry the HTTP date (`Thu, 01 Jan 2026 12:00:00
//! GMT`, read by `httpdate`). Callers get one type for both.

use std::time::SystemTime;

/// Parses `YYYY-MM-DDTHH:MM:SS[.fraction](Z|+00:00)`. Only UTC is accepted: S3 sends
/// nothing else, and guessing at offsets would hide a server bug. Digits past nanoseconds
/// are dropped.
pub fn parse_iso8601(s: &str) -> Option<SystemTime> {
    let s = s.trim();
    let utc = s.strip_suffix('Z').or_else(|| s.strip_suffix("+00:00"))?;
    let (whole, fraction) = match utc.split_once('.') {
        Some((w, f)) if !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit()) => {
            (w, &f[..f.len().min(9)])
        }
        Some(_) => return None,
        None => (utc, ""),
    };
    let text = if fraction.is_empty() {
        format!("{whole}Z")
    } else {
        format!("{whole}.{fraction}Z")
    };
    humantime::parse_rfc3339(&text).ok()
}

/// Formats as `YYYY-MM-DDTHH:MM:SSZ` (UTC, whole seconds), the way the CLI prints times.
pub fn format_iso8601(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// Parses an HTTP date (`Last-Modified` header).
pub fn parse_http_date(s: &str) -> Option<SystemTime> {
    httpdate::parse_http_date(s.trim()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn at(secs: u64, nanos: u32) -> SystemTime {
        UNIX_EPOCH + Duration::new(secs, nanos)
    }

    #[test]
    fn parses_s3_timestamps() {
        assert_eq!(parse_iso8601("1970-01-01T00:00:00Z"), Some(at(0, 0)));
        assert_eq!(
            parse_iso8601("2026-01-01T00:00:00.000Z"),
            Some(at(1_767_225_600, 0))
        );
        assert_eq!(
            parse_iso8601("2024-02-29T23:59:59.5Z"),
            Some(at(1_709_251_199, 500_000_000))
        );
        assert_eq!(
            parse_iso8601("2009-10-12T17:50:30.123456789123+00:00"),
            Some(at(1_255_369_830, 123_456_789))
        );
    }

    #[test]
    fn refuses_malformed() {
        for s in [
            "",
            "2026-01-01",
            "2026-01-01T00:00:00",
            "2026-01-01T00:00:00+01:00",
            "2026-13-01T00:00:00Z",
            "2025-02-29T00:00:00Z",
            "2026-01-01T24:00:00Z",
            "2026-01-01T00:00:00.Z",
            "20x6-01-01T00:00:00Z",
            "1969-12-31T23:59:59Z",
        ] {
            assert_eq!(parse_iso8601(s), None, "{s}");
        }
    }

    #[test]
    fn formats_and_round_trips() {
        assert_eq!(format_iso8601(at(0, 0)), "1970-01-01T00:00:00Z");
        assert_eq!(format_iso8601(at(1_709_251_199, 9)), "2024-02-29T23:59:59Z");
        for secs in [0, 59, 86_399, 951_782_400, 4_102_444_800, 1_767_225_600] {
            let s = format_iso8601(at(secs, 0));
            assert_eq!(parse_iso8601(&s), Some(at(secs, 0)), "{s}");
        }
    }

    #[test]
    fn http_dates() {
        assert_eq!(
            parse_http_date("Thu, 01 Jan 2026 00:00:00 GMT"),
            Some(at(1_767_225_600, 0))
        );
        assert_eq!(parse_http_date("yesterday"), None);
    }
}
