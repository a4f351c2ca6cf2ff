//! Which path bytes take: the name every layer (errors, statistics, selection, the
//! transports themselves) uses for a transport, kept below all of them.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The paths bytes can take, in the order of preference [`crate::select`] uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TransportKind {
    Rdma,
    Shm,
    Tcp,
}

impl TransportKind {
    pub const ALL: [TransportKind; 3] =
        [TransportKind::Rdma, TransportKind::Shm, TransportKind::Tcp];

    pub fn as_str(self) -> &'static str {
        match self {
            TransportKind::Rdma => "rdma",
            TransportKind::Shm => "shm",
            TransportKind::Tcp => "tcp",
        }
    }
}

impl fmt::Display for TransportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
