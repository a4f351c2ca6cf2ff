//! A minimal keep-alive HTTP/1.1 client connection, the load generator's only way to talk to a
//! server.
//!
//! Hand-written rather than hyper's client because on a 2-core machine the load generator
//! competes with the server under test for CPU: a loop of "write the request, parse the head,
//! read Content-Length bytes into a reused buffer" is about the least work a client can do per
//! request, and every server sees exactly the same client (the ratio stays fair). It speaks only
//! what the benchmarks need: one request at a time per connection (no pipelining),
//! Content-Length or chunked response bodies, and reconnects after `Connection: close` or any
//! error.

use std::net::SocketAddr;

use anyhow::{anyhow, bail, Context as _};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// Read buffer size: holds any response head, and big enough that a 1 MiB body takes few reads.
const READ_BUF: usize = 256 * 1024;

/// Bodies up to this size are copied behind the request head so the request is one `write`.
const COALESCE_BODY: usize = 16 * 1024;

/// Most response header lines we accept; servers under test send a handful.
const MAX_HEADERS: usize = 64;

/// One client connection to one server, opened lazily and reopened after errors.
pub struct Conn {
    addr: SocketAddr,
    host: String,
    stream: Option<TcpStream>,
    /// Bytes read from the socket but not yet consumed are `buf[start..end]`.
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    /// The request being written, reused so the hot loop does not allocate.
    wbuf: Vec<u8>,
}

/// What the load generator checks about a response.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    /// Body bytes received (after de-chunking).
    pub body_len: u64,
    /// The body itself, only when the caller asked to keep it (verification, not load).
    pub body: Option<Vec<u8>>,
}

/// How the response body is delimited.
enum Framing {
    None,
    Length(u64),
    Chunked,
    UntilClose,
}

impl Conn {
    pub fn new(addr: SocketAddr) -> Self {
        Conn {
            addr,
            host: addr.to_string(),
            stream: None,
            buf: vec![0; READ_BUF].into_boxed_slice(),
            start: 0,
            end: 0,
            wbuf: Vec::with_capacity(COALESCE_BODY + 512),
        }
    }

