//! The `yutu` binary against a scripted server: output, files, exit status and error lines.

mod common;

use std::process::{Command, Output, Stdio};

use common::{object_headers, FakeServer, Resp};

fn yutu(server: &FakeServer, args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_yutu"));
    cmd.args(args)
        .env("YUTU_URL", &server.url)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    {
        use std::io::Write;
        let mut input = child.stdin.take().unwrap();
        if let Some(data) = stdin {
            input.write_all(data).unwrap();
        }
    }
    child.wait_with_output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("yutu-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn s3_errors_print_code_and_exit_1() {
    // Bucket "b" exists, the key does not.
    let server = FakeServer::start(|r| {
        if r.path() == "/b" {
            Resp::new(200)
        } else {
            Resp::new(404)
        }
    });
    let out = yutu(&server, &["stat", "b/missing"], None);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out),
        "yutu: NoSuchKey: The specified key does not exist.\n"
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn mb_and_rb_errors() {
    let server = FakeServer::start(|r| match r.method.as_str() {
        "PUT" => Resp::s3_error(409, "BucketAlreadyOwnedByYou", "yours"),
        _ => Resp::new(204),
    });
    let out = yutu(&server, &["mb", "b"], None);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stderr(&out), "yutu: BucketAlreadyOwnedByYou: yours\n");
    let out = yutu(&server, &["rb", "s3://b"], None);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn put_from_stdin_and_file() {
    let server = FakeServer::start(|_| Resp::new(200).header("etag", "\"e\""));
    let out = yutu(&server, &["put", "-", "b/from-stdin"], Some(b"piped bytes"));
    assert!(out.status.success(), "{}", stderr(&out));
    let dir = scratch("put");
    let file = dir.join("local.bin");
    std::fs::write(&file, b"file bytes").unwrap();
    let out = yutu(&server, &["put", file.to_str().unwrap(), "b/dir/"], None);
    assert!(out.status.success(), "{}", stderr(&out));
    let reqs = server.requests();
    assert_eq!(reqs[0].target, "/b/from-stdin");
    assert_eq!(reqs[0].body, b"piped bytes");
    assert_eq!(reqs[1].target, "/b/dir/local.bin");
    assert_eq!(reqs[1].body, b"file bytes");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn get_to_stdout_and_file() {
    let server = FakeServer::start(|_| object_headers(Resp::new(200), "e").body("object bytes"));
    let out = yutu(&server, &["get", "b/k"], None);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(out.stdout, b"object bytes");
    assert!(out.stderr.is_empty());

    let dir = scratch("get");
    let file = dir.join("out.bin");
    let out = yutu(&server, &["get", "b/k", file.to_str().unwrap()], None);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(&file).unwrap(), b"object bytes");
    // Into a directory: the key's last segment names the file.
    let out = yutu(
        &server,
        &["get", "b/a/name.txt", dir.to_str().unwrap()],
        None,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        std::fs::read(dir.join("name.txt")).unwrap(),
        b"object bytes"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn failed_get_leaves_no_file() {
    let server = FakeServer::start(|_| Resp::s3_error(404, "NoSuchBucket", "no bucket"));
    let dir = scratch("getfail");
    let file = dir.join("out.bin");
    let out = yutu(&server, &["get", "b/k", file.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stderr(&out), "yutu: NoSuchBucket: no bucket\n");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn ls_buckets_and_objects() {
    let server = FakeServer::start(|r| {
        if r.path() == "/" {
            return Resp::new(200).xml("<ListAllMyBucketsResult><Buckets><Bucket><Name>alpha</Name><CreationDate>2026-01-01T00:00:00.000Z</CreationDate></Bucket></Buckets></ListAllMyBucketsResult>");
        }
        Resp::new(200).xml("<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>dir/f</Key><LastModified>2026-01-01T00:00:00.000Z</LastModified><ETag>\"e\"</ETag><Size>42</Size></Contents><CommonPrefixes><Prefix>dir/sub/</Prefix></CommonPrefixes></ListBucketResult>")
    });
    let out = yutu(&server, &["ls"], None);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "2026-01-01T00:00:00Z  alpha\n");

    let out = yutu(&server, &["ls", "alpha/dir/"], None);
    assert!(out.status.success(), "{}", stderr(&out));
    let lines: Vec<_> = stdout(&out).lines().map(str::to_string).collect();
    assert_eq!(lines.len(), 2);
    assert!(
        lines[0].ends_with(" PRE                        dir/sub/"),
        "{lines:?}"
    );
    assert_eq!(
        lines[1].split_whitespace().collect::<Vec<_>>(),
        ["42", "2026-01-01T00:00:00Z", "dir/f"]
    );

    let out = yutu(&server, &["ls", "alpha", "--recursive"], None);
    assert!(out.status.success());
    let reqs = server.requests();
    assert_eq!(reqs[1].param("delimiter").as_deref(), Some("/"));
    assert_eq!(reqs[1].param("prefix").as_deref(), Some("dir/"));
    assert_eq!(reqs[2].param("delimiter"), None);
    assert_eq!(reqs[2].param("prefix"), None);
}

#[test]
fn stat_prints_metadata() {
    let server = FakeServer::start(|_| object_headers(Resp::new(200), "abc").content_length(5));
    let out = yutu(&server, &["stat", "b/k"], None);
    assert!(out.status.success(), "{}", stderr(&out));
    let s = stdout(&out);
    assert!(s.contains("Size:          5\n"), "{s}");
    assert!(s.contains("ETag:          \"abc\"\n"), "{s}");
    assert!(s.contains("Last-Modified: 2026-01-01T00:00:00Z\n"), "{s}");
    assert!(
        s.contains("Content-Type:  application/octet-stream\n"),
        "{s}"
    );
}

#[test]
fn rm_and_usage_errors() {
    let server = FakeServer::start(|_| Resp::new(204));
    let out = yutu(&server, &["rm", "b/k"], None);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(server.requests()[0].method, "DELETE");
    let out = yutu(&server, &["rm", "b"], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).starts_with("yutu: "), "{}", stderr(&out));
    assert_eq!(server.requests().len(), 1);
}

#[test]
fn unreachable_server() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = Command::new(env!("CARGO_BIN_EXE_yutu"))
        .args(["--url", &format!("http://127.0.0.1:{port}"), "ls"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).starts_with("yutu: "), "{}", stderr(&out));
}
