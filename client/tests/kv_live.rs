//! `KvClient` and `yutu kv` against the real `yutu-server`: one-sided puts and get-into,
//! byte for byte, plus exists/prefix/remove and the local argument checks.
//!
//! The server binary is `$YUTU_BIN_DIR/yutu-server`, else the workspace's
//! `target/debug/yutu-server`, else one next to this test's target directory. When none is
//! built the tests say so and pass without running (build it with
//! `cargo build -p yutu-server`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use yutu_client::kv::{BlockHasher, KvClient, KvError, KvOptions};
use yutu_client::{Client, Credentials};

fn server_binary() -> Option<PathBuf> {
    let mut candidates = Vec::new();
    if let Ok(dir) = std::env::var("YUTU_BIN_DIR") {
        candidates.push(PathBuf::from(dir).join("yutu-server"));
    }
    candidates.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debug/yutu-server"));
    // target/<profile>/deps/<test> -> target/<profile>/yutu-server
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| Some(e.parent()?.parent()?.to_path_buf()))
    {
        candidates.push(dir.join("yutu-server"));
    }
    candidates.into_iter().find(|p| p.is_file())
}

/// A scratch directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("yutu-kv-live-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running server, killed when dropped.
struct Server {
    child: Child,
    url: String,
    _data: Scratch,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_server(name: &str) -> Option<Server> {
    start_server_with(name, None)
}

/// As `start_server`; with `config`, the node runs with authentication and that TOML.
fn start_server_with(name: &str, config: Option<&str>) -> Option<Server> {
    let Some(bin) = server_binary() else {
        // In CI the binaries are always built first: a missing one is a failure there.
        assert!(
            std::env::var_os("CI").is_none(),
            "yutu-server is not built; the test command builds it before the tests"
        );
        eprintln!(
            "SKIPPED: yutu-server is not built (looked in $YUTU_BIN_DIR and target/debug); \
             run `cargo build -p yutu-server` first"
        );
        return None;
    };
    let data = Scratch::new(name);
    let mut cmd = Command::new(bin);
    match config {
        Some(text) => {
            let path = data.0.join("yutu.toml");
            std::fs::write(&path, text).expect("write the config");
            cmd.arg("--config").arg(path);
        }
        None => {
            cmd.arg("--no-auth");
        }
    }
    let mut child = cmd
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data.0.join("data"))
        .args(["--memory", "128MiB", "--nvme-capacity", "0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn yutu-server");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
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
    let addr = match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(Ok(addr)) => addr,
        other => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("yutu-server did not announce its address: {other:?}");
        }
    };
    Some(Server {
        child,
        url: format!("http://{addr}"),
        _data: data,
    })
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn blocks_round_trip_through_registered_buffers() {
    let Some(server) = start_server("roundtrip") else {
        return;
    };
    Client::new(&server.url)
        .unwrap()
        .create_bucket("kvlive")
        .unwrap();
    let kv = KvClient::new(&server.url, KvOptions::default()).expect("kv client");
    let buf = kv.register(32 << 20).unwrap();
    assert!(buf.len() >= 32 << 20);

    let sizes: [u64; 5] = [1024, 65_536, (1 << 20) + 7, 3 << 20, 4 << 20];
    let keys: Vec<String> = (0..sizes.len()).map(|i| format!("blk-{i}")).collect();
    let mut offsets = Vec::new();
    let mut at = 0u64;
    for (i, s) in sizes.iter().enumerate() {
        buf.write_at(at, &pattern(*s as usize, i as u64 + 3))
            .unwrap();
        offsets.push(at);
        at += s;
    }
    let etags = kv
        .batch_put_from("kvlive", &keys, &buf, &offsets, &sizes)
        .expect("batch put");
    assert_eq!(etags.len(), sizes.len());
    assert!(etags.iter().all(|e| !e.is_empty()), "{etags:?}");

    // Visible through S3 too.
    let s3 = Client::new(&server.url).unwrap();
    assert_eq!(
        s3.get_bytes("kvlive", "blk-2").unwrap(),
        pattern(sizes[2] as usize, 5)
    );

    // get-into other offsets (in reverse order, with a missing key in the middle).
    let mut probe: Vec<String> = keys.iter().rev().cloned().collect();
    probe.insert(2, "missing".into());
    let base = 16u64 << 20;
    let mut into = Vec::new();
    let mut at = base;
    for k in &probe {
        into.push(at);
        at += match keys.iter().position(|x| x == k) {
            Some(i) => sizes[i],
            None => 4096,
        };
    }
    let copied = kv
        .batch_get_into("kvlive", &probe, &buf, &into)
        .expect("get-into");
    for (j, k) in probe.iter().enumerate() {
        match keys.iter().position(|x| x == k) {
            Some(i) => {
                assert_eq!(copied[j], Some(sizes[i]), "{k}");
                let mut back = vec![0u8; sizes[i] as usize];
                buf.read_at(into[j], &mut back).unwrap();
                assert!(
                    back == pattern(sizes[i] as usize, i as u64 + 3),
                    "{k} bytes"
                );
            }
            None => assert_eq!(copied[j], None, "{k}"),
        }
    }
    // The node mapped the buffer once: more calls cost it no check round trip with this
    // client's engine (the same-host fast path stays one memcpy per block).
    let checks = kv.engine().stats().shm_listener.requests;
    for _ in 0..3 {
        kv.batch_get_into("kvlive", &probe, &buf, &into)
            .expect("get-into again");
    }
    assert_eq!(
        kv.engine().stats().shm_listener.requests,
        checks,
        "the node asked this engine again for a buffer it had mapped"
    );

    // exists, prefix, remove.
    assert_eq!(
        kv.batch_exists("kvlive", &probe).unwrap(),
        vec![true, true, false, true, true, true]
    );
    assert_eq!(kv.prefix("kvlive", &probe).unwrap(), 2);
    assert_eq!(kv.prefix("kvlive", &keys).unwrap(), keys.len());
    assert_eq!(
        kv.remove("kvlive", &[keys[0].clone(), "missing".into()])
            .unwrap(),
        vec![true, false]
    );
    assert_eq!(kv.prefix("kvlive", &keys).unwrap(), 0);
    assert!(s3.get_bytes("kvlive", &keys[0]).unwrap_err().is_not_found());

    // Chained block hashes as keys.
    let tokens: Vec<u32> = (0..3 * 512).collect();
    let chain: Vec<String> = BlockHasher::new(512)
        .hash_tokens(&tokens)
        .iter()
        .map(|h| h.to_key())
        .collect();
    assert_eq!(chain.len(), 3);
    kv.batch_put_from("kvlive", &chain[..2], &buf, &[0, 1024], &[1024, 1024])
        .unwrap();
    assert_eq!(kv.prefix("kvlive", &chain).unwrap(), 2);

    // Local argument checks: nothing is sent.
    let one = vec!["k".to_string()];
    for e in [
        kv.batch_put_from("kvlive", &one, &buf, &[0, 1], &[1]),
        kv.batch_put_from("kvlive", &one, &buf, &[buf.len()], &[1]),
        kv.batch_put_from("kvlive", &one, &buf, &[u64::MAX], &[2]),
    ] {
        assert!(matches!(e, Err(KvError::InvalidArgument(_))), "{e:?}");
    }
    let e = kv.batch_get_into("kvlive", &[one[0].clone(), "j".into()], &buf, &[8, 8]);
    assert!(matches!(e, Err(KvError::InvalidArgument(_))), "{e:?}");
    let other = kv.register(4096).unwrap();
    let kv2 = KvClient::new(&server.url, KvOptions::default()).unwrap();
    let e = kv2.batch_put_from("kvlive", &one, &other, &[0], &[1]);
    assert!(matches!(e, Err(KvError::InvalidArgument(_))), "{e:?}");
    assert!(kv.batch_exists("kvlive", &[]).unwrap().is_empty());

    // Server errors keep their S3 code.
    let e = kv.batch_exists("nosuchbucket", &one).unwrap_err();
    assert_eq!(e.code(), Some("NoSuchBucket"), "{e}");
    let e = kv
        .batch_put_from("nosuchbucket", &one, &buf, &[0], &[1])
        .unwrap_err();
    assert_eq!(e.code(), Some("NoSuchBucket"), "{e}");
    // A target too small for the block: the server refuses, the client reports it.
    let e = kv
        .batch_get_into_ranges("kvlive", &[keys[4].clone()], &buf, &[0], &[1024])
        .unwrap_err();
    assert_eq!(e.code(), Some("InvalidArgument"), "{e}");
}

