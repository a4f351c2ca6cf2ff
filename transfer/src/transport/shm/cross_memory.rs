//! Copies into and out of a same-host peer's process memory with `process_vm_writev` /
//! `process_vm_readv` (cross-memory attach), where the kernel would let the peer itself do
//! what the copy does.
//!
//! A peer's process memory is reached through its memory file (`/proc/PID/mem`, see
//! `mapping.rs`), which the kernel copies page by page through a bounce page: about half a
//! `memcpy` per thread. Cross-memory attach copies straight between the two address spaces,
//! about 0.85 of a `memcpy`. It addresses the peer by pid, with *this* process's rights, so
//! it is used only when those rights add nothing to the peer's own:
//!
//! - **The peer could do it itself.** Either the peer holds `CAP_SYS_PTRACE` in this
//!   process's user namespace (its effective set, read from `/proc/PID/status`): it may read
//!   and write any process this one can. Or the peer's uid (the kernel's `SO_PEERCRED` of the
//!   Unix socket its memory file came over) equals this process's effective uid and this
//!   process has no `CAP_SYS_PTRACE`: then `process_vm_writev` reaches only processes of that
//!   user that the kernel lets be traced without the capability (same uid and gid, dumpable,
//!   permitted capabilities a subset, and what Yama allows), which the peer can already read
//!   and write with the same call. A node with `CAP_SYS_PTRACE` serving an engine without it,
//!   or running as another user than the engine, keeps to the memory file.
//! - **The pid is the peer's.** The pid must be both the socket's `SO_PEERCRED` pid and the
//!   one in the memory file's path, and a pidfd taken on it is checked before and after every
//!   copy: a copy that finds the peer gone fails. Pids are reused, so a copy could in
//!   principle land in a process that got the pid between the check and the call (the
//!   allocator must first cycle through every other pid); by the rule above that process is
//!   one the peer could write into itself, so no tenant gains any access it did not have.
//! - **Everything else as before.** The bytes and addresses are those the peer's listener
//!   vouched for (token, bounds, still registered); a copy into pages the peer unmapped fails
//!   with `EFAULT`; an unprivileged peer's `userfaultfd` handles only user-mode faults
//!   (`vm.unprivileged_userfaultfd=0`, the default), so a remote copy does not wait for it.
//!
//! Large reads (a put's blocks, on their way into the node's arena) go through a small buffer
//! of the copying thread that stays in its cache, then on with streaming stores; see
//! [`CrossMemory::read_through_bounce`] for why two copies beat one there.
//!
//! `YUTU_CROSS_MEMORY=0` in the node's environment turns it off (the memory file only).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use crate::cold_copy::{self, STREAM_MIN};

/// One piece of a copy: an address of this process, an address of the peer, a length.
pub(crate) type Piece = (*mut u8, u64, usize);

/// The most iovecs one `process_vm_*` call takes (the kernel's `UIO_MAXIOV`).
const IOV_MAX: usize = 1024;

/// The peer's pid and a pidfd on it, for copies with `process_vm_*`.
pub(crate) struct CrossMemory {
    pid: libc::pid_t,
    pidfd: OwnedFd,
    /// Set when the kernel refused a copy (`EPERM`, `ENOSYS`): the memory file from then on.
    refused: AtomicBool,
}

