//! What crosses the cluster's wires: etcd's answers (range, lease, transaction, the watch
//! stream cut into chunks) and the view built from a range, the membership document clients
//! route by (and placement over it), the nodes' usage records, the admin API's requests, a
//! replica's metadata header, write versions and anti-entropy's versions pages (with the
//! merge of shards' parts). None of it may panic, whatever the bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use yutu_api::admin::{
    DrainRequest, EvictRequest, LocalListEntry, LocalListRequest, PinRequest, ReplicateRequest,
    VersionEntry, VersionsPage, VersionsRequest,
};
use yutu_api::version::Version;
use yutu_api::cluster::{owners, BucketConfig, Member, Membership, NodeUsage};
use yutu_server::cluster::{agent, etcd, replica, sync};

fuzz_target!(|data: &[u8]| {
    if let Ok(answer) = etcd::parse_range(data) {
        let view = agent::build_view("/yutu/c/", answer.revision, answer.kvs);
        for b in view.buckets.keys() {
            let _ = view.owners(b, "key");
            let _ = view.held_elsewhere("n1", b);
        }
    }
    // The watch stream, in two chunks cut where the first byte says.
    let cut = data.first().map_or(0, |b| usize::from(*b).min(data.len()));
    let mut decoder = yutu_etcd::WatchDecoder::new(1 << 12);
    if decoder.push(&data[..cut]).is_ok() {
        let _ = decoder.push(&data[cut..]);
    }
    let _ = yutu_etcd::parse_keep_alive(data);
    let _ = yutu_etcd::parse_grant(data);
    let _ = yutu_etcd::parse_txn(data);
    if let Ok(m) = serde_json::from_slice::<Membership>(data) {
        let n = data.first().copied().unwrap_or(0) as usize;
        let o = owners("b", "k", &m.members, n);
        assert!(o.len() <= n.min(m.members.len()));
        let mut seen = o.clone();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), o.len(), "an owner twice");
    }
    let _ = serde_json::from_slice::<Member>(data);
    let _ = serde_json::from_slice::<BucketConfig>(data);
    let _ = serde_json::from_slice::<NodeUsage>(data);
    let _ = serde_json::from_slice::<EvictRequest>(data);
    let _ = serde_json::from_slice::<PinRequest>(data);
    let _ = serde_json::from_slice::<ReplicateRequest>(data);
    let _ = serde_json::from_slice::<DrainRequest>(data);
    let _ = serde_json::from_slice::<LocalListRequest>(data);
    let _ = serde_json::from_slice::<Vec<LocalListEntry>>(data);
    let _ = serde_json::from_slice::<VersionsRequest>(data);
    let _ = serde_json::from_slice::<VersionsPage>(data);
    if let Ok(parts) = serde_json::from_slice::<Vec<(Vec<VersionEntry>, Option<String>)>>(data) {
        let bounds: Vec<Option<String>> = parts.iter().map(|(_, b)| b.clone()).collect();
        let page = sync::merge_pages(parts);
        // A page never reaches past the smallest bound a shard gave, and stays in key order.
        if let Some(next) = &page.next {
            assert!(page.entries.iter().all(|e| &e.key <= next));
            assert!(bounds.iter().flatten().all(|b| next <= b));
        }
        assert!(page.entries.windows(2).all(|w| w[0].key <= w[1].key));
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = replica::decode_meta(text, data.len() as u64);
        if let Some(v) = Version::parse(text) {
            assert_eq!(Version::parse(&v.to_text()), Some(v));
        }
    }
});
