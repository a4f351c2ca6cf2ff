//! Bucket names, object keys and sizes: never panic, and what is accepted obeys the rules.
#![no_main]

use libfuzzer_sys::fuzz_target;
use yutu_api::{parse_size, validate_bucket_name, validate_object_key, MAX_KEY_LEN};

fuzz_target!(|s: &str| {
    if validate_bucket_name(s).is_ok() {
        assert!((3..=63).contains(&s.len()));
        assert!(s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-'));
        assert!(!s.contains(".."));
    }
    if validate_object_key(s).is_ok() {
        assert!(!s.is_empty() && s.len() <= MAX_KEY_LEN);
    }
    let _ = parse_size(s);
    let _ = yutu_api::placement::shard_for(s, s, 7);
});
