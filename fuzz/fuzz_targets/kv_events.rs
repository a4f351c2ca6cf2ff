//! What nodes send the conductor: KV event batches and snapshots (JSON), and their
//! validation. Never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use yutu_api::events::{KvEventBatch, KvSnapshot};
use yutu_api::route::{InstanceRegistration, LoadReport, NodeRegistration, RouteRequest};

fuzz_target!(|data: &[u8]| {
    if let Ok(b) = serde_json::from_slice::<KvEventBatch>(data) {
        let _ = b.validate();
    }
    if let Ok(s) = serde_json::from_slice::<KvSnapshot>(data) {
        let _ = s.validate();
    }
    let _ = serde_json::from_slice::<RouteRequest>(data);
    let _ = serde_json::from_slice::<NodeRegistration>(data);
    let _ = serde_json::from_slice::<InstanceRegistration>(data);
    let _ = serde_json::from_slice::<LoadReport>(data);
});
