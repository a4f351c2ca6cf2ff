//! Node-level durability defects found by a fault run, each pinned by a test through the real
//! binary: the order of two racing durable writes of one key, and the durable budget (what
//! the NVMe tier can keep) across a SIGKILL.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use yutu_tests::{pattern, Client, Server};

const MIB: usize = 1 << 20;

/// A value that names its writer and round in its first bytes, so a GET says which PUT it
/// came from; the length varies so that a mix of two versions would show as well.
fn value(round: u32, writer: u32) -> Vec<u8> {
    let len = 64 * 1024 + (round as usize * 131 + writer as usize * 977) % 8192;
    let mut v = pattern(len, u64::from(round) << 8 | u64::from(writer));
    v[..4].copy_from_slice(&round.to_le_bytes());
    v[4..8].copy_from_slice(&writer.to_le_bytes());
    v
}

/// The `(round, writer)` a value names.
fn origin(body: &[u8]) -> Option<(u32, u32)> {
    let round = u32::from_le_bytes(body.get(..4)?.try_into().ok()?);
    let writer = u32::from_le_bytes(body.get(4..8)?.try_into().ok()?);
    Some((round, writer))
}

/// Two durable PUTs of one key race each round; each writer, once its PUT is acknowledged,
/// reads the key. Every PUT of earlier rounds completed before either PUT of this round
/// started (the barrier), so the read must return this round's value of one writer or the
/// other: an earlier round's value is an acknowledged write lost behind an older one. The
/// fault run saw that in more than half the rounds of a `disk` bucket (never in a `memory`
/// one): the NVMe index and the DRAM copy were updated in two orders.
#[test]
fn racing_durable_puts_of_one_key_are_applied_in_one_order() {
    let server = Server::start(&[
        "--memory",
        "64MiB",
        "--shards",
        "1",
        "--nvme-capacity",
        "64MiB",
    ]);
    let c = server.client();
    let r = c.send("PUT", "/order", &[("x-yutu-durability", "disk")], Some(b""));
    assert_eq!(r.status, 200, "{}", r.text());
    const ROUNDS: u32 = 200;
    let deadline = Instant::now() + Duration::from_secs(120);
    let barrier = Arc::new(Barrier::new(2));
    let writers: Vec<_> = (0..2u32)
        .map(|w| {
            let c = c.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || -> Vec<String> {
                let mut stale = Vec::new();
                for round in 0..ROUNDS {
                    barrier.wait();
                    // Both writers stop at the same round (they read the same clock after
                    // the same barrier, within moments; the barrier keeps them in step).
                    if Instant::now() > deadline {
                        break;
                    }
                    let r = c.put("/order/hot", &value(round, w));
                    assert_eq!(r.status, 200, "round {round}: {}", r.text());
                    let got = c.get("/order/hot");
                    assert_eq!(got.status, 200, "round {round}: {}", got.text());
                    match origin(&got.body) {
                        Some((r, v)) if r == round && got.body == value(r, v) => {}
                        Some((r, v)) if r < round && got.body == value(r, v) => {
                            stale.push(format!(
                                "round {round}: writer {w} read round {r}'s value of writer {v}"
                            ))
                        }
                        _ => stale.push(format!(
                            "round {round}: writer {w} read {} bytes of no PUT",
                            got.body.len()
                        )),
                    }
                    barrier.wait();
                }
                stale
            })
        })
        .collect();
    let stale: Vec<String> = writers
        .into_iter()
        .flat_map(|w| w.join().expect("writer"))
        .collect();
    assert!(
        stale.is_empty(),
        "{} reads after an acknowledged PUT returned an older version, e.g. {:?}",
        stale.len(),
        &stale[..stale.len().min(5)]
    );
}

/// PUTs a 1 MiB object under each key of `keys` in `bucket`: the keys acknowledged and the
/// keys refused with 507 InsufficientStorage (nothing else is expected). Every key is tried,
/// so every shard fills up, not only the first to be full.
fn put_each(c: &Client, bucket: &str, keys: std::ops::Range<u64>) -> (Vec<u64>, Vec<u64>) {
    let (mut acknowledged, mut refused) = (Vec::new(), Vec::new());
    for i in keys {
        let r = c.put(&format!("/{bucket}/o{i:03}"), &pattern(MIB, i));
        match r.status {
            200 => acknowledged.push(i),
            507 => {
                assert_eq!(
                    r.code().as_deref(),
                    Some("InsufficientStorage"),
                    "{}",
                    r.text()
                );
                refused.push(i);
            }
            s => panic!("o{i:03}: unexpected {s}: {}", r.text()),
        }
    }
    (acknowledged, refused)
}

fn read_back(c: &Client, bucket: &str, keys: &[u64], when: &str) {
    for i in keys {
        let r = c.get(&format!("/{bucket}/o{i:03}"));
        assert_eq!(r.status, 200, "{when}: acknowledged o{i:03} is gone");
        assert!(
            r.body == pattern(MIB, *i),
            "{when}: o{i:03} has wrong bytes"
        );
    }
}

