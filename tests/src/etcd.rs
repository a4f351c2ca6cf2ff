//! A real etcd (Debian's `etcd-server`) on loopback ports of its own, for the cluster tests.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine as _;

use crate::server::wait_until;

/// A running etcd, killed when dropped.
pub struct Etcd {
    child: Option<Child>,
    /// Client URL (`http://127.0.0.1:PORT`).
    pub url: String,
    client_port: u16,
    peer_port: u16,
    dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// The etcd binary: `$YUTU_ETCD` or `etcd` on the PATH (scripts/install-test-deps.sh installs
/// Debian's etcd-server).
fn binary() -> PathBuf {
    std::env::var_os("YUTU_ETCD")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("etcd"))
}

impl Etcd {
    pub fn start() -> Etcd {
        let mut etcd = Etcd {
            child: None,
            url: String::new(),
            client_port: free_port(),
            peer_port: free_port(),
            dir: tempfile::tempdir().expect("etcd dir"),
        };
        etcd.url = format!("http://127.0.0.1:{}", etcd.client_port);
        etcd.spawn();
        etcd
    }

    fn spawn(&mut self) {
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let child = Command::new(binary())
            .arg("--data-dir")
            .arg(self.dir.path().join("data"))
            .args(["--name", "test"])
            .args(["--listen-client-urls", &self.url])
            .args(["--advertise-client-urls", &self.url])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("test={peer}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start etcd ({e}): install it with scripts/install-test-deps.sh")
            });
        self.child = Some(child);
        let health = crate::Client::new(&self.url);
        let url = format!("{}/health", self.url);
        assert!(
            wait_until(Duration::from_secs(30), || {
                health
                    .try_get("/health", &[])
                    .is_some_and(|r| r.text().contains("true"))
            }),
            "etcd did not become healthy at {url}"
        );
    }

    fn signal(&self, sig: &str) {
        if let Some(c) = &self.child {
            let _ = Command::new("kill")
                .args([sig, &c.id().to_string()])
                .status();
        }
    }

    /// Writes `key` through etcd's JSON gateway (as a test stands in for a node).
    pub fn put(&self, key: &str, value: &[u8]) {
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let body = serde_json::json!({ "key": b64(key.as_bytes()), "value": b64(value) });
        self.call("/v3/kv/put", &body);
    }

    /// Deletes `key` through etcd's JSON gateway.
    pub fn delete(&self, key: &str) {
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        self.call(
            "/v3/kv/deleterange",
            &serde_json::json!({ "key": b64(key.as_bytes()) }),
        );
    }

    fn call(&self, path: &str, body: &serde_json::Value) {
        let r = crate::Client::new(&self.url).send(
            "POST",
            path,
            &[("content-type", "application/json")],
            Some(body.to_string().as_bytes()),
        );
        assert_eq!(r.status, 200, "etcd {path}: {}", r.text());
    }

    /// Freezes etcd (SIGSTOP): connections stay open, nothing answers.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Thaws a paused etcd (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// Kills etcd (SIGKILL); [`Etcd::restart`] brings it back on its data.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts etcd again on the same ports and data directory.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.resume();
        self.kill();
    }
}
