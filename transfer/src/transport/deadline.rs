//! Blocking socket I/O under one deadline for a whole exchange.
//!
//! A socket timeout bounds one `read` or `write` call, not an exchange: a peer that sends one
//! byte just before each timeout keeps a `read_exact` going for as long as it likes. Talking
//! to an address nobody has vouched for yet (a proof challenge) must end in bounded time
//! whatever the other end does, so each call here gets only the time that is left.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// When an exchange must be over.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Deadline(Instant);

impl Deadline {
    pub(crate) fn after(timeout: Duration) -> Deadline {
        Deadline(Instant::now() + timeout)
    }

    /// The time left; `TimedOut` once there is none (a zero socket timeout would mean "block
    /// forever", and zero durations are refused by the socket calls anyway).
    pub(crate) fn left(&self) -> io::Result<Duration> {
        let left = self.0.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"));
        }
        Ok(left)
    }
}

/// A stream whose blocking calls can be bounded.
pub(crate) trait Timed: Read + Write {
    fn set_read_limit(&self, limit: Duration) -> io::Result<()>;
    fn set_write_limit(&self, limit: Duration) -> io::Result<()>;
}

impl Timed for TcpStream {
    fn set_read_limit(&self, limit: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(limit))
    }
    fn set_write_limit(&self, limit: Duration) -> io::Result<()> {
        self.set_write_timeout(Some(limit))
    }
}

impl Timed for UnixStream {
    fn set_read_limit(&self, limit: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(limit))
    }
    fn set_write_limit(&self, limit: Duration) -> io::Result<()> {
        self.set_write_timeout(Some(limit))
    }
}

/// Fills `buf`, or fails once `deadline` passes (`TimedOut`) or the stream ends first.
pub(crate) fn read_exact<S: Timed>(
    s: &mut S,
    buf: &mut [u8],
    deadline: Deadline,
) -> io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        s.set_read_limit(deadline.left()?)?;
        match s.read(&mut buf[filled..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "no answer in time"))
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes all of `buf`, or fails once `deadline` passes.
pub(crate) fn write_all<S: Timed>(s: &mut S, mut buf: &[u8], deadline: Deadline) -> io::Result<()> {
    while !buf.is_empty() {
        s.set_write_limit(deadline.left()?)?;
        match s.write(buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "could not send in time",
                ))
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer that trickles bytes cannot stretch a read past the deadline.
    #[test]
    fn a_trickling_peer_cannot_stretch_the_deadline() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let writer = std::thread::spawn(move || {
            for _ in 0..40 {
                if b.write_all(&[1]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let started = Instant::now();
        let mut buf = [0u8; 40];
        let err = read_exact(
            &mut a,
            &mut buf,
            Deadline::after(Duration::from_millis(300)),
        )
        .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        // 40 bytes at 50 ms each would take 2 s; per-call timeouts alone would wait for them.
        assert!(started.elapsed() < Duration::from_millis(1500));
        drop(a);
        writer.join().unwrap();
    }

    #[test]
    fn a_passed_deadline_fails_at_once() {
        let (mut a, _b) = UnixStream::pair().unwrap();
        let passed = Deadline::after(Duration::ZERO);
        let err = write_all(&mut a, b"x", passed).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        let err = read_exact(&mut a, &mut [0u8; 1], passed).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    }
}