/// The durable budget holds across a SIGKILL, with regions that 1 MiB objects do not fill
/// (two shards of 32 MiB: 4 MiB regions, three objects each). The fault run acknowledged
/// all 100 MiB of PUTs into a 64 MiB tier and lost more than half of them at the restart:
/// the budget counted bytes, the regions held fewer, and reclamation dropped acknowledged
/// objects to make room. Now a PUT the tier could not keep is refused (507) before it is
/// acknowledged; a restarted node counts the durable objects it recovers, so it refuses
/// further PUTs too; nothing acknowledged is ever dropped; and a delete makes room again.
#[test]
fn durable_overflow_is_refused_before_the_ack_and_across_a_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let args = [
        "--memory",
        "128MiB",
        "--shards",
        "2",
        "--nvme-capacity",
        "64MiB",
    ];
    let server = Server::start_on(dir.path(), &args);
    let c = server.client();
    let r = c.send("PUT", "/full", &[("x-yutu-durability", "disk")], Some(b""));
    assert_eq!(r.status, 200, "{}", r.text());
    let (acknowledged, refused) = put_each(&c, "full", 0..100);
    assert!(
        !refused.is_empty(),
        "100 MiB of durable PUTs were all acknowledged by a 64 MiB NVMe tier"
    );
    assert!(
        acknowledged.len() >= 16,
        "only {} MiB of a 64 MiB tier were taken",
        acknowledged.len()
    );
    read_back(&c, "full", &acknowledged, "before the kill");
    assert_eq!(server.metric_sum("yutu_durable_dropped_total"), 0.0);
    server.kill();

    let server = Server::start_on(dir.path(), &args);
    let c = server.client();
    read_back(&c, "full", &acknowledged, "after SIGKILL");
    // The recovered objects count: the tier is as full as before the kill.
    let (late, _) = put_each(&c, "full", 100..110);
    assert!(
        late.is_empty(),
        "{late:?} acknowledged after the restart: the recovered durable objects were not counted"
    );
    let (again, _) = put_each(&c, "full", refused[0]..refused[0] + 1);
    assert!(again.is_empty(), "o{:03} refused, then taken", refused[0]);
    read_back(&c, "full", &acknowledged, "after refused PUTs");
    // Deleting frees room for new PUTs; the budget, not reclamation, refuses again.
    let freed = acknowledged.len() / 2;
    for i in &acknowledged[..freed] {
        assert_eq!(c.delete(&format!("/full/o{i:03}")).status, 204);
    }
    let (more, refused) = put_each(&c, "full", 200..300);
    assert!(!refused.is_empty(), "the tier never filled up again");
    // The same number of equal objects fits again (give or take one per shard).
    assert!(
        more.len() + 2 >= freed,
        "{freed} MiB deleted, only {} MiB written again",
        more.len()
    );
    read_back(&c, "full", &acknowledged[freed..], "after refilling");
    read_back(&c, "full", &more, "after refilling");
    assert_eq!(server.metric_sum("yutu_durable_dropped_total"), 0.0);
    server.kill();

    // And all of it survives another SIGKILL.
    let server = Server::start_on(dir.path(), &args);
    let c = server.client();
    read_back(
        &c,
        "full",
        &acknowledged[freed..],
        "after the second SIGKILL",
    );
    read_back(&c, "full", &more, "after the second SIGKILL");
    for i in &acknowledged[..freed] {
        assert_eq!(
            c.get(&format!("/full/o{i:03}")).status,
            404,
            "o{i:03} came back"
        );
    }
}

/// Durable objects written once and then left alone while other durable keys are
/// overwritten: the log wraps around, and the oldest regions, still full of live durable
/// records, are reclaimed. Every acknowledged object must survive it. (`yutu-blockstore` used to
/// keep room for the record that triggered the reclamation and drop the live entries that
/// did not fit then: 4 of 12 objects here, with 16 MiB of live durable data in 64 MiB.)
#[test]
fn durable_objects_survive_reclamation_of_full_regions() {
    let dir = tempfile::tempdir().expect("temp dir");
    let args = [
        "--memory",
        "128MiB",
        "--shards",
        "2",
        "--nvme-capacity",
        "64MiB",
    ];
    let server = Server::start_on(dir.path(), &args);
    let c = server.client();
    let r = c.send("PUT", "/churn", &[("x-yutu-durability", "disk")], Some(b""));
    assert_eq!(r.status, 200, "{}", r.text());
    let (kept, refused) = put_each(&c, "churn", 0..12);
    assert!(refused.is_empty(), "12 MiB refused by a 64 MiB tier");
    // Overwrite a few other keys again and again: their old versions die, the log wraps.
    for round in 0..20u64 {
        for k in 100..104u64 {
            let r = c.put(&format!("/churn/o{k:03}"), &pattern(MIB, k + round));
            assert_eq!(r.status, 200, "{}", r.text());
        }
    }
    assert!(server.metric_sum("yutu_nvme_reclaimed_regions_total") > 0.0);
    read_back(&c, "churn", &kept, "after the log wrapped");
    assert_eq!(
        server.metric_sum("yutu_durable_dropped_total"),
        0.0,
        "{}",
        server.log()
    );
    server.kill();
    let server = Server::start_on(dir.path(), &args);
    read_back(&server.client(), "churn", &kept, "after SIGKILL");
}
