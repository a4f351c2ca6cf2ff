//! Versions of writes: a write's place among the writes of one key, so that replicas
//! converge whatever order the writes reach them in ("last writer wins").
//!
//! A version is a hybrid logical clock reading (the server's `model::version::Hlc`) and the
//! writing node's id. Version 0 ([`Version::ZERO`]) is "not versioned": records written
//! before versions existed. On the wire (headers, JSON) a version is `clock.node` in hex.

/// A write's place in the order of writes of one key. Ordered by clock, then node id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Version {
    /// Hybrid logical clock: milliseconds since the epoch in the high 48 bits, a counter for
    /// writes within one millisecond in the low 16.
    pub clock: u64,
    /// The id of the node that made the write ([`node_id`]): breaks ties between writes of
    /// two nodes in the same clock tick, the same way on every replica.
    pub node: u32,
}

impl Version {
    pub const ZERO: Version = Version { clock: 0, node: 0 };

    pub fn is_zero(&self) -> bool {
        *self == Version::ZERO
    }

    /// Text form for headers and JSON: `clock.node` in hex, e.g. `18c4f9a2b0c0001.3f2a`.
    pub fn to_text(&self) -> String {
        format!("{:x}.{:x}", self.clock, self.node)
    }

    /// Parses [`Version::to_text`]; `None` for anything else.
    pub fn parse(text: &str) -> Option<Version> {
        let (clock, node) = text.trim().split_once('.')?;
        if clock.is_empty() || node.is_empty() || clock.len() > 16 || node.len() > 8 {
            return None;
        }
        Some(Version {
            clock: u64::from_str_radix(clock, 16).ok()?,
            node: u32::from_str_radix(node, 16).ok()?,
        })
    }

    /// Wall-clock milliseconds the version was made at.
    pub fn millis(&self) -> u64 {
        self.clock >> 16
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_text())
    }
}

impl serde::Serialize for Version {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_text())
    }
}

impl<'de> serde::Deserialize<'de> for Version {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Version::parse(&text).ok_or_else(|| serde::de::Error::custom("not a version"))
    }
}

/// The id a node's versions carry: a hash of its name (never 0, so no stamped version is
/// [`Version::ZERO`]).
pub fn node_id(name: &str) -> u32 {
    let h = blake3::hash(name.as_bytes());
    let b = h.as_bytes();
    u32::from_le_bytes([b[0], b[1], b[2], b[3]]).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_order_by_clock_then_node_and_round_trip_as_text() {
        let a = Version { clock: 5, node: 9 };
        let b = Version { clock: 6, node: 1 };
        let c = Version { clock: 6, node: 2 };
        assert!(Version::ZERO < a && a < b && b < c);
        for v in [a, b, c, Version::ZERO] {
            assert_eq!(Version::parse(&v.to_text()), Some(v));
        }
        for bad in [
            "",
            ".",
            "1.",
            ".1",
            "x.1",
            "1.1.1",
            "11111111111111111.1",
            "1.111111111",
        ] {
            assert_eq!(Version::parse(bad), None, "{bad}");
        }
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<Version>(&json).unwrap(), c);
    }
}
