//! Restarting nodes where clients and peers know them, and asking a cluster about a member
//! that does not answer.
//!
//! - A node SIGKILLed (or stopped with SIGTERM) while clients and peers hold connections to
//!   it restarts on the same ports at once: its old connections linger in FIN_WAIT2 or
//!   TIME_WAIT for up to a minute, and every listener must set SO_REUSEADDR to share the port
//!   with them (while a second live node on the address is still refused: `ops.rs`).
//! - `admin nodes` with a member frozen (SIGSTOP) answers within a short per-member deadline
//!   and reports that member unreachable, saying why, instead of hanging on it.

use std::time::{Duration, Instant};

use yutu_api::admin::{NodeState, NodesResponse, NODES_PATH};
use yutu_tests::cluster::TestCluster;
use yutu_tests::server::wait_until;
use yutu_tests::{Client, Reply};

fn auth() -> String {
    format!("Bearer {}", TestCluster::admin_token())
}

fn names(ids: &[usize]) -> Vec<String> {
    ids.iter().map(|i| format!("node{i}")).collect()
}

fn admin(c: &TestCluster, i: usize, method: &str, path: &str, body: &[u8]) -> Reply {
    c.node(i)
        .client()
        .send(method, path, &[("authorization", &auth())], Some(body))
}

/// Sockets of this host whose local port is `port`, by state, from /proc/net/tcp (the tests
/// and the nodes share the loopback interface).
fn sockets_on(port: u16) -> Vec<&'static str> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let local = fields.nth(1)?;
            let state = fields.nth(1)?;
            let p = u16::from_str_radix(local.rsplit(':').next()?, 16).ok()?;
            (p == port).then_some(match state {
                "01" => "ESTABLISHED",
                "04" => "FIN_WAIT1",
                "05" => "FIN_WAIT2",
                "06" => "TIME_WAIT",
                "08" => "CLOSE_WAIT",
                "0A" => "LISTEN",
                _ => "OTHER",
            })
        })
        .collect()
}

/// Connections of a dead node that keep its port busy for the kernel.
fn lingering(port: u16) -> usize {
    sockets_on(port)
        .iter()
        .filter(|s| matches!(**s, "FIN_WAIT1" | "FIN_WAIT2" | "TIME_WAIT"))
        .count()
}

/// Node1 of three, with client connections (many, so that every shard accepted some) and
/// peer connections (writes through the others that it owns) open, goes down by `down`, and
/// must come back on its HTTP and transfer ports at once and serve; three times over, as
/// the kernel's teardown of a dead node's sockets races the restart.
fn restarts_on_its_ports(down: fn(&mut TestCluster, usize)) {
    let mut c = TestCluster::start(3, &[]);
    let r = c.node(0).client().send(
        "PUT",
        "/again",
        &[("authorization", &auth()), ("x-yutu-replicas", "2")],
        Some(b""),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    for i in 0..3 {
        c.pin_ports(i);
    }
    let ports = c.ports(1).expect("node1's ports");
    assert!(ports.transfer.is_some(), "node1 has a transfer address");
    let port = ports.http.port();
    for round in 0..3 {
        // Peer connections: node0 and node2 forward and replicate to node1 the keys it owns.
        let mut on1 = 0;
        for k in 0..30 {
            let path = format!("/again/r{round}k{k}");
            let via = [0, 2][k % 2];
            // A restarted node refuses writes of its keys (503) until it has caught up with
            // the other owners: retried.
            let mut r = admin(&c, via, "PUT", &path, format!("v{k}").as_bytes());
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while r.status == 503 && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
                r = admin(&c, via, "PUT", &path, format!("v{k}").as_bytes());
            }
            assert_eq!(r.status, 200, "{path}: {}", r.text());
            on1 += usize::from(c.holders(&path).contains(&1));
        }
        assert!(on1 > 0, "node1 owns some keys");
        // Client connections, kept open (each client pools its connection) across the kill.
        let clients: Vec<Client> = (0..16)
            .map(|_| {
                let client = c.node(1).client();
                assert_eq!(client.get("/health").status, 200);
                client
            })
            .collect();
        let established = sockets_on(port)
            .iter()
            .filter(|s| **s == "ESTABLISHED")
            .count();
        assert!(established >= 16, "{:?}", sockets_on(port));

        down(&mut c, 1);
        assert!(
            wait_until(Duration::from_secs(5), || lingering(port) > 0),
            "round {round}: the dead node left no connection on its port: {:?}",
            sockets_on(port)
        );
        let before = sockets_on(port);
        // At once: panics with the node's log if it cannot bind its ports.
        c.restart_same_port(1, &[]);
        assert_eq!(c.node(1).addr, ports.http, "lingering: {before:?}");
        for i in 0..3 {
            c.wait_members(i, &names(&[0, 1, 2]));
        }
        // Node1's record as node0 sees it: read until it names node1's transfer port (a
        // 3 s lease on a loaded machine may lapse and be granted again meanwhile).
        let transfer = ports.transfer.map(|t| t.to_string());
        let mut record = None;
        let back = wait_until(Duration::from_secs(20), || {
            record = c
                .membership(0)
                .and_then(|m| m.members.into_iter().find(|m| m.name == "node1"));
            record.as_ref().is_some_and(|m| m.transfer == transfer)
        });
        assert!(back, "node1 is back on its transfer port: {record:?}");
        // It serves its old clients (on new connections) and new writes and reads.
        for client in &clients {
            assert_eq!(client.get("/health").status, 200);
        }
        let path = format!("/again/after{round}");
        let wrote = wait_until(Duration::from_secs(20), || {
            admin(&c, 1, "PUT", &path, b"back").status == 200
        });
        assert!(
            wrote,
            "node1 does not take writes; log:\n{}",
            c.node(1).log()
        );
        for i in 0..3 {
            assert_eq!(admin(&c, i, "GET", &path, b"").body, b"back");
        }
    }
}

