//! A signed `KvClient` whose base URL has a path prefix (`http://proxy/yutu`).
//!
//! A node serves its API at the root of its listener: it has no setting to be mounted under a
//! prefix, and it routes on the first path segment (the bucket, or `v1` for the KV API). A
//! prefixed base URL therefore reaches a node only through a reverse proxy that strips the
//! prefix (one that passes `/yutu/v1/kv/...` through would have the node route it as bucket
//! `yutu`). The node verifies a SigV4 signature over the path it receives, without the
//! prefix, so the client must sign the path after the base URL, not the whole URL path. This
//! test runs a node with authentication behind such a proxy.
//!
//! The node is `$YUTU_BIN_DIR/yutu-server` or the workspace's `target/debug/yutu-server`;
//! when none is built the test says so and passes without running (as `kv_live` does).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use yutu_client::kv::{KvClient, KvOptions};
use yutu_client::Credentials;

const AK: &str = "AKIAKVPREFIX0000001";
const SK: &str = "kv-prefix-secret-000000000000000000000";
const PREFIX: &str = "/yutu";

fn server_binary() -> Option<PathBuf> {
    let mut candidates = Vec::new();
    if let Ok(dir) = std::env::var("YUTU_BIN_DIR") {
        candidates.push(PathBuf::from(dir).join("yutu-server"));
    }
    candidates.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debug/yutu-server"));
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| Some(e.parent()?.parent()?.to_path_buf()))
    {
        candidates.push(dir.join("yutu-server"));
    }
    candidates.into_iter().find(|p| p.is_file())
}

/// A node with one user, killed (and its directory removed) when dropped.
struct Node {
    child: Child,
    addr: String,
    dir: PathBuf,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start_node() -> Option<Node> {
    let Some(bin) = server_binary() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "yutu-server is not built; the test command builds it before the tests"
        );
        eprintln!("SKIPPED: yutu-server is not built; run `cargo build -p yutu-server` first");
        return None;
    };
    let dir = std::env::temp_dir().join(format!("yutu-kv-prefix-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("yutu.toml");
    std::fs::write(
        &config,
        format!("[[users]]\nname = \"engine\"\naccess_key = \"{AK}\"\nsecret_key = \"{SK}\"\n"),
    )
    .unwrap();
    let mut child = Command::new(bin)
        .arg("--config")
        .arg(&config)
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.join("data"))
        .args(["--memory", "128MiB", "--nvme-capacity", "0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn yutu-server");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut log = Vec::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(addr) = line.split("listening on ").nth(1) {
                let addr: String = addr
                    .chars()
                    .take_while(|c| c.is_ascii_hexdigit() || ".:[]".contains(*c))
                    .collect();
                let _ = tx.send(Ok(addr));
            }
            log.push(line);
        }
        let _ = tx.send(Err(log.join("\n")));
    });
    match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(Ok(addr)) => Some(Node { child, addr, dir }),
        other => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("yutu-server did not announce its address: {other:?}");
        }
    }
}

/// A reverse proxy that serves `upstream` under `PREFIX`: it strips the prefix from the
/// request line (refusing targets outside it with 404) and passes everything else, the Host
/// header included, through unchanged. One request per connection (`connection: close` is
/// added upstream, so the node closes after answering and the client does not reuse it).
/// Returns the proxy's address and how many requests it forwarded.
fn stripping_proxy(upstream: String) -> (String, mpsc::Receiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (seen_tx, seen) = mpsc::channel();
    thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            let upstream = upstream.clone();
            let seen_tx = seen_tx.clone();
            thread::spawn(move || {
                let _ = proxy_one(client, &upstream, &seen_tx);
            });
        }
    });
    (addr, seen)
}

