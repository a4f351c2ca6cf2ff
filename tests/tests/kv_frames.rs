//! KV calls in binary frames (`yutu_api::kv_frame`) against a real node: they answer what the
//! JSON calls answer, on the Unix socket and on the TCP port; and a frame connection is
//! checked as an HTTP request is (hello first, the token on every call, scopes, bounds), with
//! hostile bytes answered by an error frame, never a crash or a hang.

use std::io::{Read, Write};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use yutu_api::kv::{ExistsResponse, KeysRequest, KvOp};
use yutu_api::kv_frame::{
    self, FrameFailure, FrameOp, FramesInfo, Header, Hello, InlineBlock, Welcome, WriteRequest,
    FRAMES_PATH, HEADER_LEN, MAX_BODY,
};
use yutu_api::token::{issue, Claims, SigningKey};
use yutu_client::kv::{FramesMode, FramesPath, KvClient, KvOptions};
use yutu_tests::kv::read_frame;
use yutu_tests::server::wait_until;
use yutu_tests::users::{node_with_token_key, token_signed};
use yutu_tests::{pattern, Server};

const KEY: &str = "frames-secret-0123456789abcdef-0123456789";
const KID: &str = "f1";

fn token(scopes: &[&str], admin: bool, ttl: Duration) -> String {
    token_signed(KID, KEY, scopes, admin, ttl)
}

fn admin() -> String {
    token(&[], true, Duration::from_secs(600))
}

/// A node taking tokens signed with `KEY`, with `buckets` created.
fn node(buckets: &[&str]) -> Server {
    let server = node_with_token_key(
        KID,
        KEY,
        &["--memory", "64MiB", "--shards", "2", "--nvme-capacity", "0"],
    );
    for b in buckets {
        let r = http(&server, &admin(), "PUT", &format!("/{b}"), b"");
        assert_eq!(r.status, 200, "creating {b}: {}", r.text());
    }
    server
}

fn http(server: &Server, token: &str, method: &str, path: &str, body: &[u8]) -> yutu_tests::Reply {
    let auth = format!("Bearer {token}");
    server.client().send(
        method,
        path,
        &[("authorization", auth.as_str())],
        Some(body),
    )
}

fn client(server: &Server, mode: FramesMode) -> KvClient {
    KvClient::new(
        &server.url,
        KvOptions {
            token: Some(admin()),
            frames: mode,
            ..KvOptions::default()
        },
    )
    .expect("kv client")
}

/// Everything a sequence of calls answers, to compare two clients.
fn session(kv: &KvClient, bucket: &str) -> Vec<String> {
    let mut seen = Vec::new();
    let keys: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
    let buf = kv.register(1 << 20).expect("buffer");
    let mut offsets = Vec::new();
    let mut lens = Vec::new();
    let mut at = 0u64;
    for (i, _) in keys.iter().enumerate() {
        let data = pattern(1000 + 97 * i, i as u64);
        buf.write_at(at, &data).expect("stage");
        offsets.push(at);
        lens.push(data.len() as u64);
        at += data.len() as u64;
    }
    let etags = kv
        .batch_put_from(bucket, &keys[..10], &buf, &offsets[..10], &lens[..10])
        .expect("put-from");
    seen.push(format!("{etags:?}").len().to_string());
    seen.push(format!(
        "{:?}",
        kv.batch_exists(bucket, &keys).expect("exists")
    ));
    seen.push(format!("{:?}", kv.prefix(bucket, &keys).expect("prefix")));
    for k in ["k3", "k15", "absent"] {
        seen.push(format!("{:?}", kv.get_bytes(bucket, k).expect("get")));
    }
    let copied = kv
        .batch_get_into(bucket, &keys[..12], &buf, &offsets[..12])
        .expect("get-into");
    seen.push(format!("{copied:?}"));
    seen.push(format!(
        "{:?}",
        kv.remove(bucket, &keys[..5]).expect("remove")
    ));
    seen.push(format!(
        "{:?}",
        kv.batch_exists(bucket, &keys).expect("exists")
    ));
    let refused = kv.batch_exists("no-such-bucket", &keys[..1]).unwrap_err();
    seen.push(format!("{:?}", refused.code()));
    seen
}

