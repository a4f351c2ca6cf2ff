//! Value mirrors against a real node: a same-host client reads small KV blocks out of the
//! mirror next to the bucket's presence table, and what it reads is what the node would
//! answer: after every acknowledged put, overwrite (also by a value too large to mirror, or
//! by an S3 object), remove and eviction, and under concurrent writers, checked over a
//! recorded history of unique values.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use yutu_client::kv::{KvClient, KvOptions};
use yutu_tests::Server;

fn client(server: &Server, presence: bool) -> KvClient {
    KvClient::new(
        &server.url,
        KvOptions {
            presence,
            ..KvOptions::default()
        },
    )
    .expect("kv client")
}

fn http(server: &Server, method: &str, path: &str, body: &[u8]) -> u16 {
    server.client().send(method, path, &[], Some(body)).status
}

/// Stores `value` as `key` through put-from (a KV block).
fn put(kv: &KvClient, bucket: &str, key: &str, value: &[u8]) {
    let buf = kv.register(value.len().max(1) as u64).expect("buffer");
    buf.write_at(0, value).expect("stage");
    kv.batch_put_from(
        bucket,
        &[key.to_string()],
        &buf,
        &[0],
        &[value.len() as u64],
    )
    .expect("put-from");
}

/// A value that names its key and version, `len` bytes long, the rest letters drawn from
/// the version (so every value is unique, and a copy torn between two versions shows).
fn value(key: &str, version: usize, len: usize) -> Vec<u8> {
    let mut v = format!("{key}#{version}#").into_bytes();
    let mut x = (version as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.push(b'a' + (x % 26) as u8);
    }
    v.truncate(len);
    v
}

/// Each step changes one key and is followed by a read through a second same-host client
/// (which reads from the mirror where it can) and one that never maps a table; both must
/// answer the last acknowledged value, twice (the first read of a key is served by the node,
/// which mirrors it). The mirrored reads must have happened; S3 objects and values over
/// 4 KiB must not be read from the mirror; a batch get (always the node's) mixing mirrored,
/// large and absent keys must answer the same bytes.
#[test]
fn reads_from_the_mirror_follow_every_acknowledged_change() {
    let server = Server::start(&[
        "--memory",
        "8MiB",
        "--shards",
        "2",
        "--nvme-capacity",
        "256MiB",
    ]);
    assert_eq!(http(&server, "PUT", "/mir", b""), 200);
    let writer = client(&server, true);
    let reader = client(&server, true);
    let plain = client(&server, false);
    let mut want: HashMap<String, Option<Vec<u8>>> = HashMap::new();
    // The first read of a key after a change is the node's (and mirrors it), the second the
    // mirror's.
    let check = |want: &HashMap<String, Option<Vec<u8>>>, key: &str| {
        let w = want.get(key).cloned().flatten();
        assert_eq!(
            reader.get_bytes("mir", key).unwrap(),
            w,
            "mirror reader, {key}"
        );
        assert_eq!(
            reader.get_bytes("mir", key).unwrap(),
            w,
            "mirror reader, {key}"
        );
        assert_eq!(
            plain.get_bytes("mir", key).unwrap(),
            w,
            "node reader, {key}"
        );
    };
    for i in 0..400 {
        let key = format!("k-{}", i % 97);
        let step = i % 6;
        match step {
            0..=2 => {
                let v = value(&key, i, [4096, 100, 1][step]);
                put(&writer, "mir", &key, &v);
                want.insert(key.clone(), Some(v));
            }
            3 => {
                writer.remove("mir", std::slice::from_ref(&key)).unwrap();
                want.insert(key.clone(), None);
            }
            4 => {
                // Too large for the mirror: the older, mirrored value must not be read.
                let v = value(&key, i, 4097 + i);
                put(&writer, "mir", &key, &v);
                want.insert(key.clone(), Some(v));
            }
            _ => {
                // An S3 object replaces the block: not mirrored, and the block is gone.
                let v = value(&key, i, 64);
                assert_eq!(http(&server, "PUT", &format!("/mir/{key}"), &v), 200);
                want.insert(key.clone(), Some(v));
            }
        }
        check(&want, &key);
    }
    let hits = reader.mirror_hits();
    assert!(hits > 100, "the reader read {hits} values from the mirror");
    assert_eq!(plain.mirror_hits(), 0);
    assert!(server.metric_sum("yutu_value_mirror_stores_total") > 0.0);

    // Evictions: far more 4 KiB blocks than 8 MiB of DRAM holds; every one reads back,
    // from the mirror or, once evicted to NVMe, from the node.
    let many: Vec<String> = (0..3000).map(|i| format!("e-{i}")).collect();
    for (i, k) in many.iter().enumerate() {
        let v = value(k, i, 4096);
        put(&writer, "mir", k, &v);
        want.insert(k.clone(), Some(v));
    }
    for k in many.iter().step_by(7) {
        check(&want, k);
    }
    assert!(
        server.metric_sum("yutu_evictions_total") > 0.0,
        "some were evicted"
    );

    // A batch into a registered buffer: mirrored, too large, absent and S3 keys at once.
    let mut keys: Vec<String> = (0..97).map(|i| format!("k-{i}")).collect();
    keys.extend(many.iter().rev().take(20).cloned());
    keys.push("never-written".into());
    let room = 8192u64;
    let buf_a = reader.register(room * keys.len() as u64).unwrap();
    let buf_b = plain.register(room * keys.len() as u64).unwrap();
    let offsets: Vec<u64> = (0..keys.len() as u64).map(|i| i * room).collect();
    let rooms = vec![room; keys.len()];
    let a = reader
        .batch_get_into_ranges("mir", &keys, &buf_a, &offsets, &rooms)
        .unwrap();
    let b = plain
        .batch_get_into_ranges("mir", &keys, &buf_b, &offsets, &rooms)
        .unwrap();
    for (i, k) in keys.iter().enumerate() {
        let w = want.get(k).cloned().flatten();
        assert_eq!(a[i], b[i], "{k}");
        assert_eq!(a[i], w.as_ref().map(|w| w.len() as u64), "{k}");
        if let Some(w) = &w {
            let mut got = vec![0u8; w.len()];
            buf_a.read_at(offsets[i], &mut got).unwrap();
            assert_eq!(&got, w, "{k}");
        }
    }
}

