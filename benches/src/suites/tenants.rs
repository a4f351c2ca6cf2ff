//! The `tenants` suite: what one hostile tenant costs the others. Two well-behaved clients of
//! user alice move 16 KiB blocks with `batch_put_from` and `batch_get_into` (one through the
//! same-host mapping, one through the node's engine over tcp) while user bob, on his own
//! connection, loops over everything the control plane lets a tenant try: one key named
//! [`MAX_BATCH`] times in a lease, put-starts never ended, engine registrations at addresses
//! that are not his, and calls on a session that is not his.
//!
//! Measured time alternates between phases without and with the attacker (`--rounds` of
//! each), so drift hits both alike. The row `good_clients_under_attack` is the good clients'
//! blocks per second under attack; its reference is the same clients unloaded, measured in the
//! same run; the target is a ratio of 0.5 (issue #11: a tenant cannot take more than half of
//! what the others get). Every byte of the first batch of every phase is read back and
//! compared; a wrong byte or a failed good call fails the run.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _};
use clap::Args;
use serde_json::json;
use yutu_api::kv::MAX_BATCH;
use yutu_client::kv::{KvClient, KvOptions};
use yutu_client::Credentials;

use super::kv::{pattern, Http, Server};
use crate::report::{BenchResult, Machine, Reference, Report};

const BLOCK: usize = 16 << 10;
const BUCKET: &str = "alice";

const USERS: &str = r#"
[[users]]
name = "alice"
access_key = "ALICEBENCH"
secret_key = "alice-bench-secret"

[[users]]
name = "bob"
access_key = "BOBBENCH"
secret_key = "bob-bench-secret"
"#;

/// Options of `yutu-bench tenants`.
#[derive(Debug, Clone, Args)]
pub struct TenantsArgs {
    /// Seconds of each phase (one phase without the attacker, one with it, per round).
    #[arg(long, default_value_t = 2)]
    pub duration_secs: u64,
    /// Rounds; each is a phase without and a phase with the attacker.
    #[arg(long, default_value_t = 4)]
    pub rounds: usize,
    /// 16 KiB blocks per good call.
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Attacker threads, each on its own connection.
    #[arg(long, default_value_t = 1)]
    pub attackers: usize,
    /// DRAM given to yutu-server (`--memory`).
    #[arg(long, default_value = "256MiB")]
    pub yutu_memory: String,
}

pub async fn run(args: &TenantsArgs) -> anyhow::Result<Report> {
    tokio::task::block_in_place(|| run_blocking(args))
}

/// Where the measurement stands: the phase number (even: unloaded, odd: under attack) and
/// `phases` when it is over.
struct Schedule {
    phase: AtomicUsize,
    phases: usize,
    /// Blocks moved by calls that began and ended in the same phase, per phase.
    blocks: Vec<AtomicU64>,
    /// Set by a good client that failed, so the others stop early.
    failed: AtomicBool,
}

impl Schedule {
    fn over(&self) -> bool {
        self.phase.load(Ordering::Acquire) >= self.phases || self.failed.load(Ordering::Relaxed)
    }
}

