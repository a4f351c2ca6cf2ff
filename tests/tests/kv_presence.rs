//! Presence tables against a real node: `exists` answered from a table the node shares with a
//! same-host client agrees with the node's own answer after every acknowledged put and
//! remove, covers keys evicted to NVMe, is given only to callers that may list the bucket, is
//! retired when the bucket's settings change or the holder's token expires, and cannot be
//! written or collected by anyone but its caller.

use std::io::Write;
use std::os::fd::AsFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use yutu_api::kv_frame::{
    self, FrameOp, FramesInfo, Hello, PresenceGrant, PresenceRequest, FRAMES_PATH,
};
use yutu_client::kv::{KvClient, KvOptions};
use yutu_tests::kv::read_frame;
use yutu_tests::server::wait_until;
use yutu_tests::users::{node_with_token_key, token_signed};
use yutu_tests::{pattern, Server};

const KEY: &str = "presence-secret-0123456789abcdef-012345678";
const KID: &str = "p1";

fn token(scopes: &[&str], admin: bool, ttl: Duration) -> String {
    token_signed(KID, KEY, scopes, admin, ttl)
}

fn admin() -> String {
    token(&[], true, Duration::from_secs(600))
}

fn http(server: &Server, token: Option<&str>, method: &str, path: &str, body: &[u8]) -> u16 {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth
        .as_deref()
        .map(|a| vec![("authorization", a)])
        .unwrap_or_default();
    server
        .client()
        .send(method, path, &headers, Some(body))
        .status
}

fn client(server: &Server, token: Option<String>, presence: bool) -> KvClient {
    KvClient::new(
        &server.url,
        KvOptions {
            token,
            presence,
            ..KvOptions::default()
        },
    )
    .expect("kv client")
}

/// Stores `keys`, each `len` bytes of its own pattern.
fn put(kv: &KvClient, bucket: &str, keys: &[String], len: u64) {
    let buf = kv.register(len * keys.len() as u64).expect("buffer");
    let offsets: Vec<u64> = (0..keys.len() as u64).map(|i| i * len).collect();
    for (i, at) in offsets.iter().enumerate() {
        buf.write_at(*at, &pattern(len as usize, i as u64))
            .expect("stage");
    }
    kv.batch_put_from(bucket, keys, &buf, &offsets, &vec![len; keys.len()])
        .expect("put-from");
}

fn one(k: &str) -> Vec<String> {
    vec![k.to_string()]
}

/// Every acknowledged put is seen present and every acknowledged remove absent by the next
/// lookup, through the table; at the end the table and the node agree on every key ever
/// written and on keys never written, also after blocks were evicted to NVMe.
#[test]
fn lookups_in_the_table_follow_every_acknowledged_change_and_both_tiers() {
    let server = Server::start(&[
        "--memory",
        "16MiB",
        "--shards",
        "2",
        "--nvme-capacity",
        "256MiB",
    ]);
    assert_eq!(http(&server, None, "PUT", "/kvp", b""), 200);
    let kv = client(&server, None, true);
    let plain = client(&server, None, false);
    // The history: each step's answer is checked against what was acknowledged before it.
    let mut written = Vec::new();
    let mut present = std::collections::HashMap::new();
    for i in 0..300 {
        let key = format!("h-{i}");
        put(&kv, "kvp", &one(&key), 4096);
        assert_eq!(kv.batch_exists("kvp", &one(&key)).unwrap(), [true], "{key}");
        present.insert(key.clone(), true);
        if i % 3 == 0 {
            assert_eq!(kv.remove("kvp", &one(&key)).unwrap(), [true]);
            assert_eq!(
                kv.batch_exists("kvp", &one(&key)).unwrap(),
                [false],
                "{key}"
            );
            present.insert(key.clone(), false);
        }
        if i % 7 == 0 {
            // Replaced in place: present before, during and after.
            put(&kv, "kvp", &one(&key), 2048);
            assert_eq!(kv.batch_exists("kvp", &one(&key)).unwrap(), [true], "{key}");
            present.insert(key.clone(), true);
        }
        written.push(key);
    }
    assert_eq!(kv.presence_tables(), 2, "one table per shard");
    assert_eq!(plain.presence_tables(), 0);
    let grants = server.metric_sum("yutu_presence_grants_total");
    assert_eq!(grants, 2.0);
    let mut all = written.clone();
    all.extend((0..100).map(|i| format!("never-{i}")));
    for chunk in all.chunks(64) {
        let want: Vec<bool> = chunk
            .iter()
            .map(|k| present.get(k).copied().unwrap_or(false))
            .collect();
        assert_eq!(kv.batch_exists("kvp", chunk).unwrap(), want);
        assert_eq!(plain.batch_exists("kvp", chunk).unwrap(), want);
    }
    let chain: Vec<String> = ["h-1", "h-2", "h-3", "h-4"].map(String::from).to_vec();
    assert_eq!(kv.prefix("kvp", &chain).unwrap(), 2, "h-3 was removed");
    assert_eq!(
        kv.prefix("kvp", &chain).unwrap(),
        plain.prefix("kvp", &chain).unwrap()
    );

    // More than DRAM holds: blocks go to NVMe, and the table still says they are stored.
    let big: Vec<String> = (0..48).map(|i| format!("big-{i}")).collect();
    for chunk in big.chunks(4) {
        put(&kv, "kvp", chunk, 1 << 20);
    }
    assert!(
        wait_until(Duration::from_secs(30), || {
            server.metric_sum("yutu_nvme_objects") > 0.0
        }),
        "blocks demoted to NVMe"
    );
    // Once demotions settle, both answers agree; more keys are present than DRAM holds.
    assert!(
        wait_until(Duration::from_secs(30), || {
            big.chunks(16).all(|c| {
                kv.batch_exists("kvp", c).unwrap() == plain.batch_exists("kvp", c).unwrap()
            })
        }),
        "the table and the node agree"
    );
    let everything: Vec<String> = written.iter().chain(&big).cloned().collect();
    let stored = everything
        .chunks(64)
        .flat_map(|c| kv.batch_exists("kvp", c).unwrap())
        .filter(|p| *p)
        .count();
    let in_dram = server.metric_sum("yutu_objects");
    assert!(
        stored as f64 > in_dram,
        "{stored} keys present, {in_dram} of them in DRAM: the rest are answered from NVMe"
    );
    assert_eq!(kv.presence_tables(), 2);
    // No new grant was needed for any of it.
    assert_eq!(server.metric_sum("yutu_presence_grants_total"), grants);
}