/// One read or write of the concurrent history: what it saw or wrote, and when.
#[derive(Clone, Debug)]
struct Event {
    key: usize,
    /// The version written (`None`: a remove), or read (`None`: absent).
    version: Option<usize>,
    write: bool,
    start: Instant,
    end: Instant,
}

/// Writers overwrite and remove a few keys with unique values while readers read them
/// through the mirror. The checker: every value read was written to that key, and no read
/// returns a value older than one whose write was acknowledged before the read began.
#[test]
fn concurrent_reads_through_the_mirror_never_go_back_in_time() {
    concurrent_history(4096, |n| 64 + n % 4000, KvClient::mirror_hits);
}

/// The same history with blocks of 64 KiB to about 320 KiB, which the node notes in located
/// slots as it publishes them: the readers copy them out of their arena views without a
/// call, racing the writers' overwrites and removes of the very bytes they copy, and a copy
/// is kept only when its slot did not change meanwhile. A torn copy, another key's bytes or
/// an older version than the checker allows would fail it.
#[test]
fn concurrent_reads_through_located_slots_never_go_back_in_time() {
    concurrent_history(
        320 << 10,
        |n| (64 << 10) + (n * 4099) % (256 << 10),
        KvClient::located_hits,
    );
}

/// Two writers (one per half of the keys) put values of `len(n)` bytes and remove keys,
/// two readers get them; the history is checked for every read; `hits` counts the reads
/// that did not ask the node, of which there must have been many.
fn concurrent_history(buf_len: u64, len: fn(usize) -> usize, hits_of: fn(&KvClient) -> u64) {
    let server = Server::start(&["--memory", "64MiB", "--shards", "2", "--nvme-capacity", "0"]);
    assert_eq!(http(&server, "PUT", "/con", b""), 200);
    const KEYS: usize = 8;
    let keys: Vec<String> = (0..KEYS).map(|i| format!("c-{i}")).collect();
    let history: Arc<Mutex<Vec<Event>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + Duration::from_secs(4);
    let mut threads = Vec::new();
    // One writer per key set (each key has one writer, so its versions are in order).
    for w in 0..2usize {
        let (history, keys) = (history.clone(), keys.clone());
        // Made here, one at a time: a new client's session is proven by a transfer, and a
        // user may have two in flight.
        let kv = client(&server, true);
        threads.push(std::thread::spawn(move || {
            let buf = kv.register(buf_len).unwrap();
            let mut n = 0usize;
            while Instant::now() < deadline && n < 4000 {
                let key = w + 2 * (n % (KEYS / 2));
                let version = n * 2 + w + 1;
                let start = Instant::now();
                let written = if n % 5 == 4 {
                    kv.remove("con", &[keys[key].clone()]).unwrap();
                    None
                } else {
                    let v = value(&keys[key], version, len(n));
                    buf.write_at(0, &v).unwrap();
                    kv.batch_put_from("con", &[keys[key].clone()], &buf, &[0], &[v.len() as u64])
                        .unwrap();
                    Some(version)
                };
                let end = Instant::now();
                history.lock().unwrap().push(Event {
                    key,
                    version: written,
                    write: true,
                    start,
                    end,
                });
                n += 1;
            }
        }));
    }
    let hits = Arc::new(Mutex::new(0u64));
    for r in 0..2usize {
        let (history, keys, stop, hits) =
            (history.clone(), keys.clone(), stop.clone(), hits.clone());
        let kv = client(&server, true);
        threads.push(std::thread::spawn(move || {
            let mut n = 0usize;
            while !stop.load(Ordering::Relaxed) && n < 200_000 {
                let key = (n + r) % KEYS;
                let start = Instant::now();
                let got = kv.get_bytes("con", &keys[key]).unwrap();
                let end = Instant::now();
                let version = got.map(|v| {
                    let text = String::from_utf8_lossy(&v).to_string();
                    let mut parts = text.split('#');
                    assert_eq!(
                        parts.next(),
                        Some(keys[key].as_str()),
                        "another key's value"
                    );
                    let version: usize = parts.next().unwrap().parse().unwrap();
                    assert_eq!(v, value(&keys[key], version, v.len()), "a torn value");
                    version
                });
                history.lock().unwrap().push(Event {
                    key,
                    version,
                    write: false,
                    start,
                    end,
                });
                n += 1;
            }
            *hits.lock().unwrap() += hits_of(&kv);
        }));
    }
    // Writers end by the deadline; readers are stopped after them.
    for t in threads.drain(..2) {
        t.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let history = history.lock().unwrap().clone();
    let hits = *hits.lock().unwrap();
    assert!(hits > 100, "{hits} reads did not ask the node");

    // The checker. Per key, writes in order (one writer each): a read may return the
    // version of the last write acknowledged before it began, or of any write that began
    // before it ended and is not older than that.
    let mut reads = 0;
    for key in 0..KEYS {
        let writes: Vec<&Event> = history.iter().filter(|e| e.write && e.key == key).collect();
        for r in history.iter().filter(|e| !e.write && e.key == key) {
            reads += 1;
            let done_before = writes.iter().rposition(|w| w.end < r.start);
            let allowed: Vec<Option<usize>> = match done_before {
                Some(i) => writes[i..]
                    .iter()
                    .take_while(|w| w.start < r.end)
                    .map(|w| w.version)
                    .collect(),
                None => std::iter::once(None)
                    .chain(
                        writes
                            .iter()
                            .take_while(|w| w.start < r.end)
                            .map(|w| w.version),
                    )
                    .collect(),
            };
            assert!(
                allowed.contains(&r.version),
                "key {key}: a read in {:?}..{:?} saw {:?}, allowed {allowed:?}",
                r.start,
                r.end,
                r.version
            );
        }
    }
    assert!(reads > 1000, "{reads} reads checked");
}

const TOKEN_KEY: &str = "mirror-secret-0123456789abcdef-0123456789";
const KID: &str = "m1";

fn token(scopes: &[&str], admin: bool, ttl: Duration) -> String {
    yutu_tests::users::token_signed(KID, TOKEN_KEY, scopes, admin, ttl)
}

fn client_as(server: &Server, token: String) -> KvClient {
    KvClient::new(
        &server.url,
        KvOptions {
            token: Some(token),
            ..KvOptions::default()
        },
    )
    .expect("kv client")
}

/// Who reads from a mirror: a caller that may read and list the bucket. One that may only
/// read gets the same values from the node; another tenant gets nothing from either; after
/// the bucket's ACL changes, the old mirror is gone and reads go on right from a new table;
/// an expired token reads nothing.
#[test]
fn only_callers_that_may_list_the_bucket_read_its_mirror() {
    let server = yutu_tests::users::node_with_token_key(
        KID,
        TOKEN_KEY,
        &["--memory", "64MiB", "--shards", "2", "--nvme-capacity", "0"],
    );
    let admin = token(&[], true, Duration::from_secs(600));
    let auth = format!("Bearer {admin}");
    let made = server.client().send(
        "PUT",
        "/ten",
        &[("authorization", auth.as_str())],
        Some(b""),
    );
    assert_eq!(made.status, 200, "{}", made.text());
    let owner = client_as(&server, admin.clone());
    let keys: Vec<String> = (0..16).map(|i| format!("t-{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        put(&owner, "ten", k, &value(k, i, 512));
    }
    // A large block too: noted in a located slot as it is put.
    let big = value("t-big", 99, 192 << 10);
    put(&owner, "ten", "t-big", &big);
    let read_all = |kv: &KvClient| {
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(
                kv.get_bytes("ten", k).unwrap(),
                Some(value(k, i, 512)),
                "{k}"
            );
        }
        assert_eq!(kv.get_bytes("ten", "t-big").unwrap().as_ref(), Some(&big));
    };

    let lister = client_as(&server, token(&["ten:rl"], false, Duration::from_secs(600)));
    read_all(&lister);
    read_all(&lister);
    assert!(
        lister.mirror_hits() >= keys.len() as u64,
        "read from the mirror"
    );
    assert!(
        lister.located_hits() >= 1,
        "copied through its located slot"
    );
    assert!(server.metric_sum("yutu_value_mirror_locations_total") >= 1.0);

    let reader = client_as(&server, token(&["ten:r"], false, Duration::from_secs(600)));
    read_all(&reader);
    read_all(&reader);
    assert_eq!(
        reader.mirror_hits(),
        0,
        "read without list: no table, no mirror"
    );
    assert_eq!(reader.located_hits(), 0, "nor a located slot");

    let stranger = client_as(
        &server,
        token(&["other:rwdl"], false, Duration::from_secs(600)),
    );
    let refused = stranger.get_bytes("ten", &keys[0]).unwrap_err();
    assert_eq!(refused.code(), Some("AccessDenied"), "{refused}");
    let refused = stranger.get_bytes("ten", "t-big").unwrap_err();
    assert_eq!(refused.code(), Some("AccessDenied"), "{refused}");
    assert_eq!((stranger.mirror_hits(), stranger.located_hits()), (0, 0));

    // A settings change retires the tables and wipes their mirrors; the lister's reads
    // stay right (from the node, then from a new table's mirror).
    let acl = server.client().send(
        "PUT",
        "/ten?acl",
        &[
            ("authorization", auth.as_str()),
            ("x-amz-acl", "authenticated-read"),
        ],
        Some(b""),
    );
    assert_eq!(acl.status, 200, "{}", acl.text());
    assert!(server.metric_sum("yutu_presence_retired_total") >= 1.0);
    put(&owner, "ten", &keys[0], b"after the ACL change");
    let located = lister.located_hits();
    assert_eq!(
        lister.get_bytes("ten", "t-big").unwrap().as_ref(),
        Some(&big)
    );
    assert_eq!(
        lister.located_hits(),
        located,
        "the retired table's located slot was wiped: the node answered"
    );
    // A new table (asked for at the next get), its slot written by the node's next read,
    // then a copy through it.
    for _ in 0..3 {
        assert_eq!(
            lister.get_bytes("ten", "t-big").unwrap().as_ref(),
            Some(&big)
        );
    }
    assert!(
        lister.located_hits() > located,
        "a new table's located slot"
    );
    let hits = lister.mirror_hits();
    assert_eq!(
        lister.get_bytes("ten", &keys[0]).unwrap().as_deref(),
        Some(&b"after the ACL change"[..])
    );
    for _ in 0..2 {
        for (i, k) in keys.iter().enumerate().skip(1) {
            assert_eq!(lister.get_bytes("ten", k).unwrap(), Some(value(k, i, 512)));
        }
    }
    assert!(lister.mirror_hits() > hits, "a new table's mirror");

    // A token about to expire: its reads come from the mirror while it is valid, and the
    // node refuses it after (the client stops using the table at its expiry).
    let brief = client_as(&server, token(&["ten:rl"], false, Duration::from_secs(2)));
    for (i, k) in keys.iter().enumerate().skip(1) {
        assert_eq!(brief.get_bytes("ten", k).unwrap(), Some(value(k, i, 512)));
    }
    assert!(
        yutu_tests::server::wait_until(Duration::from_secs(30), || {
            brief.get_bytes("ten", &keys[1]).is_err()
        }),
        "the token expired"
    );
    let err = brief.get_bytes("ten", &keys[1]).unwrap_err();
    assert_eq!(err.code(), Some("ExpiredToken"), "{err}");
}
