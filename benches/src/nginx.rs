//! nginx as the HTTP reference: a well-known fast server moving the same bytes over the same
//! loopback, measured by the same client in the same run (docs/benchmarks.md, "Measuring").
//!
//! The bench starts its own nginx with a generated config in a scratch directory on tmpfs
//! (`/dev/shm`), so the reference never touches a disk and does not depend on, or disturb, any
//! system nginx: no system config, logs or pid file are used. Files are served from the same
//! tmpfs directory with the stock fast path (sendfile, keep-alive, no access log). PUTs go
//! through the WebDAV module, which writes the body to a temp file on the same tmpfs and renames
//! it into place: the closest stock nginx has to "store this object".

use std::fmt::Write as _;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

use crate::child::ChildGuard;
use crate::tempdir::TempDir;

/// How long nginx gets to start accepting connections.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// Ports are picked by binding port 0 and releasing it; another process may take the port in
/// between, so a start that fails to bind is retried with a fresh port.
const START_ATTEMPTS: usize = 3;

/// Largest request body the reference accepts (the 1 MiB objects, with room to spare).
const MAX_BODY: &str = "2m";

/// The installed nginx and what it can do.
#[derive(Debug, Clone)]
pub struct NginxInfo {
    pub bin: PathBuf,
    pub version: String,
    /// Built with `http_dav_module`, needed for the PUT reference.
    pub has_dav: bool,
}

/// A running reference nginx; stopped and its files removed when dropped.
pub struct Nginx {
    // Declared before `dir`: fields drop in order, so the server stops before its files go.
    child: ChildGuard,
    addr: SocketAddr,
    docroot: PathBuf,
    dir: TempDir,
}

/// Finds nginx (`$NGINX_BIN`, then `PATH`, then `/usr/sbin`, where Debian puts it and where a
/// non-root `PATH` often does not look) and asks it how it was built.
pub fn probe() -> anyhow::Result<NginxInfo> {
    let bin = locate().context(
        "nginx not found (set $NGINX_BIN, or run scripts/install-bench-deps.sh to install it)",
    )?;
    let out = Command::new(&bin)
        .arg("-V")
        .output()
        .with_context(|| format!("running {} -V", bin.display()))?;
    // nginx prints its version and configure arguments to stderr.
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    let version = text
        .lines()
        .find_map(|l| l.strip_prefix("nginx version: "))
        .unwrap_or("unknown")
        .to_owned();
    Ok(NginxInfo {
        bin,
        version,
        has_dav: text.contains("http_dav_module"),
    })
}

fn locate() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("NGINX_BIN") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/local/sbin")])
        .map(|d| d.join("nginx"))
        .find(|p| p.is_file())
}

/// Where the reference keeps its files: tmpfs when there is one, so the comparison is with
/// memory-speed file serving, like Yutu's DRAM tier.
fn scratch_parent() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_owned()
    } else {
        eprintln!(
            "warning: /dev/shm missing; the nginx reference serves from {:?}",
            std::env::temp_dir()
        );
        std::env::temp_dir()
    }
}

