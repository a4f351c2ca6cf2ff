//! Health, metrics, configuration and start-up errors.

use std::process::Command;

use yutu_tests::{bin_path, Server};

#[test]
fn health_and_metrics() {
    let server = Server::start(&["--memory", "64MiB", "--shards", "2"]);
    let c = server.client();
    assert_eq!(c.get("/health").text(), "ok\n");
    assert_eq!(c.get("/ready").status, 200);
    c.mb("mmm");
    c.put("/mmm/a", &[1u8; 1000]);
    c.get("/mmm/a");
    c.get("/mmm/missing");
    let text = c.get("/metrics").text();
    for needle in [
        "# TYPE yutu_requests_total counter",
        "op=\"PutObject\",status=\"200\"",
        "op=\"GetObject\",status=\"404\"",
        "# TYPE yutu_request_duration_seconds histogram",
        "yutu_request_duration_seconds_bucket{shard=",
        "yutu_dram_capacity_bytes{shard=\"1\"} ",
        "yutu_evictions_total{shard=\"0\"} 0",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    assert_eq!(server.metric_sum("yutu_bytes_in_total"), 1000.0);
    assert_eq!(server.metric_sum("yutu_bytes_out_total"), 1000.0);
    assert_eq!(server.metric_sum("yutu_objects"), 1.0);
    assert_eq!(
        server.metric_sum("yutu_dram_capacity_bytes"),
        (64u64 << 20) as f64
    );
    assert!(server.log().contains("listening on"));
}

#[test]
fn config_file_sets_every_knob() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("yutu.toml");
    std::fs::write(
        &cfg,
        "listen = \"127.0.0.1:0\"\nmemory = \"32MiB\"\nshards = 1\nmax_object_size = \"4KiB\"\nno_auth = true\neviction = \"lru\"\nlog_format = \"json\"\n",
    )
    .unwrap();
    let mut cmd = Command::new(bin_path("yutu-server"));
    cmd.arg("--config")
        .arg(&cfg)
        .arg("--data-dir")
        .arg(dir.path().join("data"));
    let server = Server::spawn(cmd, tempfile::tempdir().unwrap());
    let c = server.client();
    c.mb("cfg");
    assert_eq!(c.put("/cfg/small", &[0u8; 4096]).status, 200);
    assert_eq!(
        c.put("/cfg/big", &[0u8; 4097]).code().as_deref(),
        Some("EntityTooLarge")
    );
    assert_eq!(
        server.metric_sum("yutu_dram_capacity_bytes"),
        (32u64 << 20) as f64
    );
    assert!(!c.get("/metrics").text().contains("shard=\"1\""));
    assert!(
        server.log().lines().any(|l| l.starts_with('{')),
        "json logs"
    );
}

#[test]
fn bad_configuration_fails_fast_with_a_message() {
    let run = |args: &[&str]| {
        let out = Command::new(bin_path("yutu-server"))
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} should fail");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(run(&["--no-auth", "--memory", "lots"]).contains("invalid size"));
    assert!(run(&["--no-auth", "--shards", "0"]).contains("--shards"));
    let dir = tempfile::tempdir().unwrap();
    let short = dir.path().join("short-key.toml");
    std::fs::write(&short, "[[token_keys]]\nkid = \"k\"\nsecret = \"short\"\n").unwrap();
    assert!(run(&["--config", short.to_str().unwrap()]).contains("32 bytes"));
    let cfg = dir.path().join("bad.toml");
    std::fs::write(&cfg, "memroy = 5\n").unwrap();
    assert!(run(&["--config", cfg.to_str().unwrap()]).contains("memroy"));
    // A port already in use.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    assert!(run(&[
        "--no-auth",
        "--listen",
        &addr,
        "--data-dir",
        dir.path().to_str().unwrap()
    ])
    .contains("cannot listen"));
}

