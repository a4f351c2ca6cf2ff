//! Parallel clients: no torn objects, no lost writes.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use yutu_tests::{etag_of, xml, Server};

/// An object every byte of which is `fill`, of a length that also depends on `fill`, so that a
/// mix of two versions is detectable from the bytes alone.
fn version(fill: u8) -> Vec<u8> {
    vec![fill; 200_000 + fill as usize * 997]
}

#[test]
fn parallel_puts_and_gets_of_one_key_never_tear() {
    let server = Server::start(&["--memory", "256MiB", "--shards", "2"]);
    let c = server.client();
    c.mb("race");
    assert_eq!(c.put("/race/hot", &version(1)).status, 200);
    let stop = Arc::new(AtomicBool::new(false));

    let writers: Vec<_> = (0..3u8)
        .map(|w| {
            let c = c.clone();
            std::thread::spawn(move || {
                for i in 0..40u8 {
                    let fill = 2 + w * 50 + (i % 50);
                    let r = c.put("/race/hot", &version(fill));
                    assert_eq!(r.status, 200, "{}", r.text());
                }
            })
        })
        .collect();
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let c = c.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut checked = 0u32;
                while !stop.load(Ordering::Relaxed) || checked < 20 {
                    let r = c.get("/race/hot");
                    assert_eq!(r.status, 200);
                    let fill = r.body[0];
                    assert!(
                        r.body == version(fill),
                        "torn read: {} bytes starting with {fill}",
                        r.body.len()
                    );
                    assert_eq!(r.header("etag"), Some(etag_of(&r.body).as_str()));
                    checked += 1;
                }
                checked
            })
        })
        .collect();
    for w in writers {
        w.join().expect("writer");
    }
    stop.store(true, Ordering::Relaxed);
    let reads: u32 = readers.into_iter().map(|r| r.join().expect("reader")).sum();
    assert!(reads >= 60);
    // The final object is one whole version.
    let last = c.get("/race/hot").body;
    assert!(last == version(last[0]));
}

#[test]
fn parallel_puts_of_distinct_keys_all_land() {
    let server = Server::start(&["--memory", "256MiB", "--shards", "2"]);
    let c = server.client();
    c.mb("many");
    let threads = 8;
    let per = 60;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let c = c.clone();
            std::thread::spawn(move || {
                for i in 0..per {
                    let key = format!("t{t}/k{i:03}");
                    let r = c.put(&format!("/many/{key}"), key.as_bytes());
                    assert_eq!(r.status, 200, "{key}: {}", r.text());
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("writer");
    }
    let mut listed = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let q = match &token {
            Some(t) => format!("/many?list-type=2&max-keys=100&continuation-token={t}"),
            None => "/many?list-type=2&max-keys=100".into(),
        };
        let doc = c.get(&q).text();
        listed.extend(xml::values(&doc, "Key"));
        match xml::values(&doc, "NextContinuationToken").pop() {
            Some(t) => token = Some(t),
            None => break,
        }
    }
    let expected: BTreeSet<String> = (0..threads)
        .flat_map(|t| (0..per).map(move |i| format!("t{t}/k{i:03}")))
        .collect();
    assert_eq!(
        listed.len(),
        expected.len(),
        "duplicates or losses in the listing"
    );
    assert_eq!(listed.iter().cloned().collect::<BTreeSet<_>>(), expected);
    assert!(listed.windows(2).all(|w| w[0] < w[1]), "listing is sorted");
    for key in expected.iter().step_by(37) {
        assert_eq!(c.get(&format!("/many/{key}")).text(), *key);
    }
    // Both shards took part: keys are spread and forwarded between shards.
    assert!(server.metric_sum("yutu_objects") as usize == expected.len());
}
