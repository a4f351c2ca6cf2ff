//! Small facts from the operating system: randomness and which boot of which host this is.

use std::io::Read as _;

/// Fills `buf` from the kernel's CSPRNG. Read from `/dev/urandom` rather than through a crate:
/// it is needed once per registration and once per engine.
pub(crate) fn fill_random(buf: &mut [u8]) -> std::io::Result<()> {
    std::fs::File::open("/dev/urandom")?.read_exact(buf)
}

pub(crate) fn random_u64() -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    fill_random(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

/// Names this boot of this machine. Two engines with the same host id run under one kernel,
/// which is what shared memory needs (they may still live in different mount namespaces; a
/// failed connect then falls back to the next path). `boot_id` changes on every boot, so a
/// stale address from before a reboot never looks local.
pub(crate) fn host_id() -> String {
    match std::fs::read_to_string("/proc/sys/kernel/random/boot_id") {
        Ok(id) if !id.trim().is_empty() => id.trim().to_owned(),
        _ => {
            let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
            format!("host:{}", name.trim())
        }
    }
}

/// The system's base page size.
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size)
        .ok()
        .filter(|s| *s > 0)
        .unwrap_or(4096)
}
