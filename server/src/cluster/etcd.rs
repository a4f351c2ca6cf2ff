//! A small etcd v3 client over etcd's JSON gateway (`POST /v3/kv/range` and friends).
//!
//! Why not the `etcd-client` crate: it speaks gRPC through tonic, so building the node would
//! need `protoc` and a tokio runtime next to glommio's executors. The node needs seven calls
//! (grant, keep-alive, revoke, put, range, transaction, delete), all of which etcd serves as
//! JSON on its client port (the gateway is on by default since etcd 3.3), so they go over the
//! node's own glommio HTTP client with a deadline on every call. Keys and values are base64 in
//! the gateway's JSON and 64-bit integers are strings.

use std::time::Duration;

use base64::Engine as _;
use serde_json::{json, Value};

use crate::net::client::{Client, ClientError};

/// Longest one etcd call may take before the next endpoint is tried (the agent uses less
/// with a short lease TTL).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    #[error("etcd is unreachable ({0})")]
    Unreachable(String),
    #[error("etcd answered {status}: {message}")]
    Status { status: u16, message: String },
    #[error("etcd sent an answer Yutu cannot read: {0}")]
    Answer(String),
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn unb64(v: &Value) -> Result<Vec<u8>, EtcdError> {
    let s = v.as_str().unwrap_or("");
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .map_err(|e| EtcdError::Answer(format!("bad base64: {e}")))
}

/// A gateway integer: a string of digits (or, leniently, a JSON number); absent means 0.
fn int(v: Option<&Value>) -> i64 {
    match v {
        Some(Value::String(s)) => s.parse().unwrap_or(0),
        Some(Value::Number(n)) => n.as_i64().unwrap_or(0),
        _ => 0,
    }
}

/// One key read from etcd.
#[derive(Debug, Clone)]
pub struct KeyValue {
    pub key: String,
    pub value: Vec<u8>,
}

/// A range answer of the gateway: the store's revision and the keys (UTF-8) with their
/// values. Public for the fuzz target: etcd's bytes are not trusted either.
pub fn parse_range(v: &Value) -> Result<(i64, Vec<KeyValue>), EtcdError> {
    let revision = int(v.get("header").and_then(|h| h.get("revision")));
    let mut out = Vec::new();
    for kv in v.get("kvs").and_then(Value::as_array).into_iter().flatten() {
        let key = String::from_utf8(unb64(kv.get("key").unwrap_or(&Value::Null))?)
            .map_err(|_| EtcdError::Answer("a key is not UTF-8".into()))?;
        out.push(KeyValue {
            key,
            value: unb64(kv.get("value").unwrap_or(&Value::Null))?,
        });
    }
    Ok((revision, out))
}

/// Clients to each endpoint; a call goes to the one that answered last and moves on to the
/// next after a failure.
pub struct Etcd {
    endpoints: Vec<String>,
    clients: Vec<Option<Client>>,
    current: usize,
    timeout: Duration,
}

impl Etcd {
    pub fn new(endpoints: &[String]) -> Etcd {
        Self::with_timeout(endpoints, CALL_TIMEOUT)
    }

    pub fn with_timeout(endpoints: &[String], timeout: Duration) -> Etcd {
        Etcd {
            endpoints: endpoints.to_vec(),
            clients: endpoints.iter().map(|_| None).collect(),
            current: 0,
            timeout,
        }
    }

    async fn call(&mut self, path: &str, body: Value) -> Result<Value, EtcdError> {
        let body = serde_json::to_vec(&body).map_err(|e| EtcdError::Answer(e.to_string()))?;
        let mut last = String::from("no endpoint");
        for attempt in 0..self.endpoints.len() {
            let i = (self.current + attempt) % self.endpoints.len();
            let client = match &mut self.clients[i] {
                Some(c) => c,
                slot => match Client::new(&self.endpoints[i], self.timeout) {
                    Ok(c) => slot.insert(c),
                    Err(e) => {
                        last = e.to_string();
                        continue;
                    }
                },
            };
            match client
                .send(http::Method::POST, path, Some(body.clone()))
                .await
            {
                Ok(reply) if reply.status == 200 => {
                    self.current = i;
                    // Streaming calls (keep-alive) answer newline-separated documents.
                    let first = reply
                        .body
                        .split(|b| *b == b'\n')
                        .find(|l| !l.is_empty())
                        .unwrap_or(&[]);
                    return serde_json::from_slice(first)
                        .map_err(|e| EtcdError::Answer(e.to_string()));
                }
                Ok(reply) => {
                    return Err(EtcdError::Status {
                        status: reply.status,
                        message: String::from_utf8_lossy(&reply.body)
                            .chars()
                            .take(300)
                            .collect(),
                    })
                }
                Err(e @ (ClientError::Connect { .. } | ClientError::Timeout)) => {
                    last = format!("{}: {e}", self.endpoints[i]);
                    self.clients[i] = None;
                }
                Err(e) => {
                    last = format!("{}: {e}", self.endpoints[i]);
                    self.clients[i] = None;
                }
            }
        }
        Err(EtcdError::Unreachable(last))
    }