impl CrossMemory {
    /// Cross-memory access to process `pid`, whose memory file came over a socket whose peer
    /// is `cred`; `None` when the rules in the module docs do not allow it.
    pub(crate) fn new(pid: libc::pid_t, cred: Option<libc::ucred>) -> Option<CrossMemory> {
        let cred = cred?;
        if !enabled() || pid <= 0 || cred.pid != pid {
            return None;
        }
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return None;
        }
        // SAFETY: a descriptor the kernel has just returned, owned by nobody else.
        let pidfd = unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) };
        let vm = CrossMemory {
            pid,
            pidfd,
            refused: AtomicBool::new(false),
        };
        // SAFETY: geteuid has no preconditions.
        let same_user =
            cred.uid == unsafe { libc::geteuid() } && own_cap_sys_ptrace() == Some(false);
        // Read while the pidfd holds the pid, and checked alive after: it was the peer's.
        let allowed = same_user || traces_all(pid);
        (allowed && vm.alive()).then_some(vm)
    }

    /// Whether the process the pidfd was taken on has not exited (its pidfd is not readable).
    fn alive(&self) -> bool {
        let mut p = libc::pollfd {
            fd: self.pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no wait.
        unsafe { libc::poll(&mut p, 1, 0) == 0 }
    }

    /// The error of a copy that found the peer gone.
    fn gone(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("the peer process {} has exited", self.pid),
        )
    }

    /// A finished copy's result: the peer still alive means the pid named it throughout.
    fn still_there(&self) -> io::Result<()> {
        if self.alive() {
            Ok(())
        } else {
            Err(self.gone())
        }
    }

    /// Copies each piece `(local, address, length)` between this process and the peer, in as
    /// few calls as `IOV_MAX` allows: a block scattered over one span per layer is one system
    /// call, not one per span, and so are the blocks of a whole batch, each from its own
    /// place in the node's memory into its own range of the client's, with one liveness
    /// check before and one after (not three system calls a block). `None` as for
    /// [`CrossMemory::copy`], before anything moved.
    ///
    /// # Safety
    ///
    /// Each piece's `local` must be valid for its length (reads when `write`, writes
    /// otherwise), and the pieces' local ranges must not overlap when reading.
    pub(crate) unsafe fn copy_pieces(
        &self,
        pieces: &[Piece],
        write: bool,
    ) -> Option<io::Result<()>> {
        if self.refused.load(Ordering::Relaxed) {
            return None;
        }
        if !self.alive() {
            return Some(Err(self.gone()));
        }
        let mut pieces = pieces;
        // Large pieces on average: a small one among them (a chunk's header before its
        // tensor) costs one small copy out of the cache, not a call of its own.
        let total: usize = pieces.iter().map(|p| p.2).sum();
        if !write && total >= STREAM_MIN * pieces.len() {
            // SAFETY: as this function's contract.
            match unsafe { self.read_through_bounce(pieces) } {
                Bounced::Done => return Some(self.still_there()),
                Bounced::Refused => return None,
                // The rest the direct way, which retries what can be retried and names the
                // address that failed.
                Bounced::FailedFrom(i) => pieces = &pieces[i..],
            }
        }
        for (i, chunk) in pieces.chunks(IOV_MAX).enumerate() {
            let len: usize = chunk.iter().map(|p| p.2).sum();
            let locals: Vec<libc::iovec> = chunk
                .iter()
                .map(|&(local, _, len)| libc::iovec {
                    iov_base: local.cast(),
                    iov_len: len,
                })
                .collect();
            let remotes: Vec<libc::iovec> = chunk
                .iter()
                .map(|&(_, addr, len)| libc::iovec {
                    iov_base: addr as usize as *mut libc::c_void,
                    iov_len: len,
                })
                .collect();
            if self.refused.load(Ordering::Relaxed) {
                return None;
            }
            // SAFETY: local iovecs inside the caller's ranges, remote iovecs the kernel
            // checks against the peer's address space.
            let n = unsafe {
                if write {
                    libc::process_vm_writev(
                        self.pid,
                        locals.as_ptr(),
                        locals.len() as _,
                        remotes.as_ptr(),
                        remotes.len() as _,
                        0,
                    )
                } else {
                    libc::process_vm_readv(
                        self.pid,
                        locals.as_ptr(),
                        locals.len() as _,
                        remotes.as_ptr(),
                        remotes.len() as _,
                        0,
                    )
                }
            };
            if n < 0 && i == 0 {
                let err = io::Error::last_os_error();
                if matches!(err.raw_os_error(), Some(libc::EPERM | libc::ENOSYS)) {
                    self.refused.store(true, Ordering::Relaxed);
                    return None;
                }
            }
            if n < 0 || n as usize != len {
                // Short, interrupted or failed: the chunk again piece by piece, which retries
                // what can be retried and names the address that failed.
                for &(local, addr, plen) in chunk {
                    // SAFETY: as this function's contract.
                    match unsafe { self.copy_direct(addr, local, plen, write) } {
                        Some(Ok(())) => {}
                        Some(Err(e)) => return Some(Err(e)),
                        None => {
                            return Some(Err(io::Error::other(
                                "cross-memory access was refused mid-copy",
                            )))
                        }
                    }
                }
            }
        }
        Some(self.still_there())
    }

    /// Copies `len` bytes between `local` and address `at` of the peer (`write`: into the
    /// peer). `None` when the kernel refuses cross-memory access to it (the caller copies
    /// through the memory file instead, and so do later copies).
    ///
    /// # Safety
    ///
    /// `local` must be valid for `len` bytes (reads when `write`, writes otherwise).
    pub(crate) unsafe fn copy(
        &self,
        at: u64,
        local: *mut u8,
        len: usize,
        write: bool,
    ) -> Option<io::Result<()>> {
        if !write && len >= STREAM_MIN {
            // SAFETY: as this function's contract.
            return unsafe { self.copy_pieces(&[(local, at, len)], false) };
        }
        // SAFETY: as this function's contract.
        unsafe { self.copy_direct(at, local, len, write) }
    }

    /// [`CrossMemory::copy`] straight between the two address spaces, in one call where the
    /// kernel copies it all.
    ///
    /// # Safety
    ///
    /// As [`CrossMemory::copy`].
    unsafe fn copy_direct(
        &self,
        at: u64,
        local: *mut u8,
        len: usize,
        write: bool,
    ) -> Option<io::Result<()>> {
        if self.refused.load(Ordering::Relaxed) {
            return None;
        }
        if !self.alive() {
            return Some(Err(self.gone()));
        }
        let mut done = 0usize;
        while done < len {
            let pos = at + done as u64;
            let l = libc::iovec {
                // SAFETY: inside the caller's range (`done < len`).
                iov_base: unsafe { local.add(done) }.cast(),
                iov_len: len - done,
            };
            let r = libc::iovec {
                iov_base: pos as usize as *mut libc::c_void,
                iov_len: len - done,
            };
            // SAFETY: one local iovec inside the caller's range, one remote iovec the kernel
            // checks against the peer's address space; no memory of ours is touched
            // otherwise.
            let n = unsafe {
                if write {
                    libc::process_vm_writev(self.pid, &l, 1, &r, 1, 0)
                } else {
                    libc::process_vm_readv(self.pid, &l, 1, &r, 1, 0)
                }
            };
            match n {
                n if n > 0 => done += n as usize,
                0 => {
                    return Some(Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("the peer's memory at {pos:#x} is gone"),
                    )))
                }
                _ => {
                    let err = io::Error::last_os_error();
                    match err.raw_os_error() {
                        Some(libc::EINTR) => {}
                        Some(libc::EPERM | libc::ENOSYS) if done == 0 => {
                            tracing::debug!(pid = self.pid, %err, "no cross-memory access: the peer's memory file instead");
                            self.refused.store(true, Ordering::Relaxed);
                            return None;
                        }
                        Some(libc::ESRCH) => return Some(Err(self.gone())),
                        _ => {
                            return Some(Err(io::Error::new(
                                err.kind(),
                                format!("the peer's memory at {pos:#x}: {err}"),
                            )))
                        }
                    }
                }
            }
        }
        Some(self.still_there())
    }
}

