//! Mooncake master's read-only query endpoints (`/get_all_segments`, `/query_key`,
//! `/batch_query_keys`) on a node: status, content type and exact body of each answer, the
//! misses and the refusals, the `bucket=` parameter, permissions, and a cluster's copies.

use serde_json::Value;
use yutu_api::kv::MAX_BATCH;
use yutu_api::mooncake_master::{JSON_CONTENT_TYPE, SEGMENTS_CONTENT_TYPE};
use yutu_client::kv::{KvClient, KvOptions};
use yutu_tests::cluster::TestCluster;
use yutu_tests::users::{alice, bob, node_with_users, send_as, signed};
use yutu_tests::{Reply, Server};

const MISS: &str = r#"{"success":false,"error_code":-704,"error_message":"OBJECT_NOT_FOUND"}"#;
const NO_KEYS: &str = r#"{"success":false,"error":"No keys provided. Use ?keys=key1,key2,..."}"#;

/// The node's transfer-engine address, as `/v1/kv/engine` reports it.
fn transfer_address(reply: &Reply) -> String {
    assert_eq!(reply.status, 200, "{}", reply.text());
    let v: Value = serde_json::from_slice(&reply.body).expect("json");
    v["tcp"].as_str().expect("a tcp address").to_string()
}

/// One copy of `size` bytes on `endpoint`, as Mooncake writes it.
fn copy(size: usize, endpoint: &str) -> String {
    format!(
        r#"{{"size_":{size},"buffer_address_":0,"protocol_":"tcp","transport_endpoint_":"{endpoint}"}}"#
    )
}

fn assert_json(r: &Reply, status: u16, body: &str) {
    assert_eq!((r.status, r.text().as_str()), (status, body));
    assert_eq!(r.header("content-type"), Some(JSON_CONTENT_TYPE));
}

