//! Routing policies: the conductor's own and the baselines it is measured against.
//!
//! All five run through the same routing code, index and load bookkeeping; they differ only
//! in how they pick the prefill instance (and, for the two blind ones, the decode instance),
//! and only the global cache-aware policy pulls prefixes between nodes, writes replication
//! hints and rejects early by default.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// How the prefill instance is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Uniformly at random (prefill and decode).
    Random,
    /// In turn (prefill and decode).
    RoundRobin,
    /// The shortest predicted prefill queue; decode by predicted batch.
    LeastLoaded,
    /// The longest prefix cached on the instance's own node, among instances whose queue is
    /// within a limit of the shortest queue; no transfers between nodes.
    LocalCacheAware,
    /// Mooncake's Algorithm 1: the lowest predicted TTFT over every instance, counting
    /// queue, prefill of the uncached part, and pulling a longer prefix from another node
    /// when that beats recomputing it.
    GlobalCacheAware,
}

impl Policy {
    /// Every policy, baselines first.
    pub const ALL: [Policy; 5] = [
        Policy::Random,
        Policy::RoundRobin,
        Policy::LeastLoaded,
        Policy::LocalCacheAware,
        Policy::GlobalCacheAware,
    ];

    /// The name used on the command line, in JSON and in metrics.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Random => "random",
            Policy::RoundRobin => "round-robin",
            Policy::LeastLoaded => "least-loaded",
            Policy::LocalCacheAware => "local-cache-aware",
            Policy::GlobalCacheAware => "global-cache-aware",
        }
    }

    /// Whether the policy rejects requests predicted to miss their SLO unless configured
    /// otherwise: only the conductor's own; the baselines stand for routers that admit
    /// everything.
    pub fn rejects_by_default(self) -> bool {
        self == Policy::GlobalCacheAware
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown policy name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown policy {0:?} (random, round-robin, least-loaded, local-cache-aware, global-cache-aware)")]
pub struct UnknownPolicy(pub String);

impl FromStr for Policy {
    type Err = UnknownPolicy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Policy::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| UnknownPolicy(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for p in Policy::ALL {
            assert_eq!(p.name().parse::<Policy>(), Ok(p));
            assert_eq!(
                serde_json::to_string(&p).expect("serializes"),
                format!("\"{}\"", p.name())
            );
        }
        assert!("fastest".parse::<Policy>().is_err());
        assert!(Policy::GlobalCacheAware.rejects_by_default());
        assert!(!Policy::LeastLoaded.rejects_by_default());
    }
}
