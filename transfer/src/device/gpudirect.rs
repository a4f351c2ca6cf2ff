//! Whether GPUDirect RDMA could reach device memory on this host, and why not.
//!
//! A NIC can read and write GPU memory directly only when the kernel has a peer-memory
//! module that lets `ibv_reg_mr` pin device pages: `nvidia_peermem` (shipped with the NVIDIA
//! driver since 465) or the older out-of-tree `nv_peer_mem`. Without one, registering a
//! device pointer fails, and the blocks have to be staged through pinned host memory.
//!
//! This build always stages (see [`super::staging`]): one-sided RDMA straight into device
//! memory is not implemented, because no machine it was developed on had an RDMA device or a
//! GPU to prove it on. [`status`] is what a client reports (in its logs and in
//! `DeviceBuffer::path`) so that an operator sees which path a buffer takes and why.

use std::path::Path;

/// The kernel modules that give a NIC access to GPU memory, newest first.
pub const PEER_MEMORY_MODULES: [&str; 2] = ["nvidia_peermem", "nv_peer_mem"];

/// The peer-memory module loaded under `sys_module` (normally `/sys/module`), if any.
pub fn peer_memory_module_in(sys_module: &Path) -> Option<&'static str> {
    PEER_MEMORY_MODULES
        .into_iter()
        .find(|m| sys_module.join(m).is_dir())
}

/// The peer-memory module loaded on this host, if any.
pub fn peer_memory_module() -> Option<&'static str> {
    peer_memory_module_in(Path::new("/sys/module"))
}

/// How device memory is reached on this host, and why: `rdma_unavailable` is why the client's
/// engine has no RDMA path (`None` when it has one), `sys_module` normally `/sys/module`.
pub fn status(rdma_unavailable: Option<String>, sys_module: &Path) -> String {
    match (rdma_unavailable, peer_memory_module_in(sys_module)) {
        (Some(why), _) => format!("staged: no RDMA path ({why})"),
        (None, None) => format!(
            "staged: no peer-memory module loaded (one of {}), so the NIC cannot reach GPU memory",
            PEER_MEMORY_MODULES.join(", ")
        ),
        (None, Some(m)) => format!(
            "staged: {m} is loaded, but this build does not register GPU memory with the NIC"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_loaded_module_and_says_why_it_stages() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(peer_memory_module_in(dir.path()), None);
        let s = status(None, dir.path());
        assert!(s.contains("no peer-memory module"), "{s}");
        let s = status(Some("no RDMA device".into()), dir.path());
        assert!(s.contains("no RDMA path (no RDMA device)"), "{s}");
        std::fs::create_dir(dir.path().join("nv_peer_mem")).unwrap();
        assert_eq!(peer_memory_module_in(dir.path()), Some("nv_peer_mem"));
        std::fs::create_dir(dir.path().join("nvidia_peermem")).unwrap();
        assert_eq!(peer_memory_module_in(dir.path()), Some("nvidia_peermem"));
        let s = status(None, dir.path());
        assert!(s.contains("nvidia_peermem is loaded"), "{s}");
    }
}
