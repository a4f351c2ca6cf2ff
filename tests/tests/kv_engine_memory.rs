//! Engine memory reached in place: a range the client process already had (here an
//! anonymous mapping, as a numpy array or a torch tensor would be) is registered as it is
//! (`KvClient::register_host`), and blocks scattered over several of its ranges are stored
//! and fetched in one node call each (`batch_put_from_parts` / `batch_get_into_parts`). The
//! node on the same host copies straight into and out of it through the client's memory
//! file: no staging buffer, no tcp. Another user can never make the node reach it.

use serde_json::json;
use yutu_client::kv::{KvClient, KvOptions, Parts, PutOptions};
use yutu_tests::pattern;
use yutu_tests::users::{alice, bob, node_with_users, send_as};

const LEN: usize = 4 << 20;

/// An anonymous mapping of this process: memory the kv client did not allocate.
struct Anon(*mut u8);

impl Anon {
    fn new() -> Anon {
        // SAFETY: a fresh private anonymous mapping, owned by this value.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        Anon(p.cast())
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping is LEN bytes and lives as long as `self`; the test reads it only
        // between node calls.
        unsafe { std::slice::from_raw_parts(self.0, LEN) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, exclusively borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.0, LEN) }
    }
}

impl Drop for Anon {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once (after the buffer registered over it).
        unsafe { libc::munmap(self.0.cast(), LEN) };
    }
}

fn client(server: &yutu_tests::Server, who: yutu_client::Credentials) -> KvClient {
    KvClient::new(
        &server.url,
        KvOptions {
            credentials: Some(who),
            ..KvOptions::default()
        },
    )
    .expect("kv client")
}

