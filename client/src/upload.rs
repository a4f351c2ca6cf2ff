//! Guarding a streamed upload body against a length mismatch.
//!
//! A PUT declares its `Content-Length` before the first byte is sent. If the source then
//! yields fewer bytes (a file truncated while we read it, a pipe that closed early), the
//! server would wait for the rest; if it yields more, the extra bytes would be read as the
//! next request. [`ExactLength`] sends exactly the declared number of bytes and turns a short
//! source into an `UnexpectedEof` error, which aborts the request.

use std::io::{self, Read};

/// Reads exactly `remaining` bytes from `inner`, or fails.
pub(crate) struct ExactLength<R> {
    inner: R,
    remaining: u64,
}

impl<R: Read> ExactLength<R> {
    pub(crate) fn new(inner: R, len: u64) -> Self {
        ExactLength {
            inner,
            remaining: len,
        }
    }
}

impl<R: Read> Read for ExactLength<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.remaining == 0 || buf.is_empty() {
            return Ok(0);
        }
        let want = buf
            .len()
            .min(usize::try_from(self.remaining).unwrap_or(usize::MAX));
        let n = loop {
            match self.inner.read(&mut buf[..want]) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => break other?,
            }
        };
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "upload body ended {} bytes before its declared length",
                    self.remaining
                ),
            ));
        }
        self.remaining -= n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stops_at_the_declared_length() {
        let mut out = Vec::new();
        ExactLength::new(&b"hello world"[..], 5)
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, b"hello");
    }

    #[test]
    fn exact_source_is_fine() {
        let mut out = Vec::new();
        ExactLength::new(&b"abc"[..], 3)
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, b"abc");
        let mut out = Vec::new();
        ExactLength::new(&b""[..], 0).read_to_end(&mut out).unwrap();
        assert!(out.is_empty());
    }

    #[test]
    fn short_source_fails() {
        let mut out = Vec::new();
        let err = ExactLength::new(&b"abc"[..], 4)
            .read_to_end(&mut out)
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }
}
