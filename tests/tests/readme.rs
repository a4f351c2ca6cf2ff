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
    let server = Server::start(&["--memory", "64MiB"]);
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
