//! A node with authentication on and two users, alice and bob, and requests signed as
//! either: what the multi-tenant tests start from.

use std::time::SystemTime;

use yutu_client::Credentials;

use crate::{bin_path, Reply, Server};

/// The config file's users.
pub const USERS: &str = r#"
[[users]]
name = "alice"
access_key = "ALICEKEY"
secret_key = "alice-secret"

[[users]]
name = "bob"
access_key = "BOBKEY"
secret_key = "bob-secret"
"#;

pub fn alice() -> Credentials {
    Credentials::new("ALICEKEY", "alice-secret")
}

pub fn bob() -> Credentials {
    Credentials::new("BOBKEY", "bob-secret")
}

/// Starts a node with alice and bob as its users, with `args` (memory, shards, NVMe...).
pub fn node_with_users(args: &[&str]) -> Server {
    node_with_config(USERS, args)
}

/// Starts an authenticating node (no `--no-auth`) whose config file is `config` (users, token
/// keys...), with `args` (memory, shards, NVMe...) and a data directory of its own.
pub fn node_with_config(config: &str, args: &[&str]) -> Server {
    let data = tempfile::tempdir().expect("data dir");
    let file = data.path().join("yutu.toml");
    std::fs::write(&file, config).expect("write the config file");
    let mut cmd = std::process::Command::new(bin_path("yutu-server"));
    cmd.args(["--listen", "127.0.0.1:0"])
        .args(args)
        .arg("--config")
        .arg(&file)
        .arg("--data-dir")
        .arg(data.path().join("node"));
    Server::spawn(cmd, data)
}

/// Starts an authenticating node that takes bearer tokens signed with `secret` under key id
/// `kid` ([`token_signed`]), with `args` (memory, shards, NVMe...).
pub fn node_with_token_key(kid: &str, secret: &str, args: &[&str]) -> Server {
    node_with_config(
        &format!("[[token_keys]]\nkid = \"{kid}\"\nsecret = \"{secret}\"\n"),
        args,
    )
}

/// A two-shard node with 256 MiB of DRAM and no NVMe tier, plus `extra`, that takes tokens
/// signed with `secret` under `kid`, with `bucket` created by the admin token `admin`.
pub fn token_node_with_bucket(
    kid: &str,
    secret: &str,
    admin: &str,
    bucket: &str,
    extra: &[&str],
) -> Server {
    let mut args = crate::DRAM_NODE.to_vec();
    args.extend_from_slice(extra);
    let server = node_with_token_key(kid, secret, &args);
    let auth = format!("Bearer {admin}");
    let r = server.client().send(
        "PUT",
        &format!("/{bucket}"),
        &[("authorization", auth.as_str())],
        Some(b""),
    );
    assert_eq!(r.status, 200, "creating the bucket: {}", r.text());
    server
}

/// A bearer token for subject `engine`, signed with `secret` under key id `kid`: `scopes` in
/// the command line's `BUCKET:ACCESS` form, an admin token or not, valid for `ttl`.
pub fn token_signed(
    kid: &str,
    secret: &str,
    scopes: &[&str],
    admin: bool,
    ttl: std::time::Duration,
) -> String {
    use yutu_api::token::{issue, BucketScope, Claims, SigningKey};
    let claims = Claims {
        admin,
        buckets: scopes
            .iter()
            .map(|s| BucketScope::parse(s).expect("a token scope"))
            .collect(),
        ..Claims::new("engine", ttl)
    };
    issue(
        &claims,
        kid,
        &SigningKey::Secret(secret.as_bytes().to_vec()),
    )
    .expect("a token")
}

/// The SigV4 headers of `method path?query` with `body` as its payload, signed by `who`.
pub fn signed(
    server: &Server,
    who: &Credentials,
    method: &str,
    path: &str,
    query: &str,
    body: &[u8],
) -> Vec<(String, String)> {
    let host = server.addr.to_string();
    who.sign(method, &host, path, query, body, SystemTime::now())
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
}

/// Sends a request (no query string) signed by `who` and reads the reply.
pub fn send_as(server: &Server, who: &Credentials, method: &str, path: &str, body: &[u8]) -> Reply {
    let headers = signed(server, who, method, path, "", body);
    let refs: Vec<(&str, &str)> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    server.client().send(method, path, &refs, Some(body))
}