#[test]
fn scattered_blocks_move_in_place_between_the_node_and_engine_memory() {
    let server = node_with_users(&["--memory", "64MiB", "--shards", "2"]);
    for (who, bucket) in [(alice(), "/alice"), (bob(), "/bob")] {
        assert_eq!(send_as(&server, &who, "PUT", bucket, b"").status, 200);
    }
    let kv = client(&server, alice());
    let mut mem = Anon::new();
    // SAFETY: `mem` outlives `buf` (declared before it, dropped after it).
    let buf = unsafe { kv.register_host(mem.0, LEN as u64) }.expect("register engine memory");

    // Eight blocks of 3 layers each, layer-first: layer l of block b at l * 1 MiB + b * 32 KiB,
    // each layer span 24 KiB + b bytes (so the blocks differ in length).
    let keys: Vec<String> = (0..8).map(|b| format!("layered-{b}")).collect();
    let parts: Vec<Parts> = (0..8u64)
        .map(|b| {
            (0..3u64)
                .map(|l| (l * (1 << 20) + b * (32 << 10), (24 << 10) + b))
                .collect()
        })
        .collect();
    let mut whole: Vec<Vec<u8>> = Vec::new();
    for (b, p) in parts.iter().enumerate() {
        let mut block = Vec::new();
        for (l, &(off, len)) in p.iter().enumerate() {
            let bytes = pattern(len as usize, (b * 10 + l) as u64);
            mem.bytes_mut()[off as usize..(off + len) as usize].copy_from_slice(&bytes);
            block.extend_from_slice(&bytes);
        }
        whole.push(block);
    }
    let etags = kv
        .batch_put_from_parts("alice", &keys, &buf, &parts, &PutOptions::default())
        .expect("put-from parts");
    assert!(etags.iter().all(|e| !e.is_empty()), "{etags:?}");
    // The node stored each block as the concatenation of its spans: the S3 view agrees.
    for (k, block) in keys.iter().zip(&whole) {
        let got = send_as(&server, &alice(), "GET", &format!("/alice/{k}"), b"");
        assert_eq!(got.status, 200);
        assert!(got.body == *block, "{k} stored wrong bytes");
    }

    // Back into another layout: two spans per block in the buffer's last MiB, the first one
    // 1000 bytes. The node scatters each block over them.
    let back: Vec<Parts> = (0..8u64)
        .map(|b| {
            let at = (3 << 20) + b * (100 << 10);
            vec![(at, 1000), (at + 4096, 90 << 10)]
        })
        .collect();
    let copied = kv
        .batch_get_into_parts("alice", &keys, &buf, &back)
        .expect("get-into parts");
    for (b, c) in copied.iter().enumerate() {
        assert_eq!(*c, Some(whole[b].len() as u64));
        let (a, n) = (back[b][0].0 as usize, whole[b].len());
        assert!(
            mem.bytes()[a..a + 1000] == whole[b][..1000],
            "block {b} head"
        );
        let rest = back[b][1].0 as usize;
        assert!(
            mem.bytes()[rest..rest + n - 1000] == whole[b][1000..],
            "block {b} tail"
        );
    }
    // A missing key and a room too small are answered, not written.
    let missing = kv
        .batch_get_into_parts("alice", &["nope".to_string()], &buf, &[vec![(0, 64)]])
        .expect("missing key");
    assert_eq!(missing, vec![None]);
    let small = kv.batch_get_into_parts("alice", &keys[..1], &buf, &[vec![(0, 10), (64, 10)]]);
    assert!(small.is_err(), "a block larger than its room must fail");

    // The node reached this memory through the client's memory file (the shm listener
    // checked its descriptors), never through the client's tcp listener.
    let stats = kv.engine().stats();
    assert!(stats.shm_listener.requests > 0, "{stats:?}");
    assert_eq!(stats.tcp_listener.requests, 0, "{stats:?}");

    // Bob, with his own session, names Alice's engine memory: refused before anything moves,
    // and her bytes stay as they were.
    let bob_kv = client(&server, bob());
    let before = mem.bytes()[..4096].to_vec();
    let desc = buf.segment().descriptor(0, LEN as u64).unwrap();
    for (op, body) in [
        (
            "get-into",
            json!({"keys": ["x"], "buffer": desc, "ranges": [[0, 4096]], "session": bob_kv.session()}),
        ),
        (
            "put-from",
            json!({"blocks": [{"key": "stolen", "offset": 0, "len": 4096}], "buffer": desc, "session": bob_kv.session()}),
        ),
    ] {
        let path = format!("/v1/kv/bob/{op}");
        let r = send_as(&server, &bob(), "POST", &path, body.to_string().as_bytes());
        assert_eq!(r.status, 400, "{op}: {}", r.text());
        assert!(r.text().contains("not the client's"), "{op}: {}", r.text());
    }
    assert_eq!(
        send_as(&server, &bob(), "GET", "/bob/stolen", b"").status,
        404
    );
    assert!(mem.bytes()[..4096] == before[..]);
    // With Alice's session, Bob is refused the session itself.
    let r = send_as(
        &server,
        &bob(),
        "POST",
        "/v1/kv/bob/put-from",
        json!({"blocks": [{"key": "stolen", "offset": 0, "len": 4096}], "buffer": desc, "session": kv.session()})
            .to_string()
            .as_bytes(),
    );
    assert!(r.status == 403 || r.status == 400, "{}", r.text());
    assert_eq!(
        send_as(&server, &bob(), "GET", "/bob/stolen", b"").status,
        404
    );
    drop(buf);
}

/// The CPUs a thread may run on, from its `status` file (`Cpus_allowed_list`, e.g. `0-3,6`).
fn cpus_allowed(status: &std::path::Path) -> std::collections::BTreeSet<u32> {
    let list = std::fs::read_to_string(status)
        .expect("a thread's status")
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:").map(str::to_string))
        .expect("Cpus_allowed_list in a thread's status");
    let mut out = std::collections::BTreeSet::new();
    for part in list.trim().split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (u32, u32) = (a.parse().expect("a CPU"), b.parse().expect("a CPU"));
        out.extend(a..=b);
    }
    out
}

/// The status files of the node's threads whose names start with `prefix`.
fn thread_statuses(pid: u32, prefix: &str) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("the node's threads")
        .filter_map(|t| {
            let dir = t.ok()?.path();
            let name = std::fs::read_to_string(dir.join("comm")).ok()?;
            name.trim().starts_with(prefix).then(|| dir.join("status"))
        })
        .collect()
}