    /// Sends one request and reads the whole response. On any error the connection is dropped,
    /// so the next request starts on a fresh one and a half-read response cannot poison it.
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        body: &[u8],
        keep_body: bool,
    ) -> anyhow::Result<Response> {
        let result = self.exchange(method, path, body, keep_body).await;
        if result.is_err() {
            self.reset();
        }
        result
    }

    /// Forgets the connection, e.g. after the caller timed a request out mid-way.
    pub fn reset(&mut self) {
        self.stream = None;
        self.start = 0;
        self.end = 0;
    }

    async fn exchange(
        &mut self,
        method: &str,
        path: &str,
        body: &[u8],
        keep_body: bool,
    ) -> anyhow::Result<Response> {
        if self.stream.is_none() {
            let stream = TcpStream::connect(self.addr)
                .await
                .with_context(|| format!("connecting to {}", self.addr))?;
            // The head and a large body go out in two writes; Nagle would hold the second back.
            stream.set_nodelay(true)?;
            self.stream = Some(stream);
            self.start = 0;
            self.end = 0;
        }
        self.write_request(method, path, body).await?;
        let (status, framing, close) = self.read_head(method).await?;
        let mut kept = keep_body.then(Vec::new);
        let body_len = match framing {
            Framing::None => 0,
            Framing::Length(n) => self.read_exact_body(n, &mut kept).await?,
            Framing::Chunked => self.read_chunked_body(&mut kept).await?,
            Framing::UntilClose => self.read_until_close(&mut kept).await?,
        };
        if close || matches!(framing, Framing::UntilClose) {
            self.reset();
        }
        Ok(Response {
            status,
            body_len,
            body: kept,
        })
    }

    async fn write_request(&mut self, method: &str, path: &str, body: &[u8]) -> anyhow::Result<()> {
        use std::io::Write as _;
        self.wbuf.clear();
        write!(
            self.wbuf,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\n",
            self.host
        )?;
        if !body.is_empty() || method == "PUT" || method == "POST" {
            write!(self.wbuf, "Content-Length: {}\r\n", body.len())?;
        }
        self.wbuf.extend_from_slice(b"\r\n");
        let small = body.len() <= COALESCE_BODY;
        if small {
            self.wbuf.extend_from_slice(body);
        }
        let stream = self
            .stream
            .as_mut()
            .ok_or_else(|| anyhow!("not connected"))?;
        stream.write_all(&self.wbuf).await?;
        if !small {
            stream.write_all(body).await?;
        }
        Ok(())
    }

    /// Reads more bytes into the buffer, compacting it first; fails on EOF.
    async fn fill(&mut self) -> anyhow::Result<()> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.end == self.buf.len() {
            if self.start == 0 {
                bail!("response head larger than {READ_BUF} bytes");
            }
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let stream = self
            .stream
            .as_mut()
            .ok_or_else(|| anyhow!("not connected"))?;
        let n = stream.read(&mut self.buf[self.end..]).await?;
        if n == 0 {
            bail!("connection closed by the server mid-response");
        }
        self.end += n;
        Ok(())
    }

    /// Parses the status line and headers, skipping interim 1xx responses.
    async fn read_head(&mut self, method: &str) -> anyhow::Result<(u16, Framing, bool)> {
        loop {
            let parsed = {
                let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
                let mut resp = httparse::Response::new(&mut headers);
                match resp.parse(&self.buf[self.start..self.end])? {
                    httparse::Status::Partial => None,
                    httparse::Status::Complete(len) => {
                        let status = resp.code.unwrap_or(0);
                        let mut length = None;
                        let mut chunked = false;
                        let mut close = resp.version == Some(0);
                        for h in resp.headers.iter() {
                            if h.name.eq_ignore_ascii_case("content-length") {
                                let v = std::str::from_utf8(h.value)?.trim();
                                length = Some(v.parse::<u64>().context("bad Content-Length")?);
                            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                                chunked = contains_token(h.value, "chunked");
                            } else if h.name.eq_ignore_ascii_case("connection") {
                                close = contains_token(h.value, "close");
                            }
                        }
                        let framing = if method == "HEAD"
                            || (100..200).contains(&status)
                            || status == 204
                            || status == 304
                        {
                            Framing::None
                        } else if chunked {
                            Framing::Chunked
                        } else if let Some(n) = length {
                            Framing::Length(n)
                        } else {
                            Framing::UntilClose
                        };
                        Some((len, status, framing, close))
                    }
                }
            };
            match parsed {
                None => self.fill().await?,
                Some((len, status, framing, close)) => {
                    self.start += len;
                    if (100..200).contains(&status) {
                        continue;
                    }
                    return Ok((status, framing, close));
                }
            }
        }
    }

    /// Consumes exactly `n` body bytes, keeping them if asked.
    async fn read_exact_body(&mut self, n: u64, kept: &mut Option<Vec<u8>>) -> anyhow::Result<u64> {
        let mut left = n;
        while left > 0 {
            if self.start == self.end {
                self.fill().await?;
            }
            let take = (self.end - self.start).min(usize::try_from(left).unwrap_or(usize::MAX));
            if let Some(k) = kept.as_mut() {
                k.extend_from_slice(&self.buf[self.start..self.start + take]);
            }
            self.start += take;
            left -= take as u64;
        }
        Ok(n)
    }

    /// Reads one CRLF-terminated line (chunk sizes, trailers) and returns it without the CRLF.
    async fn read_line(&mut self) -> anyhow::Result<String> {
        loop {
            let window = &self.buf[self.start..self.end];
            if let Some(pos) = window.windows(2).position(|w| w == b"\r\n") {
                let line = String::from_utf8_lossy(&window[..pos]).into_owned();
                self.start += pos + 2;
                return Ok(line);
            }
            self.fill().await?;
        }
    }

    async fn read_chunked_body(&mut self, kept: &mut Option<Vec<u8>>) -> anyhow::Result<u64> {
        let mut total = 0;
        loop {
            let line = self.read_line().await?;
            let size_text = line.split(';').next().unwrap_or("").trim();
            let size = u64::from_str_radix(size_text, 16)
                .with_context(|| format!("bad chunk size {size_text:?}"))?;
            if size == 0 {
                // Trailers, up to the empty line.
                while !self.read_line().await?.is_empty() {}
                return Ok(total);
            }
            total += self.read_exact_body(size, kept).await?;
            if !self.read_line().await?.is_empty() {
                bail!("chunk data not followed by CRLF");
            }
        }
    }

    async fn read_until_close(&mut self, kept: &mut Option<Vec<u8>>) -> anyhow::Result<u64> {
        let mut total = 0;
        loop {
            let avail = self.end - self.start;
            if let Some(k) = kept.as_mut() {
                k.extend_from_slice(&self.buf[self.start..self.end]);
            }
            total += avail as u64;
            self.start = 0;
            self.end = 0;
            let stream = self
                .stream
                .as_mut()
                .ok_or_else(|| anyhow!("not connected"))?;
            let n = stream.read(&mut self.buf[..]).await?;
            if n == 0 {
                return Ok(total);
            }
            self.end = n;
        }
    }
}

/// Whether a comma-separated header value lists `token` (case-insensitive).
fn contains_token(value: &[u8], token: &str) -> bool {
    value
        .split(|&b| b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    /// Serves canned responses, one per request head received, then closes.
    async fn canned(responses: Vec<&'static [u8]>) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.expect("accept");
            let mut buf = vec![0u8; 65536];
            for r in responses {
                // Requests in these tests have no body: wait for the end of the head.
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = s.read(&mut buf).await.expect("read");
                    if n == 0 {
                        return;
                    }
                    got.extend_from_slice(&buf[..n]);
                }
                s.write_all(r).await.expect("write");
            }
        });
        addr
    }

    #[tokio::test]
    async fn reads_length_and_chunked_bodies_on_one_connection() {
        let addr = canned(vec![
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n",
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
        ])
        .await;
        let mut c = Conn::new(addr);
        let r = c.request("GET", "/a", b"", true).await.expect("first");
        assert_eq!((r.status, r.body_len), (200, 5));
        assert_eq!(r.body.as_deref(), Some(&b"hello"[..]));
        let r = c.request("GET", "/b", b"", true).await.expect("second");
        assert_eq!((r.status, r.body_len), (200, 5));
        assert_eq!(r.body.as_deref(), Some(&b"abcde"[..]));
        let r = c.request("GET", "/c", b"", false).await.expect("third");
        assert_eq!((r.status, r.body_len), (204, 0));
    }

    #[tokio::test]
    async fn short_body_is_an_error() {
        let addr = canned(vec![b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort"]).await;
        let mut c = Conn::new(addr);
        assert!(c.request("GET", "/a", b"", false).await.is_err());
    }

    #[test]
    fn tokens() {
        assert!(contains_token(b"keep-alive, Close", "close"));
        assert!(!contains_token(b"keep-alive", "close"));
    }
}
