//! A cluster for tests: a real etcd and N real `yutu-server` nodes on loopback, with
//! authentication on (alice and bob as users, a shared cluster key), each node with a data
//! directory that survives its restarts.

use std::net::SocketAddr;
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
    /// The addresses each node listened on when last seen running, so that
    /// [`TestCluster::restart_same_port`] can bring it back on them after it was killed.
    ports: Vec<Option<NodePorts>>,
}

/// The addresses a node listens on: its HTTP port and, once known (see
/// [`TestCluster::pin_ports`]), its transfer engine's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodePorts {
    pub http: SocketAddr,
    pub transfer: Option<SocketAddr>,
}

impl TestCluster {
    /// Starts etcd and `n` nodes (`node0`...), each with `args` besides the cluster flags, and
    /// waits until every node sees all `n` and has caught up (its first anti-entropy pass:
    /// until then it answers writes of keys it shares with 503, by design). Seeing the others
    /// is not enough: the nodes learn of each other through etcd's watch within milliseconds,
    /// before that first pass has run.
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
            ports: Vec::new(),
        };
        for i in 0..n {
            let s = c.spawn(i, &[]);
            c.nodes.push(Some(s));
        }
        let all: Vec<String> = (0..n).map(|i| format!("node{i}")).collect();
        for i in 0..n {
            c.wait_members(i, &all);
        }
        for i in 0..n {
            let node = c.node(i);
            assert!(
                wait_until(Duration::from_secs(30), || node
                    .metric_sum("yutu_cluster_caught_up")
                    == 1.0),
                "node{i} never caught up; log:\n{}",
                node.log()
            );
        }
        c
    }

    /// The etcd URL the nodes are started with: etcd itself, unless a test put a proxy in
    /// between for one node.
    fn spawn(&self, i: usize, extra: &[&str]) -> Server {
        self.spawn_with_etcd(i, &self.etcd.url.clone(), extra)
    }

    pub fn spawn_with_etcd(&self, i: usize, etcd: &str, extra: &[&str]) -> Server {
        self.spawn_listening(i, etcd, "127.0.0.1:0", extra)
    }

    /// Starts node `i` listening on `listen` (`127.0.0.1:0` for a free port).
    fn spawn_listening(&self, i: usize, etcd: &str, listen: &str, extra: &[&str]) -> Server {
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
        cmd.args(["--listen", listen, "--etcd", etcd])
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
        self.remember_ports(i);
        if let Some(s) = self.nodes[i].take() {
            s.kill();
        }
    }

    /// Stops node `i` with SIGTERM and waits for it to exit.
    pub fn stop(&mut self, i: usize) {
        self.remember_ports(i);
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

    /// Whether node `i` is running (not killed or stopped by the test).
    pub fn is_running(&self, i: usize) -> bool {
        self.nodes.get(i).is_some_and(|n| n.is_some())
    }

    /// Records the HTTP address of node `i` while it runs (kept with the transfer address
    /// [`TestCluster::pin_ports`] found, if the node still listens where it did).
    fn remember_ports(&mut self, i: usize) {
        let Some(http) = self.nodes.get(i).and_then(|n| n.as_ref()).map(|s| s.addr) else {
            return;
        };
        if self.ports.len() <= i {
            self.ports.resize(i + 1, None);
        }
        let transfer = self.ports[i]
            .filter(|p| p.http == http)
            .and_then(|p| p.transfer);
        self.ports[i] = Some(NodePorts { http, transfer });
    }

    /// Node `i`'s HTTP and transfer addresses (the transfer one from its membership record),
    /// recorded so that [`TestCluster::restart_same_port`] restarts it on both. Panics if the
    /// node does not answer.
    pub fn pin_ports(&mut self, i: usize) -> NodePorts {
        let http = self.node(i).addr;
        let name = format!("node{i}");
        let transfer = self
            .membership(i)
            .expect("the node answers with its membership")
            .members
            .into_iter()
            .find(|m| m.name == name)
            .and_then(|m| m.transfer)
            .and_then(|t| t.parse().ok());
        if self.ports.len() <= i {
            self.ports.resize(i + 1, None);
        }
        let ports = NodePorts { http, transfer };
        self.ports[i] = Some(ports);
        ports
    }

    /// The addresses node `i` was last seen listening on.
    pub fn ports(&self, i: usize) -> Option<NodePorts> {
        self.ports.get(i).copied().flatten()
    }

    /// Starts node `i` again on its data directory and on the same HTTP address (and transfer
    /// address, when [`TestCluster::pin_ports`] recorded it) as its last run, SIGKILLing it
    /// first if it still runs: what an operator's restart does, where clients and peers keep
    /// the node's address. Panics (with the node's log) if it cannot bind them.
    pub fn restart_same_port(&mut self, i: usize, extra: &[&str]) {
        self.kill(i);
        let ports = self
            .ports(i)
            .unwrap_or_else(|| panic!("node{i} never ran: no address to restart it on"));
        let transfer = ports.transfer.map(|t| t.to_string());
        let mut args: Vec<&str> = extra.to_vec();
        if let Some(t) = &transfer {
            if !extra.contains(&"--transfer-listen") {
                args.extend(["--transfer-listen", t.as_str()]);
            }
        }
        let etcd = self.etcd.url.clone();
        let s = self.spawn_listening(i, &etcd, &ports.http.to_string(), &args);
        assert_eq!(s.addr, ports.http, "node{i} restarted on another address");
        self.nodes[i] = Some(s);
    }

    /// Freezes node `i` (SIGSTOP): its sockets stay open and the kernel still accepts
    /// connections for it, but nothing answers. The node is SIGKILLed on drop as usual.
    pub fn pause(&self, i: usize) {
        signal(self.node(i).pid(), "-STOP");
    }

    /// Thaws node `i` after [`TestCluster::pause`] (SIGCONT).
    pub fn resume(&self, i: usize) {
        signal(self.node(i).pid(), "-CONT");
    }

    /// Waits (30 s at most) until every node that runs reports itself settled: its rebalancer
    /// done with the membership it sees, caught up with the other owners by anti-entropy, and
    /// owing no hint. Until a node is caught up it answers reads of its keys from other nodes
    /// (and [`TestCluster::holders`]' local reads) with 503.
    pub fn wait_settled(&self) {
        let running: Vec<usize> = (0..self.nodes.len())
            .filter(|i| self.nodes[*i].is_some())
            .collect();
        let mut last = Vec::new();
        let ok = wait_until(Duration::from_secs(30), || {
            last = running
                .iter()
                .map(|i| self.local_stats(*i).is_some_and(|st| st.settled))
                .collect();
            last.iter().all(|s| *s)
        });
        assert!(ok, "nodes {running:?} settled: {last:?}");
    }

    /// Node `i`'s own part of the admin stats (`/admin/v1/local/stats`: `settled`,
    /// `rebalancing`, `under_replicated`...), or `None` while it does not answer.
    pub fn local_stats(&self, i: usize) -> Option<yutu_api::admin::NodeStats> {
        let auth = format!("Bearer {}", Self::admin_token());
        let path = format!("{}/stats", yutu_api::admin::LOCAL_PREFIX);
        let r = self
            .node(i)
            .client()
            .try_get(&path, &[("authorization", &auth)])?;
        (r.status == 200)
            .then(|| serde_json::from_slice(&r.body).ok())
            .flatten()
    }
}

/// Sends `sig` (`-STOP`, `-CONT`...) to process `pid` with kill(1) (the test crate has no
/// libc binding), and checks that it was delivered.
fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {sig} {pid} failed");
}
