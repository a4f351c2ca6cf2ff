//! The node publishes KV events (blocks stored, removed, cleared) to a conductor, numbered
//! consecutively per epoch, and serves the snapshot the conductor resyncs from.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use yutu_tests::server::wait_until;
use yutu_tests::Server;

/// Every request the fake conductor received: path and JSON body.
type Seen = Arc<Mutex<Vec<(String, Value)>>>;

/// A stand-in conductor that records every POST body by path and answers 200.
fn fake_conductor() -> (String, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let sink = sink.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut stream = stream;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
                    let mut len = 0;
                    loop {
                        let mut h = String::new();
                        reader.read_line(&mut h).unwrap();
                        if h == "\r\n" || h.is_empty() {
                            break;
                        }
                        if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                            len = v.trim().parse().unwrap();
                        }
                    }
                    let mut body = vec![0; len];
                    reader.read_exact(&mut body).unwrap();
                    if let Ok(v) = serde_json::from_slice(&body) {
                        sink.lock().unwrap().push((path, v));
                    }
                    let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}");
                }
            });
        }
    });
    (url, seen)
}

fn block(i: u8) -> String {
    hex_block(&[i; 32])
}

fn hex_block(bytes: &[u8; 32]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn events_are_published_in_order_and_snapshot_matches() {
    let (url, seen) = fake_conductor();
    let server = Server::start(&[
        "--memory",
        "64MiB",
        "--shards",
        "2",
        "--conductor",
        &url,
        "--node-name",
        "node-a",
    ]);
    let c = server.client();
    c.mb("llama");
    for i in 0..20 {
        assert_eq!(
            c.put(&format!("/llama/{}", block(i)), &[i; 100]).status,
            200
        );
    }
    c.put("/llama/not-a-block", b"plain object");
    c.delete(&format!("/llama/{}", block(3)));

    // Registration, then every event, consecutively numbered from 1 in one epoch.
    let all_events = || -> Vec<Value> {
        seen.lock()
            .unwrap()
            .iter()
            .filter(|(p, _)| p == "/v1/events")
            .flat_map(|(_, b)| b["events"].as_array().cloned().unwrap_or_default())
            .collect()
    };
    assert!(
        wait_until(Duration::from_secs(20), || {
            let blocks: usize = all_events()
                .iter()
                .map(|e| {
                    e["kind"]
                        .as_object()
                        .and_then(|k| k.values().next())
                        .and_then(|v| v["blocks"].as_array())
                        .map_or(0, |b| b.len())
                })
                .sum();
            blocks >= 21
        }),
        "events did not arrive: {:?}",
        seen.lock().unwrap()
    );
    let log = seen.lock().unwrap().clone();
    assert_eq!(log[0].0, "/v1/nodes");
    assert_eq!(log[0].1["node"], "node-a");
    assert_eq!(log[0].1["url"], server.url);
    let events = all_events();
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["seq"], (i + 1) as u64, "{events:?}");
    }
    let epochs: Vec<&Value> = log
        .iter()
        .filter(|(p, _)| p == "/v1/events")
        .map(|(_, b)| &b["epoch"])
        .collect();
    assert!(epochs.windows(2).all(|w| w[0] == w[1]));
    let stored: Vec<String> = events
        .iter()
        .filter_map(|e| e["kind"]["stored"]["blocks"].as_array())
        .flatten()
        .map(|b| b.as_str().unwrap().to_string())
        .collect();
    assert_eq!(stored.len(), 20, "the plain object made no event");
    let removed: Vec<String> = events
        .iter()
        .filter_map(|e| e["kind"]["removed"]["blocks"].as_array())
        .flatten()
        .map(|b| b.as_str().unwrap().to_string())
        .collect();
    assert_eq!(removed, [block(3)]);

    // The snapshot: every block but the removed one, at the latest sequence number.
    let snap: Value = serde_json::from_slice(&c.get("/admin/v1/kv/snapshot").body).unwrap();
    assert_eq!(snap["node"], "node-a");
    assert_eq!(snap["epoch"], *epochs[0]);
    assert_eq!(snap["seq"], events.len() as u64);
    let mut held: Vec<String> = snap["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| {
            assert_eq!(g["bucket"], "llama");
            assert_eq!(g["tier"], "dram");
            g["blocks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b.as_str().unwrap().to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    held.sort();
    let mut want: Vec<String> = (0..20).filter(|i| *i != 3).map(block).collect();
    want.sort();
    assert_eq!(held, want);

    // Deleting the bucket clears it.
    for i in (0..20).filter(|i| *i != 3) {
        c.delete(&format!("/llama/{}", block(i)));
    }
    c.delete("/llama/not-a-block");
    assert_eq!(c.delete("/llama").status, 204);
    assert!(wait_until(Duration::from_secs(20), || all_events()
        .iter()
        .any(|e| e["kind"]["cleared"]["bucket"] == "llama")));
}