#[test]
fn a_sigkilled_node_restarts_on_its_ports_at_once() {
    restarts_on_its_ports(|c, i| c.kill(i));
}

#[test]
fn a_node_stopped_with_sigterm_restarts_on_its_ports_at_once() {
    restarts_on_its_ports(|c, i| c.stop(i));
}

/// `GET /admin/v1/nodes` through `node` with a client that gives up after `timeout`: the
/// status and body, or `None` if no answer came in time.
fn nodes_within(c: &TestCluster, node: usize, timeout: Duration) -> Option<(u16, Vec<u8>)> {
    let config = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(timeout))
        .build();
    let agent = ureq::Agent::new_with_config(config);
    let req = http::Request::builder()
        .method("GET")
        .uri(format!("{}{NODES_PATH}", c.node(node).url))
        .header("authorization", auth())
        .body(())
        .ok()?;
    let resp = agent.run(req).ok()?;
    let status = resp.status().as_u16();
    let body = resp.into_body().read_to_vec().ok()?;
    Some((status, body))
}

/// Defect: with one member frozen (SIGSTOP), `yutu admin nodes` hung on it, then reported
/// it up. Each member now has a short deadline (2 s) to report: the frozen one is reported
/// unreachable, with the reason, and the call answers well before a client gives up.
#[test]
fn admin_nodes_reports_a_paused_member_unreachable() {
    // A lease much longer than the test, so that the frozen node stays a member throughout.
    let c = TestCluster::start(3, &["--lease-ttl-secs", "60"]);
    let up = nodes_within(&c, 0, Duration::from_secs(10)).expect("an answer");
    let up: NodesResponse = serde_json::from_slice(&up.1).expect("a nodes document");
    assert!(up.nodes.iter().all(|n| n.state == NodeState::Up), "{up:?}");

    c.pause(2);
    let asked = Instant::now();
    // Well past the per-member deadline, well short of the old 30 s member timeout.
    let answer = nodes_within(&c, 0, Duration::from_secs(10));
    let took = asked.elapsed();
    c.resume(2);
    let (status, body) = answer.unwrap_or_else(|| {
        panic!("admin nodes did not answer within 10 s ({took:?}) with node2 frozen")
    });
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let nodes: NodesResponse = serde_json::from_slice(&body).expect("a nodes document");
    let state = |name: &str| nodes.nodes.iter().find(|n| n.name == name).map(|n| n.state);
    assert_eq!(state("node2"), Some(NodeState::Unreachable), "{nodes:?}");
    assert_eq!(state("node0"), Some(NodeState::Up), "{nodes:?}");
    assert_eq!(state("node1"), Some(NodeState::Up), "{nodes:?}");
    // Why it is unreachable, in the member's entry.
    let doc: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
    let entry = doc["nodes"]
        .as_array()
        .and_then(|n| n.iter().find(|e| e["name"] == "node2"))
        .expect("node2's entry");
    let reason = entry["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("no answer within"), "{entry}");

    // Thawed, it is reported up again.
    let back = wait_until(Duration::from_secs(20), || {
        nodes_within(&c, 1, Duration::from_secs(10))
            .and_then(|(_, b)| serde_json::from_slice::<NodesResponse>(&b).ok())
            .is_some_and(|n| n.nodes.iter().all(|n| n.state == NodeState::Up))
    });
    assert!(back, "node2 is not reported up after SIGCONT");
}
