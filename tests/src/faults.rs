//! Fault-injection scenarios, Jepsen style, on loopback: a [`TestCluster`] of three real nodes
//! and a bucket with two replicas; client threads run PUT (of unique values), GET and DELETE
//! over a few keys through random nodes while a nemesis SIGKILLs and restarts nodes on their
//! ports, freezes them (SIGSTOP) past their lease, or stops etcd. Then the cluster is left to
//! quiesce, every node's own copy of every key is read, and [`crate::history::check`] judges
//! the history against it.
//!
//! Everything random comes from the scenario's seed (`YUTU_FAULT_SEED` overrides it), and
//! every phase is bounded: operations per client, a wall-clock deadline for the load, and
//! deadlines on every wait. The nemesis waits on conditions (members seen to leave and come
//! back, etcd outage seen), never on sleeps.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use yutu_api::cluster::{owners, Membership, FORWARDED_HEADER};

use crate::cluster::TestCluster;
use crate::history::{self, AnomalyKind, Held, KeyState, Op, OpKind, Outcome, Recorder, Report};
use crate::server::wait_until;

/// The bucket every scenario writes.
pub const BUCKET: &str = "jepsen";
/// Its replica count.
pub const REPLICAS: usize = 2;
/// Nodes in the cluster.
pub const NODES: usize = 3;

/// What the bucket is created with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    Memory,
    Disk,
}

impl Durability {
    fn header(self) -> &'static str {
        match self {
            Durability::Memory => "memory",
            Durability::Disk => "disk",
        }
    }
}

/// One thing the nemesis does to the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL a node, and restart it at once on its data directory and ports: back before
    /// its lease (3 s) expires, so the others may never see it leave.
    KillRestartInsideTheLease,
    /// SIGKILL a node, wait until the others have dropped it (its lease expired), then restart
    /// it on its data directory and ports.
    KillRestartAfterTheLease,
    /// SIGSTOP a node until the others have dropped it (longer than its lease), then SIGCONT:
    /// it comes back believing it still is a member, with requests in flight.
    PauseLongerThanTheLease,
    /// Kill etcd until every node sees the outage (longer than a lease), then restart it on
    /// its data.
    EtcdStoppedAndRestarted,
    /// etcd SIGSTOPped until every node sees the outage, then SIGCONT.
    EtcdFrozen,
}

/// A scenario: the cluster, the load, the faults, the bounds.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: String,
    pub seed: u64,
    pub durability: Durability,
    /// Applied in order, each after `ops_between_faults` more operations.
    pub faults: Vec<Fault>,
    pub clients: usize,
    pub keys: usize,
    /// Most operations a client runs.
    pub max_ops_per_client: usize,
    /// Operations (all clients together) before the first fault and between two faults.
    pub ops_between_faults: usize,
    /// Operations (all clients together) after the last fault, before the load stops.
    pub ops_after_faults: usize,
    /// How long a client waits for one answer before it calls the operation unknown.
    pub client_timeout: Duration,
    /// Most time a client pauses between two operations (a random share of it), so that the
    /// load spreads over the faults instead of finishing before them.
    pub think: Duration,
    /// The load stops at this deadline whatever the counts.
    pub load_deadline: Duration,
    /// How long the cluster gets to settle after the load before its state is read.
    pub settle_deadline: Duration,
    /// How long, once settled, the owners of every key get to agree (repair that runs in
    /// the background) before the state is judged as it is.
    pub converge_deadline: Duration,
    /// A GET invoked this long after a write was acknowledged must see it (or later).
    pub stale_bound: Duration,
}