/// A block of 1 MiB or more is copied by its shard and a copy helper together
/// (`--copy-threads`, `yutu_transfer::split_copy`): the bytes arrive whole both ways, the
/// helper's pieces show in `yutu_copy_helper_*`, and `--copy-threads 1` keeps every copy on
/// the shard (no helper thread is ever started, the counters stay at 0).
#[test]
fn large_blocks_are_copied_with_helpers_unless_told_not_to_and_arrive_whole() {
    for threads in ["2", "1"] {
        let server = node_with_users(&[
            "--memory",
            "64MiB",
            "--shards",
            "1",
            "--copy-threads",
            threads,
        ]);
        assert!(
            server.log().contains(&format!("copy_threads={threads}")),
            "{}",
            server.log()
        );
        assert_eq!(send_as(&server, &alice(), "PUT", "/alice", b"").status, 200);
        let kv = client(&server, alice());
        let mut mem = Anon::new();
        // SAFETY: `mem` outlives `buf` (declared before it, dropped after it).
        let buf = unsafe { kv.register_host(mem.0, LEN as u64) }.expect("register engine memory");
        // A 2 MiB block from two spans (1.5 MiB and 512 KiB + 3 bytes), read back into one.
        let half = LEN / 2;
        let block = pattern(half + 3, 77);
        mem.bytes_mut()[..half + 3].copy_from_slice(&block);
        let from: Parts = vec![
            (0, (3 << 19) as u64),
            ((3 << 19) as u64, (half + 3 - (3 << 19)) as u64),
        ];
        let keys = vec!["large".to_string()];
        kv.batch_put_from_parts("alice", &keys, &buf, &[from], &PutOptions::default())
            .expect("put-from");
        let got = send_as(&server, &alice(), "GET", "/alice/large", b"");
        assert!(
            got.body == block,
            "copy-threads {threads}: stored wrong bytes"
        );
        mem.bytes_mut()[half - 8..].fill(0);
        let copied = kv
            .batch_get_into_parts(
                "alice",
                &keys,
                &buf,
                &[vec![(half as u64 - 8, half as u64 + 8)]],
            )
            .expect("get-into");
        assert_eq!(copied, vec![Some(block.len() as u64)]);
        assert!(
            mem.bytes()[half - 8..half - 5 + half] == block[..],
            "copy-threads {threads}: fetched wrong bytes"
        );
        let helpers = thread_statuses(server.pid(), "yutu-copy-").len();
        // The helper wakes some microseconds after it is asked, and takes a piece only if
        // the shard has not copied them all by then: fetch again until it has.
        let fetch = || {
            kv.batch_get_into_parts(
                "alice",
                &keys,
                &buf,
                &[vec![(half as u64 - 8, half as u64 + 8)]],
            )
            .expect("get-into")
        };
        let node = cpus_allowed(std::path::Path::new(&format!(
            "/proc/{}/status",
            server.pid()
        )));
        if threads == "2" {
            assert_eq!(helpers, node.len(), "one helper per CPU of the node");
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            while server.metric_sum("yutu_copy_helper_runs_total") == 0.0 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the copy helper never took a piece of a 2 MiB copy"
                );
                fetch();
            }
            assert!(server.metric_sum("yutu_copy_helper_bytes_total") > 0.0);
            // The helpers were made by the shard's first large copy, on the shard's pinned
            // thread; they must not all stay on that one CPU (they would only take turns with
            // the shard), but be pinned one to each CPU of the node.
            let mut pinned = std::collections::BTreeSet::new();
            for status in thread_statuses(server.pid(), "yutu-copy-") {
                let cpus = cpus_allowed(&status);
                assert_eq!(
                    cpus.len(),
                    1,
                    "a copy helper is pinned to one CPU: {cpus:?}"
                );
                pinned.extend(cpus);
            }
            assert_eq!(pinned, node, "a copy helper on each CPU of the node");
        } else {
            assert_eq!(helpers, 0, "no helper when told so");
            for _ in 0..20 {
                fetch();
            }
            assert_eq!(server.metric_sum("yutu_copy_helper_runs_total"), 0.0);
            assert_eq!(server.metric_sum("yutu_copy_helper_bytes_total"), 0.0);
        }
        drop(buf);
    }
}