fn proxy_one(
    mut client: TcpStream,
    upstream: &str,
    seen: &mpsc::Sender<String>,
) -> std::io::Result<()> {
    // The request head, byte by byte so that no body byte is consumed here.
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if client.read(&mut byte)? == 0 {
            return Ok(());
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let (request_line, rest) = head.split_once("\r\n").unwrap_or((&head, ""));
    let mut parts = request_line.splitn(3, ' ');
    let (method, target, version) = (
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
    );
    let Some(stripped) = target
        .strip_prefix(PREFIX)
        .filter(|t| t.starts_with('/') || t.starts_with('?') || t.is_empty())
    else {
        client.write_all(
            b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        )?;
        return Ok(());
    };
    let stripped = if stripped.is_empty() || stripped.starts_with('?') {
        format!("/{stripped}")
    } else {
        stripped.to_string()
    };
    let _ = seen.send(format!("{method} {target} -> {stripped}"));
    let mut server = TcpStream::connect(upstream)?;
    let rest = rest.strip_suffix("\r\n").unwrap_or(rest);
    let kept: String = rest
        .split_inclusive("\r\n")
        .filter(|l| !l.to_ascii_lowercase().starts_with("connection:"))
        .collect();
    server.write_all(
        format!("{method} {stripped} {version}\r\n{kept}connection: close\r\n\r\n").as_bytes(),
    )?;
    let (mut from_client, mut to_server) = (client.try_clone()?, server.try_clone()?);
    let upload = thread::spawn(move || {
        let _ = std::io::copy(&mut from_client, &mut to_server);
    });
    let _ = std::io::copy(&mut server, &mut client);
    let _ = client.shutdown(Shutdown::Both);
    let _ = server.shutdown(Shutdown::Both);
    let _ = upload.join();
    Ok(())
}

#[test]
fn signed_kv_calls_verify_through_a_base_url_with_a_path_prefix() {
    let Some(node) = start_node() else {
        return;
    };
    let (proxy, seen) = stripping_proxy(node.addr.clone());
    let base = format!("http://{proxy}{PREFIX}");
    let creds = Credentials::new(AK, SK);

    // The bucket, directly at the node (a signed S3 call that does not go through the proxy).
    let host = node.addr.clone();
    let mut req = ureq::put(format!("http://{}/prefixed", node.addr));
    for (name, value) in creds.sign(
        "PUT",
        &host,
        "/prefixed",
        "",
        b"",
        std::time::SystemTime::now(),
    ) {
        req = req.header(name, value);
    }
    assert_eq!(req.send_empty().expect("create bucket").status(), 200);

    // Through the proxy: a wrong secret is the node's SignatureDoesNotMatch (so the calls do
    // reach the node's verifier), the right one verifies on every call.
    let wrong = KvOptions {
        credentials: Some(Credentials::new(AK, "not-the-secret")),
        ..KvOptions::default()
    };
    let err = KvClient::new(&base, wrong).unwrap_err();
    assert_eq!(err.code(), Some("SignatureDoesNotMatch"), "{err}");

    let kv = KvClient::new(
        &base,
        KvOptions {
            credentials: Some(creds),
            ..KvOptions::default()
        },
    )
    .expect("a signed KvClient through the prefixed base URL");
    assert_eq!(kv.base_url(), base);
    let buf = kv.register(1 << 20).unwrap();
    let block: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    buf.write_at(0, &block).unwrap();
    let keys = vec!["a".to_string(), "b".to_string()];
    let etags = kv
        .batch_put_from("prefixed", &keys[..1], &buf, &[0], &[4096])
        .expect("signed put-from through the prefix");
    assert_eq!(etags.len(), 1);
    assert_eq!(
        kv.batch_exists("prefixed", &keys).unwrap(),
        vec![true, false]
    );
    let copied = kv
        .batch_get_into("prefixed", &keys, &buf, &[8192, 16384])
        .unwrap();
    assert_eq!(copied, vec![Some(4096), None]);
    let mut back = vec![0u8; 4096];
    buf.read_at(8192, &mut back).unwrap();
    assert_eq!(back, block);
    assert_eq!(kv.remove("prefixed", &keys).unwrap(), vec![true, false]);

    // Every call went through the proxy, under the prefix.
    let forwarded: Vec<String> = seen.try_iter().collect();
    assert!(forwarded.len() >= 6, "{forwarded:?}");
    assert!(
        forwarded
            .iter()
            .all(|f| f.contains(" /yutu/v1/") && f.contains(" -> /v1/")),
        "{forwarded:?}"
    );
}