#[test]
fn frame_calls_answer_what_the_json_calls_answer() {
    let server = node(&["by-frames", "by-json"]);
    let framed = client(&server, FramesMode::Auto);
    let json = client(&server, FramesMode::Off);
    assert_eq!(framed.frames_path(), Some(&FramesPath::Unix));
    assert_eq!(json.frames_path(), None);
    let calls_before = server.metric_sum("yutu_requests_total");
    let a = session(&framed, "by-frames");
    let b = session(&json, "by-json");
    assert_eq!(a, b);
    assert!(a[1].contains("true") && a[1].contains("false"), "{a:?}");
    assert!(
        server.metric_sum("yutu_requests_total") > calls_before,
        "frame calls are counted with the others"
    );
    // A value too large to answer inline is read over HTTP, whole.
    let big = pattern(kv_frame::MAX_INLINE as usize + 4096, 7);
    assert_eq!(
        http(&server, &admin(), "PUT", "/by-frames/big", &big).status,
        200
    );
    assert!(framed.get_bytes("by-frames", "big").expect("get") == Some(big));
}

/// A batch whose keys both shards own goes to each shard in a part of its own, every part
/// sent before any answer is read: no shard hands keys to the other, and every block comes
/// back in the batch's order. The same batch over HTTP goes through one shard, which hands
/// the other its keys (what the metric counts).
#[test]
fn a_batch_over_two_shards_goes_to_each_shard_directly() {
    let server = node(&["split"]);
    let n = 64usize;
    let block = 4096u64;
    let keys: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
    let lens = vec![block; n];
    let sources: Vec<u64> = (0..n as u64).map(|i| i * block).collect();
    let targets: Vec<u64> = sources.iter().map(|o| o + n as u64 * block).collect();
    let forwarded = || server.metric_sum("yutu_forwarded_total");
    for (mode, split) in [(FramesMode::Auto, true), (FramesMode::Off, false)] {
        let kv = client(&server, mode);
        let buf = kv.register(2 * n as u64 * block).expect("buffer");
        for (i, &at) in sources.iter().enumerate() {
            buf.write_at(at, &pattern(block as usize, i as u64))
                .unwrap();
        }
        // The session's first call, which may register the client's engine on one shard.
        assert!(kv.batch_exists("split", &keys[..1]).is_ok());
        let before = forwarded();
        kv.batch_put_from("split", &keys, &buf, &sources, &lens)
            .expect("put");
        let got = kv
            .batch_get_into("split", &keys, &buf, &targets)
            .expect("get");
        assert!(got.iter().all(|g| *g == Some(block)), "{mode:?}: {got:?}");
        for (i, &at) in targets.iter().enumerate() {
            let mut back = vec![0u8; block as usize];
            buf.read_at(at, &mut back).unwrap();
            assert!(
                back == pattern(block as usize, i as u64),
                "{mode:?}: block {i}"
            );
        }
        let hops = forwarded() - before;
        if split {
            assert_eq!(hops, 0.0, "frames: a shard handed keys to the other");
        } else {
            assert!(hops >= 2.0, "HTTP: {hops} hand-overs");
        }
    }
}

/// A read with a size limit answers a larger value's size instead of its bytes (a client then
/// moves it through registered memory); a client without frames, which cannot ask the size
/// first, gets the value whole.
#[test]
fn a_read_with_a_limit_answers_the_size_of_a_larger_value() {
    use yutu_client::kv::SmallValue;
    let server = node(&["limits"]);
    let framed = client(&server, FramesMode::Auto);
    let small = pattern(1000, 1);
    let large = pattern(200_000, 2);
    for (k, v) in [("small", &small), ("large", &large)] {
        assert_eq!(
            http(&server, &admin(), "PUT", &format!("/limits/{k}"), v).status,
            200
        );
    }
    let get = |kv: &KvClient, k: &str, max: u64| kv.get_small("limits", k, max).expect("read");
    assert_eq!(
        get(&framed, "small", 1000),
        SmallValue::Bytes(small.clone())
    );
    assert_eq!(get(&framed, "small", 999), SmallValue::Large(1000));
    assert_eq!(get(&framed, "large", 64 << 10), SmallValue::Large(200_000));
    assert_eq!(
        get(&framed, "large", u64::MAX),
        SmallValue::Bytes(large.clone())
    );
    assert_eq!(get(&framed, "absent", 10), SmallValue::Missing);
    let json = client(&server, FramesMode::Off);
    assert_eq!(get(&json, "large", 10), SmallValue::Bytes(large));
    assert_eq!(get(&json, "absent", 10), SmallValue::Missing);
}

#[test]
fn frames_go_over_tcp_where_unix_is_not_used() {
    let server = node(&["tcp"]);
    let kv = client(&server, FramesMode::Tcp);
    assert_eq!(kv.frames_path(), Some(&FramesPath::Tcp("127.0.0.1".into())));
    let keys = vec!["a".to_string()];
    let buf = kv.register(4096).expect("buffer");
    buf.write_at(0, b"hello").unwrap();
    kv.batch_put_from("tcp", &keys, &buf, &[0], &[5])
        .expect("put");
    assert_eq!(kv.batch_exists("tcp", &keys).expect("exists"), [true]);
    assert_eq!(
        kv.get_bytes("tcp", "a").expect("get"),
        Some(b"hello".to_vec())
    );
}

