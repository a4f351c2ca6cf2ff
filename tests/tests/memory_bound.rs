//! Writing three times the DRAM capacity: evictions happen, RSS stays bounded, and every read
//! returns the right bytes or NoSuchKey.

use yutu_tests::{pattern, Server};

/// Capacity of the node under test.
const CAPACITY: u64 = 64 << 20;
/// What the process may hold beyond its DRAM capacity: the binary and its libraries,
/// glommio's rings and I/O buffers, hyper's connection buffers and the request bodies in
/// flight. docs/architecture.md states the same figure.
const OVERHEAD: u64 = 64 << 20;

#[test]
fn writing_3x_capacity_evicts_and_stays_bounded() {
    // DRAM only: with an NVMe tier the evicted objects would be demoted, not gone.
    let server = Server::start(&["--memory", "64MiB", "--shards", "2", "--nvme-capacity", "0"]);
    let c = server.client();
    c.mb("fill");
    let size = 1 << 20;
    let count = 3 * CAPACITY as usize / size;
    // Sample RSS all along, not only at the end: transient buffers count too.
    let pid = server.pid();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut max = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                max = max.max(yutu_tests::server::rss_of(pid));
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            max
        })
    };
    let workers = 4;
    let handles: Vec<_> = (0..workers)
        .map(|w| {
            let c = c.clone();
            std::thread::spawn(move || {
                for i in (w..count).step_by(workers) {
                    let r = c.put(&format!("/fill/obj-{i:04}"), &pattern(size, i as u64));
                    assert_eq!(r.status, 200, "obj-{i}: {}", r.text());
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("writer");
    }

    assert!(server.metric_sum("yutu_evictions_total") > 0.0);
    let used = server.metric_sum("yutu_dram_used_bytes");
    assert!(used <= CAPACITY as f64, "used {used} > capacity {CAPACITY}");

    let (mut hits, mut misses) = (0, 0);
    for i in 0..count {
        let r = c.get(&format!("/fill/obj-{i:04}"));
        match r.status {
            200 => {
                assert!(r.body == pattern(size, i as u64), "obj-{i}: wrong bytes");
                hits += 1;
            }
            404 => {
                assert_eq!(r.code().as_deref(), Some("NoSuchKey"));
                misses += 1;
            }
            s => panic!("obj-{i}: unexpected status {s}"),
        }
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let max_rss = sampler.join().expect("sampler").max(server.rss_bytes());
    assert!(
        misses >= count / 2,
        "most objects were evicted ({hits} hits, {misses} misses)"
    );
    assert!(hits > 0, "recent objects are still there");
    // The most recent writes survive LRU.
    assert_eq!(c.get(&format!("/fill/obj-{:04}", count - 1)).status, 200);
    assert!(
        max_rss <= CAPACITY + OVERHEAD,
        "RSS {} MiB exceeds capacity {} MiB + overhead {} MiB",
        max_rss >> 20,
        CAPACITY >> 20,
        OVERHEAD >> 20
    );
    eprintln!(
        "max RSS {} MiB for {} MiB of DRAM capacity",
        max_rss >> 20,
        CAPACITY >> 20
    );
}

/// `--prefault`: the node holds all of its DRAM soon after start without a single write,
/// serves meanwhile, and stays within the same bound; a node without it holds little. A
/// `--memory` larger than the machine has available is refused at start with a clear error,
/// not left to the OOM killer.
#[test]
fn a_prefaulting_node_holds_its_memory_from_the_start() {
    let args = ["--memory", "64MiB", "--shards", "2", "--nvme-capacity", "0"];
    let lazy = Server::start(&args);
    let server = Server::start(&[&args[..], &["--prefault"]].concat());
    let c = server.client();
    c.mb("prefault");
    let r = c.put("/prefault/k", &pattern(1 << 20, 7));
    assert_eq!(r.status, 200, "{}", r.text());
    // The arena is a memfd: its resident pages are the process's shared-memory RSS.
    let full = yutu_tests::server::wait_until(std::time::Duration::from_secs(30), || {
        rss_shmem(server.pid()) >= CAPACITY
    });
    assert!(
        full,
        "RssShmem {} after prefaulting",
        rss_shmem(server.pid())
    );
    assert!(server.rss_bytes() <= CAPACITY + OVERHEAD);
    assert!(c.get("/prefault/k").body == pattern(1 << 20, 7));
    assert!(
        server.log().contains("DRAM arena prefaulted"),
        "{}",
        server.log()
    );
    let untouched = rss_shmem(lazy.pid());
    assert!(
        untouched < CAPACITY / 4,
        "RssShmem {untouched} without --prefault"
    );

    let dir = tempfile::tempdir().expect("temp dir");
    let out = std::process::Command::new(yutu_tests::server::bin_path("yutu-server"))
        .args(["--no-auth", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .args(["--memory", "64TiB", "--nvme-capacity", "0", "--prefault"])
        .output()
        .expect("run yutu-server");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started: {err}");
    assert!(
        err.contains("--prefault") && err.contains("available"),
        "{err}"
    );
}

/// The shared-memory part of process `pid`'s resident set (`RssShmem`), in bytes.
fn rss_shmem(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("RssShmem:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024
}
