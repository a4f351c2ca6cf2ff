//! Arena views against a real node: a same-host client that can read the node's memory
//! (it proves so by reading a nonce out of the node with `process_vm_readv`) maps the
//! shards' arenas and copies the blocks of large gets and puts from process memory itself;
//! every byte comes back right either way, a put into memory the node never wrote is the
//! node's, a process the kernel does not let read the node gets no view, and the node hands
//! the arena for the nonce alone, on Unix frame sockets alone.

use std::io::{Read, Write};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::process::CommandExt;
use std::time::Duration;

use serde::de::DeserializeOwned;
use yutu_api::kv_frame::{
    self, ArenaChallenge, ArenaChallengeRequest, ArenaViewGrant, ArenaViewRequest, FrameFailure,
    FrameOp, FramesInfo, Hello, FRAMES_PATH,
};
use yutu_client::kv::{KvClient, KvOptions};
use yutu_tests::kv::read_frame;
use yutu_tests::users::{token_node_with_bucket, token_signed};
use yutu_tests::{pattern, Server};

const KEY: &str = "arena-views-secret-0123456789abcdef-01234";
const KID: &str = "av1";
const BLOCK: usize = 2 << 20;
const BLOCKS: usize = 16;

fn admin() -> String {
    token_signed(KID, KEY, &[], true, Duration::from_secs(600))
}

/// A two-shard node taking tokens signed with `KEY`, bucket `views` created, its arenas
/// faulted in at start (`--prefault`; without it they are populated as allocations first reach
/// them: see `a_fresh_nodes_first_large_put_goes_through_views`).
fn node(extra: &[&str]) -> Server {
    let server = lazy_node(&[extra, &["--prefault"]].concat());
    let done = yutu_tests::server::wait_until(Duration::from_secs(60), || {
        server.log().matches("DRAM arena prefaulted").count() == 2
    });
    assert!(done, "the node did not prefault: {}", server.log());
    server
}

/// As [`node`], the arenas left to fault in as the node writes them.
fn lazy_node(extra: &[&str]) -> Server {
    token_node_with_bucket(KID, KEY, &admin(), "views", extra)
}

fn client(url: &str, token: String) -> KvClient {
    KvClient::new(
        url,
        KvOptions {
            token: Some(token),
            ..KvOptions::default()
        },
    )
    .expect("kv client")
}