impl Scenario {
    /// The defaults every test starts from: 4 clients over 20 keys, memory durability.
    pub fn new(name: &str, seed: u64, faults: &[Fault]) -> Scenario {
        let seed = std::env::var("YUTU_FAULT_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(seed);
        Scenario {
            name: name.to_string(),
            seed,
            durability: Durability::Memory,
            faults: faults.to_vec(),
            clients: 4,
            keys: 20,
            max_ops_per_client: 1000,
            ops_between_faults: 150,
            // A handful: the cluster serves again after the last fault, but later writes
            // would overwrite on every owner (and so hide) what the faults left behind.
            ops_after_faults: 8,
            client_timeout: Duration::from_secs(2),
            think: Duration::from_millis(10),
            load_deadline: Duration::from_secs(30),
            settle_deadline: Duration::from_secs(20),
            converge_deadline: Duration::from_secs(10),
            stale_bound: Duration::from_secs(1),
        }
    }

    pub fn durability(mut self, d: Durability) -> Scenario {
        self.durability = d;
        self
    }

    /// Operations (all clients together) after the last fault: the whole load of a scenario
    /// without faults.
    pub fn ops_after_faults(mut self, n: usize) -> Scenario {
        self.ops_after_faults = n;
        self
    }
}

/// What a scenario run produced.
pub struct Run {
    pub scenario: Scenario,
    pub history: Vec<Op>,
    pub report: Report,
    /// Whether every node reported itself settled before the state was read.
    pub settled: bool,
    /// Whether the owners of every key agreed before the state was judged.
    pub converged: bool,
    /// What the nemesis did, with times from the history's start.
    pub nemesis: Vec<String>,
    /// How long the load ran (faults included), how long the cluster took to settle, and
    /// then its owners to agree.
    pub load: Duration,
    pub settle: Duration,
    pub converge: Duration,
    pub wall: Duration,
}

/// The anomalies a scenario must not show.
pub const FORBIDDEN: [AnomalyKind; 6] = [
    AnomalyKind::LostWrite,
    AnomalyKind::ResurrectedDelete,
    AnomalyKind::Divergent,
    AnomalyKind::UnderReplicated,
    AnomalyKind::Phantom,
    AnomalyKind::Unreadable,
];

impl Run {
    /// The summary line (JSON).
    pub fn summary(&self) -> String {
        let head = format!(
            r#""scenario":{:?},"seed":{},"settled":{},"converged":{},"wall_s":{:.1},"load_s":{:.1},"settle_s":{:.1},"converge_s":{:.1}"#,
            self.scenario.name,
            self.scenario.seed,
            self.settled,
            self.converged,
            self.wall.as_secs_f64(),
            self.load.as_secs_f64(),
            self.settle.as_secs_f64(),
            self.converge.as_secs_f64()
        );
        self.report.summary(&head)
    }

    /// Panics, saying which keys and operations show it, if the run has any anomaly of
    /// [`FORBIDDEN`].
    pub fn assert_clean(&self) {
        let bad: Vec<String> = FORBIDDEN
            .iter()
            .filter(|k| self.report.count(**k) > 0)
            .map(|k| format!("{} {}", self.report.count(*k), k.name()))
            .collect();
        assert!(
            bad.is_empty(),
            "scenario {} (seed {}): {}\nsummary: {}\nnemesis:\n  {}\n{}",
            self.scenario.name,
            self.scenario.seed,
            bad.join(", "),
            self.summary(),
            self.nemesis.join("\n  "),
            self.report.explain(&FORBIDDEN, &self.history, 25)
        );
    }
}

/// A small seeded generator (xorshift64*), one per thread.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// An HTTP client that reports transport failures instead of panicking, with a short
/// timeout: an answer that does not come in time makes the operation unknown.
struct Http {
    agent: ureq::Agent,
}

/// How a request ended, short of an HTTP answer.
enum Transport {
    /// Nothing was sent (the connection was refused).
    Refused(String),
    /// Anything else: the request may have reached the node.
    Unknown(String),
}

impl Http {
    fn new(timeout: Duration) -> Http {
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .timeout_global(Some(timeout))
            .build();
        Http {
            agent: ureq::Agent::new_with_config(config),
        }
    }

    fn send(
        &self,
        url: &str,
        method: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> Result<(u16, Vec<u8>), Transport> {
        let mut builder = http::Request::builder().method(method).uri(url);
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        let result = match body {
            Some(b) => builder
                .body(b.to_vec())
                .map_err(|e| Transport::Refused(e.to_string()))
                .and_then(|r| self.agent.run(r).map_err(transport)),
            None => builder
                .body(())
                .map_err(|e| Transport::Refused(e.to_string()))
                .and_then(|r| self.agent.run(r).map_err(transport)),
        }?;
        let status = result.status().as_u16();
        let body = result
            .into_body()
            .read_to_vec()
            .map_err(|e| Transport::Unknown(format!("reading the answer: {e}")))?;
        Ok((status, body))
    }
}

fn transport(e: ureq::Error) -> Transport {
    match &e {
        ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            Transport::Refused("connection refused".into())
        }
        ureq::Error::ConnectionFailed => Transport::Refused("connection failed".into()),
        ureq::Error::Timeout(_) => Transport::Unknown("timeout".into()),
        _ => Transport::Unknown(e.to_string()),
    }
}

/// Everything the client threads share.
struct Load<'a> {
    scenario: &'a Scenario,
    urls: Vec<String>,
    auth: String,
    recorder: &'a Recorder,
    /// Operations completed, all clients together: what the nemesis paces itself on.
    progress: AtomicUsize,
    stop: AtomicBool,
    deadline: Instant,
}

