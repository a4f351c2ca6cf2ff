//! The hostile-client probe's holes, through the real binary, each as the attacker played it:
//! a token named like a user taking over the user's puts, leases and objects; anonymous and
//! slow bodies holding the memory every other client needs; stored bytes readable by every
//! local user; bearer tokens minted for another audience or by another issuer.

use std::time::Duration;

use serde_json::{json, Value};
use yutu_api::token::{issue, BucketScope, Claims, SigningKey};
use yutu_tests::users::{alice, node_with_config, send_as, USERS};
use yutu_tests::{Reply, Server};

const SECRET: &str = "probe-secret-0123456789abcdef-0123456789";

/// A node with alice, bob and an HS256 token key `k`; `extra` adds config lines.
fn node(extra: &str, args: &[&str]) -> Server {
    let config = format!("{extra}\n{USERS}\n[[token_keys]]\nkid = \"k\"\nsecret = \"{SECRET}\"\n");
    node_with_config(&config, args)
}

const SMALL: &[&str] = &["--memory", "64MiB", "--shards", "2", "--nvme-capacity", "0"];

fn token(claims: &Claims) -> String {
    issue(claims, "k", &SigningKey::Secret(SECRET.as_bytes().to_vec())).expect("a token")
}

fn scoped(sub: &str, scopes: &[&str]) -> Claims {
    Claims {
        buckets: scopes
            .iter()
            .map(|s| BucketScope::parse(s).expect("scope"))
            .collect(),
        ..Claims::new(sub, Duration::from_secs(600))
    }
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

fn json_of(r: &Reply) -> Value {
    serde_json::from_slice(&r.body).unwrap_or_else(|_| panic!("not JSON: {}", r.text()))
}

/// Hole 2: a token with `sub=alice`, scoped to its own scratch bucket, names alice's put ids
/// and lease id through its bucket. None of her puts may be published, revoked or released by
/// it, and her puts still end when she ends them.
#[test]
fn a_token_named_like_a_user_cannot_end_revoke_or_release_the_users_puts_and_leases() {
    let server = node("", SMALL);
    let alice = alice();
    assert_eq!(
        send_as(&server, &alice, "PUT", "/alice-data", b"").status,
        200
    );
    assert_eq!(
        send_as(&server, &alice, "PUT", "/alice-data/leased", b"v").status,
        200
    );
    let impostor = token(&scoped("alice", &["scratch1:rwdl"]));
    let r = with_token(&server, &impostor, "PUT", "/scratch1", b"");
    assert_eq!(r.status, 200, "{}", r.text());

    let blocks: Vec<Value> = (0..5)
        .map(|i| json!({"key": format!("half-{i}"), "len": 4096}))
        .collect();
    let started = send_as(
        &server,
        &alice,
        "POST",
        "/v1/kv/alice-data/put-start",
        json!({ "blocks": blocks }).to_string().as_bytes(),
    );
    assert_eq!(started.status, 200, "{}", started.text());
    let put_ids: Vec<u64> = json_of(&started)["puts"]
        .as_array()
        .expect("puts")
        .iter()
        .map(|p| p["put_id"].as_u64().expect("put id"))
        .collect();
    let leased = send_as(
        &server,
        &alice,
        "POST",
        "/v1/kv/alice-data/get",
        json!({ "keys": ["leased"] }).to_string().as_bytes(),
    );
    assert_eq!(leased.status, 200, "{}", leased.text());
    let leases = json_of(&leased)["leases"].clone();

    let ids = json!({ "put_ids": put_ids }).to_string();
    let end = with_token(
        &server,
        &impostor,
        "POST",
        "/v1/kv/scratch1/put-end",
        ids.as_bytes(),
    );
    assert_eq!(end.status, 400, "the impostor published: {}", end.text());
    let revoke = with_token(
        &server,
        &impostor,
        "POST",
        "/v1/kv/scratch1/revoke",
        ids.as_bytes(),
    );
    assert_eq!(revoke.status, 200, "{}", revoke.text());
    assert_eq!(json_of(&revoke)["revoked"], json!(vec![false; 5]));
    let release = with_token(
        &server,
        &impostor,
        "POST",
        "/v1/kv/release",
        json!({ "leases": leases }).to_string().as_bytes(),
    );
    assert_eq!(
        json_of(&release)["released"],
        json!(0),
        "{}",
        release.text()
    );
    for i in 0..5 {
        let r = send_as(
            &server,
            &alice,
            "HEAD",
            &format!("/alice-data/half-{i}"),
            b"",
        );
        assert_eq!(r.status, 404, "half-{i} was published by the impostor");
    }
    // Alice's own calls still work: her puts were neither ended nor revoked.
    let end = send_as(
        &server,
        &alice,
        "POST",
        "/v1/kv/alice-data/put-end",
        ids.as_bytes(),
    );
    assert_eq!(end.status, 200, "{}", end.text());
    let release = send_as(
        &server,
        &alice,
        "POST",
        "/v1/kv/release",
        json!({ "leases": leases }).to_string().as_bytes(),
    );
    assert_eq!(
        json_of(&release)["released"],
        json!(1),
        "{}",
        release.text()
    );
}

/// Hole 2, put and lease ids: not a counter another tenant can walk.
#[test]
fn put_ids_are_unguessable() {
    let server = node("", SMALL);
    let alice = alice();
    assert_eq!(send_as(&server, &alice, "PUT", "/ids", b"").status, 200);
    let mut ids = Vec::new();
    for round in 0..4 {
        let blocks: Vec<Value> = (0..16)
            .map(|i| json!({"key": format!("k{round}-{i}"), "len": 1}))
            .collect();
        let r = send_as(
            &server,
            &alice,
            "POST",
            "/v1/kv/ids/put-start",
            json!({ "blocks": blocks }).to_string().as_bytes(),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        ids.extend(
            json_of(&r)["puts"]
                .as_array()
                .expect("puts")
                .iter()
                .map(|p| p["put_id"].as_u64().expect("id") & 0xffff_ffff_ffff),
        );
    }
    ids.sort_unstable();
    let close = ids.windows(2).filter(|w| w[1] - w[0] < 1 << 16).count();
    assert!(
        close == 0,
        "{close} of {} ids lie within 65536 of another: {ids:x?}",
        ids.len()
    );
}

/// Hole 2, objects: what a token writes is the token's, never the user its subject is named
/// after. Alice (the user), with no access to bob's bucket, cannot read or re-ACL an object a
/// token with `sub=alice` wrote there.
#[test]
fn a_token_named_like_a_user_does_not_write_objects_the_user_owns() {
    let server = node("", SMALL);
    let bob = yutu_tests::users::bob();
    assert_eq!(
        send_as(&server, &bob, "PUT", "/bob-bucket", b"").status,
        200
    );
    let writer = token(&scoped("alice", &["bob-bucket:rw"]));
    let r = with_token(&server, &writer, "PUT", "/bob-bucket/o", b"token bytes");
    assert_eq!(r.status, 200, "{}", r.text());
    let alice = alice();
    assert_eq!(
        send_as(&server, &alice, "GET", "/bob-bucket/o", b"").status,
        403,
        "the user alice reads what a token named alice wrote"
    );
    let acl = yutu_tests::users::signed(&server, &alice, "GET", "/bob-bucket/o", "acl", b"");
    let refs: Vec<(&str, &str)> = acl.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let r = server
        .client()
        .send("GET", "/bob-bucket/o?acl", &refs, Some(b""));
    assert_eq!(r.status, 403, "{}", r.text());
}

/// Every path under `dir` whose mode lets the group or others in.
fn open_paths(dir: &std::path::Path, out: &mut Vec<String>) {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::symlink_metadata(dir).expect("stat");
    if meta.permissions().mode() & 0o077 != 0 {
        out.push(format!("{} {:o}", dir.display(), meta.permissions().mode()));
    }
    for entry in std::fs::read_dir(dir).expect("read_dir") {
        let path = entry.expect("entry").path();
        let meta = std::fs::symlink_metadata(&path).expect("stat");
        if meta.is_dir() {
            open_paths(&path, out);
        } else if !meta.file_type().is_symlink() && meta.permissions().mode() & 0o077 != 0 {
            out.push(format!(
                "{} {:o}",
                path.display(),
                meta.permissions().mode()
            ));
        }
    }
}

/// Hole 3: started under the usual umask (022), with a data directory an earlier start left
/// open (0755, a 0644 file), the node keeps its data directory 0700 and every file 0600: no
/// other local user can read `nvme.img` or the bucket catalog.
#[test]
fn stored_bytes_are_readable_only_by_the_nodes_user_whatever_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    let data = tempfile::tempdir().expect("dir");
    let dir = data.path().join("node");
    std::fs::create_dir(&dir).expect("mkdir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let stale = dir.join("left-by-an-older-start");
    std::fs::write(&stale, b"old").expect("write");
    std::fs::set_permissions(&stale, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let mut cmd = std::process::Command::new("sh");
    cmd.args(["-c", "umask 022; exec \"$@\"", "sh"])
        .arg(yutu_tests::bin_path("yutu-server"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--memory",
            "64MiB",
            "--shards",
            "1",
        ])
        .args(["--nvme-capacity", "16MiB", "--no-auth", "--data-dir"])
        .arg(&dir);
    let server = Server::spawn(cmd, data);
    let c = server.client();
    assert_eq!(c.send("PUT", "/disk-bucket", &[], Some(b"")).status, 200);
    let r = c.send(
        "PUT",
        "/disk-bucket/secret",
        &[("x-amz-storage-class", "STANDARD")],
        Some(b"payload"),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    for needed in ["nvme.img", "buckets.json"] {
        assert!(dir.join(needed).exists(), "{needed} is missing");
    }
    let mut open = Vec::new();
    open_paths(&dir, &mut open);
    assert!(open.is_empty(), "open to other users: {open:?}");
}

/// `aud` and `iss`: a key configured for an identity provider takes only the tokens it minted
/// for this service (401 otherwise); the node's other keys are unaffected.
#[test]
fn tokens_for_another_audience_or_from_another_issuer_are_refused() {
    let idp = "idp-secret-0123456789abcdef-0123456789ab";
    let config = format!(
        "{USERS}\n[[token_keys]]\nkid = \"idp\"\nsecret = \"{idp}\"\nissuer = \"https://idp.example\"\naudience = [\"yutu\"]\n"
    );
    let server = node_with_config(&config, SMALL);
    let mint = |iss: Option<&str>, aud: Option<&str>| {
        let claims = Claims {
            admin: true,
            iss: iss.map(str::to_string),
            aud: aud.map(|a| yutu_api::token::Audience::One(a.to_string())),
            ..Claims::new("svc", Duration::from_secs(600))
        };
        issue(&claims, "idp", &SigningKey::Secret(idp.as_bytes().to_vec())).expect("token")
    };
    let good = mint(Some("https://idp.example"), Some("yutu"));
    assert_eq!(
        with_token(&server, &good, "PUT", "/aud-ok", b"").status,
        200
    );
    for (iss, aud) in [
        (Some("https://idp.example"), Some("billing")),
        (Some("https://idp.example"), None),
        (Some("https://evil.example"), Some("yutu")),
        (None, Some("yutu")),
    ] {
        let r = with_token(&server, &mint(iss, aud), "GET", "/aud-ok", b"");
        assert_eq!(r.status, 401, "iss {iss:?} aud {aud:?}: {}", r.text());
    }
}

/// Opens a connection and sends a request head with a `len`-byte body announced and `first`
/// of its bytes; the caller trickles the rest or leaves it hanging.
fn open_body(server: &Server, head: &str, first: &[u8]) -> Option<std::net::TcpStream> {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(server.addr).ok()?;
    s.set_write_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(head.as_bytes()).ok()?;
    s.write_all(first).ok()?;
    Some(s)
}

/// A form's head: its boundary line and a text field, no file yet.
const FORM_START: &[u8] = b"--xyz\r\nContent-Disposition: form-data; name=\"key\"\r\n\r\nk\r\n";

/// Hole 1: anonymous form uploads announcing large bodies (to buckets that do not exist, and
/// to a public one, trickling a byte at a time) and one user's slow PUTs used to hold the
/// node's whole body budget, so every other client's 4 KiB PUT, 4 MiB PUT and KV call failed
/// with SlowDown. Now a form is answered 404 before its body is read, a form's fields hold
/// only a little of the anonymous pool until its signature is checked, and one client holds
/// at most its share: alice's calls all succeed while the attack goes on.
#[test]
fn anonymous_and_slow_bodies_do_not_starve_other_clients() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let server = node(
        "",
        &[
            "--memory",
            "64MiB",
            "--shards",
            "2",
            "--nvme-capacity",
            "0",
            "--body-budget",
            "16MiB",
            "--body-timeout-secs",
            "5",
        ],
    );
    let (alice, bob) = (alice(), yutu_tests::users::bob());
    assert_eq!(
        send_as(&server, &alice, "PUT", "/alice-data", b"").status,
        200
    );
    assert_eq!(send_as(&server, &bob, "PUT", "/bob-data", b"").status, 200);
    let public = yutu_tests::users::signed(&server, &alice, "PUT", "/public", "", b"");
    let mut headers: Vec<(&str, &str)> = public
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    headers.push(("x-amz-acl", "public-read-write"));
    let r = server.client().send("PUT", "/public", &headers, Some(b""));
    assert_eq!(r.status, 200, "{}", r.text());

    let addr = server.addr;
    let form = |bucket: &str, len: usize| {
        format!(
            "POST /{bucket} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: multipart/form-data; boundary=xyz\r\nContent-Length: {len}\r\n\r\n"
        )
    };
    let mut attack = Vec::new();
    // Small and large bodies announced to buckets that do not exist...
    for i in 0..32 {
        attack.extend(open_body(
            &server,
            &form(&format!("no-such-bucket-{i}"), 200 << 10),
            FORM_START,
        ));
    }
    for i in 0..16 {
        attack.extend(open_body(
            &server,
            &form(&format!("no-such-bucket-l{i}"), 1 << 20),
            FORM_START,
        ));
    }
    // ...forms to a bucket anybody may write, whose fields never end...
    for _ in 0..16 {
        attack.extend(open_body(&server, &form("public", 1 << 20), FORM_START));
    }
    // ...and bob's PUTs, signed, sending a few bytes of each.
    let payload = vec![7u8; 1 << 20];
    for i in 0..16 {
        let path = format!("/bob-data/slow-{i}");
        let signed = yutu_tests::users::signed(&server, &bob, "PUT", &path, "", &payload);
        let mut head = format!(
            "PUT {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\n",
            payload.len()
        );
        for (k, v) in &signed {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        attack.extend(open_body(&server, &head, &payload[..10]));
    }
    assert!(
        attack.len() >= 70,
        "only {} attack connections opened",
        attack.len()
    );
    // The attackers trickle a byte every 500 ms (bounded: at most 30 s), as the probe did.
    let stop = Arc::new(AtomicBool::new(false));
    let trickle = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            use std::io::Write;
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while !stop.load(Ordering::Relaxed) && std::time::Instant::now() < deadline {
                for s in &mut attack {
                    let _ = s.write_all(b"x");
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        })
    };
    // The attack holds what it can get before alice asks (bob's first bodies at least).
    assert!(
        yutu_tests::server::wait_until(Duration::from_secs(10), || {
            server.metric_sum("yutu_body_reserved_bytes") >= (2 << 20) as f64
        }),
        "the attack reserved nothing"
    );
    let small = send_as(&server, &alice, "PUT", "/alice-data/small", &[1u8; 4096]);
    let large = send_as(
        &server,
        &alice,
        "PUT",
        "/alice-data/large",
        &vec![2u8; 4 << 20],
    );
    let kv = send_as(
        &server,
        &alice,
        "POST",
        "/v1/kv/alice-data/exists",
        json!({ "keys": ["small"] }).to_string().as_bytes(),
    );
    stop.store(true, Ordering::Relaxed);
    let _ = trickle.join();
    assert_eq!(small.status, 200, "4 KiB PUT: {}", small.text());
    assert_eq!(large.status, 200, "4 MiB PUT: {}", large.text());
    assert_eq!(kv.status, 200, "KV call: {}", kv.text());
    assert_eq!(json_of(&kv)["exists"], json!([true]));
}

/// Hole 1, the answer itself: a form to a bucket that does not exist is refused before its
/// body is read (the client gets 404 having sent only the head).
#[test]
fn a_form_to_a_missing_bucket_is_refused_before_its_body_is_read() {
    use std::io::Read;
    let server = node("", SMALL);
    let addr = server.addr;
    let head = format!(
        "POST /no-such-bucket HTTP/1.1\r\nHost: {addr}\r\nContent-Type: multipart/form-data; boundary=xyz\r\nContent-Length: 2097152\r\n\r\n"
    );
    let mut s = open_body(&server, &head, FORM_START).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let mut answer = [0u8; 512];
    let n = s.read(&mut answer).expect("an answer before the body");
    let text = String::from_utf8_lossy(&answer[..n]);
    assert!(text.starts_with("HTTP/1.1 404"), "{text}");
    assert!(text.contains("NoSuchBucket"), "{text}");
}
