//! A small etcd v3 client over etcd's JSON gateway: the one call the conductor needs, reading
//! every key under a prefix (`POST /v3/kv/range`).
//!
//! Why not the `etcd-client` crate: it speaks gRPC through tonic, which would need `protoc` to
//! build, for a single read twice a second. etcd serves the same call as JSON on its client
//! port (the gateway is on by default since etcd 3.3), so it goes over `ureq`, the HTTP client
//! the conductor already uses for snapshots, on tokio's blocking pool. Keys and values are
//! base64 in the gateway's JSON, and 64-bit integers are strings.
//!
//! Every call has a deadline (a frozen etcd holds a connection open and answers nothing), the
//! answer is read up to a size bound, and the endpoints are tried in turn, starting with the
//! one that answered last.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine as _;
use serde::Deserialize;

/// Why etcd could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EtcdError {
    #[error("no etcd endpoint given")]
    NoEndpoint,
    #[error("etcd endpoint must be http://host:port or https://host:port, got {0:?}")]
    BadEndpoint(String),
    #[error("etcd is unreachable ({0})")]
    Unreachable(String),
    #[error("etcd answered {status}: {message}")]
    Status { status: u16, message: String },
    #[error("etcd sent an answer the conductor cannot read: {0}")]
    Answer(String),
}

impl EtcdError {
    /// A metric label.
    pub fn kind(&self) -> &'static str {
        match self {
            EtcdError::NoEndpoint | EtcdError::BadEndpoint(_) | EtcdError::Unreachable(_) => {
                "unreachable"
            }
            EtcdError::Status { .. } => "status",
            EtcdError::Answer(_) => "answer",
        }
    }
}

/// One key read from etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

/// The answer to a range read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeAnswer {
    /// The store's revision the read was served at.
    pub revision: i64,
    pub kvs: Vec<KeyValue>,
    /// More keys matched than the read's limit: `kvs` is not the whole range.
    pub more: bool,
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn unb64(s: &str) -> Result<Vec<u8>, EtcdError> {
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .map_err(|e| EtcdError::Answer(format!("bad base64: {e}")))
}

/// A gateway integer: a string of digits, or (leniently) a JSON number.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum GatewayInt {
    Text(String),
    Number(i64),
}

impl GatewayInt {
    fn value(&self) -> Result<i64, EtcdError> {
        match self {
            GatewayInt::Number(n) => Ok(*n),
            GatewayInt::Text(s) => s
                .parse()
                .map_err(|_| EtcdError::Answer(format!("{s:?} is not an integer"))),
        }
    }
}

#[derive(Debug, Deserialize)]
struct RawHeader {
    revision: Option<GatewayInt>,
}

#[derive(Debug, Deserialize)]
struct RawKv {
    key: String,
    /// Absent for an empty value (proto3 JSON leaves out defaults).
    #[serde(default)]
    value: String,
}

#[derive(Debug, Deserialize)]
struct RawRange {
    header: Option<RawHeader>,
    /// Absent when nothing matched.
    #[serde(default)]
    kvs: Vec<RawKv>,
    #[serde(default)]
    more: bool,
}

/// Parses the gateway's answer to `/v3/kv/range`.
pub fn parse_range(body: &[u8]) -> Result<RangeAnswer, EtcdError> {
    let raw: RawRange =
        serde_json::from_slice(body).map_err(|e| EtcdError::Answer(e.to_string()))?;
    let revision = match raw.header.and_then(|h| h.revision) {
        Some(r) => r.value()?,
        None => return Err(EtcdError::Answer("no header.revision".into())),
    };
    let kvs = raw
        .kvs
        .iter()
        .map(|kv| {
            Ok(KeyValue {
                key: unb64(&kv.key)?,
                value: unb64(&kv.value)?,
            })
        })
        .collect::<Result<_, EtcdError>>()?;
    Ok(RangeAnswer {
        revision,
        kvs,
        more: raw.more,
    })
}

/// Checks an endpoint and drops a trailing `/`.
fn endpoint(url: &str) -> Result<String, EtcdError> {
    let url = url.trim().trim_end_matches('/');
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"));
    let ok = rest.is_some_and(|r| !r.is_empty() && !r.contains('/'))
        && url.len() <= 2048
        && url.bytes().all(|b| b.is_ascii_graphic());
    if ok {
        Ok(url.to_owned())
    } else {
        Err(EtcdError::BadEndpoint(url.chars().take(80).collect()))
    }
}

/// A blocking client of one etcd cluster (call it from the blocking pool). Shared between
/// calls: it keeps its connections and remembers which endpoint answered last.
#[derive(Debug)]
pub struct EtcdClient {
    endpoints: Vec<String>,
    agent: ureq::Agent,
    /// The endpoint tried first: the one that answered last.
    current: AtomicUsize,
    max_answer_bytes: u64,
}

impl EtcdClient {
    /// A client of `endpoints` (tried in turn), with `timeout` for each call to one endpoint
    /// and answers of at most `max_answer_bytes`.
    pub fn new(
        endpoints: &[String],
        timeout: Duration,
        max_answer_bytes: u64,
    ) -> Result<EtcdClient, EtcdError> {
        if endpoints.is_empty() {
            return Err(EtcdError::NoEndpoint);
        }
        let endpoints = endpoints
            .iter()
            .map(|e| endpoint(e))
            .collect::<Result<Vec<_>, _>>()?;
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            // Non-2xx answers come back as answers, so their body can be reported.
            .http_status_as_error(false)
            .build()
            .into();
        Ok(EtcdClient {
            endpoints,
            agent,
            current: AtomicUsize::new(0),
            max_answer_bytes,
        })
    }

    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// Every key under `prefix` (at most `limit`; 0: no limit), and the revision.
    pub fn range_prefix(&self, prefix: &str, limit: u64) -> Result<RangeAnswer, EtcdError> {
        let mut body = serde_json::json!({
            "key": b64(prefix.as_bytes()),
            "range_end": b64(&yutu_api::cluster::etcd_prefix_end(prefix.as_bytes())),
        });
        if limit > 0 {
            body["limit"] = serde_json::json!(limit.to_string());
        }
        let answer = self.call("/v3/kv/range", &body.to_string())?;
        parse_range(&answer)
    }