#[test]
fn two_phase_puts_write_into_the_node_and_publish() {
    let Some(server) = start_server("twophase") else {
        return;
    };
    Client::new(&server.url)
        .unwrap()
        .create_bucket("kvtwo")
        .unwrap();
    let options = KvOptions {
        put_ttl_ms: Some(5_000),
        ..KvOptions::default()
    };
    let kv = KvClient::new(&server.url, options).expect("kv client");
    let buf = kv.register(8 << 20).unwrap();
    let sizes: [u64; 3] = [4096, (1 << 20) + 3, 0];
    let keys: Vec<String> = (0..sizes.len()).map(|i| format!("two-{i}")).collect();
    let offsets = [0u64, 4096, 4096 + sizes[1]];
    for (i, (&off, &len)) in offsets.iter().zip(&sizes).enumerate() {
        buf.write_at(off, &pattern(len as usize, i as u64 + 11))
            .unwrap();
    }
    let etags = kv
        .batch_put_two_phase("kvtwo", &keys, &buf, &offsets, &sizes)
        .expect("two-phase put");
    assert_eq!(etags.len(), keys.len());
    assert!(etags.iter().all(|e| !e.is_empty()), "{etags:?}");
    let s3 = Client::new(&server.url).unwrap();
    assert_eq!(
        s3.get_bytes("kvtwo", "two-1").unwrap(),
        pattern(sizes[1] as usize, 12)
    );
    let into = [4u64 << 20, 5 << 20, 7 << 20];
    let copied = kv.batch_get_into("kvtwo", &keys, &buf, &into).unwrap();
    assert_eq!(copied, vec![Some(sizes[0]), Some(sizes[1]), Some(0)]);
    let mut back = vec![0u8; sizes[0] as usize];
    buf.read_at(into[0], &mut back).unwrap();
    assert!(back == pattern(sizes[0] as usize, 11));

    // The ttl is sent: one the node refuses fails the put before anything is reserved.
    let bad = KvOptions {
        put_ttl_ms: Some(600_000),
        ..KvOptions::default()
    };
    let kv_bad = KvClient::new(&server.url, bad).unwrap();
    let bad_buf = kv_bad.register(4096).unwrap();
    let e = kv_bad
        .batch_put_two_phase("kvtwo", &keys[..1], &bad_buf, &[0], &[16])
        .unwrap_err();
    assert_eq!(e.code(), Some("InvalidArgument"), "{e}");
}

