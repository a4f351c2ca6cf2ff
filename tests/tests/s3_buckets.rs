//! Bucket operations against the real server.

use yutu_tests::{xml, Server};

#[test]
fn bucket_lifecycle_and_errors() {
    let server = Server::start(&["--memory", "64MiB"]);
    let c = server.client();

    // ListBuckets on an empty node.
    let r = c.get("/");
    assert_eq!(r.status, 200);
    assert!(r.text().contains("<ListAllMyBucketsResult"), "{}", r.text());
    assert!(xml::values(&r.text(), "Name").is_empty());

    // Create, then see it everywhere.
    let r = c.put("/alpha", b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("location"), Some("/alpha"));
    c.mb("beta.bucket-2");
    let names = xml::values(&c.get("/").text(), "Name");
    assert_eq!(names, ["alpha", "beta.bucket-2"]);
    assert_eq!(c.head("/alpha").status, 200);

    // Creating it again: 200, as S3 answers in us-east-1; nothing changes.
    assert_eq!(c.put("/alpha/kept", b"v").status, 200);
    let r = c.put("/alpha", b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(c.get("/alpha/kept").body, b"v");
    assert_eq!(c.delete("/alpha/kept").status, 204);
    // With --bucket-exists-conflict, 409 as S3 answers in other regions.
    let strict = Server::start(&["--memory", "64MiB", "--bucket-exists-conflict"]);
    strict.client().mb("alpha");
    let r = strict.client().put("/alpha", b"");
    assert_eq!(
        (r.status, r.code().as_deref()),
        (409, Some("BucketAlreadyOwnedByYou"))
    );

    // A CreateBucketConfiguration body is accepted.
    let cfg = br#"<CreateBucketConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><LocationConstraint>eu-west-1</LocationConstraint></CreateBucketConfiguration>"#;
    assert_eq!(c.put("/gamma", cfg).status, 200);

    // Not empty: refuse, keep the object.
    assert_eq!(c.put("/alpha/k", b"v").status, 200);
    let r = c.delete("/alpha");
    assert_eq!(
        (r.status, r.code().as_deref()),
        (409, Some("BucketNotEmpty"))
    );
    assert_eq!(c.get("/alpha/k").body, b"v");
    // A failed delete leaves the bucket writable.
    assert_eq!(c.put("/alpha/k2", b"v2").status, 200);

    // Empty it and delete it.
    assert_eq!(c.delete("/alpha/k").status, 204);
    assert_eq!(c.delete("/alpha/k2").status, 204);
    assert_eq!(c.delete("/alpha").status, 204);
    assert_eq!(c.head("/alpha").status, 404);
    let r = c.delete("/alpha");
    assert_eq!((r.status, r.code().as_deref()), (404, Some("NoSuchBucket")));
    let r = c.get("/alpha?list-type=2");
    assert_eq!((r.status, r.code().as_deref()), (404, Some("NoSuchBucket")));
    let r = c.put("/alpha/k", b"v");
    assert_eq!((r.status, r.code().as_deref()), (404, Some("NoSuchBucket")));
    let r = c.get("/alpha/k");
    assert_eq!((r.status, r.code().as_deref()), (404, Some("NoSuchBucket")));
    // It can be created again.
    c.mb("alpha");
    assert_eq!(c.head("/alpha").status, 200);
}

#[test]
fn invalid_bucket_names_are_refused() {
    let server = Server::start(&["--memory", "64MiB"]);
    let c = server.client();
    for name in [
        "ab",
        "Upper",
        "under_score",
        "-dash",
        "dash-",
        "a..b",
        "10.0.0.1",
        "xn--abc",
        "metrics",
        "health",
    ] {
        let r = c.put(&format!("/{name}"), b"");
        assert_eq!(
            (r.status, r.code().as_deref()),
            (400, Some("InvalidBucketName")),
            "{name}: {}",
            r.text()
        );
    }
    let long = "a".repeat(64);
    let r = c.put(&format!("/{long}"), b"");
    assert_eq!(r.code().as_deref(), Some("InvalidBucketName"));
    assert!(xml::values(&c.get("/").text(), "Name").is_empty());
}

#[test]
fn location_and_unsupported_subresources() {
    let server = Server::start(&["--memory", "64MiB"]);
    let c = server.client();
    c.mb("loc");
    let r = c.get("/loc?location");
    assert_eq!(r.status, 200);
    assert!(r.text().contains("LocationConstraint"), "{}", r.text());
    for q in [
        "/loc?website",
        "/loc?versioning",
        "/loc?lifecycle",
        "/loc/k?tagging",
    ] {
        let r = c.get(q);
        assert_eq!(
            (r.status, r.code().as_deref()),
            (501, Some("NotImplemented")),
            "{q}"
        );
    }
    let r = c.send("POST", "/loc?delete", &[], Some(b"<Delete/>"));
    assert_eq!((r.status, r.code().as_deref()), (400, Some("MalformedXML")));
    let r = c.send("POST", "/loc?restore", &[], Some(b""));
    assert_eq!(
        (r.status, r.code().as_deref()),
        (501, Some("NotImplemented"))
    );
}