/// A node with tokens signed by `KEY` and bucket `kvp`.
fn node() -> Server {
    let server = node_with_token_key(
        KID,
        KEY,
        &["--memory", "64MiB", "--shards", "2", "--nvme-capacity", "0"],
    );
    assert_eq!(http(&server, Some(&admin()), "PUT", "/kvp", b""), 200);
    server
}

/// A table is given only to a caller that may read and list the bucket; one that may only
/// read gets its answers from the node, and one of another bucket is refused either way.
/// Changing the bucket's settings retires its tables; an expired token's table is not used.
#[test]
fn tables_go_only_to_callers_that_may_list_and_stop_when_access_may_change() {
    let server = node();
    let owner = client(&server, Some(admin()), true);
    let keys: Vec<String> = (0..16).map(|i| format!("k{i}")).collect();
    put(&owner, "kvp", &keys[..8], 4096);
    let want: Vec<bool> = (0..16).map(|i| i < 8).collect();

    let reader = client(
        &server,
        Some(token(&["kvp:r"], false, Duration::from_secs(600))),
        true,
    );
    assert_eq!(reader.batch_exists("kvp", &keys).unwrap(), want);
    assert_eq!(reader.presence_tables(), 0, "read without list: no table");

    let lister = client(
        &server,
        Some(token(&["kvp:rl"], false, Duration::from_secs(600))),
        true,
    );
    assert_eq!(lister.batch_exists("kvp", &keys).unwrap(), want);
    assert!(lister.presence_tables() > 0);

    let stranger = client(
        &server,
        Some(token(&["other:rwdl"], false, Duration::from_secs(600))),
        true,
    );
    let refused = stranger.batch_exists("kvp", &keys).unwrap_err();
    assert_eq!(refused.code(), Some("AccessDenied"), "{refused}");
    assert_eq!(stranger.presence_tables(), 0);

    // A settings change (here the ACL) retires the bucket's tables; lookups go on right,
    // from new tables.
    let grants = server.metric_sum("yutu_presence_grants_total");
    assert_eq!(server.metric_sum("yutu_presence_retired_total"), 0.0);
    let acl = server.client().send(
        "PUT",
        "/kvp?acl",
        &[
            ("authorization", format!("Bearer {}", admin()).as_str()),
            ("x-amz-acl", "authenticated-read"),
        ],
        Some(b""),
    );
    assert_eq!(acl.status, 200, "{}", acl.text());
    assert!(server.metric_sum("yutu_presence_retired_total") >= 1.0);
    put(&owner, "kvp", &keys[8..10], 4096);
    let want: Vec<bool> = (0..16).map(|i| i < 10).collect();
    assert_eq!(lister.batch_exists("kvp", &keys).unwrap(), want);
    assert!(server.metric_sum("yutu_presence_grants_total") > grants);

    // A token about to expire: its table answers while it is valid, the node refuses after.
    let brief = client(
        &server,
        Some(token(&["kvp:rl"], false, Duration::from_secs(2))),
        true,
    );
    assert_eq!(brief.batch_exists("kvp", &keys).unwrap(), want);
    assert!(brief.presence_tables() > 0);
    assert!(
        wait_until(Duration::from_secs(30), || {
            brief.batch_exists("kvp", &keys).is_err()
        }),
        "the token expired"
    );
    let err = brief.batch_exists("kvp", &keys).unwrap_err();
    assert_eq!(err.code(), Some("ExpiredToken"), "{err}");
}