/// A second node started on a running node's address refuses to start and says why; the first
/// one keeps every connection (before, SO_REUSEPORT let both listen and the kernel split the
/// connections between them).
#[test]
fn a_second_node_on_the_same_address_refuses_to_start() {
    let first = Server::start(&["--memory", "32MiB", "--shards", "2"]);
    let dir = tempfile::tempdir().unwrap();
    let mut second = Command::new(bin_path("yutu-server"))
        .args(["--listen", &first.addr.to_string(), "--no-auth"])
        .args(["--memory", "32MiB", "--shards", "2", "--nvme-capacity", "0"])
        .arg("--data-dir")
        .arg(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut exited = None;
    yutu_tests::server::wait_until(std::time::Duration::from_secs(20), || {
        exited = second.try_wait().unwrap();
        exited.is_some()
    });
    let Some(status) = exited else {
        let _ = second.kill();
        let _ = second.wait();
        panic!("the second node is still running on {}", first.addr);
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut second.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success(), "{err}");
    assert!(err.contains("in use"), "{err}");
    assert_eq!(first.client().get("/health").status, 200);
}

/// Past --max-connections a shard answers a new connection 503 SlowDown and closes it (one
/// client cannot take every file descriptor); once a connection closes, new ones are served.
#[test]
fn connections_past_the_limit_are_refused_and_counted() {
    use std::io::{Read, Write};
    let server = Server::start(&[
        "--memory",
        "32MiB",
        "--shards",
        "1",
        "--max-connections",
        "4",
    ]);
    let ask = |s: &mut std::net::TcpStream| -> String {
        s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let _ = s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
        let mut buf = [0u8; 512];
        let n = s.read(&mut buf).unwrap_or(0);
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    // Four kept-alive connections, each answered (so each is being served).
    let mut held: Vec<std::net::TcpStream> = (0..4)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(server.addr).unwrap();
            assert!(ask(&mut s).starts_with("HTTP/1.1 200"));
            s
        })
        .collect();
    let mut fifth = std::net::TcpStream::connect(server.addr).unwrap();
    let answer = ask(&mut fifth);
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("<Code>SlowDown</Code>"), "{answer}");
    // One closes; a new connection is served again.
    drop(held.pop());
    assert!(yutu_tests::server::wait_until(
        std::time::Duration::from_secs(10),
        || {
            let mut s = std::net::TcpStream::connect(server.addr).unwrap();
            ask(&mut s).starts_with("HTTP/1.1 200")
        }
    ));
    drop(held);
    // (The scrape itself may be refused until the closed connections are noticed.)
    assert!(yutu_tests::server::wait_until(
        std::time::Duration::from_secs(10),
        || server.metric_sum("yutu_connections_refused_total") >= 1.0
    ));
}

/// The `Cpus_allowed_list` of a `/proc` status file (empty when it cannot be read).
fn cpus_allowed(status: &std::path::Path) -> String {
    std::fs::read_to_string(status)
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(|v| v.trim().to_string())
        .unwrap_or_default()
}

/// Each shard thread's `Cpus_allowed_list` (from `/proc`), by thread name.
fn shard_cpus(pid: u32) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let dir = task.unwrap().path();
        let name = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if !name.starts_with("yutu-shard-") {
            continue;
        }
        out.push((name.trim().to_string(), cpus_allowed(&dir.join("status"))));
    }
    out.sort();
    out
}

#[test]
fn shards_are_pinned_to_a_core_each_unless_told_not_to() {
    let ours = cpus_allowed(std::path::Path::new("/proc/self/status"));
    assert!(!ours.is_empty(), "no Cpus_allowed_list for this process");
    // One shard fits on any machine: pinned, its thread may run on CPU 0 only.
    let pinned = Server::start(&["--memory", "32MiB", "--shards", "1"]);
    // (glommio names the shard's helper threads after it.)
    let cpus = shard_cpus(pinned.pid());
    assert!(!cpus.is_empty(), "no shard thread");
    assert!(
        cpus.iter().all(|(_, c)| c == "0"),
        "a pinned shard: {cpus:?}"
    );
    assert!(pinned.log().contains("pinned=true"), "{}", pinned.log());
    drop(pinned);

    // --no-pin (the file's `no_pin` is config's unit test): every CPU this process may use.
    let loose = Server::start(&["--memory", "32MiB", "--shards", "1", "--no-pin"]);
    let cpus = shard_cpus(loose.pid());
    assert!(!cpus.is_empty(), "no shard thread");
    assert!(
        cpus.iter().all(|(_, c)| *c == ours),
        "an unpinned shard: {cpus:?} ({ours})"
    );
    assert!(loose.log().contains("pinned=false"), "{}", loose.log());
    let c = loose.client();
    c.mb("loose");
    assert_eq!(c.put("/loose/a", b"served").status, 200);
    assert_eq!(c.get("/loose/a").body, b"served");
}
