//! A cluster for tests: a real etcd and N real `yutu-server` nodes on loopback, with
//! authentication on (alice and bob as users, a shared cluster key), each node with a data
//! directory that survives its restarts.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use yutu_api::cluster::Membership;
use yutu_api::token::{issue, Claims, SigningKey};

use crate::etcd::Etcd;
use crate::server::wait_until;
use crate::users::{send_as, USERS};
use crate::{bin_path, Reply, Server};

/// The cluster key every test node shares (a test value: 64 hex digits).
const KEY: &str = "5ee7c1a5e7c1a55e7c1a55ee7c1a55ee7c1a55ee7c1a55ee7c1a55ee7c1a55ee";

pub struct TestCluster {
    pub etcd: Etcd,
    nodes: Vec<Option<Server>>,
    dir: tempfile::TempDir,
    args: Vec<String>,
}

impl TestCluster {
    /// Starts etcd and `n` nodes (`node0`...), each with `args` besides the cluster flags, and
    /// waits until every node sees all `n`.
    pub fn start(n: usize, args: &[&str]) -> TestCluster {
        let etcd = Etcd::start();
        let dir = tempfile::tempdir().expect("cluster dir");
        std::fs::write(dir.path().join("cluster.key"), format!("{KEY}\n")).expect("key file");
        std::fs::write(dir.path().join("yutu.toml"), USERS).expect("config file");
        let mut c = TestCluster {
            etcd,
            nodes: Vec::new(),
            dir,
            args: args.iter().map(|s| s.to_string()).collect(),
        };
        for i in 0..n {
            let s = c.spawn(i, &[]);
            c.nodes.push(Some(s));
        }
        let all: Vec<String> = (0..n).map(|i| format!("node{i}")).collect();
        for i in 0..n {
            c.wait_members(i, &all);
        }
        c
    }

    /// The etcd URL the nodes are started with: etcd itself, unless a test put a proxy in
    /// between for one node.
    fn spawn(&self, i: usize, extra: &[&str]) -> Server {
        self.spawn_with_etcd(i, &self.etcd.url.clone(), extra)
    }

    pub fn spawn_with_etcd(&self, i: usize, etcd: &str, extra: &[&str]) -> Server {
        let data = self.dir.path().join(format!("node{i}"));
        let given = |flag: &str| self.args.iter().any(|a| a == flag) || extra.contains(&flag);
        // Small nodes unless the test says otherwise.
        let defaults: Vec<&str> = [
            ("--nvme-capacity", "0"),
            ("--shards", "2"),
            ("--memory", "64MiB"),
            ("--lease-ttl-secs", "3"),
        ]
        .iter()
        .filter(|(flag, _)| !given(flag))
        .flat_map(|(flag, value)| [*flag, *value])
        .collect();
        let mut cmd = Command::new(bin_path("yutu-server"));
        cmd.args(["--listen", "127.0.0.1:0", "--etcd", etcd])
            .args(["--node-name", &format!("node{i}")])
            .arg("--cluster-key-file")
            .arg(self.dir.path().join("cluster.key"))
            .arg("--config")
            .arg(self.dir.path().join("yutu.toml"))
            .arg("--data-dir")
            .arg(&data)
            .args(&defaults)
            .args(&self.args)
            .args(extra);
        Server::spawn(cmd, tempfile::tempdir().expect("temp dir"))
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Node `i` (panics if it was killed).
    pub fn node(&self, i: usize) -> &Server {
        self.nodes[i].as_ref().expect("the node is running")
    }

    /// SIGKILLs node `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(s) = self.nodes[i].take() {
            s.kill();
        }
    }

    /// Stops node `i` with SIGTERM and waits for it to exit.
    pub fn stop(&mut self, i: usize) {
        if let Some(mut s) = self.nodes[i].take() {
            s.terminate();
            assert!(
                s.exit_within(Duration::from_secs(20)).is_some(),
                "node{i} did not stop"
            );
        }
    }

    /// Starts node `i` again on its data directory (same name), with `extra` arguments.
    pub fn restart(&mut self, i: usize, extra: &[&str]) {
        self.kill(i);
        let s = self.spawn(i, extra);
        self.nodes[i] = Some(s);
    }

    /// Adds a node started by the caller (e.g. one that reaches etcd through a proxy) as
    /// node `len()`.
    pub fn push_node(&mut self, server: Server) {
        self.nodes.push(Some(server));
    }

    /// The etcd client address, for a proxy in front of it.
    pub fn etcd_addr(&self) -> std::net::SocketAddr {
        self.etcd
            .url
            .trim_start_matches("http://")
            .parse()
            .expect("etcd listens on an IP address")
    }

    fn token(sub: &str) -> String {
        let claims = Claims {
            admin: true,
            ..Claims::new(sub, Duration::from_secs(3600))
        };
        issue(
            &claims,
            "cluster",
            &SigningKey::Secret(KEY.as_bytes().to_vec()),
        )
        .expect("sign a token")
    }

    /// An admin token every node accepts (signed with the cluster key).
    pub fn admin_token() -> String {
        Self::token("test-admin")
    }

    /// A node token, as nodes sign them for each other.
    pub fn node_token() -> String {
        Self::token("node:test")
    }

    /// Node `i`'s membership document, or `None` while it does not answer.
    pub fn membership(&self, i: usize) -> Option<Membership> {
        let auth = format!("Bearer {}", Self::admin_token());
        let r = self
            .node(i)
            .client()
            .try_get("/v1/cluster", &[("authorization", &auth)])?;
        serde_json::from_slice(&r.body).ok()
    }

    /// Names of the members node `i` sees.
    pub fn members(&self, i: usize) -> Vec<String> {
        self.membership(i)
            .map(|m| m.members.into_iter().map(|m| m.name).collect())
            .unwrap_or_default()
    }

    /// Waits (30 s at most) until node `i` sees exactly `expected`.
    pub fn wait_members(&self, i: usize, expected: &[String]) {
        let mut seen = Vec::new();
        let ok = wait_until(Duration::from_secs(30), || {
            seen = self.members(i);
            seen == expected
        });
        assert!(ok, "node{i} sees {seen:?}, expected {expected:?}");
    }

    /// A request signed by alice (SigV4), sent to node `i`.
    pub fn alice(&self, i: usize, method: &str, path: &str, body: &[u8]) -> Reply {
        send_as(self.node(i), &crate::users::alice(), method, path, body)
    }

    /// A request signed by bob, sent to node `i`.
    pub fn bob(&self, i: usize, method: &str, path: &str, body: &[u8]) -> Reply {
        send_as(self.node(i), &crate::users::bob(), method, path, body)
    }

    /// What node `i` itself holds at `path` (a GET it serves locally, as for another node).
    pub fn local_get(&self, i: usize, path: &str) -> Reply {
        let auth = format!("Bearer {}", Self::node_token());
        self.node(i).client().send(
            "GET",
            path,
            &[
                ("authorization", &auth),
                (yutu_api::cluster::FORWARDED_HEADER, "test"),
            ],
            None,
        )
    }

    /// Which nodes hold `path` themselves.
    pub fn holders(&self, path: &str) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].is_some() && self.local_get(i, path).status == 200)
            .collect()
    }

    /// The cluster's directory (the key file is `cluster.key` in it).
    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }
}
