//! `aws-chunked` upload framing, unsigned and with chunk signatures: never panics, and what
//! decodes is never longer than what was sent.
#![no_main]

use libfuzzer_sys::fuzz_target;
use yutu_api::sigv4::Scope;
use yutu_server::auth::chunked::{decode, ChunkSigner};

fuzz_target!(|data: &[u8]| {
    if let Ok(d) = decode(data, None) {
        assert!(d.data.len() <= data.len());
    }
    let signer = ChunkSigner {
        key: [7; 32],
        amz_date: "20261124T000000Z".into(),
        scope: Scope::new("20261124", "us-east-1", "s3"),
        previous: "0".repeat(64),
    };
    let _ = decode(data, Some(signer));
});
