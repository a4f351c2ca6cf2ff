//! Fault injection with a history checker (see `yutu_tests::faults` and
//! `yutu_tests::history`): three nodes, a bucket with two replicas, four clients racing PUTs,
//! GETs and DELETEs over twenty keys through random nodes, while a nemesis kills, restarts,
//! freezes nodes or stops etcd. After the cluster settles, no acknowledged write may be
//! lost, no acknowledged delete undone, and every owner of a key must hold the same state.
//!
//! Each scenario prints one summary line (`fault-checker {...}`) to stderr; a failure lists the
//! anomalies with the operations that show them. `YUTU_FAULT_SEED` replays another seed.

use yutu_tests::faults::{run, Durability, Fault, Scenario};

/// No fault: racing PUTs and DELETEs of the same keys through different coordinators must
/// leave both owners of every key with the same, last acknowledged state.
#[test]
fn concurrent_overwrites_and_deletes_memory() {
    let s =
        Scenario::new("concurrent_overwrites_and_deletes_memory", 1, &[]).ops_after_faults(1600);
    run(&s).assert_clean();
}

/// The same races with writes going through to the NVMe tier before they are acknowledged.
#[test]
fn concurrent_overwrites_and_deletes_disk() {
    let s = Scenario::new("concurrent_overwrites_and_deletes_disk", 2, &[])
        .durability(Durability::Disk)
        .ops_after_faults(1600);
    run(&s).assert_clean();
}

/// Five times, a random node is SIGKILLed and restarted at once on its data and ports, back
/// before its 3 s lease expires: the others may never see it leave, so nothing rebalances,
/// and what it missed while down (or acknowledged and had not yet copied) must be repaired.
/// Disk durability, so that the node comes back with what it held.
#[test]
fn sigkill_and_restart_inside_the_lease() {
    let s = Scenario::new(
        "sigkill_and_restart_inside_the_lease",
        3,
        &[Fault::KillRestartInsideTheLease; 5],
    )
    .durability(Durability::Disk);
    run(&s).assert_clean();
}

/// Three times, a random node is SIGKILLed, dropped by the others when its lease expires
/// (they own its keys meanwhile), then restarted on its data and ports: it comes back with
/// copies older than what the others acknowledged since.
#[test]
fn sigkill_and_restart_after_the_lease() {
    let s = Scenario::new(
        "sigkill_and_restart_after_the_lease",
        4,
        &[Fault::KillRestartAfterTheLease; 3],
    )
    .durability(Durability::Disk);
    run(&s).assert_clean();
}

/// Three times, a random node is frozen (SIGSTOP) until the others drop it, then thawed: it
/// wakes up believing it is still a member, with requests in flight and stale copies.
#[test]
fn sigstop_longer_than_the_lease() {
    let s = Scenario::new(
        "sigstop_longer_than_the_lease",
        5,
        &[Fault::PauseLongerThanTheLease; 3],
    );
    run(&s).assert_clean();
}

/// etcd stopped (SIGSTOP: its connections hang) and then killed, each until every node sees
/// the outage (longer than a lease), then resumed or restarted on its data: the nodes carry
/// on with the membership they last read.
#[test]
fn etcd_stopped_and_restarted() {
    let s = Scenario::new(
        "etcd_stopped_and_restarted",
        6,
        &[Fault::EtcdFrozen, Fault::EtcdStoppedAndRestarted],
    );
    run(&s).assert_clean();
}
