//! A small HTTP/1.1 client on glommio, for the node's own outgoing calls (publishing KV events
//! to the conductor). It reuses hyper's client connection over the same socket adapter the
//! server uses, keeps one connection alive and reconnects after an error.

use std::time::Duration;

use bytes::Bytes;
use glommio::net::TcpStream;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;

use super::io::HyperStream;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("invalid URL {0:?}: only http://host:port[/path] is supported")]
    Url(String),
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("HTTP error: {0}")]
    Http(#[from] hyper::Error),
    #[error("the request timed out")]
    Timeout,
    #[error("cannot build the request: {0}")]
    Request(#[from] http::Error),
    #[error("the answer could not be read within the size limit: {0}")]
    TooLarge(String),
}

/// The most the node reads of an answer to its own calls.
pub const MAX_REPLY_BYTES: usize = 1 << 20;

/// A response, fully read.
pub struct Reply {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

/// An answer whose body is read as it arrives (etcd's watch): one call's connection, not
/// reused afterwards.
pub struct Streaming {
    pub status: u16,
    body: hyper::body::Incoming,
}

impl Streaming {
    /// The body's next bytes, waiting at most `wait`; `Ok(None)` at its end. A read that
    /// times out loses nothing (the next one gets the bytes), so a caller may wait in short
    /// slices to check for its own stop.
    pub async fn next_chunk(&mut self, wait: Duration) -> Result<Option<Bytes>, ClientError> {
        loop {
            let frame = within(wait, async { Ok(self.body.frame().await) }).await?;
            match frame {
                None => return Ok(None),
                Some(Err(e)) => return Err(ClientError::Http(e)),
                Some(Ok(f)) => {
                    if let Ok(data) = f.into_data() {
                        return Ok(Some(data));
                    }
                    // A trailers frame: nothing to hand on.
                }
            }
        }
    }
}

/// `f`, or [`ClientError::Timeout`] after `d`.
async fn within<T>(
    d: Duration,
    f: impl std::future::Future<Output = Result<T, ClientError>>,
) -> Result<T, ClientError> {
    futures_lite::future::or(f, async {
        glommio::timer::sleep(d).await;
        Err(ClientError::Timeout)
    })
    .await
}

/// One keep-alive connection to one `http://host:port` base URL.
pub struct Client {
    authority: String,
    base_path: String,
    sender: Option<SendRequest<Full<Bytes>>>,
    timeout: Duration,
    /// `Authorization` sent with every request (a bearer token), if any.
    authorization: Option<http::HeaderValue>,
    /// The most of an answer's body read ([`MAX_REPLY_BYTES`] unless raised).
    max_reply: usize,
}

impl Client {
    pub fn new(base: &str, timeout: Duration) -> Result<Client, ClientError> {
        let rest = base
            .strip_prefix("http://")
            .ok_or_else(|| ClientError::Url(base.to_string()))?;
        let (authority, path) = match rest.split_once('/') {
            Some((a, p)) => (a, format!("/{}", p.trim_end_matches('/'))),
            None => (rest, String::new()),
        };
        if authority.is_empty() {
            return Err(ClientError::Url(base.to_string()));
        }
        Ok(Client {
            authority: authority.to_string(),
            base_path: if path == "/" { String::new() } else { path },
            sender: None,
            timeout,
            authorization: None,
            max_reply: MAX_REPLY_BYTES,
        })
    }

    /// Reads answers of up to `bytes` (objects copied between nodes).
    pub fn with_max_reply(mut self, bytes: usize) -> Client {
        self.max_reply = bytes;
        self
    }

    /// Sends `token` as `Authorization: Bearer` with every request.
    pub fn with_bearer(mut self, token: &str) -> Result<Client, ClientError> {
        let mut value = http::HeaderValue::from_str(&format!("Bearer {}", token.trim()))
            .map_err(|_| ClientError::Url("the bearer token is not a valid header value".into()))?;
        value.set_sensitive(true);
        self.authorization = Some(value);
        Ok(self)
    }

    async fn connect(&mut self) -> Result<SendRequest<Full<Bytes>>, ClientError> {
        let stream =
            TcpStream::connect(&self.authority)
                .await
                .map_err(|e| ClientError::Connect {
                    addr: self.authority.clone(),
                    source: std::io::Error::other(e.to_string()),
                })?;
        let _ = stream.set_nodelay(true);
        let (sender, conn) = hyper::client::conn::http1::handshake(HyperStream(stream)).await?;
        glommio::spawn_local(async move {
            let _ = conn.await;
        })
        .detach();
        Ok(sender)
    }

    /// Sends `method path` with a JSON body (or none) and reads the whole answer.
    pub async fn send(
        &mut self,
        method: http::Method,
        path: &str,
        json: Option<Vec<u8>>,
    ) -> Result<Reply, ClientError> {
        let mut headers = http::HeaderMap::new();
        if json.is_some() {
            headers.insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
        }
        self.send_with(method, path, headers, Bytes::from(json.unwrap_or_default()))
            .await
    }

    /// POSTs a JSON body and returns once the answer's head has come (within the client's
    /// timeout), leaving its body to be read as it arrives.
    pub async fn open_stream(
        &mut self,
        path: &str,
        json: Vec<u8>,
    ) -> Result<Streaming, ClientError> {
        let mut sender = match self.sender.take() {
            Some(s) if !s.is_closed() => s,
            _ => self.connect().await?,
        };
        let req = http::Request::builder()
            .method(http::Method::POST)
            .uri(format!("{}{path}", self.base_path))
            .header(http::header::HOST, &self.authority)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(json)))?;
        let resp = within(self.timeout, async {
            sender.ready().await?;
            Ok(sender.send_request(req).await?)
        })
        .await?;
        Ok(Streaming {
            status: resp.status().as_u16(),
            body: resp.into_body(),
        })
    }

    /// Sends `method path` with these headers and body, and reads the whole answer.
    pub async fn send_with(
        &mut self,
        method: http::Method,
        path: &str,
        headers: http::HeaderMap,
        body: Bytes,
    ) -> Result<Reply, ClientError> {
        let mut sender = match self.sender.take() {
            Some(s) if !s.is_closed() => s,
            _ => self.connect().await?,
        };
        let mut req = http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base_path))
            .header(http::header::HOST, &self.authority);
        if let Some(h) = req.headers_mut() {
            h.extend(headers);
        }
        if let Some(auth) = &self.authorization {
            req = req.header(http::header::AUTHORIZATION, auth.clone());
        }
        let req = req.body(Full::new(body))?;
        let max_reply = self.max_reply;
        let exchange = async {
            sender.ready().await?;
            let resp = sender.send_request(req).await?;
            let status = resp.status().as_u16();
            let (parts, body) = resp.into_parts();
            // The conductor's answers are small JSON documents; a peer that sends more is
            // broken (or not the conductor), and is not read into memory.
            let body = http_body_util::Limited::new(body, max_reply)
                .collect()
                .await
                .map_err(|e| ClientError::TooLarge(e.to_string()))?
                .to_bytes();
            Ok::<_, ClientError>(Reply {
                status,
                headers: parts.headers,
                body,
            })
        };
        let reply = glommio::timer::timeout(self.timeout, async {
            exchange.await.map_err(|e| {
                glommio::GlommioError::<()>::IoError(std::io::Error::other(e.to_string()))
            })
        })
        .await
        .map_err(|e| match e {
            glommio::GlommioError::TimedOut(_) => ClientError::Timeout,
            other => ClientError::Connect {
                addr: self.authority.clone(),
                source: std::io::Error::other(other.to_string()),
            },
        })?;
        self.sender = Some(sender);
        Ok(reply)
    }
}
