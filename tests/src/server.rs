//! Starting and stopping a real `yutu-server` process.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::http::Client;

/// Where a workspace binary lives: `$YUTU_BIN_DIR/NAME` or next to the test executable.
pub fn bin_path(name: &str) -> PathBuf {
    if let Ok(dir) = std::env::var("YUTU_BIN_DIR") {
        return PathBuf::from(dir).join(name);
    }
    let exe = std::env::current_exe().expect("the test knows its own path");
    // target/<profile>/deps/<test> -> target/<profile>/<name>
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("test executables live in target/<profile>/deps");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: build the binaries first with `cargo build --workspace --bins`",
        path.display()
    );
    path
}

/// Tests run many servers at once: unless a test sizes the NVMe tier itself, each gets a
/// small one (the default is 4 GiB of preallocated disk).
fn small_nvme(extra: &[&str]) -> Vec<&'static str> {
    if extra.contains(&"--nvme-capacity") {
        vec![]
    } else {
        vec!["--nvme-capacity", "64MiB"]
    }
}

/// A running server, killed when dropped.
pub struct Server {
    child: Child,
    pub addr: SocketAddr,
    pub url: String,
    pub data_dir: tempfile::TempDir,
    log: Arc<Mutex<Vec<String>>>,
}

impl Server {
    /// Starts `yutu-server --no-auth --listen 127.0.0.1:0` with its own data directory and the
    /// extra arguments given.
    pub fn start(extra: &[&str]) -> Server {
        let data_dir = tempfile::tempdir().expect("temp dir");
        let mut cmd = Command::new(bin_path("yutu-server"));
        cmd.args(["--no-auth", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir.path())
            .args(small_nvme(extra))
            .args(extra);
        Self::spawn(cmd, data_dir)
    }

    /// Starts `yutu-server --no-auth --listen 127.0.0.1:0` on an existing data directory (to
    /// test what survives a restart); the directory outlives the server.
    pub fn start_on(dir: &std::path::Path, extra: &[&str]) -> Server {
        let mut cmd = Command::new(bin_path("yutu-server"));
        cmd.args(["--no-auth", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir)
            .args(small_nvme(extra))
            .args(extra);
        Self::spawn(cmd, tempfile::tempdir().expect("temp dir"))
    }

    /// Kills the server with SIGKILL and waits for it to be gone.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the server with exactly these arguments (plus a data directory).
    pub fn spawn(mut cmd: Command, data_dir: tempfile::TempDir) -> Server {
        cmd.stdout(Stdio::null()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn yutu-server");
        let stderr = child.stderr.take().expect("piped stderr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(addr) = line.split("listening on ").nth(1) {
                    // Text logs end the address with a space, JSON logs with a quote.
                    let addr: String = addr
                        .chars()
                        .take_while(|c| c.is_ascii_hexdigit() || ".:[]".contains(*c))
                        .collect();
                    let _ = tx.send(addr);
                }
                if let Ok(mut l) = sink.lock() {
                    l.push(line);
                }
            }
        });
        let addr: SocketAddr = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(a) => a.parse().expect("the server prints a socket address"),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "yutu-server did not announce its address within 30 s; log:\n{}",
                    log.lock().map(|l| l.join("\n")).unwrap_or_default()
                );
            }
        };
        Server {
            child,
            url: format!("http://{addr}"),
            addr,
            data_dir,
            log,
        }
    }

    pub fn client(&self) -> Client {
        Client::new(&self.url)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident set size of the server process, from /proc.
    pub fn rss_bytes(&self) -> u64 {
        rss_of(self.pid())
    }

    /// Sends SIGTERM (a graceful stop).
    pub fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM failed");
    }

    /// The exit status once the process has ended, waiting up to `timeout`.
    pub fn exit_within(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let mut status = None;
        wait_until(timeout, || {
            status = self.child.try_wait().ok().flatten();
            status.is_some()
        });
        status
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Everything the server logged so far.
    pub fn log(&self) -> String {
        self.log.lock().map(|l| l.join("\n")).unwrap_or_default()
    }

    /// The value of a metric series summed over shards, e.g. `yutu_evictions_total`.
    pub fn metric_sum(&self, name: &str) -> f64 {
        let text = self.client().get("/metrics").text();
        text.lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ', ',']))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Resident set size of process `pid` (0 once it is gone), from /proc.
pub fn rss_of(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024
}

/// Waits until `cond` holds, checking every few milliseconds, for at most `timeout`.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