/// Puts `BLOCKS` large blocks from registered process memory (as an engine's numpy array is
/// registered; twice, the second overwriting with other bytes), gets them back into its
/// other half with a missing key among them, then a batch of small blocks, and the large
/// ones into a memfd buffer (which the node maps and copies itself); checks every byte.
/// The bytes this client copied through views: the large puts and get with process memory,
/// or 0.
fn round_trip(kv: &KvClient) -> u64 {
    let half = BLOCKS * BLOCK;
    let mut mem = vec![0u8; 2 * half];
    // SAFETY: `mem` outlives `buf` (dropped at the end of this function, before `mem`), and is
    // read and written here only between calls.
    let buf = unsafe { kv.register_host(mem.as_mut_ptr(), mem.len() as u64) }.expect("buffer");
    let keys: Vec<String> = (0..BLOCKS).map(|i| format!("big-{i}")).collect();
    let offsets: Vec<u64> = (0..BLOCKS).map(|i| (i * BLOCK) as u64).collect();
    let lens = vec![BLOCK as u64; BLOCKS];
    let before = kv.view_bytes();
    for round in 0..2u64 {
        for (i, &at) in offsets.iter().enumerate() {
            let at = at as usize;
            mem[at..at + BLOCK].copy_from_slice(&pattern(BLOCK, round * 100 + i as u64));
        }
        kv.batch_put_from("views", &keys, &buf, &offsets, &lens)
            .expect("a large put");
    }
    // Fifteen stored keys and a missing one, which the node answers.
    let mut wanted: Vec<String> = keys[..BLOCKS - 1].to_vec();
    wanted.insert(3, "never-stored".into());
    let targets: Vec<u64> = (0..BLOCKS).map(|i| (half + i * BLOCK) as u64).collect();
    let got = kv
        .batch_get_into("views", &wanted, &buf, &targets)
        .expect("a large get");
    for (j, key) in wanted.iter().enumerate() {
        if key == "never-stored" {
            assert_eq!(got[j], None, "a missing key is answered missing");
            continue;
        }
        let i: u64 = key.trim_start_matches("big-").parse().unwrap();
        assert_eq!(got[j], Some(BLOCK as u64), "key {key}");
        let at = targets[j] as usize;
        assert!(
            mem[at..at + BLOCK] == pattern(BLOCK, 100 + i),
            "key {key} came back wrong"
        );
    }
    let moved = kv.view_bytes() - before;
    // Small blocks: the node copies, views or not.
    let small: Vec<String> = (0..8).map(|i| format!("small-{i}")).collect();
    let small_at: Vec<u64> = (0..8).map(|i| (i * 4096) as u64).collect();
    for (i, &at) in small_at.iter().enumerate() {
        let at = at as usize;
        mem[at..at + 4096].copy_from_slice(&pattern(4096, 900 + i as u64));
    }
    kv.batch_put_from("views", &small, &buf, &small_at, &[4096; 8])
        .unwrap();
    let into: Vec<u64> = small_at.iter().map(|a| half as u64 + a).collect();
    let got = kv.batch_get_into("views", &small, &buf, &into).unwrap();
    assert!(got.iter().all(|g| *g == Some(4096)));
    for (i, &at) in into.iter().enumerate() {
        let at = at as usize;
        assert!(
            mem[at..at + 4096] == pattern(4096, 900 + i as u64),
            "small block {i}"
        );
    }
    // A memfd buffer: the node maps it and copies.
    let mapped = kv.register(half as u64).expect("a memfd buffer");
    let got = kv
        .batch_get_into("views", &keys, &mapped, &offsets)
        .unwrap();
    assert!(got.iter().all(|g| *g == Some(BLOCK as u64)));
    let mut back = vec![0u8; BLOCK];
    mapped.read_at(offsets[7], &mut back).unwrap();
    assert!(back == pattern(BLOCK, 107), "a block in the memfd buffer");
    assert_eq!(
        kv.view_bytes() - before,
        moved,
        "small calls and mapped memory go to the node"
    );
    drop(buf);
    moved
}

/// Where a child runs the client as another user, it reads its node from these.
const CHILD_URL: &str = "YUTU_ARENA_TEST_URL";
const CHILD_TOKEN: &str = "YUTU_ARENA_TEST_TOKEN";

#[test]
fn a_client_that_can_read_the_node_copies_large_blocks_itself() {
    if let (Ok(url), Ok(token)) = (std::env::var(CHILD_URL), std::env::var(CHILD_TOKEN)) {
        // The child half of `a_process_that_cannot_read_the_node_gets_no_view`.
        let kv = client(&url, token);
        assert_eq!(
            round_trip(&kv),
            0,
            "a process that cannot read the node copies nothing"
        );
        assert_eq!(kv.arena_views(), 0);
        return;
    }
    let server = node(&[]);
    let kv = client(&server.url, admin());
    let moved = round_trip(&kv);
    // Both puts of 16 blocks and the get of 15 stored ones, copied here.
    assert_eq!(moved, (2 * BLOCKS + BLOCKS - 1) as u64 * BLOCK as u64);
    assert_eq!(kv.arena_views(), 2, "a view of each shard's arena");
    assert_eq!(
        server.metric_sum("yutu_arena_views_total{outcome=\"given\""),
        2.0
    );
    // What the node stored is what a plain S3 GET reads.
    let auth = format!("Bearer {}", admin());
    let r = server.client().send(
        "GET",
        "/views/big-5",
        &[("authorization", auth.as_str())],
        None,
    );
    assert_eq!(r.status, 200);
    assert!(r.body == pattern(BLOCK, 105), "the stored block");
}

#[test]
fn a_node_without_arena_views_copies_every_block_itself() {
    let server = node(&["--no-arena-views"]);
    let kv = client(&server.url, admin());
    assert_eq!(round_trip(&kv), 0);
    assert_eq!(kv.arena_views(), 0);
    assert_eq!(server.metric_sum("yutu_arena_views_total"), 0.0);
}

