//! Whether GPUDirect RDMA could reach device memory on this host, and why not.
//!
//! A NIC can read and write GPU memory directly only when the kernel has a peer-memory
//! module that lets `ibv_reg_mr` pin device pages: `nvidia_peermem` (shipped with the NVIDIA
//! driver since 465) or the older out-of-tree `nv_peer_mem`. Without one, registering a
//! device pointer fails, and the blocks have to be staged through pinned host memory.
//!
//! When the engine runs the rdma transport and a module is loaded, a client registers its GPU
//! buffer with the NIC ([`crate::MemoryRegion::device_memory`], then
//! [`crate::TransferEngine::register`]) and the node's one-sided reads and writes land in GPU
//! memory directly; when either is missing, or the NIC refuses the device address, the
//! blocks are staged (see [`super::staging`]). [`blocker`] says why GPUDirect cannot be
//! tried, [`status`] is what a client reports (`KvClient::device_path`) so that an operator
//! sees which path a buffer takes and why.

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

/// Why GPUDirect RDMA cannot be tried on this host, `None` when it can: `rdma_unavailable`
/// is why the client's engine has no RDMA path (`None` when it has one), `sys_module`
/// normally `/sys/module`.
pub fn blocker(rdma_unavailable: Option<String>, sys_module: &Path) -> Option<String> {
    match (rdma_unavailable, peer_memory_module_in(sys_module)) {
        (Some(why), _) => Some(format!("no RDMA path ({why})")),
        (None, None) => Some(format!(
            "no peer-memory module loaded (one of {}), so the NIC cannot reach GPU memory",
            PEER_MEMORY_MODULES.join(", ")
        )),
        (None, Some(_)) => None,
    }
}

/// How device memory is reached on this host, and why (arguments as for [`blocker`]).
pub fn status(rdma_unavailable: Option<String>, sys_module: &Path) -> String {
    match blocker(rdma_unavailable, sys_module) {
        Some(why) => format!("staged: {why}"),
        None => format!(
            "gpudirect: {} is loaded; GPU buffers are registered with the NIC (staged where \
             the NIC refuses one or a node has no RDMA)",
            peer_memory_module_in(sys_module).unwrap_or("a peer-memory module")
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
        assert_eq!(blocker(None, dir.path()), None);
        assert!(blocker(Some("off".into()), dir.path()).is_some());
        let s = status(None, dir.path());
        assert!(s.starts_with("gpudirect: nvidia_peermem is loaded"), "{s}");
    }
}

/// What a GPUDirect segment means for the other paths, on engines without an RDMA device: the
/// segment is put in the table as the rdma transport would leave it, over "device memory"
/// that is an inaccessible mapping, so a CPU copy into it would crash the test.
#[cfg(test)]
mod device_segments {
    use std::time::Duration;

    use crate::{
        EngineConfig, HugePages, MemoryRegion, NodeId, TransferEngine, TransferError,
        TransferRequest, TransportKind,
    };

    /// `len` bytes of address space that fault on any access (`PROT_NONE`).
    struct Untouchable {
        ptr: *mut libc::c_void,
        len: usize,
    }

    impl Untouchable {
        fn new(len: usize) -> Untouchable {
            // SAFETY: a fresh anonymous mapping; nothing else refers to it.
            let ptr = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_NONE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(ptr, libc::MAP_FAILED);
            Untouchable { ptr, len }
        }

        fn region(&self) -> MemoryRegion {
            // SAFETY: the mapping outlives the engines of the test (declared first, dropped
            // last), and nothing may touch it: that is what the test checks.
            unsafe { MemoryRegion::device_memory(0, self.ptr as u64, self.len as u64) }.unwrap()
        }
    }

    impl Drop for Untouchable {
        fn drop(&mut self) {
            // SAFETY: the mapping made in `new`, unmapped once.
            unsafe { libc::munmap(self.ptr, self.len) };
        }
    }

    fn engine(node: u64, dir: &std::path::Path, host: &str) -> TransferEngine {
        let mut config = EngineConfig::new(NodeId(node));
        config.shm_dir = Some(dir.to_path_buf());
        config.host = Some(host.to_string());
        config.io_timeout = Duration::from_secs(20);
        TransferEngine::start(config).unwrap()
    }

    /// Without RDMA there is nothing to register GPU memory with: a typed error that says
    /// why, and nothing left registered.
    #[test]
    fn registering_gpu_memory_needs_rdma() {
        let gpu = Untouchable::new(1 << 20);
        let dir = tempfile::tempdir().unwrap();
        let e = engine(1, dir.path(), "h");
        let err = e.register(gpu.region()).unwrap_err();
        assert!(matches!(err, TransferError::DeviceMemory { .. }), "{err}");
        assert!(err.to_string().contains("no rdma transport"), "{err}");
        assert_eq!(e.segment_count(), 0);
    }

    /// A peer that reaches a GPU segment over shm or tcp is told the path cannot serve it
    /// (retryable, so that rdma is tried where it exists), and no CPU ever copies into it;
    /// a batch from GPU memory goes over rdma only, never a CPU path.
    #[test]
    fn cpu_paths_never_touch_a_gpu_segment() {
        let gpu = Untouchable::new(1 << 20);
        let dir = tempfile::tempdir().unwrap();
        for same_host in [true, false] {
            let a = engine(1, dir.path(), "host-a");
            let b = engine(2, dir.path(), if same_host { "host-a" } else { "host-b" });
            a.add_peer(b.address());
            b.add_peer(a.address());
            let device = b.segment_table().insert(gpu.region(), false, None).unwrap();
            let host = MemoryRegion::allocate("t", 1 << 20, HugePages::Never).unwrap();
            host.write_at(0, &[7u8; 4096]).unwrap();
            let host = a.register(host).unwrap();
            let desc = device.descriptor(0, 4096).unwrap();
            let paths = if same_host {
                vec![TransportKind::Shm, TransportKind::Tcp]
            } else {
                vec![TransportKind::Tcp]
            };
            for kind in &paths {
                for req in [
                    TransferRequest::write(&host, 0, &desc),
                    TransferRequest::read(&host, 0, &desc),
                ] {
                    let result = a.submit_via([req], &[*kind]).unwrap().wait();
                    let err = result.outcomes[0].as_ref().unwrap_err();
                    let TransferError::AllPathsFailed { attempts, .. } = err else {
                        panic!("{kind}: {err}");
                    };
                    let (tried, why) = &attempts[0];
                    assert_eq!((attempts.len(), tried), (1, kind), "{err}");
                    // The path could not serve it; the target did not refuse the request.
                    assert!(why.is_retryable(), "{kind}: {why}");
                    let expected = match kind {
                        TransportKind::Tcp => "is GPU memory",
                        _ => "not shared over shm",
                    };
                    assert!(why.to_string().contains(expected), "{kind}: {why}");
                }
            }
            // All paths: every one refuses, none copies.
            let err = a
                .transfer([TransferRequest::write(&host, 0, &desc)])
                .unwrap_err();
            assert!(matches!(err, TransferError::AllPathsFailed { .. }), "{err}");
            // From GPU memory on this side: no path but rdma, which neither engine has.
            let target = host.descriptor(0, 4096).unwrap();
            let err = b
                .transfer([TransferRequest::write(&device, 0, &target)])
                .unwrap_err();
            assert!(matches!(err, TransferError::NoPath { .. }), "{err}");
            let mut back = [0u8; 4096];
            host.region().read_at(0, &mut back).unwrap();
            assert_eq!(back, [7u8; 4096], "the host side is untouched");
        }
    }
}
