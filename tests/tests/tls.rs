//! HTTPS: with --tls-cert/--tls-key the node serves TLS only (a real client verifying the
//! certificate against its CA reads back what it wrote), and a plain-HTTP request gets no answer.

use std::process::Command;

use yutu_tests::pki::Pki;
use yutu_tests::{pattern, Server};

fn curl(args: &[&str]) -> std::process::Output {
    Command::new("curl")
        .args(["-sS", "--max-time", "20"])
        .args(args)
        .output()
        .expect("curl is installed")
}

#[test]
fn the_node_serves_https_with_its_certificate_and_nothing_in_plain_text() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::make(dir.path());
    let (ca, cert, key) = (
        pki.ca.to_string_lossy().into_owned(),
        pki.cert.to_string_lossy().into_owned(),
        pki.key.to_string_lossy().into_owned(),
    );
    let server = Server::start(&["--memory", "32MiB", "--tls-cert", &cert, "--tls-key", &key]);
    let base = format!("https://{}", server.addr);
    let out = curl(&["--cacert", &ca, &format!("{base}/health")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, b"ok\n");

    let body = dir.path().join("body");
    std::fs::write(&body, pattern(1 << 20, 3)).unwrap();
    let out = curl(&["--cacert", &ca, "-f", "-X", "PUT", &format!("{base}/tls")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = curl(&[
        "--cacert",
        &ca,
        "-f",
        "-T",
        body.to_str().unwrap(),
        &format!("{base}/tls/object"),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = curl(&["--cacert", &ca, "-f", &format!("{base}/tls/object")]);
    assert!(out.stdout == pattern(1 << 20, 3), "wrong bytes over TLS");

    // Frames are not encrypted: a TLS node offers them on its Unix sockets only, never on
    // TCP ports.
    let out = curl(&["--cacert", &ca, "-f", &format!("{base}/v1/kv/frames")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let info: yutu_api::kv_frame::FramesInfo =
        serde_json::from_slice(&out.stdout).expect("frames info");
    assert!(info.tcp.is_empty(), "{info:?}");
    assert!(!info.unix.is_empty(), "{info:?}");

    // A client that does not trust the certificate refuses it...
    assert!(!curl(&[&format!("{base}/health")]).status.success());
    // ...and plain HTTP to the TLS port gets no HTTP answer.
    let out = curl(&[&format!("http://{}/health", server.addr)]);
    assert!(!out.status.success() && !out.stdout.starts_with(b"ok"));
}

#[test]
fn a_bad_certificate_stops_the_start_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate").unwrap();
    let out = Command::new(yutu_tests::bin_path("yutu-server"))
        .args([
            "--no-auth",
            "--listen",
            "127.0.0.1:0",
            "--nvme-capacity",
            "0",
        ])
        .arg("--data-dir")
        .arg(dir.path().join("d"))
        .arg("--tls-cert")
        .arg(&junk)
        .arg("--tls-key")
        .arg(&junk)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("TLS") || err.contains("certificate"), "{err}");
}
