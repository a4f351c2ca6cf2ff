//! Request targets as the server splits them into bucket, key and query: never panics, and
//! a bucket or key it accepts is never empty.
#![no_main]

use libfuzzer_sys::fuzz_target;
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
    }
});