    /// POSTs `body` to `path`, trying each endpoint in turn; the first 200's body.
    fn call(&self, path: &str, body: &str) -> Result<Vec<u8>, EtcdError> {
        let first = self.current.load(Ordering::Relaxed);
        let mut last = EtcdError::NoEndpoint;
        for attempt in 0..self.endpoints.len() {
            let i = (first + attempt) % self.endpoints.len();
            let url = format!("{}{path}", self.endpoints[i]);
            match self.call_one(&url, body) {
                Ok(answer) => {
                    self.current.store(i, Ordering::Relaxed);
                    return Ok(answer);
                }
                // Another member of the etcd cluster may well answer: try it.
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn call_one(&self, url: &str, body: &str) -> Result<Vec<u8>, EtcdError> {
        let mut resp = self
            .agent
            .post(url)
            .header("content-type", "application/json")
            .send(body)
            .map_err(|e| EtcdError::Unreachable(format!("{url}: {e}")))?;
        let status = resp.status().as_u16();
        let answer = resp
            .body_mut()
            .with_config()
            .limit(self.max_answer_bytes)
            .read_to_vec()
            .map_err(|e| match e {
                ureq::Error::BodyExceedsLimit(limit) => {
                    EtcdError::Answer(format!("{url}: answer over {limit} bytes"))
                }
                e => EtcdError::Unreachable(format!("{url}: {e}")),
            })?;
        if status != 200 {
            return Err(EtcdError::Status {
                status,
                message: String::from_utf8_lossy(&answer).chars().take(300).collect(),
            });
        }
        Ok(answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_answers_parse_with_string_or_number_integers() {
        let body = format!(
            r#"{{"header":{{"cluster_id":"1","revision":"42"}},"kvs":[{{"key":"{}","value":"{}","create_revision":"5","lease":"7"}},{{"key":"{}"}}],"count":"2"}}"#,
            b64(b"/yutu/c/members/a"),
            b64(b"{}"),
            b64(b"/yutu/c/members/b"),
        );
        let a = parse_range(body.as_bytes()).expect("parses");
        assert_eq!(a.revision, 42);
        assert!(!a.more);
        assert_eq!(a.kvs.len(), 2);
        assert_eq!(a.kvs[0].key, b"/yutu/c/members/a");
        assert_eq!(a.kvs[0].value, b"{}");
        assert!(a.kvs[1].value.is_empty(), "an absent value is empty");
        // Nothing matched: no kvs at all; numbers where strings are expected are accepted.
        let a = parse_range(br#"{"header":{"revision":7},"more":true}"#).expect("parses");
        assert_eq!((a.revision, a.kvs.len(), a.more), (7, 0, true));
    }

    #[test]
    fn unreadable_answers_are_errors_not_panics() {
        for bad in [
            &b"not json"[..],
            br#"{"kvs":[]}"#,
            br#"{"header":{"revision":"x"}}"#,
            br#"{"header":{"revision":"1"},"kvs":[{"key":"%%%"}]}"#,
            br#"{"header":{"revision":"1"},"kvs":[{"value":"AA=="}]}"#,
            br#"{"header":{"revision":"1"},"kvs":"no"}"#,
        ] {
            let e = parse_range(bad).expect_err("refused");
            assert_eq!(e.kind(), "answer", "{e}");
        }
    }

    #[test]
    fn endpoints_are_checked() {
        let t = Duration::from_secs(1);
        assert_eq!(
            EtcdClient::new(&[], t, 1).map(|_| ()),
            Err(EtcdError::NoEndpoint)
        );
        for bad in [
            "127.0.0.1:2379",
            "ftp://x",
            "http://",
            "http://a/b",
            "http://a b",
        ] {
            assert!(
                matches!(
                    EtcdClient::new(&[bad.to_string()], t, 1),
                    Err(EtcdError::BadEndpoint(_))
                ),
                "{bad}"
            );
        }
        let c = EtcdClient::new(
            &["http://127.0.0.1:2379/".into(), "https://e2:2379".into()],
            t,
            1,
        )
        .expect("valid");
        assert_eq!(c.endpoints(), ["http://127.0.0.1:2379", "https://e2:2379"]);
    }

    #[test]
    fn a_frozen_endpoint_is_given_up_at_the_deadline() {
        // Accepts connections (the kernel's backlog does) and never answers, as a SIGSTOPped
        // etcd does.
        let frozen = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", frozen.local_addr().expect("addr"));
        let c = EtcdClient::new(&[url], Duration::from_millis(200), 1 << 20).expect("valid");
        let started = std::time::Instant::now();
        let e = c.range_prefix("/yutu/", 10).expect_err("no answer");
        assert_eq!(e.kind(), "unreachable", "{e}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn every_endpoint_is_tried_and_the_last_error_reported() {
        // Nothing listens on these (ports of sockets bound then closed).
        let closed: Vec<String> = (0..2)
            .map(|_| {
                let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
                format!("http://{}", l.local_addr().expect("addr"))
            })
            .collect();
        let c = EtcdClient::new(&closed, Duration::from_secs(2), 1 << 20).expect("valid");
        match c.range_prefix("/yutu/", 10) {
            Err(EtcdError::Unreachable(m)) => assert!(m.contains(&closed[1]), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}
