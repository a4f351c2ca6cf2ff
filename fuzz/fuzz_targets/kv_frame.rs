//! What a KV frame connection reads, on either end: frame headers, call bodies split into
//! bucket and request, every request and answer body. Never panics; a header that decodes
//! encodes back to the same bytes, and a request that decodes re-encodes to one that decodes
//! to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use yutu_api::kv::{
    CopiedResponse, EtagsResponse, ExistsResponse, GetIntoRequest, GetResponse, KeysRequest,
    PublishRequest, PublishResponse, PutFromRequest, PutIdsRequest, PutStartRequest,
    PutStartResponse, ReleaseRequest,
};
use yutu_api::kv_frame::{
    decode, encode, split_call, FrameFailure, FramesInfo, Header, Hello, PresenceGrant,
    PresenceRequest, ReadRequest, ReadResponse, Welcome, WriteRequest, HEADER_LEN,
};

fuzz_target!(|data: &[u8]| {
    if let Some(b) = data.get(..HEADER_LEN) {
        let head: &[u8; HEADER_LEN] = b.try_into().expect("exact length");
        if let Ok(h) = Header::decode(head) {
            assert_eq!(&h.encode(), head, "a decoded header re-encodes differently");
        }
    }
    let body = data.get(HEADER_LEN.min(data.len())..).unwrap_or_default();
    if let Ok((_bucket, request)) = split_call(body) {
        round_trip::<KeysRequest>(request);
        round_trip::<PutStartRequest>(request);
        round_trip::<PutIdsRequest>(request);
        round_trip::<PublishRequest>(request);
        round_trip::<GetIntoRequest>(request);
        round_trip::<PutFromRequest>(request);
        round_trip::<ReadRequest>(request);
        round_trip::<WriteRequest>(request);
        round_trip::<PresenceRequest>(request);
    }
    round_trip::<Hello>(body);
    round_trip::<ReleaseRequest>(body);
    let _ = decode::<Welcome>(body);
    let _ = decode::<FrameFailure>(body);
    let _ = decode::<FramesInfo>(body);
    let _ = decode::<ReadResponse>(body);
    let _ = decode::<ExistsResponse>(body);
    let _ = decode::<EtagsResponse>(body);
    let _ = decode::<GetResponse>(body);
    let _ = decode::<CopiedResponse>(body);
    let _ = decode::<PutStartResponse>(body);
    let _ = decode::<PublishResponse>(body);
    let _ = decode::<PresenceGrant>(body);
    presence_table(body);
});

/// Bytes as a presence table a client maps: opening it checks the header against the length,
/// and a lookup in whatever it holds ends (every probe is bounded) without a panic; so does a
/// read from the value mirror the header names.
fn presence_table(raw: &[u8]) {
    use std::sync::atomic::AtomicU64;
    use yutu_api::presence::{fingerprint, Table};
    let words: Vec<AtomicU64> = raw
        .chunks_exact(8)
        .map(|c| AtomicU64::new(u64::from_le_bytes(c.try_into().expect("8 bytes"))))
        .collect();
    if let Ok(t) = Table::open(&words) {
        let _ = t.lookup(fingerprint(&[0u8; 32], "key"));
        let _ = t.count();
    }
    // The value mirror its header may name: placed within the mapping or refused, and a
    // read never answers more than a slot holds.
    if let Ok(Some(m)) = yutu_api::mirror::Mirror::named(&words) {
        let mut out = Vec::new();
        for key in ["key", "other", ""] {
            let _ = m.read(fingerprint(&[0u8; 32], key), &mut out);
            assert!(out.len() <= m.value_max());
        }
    }
}

fn round_trip<T>(raw: &[u8])
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    if let Ok(v) = decode::<T>(raw) {
        let again = encode(&v).expect("a decoded value encodes");
        assert_eq!(decode::<T>(&again).expect("re-encoded value decodes"), v);
    }
}