/// How a read through the bounce buffer ended.
enum Bounced {
    Done,
    /// The kernel refuses cross-memory access to this peer (nothing moved).
    Refused,
    /// A call came back short or failed; the pieces from this index on are not all copied.
    FailedFrom(usize),
}

/// Bytes of a thread's bounce buffer: small enough to stay in a core's L2 (so the kernel's
/// copy into it is a copy into cache), large enough that a 2 MiB block takes 4 calls.
const BOUNCE: usize = 512 * 1024;

thread_local! {
    /// Each copying thread's bounce buffer (a shard's, a transfer worker's), made on first
    /// use and kept.
    static BOUNCE_BUF: std::cell::RefCell<Option<Box<[u8]>>> = const { std::cell::RefCell::new(None) };
}

impl CrossMemory {
    /// Reads the pieces out of the peer through a small buffer of this thread's: the kernel
    /// copies into the buffer, which stays in the cache, and streaming stores copy it on to
    /// each piece's place (`cold_copy`). A put's pieces are bound for the node's arena, where
    /// the kernel's own copy reads every destination line into the cache before writing it.
    /// The two copies together beat the one: Python `batch_put_from` of 2 MiB blocks from
    /// numpy went from 8.2 to 9.4–9.8 GB/s on the development VM (`docs/kv-api.md`). Each
    /// call fills the buffer from as many pieces (or parts of one) as fit, up to `IOV_MAX`.
    ///
    /// # Safety
    ///
    /// As [`CrossMemory::copy_pieces`] when reading.
    unsafe fn read_through_bounce(&self, pieces: &[Piece]) -> Bounced {
        BOUNCE_BUF.with(|cell| {
            let Ok(mut slot) = cell.try_borrow_mut() else {
                return Bounced::FailedFrom(0);
            };
            let buf = slot.get_or_insert_with(|| vec![0u8; BOUNCE].into_boxed_slice());
            let base = buf.as_mut_ptr();
            // Per call: the peer's ranges, and where each lands (bounce offset, destination).
            let mut remotes: Vec<libc::iovec> = Vec::new();
            let mut lands: Vec<(usize, *mut u8, usize)> = Vec::new();
            let mut used = 0usize;
            let mut batch_from = 0usize;
            let mut first_call = true;
            for (i, &(local, addr, len)) in pieces.iter().enumerate() {
                let mut done = 0usize;
                while done < len {
                    if used == BOUNCE || remotes.len() == IOV_MAX {
                        // SAFETY: as this function's contract; `lands` lie in the pieces.
                        match unsafe { self.bounce_once(base, used, &remotes, &lands, first_call) }
                        {
                            Bounced::Done => {}
                            Bounced::FailedFrom(_) => return Bounced::FailedFrom(batch_from),
                            Bounced::Refused => return Bounced::Refused,
                        }
                        first_call = false;
                        remotes.clear();
                        lands.clear();
                        used = 0;
                        batch_from = i;
                    }
                    let n = (len - done).min(BOUNCE - used);
                    remotes.push(libc::iovec {
                        iov_base: (addr + done as u64) as usize as *mut libc::c_void,
                        iov_len: n,
                    });
                    // SAFETY: `done + n <= len`, inside the piece.
                    lands.push((used, unsafe { local.add(done) }, n));
                    used += n;
                    done += n;
                }
            }
            if used == 0 {
                return Bounced::Done;
            }
            // SAFETY: as above.
            match unsafe { self.bounce_once(base, used, &remotes, &lands, first_call) } {
                Bounced::FailedFrom(_) => Bounced::FailedFrom(batch_from),
                other => other,
            }
        })
    }

