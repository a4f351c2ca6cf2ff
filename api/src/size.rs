//! Byte sizes written the way operators write them: `64MiB`, `4GiB`, `1G`, `1048576`.
//!
//! Binary (`KiB`, `MiB`, `GiB`) and decimal (`KB`, `MB`, `GB`) units are both accepted, as
//! `parse-size` reads them. In a TOML config a size is either such a string or an integer.

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
    parse_size::parse_size(input.trim()).map_err(|_| SizeError {
        input: input.to_string(),
    })
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
        assert!(parse_size("lots").is_err());
        assert!(parse_size("-1").is_err());
    }
}
