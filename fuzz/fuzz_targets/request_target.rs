//! Request targets as the server splits them into bucket, key and query: never panics, and
//! a bucket or key it accepts is never empty. Each target is then parsed into its endpoint
//! under every method, with and without a copy source and a form body: never panics, and an
//! S3 endpoint names the bucket and key of its target.
#![no_main]

use libfuzzer_sys::fuzz_target;
use yutu_server::http::endpoint::Endpoint;
use yutu_server::http::target::Target;

fuzz_target!(|s: &str| {
    let Ok(uri) = s.parse::<http::Uri>() else {
        return;
    };
    if let Ok(t) = Target::parse(&uri) {
        if let Some(b) = &t.bucket {
            assert!(!b.is_empty());
        }
        if let Some(k) = &t.key {
            assert!(!k.is_empty());
        }
        let _ = t.unsupported_subresource();
        let _ = t.param("prefix");
        let mut headers = http::HeaderMap::new();
        for round in 0..3 {
            if round == 1 {
                headers.insert("x-amz-copy-source", http::HeaderValue::from_static("/a/b"));
            }
            if round == 2 {
                headers.insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("multipart/form-data; boundary=x"),
                );
            }
            for method in [
                http::Method::GET,
                http::Method::HEAD,
                http::Method::PUT,
                http::Method::POST,
                http::Method::DELETE,
                http::Method::OPTIONS,
                http::Method::PATCH,
            ] {
                match Endpoint::parse(&method, &t, &headers) {
                    Ok(Endpoint::Bucket { bucket, .. }) => {
                        assert_eq!(Some(&bucket), t.bucket.as_ref());
                        assert!(t.key.is_none());
                    }
                    Ok(Endpoint::Object { bucket, key, .. }) => {
                        assert_eq!(Some(&bucket), t.bucket.as_ref());
                        assert_eq!(Some(&key), t.key.as_ref());
                    }
                    Ok(e) => {
                        let _ = (e.op(), e.needs_credentials());
                    }
                    Err(_) => {}
                }
            }
        }
    }
});