fn key_name(k: usize) -> String {
    format!("k{k:02}")
}

/// One client: random operations on random keys through random nodes, each recorded.
fn client(load: &Load, id: usize) {
    let s = load.scenario;
    let mut rng = Rng::new(s.seed ^ ((id as u64 + 1) << 32));
    let http = Http::new(s.client_timeout);
    let auth = [("authorization", load.auth.as_str())];
    for seq in 0..s.max_ops_per_client {
        if load.stop.load(Ordering::Relaxed) || Instant::now() >= load.deadline {
            break;
        }
        let key = key_name(rng.below(s.keys));
        let node = rng.below(load.urls.len());
        let kind = match rng.below(100) {
            0..=44 => OpKind::Put(format!("c{id}-{seq}")),
            45..=79 => OpKind::Get,
            _ => OpKind::Delete,
        };
        let url = format!("{}/{BUCKET}/{key}", load.urls[node]);
        let invoke = load.recorder.now();
        let answer = match &kind {
            OpKind::Put(v) => http.send(&url, "PUT", &auth, Some(v.as_bytes())),
            OpKind::Get => http.send(&url, "GET", &auth, None),
            OpKind::Delete => http.send(&url, "DELETE", &auth, None),
        };
        let complete = load.recorder.now();
        let outcome = match answer {
            Ok((status, body)) => match (status, &kind) {
                (200, OpKind::Get) => Outcome::Ok(Some(String::from_utf8_lossy(&body).into())),
                (404, OpKind::Get) if no_such_key(&body) => Outcome::Ok(None),
                (200..=299, _) => Outcome::Ok(None),
                (400..=499, _) => Outcome::Failed(status_reason(status, &body)),
                _ => Outcome::Unknown(status_reason(status, &body)),
            },
            Err(Transport::Refused(why)) => Outcome::Failed(why),
            Err(Transport::Unknown(why)) => Outcome::Unknown(why),
        };
        load.recorder.record(Op {
            id: 0,
            client: id,
            node,
            key,
            kind,
            invoke,
            complete,
            outcome,
        });
        load.progress.fetch_add(1, Ordering::Relaxed);
        // Pacing, not synchronisation: spreads the load over the nemesis's faults.
        let think = s.think.as_micros() as usize;
        if think > 0 {
            std::thread::sleep(Duration::from_micros(rng.below(think) as u64));
        }
    }
}

fn status_reason(status: u16, body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let code = crate::xml::values(&text, "Code").into_iter().next();
    match code {
        Some(c) => format!("{status} {c}"),
        None => status.to_string(),
    }
}

/// A 404 that says the key is absent (not that the bucket is unknown).
fn no_such_key(body: &[u8]) -> bool {
    crate::xml::values(&String::from_utf8_lossy(body), "Code")
        .iter()
        .any(|c| c == "NoSuchKey")
}

fn names(ids: impl IntoIterator<Item = usize>) -> Vec<String> {
    ids.into_iter().map(|i| format!("node{i}")).collect()
}

/// Waits (with `timeout`) until node `i` sees exactly `expected`; false if it never did.
fn sees(c: &TestCluster, i: usize, expected: &[String], timeout: Duration) -> bool {
    wait_until(timeout, || c.members(i) == expected)
}

