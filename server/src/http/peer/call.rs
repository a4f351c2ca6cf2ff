//! Asking other members' local admin API (`/admin/v1/local/...`) as this node: one member
//! ([`ask`], [`ask_within`]) or every member at once ([`ask_all`]), each with a deadline that
//! covers connecting, sending and the whole answer.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Method;
use serde::de::DeserializeOwned;
use yutu_api::admin::LOCAL_PREFIX;
use yutu_api::cluster::{Member, FORWARDED_HEADER};

use super::forward;
use crate::cluster::Cluster;

/// How long a member may take to answer its part.
pub const MEMBER_TIMEOUT: Duration = Duration::from_secs(30);

/// Sends `method LOCAL_PREFIX/call` with `body` to `member`, as this node.
pub async fn ask<T: DeserializeOwned>(
    cluster: &Cluster,
    member: &Member,
    method: Method,
    call: &str,
    body: Option<Vec<u8>>,
) -> Result<T, String> {
    ask_within(cluster, member, method, call, body, MEMBER_TIMEOUT).await
}

/// [`ask`], given up on after `deadline` in all (connecting, sending, the answer).
pub async fn ask_within<T: DeserializeOwned>(
    cluster: &Cluster,
    member: &Member,
    method: Method,
    call: &str,
    body: Option<Vec<u8>>,
    deadline: Duration,
) -> Result<T, String> {
    let work = async {
        ask_once(cluster, member, method, call, body, deadline)
            .await
            .map_err(|e| glommio::GlommioError::<()>::IoError(std::io::Error::other(e)))
    };
    match glommio::timer::timeout(deadline, work).await {
        Ok(answer) => Ok(answer),
        Err(glommio::GlommioError::TimedOut(_)) => Err(format!("no answer within {deadline:?}")),
        Err(e) => Err(e.to_string()),
    }
}

async fn ask_once<T: DeserializeOwned>(
    cluster: &Cluster,
    member: &Member,
    method: Method,
    call: &str,
    body: Option<Vec<u8>>,
    deadline: Duration,
) -> Result<T, String> {
    let peer = forward::authority(&member.url).ok_or_else(|| format!("URL {}", member.url))?;
    let mut req = http::Request::builder()
        .method(method)
        .uri(format!("{LOCAL_PREFIX}{call}"))
        .body(match body {
            Some(b) => forward::bytes_body(Bytes::from(b)),
            None => forward::empty_body(),
        })
        .map_err(|e| e.to_string())?;
    let h = req.headers_mut();
    forward::set(h, "host", peer);
    forward::set(h, "content-type", "application/json");
    forward::set(h, FORWARDED_HEADER, &cluster.node);
    if let Some(token) = cluster.node_token() {
        forward::set(h, "authorization", &format!("Bearer {token}"));
    }
    let sender = forward::connect(peer).await.map_err(|e| e.to_string())?;
    let (head, body) = forward::exchange_raw(peer, sender, req, deadline, 16 << 20)
        .await
        .map_err(|e| e.to_string())?;
    if !head.status.is_success() {
        return Err(format!(
            "answered {}: {}",
            head.status,
            String::from_utf8_lossy(&body)
                .chars()
                .take(200)
                .collect::<String>()
        ));
    }
    serde_json::from_slice(&body).map_err(|e| format!("unreadable answer: {e}"))
}

/// Every member's answer to `call`, in member order (`Err` for one that failed), each given
/// up on after `deadline`.
pub async fn ask_all<T: DeserializeOwned>(
    cluster: &Arc<Cluster>,
    members: &[Member],
    method: Method,
    call: &str,
    body: Option<Vec<u8>>,
    deadline: Duration,
) -> Vec<Result<T, String>> {
    let calls = members
        .iter()
        .map(|m| ask_within::<T>(cluster, m, method.clone(), call, body.clone(), deadline));
    futures::future::join_all(calls).await
}
