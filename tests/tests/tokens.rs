//! Bearer tokens through the real binary: a new node is never open, every bad token is 401,
//! a token reaches only the buckets its scopes name (S3, KV, copy, listing, admin), keys
//! rotate by kid, and `yutu token issue` mints what the node accepts.

use std::process::Command;
use std::time::Duration;

use yutu_api::token::{
    issue, unix_now, BucketScope, Claims, KeyAlgorithm, SigningKey, FIRST_TOKEN_FILE,
    LOCAL_SECRET_FILE,
};
use yutu_tests::users::node_with_config;
use yutu_tests::{bin_path, pattern, Reply, Server};

const K1: &[u8] = b"k1-secret-0123456789abcdef-0123456789";
const K2: &[u8] = b"k2-secret-0123456789abcdef-0123456789";
/// A test-only Ed25519 key pair.
const ED_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIFOzD/2ln0rtT31ZPzD7KiQ7/Olp4Neu9yppS2uqTOHY\n-----END PRIVATE KEY-----\n";
const ED_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAEZHe7zDBeUqKmipw0O6R6zOmSPcmXSWJ3mWu60xsEKU=\n-----END PUBLIC KEY-----\n";

fn now() -> u64 {
    unix_now()
}

fn claims(scopes: &[&str], admin: bool) -> Claims {
    Claims {
        admin,
        buckets: scopes
            .iter()
            .map(|s| BucketScope::parse(s).unwrap())
            .collect(),
        ..Claims::new("tester", Duration::from_secs(600))
    }
}

fn hs(claims: &Claims, kid: &str, secret: &[u8]) -> String {
    issue(claims, kid, &SigningKey::Secret(secret.to_vec())).unwrap()
}

/// A node with two HS256 keys (k1, k2) and an EdDSA public key (ed, read from a file)
/// configured.
fn node_with_keys() -> Server {
    // The key file is read at start; it need not outlive the start.
    let keys = tempfile::tempdir().unwrap();
    let pub_file = keys.path().join("ed.pub");
    std::fs::write(&pub_file, ED_PUBLIC).unwrap();
    let config = format!(
        "[[token_keys]]\nkid = \"k1\"\nsecret = \"{}\"\n\n[[token_keys]]\nkid = \"k2\"\nalg = \"HS256\"\nsecret = \"{}\"\n\n[[token_keys]]\nkid = \"ed\"\nalg = \"EdDSA\"\npublic_key_file = \"{}\"\n",
        std::str::from_utf8(K1).unwrap(),
        std::str::from_utf8(K2).unwrap(),
        pub_file.display()
    );
    node_with_config(
        &config,
        &["--memory", "64MiB", "--shards", "2", "--nvme-capacity", "0"],
    )
}

/// An admin token, after creating `buckets` with it.
fn admin_with_buckets(server: &Server, buckets: &[&str]) -> String {
    let admin = hs(&claims(&[], true), "k1", K1);
    for b in buckets {
        let r = with_token(server, &admin, "PUT", &format!("/{b}"), b"");
        assert_eq!(r.status, 200, "creating {b}: {}", r.text());
    }
    admin
}

fn with_token(server: &Server, token: &str, method: &str, path: &str, body: &[u8]) -> Reply {
    let auth = format!("Bearer {token}");
    server.client().send(
        method,
        path,
        &[("authorization", auth.as_str())],
        Some(body),
    )
}

#[test]
fn a_new_node_is_never_open_and_its_first_token_lasts_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("node");
    let start = || {
        let mut cmd = Command::new(bin_path("yutu-server"));
        cmd.args([
            "--listen",
            "127.0.0.1:0",
            "--memory",
            "32MiB",
            "--shards",
            "1",
        ])
        .args(["--nvme-capacity", "0", "--data-dir"])
        .arg(&data);
        Server::spawn(cmd, tempfile::tempdir().unwrap())
    };
    let server = start();
    // Anonymous requests are refused.
    assert_eq!(server.client().put("/open", b"").status, 403);
    assert_eq!(server.client().get("/").status, 403);
    // The first admin token is printed and saved (mode 0600).
    let saved = std::fs::read_to_string(data.join(FIRST_TOKEN_FILE)).unwrap();
    let token = saved.trim().to_string();
    assert!(server.log().contains(&token), "the token is printed");
    let mode = std::fs::metadata(data.join(LOCAL_SECRET_FILE))
        .unwrap()
        .permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o600
    );
    assert_eq!(with_token(&server, &token, "PUT", "/mine", b"").status, 200);
    assert_eq!(
        with_token(&server, &token, "PUT", "/mine/k", b"v").status,
        200
    );
    drop(server);
    // A restart keeps the key: the token still works, and no new one is printed.
    let server = start();
    assert_eq!(
        with_token(&server, &token, "HEAD", "/mine", b"").status,
        200
    );
    assert_eq!(
        with_token(&server, &token, "PUT", "/mine/k", b"v").status,
        200
    );
    assert!(!server.log().contains("first admin token"));
    // `yutu token issue --data-dir` signs with the same key.
    let out = Command::new(bin_path("yutu"))
        .args(["token", "issue", "--data-dir"])
        .arg(&data)
        .args(["--sub", "reader", "--bucket", "mine:rl", "--ttl", "10m"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reader = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert_eq!(
        with_token(&server, &reader, "GET", "/mine/k", b"").body,
        b"v"
    );
    assert_eq!(
        with_token(&server, &reader, "PUT", "/mine/k", b"w").status,
        403
    );
    // The CLI takes the token from YUTU_TOKEN.
    let out = Command::new(bin_path("yutu"))
        .args(["--url", &server.url, "ls", "mine"])
        .env("YUTU_TOKEN", &reader)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains('k'));
}

