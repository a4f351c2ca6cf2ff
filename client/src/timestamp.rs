//! The two timestamp formats S3 uses, read into [`SystemTime`].
//!
//! XML documents carry ISO 8601 in UTC (`2026-01-01T12:00:00.000Z`); response headers carry
//! the HTTP date (`Thu, 01 Jan 2026 12:00:00 GMT`, read by `httpdate`). Callers get one type
//! for both. ISO 8601 is parsed by hand rather than with a date crate: S3 only ever sends this
//! one UTC shape, and converting a civil date to days is a dozen lines.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Parses `YYYY-MM-DDTHH:MM:SS[.fraction](Z|+00:00)`. Only UTC is accepted: S3 sends
/// nothing else, and guessing at offsets would hide a server bug.
pub fn parse_iso8601(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let year = digits(&b[0..4])?;
    let month = digits(&b[5..7])?;
    let day = digits(&b[8..10])?;
    let hour = digits(&b[11..13])?;
    let minute = digits(&b[14..16])?;
    let second = digits(&b[17..19])?;
    let mut rest = &b[19..];
    let mut nanos = 0u32;
    if let Some(frac) = rest.strip_prefix(b".") {
        let n = frac.iter().take_while(|c| c.is_ascii_digit()).count();
        if n == 0 {
            return None;
        }
        // Keep at most nanosecond precision; pad shorter fractions (".5" is 500 ms).
        let mut value = 0u32;
        for i in 0..9 {
            value = value * 10
                + frac
                    .get(i)
                    .filter(|_| i < n)
                    .map_or(0, |d| u32::from(d - b'0'));
        }
        nanos = value;
        rest = &frac[n..];
    }
    if !matches!(rest, b"Z" | b"z" | b"+00:00") {
        return None;
    }
    if !(1..=12).contains(&month) || day == 0 || day > days_in_month(year, month) {
        return None;
    }
    if hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + i64::from(hour * 3600 + minute * 60 + second);
    let secs = u64::try_from(secs).ok()?;
    UNIX_EPOCH.checked_add(Duration::new(secs, nanos))
}

/// Formats as `YYYY-MM-DDTHH:MM:SSZ` (UTC, whole seconds), the way the CLI prints times.
pub fn format_iso8601(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Parses an HTTP date (`Last-Modified` header).
pub fn parse_http_date(s: &str) -> Option<SystemTime> {
    httpdate::parse_http_date(s.trim()).ok()
}

fn digits(b: &[u8]) -> Option<u32> {
    b.iter().try_fold(0u32, |acc, &c| {
        c.is_ascii_digit().then(|| acc * 10 + u32::from(c - b'0'))
    })
}

fn is_leap(y: u32) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

fn days_in_month(y: u32, m: u32) -> u32 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: u32, m: u32, d: u32) -> i64 {
    let y = i64::from(y) - i64::from(m <= 2);
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The inverse of [`days_from_civil`].
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

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