/// A raw frame connection to shard `shard`'s Unix socket.
fn connect(server: &Server, shard: usize) -> UnixStream {
    let r = http(server, &admin(), "GET", FRAMES_PATH, b"");
    assert_eq!(r.status, 200, "{}", r.text());
    let info: FramesInfo = serde_json::from_slice(&r.body).expect("frames info");
    assert_eq!(info.pid, server.pid(), "the node's process");
    assert_eq!(info.unix.len(), 2);
    assert_eq!(info.tcp.len(), 2);
    let addr =
        std::os::unix::net::SocketAddr::from_abstract_name(info.unix[shard].as_bytes()).unwrap();
    let s = UnixStream::connect_addr(&addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

fn send(s: &mut UnixStream, op: FrameOp, id: u32, body: &[u8]) {
    s.write_all(&kv_frame::frame(op, true, id, body).unwrap())
        .unwrap();
}

fn ok<T: DeserializeOwned>(s: &mut UnixStream) -> T {
    let (h, body) = read_frame(s);
    assert!(
        h.ok,
        "an error: {:?}",
        kv_frame::decode::<FrameFailure>(&body)
    );
    kv_frame::decode(&body).expect("the answer's struct")
}

fn failed(s: &mut UnixStream) -> FrameFailure {
    let (h, body) = read_frame(s);
    assert!(!h.ok, "a success where an error was due");
    kv_frame::decode(&body).expect("a failure")
}

fn closed(s: &mut UnixStream) -> bool {
    let mut b = [0u8; 1];
    matches!(s.read(&mut b), Ok(0))
}

fn hello(s: &mut UnixStream, token: Option<String>) {
    send(
        s,
        FrameOp::Hello,
        0,
        &kv_frame::encode(&Hello { token }).unwrap(),
    );
}

fn call(s: &mut UnixStream, id: u32, bucket: &str, op: KvOp, req: &impl Serialize) {
    send(
        s,
        FrameOp::Kv(op),
        id,
        &kv_frame::encode_call(bucket, req).unwrap(),
    );
}

fn keys(ks: &[&str]) -> KeysRequest {
    KeysRequest {
        keys: ks.iter().map(|k| k.to_string()).collect(),
        ttl_ms: None,
    }
}

#[test]
fn a_frame_connection_is_checked_as_http_requests_are() {
    let server = node(&["mine", "theirs"]);
    // Bytes that are not a frame: an error frame, then the connection ends.
    let mut s = connect(&server, 0);
    s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    assert_eq!(failed(&mut s).status, 400);
    assert!(closed(&mut s));
    // A call before the hello.
    let mut s = connect(&server, 0);
    call(&mut s, 1, "mine", KvOp::Exists, &keys(&["a"]));
    assert_eq!(failed(&mut s).code, "InvalidRequest");
    assert!(closed(&mut s));
    // No token, and a token that expired.
    let mut s = connect(&server, 1);
    hello(&mut s, None);
    assert_eq!(failed(&mut s).code, "AccessDenied");
    assert!(closed(&mut s));
    let mut s = connect(&server, 1);
    let expired = issue(
        &Claims {
            exp: yutu_api::token::unix_now() - 120,
            ..Claims::new("engine", Duration::from_secs(600))
        },
        "f1",
        &SigningKey::Secret(KEY.as_bytes().to_vec()),
    )
    .unwrap();
    hello(&mut s, Some(expired));
    assert_eq!(failed(&mut s).code, "ExpiredToken");
    assert!(closed(&mut s));
    // A body larger than any frame may carry.
    let mut s = connect(&server, 0);
    hello(&mut s, Some(admin()));
    let w: Welcome = ok(&mut s);
    assert_eq!((w.shard, w.shards), (0, 2));
    let mut head = Header {
        op: FrameOp::Kv(KvOp::Exists),
        ok: true,
        id: 9,
        len: 0,
    }
    .encode();
    head[12..16].copy_from_slice(&(MAX_BODY + 1).to_le_bytes());
    s.write_all(&head).unwrap();
    assert_eq!(failed(&mut s).status, 400);
    assert!(closed(&mut s));

    // A call larger than its JSON form may be (only a write carries values).
    let mut s = connect(&server, 0);
    hello(&mut s, Some(admin()));
    let _: Welcome = ok(&mut s);
    let mut head = Header {
        op: FrameOp::Kv(KvOp::Exists),
        ok: true,
        id: 9,
        len: 0,
    }
    .encode();
    head[12..16].copy_from_slice(&((yutu_api::kv::MAX_REQUEST_BYTES as u32) + 1).to_le_bytes());
    s.write_all(&head).unwrap();
    assert_eq!(failed(&mut s).code, "EntityTooLarge");
    assert!(closed(&mut s));

    // A token scoped to one bucket: the other is refused, and the connection goes on.
    let mut s = connect(&server, 1);
    hello(
        &mut s,
        Some(token(&["mine:rwdl"], false, Duration::from_secs(600))),
    );
    let _: Welcome = ok(&mut s);
    call(&mut s, 2, "theirs", KvOp::Exists, &keys(&["a"]));
    assert_eq!(failed(&mut s).code, "AccessDenied");
    call(&mut s, 3, "no such bucket!", KvOp::Exists, &keys(&["a"]));
    assert_eq!(failed(&mut s).code, "InvalidBucketName");
    call(&mut s, 4, "mine", KvOp::Exists, &keys(&[""]));
    assert_eq!(failed(&mut s).status, 400);
    // Inline values: stored if absent, visible over S3, kept when present.
    let write = |if_absent, value: &[u8]| {
        kv_frame::encode_call(
            "mine",
            &WriteRequest {
                blocks: vec![InlineBlock {
                    key: "inline".into(),
                    value: value.to_vec(),
                }],
                if_absent,
            },
        )
        .unwrap()
    };
    send(&mut s, FrameOp::Write, 5, &write(true, b"first"));
    let etags: yutu_api::kv::EtagsResponse = ok(&mut s);
    assert_eq!(etags.etags.len(), 1);
    assert!(!etags.etags[0].is_empty());
    send(&mut s, FrameOp::Write, 6, &write(true, b"second"));
    let kept: yutu_api::kv::EtagsResponse = ok(&mut s);
    assert_eq!(kept.etags, [String::new()], "present: left as it is");
    assert_eq!(
        http(&server, &admin(), "GET", "/mine/inline", b"").body,
        b"first"
    );
    // Two calls in one write, and one call in two writes: each is answered, in order.
    let mut two = kv_frame::frame(
        FrameOp::Kv(KvOp::Exists),
        true,
        7,
        &kv_frame::encode_call("mine", &keys(&["inline"])).unwrap(),
    )
    .unwrap();
    let second = kv_frame::frame(
        FrameOp::Kv(KvOp::Exists),
        true,
        8,
        &kv_frame::encode_call("mine", &keys(&["absent", "inline"])).unwrap(),
    )
    .unwrap();
    two.extend_from_slice(&second);
    s.write_all(&two).unwrap();
    let (h, body) = read_frame(&mut s);
    assert_eq!(h.id, 7);
    let first: ExistsResponse = kv_frame::decode(&body).unwrap();
    assert_eq!(first.exists, [true]);
    let (h, body) = read_frame(&mut s);
    assert_eq!(h.id, 8);
    let answered: ExistsResponse = kv_frame::decode(&body).unwrap();
    assert_eq!(answered.exists, [false, true]);
    let split = kv_frame::frame(
        FrameOp::Kv(KvOp::Exists),
        true,
        10,
        &kv_frame::encode_call("mine", &keys(&["inline"])).unwrap(),
    )
    .unwrap();
    s.write_all(&split[..HEADER_LEN + 3]).unwrap();
    s.flush().unwrap();
    s.write_all(&split[HEADER_LEN + 3..]).unwrap();
    let again: ExistsResponse = ok(&mut s);
    assert_eq!(again.exists, [true]);
}

/// The token is checked on every call, not once per connection: a connection opened with a
/// token that then expires is refused from that moment on.
#[test]
fn a_token_that_expires_stops_working_on_an_open_connection() {
    let server = node(&["mine"]);
    let mut s = connect(&server, 0);
    hello(
        &mut s,
        Some(token(&["mine:rwdl"], false, Duration::from_secs(2))),
    );
    let _: Welcome = ok(&mut s);
    call(&mut s, 1, "mine", KvOp::Exists, &keys(&["a"]));
    let fine: ExistsResponse = ok(&mut s);
    assert_eq!(fine.exists, [false]);
    let mut id = 2;
    let refused = wait_until(Duration::from_secs(20), || {
        id += 1;
        call(&mut s, id, "mine", KvOp::Exists, &keys(&["a"]));
        let (h, body) = read_frame(&mut s);
        !h.ok && kv_frame::decode::<FrameFailure>(&body).unwrap().code == "ExpiredToken"
    });
    assert!(refused, "the expired token still worked");
}
