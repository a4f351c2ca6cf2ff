//! What KV clients and peers send: segment descriptors (binary), transfer frames (tcp
//! requests and proof challenges) and the KV control bodies (JSON). Never panics; a
//! descriptor that decodes encodes back to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use yutu_api::kv::{GetIntoRequest, PeerRequest, PublishRequest, PutFromRequest, PutStartRequest};
use yutu_transfer::transport::tcp::wire::{Frame, REQUEST_LEN};
use yutu_transfer::SegmentDescriptor;

fuzz_target!(|data: &[u8]| {
    if let Some(b) = data.get(..SegmentDescriptor::ENCODED_LEN) {
        if let Ok(d) = SegmentDescriptor::decode(b) {
            assert_eq!(&d.encode()[..], b, "a decoded descriptor re-encodes differently");
        }
    }
    if let Some(b) = data.get(..REQUEST_LEN) {
        let frame: &[u8; REQUEST_LEN] = b.try_into().expect("exact length");
        let _ = Frame::decode(frame);
    }
    let _ = serde_json::from_slice::<PeerRequest>(data);
    if let Ok(r) = serde_json::from_slice::<GetIntoRequest>(data) {
        let n = r.ranges.as_ref().map_or(0, Vec::len) + r.targets.as_ref().map_or(0, Vec::len);
        check_parts(r.parts.as_deref(), n);
    }
    if let Ok(r) = serde_json::from_slice::<PutFromRequest>(data) {
        check_parts(r.parts.as_deref(), r.blocks.len());
    }
    let _ = serde_json::from_slice::<PutStartRequest>(data);
    let _ = serde_json::from_slice::<PublishRequest>(data);
});

/// Grouped spans cover every span once, in order, with no empty group.
fn check_parts(parts: Option<&[u32]>, n: usize) {
    if let Ok(groups) = yutu_api::kv::part_ranges(parts, n) {
        let mut at = 0;
        for g in &groups {
            assert!(g.start == at && g.end > g.start, "groups {groups:?} of {n}");
            at = g.end;
        }
        assert_eq!(at, n);
    }
}
