//! The client against a scripted server: what goes on the wire, and how answers are read.

mod common;

use std::io::Read;

use common::{object_headers, FakeServer, Resp};
use yutu_client::{Client, ClientError};

fn s3_code(e: ClientError) -> (u16, String) {
    match e {
        ClientError::S3 { status, code, .. } => (status, code),
        other => panic!("expected an S3 error, got {other:?}"),
    }
}

#[test]
fn list_buckets_reads_the_document() {
    let server = FakeServer::start(|_| {
        Resp::new(200).xml(
            r#"<?xml version="1.0" encoding="UTF-8"?><ListAllMyBucketsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Owner><ID>y</ID><DisplayName>y</DisplayName></Owner><Buckets><Bucket><Name>a</Name><CreationDate>2026-01-01T00:00:00.000Z</CreationDate></Bucket></Buckets></ListAllMyBucketsResult>"#,
        )
    });
    let client = Client::new(&server.url).unwrap();
    let buckets = client.list_buckets().unwrap();
    assert_eq!(buckets.len(), 1);
    assert_eq!(buckets[0].name, "a");
    let reqs = server.requests();
    assert_eq!(
        (reqs[0].method.as_str(), reqs[0].target.as_str()),
        ("GET", "/")
    );
}

#[test]
fn error_bodies_become_s3_errors() {
    let server = FakeServer::start(|_| Resp::s3_error(409, "BucketNotEmpty", "not empty"));
    let client = Client::new(&server.url).unwrap();
    match client.delete_bucket("b").unwrap_err() {
        ClientError::S3 {
            status,
            code,
            message,
        } => assert_eq!(
            (status, code.as_str(), message.as_str()),
            (409, "BucketNotEmpty", "not empty")
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(server.requests()[0].method, "DELETE");
    assert_eq!(server.requests()[0].target, "/b");
}

#[test]
fn head_404s_are_named_by_resource() {
    // Bucket "b" exists and holds nothing; no other bucket exists.
    let server = FakeServer::start(|r| {
        if r.path() == "/b" {
            Resp::new(200)
        } else {
            Resp::new(404)
        }
    });
    let client = Client::new(&server.url).unwrap();
    assert!(client.head_bucket("b").unwrap());
    assert!(!client.head_bucket("c").unwrap());
    assert_eq!(
        s3_code(client.head_object("b", "k").unwrap_err()),
        (404, "NoSuchKey".into())
    );
    assert_eq!(
        s3_code(client.head_object("c", "k").unwrap_err()),
        (404, "NoSuchBucket".into())
    );
    assert!(!client.object_exists("c", "k").unwrap());
    let before = server.requests().len();
    assert!(!client.object_exists("b", "k").unwrap());
    assert_eq!(
        server.requests().len(),
        before + 1,
        "object_exists is one request"
    );
}

#[test]
fn head_error_code_header_is_trusted() {
    let server = FakeServer::start(|_| Resp::new(404).header("x-amz-error-code", "NoSuchBucket"));
    let client = Client::new(&server.url).unwrap();
    assert_eq!(
        s3_code(client.head_object("b", "k").unwrap_err()),
        (404, "NoSuchBucket".into())
    );
    assert_eq!(server.requests().len(), 1);
}

#[test]
fn head_bucket_true_and_other_errors() {
    let server = FakeServer::start(|r| {
        if r.path() == "/ok" {
            Resp::new(200)
        } else {
            Resp::new(403)
        }
    });
    let client = Client::new(&server.url).unwrap();
    assert!(client.head_bucket("ok").unwrap());
    assert_eq!(
        s3_code(client.head_bucket("no").unwrap_err()),
        (403, "AccessDenied".into())
    );
}

#[test]
fn head_object_reads_metadata() {
    let server = FakeServer::start(|_| {
        object_headers(Resp::new(200), "abc")
            .header("content-type", "text/plain")
            .content_length(12_345_678_901)
    });
    let client = Client::new(&server.url).unwrap();
    let info = client.head_object("b", "dir/a b").unwrap();
    assert_eq!(info.size, 12_345_678_901);
    assert_eq!(info.etag, "abc");
    let reqs = server.requests();
    assert_eq!(reqs[0].method, "HEAD");
    assert_eq!(reqs[0].target, "/b/dir/a%20b");
}

#[test]
fn put_streams_the_body_with_its_length() {
    let server = FakeServer::start(|_| Resp::new(200).header("etag", "\"e1\""));
    let client = Client::new(&server.url).unwrap();
    let put = client
        .put_object("b", "k+1", &b"hello"[..], 5, Some("text/plain"))
        .unwrap();
    assert_eq!(put.etag, "e1");
    let req = &server.requests()[0];
    assert_eq!(req.method, "PUT");
    assert_eq!(req.target, "/b/k%2B1");
    assert_eq!(req.body, b"hello");
    assert_eq!(req.header("content-length"), Some("5"));
    assert_eq!(req.header("content-type"), Some("text/plain"));
    assert_eq!(req.header("expect"), None);
    assert_eq!(req.header("transfer-encoding"), None);
}

#[test]
fn big_puts_ask_before_sending() {
    let server = FakeServer::start(|_| Resp::new(200).header("etag", "\"e\""));
    let client = Client::new(&server.url).unwrap();
    let data = vec![7u8; 3 << 20];
    client.put_bytes("b", "big", &data).unwrap();
    let req = &server.requests()[0];
    assert_eq!(req.header("expect"), Some("100-continue"));
    assert_eq!(req.body.len(), data.len());
}

#[test]
fn refused_big_put_reports_the_s3_error() {
    let server = FakeServer::start(|_| {
        Resp::s3_error(404, "NoSuchBucket", "The specified bucket does not exist.").early()
    });
    let client = Client::new(&server.url).unwrap();
    let data = vec![0u8; 8 << 20];
    let err = client.put_bytes("nope", "k", &data).unwrap_err();
    assert_eq!(s3_code(err), (404, "NoSuchBucket".into()));
}

#[test]
fn short_upload_source_fails() {
    let server = FakeServer::start(|_| Resp::new(200).header("etag", "\"e\""));
    let client = Client::new(&server.url).unwrap();
    let err = client
        .put_object("b", "k", &b"abc"[..], 10, None)
        .unwrap_err();
    assert!(
        matches!(&err, ClientError::Io(_) | ClientError::Transport(_)),
        "{err:?}"
    );
}

#[test]
fn empty_key_never_reaches_the_bucket() {
    let server = FakeServer::start(|_| Resp::new(204));
    let client = Client::new(&server.url).unwrap();
    assert!(matches!(
        client.delete_object("b", ""),
        Err(ClientError::InvalidArgument(_))
    ));
    assert!(server.requests().is_empty());
}

#[test]
fn large_gets_are_not_truncated() {
    // Above ureq's 10 MB default for read_to_vec.
    const LEN: usize = 24 << 20;
    let server = FakeServer::start(|_| {
        object_headers(Resp::new(200), "big").body((0..LEN).map(|i| i as u8).collect::<Vec<_>>())
    });
    let client = Client::new(&server.url).unwrap();
    let data = client.get_bytes("b", "big").unwrap();
    assert_eq!(data.len(), LEN);
    assert!(data.iter().enumerate().all(|(i, b)| *b == i as u8));
}

#[test]
fn ranged_get_reports_the_part_and_the_whole() {
    let server = FakeServer::start(|r| {
        assert_eq!(r.header("range"), Some("bytes=2-5"));
        object_headers(Resp::new(206), "e")
            .header("content-range", "bytes 2-5/10")
            .body("2345")
    });
    let client = Client::new(&server.url).unwrap();
    let mut obj = client.get_object("b", "k", Some((2, Some(5)))).unwrap();
    assert_eq!(obj.range, Some((2, 5)));
    assert_eq!(obj.content_length, 4);
    assert_eq!(obj.info.size, 10);
    let mut s = String::new();
    obj.read_to_string(&mut s).unwrap();
    assert_eq!(s, "2345");
}

#[test]
fn get_of_missing_key() {
    let server = FakeServer::start(|_| {
        Resp::s3_error(404, "NoSuchKey", "The specified key does not exist.")
    });
    let client = Client::new(&server.url).unwrap();
    assert_eq!(
        s3_code(client.get_object("b", "k", None).unwrap_err()),
        (404, "NoSuchKey".into())
    );
}

fn page(keys: &[&str], token: Option<&str>) -> String {
    let mut xml = String::from("<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Name>b</Name><Prefix>p/</Prefix>");
    xml.push_str(&format!(
        "<KeyCount>{}</KeyCount><MaxKeys>2</MaxKeys>",
        keys.len()
    ));
    xml.push_str(&format!("<IsTruncated>{}</IsTruncated>", token.is_some()));
    for k in keys {
        xml.push_str(&format!("<Contents><Key>{k}</Key><LastModified>2026-01-01T00:00:00.000Z</LastModified><ETag>\"e\"</ETag><Size>1</Size><StorageClass>STANDARD</StorageClass></Contents>"));
    }
    if let Some(t) = token {
        xml.push_str(&format!(
            "<NextContinuationToken>{t}</NextContinuationToken>"
        ));
    }
    xml.push_str("</ListBucketResult>");
    xml
}

#[test]
fn list_all_follows_continuation_tokens() {
    let server = FakeServer::start(|r| {
        assert_eq!(r.param("list-type").as_deref(), Some("2"));
        assert_eq!(r.param("prefix").as_deref(), Some("p/"));
        match r.param("continuation-token").as_deref() {
            None => Resp::new(200).xml(&page(&["p/a", "p/b"], Some("t 1/+"))),
            Some("t 1/+") => Resp::new(200).xml(&page(&["p/c"], None)),
            Some(other) => panic!("unexpected token {other}"),
        }
    });
    let client = Client::new(&server.url).unwrap();
    let all = client.list_all("b", Some("p/"), None).unwrap();
    let keys: Vec<_> = all.objects.iter().map(|o| o.key.as_str()).collect();
    assert_eq!(keys, ["p/a", "p/b", "p/c"]);
    assert_eq!(server.requests().len(), 2);
}

#[test]
fn truncated_listing_without_token_stops() {
    let server = FakeServer::start(|_| {
        Resp::new(200).xml("<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>")
    });
    let client = Client::new(&server.url).unwrap();
    let mut pages = client.list_pages("b", None, None);
    assert!(matches!(
        pages.next(),
        Some(Err(ClientError::InvalidResponse(_)))
    ));
    assert!(pages.next().is_none());
}

#[test]
fn list_objects_v2_sends_every_parameter() {
    let server = FakeServer::start(|_| Resp::new(200).xml(&page(&[], None)));
    let client = Client::new(&server.url).unwrap();
    client
        .list_objects_v2("b", Some("a&b"), Some("/"), Some(7), Some("tok"), Some("s"))
        .unwrap();
    let req = &server.requests()[0];
    assert_eq!(req.path(), "/b");
    let q = req.query();
    for (k, v) in [
        ("list-type", "2"),
        ("prefix", "a&b"),
        ("delimiter", "/"),
        ("max-keys", "7"),
        ("continuation-token", "tok"),
        ("start-after", "s"),
    ] {
        assert!(
            q.contains(&(k.to_string(), v.to_string())),
            "{k} missing in {q:?}"
        );
    }
}

#[test]
fn unreachable_server_is_a_transport_error() {
    // Bind and drop to get a port that refuses connections.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let client = Client::new(&format!("http://127.0.0.1:{port}")).unwrap();
    assert!(matches!(
        client.list_buckets(),
        Err(ClientError::Transport(_) | ClientError::Io(_))
    ));
}