    /// One `process_vm_readv` of `remotes` into the first `used` bytes of the bounce buffer
    /// at `base`, then each landing copied on to its destination.
    ///
    /// # Safety
    ///
    /// `base` valid for `used` bytes; every landing's destination valid for its length and
    /// not overlapping the buffer.
    unsafe fn bounce_once(
        &self,
        base: *mut u8,
        used: usize,
        remotes: &[libc::iovec],
        lands: &[(usize, *mut u8, usize)],
        first_call: bool,
    ) -> Bounced {
        let local = libc::iovec {
            iov_base: base.cast(),
            iov_len: used,
        };
        // SAFETY: one local iovec inside the bounce buffer; the remote iovecs the kernel
        // checks against the peer's address space.
        let n = unsafe {
            libc::process_vm_readv(self.pid, &local, 1, remotes.as_ptr(), remotes.len() as _, 0)
        };
        if n < 0 && first_call {
            let err = io::Error::last_os_error();
            if matches!(err.raw_os_error(), Some(libc::EPERM | libc::ENOSYS)) {
                self.refused.store(true, Ordering::Relaxed);
                return Bounced::Refused;
            }
        }
        if n < 0 || n as usize != used {
            return Bounced::FailedFrom(0);
        }
        for &(at, dst, len) in lands {
            // SAFETY: `at + len <= used`, inside the buffer; the caller vouches for `dst`.
            unsafe { cold_copy::copy_cold(base.add(at), dst, len) };
        }
        Bounced::Done
    }
}

