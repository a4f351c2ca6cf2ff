//! A small blocking HTTP client for tests, on `ureq`, that never turns a status into an error.

use std::time::Duration;

use ureq::Agent;

/// A response, fully read.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The code of an error body: S3's XML `<Code>`, or the `code` of the KV and admin
    /// APIs' JSON errors.
    pub fn code(&self) -> Option<String> {
        crate::xml::values(&self.text(), "Code")
            .into_iter()
            .next()
            .or_else(|| {
                serde_json::from_slice::<yutu_api::error::JsonError>(&self.body)
                    .ok()
                    .map(|e| e.code)
            })
    }
}

#[derive(Clone)]
pub struct Client {
    base: String,
    agent: Agent,
}

impl Client {
    pub fn new(base: &str) -> Client {
        Client::with_timeout(base, Duration::from_secs(120))
    }

    /// A client whose every call gives up after `timeout` (for probes that poll).
    pub fn with_timeout(base: &str, timeout: Duration) -> Client {
        let config = Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .timeout_global(Some(timeout))
            .build();
        Client {
            base: base.trim_end_matches('/').to_string(),
            agent: Agent::new_with_config(config),
        }
    }

    /// Sends `method path` with headers and an optional body; `path` is sent as written
    /// (already percent-encoded) after the base URL.
    pub fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> Reply {
        let mut builder = http::Request::builder()
            .method(method)
            .uri(format!("{}{}", self.base, path));
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        let result = match body {
            Some(b) => self
                .agent
                .run(builder.body(b.to_vec()).expect("valid request")),
            None => self.agent.run(builder.body(()).expect("valid request")),
        };
        let resp = result.unwrap_or_else(|e| panic!("{method} {path}: transport error: {e}"));
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp
            .into_body()
            .with_config()
            .limit(u64::MAX)
            .read_to_vec()
            .unwrap_or_else(|e| panic!("{method} {path}: reading the body: {e}"));
        Reply {
            status,
            headers,
            body,
        }
    }

    /// A PUT that reports a transport failure (a killed server) as `None` instead of failing.
    pub fn try_put(&self, path: &str, body: &[u8]) -> Option<u16> {
        let req = http::Request::builder()
            .method("PUT")
            .uri(format!("{}{}", self.base, path))
            .body(body.to_vec())
            .ok()?;
        let resp = self.agent.run(req).ok()?;
        let status = resp.status().as_u16();
        resp.into_body().read_to_vec().ok()?;
        Some(status)
    }

    /// A GET that reports a transport failure (nothing listening yet, a killed server) as
    /// `None` instead of failing.
    pub fn try_get(&self, path: &str, headers: &[(&str, &str)]) -> Option<Reply> {
        let mut builder = http::Request::builder()
            .method("GET")
            .uri(format!("{}{}", self.base, path));
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        let resp = self.agent.run(builder.body(()).ok()?).ok()?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp.into_body().read_to_vec().ok()?;
        Some(Reply {
            status,
            headers,
            body,
        })
    }

    /// POSTs `body` as JSON; the status and the answer parsed as JSON (`Null` when it is not).
    pub fn post_json(&self, path: &str, body: &serde_json::Value) -> (u16, serde_json::Value) {
        let r = self.send(
            "POST",
            path,
            &[("content-type", "application/json")],
            Some(body.to_string().as_bytes()),
        );
        let answer = serde_json::from_slice(&r.body).unwrap_or(serde_json::Value::Null);
        (r.status, answer)
    }

    pub fn get(&self, path: &str) -> Reply {
        self.send("GET", path, &[], None)
    }

    pub fn head(&self, path: &str) -> Reply {
        self.send("HEAD", path, &[], None)
    }

    pub fn put(&self, path: &str, body: &[u8]) -> Reply {
        self.send("PUT", path, &[], Some(body))
    }

    pub fn delete(&self, path: &str) -> Reply {
        self.send("DELETE", path, &[], None)
    }

    /// Creates a bucket and asserts it worked.
    pub fn mb(&self, bucket: &str) {
        let r = self.put(&format!("/{bucket}"), b"");
        assert_eq!(r.status, 200, "create bucket {bucket}: {}", r.text());
    }
}
