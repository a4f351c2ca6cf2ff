//! The README's curl examples work as written (against a server on an ephemeral port).

use std::process::Command;

use yutu_tests::Server;

#[test]
fn readme_curl_examples_run() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md at the workspace root");
    let block = readme
        .split("<!-- curl-examples:start -->")
        .nth(1)
        .and_then(|rest| rest.split("<!-- curl-examples:end -->").next())
        .expect("the README marks its curl examples");
    let commands: Vec<&str> = block
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("curl "))
        .collect();
    assert!(
        commands.len() >= 8,
        "found {} curl examples",
        commands.len()
    );
    // As the README starts it: authentication on, the first admin token in the data dir.
    let data = tempfile::tempdir().expect("data dir");
    let mut start = Command::new(yutu_tests::bin_path("yutu-server"));
    start
        .args([
            "--listen",
            "127.0.0.1:0",
            "--memory",
            "64MiB",
            "--nvme-capacity",
            "0",
        ])
        .arg("--data-dir")
        .arg(data.path().join("yutu-data"));
    let server = Server::spawn(start, data);
    assert!(
        block.contains("export TOKEN=$(cat yutu-data/auth/admin-token)"),
        "the README takes the token from where the node saves it"
    );
    let token = std::fs::read_to_string(
        server
            .data_dir
            .path()
            .join("yutu-data")
            .join(yutu_api::token::FIRST_TOKEN_FILE),
    )
    .expect("the node saved its first admin token");
    // Without the token the node refuses: the examples prove something.
    assert_eq!(server.client().put("/demo", b"").status, 403);
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    for cmd in commands {
        let line = cmd.replace("http://127.0.0.1:9000", &server.url).replacen(
            "curl ",
            "curl -sS --fail-with-body -o /dev/null ",
            1,
        );
        let out = Command::new("sh")
            .arg("-c")
            .arg(&line)
            .env("TOKEN", token.trim())
            .current_dir(root)
            .output()
            .expect("run sh");
        assert!(
            out.status.success(),
            "README example failed: {cmd}\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
