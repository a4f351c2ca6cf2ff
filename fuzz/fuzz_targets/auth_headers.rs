//! Request authentication from hostile heads: SigV4 and SigV2 `Authorization` headers,
//! presigned query strings, bearer tokens and `x-amz-*` headers, as the node reads them.
//! The input is a request head: `METHOD URI` then `name: value` lines. Never panics, and no
//! forged request is ever let in as a user or token holder (nothing here knows the user's
//! secret or the token key): at most it is anonymous.
#![no_main]

use std::sync::Arc;

use http::{HeaderMap, HeaderName, HeaderValue, Method, Uri};
use libfuzzer_sys::fuzz_target;
use yutu_server::auth::authenticate::authenticate;
use yutu_server::auth::sigv2::canonical_resources;
use yutu_server::auth::sigv4::parse_authorization;
use yutu_server::auth::tokens::TokenVerifier;
use yutu_server::auth::Identity;
use yutu_server::config::{Flags, Settings, User};

fn settings() -> Settings {
    let mut s = Settings::resolve(Flags {
        shards: Some(1),
        ..Flags::default()
    })
    .expect("default settings");
    s.users = vec![Arc::new(User {
        name: "fuzz".into(),
        access_key: "AKIDFUZZ".into(),
        secret_key: "a secret nobody sends".into(),
        admin: true,
        read: vec![],
        write: vec![],
    })];
    s.keyring
        .add_secret("k", b"a token key nobody signs with, 32+ bytes")
        .expect("key");
    s
}

fuzz_target!(|s: &str| {
    let mut lines = s.lines();
    let Some(first) = lines.next() else { return };
    let (method, uri) = first.split_once(' ').unwrap_or((first, "/"));
    let (Ok(method), Ok(uri)) = (method.parse::<Method>(), uri.parse::<Uri>()) else {
        return;
    };
    let mut headers = HeaderMap::new();
    for line in lines {
        let _ = parse_authorization(line);
        if let Some((name, value)) = line.split_once(':') {
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(name.trim().as_bytes()),
                HeaderValue::from_str(value.trim()),
            ) {
                headers.append(n, v);
            }
        }
    }
    let _ = canonical_resources(uri.path(), None, uri.query());
    let _ = canonical_resources(uri.path(), Some("bucket"), uri.query());
    thread_local! {
        static SETTINGS: (Settings, TokenVerifier) = {
            let s = settings();
            let v = TokenVerifier::new(s.keyring.clone());
            (s, v)
        };
    }
    SETTINGS.with(|(settings, tokens)| {
        // Without credentials a request is anonymous (what ACLs allow everyone); anything
        // else would be a forged request let in as someone.
        if let Ok(auth) = authenticate(settings, tokens, &method, &uri, &headers, None) {
            assert!(
                matches!(auth.identity, Identity::Anonymous),
                "a forged request was authenticated as {:?}",
                auth.identity
            );
        }
        let _ = authenticate(settings, tokens, &method, &uri, &headers, Some("bucket"));
    });
});