fn yutu(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_yutu"))
        .args(args)
        .env("YUTU_URL", url)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "yutu failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn cli_kv_put_get_exists_prefix() {
    let Some(server) = start_server("cli") else {
        return;
    };
    let dir = Scratch::new("cli-files");
    ok(&yutu(&server.url, &["mb", "kvcli"]));
    let data = pattern((2 << 20) + 13, 9);
    let src = dir.0.join("in.bin");
    std::fs::write(&src, &data).unwrap();
    ok(&yutu(
        &server.url,
        &["kv", "put", "kvcli", "blk", src.to_str().unwrap()],
    ));
    let dst = dir.0.join("out.bin");
    ok(&yutu(
        &server.url,
        &["kv", "get", "kvcli", "blk", dst.to_str().unwrap()],
    ));
    assert!(std::fs::read(&dst).unwrap() == data, "kv get bytes");

    let out = ok(&yutu(
        &server.url,
        &["kv", "exists", "kvcli", "blk", "nope"],
    ));
    assert_eq!(out, "true\tblk\nfalse\tnope\n");

    let o = yutu(
        &server.url,
        &["kv", "get", "kvcli", "nope", dst.to_str().unwrap()],
    );
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("NoSuchKey"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );

    // prefix: store the first two 512-token blocks of a 3-block prompt (plus a partial tail).
    let tokens: Vec<u32> = (0..3 * 512 + 100).map(|t| t * 7 % 50_000).collect();
    let chain: Vec<String> = BlockHasher::new(512)
        .hash_tokens(&tokens)
        .iter()
        .map(|h| h.to_key())
        .collect();
    for k in &chain[..2] {
        ok(&yutu(
            &server.url,
            &["kv", "put", "kvcli", k, src.to_str().unwrap()],
        ));
    }
    let tok = dir.0.join("tokens.txt");
    let text: Vec<String> = tokens.iter().map(|t| t.to_string()).collect();
    std::fs::write(&tok, text.join(" ")).unwrap();
    let out = ok(&yutu(
        &server.url,
        &["kv", "prefix", "kvcli", "--tokens", tok.to_str().unwrap()],
    ));
    assert_eq!(out.trim(), "2");
}

