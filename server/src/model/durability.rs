//! Where a bucket's objects must be before a write is acknowledged.

use serde::{Deserialize, Serialize};

/// Where a bucket's objects must be before a PUT is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// DRAM only: fastest; lost on restart unless demoted to NVMe meanwhile.
    #[default]
    Memory,
    /// Written through to NVMe and synced before the PUT is acknowledged: survives kill -9.
    Disk,
}

impl Durability {
    pub fn parse(s: &str) -> Option<Durability> {
        match s.to_ascii_lowercase().as_str() {
            "memory" => Some(Durability::Memory),
            "disk" => Some(Durability::Disk),
            _ => None,
        }
    }

    /// The name `parse` reads (`x-yutu-durability`).
    pub fn as_str(self) -> &'static str {
        match self {
            Durability::Memory => "memory",
            Durability::Disk => "disk",
        }
    }
}