/// The raw grant: over TCP there is none; the hand-over socket closes on a wrong nonce
/// without a descriptor; the right nonce gets a descriptor that maps read-only and refuses
/// writes; a second collection finds the socket gone.
#[test]
fn the_table_is_handed_over_once_to_the_nonce_and_cannot_be_written() {
    let server = node();
    let auth = format!("Bearer {}", admin());
    let listed = server.client().send(
        "GET",
        FRAMES_PATH,
        &[("authorization", auth.as_str())],
        None,
    );
    let info: FramesInfo = serde_json::from_str(&listed.text()).expect("frames info");
    let name = &info.unix[0];
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let mut s = UnixStream::connect_addr(&addr).expect("frame socket");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let hello = kv_frame::encode(&Hello {
        token: Some(admin()),
    })
    .unwrap();
    s.write_all(&kv_frame::frame(FrameOp::Hello, true, 1, &hello).unwrap())
        .unwrap();
    assert!(read_frame(&mut s).0.ok);
    let body = kv_frame::encode_call("kvp", &PresenceRequest {}).unwrap();
    s.write_all(&kv_frame::frame(FrameOp::Presence, true, 2, &body).unwrap())
        .unwrap();
    let (h, raw) = read_frame(&mut s);
    assert!(h.ok, "{}", String::from_utf8_lossy(&raw));
    let grant: PresenceGrant = kv_frame::decode(&raw).unwrap();
    assert_eq!(grant.nonce.len(), 16);
    assert_eq!(grant.secret.len(), 32);

    let collect = |nonce: &[u8]| -> std::io::Result<(usize, Vec<std::os::fd::OwnedFd>)> {
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(grant.socket.as_bytes())?;
        let mut c = UnixStream::connect_addr(&addr)?;
        c.set_read_timeout(Some(Duration::from_secs(10)))?;
        c.write_all(nonce)?;
        let mut byte = [0u8; 1];
        let mut fds = Vec::new();
        let n = yutu_transfer::fdpass::recv_with_fds(c.as_fd(), &mut byte, &mut fds)?;
        Ok((n, fds))
    };
    let mut wrong = grant.nonce.clone();
    wrong[0] ^= 1;
    let (n, fds) = collect(&wrong).expect("a wrong nonce is answered by a close");
    assert_eq!((n, fds.len()), (0, 0), "a wrong nonce gets nothing");
    let (n, mut fds) = collect(&grant.nonce).expect("collected");
    assert_eq!((n, fds.len()), (1, 1));
    let file = std::fs::File::from(fds.remove(0));
    assert_eq!(file.metadata().unwrap().len(), grant.bytes);
    // SAFETY: a test mapping attempt that must fail.
    assert!(
        unsafe { memmap2::MmapMut::map_mut(&file) }.is_err(),
        "writable mapping"
    );
    assert!((&file).write_all(b"x").is_err(), "write");
    assert!(file.set_len(0).is_err(), "truncate");
    // SAFETY: a read-only mapping of the sealed table.
    let map = unsafe { memmap2::Mmap::map(&file) }.expect("read-only mapping");
    assert_eq!(&map[..8], b"YUTUPRS1");
    assert!(
        collect(&grant.nonce).is_err(),
        "the socket is gone after one hand-over"
    );

    // Grants left uncollected are bounded: past 64 open on a shard, a grant is refused.
    let mut granted = Vec::new();
    let mut refused = None;
    for id in 10..80 {
        s.write_all(&kv_frame::frame(FrameOp::Presence, true, id, &body).unwrap())
            .unwrap();
        let (h, raw) = read_frame(&mut s);
        if h.ok {
            granted.push(kv_frame::decode::<PresenceGrant>(&raw).unwrap());
        } else {
            refused = Some(String::from_utf8_lossy(&raw).to_string());
            break;
        }
    }
    assert_eq!(granted.len(), 64, "{refused:?}");
    assert!(refused.unwrap().contains("SlowDown"));

    // Over TCP there is no table.
    if let Some(port) = info.tcp.first() {
        let mut t = std::net::TcpStream::connect(("127.0.0.1", *port)).expect("tcp frames");
        t.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        t.write_all(&kv_frame::frame(FrameOp::Hello, true, 1, &hello).unwrap())
            .unwrap();
        assert!(read_frame(&mut t).0.ok);
        t.write_all(&kv_frame::frame(FrameOp::Presence, true, 2, &body).unwrap())
            .unwrap();
        let (h, raw) = read_frame(&mut t);
        assert!(!h.ok);
        assert!(String::from_utf8_lossy(&raw).contains("Unix"));
    }
}
