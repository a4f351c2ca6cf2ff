//! Sending a request on to another node of the cluster, and reading its whole answer.
//!
//! Connections to peers are pooled per shard (this is thread-per-core: each shard has its own
//! pool, no lock), at most [`POOL_PER_PEER`] idle per peer. Connecting has its own short
//! deadline, separate from the exchange's, so that a dead owner is passed over at once and the
//! next owner tried: a refused connection (a killed node) fails in microseconds, a silent host
//! in [`CONNECT_TIMEOUT`].

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use glommio::net::TcpStream;
use http::{header, HeaderMap, HeaderName, Response};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::client::conn::http1::SendRequest;

use crate::http::Resp;
use crate::net::io::HyperStream;

/// The body of a forwarded request: the client's, streamed through, or bytes in hand.
pub type ProxyBody = UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// Longest wait for a peer to accept a connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Idle connections kept per peer and shard.
const POOL_PER_PEER: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// The peer could not be reached: nothing was sent, the next owner may be tried.
    #[error("cannot reach {peer}: {reason}")]
    Unreachable { peer: String, reason: String },
    /// The exchange failed after the request went out: it may or may not have been applied.
    #[error("{peer} failed during the request: {reason}")]
    Failed { peer: String, reason: String },
}

thread_local! {
    static POOL: RefCell<HashMap<String, Vec<SendRequest<ProxyBody>>>> = RefCell::new(HashMap::new());
}

/// `host:port` of a member's `http://` URL.
pub fn authority(url: &str) -> Option<&str> {
    url.strip_prefix("http://")
        .map(|rest| rest.split('/').next().unwrap_or(rest))
        .filter(|a| !a.is_empty())
}

pub fn empty_body() -> ProxyBody {
    Empty::<Bytes>::new()
        .map_err(|never| match never {})
        .boxed_unsync()
}

pub fn bytes_body(data: Bytes) -> ProxyBody {
    Full::new(data)
        .map_err(|never| match never {})
        .boxed_unsync()
}

pub fn incoming_body(body: hyper::body::Incoming) -> ProxyBody {
    body.map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)
        .boxed_unsync()
}

/// A connection to `peer` (`host:port`): an idle pooled one, or a new one.
pub async fn connect(peer: &str) -> Result<SendRequest<ProxyBody>, ForwardError> {
    let pooled = POOL.with(|p| {
        let mut p = p.borrow_mut();
        let idle = p.get_mut(peer)?;
        while let Some(s) = idle.pop() {
            if !s.is_closed() {
                return Some(s);
            }
        }
        None
    });
    if let Some(s) = pooled {
        return Ok(s);
    }
    let unreachable = |reason: String| ForwardError::Unreachable {
        peer: peer.to_string(),
        reason,
    };
    let stream = glommio::timer::timeout(CONNECT_TIMEOUT, async {
        TcpStream::connect(peer)
            .await
            .map_err(|e| glommio::GlommioError::<()>::IoError(std::io::Error::other(e.to_string())))
    })
    .await
    .map_err(|e| match e {
        glommio::GlommioError::TimedOut(_) => unreachable("connect timed out".into()),
        other => unreachable(other.to_string()),
    })?;
    let _ = stream.set_nodelay(true);
    let (sender, conn) = hyper::client::conn::http1::handshake(HyperStream(stream))
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    glommio::spawn_local(async move {
        let _ = conn.await;
    })
    .detach();
    Ok(sender)
}

fn release(peer: &str, sender: SendRequest<ProxyBody>) {
    if sender.is_closed() {
        return;
    }
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        let idle = p.entry(peer.to_string()).or_default();
        if idle.len() < POOL_PER_PEER {
            idle.push(sender);
        }
    });
}

/// Headers that describe one connection, not the message: never passed on.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    // The client's 100-continue was answered by this node already.
    "expect",
];

/// The client's headers, less the hop-by-hop ones.
pub fn end_to_end(headers: &HeaderMap) -> HeaderMap {
    let mut out = headers.clone();
    for h in HOP_BY_HOP {
        out.remove(*h);
    }
    out
}

/// Sends `req` on `sender` and reads the answer (at most `max_body` bytes of body) within
/// `timeout`, as a response to pass on to the client.
pub async fn exchange(
    peer: &str,
    sender: SendRequest<ProxyBody>,
    req: http::Request<ProxyBody>,
    timeout: Duration,
    max_body: u64,
) -> Result<Resp, ForwardError> {
    let (parts, body) = exchange_raw(peer, sender, req, timeout, max_body).await?;
    let mut resp = Response::builder().status(parts.status);
    if let Some(h) = resp.headers_mut() {
        for (name, value) in parts.headers.iter() {
            if !HOP_BY_HOP.contains(&name.as_str()) && name != header::CONTENT_LENGTH {
                h.append(name.clone(), value.clone());
            }
        }
        // A HEAD answer has no body but the object's length.
        if let Some(len) = parts.headers.get(header::CONTENT_LENGTH) {
            h.insert(header::CONTENT_LENGTH, len.clone());
        }
    }
    resp.body(Full::new(body))
        .map_err(|e| ForwardError::Failed {
            peer: peer.to_string(),
            reason: format!("cannot rebuild the answer: {e}"),
        })
}

/// [`exchange`], answering the response head and body as they came.
pub async fn exchange_raw(
    peer: &str,
    mut sender: SendRequest<ProxyBody>,
    req: http::Request<ProxyBody>,
    timeout: Duration,
    max_body: u64,
) -> Result<(http::response::Parts, Bytes), ForwardError> {
    let failed = |reason: String| ForwardError::Failed {
        peer: peer.to_string(),
        reason,
    };
    let work = async {
        sender
            .ready()
            .await
            .map_err(|e| failed(format!("connection not ready: {e}")))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| failed(e.to_string()))?;
        let (parts, body) = resp.into_parts();
        let body = http_body_util::Limited::new(body, max_body.min(usize::MAX as u64) as usize)
            .collect()
            .await
            .map_err(|e| failed(format!("answer body: {e}")))?
            .to_bytes();
        Ok::<_, ForwardError>((parts, body))
    };
    let result = glommio::timer::timeout(timeout, async {
        work.await
            .map_err(|e| glommio::GlommioError::<()>::IoError(std::io::Error::other(e.to_string())))
    })
    .await;
    let (parts, body) = match result {
        Ok(x) => x,
        Err(glommio::GlommioError::TimedOut(_)) => {
            return Err(failed(format!("no answer within {timeout:?}")))
        }
        Err(e) => return Err(failed(e.to_string())),
    };
    release(peer, sender);
    Ok((parts, body))
}

/// Adds a header by name (for names only known at run time).
pub fn set(headers: &mut HeaderMap, name: &'static str, value: &str) {
    if let Ok(v) = http::HeaderValue::from_str(value) {
        headers.insert(HeaderName::from_static(name), v);
    }
}
