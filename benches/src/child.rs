//! A server process the bench started, and the promise that it stops when the bench does.
//!
//! Each server runs in its own process group so that one signal reaches every process it forked
//! (nginx's workers outlive a killed master otherwise). The guard's `Drop` asks the group to
//! terminate, waits a little, then kills it, so an early `?` or a panic never leaves a server
//! behind. The child's stdout and stderr are drained by threads into a short tail of lines: a
//! full pipe would block the server, and the tail explains a failed start.

use std::collections::VecDeque;
use std::io::{BufRead as _, BufReader, Read};
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;

/// How long a server gets to exit after SIGTERM before the group is killed.
const TERM_GRACE: Duration = Duration::from_secs(5);

/// Output lines remembered for error messages.
const TAIL_LINES: usize = 40;

/// A running child process group; terminated when dropped.
pub struct ChildGuard {
    name: String,
    child: Child,
    tail: Arc<Mutex<VecDeque<String>>>,
    exited: bool,
}

impl ChildGuard {
    /// Spawns `cmd` in a new process group with its output captured. Returns the guard and a
    /// channel that sees every output line (stdout and stderr interleaved) as it arrives, for
    /// callers that wait for a readiness line; dropping the receiver is fine.
    pub fn spawn(name: &str, cmd: &mut Command) -> anyhow::Result<(Self, Receiver<String>)> {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {name} ({:?})", cmd.get_program()))?;
        let tail = Arc::new(Mutex::new(VecDeque::with_capacity(TAIL_LINES)));
        let (tx, rx) = mpsc::channel();
        if let Some(out) = child.stdout.take() {
            drain(out, Arc::clone(&tail), tx.clone());
        }
        if let Some(err) = child.stderr.take() {
            drain(err, Arc::clone(&tail), tx);
        }
        let guard = ChildGuard {
            name: name.to_owned(),
            child,
            tail,
            exited: false,
        };
        Ok((guard, rx))
    }

    /// Fails if the process has exited, quoting its last output lines.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => {
                self.exited = true;
                anyhow::bail!(
                    "{} exited ({status}); last output:\n{}",
                    self.name,
                    self.tail()
                )
            }
            Err(e) => Err(e).with_context(|| format!("checking on {}", self.name)),
        }
    }

    /// CPU time the process has used so far (user and system, all its threads), from
    /// `/proc/PID/stat`; `None` where that cannot be read. What a server costs per request,
    /// read this way, moves far less between runs on a shared VM than its throughput does
    /// (which also depends on how the cores were shared with the load generator).
    pub fn cpu_seconds(&self) -> Option<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).ok()?;
        // The fields after the command (in parentheses, which may hold spaces): state is the
        // first of them, utime and stime the 12th and 13th (fields 14 and 15 of proc(5)).
        let rest = &stat[stat.rfind(')')? + 1..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        (hz > 0).then(|| ticks as f64 / hz as f64)
    }

    /// The last lines the process wrote.
    pub fn tail(&self) -> String {
        let tail = self.tail.lock().unwrap_or_else(|p| p.into_inner());
        tail.iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// SIGKILLs the child's group now and waits for it (a crash, for failover measurements).
    pub fn kill(&mut self) {
        self.signal_group(libc::SIGKILL);
        let _ = self.child.wait();
        self.exited = true;
    }

    fn signal_group(&self, signal: libc::c_int) {
        let Ok(pgid) = libc::pid_t::try_from(self.child.id()) else {
            return;
        };
        // SAFETY: kill(2) with a negative pid signals the process group we created for this
        // child (process_group(0) makes its pid the group id); it touches no memory of ours.
        // Linux does not reuse a pid while it still names a live group, so this cannot reach an
        // unrelated process.
        unsafe {
            libc::kill(-pgid, signal);
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if !self.exited {
            self.signal_group(libc::SIGTERM);
            let deadline = Instant::now() + TERM_GRACE;
            while Instant::now() < deadline {
                match self.child.try_wait() {
                    Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                    _ => break,
                }
            }
        }
        // Whatever is left of the group (the leader ignoring SIGTERM, orphaned workers) dies now.
        self.signal_group(libc::SIGKILL);
        let _ = self.child.wait();
    }
}

/// Moves lines from one of the child's pipes into the tail and the readiness channel, until the
/// pipe closes (the process exited).
fn drain(pipe: impl Read + Send + 'static, tail: Arc<Mutex<VecDeque<String>>>, tx: Sender<String>) {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(pipe);
        let mut raw = Vec::new();
        loop {
            raw.clear();
            match reader.read_until(b'\n', &mut raw) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let line = strip_ansi(&String::from_utf8_lossy(&raw))
                .trim_end()
                .to_owned();
            {
                let mut t = tail.lock().unwrap_or_else(|p| p.into_inner());
                if t.len() == TAIL_LINES {
                    t.pop_front();
                }
                t.push_back(line.clone());
            }
            // The receiver goes away once the caller saw what it waited for; keep draining.
            let _ = tx.send(line);
        }
    });
}

/// Removes terminal colour sequences (`ESC [ ... letter`), which tracing adds even to pipes.
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_colour_codes() {
        assert_eq!(
            strip_ansi("\u{1b}[2m2025\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m listening on 1"),
            "2025  INFO listening on 1"
        );
    }

    #[test]
    fn guard_stops_the_whole_group() {
        // A shell that forks a long sleeper: both must be gone once the guard drops.
        let (mut guard, rx) = ChildGuard::spawn(
            "sh",
            Command::new("sh").args(["-c", "sleep 30 & echo child $!; wait"]),
        )
        .expect("spawn sh");
        let line = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("child pid line");
        let pid: i32 = line
            .strip_prefix("child ")
            .and_then(|p| p.parse().ok())
            .expect("pid");
        guard.check_running().expect("running");
        drop(guard);
        let deadline = Instant::now() + Duration::from_secs(5);
        while running(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!running(pid), "the forked sleeper outlived the guard");
    }

    /// Alive and not a zombie (an orphan may wait a moment for its reaper).
    fn running(pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit(')')
                    .next()
                    .map(|r| r.trim_start().starts_with('Z'))
            })
            .is_some_and(|zombie| !zombie)
    }
}
