//! The node's transport to etcd: its own glommio HTTP client ([`Client`]), with a deadline
//! on every call, speaking etcd's JSON gateway as [`yutu_etcd`] defines it. The requests,
//! the answers' parsing, the watch stream's decoding and the endpoint rotation are the
//! shared crate's (the conductor uses the same); this module only moves bytes.
//!
//! Why not the `etcd-client` crate: it speaks gRPC through tonic, so building the node would
//! need `protoc` and a tokio runtime next to glommio's executors (see [`yutu_etcd`]).

use std::time::{Duration, Instant};

pub use yutu_etcd::{parse_range, EtcdError, KeyValue};
use yutu_etcd::{Call, Endpoints, WatchDecoder, WatchResponse};

use crate::net::client::Client;

/// Longest one etcd call may take before the next endpoint is tried (the agent uses less
/// with a short lease TTL).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// Longest one read of a watch stream waits before the watcher checks whether to stop (the
/// stream itself stays open: an idle watch is a healthy one).
const WATCH_SLICE: Duration = Duration::from_millis(500);

/// Clients to each endpoint; a call goes to the one that answered last and moves on to the
/// next after a failure.
pub struct Etcd {
    /// The endpoints, or why they cannot be used (reported by every call).
    endpoints: Result<Endpoints, EtcdError>,
    clients: Vec<Option<Client>>,
    timeout: Duration,
}

impl Etcd {
    pub fn new(endpoints: &[String]) -> Etcd {
        Self::with_timeout(endpoints, CALL_TIMEOUT)
    }

    pub fn with_timeout(endpoints: &[String], timeout: Duration) -> Etcd {
        Etcd {
            endpoints: Endpoints::new(endpoints),
            clients: endpoints.iter().map(|_| None).collect(),
            timeout,
        }
    }

    /// The connection to endpoint `i`, made if there is none.
    fn client(&mut self, i: usize, url: &str) -> Result<&mut Client, EtcdError> {
        let timeout = self.timeout;
        let slot = self
            .clients
            .get_mut(i)
            .ok_or_else(|| EtcdError::Unreachable(format!("{url}: no client")))?;
        match slot {
            Some(c) => Ok(c),
            None => Client::new(url, timeout)
                .map(|c| slot.insert(c.with_max_reply(yutu_etcd::MAX_ANSWER_BYTES)))
                .map_err(|e| EtcdError::Unreachable(format!("{url}: {e}"))),
        }
    }

    /// Sends `call` to each endpoint in turn, starting with the one that answered last; the
    /// first 200's body. A non-200 answer is etcd's word and is not retried elsewhere.
    async fn call(&mut self, call: Call) -> Result<bytes::Bytes, EtcdError> {
        let order: Vec<(usize, String)> = match &self.endpoints {
            Ok(e) => e.order().map(|(i, u)| (i, u.to_owned())).collect(),
            Err(e) => return Err(e.clone()),
        };
        let mut last = EtcdError::NoEndpoint;
        for (i, url) in order {
            let sent = match self.client(i, &url) {
                Ok(client) => {
                    client
                        .send(
                            http::Method::POST,
                            call.path,
                            Some(call.body.clone().into()),
                        )
                        .await
                }
                Err(e) => {
                    last = e;
                    continue;
                }
            };
            match sent {
                Ok(reply) if reply.status == 200 => {
                    if let Ok(e) = &self.endpoints {
                        e.answered(i);
                    }
                    return Ok(reply.body);
                }
                Ok(reply) => return Err(EtcdError::status(reply.status, &reply.body)),
                Err(e) => {
                    last = EtcdError::Unreachable(format!("{url}: {e}"));
                    self.clients[i] = None;
                }
            }
        }
        Err(last)
    }

    /// A new lease of `ttl` seconds; its id.
    pub async fn grant(&mut self, ttl: u64) -> Result<i64, EtcdError> {
        yutu_etcd::parse_grant(&self.call(Call::grant(ttl)).await?)
    }

    /// Renews a lease; `None` when it has expired (etcd forgot it).
    pub async fn keep_alive(&mut self, lease: i64) -> Result<Option<u64>, EtcdError> {
        yutu_etcd::parse_keep_alive(&self.call(Call::keep_alive(lease)).await?)
    }

    pub async fn revoke(&mut self, lease: i64) -> Result<(), EtcdError> {
        yutu_etcd::parse_ok(&self.call(Call::revoke(lease)).await?).map(|_| ())
    }

