//! Passing file descriptors over a Unix socket (`SCM_RIGHTS`).
//!
//! std has no stable API for ancillary data, so this is `sendmsg`/`recvmsg` by hand. The
//! receiver always uses `MSG_CMSG_CLOEXEC` (a received memfd must not leak into child
//! processes) and treats a truncated control message as an error: descriptors the kernel had
//! to drop cannot be recovered, and silently missing ones would shift every later one.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// The most descriptors one message carries.
pub const MAX_FDS: usize = 64;

/// Sends all of `data`, with `fds` attached to its first byte.
pub fn send_with_fds(sock: BorrowedFd<'_>, data: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if fds.is_empty() {
        return send_plain(sock, data);
    }
    if fds.len() > MAX_FDS || data.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "descriptors need 1..=MAX_FDS of them and at least one data byte",
        ));
    }
    let sent = sendmsg_fds(sock, data, fds, 0)?;
    // The descriptors went with the first byte; the rest, if the socket took only part, is
    // plain data.
    send_plain(sock, &data[sent..])
}

/// Sends what the socket takes now of `data` (at least its first byte, with `fds` attached)
/// without waiting for room: the bytes sent, the rest for the caller to send. `WouldBlock`
/// when the socket has no room at all (for a caller that must not block its thread).
pub fn send_with_fds_now(
    sock: BorrowedFd<'_>,
    data: &[u8],
    fds: &[BorrowedFd<'_>],
) -> io::Result<usize> {
    if fds.is_empty() || fds.len() > MAX_FDS || data.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "descriptors need 1..=MAX_FDS of them and at least one data byte",
        ));
    }
    sendmsg_fds(sock, data, fds, libc::MSG_DONTWAIT)
}

/// One `sendmsg` of `data` with `fds` attached to its first byte: the bytes the socket took.
fn sendmsg_fds(
    sock: BorrowedFd<'_>,
    data: &[u8],
    fds: &[BorrowedFd<'_>],
    flags: libc::c_int,
) -> io::Result<usize> {
    let fd_bytes = std::mem::size_of_val(fds) as u32;
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes) } as usize;
    // u64 words keep the control buffer aligned for `cmsghdr`.
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: msghdr is plain old data; every field we rely on is set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: the control buffer is `space` bytes, aligned, and large enough for one header
    // carrying `fds.len()` ints (CMSG_SPACE above), so CMSG_FIRSTHDR is non-null and CMSG_DATA
    // points at `fd_bytes` writable bytes inside it.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(fd_bytes) as _;
        let dst = libc::CMSG_DATA(cmsg).cast::<libc::c_int>();
        for (i, fd) in fds.iter().enumerate() {
            dst.add(i).write_unaligned(fd.as_raw_fd());
        }
    }
    loop {
        // SAFETY: `msg` points at `iov` (over live `data`) and at the control buffer, both
        // alive for the call; MSG_NOSIGNAL turns a closed peer into EPIPE instead of SIGPIPE.
        let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL | flags) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

fn send_plain(sock: BorrowedFd<'_>, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        // SAFETY: sending from a live slice; MSG_NOSIGNAL as above.
        let n = unsafe {
            libc::send(
                sock.as_raw_fd(),
                data.as_ptr().cast(),
                data.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        data = &data[n as usize..];
    }
    Ok(())
}

/// One `recvmsg` into `buf`; descriptors that arrive with it are appended to `fds`. Returns the
/// bytes read (0 at end of stream).
pub fn recv_with_fds(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> io::Result<usize> {
    // SAFETY: a pure size computation.
    let space =
        unsafe { libc::CMSG_SPACE((MAX_FDS * std::mem::size_of::<libc::c_int>()) as u32) } as usize;
    let mut control = vec![0u64; space.div_ceil(8)];
    loop {
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: plain old data, fields set below.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: `msg` describes `buf` and `control`, both live and writable for the call.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        // SAFETY: the kernel filled `msg`'s control area with well-formed headers of total
        // length `msg_controllen`; CMSG_FIRSTHDR/NXTHDR stay inside it, and each SCM_RIGHTS
        // payload holds `(cmsg_len - CMSG_LEN(0)) / sizeof(int)` descriptors that are now ours.
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
            while !cmsg.is_null() {
                if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                    let payload = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                    let count = payload / std::mem::size_of::<libc::c_int>();
                    let src = libc::CMSG_DATA(cmsg).cast::<libc::c_int>();
                    for i in 0..count {
                        fds.push(OwnedFd::from_raw_fd(src.add(i).read_unaligned()));
                    }
                }
                cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
            }
        }
        if msg.msg_flags & libc::MSG_CTRUNC != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "descriptors were dropped (control message truncated)",
            ));
        }
        return Ok(n as usize);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn descriptors_arrive_with_their_message() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut f1 = tempfile::tempfile().unwrap();
        f1.write_all(b"one").unwrap();
        let mut f2 = tempfile::tempfile().unwrap();
        f2.write_all(b"two").unwrap();
        send_with_fds(a.as_fd(), b"hello", &[f1.as_fd(), f2.as_fd()]).unwrap();
        let mut buf = [0u8; 16];
        let mut fds = Vec::new();
        let n = recv_with_fds(b.as_fd(), &mut buf, &mut fds).unwrap();
        assert_eq!(&buf[..n], b"hello");
        assert_eq!(fds.len(), 2);
        let mut got = String::new();
        let mut file = std::fs::File::from(fds.remove(1));
        use std::io::Seek;
        file.seek(std::io::SeekFrom::Start(0)).unwrap();
        file.read_to_string(&mut got).unwrap();
        assert_eq!(got, "two");
        // Without descriptors it is a plain message.
        send_with_fds(a.as_fd(), b"x", &[]).unwrap();
        let mut fds = Vec::new();
        assert_eq!(recv_with_fds(b.as_fd(), &mut buf, &mut fds).unwrap(), 1);
        assert!(fds.is_empty());
        drop(a);
        assert_eq!(recv_with_fds(b.as_fd(), &mut buf, &mut fds).unwrap(), 0);
    }
}
