//! A conductor and a node that both authenticate: callers of the conductor need a token with
//! the right conductor scope, the node publishes its events with its own token, and the
//! conductor fetches the node's snapshot (after a restart) with an admin token of the node.

use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use yutu_api::block_hash::BlockHasher;
use yutu_api::token::{issue, Claims, ConductorScope, SigningKey};
use yutu_tests::pki::Pki;
use yutu_tests::server::wait_until;
use yutu_tests::{bin_path, Client, Server};

/// One HS256 key, configured on both the node and the conductor.
const SECRET: &str = "shared-secret-of-the-cluster-0123456789";

fn token(sub: &str, admin: bool, conductor: &[ConductorScope]) -> String {
    let claims = Claims {
        admin,
        conductor: conductor.to_vec(),
        ..Claims::new(sub, Duration::from_secs(600))
    };
    issue(
        &claims,
        "cluster",
        &SigningKey::Secret(SECRET.as_bytes().to_vec()),
    )
    .unwrap()
}

fn post(c: &Client, token: Option<&str>, path: &str, body: &Value) -> (u16, Value) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("content-type", "application/json")];
    if let Some(a) = &auth {
        headers.push(("authorization", a.as_str()));
    }
    let r = c.send("POST", path, &headers, Some(body.to_string().as_bytes()));
    (
        r.status,
        serde_json::from_slice(&r.body).unwrap_or(Value::Null),
    )
}

fn get(c: &Client, token: &str, path: &str) -> Value {
    let auth = format!("Bearer {token}");
    serde_json::from_slice(&c.send("GET", path, &[("authorization", &auth)], None).body)
        .unwrap_or(Value::Null)
}

#[test]
fn callers_need_conductor_scopes_and_nodes_publish_and_resync_with_tokens() {
    scenario(false);
}

/// The same with the node serving HTTPS: the conductor fetches its snapshot over TLS,
/// trusting the node's certificate (`--node-ca-file`).
#[test]
fn the_conductor_resyncs_a_node_that_serves_https() {
    scenario(true);
}

/// A PUT to the node, over HTTPS with curl trusting `ca` when given, else plain.
fn put(
    node: &Server,
    ca: Option<&std::path::Path>,
    auth: &str,
    path: &str,
    body: &[u8],
    extra: &[(&str, &str)],
) -> u16 {
    let Some(ca) = ca else {
        let mut headers = vec![("authorization", auth)];
        headers.extend_from_slice(extra);
        return node.client().send("PUT", path, &headers, Some(body)).status;
    };
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), body).unwrap();
    let mut cmd = Command::new("curl");
    cmd.args([
        "-sS",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "--max-time",
        "20",
        "--cacert",
    ])
    .arg(ca)
    .args(["-H", &format!("authorization: {auth}")]);
    for (k, v) in extra {
        cmd.args(["-H", &format!("{k}: {v}")]);
    }
    let out = cmd
        .arg("-T")
        .arg(file.path())
        .arg(format!("https://{}{path}", node.addr))
        .output()
        .expect("curl is installed");
    String::from_utf8_lossy(&out.stdout).parse().unwrap_or(0)
}

