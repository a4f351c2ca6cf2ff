//! The timestamp formats S3 uses, read into and written from [`SystemTime`] by the `time`
//! crate (and `httpdate`):
//!
//! - XML documents carry RFC 3339 / ISO 8601 in UTC (`2026-01-01T12:00:00.000Z`);
//! - response headers carry the HTTP date (`Thu, 01 Jan 2026 12:00:00 GMT`);
//! - SigV4's `x-amz-date` is ISO 8601 basic format (`20260101T120000Z`).

use std::time::SystemTime;

use time::format_description::well_known::iso8601::{self, Iso8601, TimePrecision};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// ISO 8601 basic format to the second, `Z` for UTC: `20130524T000000Z`.
const AMZ_DATE: iso8601::EncodedConfig = iso8601::Config::DEFAULT
    .set_use_separators(false)
    .set_time_precision(TimePrecision::Second {
        decimal_digits: None,
    })
    .encode();

/// Parses an RFC 3339 timestamp in UTC (`Z` or `+00:00`). Other offsets are refused: S3
/// sends nothing else, and accepting them would hide a server bug. Digits past nanoseconds
/// are dropped.
pub fn parse_iso8601(s: &str) -> Option<SystemTime> {
    let t = OffsetDateTime::parse(s.trim(), &Rfc3339).ok()?;
    t.offset().is_utc().then(|| t.into())
}

/// Formats as `YYYY-MM-DDTHH:MM:SSZ` (UTC, whole seconds), the way the CLI prints times.
pub fn format_iso8601(t: SystemTime) -> String {
    let t = OffsetDateTime::from(t);
    t.replace_nanosecond(0)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        // Only years past 9999, which RFC 3339 cannot write.
        .unwrap_or_else(|| t.to_string())
}

/// Formats as SigV4's `x-amz-date`: `YYYYMMDDTHHMMSSZ` (UTC).
pub fn format_amz_date(t: SystemTime) -> String {
    let t = OffsetDateTime::from(t);
    t.format(&Iso8601::<AMZ_DATE>)
        .unwrap_or_else(|_| t.to_string())
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
            parse_iso8601(" 2024-02-29T23:59:59.5Z\n"),
            Some(at(1_709_251_199, 500_000_000))
        );
        assert_eq!(
            parse_iso8601("2009-10-12T17:50:30.123456789123+00:00"),
            Some(at(1_255_369_830, 123_456_789))
        );
        assert_eq!(
            parse_iso8601("1969-12-31T23:59:59Z"),
            Some(UNIX_EPOCH - Duration::from_secs(1))
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
            "20260101T000000Z",
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
    fn amz_dates() {
        assert_eq!(format_amz_date(at(1_369_353_600, 0)), "20130524T000000Z");
        assert_eq!(
            format_amz_date(at(1_440_938_160, 999_999_999)),
            "20150830T123600Z"
        );
        assert_eq!(format_amz_date(at(0, 0)), "19700101T000000Z");
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
