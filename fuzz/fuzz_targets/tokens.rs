//! Bearer tokens and their scopes as the node and the conductor read them: never panics,
//! and nothing not signed by a configured key verifies.
#![no_main]

use libfuzzer_sys::fuzz_target;
use yutu_api::token::{Access, BucketScope, ConductorScope, KeyAlgorithm, Keyring};

const ED_PUBLIC: &[u8] = b"-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAEZHe7zDBeUqKmipw0O6R6zOmSPcmXSWJ3mWu60xsEKU=\n-----END PUBLIC KEY-----\n";

fuzz_target!(|s: &str| {
    thread_local! {
        static RING: Keyring = {
            let mut k = Keyring::default();
            k.add_secret("hs", b"a token key nobody signs with, 32+ bytes").expect("key");
            k.add_public_pem("ed", KeyAlgorithm::EdDSA, ED_PUBLIC).expect("key");
            k
        };
    }
    RING.with(|ring| {
        if let Ok(claims) = ring.verify(s) {
            panic!("a forged token verified: {claims:?}");
        }
    });
    if let Ok(scope) = BucketScope::parse(s) {
        let _ = scope.matches(s);
    }
    if let Ok(a) = Access::parse(s) {
        assert_eq!(Access::parse(&a.to_string()), Ok(a));
    }
    let _ = ConductorScope::parse(s);
    let _ = yutu_api::token::parse_local_secret(s);
});