#[test]
fn signed_calls_work_against_a_node_with_authentication() {
    const AK: &str = "AKIAKVLIVE000000001";
    const SK: &str = "kv-live-secret-0000000000000000000000000";
    let config =
        format!("[[users]]\nname = \"engine\"\naccess_key = \"{AK}\"\nsecret_key = \"{SK}\"\n");
    let Some(server) = start_server_with("signed", Some(&config)) else {
        return;
    };
    let creds = Credentials::new(AK, SK);
    // The bucket, with a request signed by hand through the same signer.
    let host = server.url.trim_start_matches("http://").to_string();
    let mut req = ureq::put(format!("{}/signed", server.url));
    for (name, value) in creds.sign(
        "PUT",
        &host,
        "/signed",
        "",
        b"",
        std::time::SystemTime::now(),
    ) {
        req = req.header(name, value);
    }
    assert_eq!(req.send_empty().expect("create bucket").status(), 200);

    // Unsigned: refused, and the error says so.
    let err = KvClient::new(&server.url, KvOptions::default()).unwrap_err();
    assert_eq!(err.code(), Some("AccessDenied"), "{err}");
    // A wrong secret: refused.
    let wrong = KvOptions {
        credentials: Some(Credentials::new(AK, "not-the-secret")),
        ..KvOptions::default()
    };
    let err = KvClient::new(&server.url, wrong).unwrap_err();
    assert_eq!(err.code(), Some("SignatureDoesNotMatch"), "{err}");

    let kv = KvClient::new(
        &server.url,
        KvOptions {
            credentials: Some(creds),
            ..KvOptions::default()
        },
    )
    .expect("signed kv client");
    let buf = kv.register(1 << 20).unwrap();
    buf.write_at(0, &pattern(4096, 5)).unwrap();
    let keys = vec!["a".to_string()];
    kv.batch_put_from("signed", &keys, &buf, &[0], &[4096])
        .expect("signed put-from");
    assert_eq!(kv.batch_exists("signed", &keys).unwrap(), vec![true]);
    let copied = kv.batch_get_into("signed", &keys, &buf, &[8192]).unwrap();
    assert_eq!(copied, vec![Some(4096)]);
    let mut back = vec![0u8; 4096];
    buf.read_at(8192, &mut back).unwrap();
    assert_eq!(back, pattern(4096, 5));
}

// ---- a signed KvClient whose base URL has a path prefix (`http://proxy/yutu`) ----------
//
// A node serves its API at the root of its listener: it has no setting to be mounted under a
// prefix, and it routes on the first path segment (the bucket, or `v1` for the KV API). A
// prefixed base URL therefore reaches a node only through a reverse proxy that strips the
// prefix. The node verifies a SigV4 signature over the path it receives, without the prefix,
// so the client must sign the path after the base URL, not the whole URL path.

const AK: &str = "AKIAKVPREFIX0000001";
const SK: &str = "kv-prefix-secret-000000000000000000000";
const PREFIX: &str = "/yutu";