/// Stops the clients when the nemesis returns or panics.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// What the nemesis does: applies `fault` and waits until the cluster shows it (and, for a
/// fault that ends, until every node sees all members again). Panics if the cluster never
/// shows it within the deadlines.
fn apply(c: &mut TestCluster, fault: Fault, rng: &mut Rng) -> String {
    let all = names(0..NODES);
    let wait = Duration::from_secs(20);
    let victim = rng.below(NODES);
    let others: Vec<usize> = (0..NODES).filter(|&j| j != victim).collect();
    let rejoined = |c: &TestCluster| {
        for i in 0..NODES {
            assert!(
                sees(c, i, &all, wait),
                "node{i} does not see every member again: {:?}",
                c.members(i)
            );
        }
    };
    match fault {
        Fault::KillRestartInsideTheLease => {
            c.kill(victim);
            c.restart_same_port(victim, &[]);
            rejoined(c);
            format!("SIGKILL node{victim}, restarted on its port at once")
        }
        Fault::KillRestartAfterTheLease => {
            c.kill(victim);
            for &j in &others {
                assert!(
                    sees(c, j, &names(others.clone()), wait),
                    "node{j} still sees the killed node{victim}"
                );
            }
            c.restart_same_port(victim, &[]);
            rejoined(c);
            format!("SIGKILL node{victim}, dropped by the others, restarted on its port")
        }
        Fault::PauseLongerThanTheLease => {
            c.pause(victim);
            let dropped = others
                .iter()
                .all(|&j| sees(c, j, &names(others.clone()), wait));
            c.resume(victim);
            assert!(dropped, "the others never dropped the paused node{victim}");
            rejoined(c);
            format!("SIGSTOP node{victim} until the others dropped it, then SIGCONT")
        }
        Fault::EtcdStoppedAndRestarted | Fault::EtcdFrozen => {
            // Stopped (SIGSTOP: connections hang) or killed (refused).
            let frozen = fault == Fault::EtcdFrozen;
            if frozen {
                c.etcd.pause();
            } else {
                c.etcd.kill();
            }
            let seen = wait_until(wait, || {
                (0..NODES).all(|i| c.node(i).metric_sum("yutu_cluster_etcd_outage") == 1.0)
            });
            if frozen {
                c.etcd.resume();
            } else {
                c.etcd.restart();
            }
            assert!(seen, "the nodes never saw etcd gone");
            let back = wait_until(Duration::from_secs(30), || {
                (0..NODES).all(|i| {
                    let n = c.node(i);
                    n.metric_sum("yutu_cluster_etcd_outage") == 0.0
                        && n.metric_sum("yutu_cluster_writable") == 1.0
                })
            });
            assert!(back, "the nodes never saw etcd back");
            rejoined(c);
            if frozen {
                "etcd SIGSTOPped until every node saw the outage, then SIGCONT".to_string()
            } else {
                "etcd killed until every node saw the outage, then restarted".to_string()
            }
        }
    }
}

/// Runs `s` and judges it. Panics only if the harness itself fails (a node that cannot
/// restart, a fault the cluster never shows); anomalies are in the returned [`Run`].
pub fn run(s: &Scenario) -> Run {
    let started = Instant::now();
    let mut args = vec![];
    if s.durability == Durability::Disk {
        args.extend(["--nvme-capacity", "16MiB"]);
    }
    let mut c = TestCluster::start(NODES, &args);
    for i in 0..NODES {
        c.pin_ports(i);
    }
    let auth = format!("Bearer {}", TestCluster::admin_token());
    let r = c.node(0).client().send(
        "PUT",
        &format!("/{BUCKET}"),
        &[
            ("authorization", &auth),
            ("x-yutu-replicas", &REPLICAS.to_string()),
            ("x-yutu-durability", s.durability.header()),
        ],
        Some(b""),
    );
    assert_eq!(r.status, 200, "create the bucket: {}", r.text());

    let recorder = Recorder::new();
    let load = Load {
        scenario: s,
        urls: (0..NODES).map(|i| c.node(i).url.clone()).collect(),
        auth,
        recorder: &recorder,
        progress: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        deadline: Instant::now() + s.load_deadline,
    };
    let mut nemesis = Vec::new();
    let mut rng = Rng::new(s.seed);
    let load_started = Instant::now();
    std::thread::scope(|scope| {
        for id in 0..s.clients {
            let load = &load;
            scope.spawn(move || client(load, id));
        }
        let _stop = StopOnDrop(&load.stop);
        let progressed = |target: usize| {
            wait_until(
                load.deadline.saturating_duration_since(Instant::now()),
                || {
                    load.progress.load(Ordering::Relaxed) >= target
                        || load.stop.load(Ordering::Relaxed)
                },
            )
        };
        for fault in &s.faults {
            let target = load.progress.load(Ordering::Relaxed) + s.ops_between_faults;
            if !progressed(target) {
                nemesis.push(format!("load ended before {fault:?}"));
                break;
            }
            let at = recorder.now();
            let what = apply(&mut c, *fault, &mut rng);
            nemesis.push(format!(
                "[{:.3}s..{:.3}s] {what}",
                at.as_secs_f64(),
                recorder.now().as_secs_f64()
            ));
        }
        progressed(load.progress.load(Ordering::Relaxed) + s.ops_after_faults);
    });

    let load_time = load_started.elapsed();
    let settle_started = Instant::now();
    // Quiesce: every node up, seeing every member, and settled.
    let all = names(0..NODES);
    for i in 0..NODES {
        assert!(c.is_running(i), "node{i} is down after the nemesis");
        sees(&c, i, &all, s.settle_deadline);
    }
    let settled = wait_until(s.settle_deadline, || {
        (0..NODES).all(|i| {
            c.local_stats(i)
                .is_some_and(|st| st.settled && !st.rebalancing && st.under_replicated == 0)
        })
    });
    let settle = settle_started.elapsed();
    let converge_started = Instant::now();
    let mut finals = BTreeMap::new();
    let until = converge_started + s.converge_deadline;
    let converged = wait_until(s.converge_deadline, || {
        finals = final_states(&c, s, until);
        finals.values().all(KeyState::converged)
    });
    let converge = converge_started.elapsed();
    let history = recorder.into_history();
    let report = history::check(&history, &finals, s.stale_bound);
    let run = Run {
        scenario: s.clone(),
        history,
        report,
        settled,
        converged,
        nemesis,
        load: load_time,
        settle,
        converge,
        wall: started.elapsed(),
    };
    eprintln!("fault-checker {}", run.summary());
    let stale = run.report.explain(&[AnomalyKind::StaleRead], &[], 5);
    if !stale.is_empty() {
        eprintln!("fault-checker stale reads (reported, not failed on):\n{stale}");
    }
    run
}

