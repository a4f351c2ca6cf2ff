//! `Range` header parsing: never panics, and a resolved range always lies inside the object.
#![no_main]

use libfuzzer_sys::fuzz_target;
use yutu_api::parse_range;

fuzz_target!(|input: (&str, u64)| {
    let (header, size) = input;
    if let Some(spec) = parse_range(header) {
        if let Some(r) = spec.resolve(size) {
            assert!(r.start < r.end, "{header:?} on {size}: empty range {r:?}");
            assert!(r.end <= size, "{header:?} on {size}: past the end {r:?}");
            let cr = r.content_range(size);
            assert!(cr.starts_with("bytes "));
        }
    }
});