    /// Writes `key`, attached to `lease` if given.
    pub async fn put(
        &mut self,
        key: &str,
        value: &[u8],
        lease: Option<i64>,
    ) -> Result<(), EtcdError> {
        let call = Call::put(key.as_bytes(), value, lease);
        yutu_etcd::parse_ok(&self.call(call).await?).map(|_| ())
    }

    /// Every key under `prefix`, and the store's revision.
    pub async fn range_prefix(&mut self, prefix: &str) -> Result<(i64, Vec<KeyValue>), EtcdError> {
        let answer = parse_range(&self.call(Call::range_prefix(prefix.as_bytes(), 0)).await?)?;
        Ok((answer.revision, answer.kvs))
    }

    /// One key's value.
    pub async fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>, EtcdError> {
        let answer = parse_range(&self.call(Call::range_key(key.as_bytes())).await?)?;
        Ok(answer.kvs.into_iter().next().map(|kv| kv.value))
    }

    /// Writes `key` only if it does not exist (one transaction); whether it was written.
    pub async fn create(&mut self, key: &str, value: &[u8]) -> Result<bool, EtcdError> {
        yutu_etcd::parse_txn(&self.call(Call::create(key.as_bytes(), value)).await?)
    }

    /// Replaces `key`'s value only if it is still `old` (one transaction); whether it was
    /// written. A key deleted meanwhile is not written again.
    pub async fn replace(&mut self, key: &str, old: &[u8], new: &[u8]) -> Result<bool, EtcdError> {
        yutu_etcd::parse_txn(&self.call(Call::replace(key.as_bytes(), old, new)).await?)
    }

    /// Writes `key` attached to `lease` only if it does not exist (one transaction); whether
    /// it was written.
    pub async fn create_leased(
        &mut self,
        key: &str,
        value: &[u8],
        lease: i64,
    ) -> Result<bool, EtcdError> {
        let call = Call::create_leased(key.as_bytes(), value, lease);
        yutu_etcd::parse_txn(&self.call(call).await?)
    }

    /// Deletes `key`; whether it existed.
    pub async fn delete(&mut self, key: &str) -> Result<bool, EtcdError> {
        Ok(yutu_etcd::parse_delete(&self.call(Call::delete(key.as_bytes())).await?)? > 0)
    }

    /// Watches the keys under `prefix` from `start_revision`, handing each document of the
    /// stream to `on` until it returns `false`, the stream ends or breaks, `stopped` says so
    /// (checked at least every [`WATCH_SLICE`]), or `session` has passed. `Ok` when the
    /// stream was opened and ran; the endpoints are tried in turn to open it.
    pub async fn watch_prefix(
        &mut self,
        prefix: &str,
        start_revision: i64,
        session: Duration,
        stopped: impl Fn() -> bool,
        mut on: impl FnMut(WatchResponse) -> bool,
    ) -> Result<(), EtcdError> {
        let call = Call::watch_prefix(prefix.as_bytes(), start_revision);
        let order: Vec<(usize, String)> = match &self.endpoints {
            Ok(e) => e.order().map(|(i, u)| (i, u.to_owned())).collect(),
            Err(e) => return Err(e.clone()),
        };
        let until = Instant::now() + session;
        let mut last = EtcdError::NoEndpoint;
        for (i, url) in order {
            // A connection of its own: the stream holds it until it ends.
            let opened = match Client::new(&url, self.timeout) {
                Ok(mut c) => {
                    c.open_stream(call.path, call.body.clone().into_bytes())
                        .await
                }
                Err(e) => Err(e),
            };
            let mut stream = match opened {
                Ok(s) if s.status == 200 => s,
                Ok(s) => {
                    last = EtcdError::status(s.status, b"(a watch refused)");
                    continue;
                }
                Err(e) => {
                    last = EtcdError::Unreachable(format!("{url}: {e}"));
                    continue;
                }
            };
            if let Ok(e) = &self.endpoints {
                e.answered(i);
            }
            let mut decoder = WatchDecoder::default();
            while !stopped() {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(());
                }
                let chunk = match stream.next_chunk(left.min(WATCH_SLICE)).await {
                    Ok(Some(chunk)) => chunk,
                    Ok(None) => return Ok(()),
                    Err(crate::net::client::ClientError::Timeout) => continue,
                    Err(e) => return Err(EtcdError::Unreachable(format!("{url}: {e}"))),
                };
                for doc in decoder.push(&chunk)? {
                    if !on(doc) {
                        return Ok(());
                    }
                }
            }
            return Ok(());
        }
        Err(last)
    }
}
