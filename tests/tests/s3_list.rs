//! ListObjectsV2 and ListObjects (v1) against the real server, with keys spread over shards.

use yutu_tests::{xml, Client, Server};

fn list(c: &Client, query: &str) -> String {
    let r = c.get(&format!("/list?{query}"));
    assert_eq!(r.status, 200, "{query}: {}", r.text());
    r.text()
}

fn keys(doc: &str) -> Vec<String> {
    xml::values(doc, "Contents")
        .iter()
        .flat_map(|c| xml::values(c, "Key"))
        .collect()
}

fn prefixes(doc: &str) -> Vec<String> {
    xml::values(doc, "CommonPrefixes")
        .iter()
        .flat_map(|c| xml::values(c, "Prefix"))
        .collect()
}

fn setup() -> (Server, Vec<String>) {
    let server = Server::start(&["--memory", "64MiB", "--shards", "2"]);
    let c = server.client();
    c.mb("list");
    let mut all = Vec::new();
    for d in ["docs", "img", "logs"] {
        for i in 0..40 {
            all.push(format!("{d}/{i:03}.txt"));
        }
    }
    for i in 0..30 {
        all.push(format!("top-{i:02}"));
    }
    all.push("logs/2026/01/a".into());
    for k in &all {
        assert_eq!(c.put(&format!("/list/{k}"), k.as_bytes()).status, 200);
    }
    all.sort();
    (server, all)
}

#[test]
fn v2_pagination_prefix_delimiter() {
    let (server, all) = setup();
    let c = server.client();

    // Everything, in one page.
    let doc = list(&c, "list-type=2");
    assert_eq!(keys(&doc), all);
    assert_eq!(xml::values(&doc, "KeyCount"), [all.len().to_string()]);
    assert_eq!(xml::values(&doc, "IsTruncated"), ["false"]);
    assert!(doc.contains("<Size>"), "{doc}");
    assert!(
        doc.contains("<ETag>&quot;") || doc.contains("<ETag>\""),
        "{doc}"
    );

    // Small pages with continuation tokens: complete, in order, no duplicates.
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    let mut pages = 0;
    loop {
        let q = match &token {
            Some(t) => format!("list-type=2&max-keys=7&continuation-token={t}"),
            None => "list-type=2&max-keys=7".to_string(),
        };
        let doc = list(&c, &q);
        let page = keys(&doc);
        assert!(page.len() <= 7);
        assert_eq!(xml::values(&doc, "KeyCount"), [page.len().to_string()]);
        seen.extend(page);
        pages += 1;
        if xml::values(&doc, "IsTruncated") == ["true"] {
            token = Some(xml::values(&doc, "NextContinuationToken").remove(0));
        } else {
            assert!(xml::values(&doc, "NextContinuationToken").is_empty());
            break;
        }
        assert!(pages < 100, "pagination does not end");
    }
    assert_eq!(seen, all);

    // Prefix.
    let doc = list(&c, "list-type=2&prefix=img/");
    let expect: Vec<String> = all
        .iter()
        .filter(|k| k.starts_with("img/"))
        .cloned()
        .collect();
    assert_eq!(keys(&doc), expect);

    // Delimiter: common prefixes roll up whole directories.
    let doc = list(&c, "list-type=2&delimiter=/");
    assert_eq!(prefixes(&doc), ["docs/", "img/", "logs/"]);
    let tops: Vec<String> = all.iter().filter(|k| !k.contains('/')).cloned().collect();
    assert_eq!(keys(&doc), tops);
    assert_eq!(
        xml::values(&doc, "KeyCount"),
        [(tops.len() + 3).to_string()]
    );

    // Delimiter with paging: prefixes count against max-keys and are not repeated.
    let mut entries = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let q = match &token {
            Some(t) => format!("list-type=2&delimiter=/&max-keys=2&continuation-token={t}"),
            None => "list-type=2&delimiter=/&max-keys=2".into(),
        };
        let doc = list(&c, &q);
        let mut page: Vec<String> = prefixes(&doc);
        page.extend(keys(&doc));
        assert!(page.len() <= 2, "{doc}");
        entries.extend(page);
        if xml::values(&doc, "IsTruncated") == ["true"] {
            token = Some(xml::values(&doc, "NextContinuationToken").remove(0));
        } else {
            break;
        }
    }
    entries.sort();
    let mut want: Vec<String> = vec!["docs/".into(), "img/".into(), "logs/".into()];
    want.extend(tops);
    want.sort();
    assert_eq!(entries, want);

    // Prefix plus delimiter one level down.
    let doc = list(&c, "list-type=2&prefix=logs/&delimiter=/");
    assert_eq!(prefixes(&doc), ["logs/2026/"]);
    assert_eq!(keys(&doc).len(), 40);

    // start-after.
    let doc = list(&c, "list-type=2&start-after=top-27");
    assert_eq!(keys(&doc), ["top-28", "top-29"]);

    // max-keys=0.
    let doc = list(&c, "list-type=2&max-keys=0");
    assert!(keys(&doc).is_empty());
    assert_eq!(xml::values(&doc, "IsTruncated"), ["false"]);

    // encoding-type=url.
    c.put("/list/sp%20ace", b"x");
    let doc = list(&c, "list-type=2&prefix=sp&encoding-type=url");
    assert_eq!(keys(&doc), ["sp%20ace"]);
    assert_eq!(xml::values(&doc, "EncodingType"), ["url"]);
}

#[test]
fn v1_marker_and_bad_parameters() {
    let (server, all) = setup();
    let c = server.client();
    let doc = list(&c, "max-keys=5");
    assert_eq!(keys(&doc), all[..5]);
    assert_eq!(xml::values(&doc, "IsTruncated"), ["true"]);
    let doc = list(&c, &format!("marker={}&max-keys=1000", all[4]));
    assert_eq!(keys(&doc), all[5..]);
    let doc = list(&c, "delimiter=/&max-keys=2");
    assert_eq!(xml::values(&doc, "NextMarker"), ["img/"]);

    for q in [
        "max-keys=-1",
        "max-keys=abc",
        "list-type=3",
        "encoding-type=xml",
        "list-type=2&continuation-token=zz",
    ] {
        let r = c.get(&format!("/list?{q}"));
        assert_eq!(
            (r.status, r.code().as_deref()),
            (400, Some("InvalidArgument")),
            "{q}"
        );
    }
}