/// Runs the client half of the first test as user `nobody`: the kernel does not let it read
/// the node (a root process) with `process_vm_readv`, so it gets no view and the node copies.
#[test]
fn a_process_that_cannot_read_the_node_gets_no_view() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: only root can start the child as another user");
        return;
    }
    let server = node(&[]);
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_client_that_can_read_the_node_copies_large_blocks_itself",
            "--nocapture",
        ])
        .env(CHILD_URL, &server.url)
        .env(CHILD_TOKEN, admin())
        .env("TMPDIR", "/tmp")
        .uid(65534)
        .gid(65534)
        .output()
        .expect("the child test");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the child failed: {text}");
    assert!(text.contains("1 passed"), "the child ran the test: {text}");
    assert_eq!(
        server.metric_sum("yutu_arena_views_total{outcome=\"given\""),
        0.0
    );
    assert!(
        server.metric_sum("yutu_arena_views_total{outcome=\"refused\"") >= 1.0,
        "the child's answer proved nothing"
    );
}

fn frames_info(server: &Server) -> FramesInfo {
    let auth = format!("Bearer {}", admin());
    let r = server.client().send(
        "GET",
        FRAMES_PATH,
        &[("authorization", auth.as_str())],
        None,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    serde_json::from_slice(&r.body).expect("frames info")
}

/// A frame connection, greeted with the admin token.
fn greeted<S: Read + Write>(mut s: S) -> S {
    let hello = kv_frame::encode(&Hello {
        token: Some(admin()),
    })
    .unwrap();
    s.write_all(&kv_frame::frame(FrameOp::Hello, true, 0, &hello).unwrap())
        .unwrap();
    let (h, _) = read_frame(&mut s);
    assert!(h.ok, "the hello is accepted");
    s
}

fn unix(info: &FramesInfo, shard: usize) -> std::os::unix::net::UnixStream {
    let addr =
        std::os::unix::net::SocketAddr::from_abstract_name(info.unix[shard].as_bytes()).unwrap();
    let s = std::os::unix::net::UnixStream::connect_addr(&addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    greeted(s)
}

fn ask<T: DeserializeOwned>(
    s: &mut (impl Read + Write),
    op: FrameOp,
    body: &impl serde::Serialize,
) -> Result<T, FrameFailure> {
    let body = kv_frame::encode(body).unwrap();
    s.write_all(&kv_frame::frame(op, true, 7, &body).unwrap())
        .unwrap();
    let (h, body) = read_frame(s);
    if h.ok {
        Ok(kv_frame::decode(&body).expect("an answer"))
    } else {
        Err(kv_frame::decode(&body).expect("a failure"))
    }
}

fn view(s: &mut (impl Read + Write), proof: Vec<u8>) -> Result<ArenaViewGrant, FrameFailure> {
    ask(s, FrameOp::ArenaView, &ArenaViewRequest { proof })
}

fn challenge(s: &mut (impl Read + Write)) -> Result<ArenaChallenge, FrameFailure> {
    ask(s, FrameOp::ArenaChallenge, &ArenaChallengeRequest {})
}

/// Reads `len` bytes at `address` of process `pid`, as a client proving itself does.
fn read_out_of(pid: u32, address: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    let local = libc::iovec {
        iov_base: out.as_mut_ptr().cast(),
        iov_len: len,
    };
    let remote = libc::iovec {
        iov_base: address as usize as *mut libc::c_void,
        iov_len: len,
    };
    // SAFETY: one local iovec over `out`; the kernel checks the remote one.
    let n = unsafe { libc::process_vm_readv(pid as i32, &local, 1, &remote, 1, 0) };
    assert_eq!(
        n,
        len as isize,
        "reading the node: {}",
        std::io::Error::last_os_error()
    );
    out
}

#[test]
fn the_arena_is_handed_only_for_the_nonce_read_out_of_the_node() {
    let server = node(&[]);
    let info = frames_info(&server);
    let mut s = unix(&info, 0);
    // No challenge asked yet.
    let e = view(&mut s, vec![0; 32]).unwrap_err();
    assert_eq!(
        (e.status, e.code.as_str()),
        (400, "InvalidRequest"),
        "{}",
        e.message
    );
    // A wrong answer is refused and spends the challenge.
    let c = challenge(&mut s).expect("a challenge");
    assert_eq!(c.len, 32);
    let e = view(&mut s, vec![0; 32]).unwrap_err();
    assert_eq!(
        (e.status, e.code.as_str()),
        (403, "AccessDenied"),
        "{}",
        e.message
    );
    let right = read_out_of(info.pid, c.address, 32);
    let e = view(&mut s, right).unwrap_err();
    assert_eq!(
        e.code, "InvalidRequest",
        "the right bytes after a wrong answer: spent"
    );
    // The nonce read out of the node's memory: the view, with the arena's memfd offered.
    let c = challenge(&mut s).expect("a challenge");
    let grant = view(&mut s, read_out_of(info.pid, c.address, 32)).expect("the view");
    assert_eq!(grant.shard, 0);
    assert!(
        grant.len >= 64 << 20,
        "the shard's arena: {} bytes",
        grant.len
    );
    assert_eq!(grant.nonce.len(), 16);
    // Every challenge is new.
    let again = challenge(&mut s).expect("a challenge");
    assert_ne!(
        read_out_of(info.pid, again.address, 32),
        read_out_of(info.pid, c.address, 32)
    );
    assert_eq!(
        server.metric_sum("yutu_arena_views_total{outcome=\"given\""),
        1.0
    );
    assert_eq!(
        server.metric_sum("yutu_arena_views_total{outcome=\"refused\""),
        1.0
    );

    // Not on TCP frame ports, not without a token, not from a node that gives none.
    let tcp = std::net::TcpStream::connect(("127.0.0.1", info.tcp[0])).expect("tcp frames");
    tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut tcp = greeted(tcp);
    let e = challenge(&mut tcp).unwrap_err();
    assert_eq!(e.code, "InvalidRequest", "{}", e.message);
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(info.unix[1].as_bytes()).unwrap();
    let mut anonymous = std::os::unix::net::UnixStream::connect_addr(&addr).unwrap();
    anonymous
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let hello = kv_frame::encode(&Hello { token: None }).unwrap();
    anonymous
        .write_all(&kv_frame::frame(FrameOp::Hello, true, 0, &hello).unwrap())
        .unwrap();
    let (h, _) = read_frame(&mut anonymous);
    assert!(
        !h.ok,
        "an anonymous hello is refused on an authenticated node"
    );
    let off = node(&["--no-arena-views"]);
    let info = frames_info(&off);
    let mut s = unix(&info, 1);
    let e = challenge(&mut s).unwrap_err();
    assert_eq!(e.code, "NotImplemented", "{}", e.message);
}

/// The first `n` keys `PREFIX-i` of bucket `views` that shard `shard` (of two) owns.
fn keys_on(prefix: &str, shard: usize, n: usize) -> Vec<String> {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .filter(|k| yutu_api::placement::shard_for("views", k, 2) == shard)
        .take(n)
        .collect()
}

/// A view get does not wait for its release's answer: the release is sent at once and its
/// answer read before the connection's next call, so a get right after, on the same shard,
/// finds the lease ended. With room for one block's lease per user and shard, every get of
/// a loop is still leased whole (none falls back to the node's copy), and every other call
/// on those connections still reads its own answer.
#[test]
fn a_view_gets_release_ends_its_lease_before_the_next_call() {
    // 3 MiB leased per user and shard: one block's lease, not two.
    let server = node(&["--kv-user-leased", "6MiB"]);
    let kv = client(&server.url, admin());
    let on_shard = keys_on("again", 0, 2);
    let (key, small) = (on_shard[..1].to_vec(), on_shard[1..].to_vec());
    let mut mem = vec![0u8; 2 * BLOCK];
    // SAFETY: `mem` outlives `buf`, dropped first below; read and written only between calls.
    let buf = unsafe { kv.register_host(mem.as_mut_ptr(), mem.len() as u64) }.expect("buffer");
    mem[..BLOCK].copy_from_slice(&pattern(BLOCK, 77));
    kv.batch_put_from("views", &key, &buf, &[0], &[BLOCK as u64])
        .unwrap();
    let before = kv.view_bytes();
    for round in 0..50u64 {
        mem[BLOCK..].fill(0);
        let got = kv
            .batch_get_into("views", &key, &buf, &[BLOCK as u64])
            .unwrap();
        assert_eq!(got, vec![Some(BLOCK as u64)], "round {round}");
        assert!(
            mem[BLOCK..] == pattern(BLOCK, 77),
            "round {round}: the bytes"
        );
        assert_eq!(
            kv.view_bytes() - before,
            (round + 1) * BLOCK as u64,
            "round {round} was leased: the last one's lease had ended"
        );
        // Another kind of call on the same connection reads its own answer, not the
        // release's: a small put (the node's copy) and its get.
        kv.batch_put_from("views", &small, &buf, &[0], &[4096])
            .unwrap();
        assert_eq!(
            kv.batch_get_into("views", &small, &buf, &[2 * BLOCK as u64 - 4096])
                .unwrap(),
            vec![Some(4096)],
            "round {round}"
        );
    }
    assert_eq!(
        server.metric_sum("yutu_kv_user_limit_refused_total{limit=\"leased_bytes\""),
        0.0
    );
    drop(buf);
}

/// A view get that one shard will not lease (the user's leased bytes there would pass
/// `--kv-user-leased`) goes to the node whole, and the other shard's leases end at once: a
/// view get on that shard right after is leased in full.
#[test]
fn a_refused_lease_on_one_shard_releases_the_others() {
    // 5 MiB leased per user and shard.
    let server = node(&["--kv-user-leased", "10MiB"]);
    let kv = client(&server.url, admin());
    let on = |shard: usize, n: usize| keys_on("lim", shard, n);
    // Two blocks on shard 0 (4 MiB, within its limit), three on shard 1 (6 MiB, past it).
    let (first, second) = (on(0, 4), on(1, 3));
    let mut mem = vec![0u8; 8 * BLOCK];
    // SAFETY: `mem` outlives `buf`, dropped first below; read and written only between calls.
    let buf = unsafe { kv.register_host(mem.as_mut_ptr(), mem.len() as u64) }.expect("buffer");
    let all: Vec<String> = first.iter().chain(&second).cloned().collect();
    let offsets: Vec<u64> = (0..all.len()).map(|i| (i * BLOCK) as u64).collect();
    for (i, &at) in offsets.iter().enumerate() {
        let at = at as usize;
        mem[at..at + BLOCK].copy_from_slice(&pattern(BLOCK, 500 + i as u64));
    }
    kv.batch_put_from(
        "views",
        &all,
        &buf,
        &offsets,
        &vec![BLOCK as u64; all.len()],
    )
    .unwrap();
    mem.fill(0);
    let put = kv.view_bytes();
    let keys: Vec<String> = first[..2].iter().chain(&second).cloned().collect();
    let picked = [0usize, 1, 4, 5, 6];
    let into: Vec<u64> = (0..keys.len()).map(|i| (i * BLOCK) as u64).collect();
    let got = kv.batch_get_into("views", &keys, &buf, &into).unwrap();
    assert!(got.iter().all(|g| *g == Some(BLOCK as u64)), "{got:?}");
    for (j, &at) in into.iter().enumerate() {
        let at = at as usize;
        assert!(
            mem[at..at + BLOCK] == pattern(BLOCK, 500 + picked[j] as u64),
            "block {j} through the node"
        );
    }
    assert_eq!(
        kv.view_bytes(),
        put,
        "the refused call went to the node whole"
    );
    assert!(server.metric_sum("yutu_kv_user_limit_refused_total{limit=\"leased_bytes\"") >= 1.0);
    // Shard 0's two leases ended with the call: two more of its blocks lease in full.
    let more = first[2..].to_vec();
    let got = kv.batch_get_into("views", &more, &buf, &into[..2]).unwrap();
    assert!(got.iter().all(|g| *g == Some(BLOCK as u64)));
    assert_eq!(
        kv.view_bytes() - put,
        2 * BLOCK as u64,
        "shard 0 leased them: nothing was left held"
    );
    drop(buf);
}

/// A fresh node without `--prefault` populates the room it reserves for a view put before it
/// answers (the pages are allocated by, and charged to, the node), so even the first large
/// put into memory the node never wrote goes through the view. (A range the client finds not
/// resident, as from a kernel without `MADV_POPULATE_WRITE`, would be revoked and copied by
/// the node: `view_pages.rs` tests that check.)
#[test]
fn a_fresh_nodes_first_large_put_goes_through_views() {
    let server = lazy_node(&[]);
    let kv = client(&server.url, admin());
    let mut mem = vec![0u8; BLOCKS * BLOCK];
    // SAFETY: `mem` outlives `buf`, dropped first below; read and written only between calls.
    let buf = unsafe { kv.register_host(mem.as_mut_ptr(), mem.len() as u64) }.expect("buffer");
    let keys: Vec<String> = (0..BLOCKS).map(|i| format!("cold-{i}")).collect();
    let offsets: Vec<u64> = (0..BLOCKS).map(|i| (i * BLOCK) as u64).collect();
    let lens = vec![BLOCK as u64; BLOCKS];
    for (i, &at) in offsets.iter().enumerate() {
        let at = at as usize;
        mem[at..at + BLOCK].copy_from_slice(&pattern(BLOCK, 300 + i as u64));
    }
    kv.batch_put_from("views", &keys, &buf, &offsets, &lens)
        .expect("a large put");
    assert!(kv.arena_views() >= 1, "the put asked for views");
    assert_eq!(
        kv.view_bytes(),
        (BLOCKS * BLOCK) as u64,
        "the client wrote the whole put into fresh memory through its views"
    );
    let auth = format!("Bearer {}", admin());
    let r = server.client().send(
        "GET",
        "/views/cold-9",
        &[("authorization", auth.as_str())],
        None,
    );
    assert_eq!(r.status, 200);
    assert!(r.body == pattern(BLOCK, 309), "the stored block");
    drop(buf);
}

/// A view put that one shard will not reserve for (the user's reserved bytes there would
/// pass `--kv-user-reserved`) goes to the node whole, and the other shard's reservations are
/// revoked at once: a view put on that shard right after is reserved in full.
#[test]
fn a_refused_reservation_on_one_shard_revokes_the_others() {
    // 5 MiB reserved per user and shard.
    let server = node(&["--kv-user-reserved", "10MiB"]);
    let kv = client(&server.url, admin());
    let on = |shard: usize, n: usize| keys_on("res", shard, n);
    // Two blocks on shard 0 (4 MiB, within its limit), three on shard 1 (6 MiB, past it).
    let (first, second) = (on(0, 4), on(1, 3));
    let mut mem = vec![0u8; 8 * BLOCK];
    // SAFETY: `mem` outlives `buf`, dropped first below; read and written only between calls.
    let buf = unsafe { kv.register_host(mem.as_mut_ptr(), mem.len() as u64) }.expect("buffer");
    let keys: Vec<String> = first[..2].iter().chain(&second).cloned().collect();
    let offsets: Vec<u64> = (0..keys.len()).map(|i| (i * BLOCK) as u64).collect();
    for (i, &at) in offsets.iter().enumerate() {
        let at = at as usize;
        mem[at..at + BLOCK].copy_from_slice(&pattern(BLOCK, 700 + i as u64));
    }
    let lens = vec![BLOCK as u64; keys.len()];
    kv.batch_put_from("views", &keys, &buf, &offsets, &lens)
        .unwrap();
    assert_eq!(kv.view_bytes(), 0, "the refused put went to the node whole");
    assert!(server.metric_sum("yutu_kv_user_limit_refused_total{limit=\"reserved_bytes\"") >= 1.0);
    // Shard 0's two reservations were revoked with the call: two more of its blocks reserve
    // in full.
    kv.batch_put_from("views", &first[2..], &buf, &offsets[..2], &lens[..2])
        .unwrap();
    assert_eq!(
        kv.view_bytes(),
        2 * BLOCK as u64,
        "shard 0 reserved them: nothing was left held"
    );
    // Every block is what was put.
    mem.fill(0);
    let all: Vec<String> = keys.iter().chain(&first[2..]).cloned().collect();
    let seeds = [700u64, 701, 702, 703, 704, 700, 701];
    let into: Vec<u64> = (0..all.len()).map(|i| (i * BLOCK) as u64).collect();
    let mut mem2 = vec![0u8; all.len() * BLOCK];
    // SAFETY: as `buf`.
    let out = unsafe { kv.register_host(mem2.as_mut_ptr(), mem2.len() as u64) }.expect("buffer");
    let got = kv.batch_get_into("views", &all, &out, &into).unwrap();
    assert!(got.iter().all(|g| *g == Some(BLOCK as u64)), "{got:?}");
    for (j, &at) in into.iter().enumerate() {
        let at = at as usize;
        assert!(
            mem2[at..at + BLOCK] == pattern(BLOCK, seeds[j]),
            "block {j}"
        );
    }
    drop((buf, out));
}
