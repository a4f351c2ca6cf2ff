//! Why RDMA cannot be used, or failed. Compiled with or without the `rdma` feature, so that an
//! engine built without it can say so in the same type.

use std::fmt;

/// An RDMA setup or data-path failure. All of them leave the other transports usable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RdmaError {
    #[error("rdma is disabled by configuration")]
    Disabled,
    #[error("this build has no rdma support (cargo feature `rdma`)")]
    NotCompiled,
    #[error("no rdma device found")]
    NoDevice,
    #[error("rdma device {0} not found")]
    DeviceNotFound(String),
    #[error("rdma device {device} has no active port")]
    NoActivePort { device: String },
    #[error("{call} failed: {}", Errno(*.errno))]
    Verbs { call: &'static str, errno: i32 },
    #[error("work request failed with completion status {status} ({})", status_name(*.status))]
    Completion { status: u32 },
    #[error("rdma handshake failed: {0}")]
    Handshake(String),
}

impl RdmaError {
    /// A verbs call failed; reads `errno`.
    #[cfg_attr(not(feature = "rdma"), allow(dead_code))]
    pub(crate) fn verbs(call: &'static str) -> RdmaError {
        RdmaError::Verbs {
            call,
            errno: std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
        }
    }
}

struct Errno(i32);

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", std::io::Error::from_raw_os_error(self.0))
    }
}

/// Names of `ibv_wc_status` values, for messages (the values are fixed by the verbs ABI).
fn status_name(status: u32) -> &'static str {
    match status {
        0 => "success",
        1 => "local length error",
        2 => "local QP operation error",
        4 => "local protection error",
        5 => "flushed",
        7 => "bad response",
        8 => "local access error",
        9 => "remote invalid request",
        10 => "remote access error",
        11 => "remote operation error",
        12 => "retry exceeded",
        13 => "RNR retry exceeded",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_say_what_happened() {
        assert_eq!(RdmaError::NoDevice.to_string(), "no rdma device found");
        let verbs = RdmaError::Verbs {
            call: "ibv_reg_mr",
            errno: libc::ENOMEM,
        };
        assert!(verbs.to_string().starts_with("ibv_reg_mr failed: "));
        assert!(RdmaError::Completion { status: 10 }
            .to_string()
            .contains("remote access error"));
    }
}