    /// A new lease of `ttl` seconds; its id.
    pub async fn grant(&mut self, ttl: u64) -> Result<i64, EtcdError> {
        let v = self.call("/v3/lease/grant", json!({ "TTL": ttl })).await?;
        match int(v.get("ID")) {
            0 => Err(EtcdError::Answer(format!("no lease id in {v}"))),
            id => Ok(id),
        }
    }

    /// Renews a lease; `None` when it has expired (etcd forgot it).
    pub async fn keep_alive(&mut self, lease: i64) -> Result<Option<u64>, EtcdError> {
        let v = self
            .call("/v3/lease/keepalive", json!({ "ID": lease.to_string() }))
            .await?;
        let result = v.get("result").unwrap_or(&v);
        match int(result.get("TTL")) {
            ttl if ttl > 0 => Ok(Some(ttl as u64)),
            _ => Ok(None),
        }
    }

    pub async fn revoke(&mut self, lease: i64) -> Result<(), EtcdError> {
        self.call("/v3/lease/revoke", json!({ "ID": lease.to_string() }))
            .await
            .map(|_| ())
    }

    /// Writes `key`, attached to `lease` if given.
    pub async fn put(
        &mut self,
        key: &str,
        value: &[u8],
        lease: Option<i64>,
    ) -> Result<(), EtcdError> {
        let mut body = json!({ "key": b64(key.as_bytes()), "value": b64(value) });
        if let Some(l) = lease {
            body["lease"] = json!(l.to_string());
        }
        self.call("/v3/kv/put", body).await.map(|_| ())
    }

    /// Every key under `prefix`, and the store's revision.
    pub async fn range_prefix(&mut self, prefix: &str) -> Result<(i64, Vec<KeyValue>), EtcdError> {
        let v = self
            .call(
                "/v3/kv/range",
                json!({
                    "key": b64(prefix.as_bytes()),
                    "range_end": b64(&yutu_api::cluster::etcd_prefix_end(prefix.as_bytes())),
                }),
            )
            .await?;
        parse_range(&v)
    }

    /// One key's value.
    pub async fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>, EtcdError> {
        let v = self
            .call("/v3/kv/range", json!({ "key": b64(key.as_bytes()) }))
            .await?;
        match v
            .get("kvs")
            .and_then(Value::as_array)
            .and_then(|a| a.first())
        {
            Some(kv) => Ok(Some(unb64(&kv["value"])?)),
            None => Ok(None),
        }
    }

    /// One transaction: `put` on `key` only if `compare` (one etcd comparison, without its
    /// key) holds; whether it was written.
    async fn put_if(
        &mut self,
        key: &str,
        mut compare: Value,
        mut put: Value,
    ) -> Result<bool, EtcdError> {
        let k = b64(key.as_bytes());
        compare["key"] = json!(k);
        put["key"] = json!(k);
        let v = self
            .call(
                "/v3/kv/txn",
                json!({ "compare": [compare], "success": [{ "request_put": put }] }),
            )
            .await?;
        Ok(v.get("succeeded").and_then(Value::as_bool).unwrap_or(false))
    }

    /// Writes `key` only if it does not exist (one transaction); whether it was written.
    pub async fn create(&mut self, key: &str, value: &[u8]) -> Result<bool, EtcdError> {
        let absent = json!({ "target": "CREATE", "create_revision": "0" });
        self.put_if(key, absent, json!({ "value": b64(value) }))
            .await
    }

    /// Replaces `key`'s value only if it is still `old` (one transaction); whether it was
    /// written. A key deleted meanwhile is not written again.
    pub async fn replace(&mut self, key: &str, old: &[u8], new: &[u8]) -> Result<bool, EtcdError> {
        let same = json!({ "target": "VALUE", "value": b64(old) });
        self.put_if(key, same, json!({ "value": b64(new) })).await
    }

    /// Writes `key` attached to `lease` only if it does not exist (one transaction); whether
    /// it was written.
    pub async fn create_leased(
        &mut self,
        key: &str,
        value: &[u8],
        lease: i64,
    ) -> Result<bool, EtcdError> {
        let absent = json!({ "target": "CREATE", "create_revision": "0" });
        let put = json!({ "value": b64(value), "lease": lease.to_string() });
        self.put_if(key, absent, put).await
    }

    /// Deletes `key`; whether it existed.
    pub async fn delete(&mut self, key: &str) -> Result<bool, EtcdError> {
        let v = self
            .call("/v3/kv/deleterange", json!({ "key": b64(key.as_bytes()) }))
            .await?;
        Ok(int(v.get("deleted")) > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_are_strings_or_numbers() {
        assert_eq!(int(Some(&json!("42"))), 42);
        assert_eq!(int(Some(&json!(7))), 7);
        assert_eq!(int(None), 0);
        assert_eq!(int(Some(&json!("x"))), 0);
    }
}