/// Every key's state on every node, read from each node alone, with its owners under the
/// membership node0 sees now. A read that fails is retried until `until` (once at least).
fn final_states(c: &TestCluster, s: &Scenario, until: Instant) -> BTreeMap<String, KeyState> {
    let auth = format!("Bearer {}", TestCluster::admin_token());
    let m: Membership = {
        let r = c
            .node(0)
            .client()
            .send("GET", "/v1/cluster", &[("authorization", &auth)], None);
        serde_json::from_slice(&r.body).expect("node0's membership")
    };
    let replicas = m
        .buckets
        .iter()
        .find(|b| b.bucket == BUCKET)
        .map_or(REPLICAS, |b| b.replicas as usize);
    let http = Http::new(Duration::from_secs(5));
    let node_auth = format!("Bearer {}", TestCluster::node_token());
    let headers = [
        ("authorization", node_auth.as_str()),
        (FORWARDED_HEADER, "fault-checker"),
    ];
    let index = |name: &str| -> usize {
        name.strip_prefix("node")
            .and_then(|i| i.parse().ok())
            .unwrap_or_else(|| panic!("unexpected member {name}"))
    };
    (0..s.keys)
        .map(|k| {
            let key = key_name(k);
            let own: Vec<usize> = owners(BUCKET, &key, &m.members, replicas)
                .into_iter()
                .map(|o| index(&m.members[o].name))
                .collect();
            let read = |i: usize| -> Held {
                let url = format!("{}/{BUCKET}/{key}", c.node(i).url);
                let mut held = Held::Unreadable("not read".into());
                // A node just back may answer 503 for a moment: retry, within the deadline.
                wait_until(until.saturating_duration_since(Instant::now()), || {
                    held = match http.send(&url, "GET", &headers, None) {
                        Ok((200, body)) => Held::Value(String::from_utf8_lossy(&body).into()),
                        Ok((404, body)) if no_such_key(&body) => Held::Absent,
                        Ok((status, body)) => Held::Unreadable(status_reason(status, &body)),
                        Err(Transport::Refused(e)) | Err(Transport::Unknown(e)) => {
                            Held::Unreadable(e)
                        }
                    };
                    !matches!(held, Held::Unreadable(_))
                });
                held
            };
            let state = KeyState {
                replicas: replicas.min(m.members.len()),
                owners: own.iter().map(|&i| (format!("node{i}"), read(i))).collect(),
                others: (0..NODES)
                    .filter(|i| !own.contains(i))
                    .map(|i| (format!("node{i}"), read(i)))
                    .collect(),
            };
            (key, state)
        })
        .collect()
}
