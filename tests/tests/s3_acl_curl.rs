//! ACLs, CORS and form uploads as a curl user meets them: the real `curl` binary, unsigned,
//! against a node with authentication on, under each canned ACL.

use std::process::Command;

use yutu_tests::users::node_with_users;
use yutu_tests::Server;

/// The node's first admin token (saved in its data directory at the first start).
fn admin_token(server: &Server) -> String {
    let path = server
        .data_dir
        .path()
        .join("node")
        .join(yutu_api::token::FIRST_TOKEN_FILE);
    std::fs::read_to_string(path)
        .expect("the first admin token")
        .trim()
        .to_string()
}

/// Runs curl with `args` (the URL's `URL` replaced by the node's); the status code and body.
fn curl(server: &Server, args: &[&str]) -> (u16, String) {
    let args: Vec<String> = args.iter().map(|a| a.replace("URL", &server.url)).collect();
    let out = Command::new("curl")
        .args(["-sS", "-w", "\n%{http_code}"])
        .args(&args)
        .output()
        .expect("run curl");
    assert!(
        out.status.success(),
        "curl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

#[test]
fn anonymous_curl_under_each_canned_acl() {
    let server = node_with_users(&["--memory", "64MiB", "--shards", "2"]);
    let bearer = format!("Authorization: Bearer {}", admin_token(&server));
    let admin = |args: &[&str]| {
        let mut all = vec!["-H", bearer.as_str()];
        all.extend_from_slice(args);
        curl(&server, &all)
    };
    for (bucket, acl) in [
        ("c-private", "private"),
        ("c-public", "public-read"),
        ("c-open", "public-read-write"),
        ("c-signed", "authenticated-read"),
    ] {
        let acl_header = format!("x-amz-acl: {acl}");
        let url = format!("URL/{bucket}");
        assert_eq!(admin(&["-X", "PUT", "-H", &acl_header, &url]).0, 200);
        for (key, object_acl) in [("secret", "private"), ("shared", "public-read")] {
            let h = format!("x-amz-acl: {object_acl}");
            let url = format!("URL/{bucket}/{key}");
            let r = admin(&["-X", "PUT", "-H", &h, "--data-binary", key, &url]);
            assert_eq!(r.0, 200, "{r:?}");
        }
    }
    let anon = |args: &[&str]| curl(&server, args);
    for bucket in ["c-private", "c-public", "c-open", "c-signed"] {
        // Objects: what their own ACL says.
        assert_eq!(
            anon(&[&format!("URL/{bucket}/shared")]),
            (200, "shared".into())
        );
        let (code, body) = anon(&[&format!("URL/{bucket}/secret")]);
        assert_eq!(code, 403, "{bucket}: {body}");
        assert!(body.contains("<Code>AccessDenied</Code>"), "{body}");
        // A missing key: NoSuchKey to whoever may list the bucket (as S3 answers), and
        // nothing more than AccessDenied to anybody else.
        let listable = matches!(bucket, "c-public" | "c-open");
        let absent = anon(&[&format!("URL/{bucket}/absent")]).0;
        assert_eq!(absent, if listable { 404 } else { 403 }, "{bucket}");
        // The bucket: listing, writing, its ACL.
        let list = anon(&[&format!("URL/{bucket}?list-type=2")]);
        assert_eq!(list.0, if listable { 200 } else { 403 }, "{bucket} list");
        let writable = bucket == "c-open";
        let put = anon(&[
            "-X",
            "PUT",
            "--data-binary",
            "x",
            &format!("URL/{bucket}/anon"),
        ]);
        assert_eq!(put.0, if writable { 200 } else { 403 }, "{bucket} put");
        let form = anon(&[
            "-F",
            "key=form",
            "-F",
            "file=@Cargo.toml",
            &format!("URL/{bucket}"),
        ]);
        assert_eq!(form.0, if writable { 204 } else { 403 }, "{bucket} form");
        assert_eq!(anon(&[&format!("URL/{bucket}?acl")]).0, 403, "{bucket} acl");
        let del = anon(&["-X", "DELETE", &format!("URL/{bucket}/shared")]);
        assert_eq!(del.0, if writable { 204 } else { 403 }, "{bucket} delete");
    }
    // What anonymous wrote into the open bucket is there.
    assert_eq!(admin(&["URL/c-open/anon"]), (200, "x".into()));
    // Never: listing buckets, creating one, the KV API.
    assert_eq!(anon(&["URL/"]).0, 403);
    assert_eq!(anon(&["-X", "PUT", "URL/c-anon"]).0, 403);
    let kv = anon(&[
        "-X",
        "POST",
        "-d",
        r#"{"keys":["anon"]}"#,
        "URL/v1/kv/c-open/exists",
    ]);
    assert_eq!(kv.0, 403);
    // A preflight is answered without credentials, from the bucket's rules.
    let cors = r#"<CORSConfiguration><CORSRule><AllowedOrigin>https://app.example</AllowedOrigin><AllowedMethod>GET</AllowedMethod></CORSRule></CORSConfiguration>"#;
    assert_eq!(
        admin(&["-X", "PUT", "--data-binary", cors, "URL/c-public?cors"]).0,
        200
    );
    let pre = |origin: &str| {
        curl(
            &server,
            &[
                "-X",
                "OPTIONS",
                "-H",
                &format!("Origin: {origin}"),
                "-H",
                "Access-Control-Request-Method: GET",
                "-D",
                "-",
                "URL/c-public/shared",
            ],
        )
    };
    let (code, headers) = pre("https://app.example");
    assert_eq!(code, 200);
    assert!(
        headers
            .to_ascii_lowercase()
            .contains("access-control-allow-origin: https://app.example"),
        "{headers}"
    );
    assert_eq!(pre("https://other.example").0, 403);
}
