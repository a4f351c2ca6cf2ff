//! The HTTP `Range` header for object reads, with S3's reading of RFC 9110.
//!
//! S3 serves one range per request. A header it cannot parse (wrong unit, several ranges,
//! `first > last`, garbage) is ignored and the whole object is returned, as RFC 9110 §14.2
//! allows and S3 does; a well-formed range that starts past the end of the object is
//! unsatisfiable (416 `InvalidRange`).

/// A parsed byte-range request, before the object size is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeSpec {
    /// `bytes=first-last` (last inclusive).
    FromTo(u64, u64),
    /// `bytes=first-`.
    From(u64),
    /// `bytes=-n`: the last n bytes.
    Suffix(u64),
}

/// A range resolved against an object size: `start..end` with `end` exclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteRange {
    pub start: u64,
    pub end: u64,
}

impl ByteRange {
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }

    /// The `Content-Range` value for a 206 answer.
    pub fn content_range(&self, size: u64) -> String {
        format!("bytes {}-{}/{}", self.start, self.end - 1, size)
    }
}

/// Parses a `Range` header value. `None` means "ignore the header" (serve the whole object).
pub fn parse_range(value: &str) -> Option<RangeSpec> {
    let spec = value.trim().strip_prefix("bytes=")?.trim();
    if spec.contains(',') {
        return None;
    }
    let (first, last) = spec.split_once('-')?;
    let (first, last) = (first.trim(), last.trim());
    let num = |s: &str| -> Option<u64> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        s.parse().ok()
    };
    match (first.is_empty(), last.is_empty()) {
        (true, true) => None,
        (true, false) => Some(RangeSpec::Suffix(num(last)?)),
        (false, true) => Some(RangeSpec::From(num(first)?)),
        (false, false) => {
            let (a, b) = (num(first)?, num(last)?);
            (a <= b).then_some(RangeSpec::FromTo(a, b))
        }
    }
}

impl RangeSpec {
    /// Resolves the range against an object of `size` bytes; `None` means unsatisfiable (416).
    pub fn resolve(self, size: u64) -> Option<ByteRange> {
        match self {
            RangeSpec::FromTo(a, b) if a < size => Some(ByteRange {
                start: a,
                end: b.saturating_add(1).min(size),
            }),
            RangeSpec::From(a) if a < size => Some(ByteRange {
                start: a,
                end: size,
            }),
            RangeSpec::Suffix(n) if n > 0 && size > 0 => Some(ByteRange {
                start: size.saturating_sub(n),
                end: size,
            }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_three_forms() {
        assert_eq!(parse_range("bytes=0-9"), Some(RangeSpec::FromTo(0, 9)));
        assert_eq!(parse_range("bytes=5-"), Some(RangeSpec::From(5)));
        assert_eq!(parse_range("bytes=-3"), Some(RangeSpec::Suffix(3)));
    }

    #[test]
    fn ignores_malformed() {
        for v in [
            "bytes=",
            "bytes=-",
            "bytes=a-b",
            "items=0-1",
            "bytes=0-1,3-4",
            "bytes=9-2",
            "0-1",
            "bytes=+1-2",
            "bytes=99999999999999999999999-",
        ] {
            assert_eq!(parse_range(v), None, "{v}");
        }
    }

    #[test]
    fn resolves_against_size() {
        let r = |s: &str, size| parse_range(s).unwrap().resolve(size);
        assert_eq!(r("bytes=0-9", 5), Some(ByteRange { start: 0, end: 5 }));
        assert_eq!(r("bytes=2-", 5), Some(ByteRange { start: 2, end: 5 }));
        assert_eq!(r("bytes=-2", 5), Some(ByteRange { start: 3, end: 5 }));
        assert_eq!(r("bytes=-10", 5), Some(ByteRange { start: 0, end: 5 }));
        assert_eq!(r("bytes=5-", 5), None);
        assert_eq!(r("bytes=-0", 5), None);
        assert_eq!(r("bytes=0-0", 0), None);
        assert_eq!(
            ByteRange { start: 3, end: 5 }.content_range(5),
            "bytes 3-4/5"
        );
    }
}
