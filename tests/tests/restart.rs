//! What survives a restart of the node: bucket definitions (with owner and durability).

use yutu_tests::{xml, Server};

#[test]
fn buckets_survive_kill_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_on(dir.path(), &["--memory", "64MiB"]);
    let c = server.client();
    c.mb("kept-a");
    let r = c.send(
        "PUT",
        "/kept-disk",
        &[("x-yutu-durability", "disk")],
        Some(b""),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r = c.send(
        "PUT",
        "/bad-durability",
        &[("x-yutu-durability", "tape")],
        Some(b""),
    );
    assert_eq!(
        (r.status, r.code().as_deref()),
        (400, Some("InvalidArgument"))
    );
    c.mb("deleted");
    assert_eq!(c.delete("/deleted").status, 204);
    server.kill();

    let server = Server::start_on(dir.path(), &["--memory", "64MiB"]);
    let c = server.client();
    assert_eq!(
        xml::values(&c.get("/").text(), "Name"),
        ["kept-a", "kept-disk"]
    );
    assert_eq!(c.head("/kept-a").status, 200);
    assert_eq!(c.head("/deleted").status, 404);
    // Usable at once, on every shard.
    for i in 0..20 {
        assert_eq!(c.put(&format!("/kept-a/k{i}"), b"v").status, 200);
    }
    // A corrupt catalog stops the node with a clear message instead of losing buckets.
    server.kill();
    std::fs::write(dir.path().join("buckets.json"), b"{garbage").unwrap();
    let out = std::process::Command::new(yutu_tests::bin_path("yutu-server"))
        .args(["--no-auth", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("bucket catalog"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