#[test]
fn every_bad_token_is_401() {
    let server = node_with_keys();
    let admin = hs(&claims(&[], true), "k1", K1);
    assert_eq!(with_token(&server, &admin, "PUT", "/bkt", b"").status, 200);
    let expired = hs(
        &Claims {
            exp: now() - 120,
            ..claims(&[], true)
        },
        "k1",
        K1,
    );
    let early = hs(
        &Claims {
            nbf: Some(now() + 600),
            ..claims(&[], true)
        },
        "k1",
        K1,
    );
    let wrong_secret = hs(&claims(&[], true), "k1", K2);
    let unknown_kid = hs(&claims(&[], true), "k9", K1);
    let parts: Vec<&str> = admin.split('.').collect();
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let alg_none = format!(
        "{}.{}.",
        b64.encode(br#"{"alg":"none","typ":"JWT","kid":"k1"}"#),
        parts[1]
    );
    for (what, token, code) in [
        ("expired", expired.as_str(), "ExpiredToken"),
        ("not yet valid", early.as_str(), "InvalidToken"),
        ("wrongly signed", wrong_secret.as_str(), "InvalidToken"),
        ("unknown kid", unknown_kid.as_str(), "InvalidToken"),
        ("alg none", alg_none.as_str(), "InvalidToken"),
        ("garbage", "not-a-token", "InvalidToken"),
    ] {
        let r = with_token(&server, token, "GET", "/bkt", b"");
        assert_eq!((r.status, r.code().as_deref()), (401, Some(code)), "{what}");
        assert!(r
            .header("www-authenticate")
            .is_some_and(|h| h.starts_with("Bearer")));
        let r = with_token(
            &server,
            token,
            "POST",
            "/v1/kv/bkt/exists",
            br#"{"keys":["x"]}"#,
        );
        assert_eq!(r.status, 401, "{what} on the KV API");
        assert_eq!(r.header("content-type"), Some("application/json"));
        let body: yutu_api::error::JsonError = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(body.code, code, "{what} on the KV API");
    }
    // Every configured key verifies (rotation: k1 and k2 side by side), EdDSA included.
    let ed = issue(
        &claims(&["bkt:rl"], false),
        "ed",
        &SigningKey::Pem(KeyAlgorithm::EdDSA, ED_PRIVATE.as_bytes().to_vec()),
    )
    .unwrap();
    for token in [hs(&claims(&["bkt:rl"], false), "k2", K2), ed] {
        assert_eq!(with_token(&server, &token, "GET", "/bkt", b"").status, 200);
    }
}

#[test]
fn a_token_scoped_to_one_bucket_reaches_no_other() {
    let server = node_with_keys();
    let admin = admin_with_buckets(&server, &["alpha", "beta"]);
    for b in ["alpha", "beta"] {
        let r = with_token(
            &server,
            &admin,
            "PUT",
            &format!("/{b}/obj"),
            &pattern(4096, 1),
        );
        assert_eq!(r.status, 200);
    }
    let a_only = hs(&claims(&["alpha:rwdl"], false), "k1", K1);
    let t =
        |method: &str, path: &str, body: &[u8]| with_token(&server, &a_only, method, path, body);
    // Its own bucket: everything.
    assert_eq!(t("GET", "/alpha/obj", b"").body, pattern(4096, 1));
    assert_eq!(t("PUT", "/alpha/new", b"x").status, 200);
    assert_eq!(t("GET", "/alpha?list-type=2", b"").status, 200);
    // The other bucket: nothing, through any API.
    let denied: Vec<(&str, String, Vec<u8>)> = vec![
        ("GET", "/beta/obj".into(), vec![]),
        ("HEAD", "/beta/obj".into(), vec![]),
        ("PUT", "/beta/obj".into(), b"overwritten".to_vec()),
        ("DELETE", "/beta/obj".into(), vec![]),
        ("GET", "/beta?list-type=2".into(), vec![]),
        ("GET", "/beta".into(), vec![]),
        ("HEAD", "/beta".into(), vec![]),
        ("DELETE", "/beta".into(), vec![]),
        ("POST", "/beta?uploads".into(), vec![]),
        (
            "POST",
            "/beta?delete".into(),
            b"<Delete><Object><Key>obj</Key></Object></Delete>".to_vec(),
        ),
        (
            "POST",
            "/v1/kv/beta/exists".into(),
            br#"{"keys":["obj"]}"#.to_vec(),
        ),
        (
            "POST",
            "/v1/kv/beta/get".into(),
            br#"{"keys":["obj"]}"#.to_vec(),
        ),
        (
            "POST",
            "/v1/kv/beta/remove".into(),
            br#"{"keys":["obj"]}"#.to_vec(),
        ),
        (
            "POST",
            "/v1/kv/beta/put-start".into(),
            br#"{"blocks":[{"key":"k","len":4096}]}"#.to_vec(),
        ),
        ("GET", yutu_api::events::SNAPSHOT_PATH.into(), vec![]),
        ("PUT", "/gamma".into(), vec![]),
    ];
    for (method, path, body) in &denied {
        let r = t(method, path, body);
        assert_eq!(r.status, 403, "{method} {path}: {}", r.text());
    }
    // A copy from the other bucket into its own is refused too.
    let r = server.client().send(
        "PUT",
        "/alpha/copied",
        &[
            ("authorization", &format!("Bearer {a_only}")),
            ("x-amz-copy-source", "/beta/obj"),
        ],
        Some(b""),
    );
    assert_eq!(r.status, 403, "copy: {}", r.text());
    // ListBuckets shows only its bucket.
    let list = t("GET", "/", b"").text();
    assert!(
        list.contains("<Name>alpha</Name>") && !list.contains("<Name>beta</Name>"),
        "{list}"
    );
    // Nothing of b changed.
    assert_eq!(
        with_token(&server, &admin, "GET", "/beta/obj", b"").body,
        pattern(4096, 1)
    );
    // A read-only token reads and lists but cannot write or delete, on either API.
    let reader = hs(&claims(&["alpha:rl"], false), "k1", K1);
    let r =
        |method: &str, path: &str, body: &[u8]| with_token(&server, &reader, method, path, body);
    assert_eq!(r("GET", "/alpha/obj", b"").status, 200);
    assert_eq!(r("GET", "/alpha?list-type=2", b"").status, 200);
    assert_eq!(
        r("POST", "/v1/kv/alpha/exists", br#"{"keys":["obj"]}"#).status,
        200
    );
    for (method, path, body) in [
        ("PUT", "/alpha/obj", &b"x"[..]),
        ("DELETE", "/alpha/obj", b""),
        ("POST", "/v1/kv/alpha/remove", br#"{"keys":["obj"]}"#),
        (
            "POST",
            "/v1/kv/alpha/put-start",
            br#"{"blocks":[{"key":"k","len":4096}]}"#,
        ),
    ] {
        assert_eq!(r(method, path, body).status, 403, "{method} {path}");
    }
    // The admin API needs an admin token.
    assert_eq!(
        with_token(&server, &admin, "GET", yutu_api::events::SNAPSHOT_PATH, b"").status,
        200
    );
}

/// An inference engine's client with a token scoped to its bucket: its engine registers, puts
/// and gets blocks one-sidedly; the same client cannot touch another bucket.
#[test]
fn a_kv_client_with_a_scoped_token_moves_blocks_in_its_bucket_only() {
    use yutu_client::kv::{KvClient, KvOptions};
    let server = node_with_keys();
    admin_with_buckets(&server, &["kv-one", "other"]);
    let engine = hs(&claims(&["kv-*:rwdl"], false), "k2", K2);
    let kv = KvClient::new(
        &server.url,
        KvOptions {
            token: Some(engine),
            ..KvOptions::default()
        },
    )
    .expect("the client registers with its token");
    let block = 64 << 10;
    let buf = kv.register(2 * block as u64).expect("buffer");
    buf.write_at(0, &pattern(block, 42)).unwrap();
    let keys = vec!["b0".to_string()];
    kv.batch_put_from("kv-one", &keys, &buf, &[0], &[block as u64])
        .expect("put-from");
    let copied = kv
        .batch_get_into("kv-one", &keys, &buf, &[block as u64])
        .expect("get-into");
    assert_eq!(copied, vec![Some(block as u64)]);
    let mut back = vec![0u8; block];
    buf.read_at(block as u64, &mut back).unwrap();
    assert!(back == pattern(block, 42));
    let refused = kv.batch_put_from("other", &keys, &buf, &[0], &[block as u64]);
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_string().contains("AccessDenied")),
        "{refused:?}"
    );
}
