//! The NVMe tier through the real binary: spilling past DRAM, durability across SIGKILL, and
//! objects in both tiers seen by HEAD, GET, LIST and DELETE.

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use yutu_tests::server::{rss_of, wait_until};
use yutu_tests::{pattern, xml, Server};

/// DRAM 64 MiB, NVMe 1 GiB, 800 MiB written: the early objects come back from NVMe.
#[test]
fn spills_800mib_to_nvme_and_reads_it_back() {
    let server = Server::start(&[
        "--memory",
        "64MiB",
        "--shards",
        "2",
        "--nvme-capacity",
        "1GiB",
    ]);
    let c = server.client();
    c.mb("spill");
    let size = 1 << 20;
    let count = 800;
    let pid = server.pid();
    let mut max_rss = 0;
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let c = c.clone();
            std::thread::spawn(move || {
                for i in (w..count).step_by(4) {
                    let r = c.put(&format!("/spill/o{i:04}"), &pattern(size, i as u64));
                    assert_eq!(r.status, 200, "o{i}: {}", r.text());
                }
            })
        })
        .collect();
    while writers.iter().any(|w| !w.is_finished()) {
        max_rss = max_rss.max(rss_of(pid));
        std::thread::sleep(Duration::from_millis(20));
    }
    for w in writers {
        w.join().expect("writer");
    }
    // Demotions drain in the background; wait until nothing is in flight.
    assert!(wait_until(Duration::from_secs(60), || server
        .metric_sum("yutu_demotions_total")
        + server.metric_sum("yutu_demotions_dropped_total")
        + server.metric_sum("yutu_objects")
        >= count as f64 - 1.0));
    assert!(
        server.metric_sum("yutu_demotions_total") > 500.0,
        "most evicted objects went to NVMe"
    );
    let mut from_nvme = 0;
    for i in (0..count).step_by(7) {
        let before = server.metric_sum("yutu_tier_hits_total{tier=\"nvme\"");
        let r = c.get(&format!("/spill/o{i:04}"));
        assert_eq!(r.status, 200, "o{i}: {}", r.text());
        assert!(r.body == pattern(size, i as u64), "o{i}: wrong bytes");
        if server.metric_sum("yutu_tier_hits_total{tier=\"nvme\"") > before {
            from_nvme += 1;
        }
        max_rss = max_rss.max(rss_of(pid));
    }
    assert!(
        from_nvme > 50,
        "early objects are read from NVMe ({from_nvme})"
    );
    // HEAD and LIST see both tiers.
    let h = c.head("/spill/o0000");
    assert_eq!(h.status, 200);
    assert_eq!(h.header("content-length"), Some("1048576"));
    let mut listed = 0;
    let mut token: Option<String> = None;
    loop {
        let q = match &token {
            Some(t) => format!("/spill?list-type=2&continuation-token={t}"),
            None => "/spill?list-type=2".into(),
        };
        let doc = c.get(&q).text();
        listed += xml::values(&doc, "Key").len();
        match xml::values(&doc, "NextContinuationToken").pop() {
            Some(t) => token = Some(t),
            None => break,
        }
    }
    assert_eq!(
        listed, count,
        "every object is listed once, whichever tier holds it"
    );
    // DELETE removes from both tiers.
    assert_eq!(c.delete("/spill/o0001").status, 204);
    assert_eq!(c.get("/spill/o0001").status, 404);
    eprintln!(
        "max RSS {} MiB with 64 MiB DRAM and a 1 GiB NVMe tier",
        max_rss >> 20
    );
    assert!(max_rss < 256 << 20, "RSS {} MiB", max_rss >> 20);
}

/// Durable (`disk`) objects survive SIGKILL at random moments: every acknowledged PUT reads
/// back byte-identical after the restart, and no GET ever returns wrong bytes.
#[test]
fn disk_durability_survives_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--memory",
        "64MiB",
        "--shards",
        "2",
        "--nvme-capacity",
        "256MiB",
    ];
    let mut acked: Vec<(String, u64, usize)> = Vec::new();
    let mut seed = 0u64;
    for round in 0..4 {
        let server = Server::start_on(dir.path(), &args);
        let c = server.client();
        if round == 0 {
            let r = c.send(
                "PUT",
                "/durable",
                &[("x-yutu-durability", "disk")],
                Some(b""),
            );
            assert_eq!(r.status, 200, "{}", r.text());
        }
        // Everything acknowledged so far is there, byte for byte.
        for (key, s, len) in &acked {
            let r = c.get(&format!("/durable/{key}"));
            assert_eq!(r.status, 200, "round {round}: {key} lost after SIGKILL");
            assert!(
                r.body == pattern(*len, *s),
                "round {round}: {key} has wrong bytes"
            );
        }
        // Write in a background thread and kill the server while it writes.
        let url = server.url.clone();
        let writer = std::thread::spawn(move || {
            let c = yutu_tests::Client::new(&url);
            let mut done = Vec::new();
            for i in 0..10_000u64 {
                let s = seed + i;
                let len = 1000 + (s as usize * 7919) % 300_000;
                let key = format!("r{round}-{i}");
                match c.try_put(&format!("/durable/{key}"), &pattern(len, s)) {
                    Some(200) => done.push((key, s, len)),
                    _ => break,
                }
            }
            done
        });
        // Let some PUTs land, then kill at a moment that depends on the round.
        let target = 20 + round * 17;
        assert!(wait_until(Duration::from_secs(60), || server.metric_sum(
            "yutu_requests_total{shard=\"0\",op=\"PutObject\",status=\"200\"}"
        ) + server
            .metric_sum(
                "yutu_requests_total{shard=\"1\",op=\"PutObject\",status=\"200\"}"
            )
            >= target as f64));
        server.kill();
        let done = writer.join().expect("writer");
        seed += 10_000;
        acked.extend(done);
    }
    assert!(
        acked.len() > 50,
        "enough acknowledged PUTs to mean something ({})",
        acked.len()
    );
    let server = Server::start_on(dir.path(), &args);
    let c = server.client();
    for (key, s, len) in &acked {
        let r = c.get(&format!("/durable/{key}"));
        assert_eq!(r.status, 200, "{key} lost");
        assert!(r.body == pattern(*len, *s), "{key} has wrong bytes");
    }
    // A half-sent PUT is never visible.
    let mut s = TcpStream::connect(server.addr).unwrap();
    s.write_all(b"PUT /durable/half HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nabc")
        .unwrap();
    drop(s);
    assert_eq!(c.get("/durable/half").status, 404);
}
