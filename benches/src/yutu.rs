//! The system under test: the real `yutu-server` binary, started by the bench on a free
//! loopback port with a scratch data directory.
//!
//! Benchmarking the shipped binary (not an in-process server) measures what users run,
//! including its HTTP stack and thread layout, and lets the bench stop it between suites so it
//! never competes for the 2 cores with the reference. The server picks its own port
//! (`--listen 127.0.0.1:0`) and announces it in a `listening on ADDR` log line, which is read
//! from its output; that avoids the race of choosing a port for it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

use crate::child::ChildGuard;
use crate::tempdir::TempDir;

/// How long the server gets to log its address.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Upper bound on building the server when no binary is found (a cold release build on two
/// cores takes minutes, not hours).
const BUILD_TIMEOUT: Duration = Duration::from_secs(30 * 60);

const BIN_NAME: &str = "yutu-server";

/// A running yutu-server; stopped and its data removed when dropped.
pub struct YutuServer {
    // Declared before `data_dir`: the server stops before its files are removed.
    child: ChildGuard,
    addr: SocketAddr,
    _data_dir: TempDir,
}

impl YutuServer {
    /// Starts `bin` with authentication off and `memory` of DRAM (a size string such as
    /// `1GiB`), and waits for it to announce its address.
    pub fn start(bin: &Path, memory: &str) -> anyhow::Result<Self> {
        let data_dir = TempDir::new_in(&std::env::temp_dir(), "yutu-bench-data-")?;
        let mut cmd = Command::new(bin);
        cmd.args(["--no-auth", "--listen", "127.0.0.1:0", "--memory", memory])
            .arg("--data-dir")
            .arg(data_dir.path())
            // Plain log lines: easier to match, and nothing to strip.
            .env("NO_COLOR", "1");
        let (mut child, lines) = ChildGuard::spawn(BIN_NAME, &mut cmd)?;
        let deadline = Instant::now() + START_TIMEOUT;
        let addr = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!(
                    "{BIN_NAME} did not log 'listening on ADDR' within {START_TIMEOUT:?}; last output:\n{}",
                    child.tail()
                );
            }
            match lines.recv_timeout(left.min(Duration::from_millis(100))) {
                Ok(line) => {
                    if let Some(addr) = parse_listening(&line) {
                        break addr;
                    }
                }
                Err(RecvTimeoutError::Timeout) => child.check_running()?,
                Err(RecvTimeoutError::Disconnected) => {
                    // Both pipes closed: the process is gone (or closed its output).
                    std::thread::sleep(Duration::from_millis(50));
                    child.check_running()?;
                    bail!("{BIN_NAME} closed its output without logging its address");
                }
            }
        };
        Ok(YutuServer {
            child,
            addr,
            _data_dir: data_dir,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Fails if the server died during a measurement, quoting its last log lines.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        self.child.check_running()
    }
}

/// Finds `listening on <addr>` anywhere in a log line (colour codes already stripped).
pub fn parse_listening(line: &str) -> Option<SocketAddr> {
    let (_, rest) = line.split_once("listening on ")?;
    let rest = rest.trim_start_matches(['"', '\'', '=', ' ']);
    let end = rest
        .find(|c: char| !(c.is_ascii_hexdigit() || matches!(c, '.' | ':' | '[' | ']')))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// Finds the server binary: `$YUTU_SERVER_BIN` if set (an explicit choice wins), else next to
/// this executable (where `cargo build --release` puts both), else builds it with cargo.
///
/// A binary found next to this one is used as is, even if the sources changed since: run
/// `cargo build --release -p yutu-server` first when benchmarking a change.
pub fn locate_binary() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("YUTU_SERVER_BIN") {
        let p = PathBuf::from(p);
        if !p.is_file() {
            bail!(
                "$YUTU_SERVER_BIN points at {}, which is not a file",
                p.display()
            );
        }
        return Ok(p);
    }
    let exe = std::env::current_exe().context("finding this executable")?;
    if let Some(sibling) = exe.parent().map(|d| d.join(BIN_NAME)) {
        if sibling.is_file() {
            return Ok(sibling);
        }
    }
    eprintln!(
        "{BIN_NAME} not found next to {}; building it",
        exe.display()
    );
    build_binary()
}

/// Runs `cargo build --release -p yutu-server` in this workspace and returns the executable
/// cargo reports (so a `CARGO_TARGET_DIR` in the environment is honoured).
fn build_binary() -> anyhow::Result<PathBuf> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("the bench crate has no parent directory")?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out_file = TempDir::new_in(&std::env::temp_dir(), "yutu-bench-build-")?;
    let out_path = out_file.path().join("messages.json");
    let mut child = Command::new(cargo)
        .current_dir(workspace)
        .args([
            "build",
            "--release",
            "-p",
            BIN_NAME,
            "--message-format=json-render-diagnostics",
        ])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path)?)
        .spawn()
        .context("running cargo to build yutu-server")?;
    let deadline = Instant::now() + BUILD_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("building {BIN_NAME} took longer than {BUILD_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    if !status.success() {
        bail!("cargo build -p {BIN_NAME} failed ({status})");
    }
    let messages = std::fs::read_to_string(&out_path)?;
    messages
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == BIN_NAME)
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .context("cargo built yutu-server but reported no executable")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_address_in_log_lines() {
        let want: SocketAddr = "127.0.0.1:41234".parse().expect("addr");
        for line in [
            "2025-01-01T00:00:00Z  INFO yutu_server: listening on 127.0.0.1:41234",
            "INFO listening on 127.0.0.1:41234 shards=2",
            "INFO yutu_server::http: listening on \"127.0.0.1:41234\"",
            r#"{"fields":{"message":"listening on 127.0.0.1:41234"}}"#,
        ] {
            assert_eq!(parse_listening(line), Some(want), "{line}");
        }
        assert_eq!(
            parse_listening("listening on [::1]:80"),
            Some("[::1]:80".parse().expect("v6"))
        );
        assert_eq!(parse_listening("INFO starting"), None);
    }
}
