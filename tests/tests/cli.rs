//! The `yutu` CLI against the real server.

use std::process::{Command, Output};

use yutu_tests::{bin_path, pattern, Server};

fn yutu(server: &Server, args: &[&str]) -> Output {
    Command::new(bin_path("yutu"))
        .arg("--url")
        .arg(&server.url)
        .args(args)
        .output()
        .expect("run yutu")
}

fn ok(server: &Server, args: &[&str]) -> String {
    let out = yutu(server, args);
    assert!(
        out.status.success(),
        "yutu {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn cli_round_trip() {
    let server = Server::start(&["--memory", "64MiB"]);
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("in.bin");
    let data = pattern(6 << 20, 3);
    std::fs::write(&src, &data).unwrap();

    ok(&server, &["mb", "cli"]);
    assert!(ok(&server, &["ls"]).contains("cli"));
    ok(&server, &["put", src.to_str().unwrap(), "cli/dir/in.bin"]);
    ok(&server, &["put", src.to_str().unwrap(), "cli/top.bin"]);

    let listing = ok(&server, &["ls", "cli"]);
    assert!(
        listing.contains("PRE") && listing.contains("dir/"),
        "{listing}"
    );
    assert!(listing.contains("top.bin"), "{listing}");
    let recursive = ok(&server, &["ls", "cli", "--recursive"]);
    assert!(recursive.contains("dir/in.bin") && recursive.contains(&data.len().to_string()));

    let stat = ok(&server, &["stat", "cli/dir/in.bin"]);
    assert!(stat.contains(&data.len().to_string()), "{stat}");
    assert!(stat.contains(&yutu_tests::etag_of(&data)), "{stat}");

    let dst = dir.path().join("out.bin");
    ok(&server, &["get", "cli/dir/in.bin", dst.to_str().unwrap()]);
    assert!(std::fs::read(&dst).unwrap() == data);
    let stdout = yutu(&server, &["get", "cli/top.bin", "-"]);
    assert!(stdout.status.success() && stdout.stdout == data);

    // Errors: S3 code on stderr, exit status 1.
    let out = yutu(&server, &["rb", "cli"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("BucketNotEmpty"));
    let out = yutu(&server, &["get", "cli/missing", "-"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("NoSuchKey"));

    ok(&server, &["rm", "cli/dir/in.bin"]);
    ok(&server, &["rm", "cli/top.bin"]);
    ok(&server, &["rb", "cli"]);
    assert!(!ok(&server, &["ls"]).contains("cli"));
}
