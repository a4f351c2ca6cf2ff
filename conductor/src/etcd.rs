//! The conductor's transport to etcd: `ureq` (the HTTP client it already uses for snapshots)
//! on tokio's blocking pool, speaking etcd's JSON gateway as [`yutu_etcd`] defines it. This
//! module only moves bytes: the requests, the answers' parsing, the watch stream's decoding
//! and the endpoint rotation are the shared crate's, the same as the node's.
//!
//! Every call has a deadline (a frozen etcd holds a connection open and answers nothing), an
//! answer is read up to a size bound, and the endpoints are tried in turn, starting with the
//! one that answered last. A watch is one long response: it gets a deadline of its own (its
//! session), after which the caller opens it again.

use std::io::Read;
use std::time::Duration;

pub use yutu_etcd::{parse_range, EtcdError, KeyValue, RangeAnswer};
use yutu_etcd::{Call, Endpoints, WatchDecoder, WatchResponse};

/// A blocking client of one etcd cluster (call it from the blocking pool). Shared between
/// calls: it keeps its connections and remembers which endpoint answered last.
#[derive(Debug)]
pub struct EtcdClient {
    endpoints: Endpoints,
    agent: ureq::Agent,
    timeout: Duration,
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
        let endpoints = Endpoints::new(endpoints)?;
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            // Non-2xx answers come back as answers, so their body can be reported.
            .http_status_as_error(false)
            .build()
            .into();
        Ok(EtcdClient {
            endpoints,
            agent,
            timeout,
            max_answer_bytes,
        })
    }

    pub fn endpoints(&self) -> &[String] {
        self.endpoints.urls()
    }

    /// Every key under `prefix` (at most `limit`; 0: no limit), and the revision.
    pub fn range_prefix(&self, prefix: &str, limit: u64) -> Result<RangeAnswer, EtcdError> {
        parse_range(&self.call(&Call::range_prefix(prefix.as_bytes(), limit))?)
    }

    /// Sends `call`, trying each endpoint in turn; the first 200's body.
    fn call(&self, call: &Call) -> Result<Vec<u8>, EtcdError> {
        let mut last = EtcdError::NoEndpoint;
        for (i, base) in self.endpoints.order() {
            match self.call_one(&format!("{base}{}", call.path), &call.body) {
                Ok(answer) => {
                    self.endpoints.answered(i);
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
            return Err(EtcdError::status(status, &answer));
        }
        Ok(answer)
    }

    /// Watches the keys under `prefix` from `start_revision`, handing each document of the
    /// stream to `on` until it returns `false`, the stream ends or breaks, or `session` has
    /// passed (the deadline of the whole stream: a frozen etcd cannot hold the thread
    /// longer). `Ok` when the stream ran (the caller opens the next one); the endpoints are
    /// tried in turn to open it.
    pub fn watch_prefix(
        &self,
        prefix: &str,
        start_revision: i64,
        session: Duration,
        mut on: impl FnMut(WatchResponse) -> bool,
    ) -> Result<(), EtcdError> {
        let call = Call::watch_prefix(prefix.as_bytes(), start_revision);
        let mut last = EtcdError::NoEndpoint;
        for (i, base) in self.endpoints.order() {
            let url = format!("{base}{}", call.path);
            let resp = self
                .agent
                .post(&url)
                .config()
                .timeout_global(Some(session))
                .timeout_connect(Some(self.timeout))
                .timeout_recv_response(Some(self.timeout))
                .build()
                .header("content-type", "application/json")
                .send(&call.body);
            let mut resp = match resp {
                Ok(r) => r,
                Err(e) => {
                    last = EtcdError::Unreachable(format!("{url}: {e}"));
                    continue;
                }
            };
            let status = resp.status().as_u16();
            let mut reader = resp.body_mut().as_reader();
            if status != 200 {
                let mut answer = Vec::new();
                let _ = reader.take(4096).read_to_end(&mut answer);
                last = EtcdError::status(status, &answer);
                continue;
            }
            self.endpoints.answered(i);
            return read_stream(&mut reader, &mut on)
                .map_err(|e| EtcdError::Unreachable(format!("{url}: {e}")));
        }
        Err(last)
    }
}

/// Feeds the stream's chunks through the decoder to `on`; returns when the stream ends or
/// `on` says stop. A decoding error ends the stream as a read error would.
fn read_stream(
    reader: &mut impl Read,
    on: &mut impl FnMut(WatchResponse) -> bool,
) -> Result<(), String> {
    let mut decoder = WatchDecoder::default();
    let mut chunk = vec![0u8; 16 << 10];
    loop {
        let n = reader.read(&mut chunk).map_err(|e| e.to_string())?;
        if n == 0 {
            return Ok(());
        }
        for doc in decoder.push(&chunk[..n]).map_err(|e| e.to_string())? {
            if !on(doc) {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let e = c
            .watch_prefix("/yutu/", 1, Duration::from_secs(30), |_| true)
            .expect_err("no answer");
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

    #[test]
    fn bad_endpoints_are_refused() {
        let t = Duration::from_secs(1);
        assert_eq!(
            EtcdClient::new(&[], t, 1).map(|_| ()),
            Err(EtcdError::NoEndpoint)
        );
        assert!(matches!(
            EtcdClient::new(&["127.0.0.1:2379".into()], t, 1),
            Err(EtcdError::BadEndpoint(_))
        ));
    }
}
