//! Byte sizes written the way operators write them: `64MiB`, `4GiB`, `1G`, `1048576`.
//!
//! Binary (`KiB`, `MiB`, `GiB`, `TiB`; also `K`, `M`, `G`, `T`) and decimal (`KB`, `MB`, `GB`,
//! `TB`) units are accepted, case-insensitively, after an integer or a decimal number
//! (`1.5GiB`). In a TOML config a size is either such a string or an integer.
//!
//! Written by hand rather than with the `parse-size` crate: fuzzing found that crate's parser
//! overflowing (a panic in debug builds, a wrong size in release) on long digit strings, and
//! the grammar is small enough to own.

use serde::{Deserialize, Deserializer};

/// A size in bytes that deserializes from `"64MiB"` or `67108864`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid size {input:?}: write a number of bytes with an optional unit, like 64MiB or 4GiB"
)]
pub struct SizeError {
    pub input: String,
}

/// Parses a size such as `64MiB`.
pub fn parse_size(input: &str) -> Result<u64, SizeError> {
    let err = || SizeError {
        input: input.to_string(),
    };
    let s = input.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = (&s[..split], s[split..].trim());
    let multiplier: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return Err(err()),
    };
    let (whole, frac) = match number.split_once('.') {
        Some((w, f)) => (w, f),
        None => (number, ""),
    };
    if whole.is_empty() || frac.contains('.') || (number.contains('.') && frac.is_empty()) {
        return Err(err());
    }
    let whole: u64 = whole.parse().map_err(|_| err())?;
    let mut bytes = whole.checked_mul(multiplier).ok_or_else(err)?;
    if !frac.is_empty() {
        // Up to 9 fractional digits are honoured; the fraction of a byte is rounded down.
        let digits = &frac[..frac.len().min(9)];
        let scale = 10u64.pow(digits.len() as u32);
        let f: u64 = digits.parse().map_err(|_| err())?;
        let part = (f as u128 * multiplier as u128 / scale as u128) as u64;
        bytes = bytes.checked_add(part).ok_or_else(err)?;
    }
    Ok(bytes)
}

impl std::str::FromStr for ByteSize {
    type Err = SizeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_size(s).map(ByteSize)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(ByteSize(n)),
            Raw::Text(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("4GiB"), Ok(4 << 30));
        assert_eq!(parse_size("1024"), Ok(1024));
        assert_eq!(parse_size("1KB"), Ok(1000));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size(" 2 g "), Ok(2 << 30));
        assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
        // Regressions found by fuzzing: long digit runs neither panic nor wrap.
        assert_eq!(parse_size(&format!("{}1", "0".repeat(100))), Ok(1));
        assert!(parse_size(&format!("1{}", "9".repeat(30))).is_err());
        for bad in [
            "lots",
            "-1",
            "",
            "MiB",
            "1..5M",
            "1.M",
            "18446744073709551616",
            "20000000TiB",
            "1 2",
            "1e3",
        ] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