fn run_blocking(args: &TenantsArgs) -> anyhow::Result<Report> {
    ensure!(
        args.duration_secs > 0 && args.rounds > 0 && args.batch > 0 && args.attackers > 0,
        "every count and duration of the tenants suite must be at least 1"
    );
    ensure!(args.batch <= MAX_BATCH, "--batch is at most {MAX_BATCH}");
    let bin = crate::yutu::locate_binary()?;
    eprintln!("under test: {}", bin.display());
    let mut server = Server::start_with(
        &bin,
        Some(USERS),
        &["--memory", &args.yutu_memory, "--shards", "2"],
    )?;
    let alice = Credentials::new("ALICEBENCH", "alice-bench-secret");
    let bob = Credentials::new("BOBBENCH", "bob-bench-secret");
    let mut http = Http::connect(server.addr)?;
    for (who, path) in [(&alice, "/alice"), (&bob, "/bob")] {
        let (status, body) = http.send_as(Some(who), "PUT", path, b"")?;
        ensure!(
            status == 200,
            "creating {path}: {status} {}",
            String::from_utf8_lossy(&body)
        );
    }
    let (status, _) = http.send_as(Some(&bob), "PUT", "/bob/mine", &pattern(BLOCK, 1))?;
    ensure!(status == 200, "storing bob's block: {status}");

    let url = format!("http://{}", server.addr);
    let good: Vec<Good> = [true, false]
        .into_iter()
        .enumerate()
        .map(|(i, shm)| Good::connect(&url, &alice, shm, i as u64, args.batch))
        .collect::<anyhow::Result<_>>()?;
    let schedule = Schedule {
        phase: AtomicUsize::new(0),
        phases: 2 * args.rounds,
        blocks: (0..2 * args.rounds).map(|_| AtomicU64::new(0)).collect(),
        failed: AtomicBool::new(false),
    };
    let refused = AtomicU64::new(0);
    let phase_time = Duration::from_secs(args.duration_secs);
    eprintln!(
        "tenants: {} rounds of {}s unloaded + {}s under attack...",
        args.rounds, args.duration_secs, args.duration_secs
    );
    let outcome: anyhow::Result<()> = std::thread::scope(|scope| {
        let clients: Vec<_> = good
            .iter()
            .map(|g| scope.spawn(|| g.run(&schedule)))
            .collect();
        let attackers: Vec<_> = (0..args.attackers)
            .map(|_| scope.spawn(|| attack(server.addr, &bob, &schedule, &refused)))
            .collect();
        let start = Instant::now();
        for phase in 1..=schedule.phases {
            // The bench's clock, not synchronisation: each phase lasts its time.
            let until = start + phase_time * phase as u32;
            while !schedule.failed.load(Ordering::Relaxed) {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                std::thread::sleep(left.min(Duration::from_millis(50)));
            }
            schedule.phase.store(phase, Ordering::Release);
        }
        for c in clients {
            c.join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("a good client panicked")))?;
        }
        for a in attackers {
            a.join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("the attacker panicked")))?;
        }
        Ok(())
    });
    outcome?;
    server.check_running()?;
    let refused = refused.load(Ordering::Relaxed);
    ensure!(
        refused > 0,
        "the attacker was never refused: the run proves nothing"
    );

    let rate = |odd: usize| {
        let blocks: u64 = (0..args.rounds)
            .map(|r| schedule.blocks[2 * r + odd].load(Ordering::Relaxed))
            .sum();
        blocks as f64 / (phase_time.as_secs_f64() * args.rounds as f64)
    };
    let (unloaded, loaded) = (rate(0), rate(1));
    eprintln!("attacker refused {refused} times");
    let mb = |rate: f64| Some(rate * BLOCK as f64 / 1e6);
    Ok(Report {
        suite: "tenants".to_owned(),
        notes: Default::default(),
        skipped: None,
        machine: Machine::detect(),
        results: vec![BenchResult {
            name: "good_clients_under_attack".to_owned(),
            value: Some(loaded),
            unit: "blocks/s".to_owned(),
            p50_us: None,
            p99_us: None,
            mb_per_s: mb(loaded),
            errors: Some(0),
            reference: Some(Reference {
                name: "good_clients_unloaded".to_owned(),
                value: unloaded,
                p50_us: None,
                p99_us: None,
                mb_per_s: mb(unloaded),
                errors: Some(0),
            }),
            ratio: None,
            target: Some(0.5),
        }
        .with_ratio()],
    })
}

/// One of alice's clients: its own engine, session and buffer (put sources, then get targets).
struct Good {
    kv: KvClient,
    buf: yutu_client::kv::Buffer,
    tag: u64,
    batch: usize,
}

impl Good {
    fn connect(
        url: &str,
        who: &Credentials,
        shm: bool,
        tag: u64,
        batch: usize,
    ) -> anyhow::Result<Good> {
        let kv = KvClient::new(
            url,
            KvOptions {
                shm,
                credentials: Some(who.clone()),
                ..KvOptions::default()
            },
        )?;
        let buf = kv.register((2 * batch * BLOCK) as u64)?;
        for i in 0..2 * batch {
            buf.write_at(
                (i * BLOCK) as u64,
                &pattern(BLOCK, tag * 1_000_000 + i as u64),
            )?;
        }
        Ok(Good {
            kv,
            buf,
            tag,
            batch,
        })
    }