/// Whether cross-memory attach is on (`YUTU_CROSS_MEMORY=0` turns it off).
fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("YUTU_CROSS_MEMORY").is_none_or(|v| v != "0"))
}

/// Whether this process has `CAP_SYS_PTRACE` in its effective set (`None`: cannot tell).
fn own_cap_sys_ptrace() -> Option<bool> {
    static OWN: OnceLock<Option<bool>> = OnceLock::new();
    *OWN.get_or_init(|| cap_sys_ptrace("self"))
}

/// Whether process `pid` (`"self"`, or a number) has `CAP_SYS_PTRACE` in its effective set.
fn cap_sys_ptrace(pid: &str) -> Option<bool> {
    const CAP_SYS_PTRACE: u32 = 19;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))?
        .trim();
    let caps = u64::from_str_radix(hex, 16).ok()?;
    Some(caps & (1 << CAP_SYS_PTRACE) != 0)
}

/// Whether process `pid` may trace whatever this process may: it holds `CAP_SYS_PTRACE` in
/// this process's user namespace.
fn traces_all(pid: libc::pid_t) -> bool {
    let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/user")).ok();
    cap_sys_ptrace(&pid.to_string()) == Some(true)
        && ns(&pid.to_string()).is_some_and(|theirs| Some(theirs) == ns("self"))
}

/// The credentials of the process at the other end of a Unix socket (`SO_PEERCRED`).
pub(crate) fn peer_cred(sock: &impl AsRawFd) -> Option<libc::ucred> {
    // SAFETY: ucred is plain old data; getsockopt fills it and its length.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: a valid descriptor, out-pointers to our locals with their sizes.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0 && len as usize == std::mem::size_of::<libc::ucred>()).then_some(cred)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own() -> libc::ucred {
        // SAFETY: no preconditions.
        unsafe {
            libc::ucred {
                pid: libc::getpid(),
                uid: libc::geteuid(),
                gid: libc::getegid(),
            }
        }
    }

    /// Another user's process, or a pid that is not the socket's peer, gets no cross-memory
    /// access; this process's own does when it lacks `CAP_SYS_PTRACE`, and copies both ways.
    #[test]
    fn cross_memory_is_only_for_the_peers_own_process_of_this_user() {
        let me = own();
        assert!(CrossMemory::new(me.pid, None).is_none());
        let other_user = libc::ucred {
            uid: me.uid.wrapping_add(1),
            ..me
        };
        // Another user: only when that process may trace everything this one may.
        assert_eq!(
            CrossMemory::new(me.pid, Some(other_user)).is_some(),
            traces_all(me.pid)
        );
        let other_pid = libc::ucred { pid: 1, ..me };
        assert!(CrossMemory::new(me.pid, Some(other_pid)).is_none());
        // This process is its own peer: same user, and it can trace itself either way.
        let vm = CrossMemory::new(me.pid, Some(me)).expect("a process's own memory");
        let mut target = vec![0u8; 3 << 20];
        let mut src: Vec<u8> = (0..3 << 20).map(|i| (i % 251) as u8).collect();
        let at = target.as_mut_ptr() as u64;
        // SAFETY: `src` and `target` are live for the calls; the kernel writes `target`
        // through our own address space while no Rust reference reads it.
        unsafe {
            vm.copy(at, src.as_mut_ptr(), src.len(), true)
                .unwrap()
                .unwrap()
        };
        assert_eq!(target, src);
        let mut back = vec![0u8; 1000];
        // SAFETY: as above.
        unsafe { vm.copy(at + 5, back.as_mut_ptr(), 1000, false) }
            .unwrap()
            .unwrap();
        assert_eq!(back, src[5..1005]);
        // An address that is not mapped fails the copy; nothing faults here.
        // SAFETY: as above; the remote address is checked by the kernel.
        let err = unsafe { vm.copy(8, back.as_mut_ptr(), 10, false) }.unwrap();
        assert!(err.is_err());
    }
}