/// A reverse proxy that serves `upstream` under `PREFIX`: it strips the prefix from the
/// request line (refusing targets outside it with 404) and passes everything else, the Host
/// header included, through unchanged. One request per connection (`connection: close` is
/// added upstream, so the node closes after answering and the client does not reuse it).
/// Returns the proxy's address and how many requests it forwarded.
fn stripping_proxy(upstream: String) -> (String, mpsc::Receiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (seen_tx, seen) = mpsc::channel();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            let upstream = upstream.clone();
            let seen_tx = seen_tx.clone();
            std::thread::spawn(move || {
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
    let upload = std::thread::spawn(move || {
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
    let users =
        format!("[[users]]\nname = \"engine\"\naccess_key = \"{AK}\"\nsecret_key = \"{SK}\"\n");
    let Some(node) = start_server_with("prefix", Some(&users)) else {
        return;
    };
    let addr = node.url.trim_start_matches("http://").to_string();
    let (proxy, seen) = stripping_proxy(addr.clone());
    let base = format!("http://{proxy}{PREFIX}");
    let creds = Credentials::new(AK, SK);

    // The bucket, directly at the node (a signed S3 call that does not go through the proxy).
    let mut req = ureq::put(format!("{}/prefixed", node.url));
    for (name, value) in creds.sign(
        "PUT",
        &addr,
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

/// The path an engine's own host memory takes (shared with the Python package): spans of
/// plain heap memory are staged through the pool, chunk by chunk through the two halves of a
/// buffer (a chunk of 64 KiB splits this batch into several), scattered over several spans
/// per key; spans inside one range registered in place go in one call with no staging. Both
/// read back byte for byte, and a device span is refused before anything moves.
#[test]
fn an_engines_host_memory_is_staged_or_reached_in_place() {
    use yutu_client::kv::{PutOptions, Span, SpanStaging};
    let Some(server) = start_server("spans") else {
        return;
    };
    Client::new(&server.url)
        .unwrap()
        .create_bucket("spans")
        .unwrap();
    let kv = KvClient::new(&server.url, KvOptions::default()).expect("kv client");
    let staging = SpanStaging::new(64 << 10, 2);
    let span = |v: &[u8]| Span {
        addr: v.as_ptr() as usize,
        len: v.len() as u64,
        device: None,
    };
    // Staged: each key's value gathered from two spans of unregistered heap memory.
    let sizes = [5_000usize, 70_000, 1, 200_000, 33_333];
    let keys: Vec<String> = (0..sizes.len()).map(|i| format!("staged-{i}")).collect();
    let values: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| pattern(n, 40 + i as u64))
        .collect();
    let halves: Vec<[Span; 2]> = values
        .iter()
        .map(|v| {
            let (a, b) = v.split_at(v.len() / 2);
            [span(a), span(b)]
        })
        .collect();
    let srcs: Vec<&[Span]> = halves.iter().map(|h| &h[..]).collect();
    staging
        .put_from_parts(&kv, "spans", &keys, &srcs, &PutOptions::default())
        .expect("staged put");
    let mut outs: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
    let dests: Vec<Span> = outs.iter_mut().map(|v| span(v)).collect();
    let got = staging
        .get_into(&kv, "spans", &keys, &dests)
        .expect("staged get");
    assert_eq!(
        got,
        sizes.iter().map(|&n| Some(n as u64)).collect::<Vec<_>>()
    );
    assert_eq!(outs, values);
    assert_eq!(
        staging.in_place.path(dests[0].addr),
        None,
        "never registered"
    );

    // In place: one registered range holds both the sources and the targets.
    let mut region = vec![0u8; 1 << 20];
    let base = region.as_mut_ptr() as usize;
    // SAFETY: `region` outlives every call below and is unregistered before it is dropped.
    unsafe { staging.in_place.register(&kv, base, region.len() as u64) };
    assert_eq!(
        staging.in_place.path(base).as_deref(),
        Some("in place"),
        "a heap range the engine registers as it is"
    );
    let v = pattern(300_000, 77);
    region[..v.len()].copy_from_slice(&v);
    let src = Span {
        addr: base,
        len: v.len() as u64,
        device: None,
    };
    staging
        .put_from(
            &kv,
            "spans",
            &["in-place".to_string()],
            &[src],
            &PutOptions::default(),
        )
        .expect("in-place put");
    let dst = Span {
        addr: base + (512 << 10),
        len: 400_000,
        device: None,
    };
    let got = staging
        .get_into(&kv, "spans", &["in-place".to_string()], &[dst])
        .expect("in-place get");
    assert_eq!(got, vec![Some(v.len() as u64)]);
    assert_eq!(&region[512 << 10..(512 << 10) + v.len()], &v[..]);
    staging.in_place.unregister(base);

    // The client's own memory (objects it holds for the call, never a caller's pointer): no
    // registration of the caller's, gathered from two heap vectors and scattered into two
    // others, in place once the own-memory registration is made on first use.
    assert!(!kv.own_memory_registered());
    let (a, b) = (pattern(90_000, 81), pattern(7, 82));
    let own_keys = ["own-0".to_string(), "own-1".to_string()];
    staging
        .put_from_own(
            &kv,
            "spans",
            &own_keys,
            &[&[span(&a), span(&b)], &[span(&b)]],
            &PutOptions::default(),
        )
        .expect("own put");
    assert!(kv.own_memory_registered());
    let (mut x, mut y, mut z) = (vec![0u8; 50_000], vec![0u8; 60_000], vec![0u8; 7]);
    let span_mut = |v: &mut Vec<u8>| Span {
        addr: v.as_mut_ptr() as usize,
        len: v.len() as u64,
        device: None,
    };
    let (sx, sy, sz) = (span_mut(&mut x), span_mut(&mut y), span_mut(&mut z));
    let got = staging
        .get_into_own(&kv, "spans", &own_keys, &[&[sx, sy], &[sz]])
        .expect("own get");
    assert_eq!(got, vec![Some(90_007), Some(7)]);
    let joined: Vec<u8> = a.iter().chain(&b).copied().collect();
    assert_eq!(&x[..], &joined[..50_000]);
    assert_eq!(&y[..40_007], &joined[50_000..]);
    assert_eq!(z, b);
    // get_bytes of a value past 64 KiB: written by the node into the new vector.
    assert_eq!(
        kv.get_bytes("spans", "own-0").unwrap(),
        Some(joined.clone())
    );
    assert_eq!(kv.get_bytes("spans", "own-1").unwrap(), Some(b.clone()));
    assert_eq!(kv.get_bytes("spans", "absent").unwrap(), None);
    // A client reaching the node by TCP (as from another host) never registers its own
    // memory: large values come as before, and only registered memory is reached in place.
    let remote = KvClient::new(
        &server.url,
        KvOptions {
            frames: yutu_client::kv::FramesMode::Tcp,
            ..KvOptions::default()
        },
    )
    .expect("kv client over tcp frames");
    assert_eq!(
        remote.get_bytes("spans", "own-0").unwrap(),
        Some(joined.clone())
    );
    let staged = SpanStaging::new(64 << 10, 2);
    let mut far = vec![0u8; 90_007];
    let got = staged
        .get_into_own(&remote, "spans", &own_keys[..1], &[&[span_mut(&mut far)]])
        .expect("staged own get");
    assert_eq!(got, vec![Some(90_007)]);
    assert_eq!(far, joined);
    assert!(!remote.own_memory_registered());
    // Too little room: refused, and nothing written.
    let mut small = vec![0u8; 10];
    let err = staging.get_into_own(&kv, "spans", &own_keys[..1], &[&[span_mut(&mut small)]]);
    let err = err.expect_err("a block larger than its room is refused");
    assert!(err.to_string().contains("has 10 bytes"), "{err}");
    assert_eq!(small, vec![0u8; 10]);
    x.clear();
    y.clear();
    z.clear();

    let gpu = Span {
        addr: base,
        len: 16,
        device: Some(0),
    };
    let err = staging
        .get_into(&kv, "spans", &["in-place".to_string()], &[gpu])
        .expect_err("device memory is not staged through host buffers");
    assert!(matches!(err, KvError::InvalidArgument(_)), "{err}");
}

/// Memory an engine allocated through Yutu (a sealable memfd it mapped itself) is registered
/// as that memfd, which the node maps: a range in the middle of the mapping moves blocks at
/// the right offsets both ways, and a memfd that cannot be sealed is refused (the node maps
/// only memfds that cannot shrink under it) and falls back to process memory.
#[test]
fn an_engines_memfd_is_handed_to_the_node() {
    use std::os::fd::{AsFd, FromRawFd, OwnedFd};
    use yutu_client::kv::{PutOptions, Span, SpanStaging};
    let Some(server) = start_server("memfd") else {
        return;
    };
    Client::new(&server.url)
        .unwrap()
        .create_bucket("memfd")
        .unwrap();
    let kv = KvClient::new(&server.url, KvOptions::default()).expect("kv client");
    let memfd = |flags: libc::c_uint, len: usize| -> (OwnedFd, *mut u8) {
        // SAFETY: a fresh memfd, sized and mapped shared here; the test unmaps nothing while
        // the engine uses it (the process ends with the test).
        unsafe {
            let fd = libc::memfd_create(c"yutu-test-pool".as_ptr(), flags);
            assert!(fd >= 0, "memfd_create");
            assert_eq!(libc::ftruncate(fd, len as libc::off_t), 0);
            let p = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            (OwnedFd::from_raw_fd(fd), p.cast())
        }
    };
    let len = 4 << 20;
    let (fd, base) = memfd(libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING, len);
    // SAFETY: the mapping made above, `len` bytes, never unmapped.
    let pool = unsafe { std::slice::from_raw_parts_mut(base, len) };
    let staging = SpanStaging::new(64 << 10, 2);
    let reg = base as usize + (1 << 20);
    // SAFETY: the range lies in the mapping of `fd` at `base`, mapped for the whole test.
    unsafe {
        staging
            .in_place
            .register_memfd(&kv, reg, 2 << 20, fd.as_fd(), base as usize, len as u64)
    };
    assert_eq!(
        staging.in_place.path(reg).as_deref(),
        Some("in place: memfd")
    );
    let v = pattern(300_000, 91);
    pool[(1 << 20) + 4096..(1 << 20) + 4096 + v.len()].copy_from_slice(&v);
    let src = Span {
        addr: reg + 4096,
        len: v.len() as u64,
        device: None,
    };
    let key = ["memfd-block".to_string()];
    staging
        .put_from(&kv, "memfd", &key, &[src], &PutOptions::default())
        .expect("put from the memfd");
    assert_eq!(
        kv.get_bytes("memfd", &key[0]).unwrap().as_deref(),
        Some(&v[..])
    );
    let dst = Span {
        addr: reg + (1 << 20),
        len: 400_000,
        device: None,
    };
    let got = staging
        .get_into(&kv, "memfd", &key, &[dst])
        .expect("get into the memfd");
    assert_eq!(got, vec![Some(v.len() as u64)]);
    assert_eq!(&pool[(2 << 20)..(2 << 20) + v.len()], &v[..]);
    staging.in_place.unregister(reg);

    // Not sealable: refused as a memfd, registered as plain process memory instead.
    let (plain, pbase) = memfd(libc::MFD_CLOEXEC, 1 << 20);
    let err = kv
        .register_memfd(plain.as_fd(), 1 << 20)
        .expect_err("a memfd that can shrink is refused");
    assert!(matches!(err, KvError::InvalidArgument(_)), "{err}");
    // SAFETY: as above.
    unsafe {
        staging.in_place.register_memfd(
            &kv,
            pbase as usize,
            1 << 20,
            plain.as_fd(),
            pbase as usize,
            1 << 20,
        )
    };
    assert_eq!(
        staging.in_place.path(pbase as usize).as_deref(),
        Some("in place")
    );
}

/// An anonymous mapping of `len` bytes whose first byte is 2 MiB-aligned, every byte written
/// (so every page is resident); unmapped when dropped.
struct Filled {
    base: *mut u8,
    raw: *mut libc::c_void,
    raw_len: usize,
    len: usize,
}

impl Filled {
    fn new(len: usize) -> Filled {
        let raw_len = len + (2 << 20);
        // SAFETY: a fresh private anonymous mapping, unmapped in `drop`.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                raw_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(raw, libc::MAP_FAILED);
        let base = (raw as usize).next_multiple_of(2 << 20) as *mut u8;
        // SAFETY: `[base, base + len)` lies inside the mapping just made.
        unsafe { std::ptr::write_bytes(base, 0x5a, len) };
        Filled {
            base,
            raw,
            raw_len,
            len,
        }
    }

    /// Whether any part of `[base, base + len)` is advised `MADV_HUGEPAGE` (`hg` among its
    /// `VmFlags` in `/proc/self/smaps`), and its bytes in huge pages (`AnonHugePages`).
    fn huge(&self) -> (bool, u64) {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let (start, end) = (self.base as usize, self.base as usize + self.len);
        let (mut inside, mut advised, mut huge) = (false, false, 0u64);
        for line in smaps.lines() {
            let range = line.split_once(' ').and_then(|(r, _)| r.split_once('-'));
            if let Some((a, b)) = range.and_then(|(a, b)| {
                Some((
                    usize::from_str_radix(a, 16).ok()?,
                    usize::from_str_radix(b, 16).ok()?,
                ))
            }) {
                inside = a < end && b > start;
            } else if inside {
                if let Some(kb) = line.strip_prefix("AnonHugePages:") {
                    huge += kb
                        .trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<u64>()
                        .unwrap()
                        << 10;
                } else if let Some(flags) = line.strip_prefix("VmFlags:") {
                    advised |= flags.split_whitespace().any(|f| f == "hg");
                }
            }
        }
        (advised, huge)
    }
}

impl Drop for Filled {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.raw, self.raw_len) };
    }
}

/// Whether this kernel collapses resident memory into transparent huge pages on request
/// (`MADV_COLLAPSE`, Linux 6.1, with transparent huge pages not turned off).
fn kernel_collapses() -> bool {
    let thp =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut v = release
        .trim()
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().ok());
    let (major, minor) = (v.next().flatten(), v.next().flatten());
    !thp.is_empty()
        && !thp.contains("[never]")
        && matches!((major, minor), (Some(ma), Some(mi)) if (ma, mi) >= (6, 1))
}

/// A host range an engine registers is advised to use transparent huge pages, and what it
/// has already filled is collapsed into them (the node's cross-memory copies then run about
/// twice as fast). The client's own-memory registration, which spans the whole address
/// space, advises nothing: memory the client never registered keeps its pages.
#[test]
fn a_registered_host_range_is_backed_by_huge_pages_and_nothing_else_is() {
    use yutu_client::kv::{PutOptions, Span, SpanStaging};
    let Some(server) = start_server("huge") else {
        return;
    };
    Client::new(&server.url)
        .unwrap()
        .create_bucket("huge")
        .unwrap();
    let kv = KvClient::new(&server.url, KvOptions::default()).expect("kv client");
    let bystander = Filled::new(8 << 20);
    let engine = Filled::new(8 << 20);
    assert_eq!(engine.huge(), (false, 0), "plain pages before registration");

    // The own-memory registration (made on the first put of the client's own objects).
    let staging = SpanStaging::new(64 << 10, 2);
    let value = pattern(200_000, 3);
    let span = Span {
        addr: value.as_ptr() as usize,
        len: value.len() as u64,
        device: None,
    };
    staging
        .put_from_own(
            &kv,
            "huge",
            &["own".to_string()],
            &[&[span]],
            &PutOptions::default(),
        )
        .expect("own put");
    assert!(kv.own_memory_registered());
    assert_eq!(bystander.huge(), (false, 0), "own memory advises nothing");

    // SAFETY: `engine` stays mapped until after `buf` is dropped.
    let buf = unsafe { kv.register_host(engine.base, engine.len as u64) }.expect("register");
    let (advised, huge) = engine.huge();
    assert!(advised, "the registered range is advised MADV_HUGEPAGE");
    if kernel_collapses() {
        assert!(
            huge >= 2 << 20,
            "its resident chunks are collapsed: {huge} bytes in huge pages"
        );
    }
    // SAFETY: the range is the engine's mapping, alive for the borrow.
    let bytes = unsafe { std::slice::from_raw_parts(engine.base, engine.len) };
    assert!(bytes.iter().all(|b| *b == 0x5a), "the bytes are kept");
    assert_eq!(bystander.huge(), (false, 0));
    drop(buf);
}
