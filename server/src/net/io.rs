//! Glue between glommio's sockets and hyper 1.x.
//!
//! hyper reads and writes through its own `rt::Read`/`rt::Write` traits; glommio's
//! `TcpStream` implements the `futures` `AsyncRead`/`AsyncWrite` ones. This wrapper forwards
//! from one to the other, as glommio's hyper example does for hyper 0.14.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_lite::{AsyncRead, AsyncWrite};
use glommio::net::TcpStream;
use hyper::rt::ReadBufCursor;

/// A socket (or a TLS stream over one) as hyper's I/O.
pub struct HyperStream<S = TcpStream>(pub S);

impl<S: AsyncRead + Unpin> hyper::rt::Read for HyperStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        // SAFETY: the bytes are zeroed here before being handed to `poll_read` as an
        // initialised slice, and only `n` of them, which `poll_read` reports it wrote, are
        // marked filled.
        let slot = unsafe { buf.as_mut() };
        for b in slot.iter_mut() {
            b.write(0);
        }
        // SAFETY: every element was initialised by the loop above.
        let init: &mut [u8] =
            unsafe { std::slice::from_raw_parts_mut(slot.as_mut_ptr().cast::<u8>(), slot.len()) };
        match Pin::new(&mut self.0).poll_read(cx, init) {
            Poll::Ready(Ok(n)) => {
                // SAFETY: `n` bytes were written by the read into the initialised slice.
                unsafe { buf.advance(n) };
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncWrite + Unpin> hyper::rt::Write for HyperStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_close(cx)
    }
}
