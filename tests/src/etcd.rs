//! A real etcd (Debian's `etcd-server`) on loopback ports of its own, for the cluster tests.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine as _;

use crate::server::wait_until;

/// Why an etcd did not start.
enum Start {
    /// It exited while starting (a port taken in the meantime, most likely).
    Exited(String),
    /// It stayed up but did not answer healthy within the deadline.
    Unhealthy(String),
}

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
    /// Starts etcd on two free loopback ports. The ports are picked by binding port 0 and
    /// letting go, so another test's process can take one before etcd binds it; an etcd that
    /// exits while starting is retried on fresh ports (a few times), and one that stays up
    /// but never turns healthy fails the test with its log.
    pub fn start() -> Etcd {
        Etcd::start_on(|| (free_port(), free_port()))
    }

    /// [`Etcd::start`] with the ports each attempt tries drawn from `ports`.
    fn start_on(mut ports: impl FnMut() -> (u16, u16)) -> Etcd {
        let mut etcd = Etcd {
            child: None,
            url: String::new(),
            client_port: 0,
            peer_port: 0,
            dir: tempfile::tempdir().expect("etcd dir"),
        };
        let mut last = String::new();
        for _ in 0..4 {
            (etcd.client_port, etcd.peer_port) = ports();
            etcd.url = format!("http://127.0.0.1:{}", etcd.client_port);
            match etcd.spawn() {
                Ok(()) => return etcd,
                Err(Start::Exited(why)) => last = why,
                Err(Start::Unhealthy(why)) => panic!("{why}"),
            }
            let _ = std::fs::remove_dir_all(etcd.dir.path().join("data"));
        }
        panic!("etcd would not start on fresh ports: {last}");
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("etcd.log")
    }

    /// The end of etcd's log, for a failure message.
    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(12)..].join("\n")
    }

    fn spawn(&mut self) -> Result<(), Start> {
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("etcd log file");
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
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start etcd ({e}): install it with scripts/install-test-deps.sh")
            });
        self.child = Some(child);
        // A short per-probe timeout: whatever holds a port etcd could not bind may never answer.
        let health = crate::Client::with_timeout(&self.url, Duration::from_secs(1));
        let mut exited = None;
        let healthy = wait_until(Duration::from_secs(30), || {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                exited = Some(status);
                return true;
            }
            health
                .try_get("/health", &[])
                .is_some_and(|r| r.text().contains("true"))
        });
        if let Some(status) = exited {
            self.child = None;
            return Err(Start::Exited(format!(
                "etcd at {} exited ({status}):\n{}",
                self.url,
                self.log_tail()
            )));
        }
        if !healthy {
            return Err(Start::Unhealthy(format!(
                "etcd did not become healthy at {}/health:\n{}",
                self.url,
                self.log_tail()
            )));
        }
        Ok(())
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
        if let Err(Start::Exited(why) | Start::Unhealthy(why)) = self.spawn() {
            panic!("{why}");
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.resume();
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client port taken between picking it and etcd binding it costs a retry, not the test.
    #[test]
    fn a_port_taken_before_etcd_binds_it_is_retried_on_fresh_ports() {
        let taken = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let taken_port = taken.local_addr().expect("its address").port();
        let mut first = true;
        let etcd = Etcd::start_on(|| {
            if std::mem::take(&mut first) {
                (taken_port, free_port())
            } else {
                (free_port(), free_port())
            }
        });
        assert!(!first, "the taken port was tried");
        assert_ne!(etcd.client_port, taken_port);
        let health = crate::Client::new(&etcd.url).get("/health");
        assert!(health.text().contains("true"), "{}", health.text());
    }
}