fn scenario(tls: bool) {
    let dir = tempfile::tempdir().unwrap();
    let Pki {
        ca: ca_cert,
        cert,
        key,
    } = Pki::make(dir.path());
    let keys = format!("kid = \"cluster\"\nsecret = \"{SECRET}\"\n");
    let conductor_cfg = dir.path().join("conductor.toml");
    std::fs::write(&conductor_cfg, format!("[[auth.token_keys]]\n{keys}")).unwrap();
    let node_cfg = dir.path().join("node.toml");
    std::fs::write(&node_cfg, format!("[[token_keys]]\n{keys}")).unwrap();
    // The conductor's token for the node's admin API, the node's for the conductor.
    let node_admin = dir.path().join("node-admin.token");
    std::fs::write(&node_admin, token("conductor", true, &[])).unwrap();
    let publisher = dir.path().join("publisher.token");
    std::fs::write(
        &publisher,
        token("node-a", false, &[ConductorScope::Events]),
    )
    .unwrap();

    // Without keys the conductor refuses to start open.
    let out = Command::new(bin_path("yutu-conductor"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--no-auth"));

    let mut cmd = Command::new(bin_path("yutu-conductor"));
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&conductor_cfg)
        .arg("--node-token-file")
        .arg(&node_admin);
    if tls {
        cmd.arg("--node-ca-file").arg(&ca_cert);
    }
    let conductor = Server::spawn(cmd, tempfile::tempdir().unwrap());
    let cc = conductor.client();
    let router = token("router", false, &[ConductorScope::Route]);
    let events_only = token("node-x", false, &[ConductorScope::Events]);
    let req =
        json!({"bucket": "llama", "token_ids": [1, 2, 3], "output_length": 5, "dry_run": true});
    // No token, a bad token: 401; the wrong scope: 403; the right one: served.
    assert_eq!(post(&cc, None, "/v1/route", &req).0, 401);
    assert_eq!(post(&cc, Some("junk"), "/v1/route", &req).0, 401);
    assert_eq!(post(&cc, Some(&events_only), "/v1/route", &req).0, 403);
    assert_eq!(
        post(&cc, Some(&router), "/v1/events", &json!({})).0,
        403,
        "a router cannot publish events"
    );
    for reg in [
        json!({"id": "pB", "role": "prefill", "node": "node-b"}),
        json!({"id": "pA", "role": "prefill", "node": "node-a"}),
        json!({"id": "d0", "role": "decode"}),
    ] {
        assert_eq!(post(&cc, None, "/v1/instances", &reg).0, 401);
        let (status, body) = post(&cc, Some(&router), "/v1/instances", &reg);
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(cc.get("/health").status, 200, "health stays open");

    // The node authenticates too, and publishes with its token.
    let data = dir.path().join("node-a");
    let start_node = || {
        let mut cmd = Command::new(bin_path("yutu-server"));
        cmd.args([
            "--listen",
            "127.0.0.1:0",
            "--memory",
            "64MiB",
            "--shards",
            "2",
        ])
        .args(["--nvme-capacity", "64MiB", "--node-name", "node-a"])
        .args(["--conductor", &conductor.url, "--config"])
        .arg(&node_cfg)
        .arg("--conductor-token-file")
        .arg(&publisher)
        .arg("--data-dir")
        .arg(&data);
        if tls {
            cmd.arg("--tls-cert").arg(&cert).arg("--tls-key").arg(&key);
        }
        Server::spawn(cmd, tempfile::tempdir().unwrap())
    };
    let ca = tls.then_some(ca_cert.as_path());
    let node_a = start_node();
    let writer = token("engine", true, &[]);
    let auth = format!("Bearer {writer}");
    let status = put(
        &node_a,
        ca,
        &auth,
        "/llama",
        b"",
        &[("x-yutu-durability", "disk")],
    );
    assert_eq!(status, 200);
    let tokens: Vec<u32> = (0..8 * 512).map(|i| i * 5 + 1).collect();
    let blocks = BlockHasher::new(512).hash_tokens(&tokens);
    for (i, b) in blocks.iter().enumerate() {
        let path = format!("/llama/{}", b.to_key());
        assert_eq!(
            put(&node_a, ca, &auth, &path, &vec![i as u8; 4096], &[]),
            200
        );
    }
    let routed = |want: u64| {
        let (status, d) = post(
            &cc,
            Some(&router),
            "/v1/route",
            &json!({"bucket": "llama", "token_ids": tokens, "output_length": 5, "dry_run": true}),
        );
        status == 200 && d["prefill"]["instance"] == "pA" && d["cached_blocks"] == want
    };
    assert!(
        wait_until(Duration::from_secs(30), || routed(8)),
        "the node's events never reached the conductor"
    );

    // A restart makes the conductor resync from the node's snapshot, which needs the token.
    let node_of = |name: &str| {
        get(&cc, &events_only, "/v1/nodes")
            .as_array()
            .and_then(|n| n.iter().find(|n| n["node"] == name).cloned())
            .unwrap_or(Value::Null)
    };
    let old_epoch = node_of("node-a")["epoch"].as_u64().unwrap();
    node_a.kill();
    let _node_a = start_node();
    assert!(
        wait_until(Duration::from_secs(30), || {
            let n = node_of("node-a");
            n["epoch"].as_u64().is_some_and(|e| e > old_epoch)
                && n["resyncing"] == false
                && n["blocks"] == 8
        }),
        "node-a was not resynced: {}\nconductor log:\n{}",
        node_of("node-a"),
        conductor.log()
    );
}