    fn run(&self, schedule: &Schedule) -> anyhow::Result<()> {
        let r = self.run_phases(schedule);
        if r.is_err() {
            schedule.failed.store(true, Ordering::Relaxed);
        }
        r
    }

    /// put-from then get-into of a batch, over and over; blocks counted in the phase the call
    /// pair began and ended in. The first batch of each phase is read back and compared.
    fn run_phases(&self, schedule: &Schedule) -> anyhow::Result<()> {
        let offsets: Vec<u64> = (0..self.batch).map(|i| (i * BLOCK) as u64).collect();
        let back: Vec<u64> = offsets
            .iter()
            .map(|o| o + (self.batch * BLOCK) as u64)
            .collect();
        let lens = vec![BLOCK as u64; self.batch];
        let mut checked = usize::MAX;
        let mut call = 0u64;
        while !schedule.over() {
            let phase = schedule.phase.load(Ordering::Acquire);
            call += 1;
            let keys: Vec<String> = (0..self.batch)
                .map(|i| format!("{}-{}-{i}", self.tag, call % 64))
                .collect();
            self.kv
                .batch_put_from(BUCKET, &keys, &self.buf, &offsets, &lens)
                .with_context(|| format!("client {}: put-from", self.tag))?;
            let copied = self
                .kv
                .batch_get_into(BUCKET, &keys, &self.buf, &back)
                .with_context(|| format!("client {}: get-into", self.tag))?;
            if copied.iter().any(|c| *c != Some(BLOCK as u64)) {
                bail!("client {}: get-into answered {copied:?}", self.tag);
            }
            if checked != phase {
                checked = phase;
                let mut got = vec![0u8; BLOCK];
                for (i, off) in back.iter().enumerate() {
                    self.buf.read_at(*off, &mut got)?;
                    ensure!(
                        got == pattern(BLOCK, self.tag * 1_000_000 + i as u64),
                        "client {}: block {i} came back with wrong bytes",
                        self.tag
                    );
                }
            }
            if schedule.phase.load(Ordering::Acquire) == phase && phase < schedule.phases {
                schedule.blocks[phase].fetch_add(2 * self.batch as u64, Ordering::Relaxed);
            }
        }
        Ok(())
    }
}

/// Bob, in the phases under attack: the hostile calls in a loop on one connection.
fn attack(
    addr: std::net::SocketAddr,
    bob: &Credentials,
    schedule: &Schedule,
    refused: &AtomicU64,
) -> anyhow::Result<()> {
    let mut http = Http::connect(addr)?;
    let mut i = 0u64;
    while !schedule.over() {
        if schedule.phase.load(Ordering::Acquire) % 2 == 0 {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        i += 1;
        let calls = [
            (
                "/v1/kv/bob/get".to_owned(),
                json!({"keys": vec!["mine"; MAX_BATCH], "ttl_ms": 60_000}),
            ),
            (
                "/v1/kv/bob/put-start".to_owned(),
                json!({"blocks": [{"key": format!("r{i}"), "len": 1 << 20}], "ttl_ms": 60_000}),
            ),
            (
                yutu_api::kv::PEERS_PATH.to_owned(),
                json!({"client": {"node": format!("{:016x}", 0xbad0 + i), "incarnation": "0000000000000001",
                    "host": "h", "tcp": "127.0.0.1:9"}, "secret": "00".repeat(32)}),
            ),
            (
                format!("/v1/kv/{BUCKET}/get-into"),
                json!({"keys": ["x"], "targets": [], "session": format!("{i:032x}")}),
            ),
        ];
        for (path, body) in calls {
            let (status, _) =
                http.send_as(Some(bob), "POST", &path, body.to_string().as_bytes())?;
            if status != 200 {
                refused.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    Ok(())
}