#[test]
fn a_node_answers_as_a_mooncake_master() {
    let server = Server::start(&["--shards", "2"]);
    let c = server.client();
    let me = transfer_address(&c.get("/v1/kv/engine"));

    // The node alone is the one segment.
    let r = c.get("/get_all_segments");
    assert_eq!((r.status, r.text()), (200, format!("{me}\n")));
    assert_eq!(r.header("content-type"), Some(SEGMENTS_CONTENT_TYPE));

    // No `default` bucket yet: every key is a miss.
    assert_json(&c.get("/query_key?key=k1"), 404, MISS);

    // Objects through S3 in the default bucket, and a block through the KV API in another.
    c.mb("default");
    assert_eq!(c.put("/default/k1", &[7u8; 4096]).status, 200);
    assert_eq!(c.put("/default/k2", b"hello").status, 200);
    assert_eq!(c.put("/default/a%20b/c", b"").status, 200);
    c.mb("kvbucket");
    let kv = KvClient::new(&server.url, KvOptions::default()).expect("kv client");
    let buf = kv.register(1 << 20).expect("buffer");
    buf.write_at(0, &[1u8; 1000]).expect("stage");
    kv.batch_put_from("kvbucket", &["block".to_string()], &buf, &[0], &[1000])
        .expect("put");

    // query_key: found, with the key plain or percent-encoded; a miss.
    let found = format!(r#"{{"success":true,"data":[{}]}}"#, copy(4096, &me));
    assert_json(&c.get("/query_key?key=k1"), 200, &found);
    assert_json(&c.get("/query_key?key=%6B1"), 200, &found);
    let empty = format!(r#"{{"success":true,"data":[{}]}}"#, copy(0, &me));
    assert_json(&c.get("/query_key?key=a%20b/c"), 200, &empty);
    assert_json(&c.get("/query_key?key=nope"), 404, MISS);
    // A key no bucket may hold, or none at all.
    let invalid = r#"{"success":false,"error_code":-400,"error_message":"INVALID_KEY"}"#;
    assert_json(&c.get("/query_key"), 404, invalid);
    assert_json(
        &c.get(&format!("/query_key?key={}", "x".repeat(2000))),
        404,
        invalid,
    );

    // batch_query_keys: sorted, repeats collapsed, misses per key; the keys URL-decoded.
    let r = c.get("/batch_query_keys?keys=k2,nope,k1,k2");
    let expected = format!(
        r#"{{"success":true,"data":{{"k1":{{"ok":true,"values":[{}]}},"k2":{{"ok":true,"values":[{}]}},"nope":{{"ok":false,"error":"OBJECT_NOT_FOUND"}}}}}}"#,
        copy(4096, &me),
        copy(5, &me)
    );
    assert_json(&r, 200, &expected);
    assert_json(
        &c.get("/batch_query_keys?keys=k2%2Cnope,k1,k2"),
        200,
        &expected,
    );
    // The 400s: no keys, empty keys, too many.
    assert_json(&c.get("/batch_query_keys"), 400, NO_KEYS);
    assert_json(&c.get("/batch_query_keys?keys="), 400, NO_KEYS);
    assert_json(&c.get("/batch_query_keys?keys=,,"), 400, NO_KEYS);
    let many: Vec<String> = (0..=MAX_BATCH).map(|i| format!("k{i}")).collect();
    let r = c.get(&format!("/batch_query_keys?keys={}", many.join(",")));
    assert_eq!(r.status, 400, "{}", r.text());
    let v: Value = serde_json::from_slice(&r.body).expect("json");
    assert_eq!(v["success"], false);
    assert!(v["error"].as_str().unwrap().contains("at most"), "{v}");

    // bucket=: the KV block is found in its bucket only; a missing bucket misses; a name
    // no bucket can have is refused as S3 does.
    let block = format!(r#"{{"success":true,"data":[{}]}}"#, copy(1000, &me));
    assert_json(&c.get("/query_key?key=block&bucket=kvbucket"), 200, &block);
    assert_json(&c.get("/query_key?key=block"), 404, MISS);
    assert_json(&c.get("/query_key?key=block&bucket=default"), 404, MISS);
    assert_json(&c.get("/query_key?key=k1&bucket=no-such-bucket"), 404, MISS);
    assert_json(
        &c.get("/batch_query_keys?keys=block,k1&bucket=kvbucket"),
        200,
        &format!(
            r#"{{"success":true,"data":{{"block":{{"ok":true,"values":[{}]}},"k1":{{"ok":false,"error":"OBJECT_NOT_FOUND"}}}}}}"#,
            copy(1000, &me)
        ),
    );
    assert_json(
        &c.get("/batch_query_keys?keys=k1&bucket=no-such-bucket"),
        200,
        r#"{"success":true,"data":{"k1":{"ok":false,"error":"OBJECT_NOT_FOUND"}}}"#,
    );
    let r = c.get("/query_key?key=k1&bucket=Not_A_Bucket");
    assert_eq!(
        (r.status, r.code().as_deref()),
        (400, Some("InvalidBucketName"))
    );

    // Only GET of exactly these paths is Mooncake's; the rest is S3, where they are not
    // bucket names.
    let r = c.put("/query_key", b"");
    assert_eq!(
        (r.status, r.code().as_deref()),
        (400, Some("InvalidBucketName")),
        "{}",
        r.text()
    );
    let r = c.get("/get_all_segments/x");
    assert!(r.status >= 400 && r.code().is_some(), "{}", r.text());
    // Counted under their own operation.
    assert!(
        server
            .client()
            .get("/metrics")
            .text()
            .contains("op=\"MooncakeMaster\""),
        "no MooncakeMaster metrics"
    );
}

/// A signed GET of `path?query` as `who`.
fn get_as(server: &Server, who: &yutu_client::Credentials, path: &str, query: &str) -> Reply {
    let headers = signed(server, who, "GET", path, query, b"");
    let refs: Vec<(&str, &str)> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let target = if query.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{query}")
    };
    server.client().send("GET", &target, &refs, None)
}

#[test]
fn key_queries_are_allowed_as_reading_the_bucket_is() {
    let server = node_with_users(&["--memory", "64MiB"]);
    assert_eq!(
        send_as(&server, &alice(), "PUT", "/default", b"").status,
        200
    );
    assert_eq!(
        send_as(&server, &alice(), "PUT", "/default/k", b"kv").status,
        200
    );
    assert_eq!(
        send_as(&server, &alice(), "PUT", "/shared", b"").status,
        200
    );
    let c = server.client();
    let me = transfer_address(&send_as(&server, &alice(), "GET", "/v1/kv/engine", b""));
    let found = format!(r#"{{"success":true,"data":[{}]}}"#, copy(2, &me));

    // The owner may; another user without a grant and an anonymous caller may not.
    assert_json(
        &get_as(&server, &alice(), "/query_key", "key=k"),
        200,
        &found,
    );
    let r = get_as(&server, &bob(), "/query_key", "key=k");
    assert_eq!((r.status, r.code().as_deref()), (403, Some("AccessDenied")));
    let r = get_as(&server, &bob(), "/batch_query_keys", "keys=k");
    assert_eq!((r.status, r.code().as_deref()), (403, Some("AccessDenied")));
    let r = c.get("/query_key?key=k");
    assert_eq!((r.status, r.code().as_deref()), (403, Some("AccessDenied")));
    let r = c.get("/batch_query_keys?keys=k&bucket=shared");
    assert_eq!((r.status, r.code().as_deref()), (403, Some("AccessDenied")));
    // A bucket ACL opens listing, not reading: still refused to anonymous callers.
    let acl = signed(&server, &alice(), "PUT", "/shared", "acl", b"");
    let mut h: Vec<(&str, &str)> = acl.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    h.push(("x-amz-acl", "public-read"));
    assert_eq!(c.send("PUT", "/shared?acl", &h, Some(b"")).status, 200);
    let r = c.get("/query_key?key=k&bucket=shared");
    assert_eq!((r.status, r.code().as_deref()), (403, Some("AccessDenied")));

    // The segments: any caller with credentials, as `GET /v1/cluster`.
    let r = get_as(&server, &bob(), "/get_all_segments", "");
    assert_eq!((r.status, r.text()), (200, format!("{me}\n")));
    let r = c.get("/get_all_segments");
    assert_eq!((r.status, r.code().as_deref()), (403, Some("AccessDenied")));
}

#[test]
fn a_cluster_reports_every_member_and_each_keys_owners() {
    let c = TestCluster::start(3, &[]);
    let auth = format!("Bearer {}", TestCluster::admin_token());
    let h = [("authorization", auth.as_str())];
    let r = c.node(0).client().send(
        "PUT",
        "/default",
        &[h[0], ("x-yutu-replicas", "2")],
        Some(b""),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let members = c.membership(0).expect("membership").members;
    let transfer: Vec<String> = members
        .iter()
        .map(|m| m.transfer.clone().expect("a transfer address"))
        .collect();
    let all: String = transfer.iter().map(|t| format!("{t}\n")).collect();
    for i in 0..3 {
        let r = c
            .node(i)
            .client()
            .send("GET", "/get_all_segments", &h, None);
        assert_eq!((r.status, r.text()), (200, all.clone()), "node{i}");
    }
    let keys: Vec<String> = (0..6).map(|k| format!("key-{k}")).collect();
    for (k, key) in keys.iter().enumerate() {
        let body = vec![k as u8; 100 + k];
        let r = c
            .node(k % 3)
            .client()
            .send("PUT", &format!("/default/{key}"), &h, Some(&body));
        assert_eq!(r.status, 200, "{}", r.text());
    }
    for (k, key) in keys.iter().enumerate() {
        let mut holders: Vec<String> = c
            .holders(&format!("/default/{key}"))
            .into_iter()
            .map(|i| transfer[i].clone())
            .collect();
        holders.sort();
        assert_eq!(holders.len(), 2, "{key}");
        // Every node, owner or not, reports both copies.
        for i in 0..3 {
            let r = c
                .node(i)
                .client()
                .send("GET", &format!("/query_key?key={key}"), &h, None);
            assert_eq!(r.status, 200, "node{i} {key}: {}", r.text());
            let v: Value = serde_json::from_slice(&r.body).expect("json");
            let mut at: Vec<String> = v["data"]
                .as_array()
                .expect("data")
                .iter()
                .map(|d| {
                    assert_eq!(d["size_"], 100 + k);
                    d["transport_endpoint_"].as_str().unwrap().to_string()
                })
                .collect();
            at.sort();
            assert_eq!(at, holders, "node{i} {key}");
        }
    }
    let r = c.node(1).client().send(
        "GET",
        &format!("/batch_query_keys?keys={},nope", keys.join(",")),
        &h,
        None,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v: Value = serde_json::from_slice(&r.body).expect("json");
    for key in &keys {
        assert_eq!(
            v["data"][key]["values"].as_array().map(Vec::len),
            Some(2),
            "{v}"
        );
    }
    assert_eq!(v["data"]["nope"]["error"], "OBJECT_NOT_FOUND");
    let r = c
        .node(2)
        .client()
        .send("GET", "/query_key?key=nope", &h, None);
    assert_eq!((r.status, r.text().as_str()), (404, MISS));

    // With node2 gone (still a member until its lease ends): a key is still found on its
    // other owner; a missing key node2 owns is RPC_FAIL, not a miss; one it does not own is
    // a miss.
    let mut c = c;
    c.kill(2);
    let owns =
        |key: &str, i: usize| yutu_api::cluster::owners("default", key, &members, 2).contains(&i);
    let held = keys.iter().find(|k| owns(k, 2)).expect("node2 owns a key");
    let r = c
        .node(0)
        .client()
        .send("GET", &format!("/query_key?key={held}"), &h, None);
    assert_eq!(r.status, 200, "{}", r.text());
    let v: Value = serde_json::from_slice(&r.body).expect("json");
    assert_eq!(v["data"].as_array().map(Vec::len), Some(1), "{v}");
    let lost = (0..)
        .map(|n| format!("absent-{n}"))
        .find(|k| owns(k, 2))
        .unwrap();
    let free = (0..)
        .map(|n| format!("absent-{n}"))
        .find(|k| !owns(k, 2))
        .unwrap();
    let r = c
        .node(0)
        .client()
        .send("GET", &format!("/query_key?key={lost}"), &h, None);
    assert_eq!(
        (r.status, r.text().as_str()),
        (
            404,
            r#"{"success":false,"error_code":-900,"error_message":"RPC_FAIL"}"#
        )
    );
    let r = c
        .node(0)
        .client()
        .send("GET", &format!("/query_key?key={free}"), &h, None);
    assert_eq!((r.status, r.text().as_str()), (404, MISS));
    let r = c.node(1).client().send(
        "GET",
        &format!("/batch_query_keys?keys={lost},{free}"),
        &h,
        None,
    );
    let v: Value = serde_json::from_slice(&r.body).expect("json");
    assert_eq!(v["data"][&lost]["error"], "RPC_FAIL", "{v}");
    assert_eq!(v["data"][&free]["error"], "OBJECT_NOT_FOUND", "{v}");
}