impl Nginx {
    /// Starts nginx with `workers` worker processes on a free loopback port, serving an empty
    /// docroot (fill it with [`Nginx::docroot`]). PUT is enabled when `dav` is set.
    pub fn start(info: &NginxInfo, workers: usize, dav: bool) -> anyhow::Result<Self> {
        let dir = TempDir::new_in(&scratch_parent(), "yutu-bench-nginx-")?;
        let docroot = dir.path().join("www");
        let body_tmp = dir.path().join("body");
        std::fs::create_dir_all(&docroot)?;
        std::fs::create_dir_all(&body_tmp)?;
        let mut last_err = None;
        for _ in 0..START_ATTEMPTS {
            let port = free_port()?;
            let conf = config(&ConfigParams {
                dir: dir.path(),
                docroot: &docroot,
                port,
                workers,
                dav,
                as_root: running_as_root(),
            });
            let conf_path = dir.path().join("nginx.conf");
            std::fs::write(&conf_path, conf)?;
            let error_log = dir.path().join("error.log");
            let mut cmd = Command::new(&info.bin);
            cmd.arg("-p")
                .arg(dir.path())
                .arg("-e")
                .arg(&error_log)
                .arg("-c")
                .arg(&conf_path)
                .args(["-g", "daemon off;"]);
            let (child, _lines) = ChildGuard::spawn("nginx", &mut cmd)?;
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            match wait_ready(child, addr, &error_log) {
                Ok(child) => {
                    return Ok(Nginx {
                        child,
                        addr,
                        docroot,
                        dir,
                    })
                }
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| anyhow::anyhow!("nginx was not started")))
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The directory nginx serves `/` from.
    pub fn docroot(&self) -> &Path {
        &self.docroot
    }

    /// Fails if nginx died during a measurement (then its numbers mean nothing).
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        self.child.check_running().with_context(|| {
            format!(
                "error log:\n{}",
                read_log(&self.dir.path().join("error.log"))
            )
        })
    }
}

/// Polls until nginx accepts a connection, giving up if it exits or takes too long.
fn wait_ready(
    mut child: ChildGuard,
    addr: SocketAddr,
    error_log: &Path,
) -> anyhow::Result<ChildGuard> {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Err(e) = child.check_running() {
            return Err(e).with_context(|| format!("nginx error log:\n{}", read_log(error_log)));
        }
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(child);
        }
        if Instant::now() >= deadline {
            bail!(
                "nginx did not accept connections on {addr} within {START_TIMEOUT:?}; error log:\n{}",
                read_log(error_log)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn read_log(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| format!("(unreadable: {e})"))
}

/// A loopback port nobody listens on right now.
fn free_port() -> anyhow::Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr()?.port())
}

/// As root, nginx's workers would switch to `nobody`, who cannot read or write our 0700
/// scratch directory; keeping them root is harmless for a loopback-only reference.
fn running_as_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

struct ConfigParams<'a> {
    dir: &'a Path,
    docroot: &'a Path,
    port: u16,
    workers: usize,
    dav: bool,
    as_root: bool,
}

/// The whole nginx config. Every path nginx might write (pid, logs, all temp dirs) is inside
/// the scratch directory, so it runs as any user and leaves nothing behind.
fn config(p: &ConfigParams<'_>) -> String {
    let d = p.dir.display();
    let mut c = String::new();
    if p.as_root {
        c.push_str("user root;\n");
    }
    let _ = write!(
        c,
        "worker_processes {workers};
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{
    worker_connections 1024;
}}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    keepalive_timeout 75s;
    keepalive_requests 100000000;
    default_type application/octet-stream;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    server {{
        listen 127.0.0.1:{port};
        root {root};
        location / {{
",
        workers = p.workers.max(1),
        port = p.port,
        root = p.docroot.display(),
    );
    if p.dav {
        let _ = write!(
            c,
            "            dav_methods PUT;
            create_full_put_path on;
            dav_access user:rw group:r all:r;
            client_max_body_size {MAX_BODY};
"
        );
    }
    c.push_str("        }\n    }\n}\n");
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_keeps_every_path_in_the_scratch_dir() {
        let conf = config(&ConfigParams {
            dir: Path::new("/dev/shm/x"),
            docroot: Path::new("/dev/shm/x/www"),
            port: 8080,
            workers: 2,
            dav: true,
            as_root: false,
        });
        assert!(conf.contains("listen 127.0.0.1:8080;"));
        assert!(conf.contains("worker_processes 2;"));
        assert!(conf.contains("dav_methods PUT;"));
        assert!(!conf.contains("user root"));
        for line in conf
            .lines()
            .filter(|l| l.contains("_temp_path") || l.contains("pid ") || l.contains("error_log"))
        {
            assert!(line.contains("/dev/shm/x/"), "{line}");
        }
        assert_eq!(conf.matches('{').count(), conf.matches('}').count());
    }
}
