//! The cluster's shared state and where keys live in it.
//!
//! Nodes of a cluster register in etcd under `/yutu/<cluster>/members/<node>` (a [`Member`],
//! under a lease the node keeps alive) and bucket configuration lives under
//! `/yutu/<cluster>/buckets/<bucket>` (a [`BucketConfig`]). Every node and every client
//! computes a key's owners from the membership alone with [`owners`], so there is no metadata
//! master on the data path.

use serde::{Deserialize, Serialize};

/// Header naming a bucket's replica count at creation (`x-yutu-replicas: 2`).
pub const REPLICAS_HEADER: &str = "x-yutu-replicas";
/// Header on a request one node forwards to another: the sending node's name. Only honoured
/// together with a valid node token ([`NODE_TOKEN_HEADER`]).
pub const FORWARDED_HEADER: &str = "x-yutu-forwarded";
/// Header on a replica write from a key's coordinating owner: store it here, do not forward or
/// replicate it again.
pub const REPLICA_HEADER: &str = "x-yutu-replica";
/// Header on a replica write: the coordinator's metadata of the object (base64 of the JSON
/// record the NVMe tier stores), so every copy has the same ETag, checksum, user metadata
/// and modification time. Only honoured from a node.
pub const REPLICA_META_HEADER: &str = "x-yutu-replica-meta";
/// Header carrying the sending node's bearer token on forwarded requests (the client's own
/// `Authorization` travels unchanged, so the owner checks the client itself).
pub const NODE_TOKEN_HEADER: &str = "x-yutu-node-token";
/// On a replica delete: the delete's version ([`crate::version::Version`], text form), kept
/// as a tombstone by the owner; an object newer than it stays.
pub const VERSION_HEADER: &str = "x-yutu-version";
/// The largest replica count a bucket may ask for.
pub const MAX_REPLICAS: u32 = 7;
/// Path of the membership document every node serves (`GET`, any authenticated caller).
pub const MEMBERSHIP_PATH: &str = "/v1/cluster";

/// etcd key prefix of a cluster's state.
pub fn prefix(cluster: &str) -> String {
    format!("/yutu/{cluster}/")
}

/// etcd key of a member.
pub fn member_key(cluster: &str, node: &str) -> String {
    format!("/yutu/{cluster}/members/{node}")
}

/// etcd key that marks a node as being drained (`yutu admin drain`): placement passes it
/// over, so its keys move to other nodes.
pub fn drain_key(cluster: &str, node: &str) -> String {
    format!("/yutu/{cluster}/drain/{node}")
}

/// etcd key of a bucket's configuration.
pub fn bucket_key(cluster: &str, bucket: &str) -> String {
    format!("/yutu/{cluster}/buckets/{bucket}")
}

/// One live node, as it registers itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// The node's name (`--node-name`), unique in the cluster; placement hashes it.
    pub name: String,
    /// Base URL of its HTTP API (S3, KV control, admin).
    pub url: String,
    /// Its transfer engine's TCP address, for one-sided KV transfers.
    #[serde(default)]
    pub transfer: Option<String>,
    /// Failure-domain label (`--zone`); replicas go to distinct zones when there are several.
    #[serde(default)]
    pub zone: Option<String>,
    /// DRAM capacity in bytes.
    #[serde(default)]
    pub memory: u64,
    /// NVMe capacity in bytes.
    #[serde(default)]
    pub nvme: u64,
    /// Number of shards.
    #[serde(default)]
    pub shards: usize,
    /// When this run of the node started (ms since the Unix epoch).
    #[serde(default)]
    pub started_ms: u64,
    /// Set while the node is being drained: it owns nothing new.
    #[serde(default)]
    pub draining: bool,
    /// Random per data directory: a restart of the same node keeps it, and takes its own
    /// record over at once; another node started under the same name has another, and is
    /// refused instead of replacing the record.
    #[serde(default)]
    pub instance: String,
}

/// A bucket's cluster-wide configuration, fixed at creation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketConfig {
    /// The user who created it.
    pub owner: String,
    /// `memory` or `disk`.
    pub durability: String,
    /// Copies of every object (N).
    pub replicas: u32,
    /// Creation time, ms since the Unix epoch.
    pub created_ms: u64,
    /// Most bytes of objects the bucket may hold, counted once whatever the replica count;
    /// `None`: no quota. Configurations written before quotas existed have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<u64>,
    /// Grants beyond the owner's (PutBucketAcl changes it, the one setting that can change).
    #[serde(default, skip_serializing_if = "crate::acl::Acl::is_empty")]
    pub acl: crate::acl::Acl,
    /// The CORS configuration (PutBucketCors), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cors: Option<crate::cors::CorsConfiguration>,
    /// The bucket policy's text (PutBucketPolicy), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// Its public access block (PutPublicAccessBlock), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_access_block: Option<crate::public_access_block::PublicAccessBlock>,
    /// Its object ownership (PutBucketOwnershipControls), if set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ownership: Option<crate::ownership::ObjectOwnership>,
}

/// etcd key under which a node publishes the bytes it holds per bucket ([`NodeUsage`]),
/// under its lease, so that every node can tell how full a bucket with a quota is.
pub fn usage_key(cluster: &str, node: &str) -> String {
    format!("/yutu/{cluster}/usage/{node}")
}

/// What one node holds, per bucket: bytes of objects in DRAM and on NVMe, every copy it
/// holds counted (a bucket with N replicas is held about N times over the cluster).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeUsage {
    pub buckets: std::collections::BTreeMap<String, u64>,
}

/// The membership document (`GET /v1/cluster`): what a client needs to route itself.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Membership {
    /// The cluster's name; empty for a single node.
    pub cluster: String,
    /// etcd revision the view was read at (0 for a single node); a client refreshes when a
    /// node answers with a newer one.
    pub revision: i64,
    /// The node that answered.
    pub node: String,
    /// Live members, sorted by name.
    pub members: Vec<Member>,
    /// Replica count of each bucket the cluster knows.
    pub buckets: Vec<BucketReplicas>,
    /// Whether the answering node reached etcd within its lease TTL. A node cut off from
    /// etcd asks its peers: if they reach etcd, it is the one partitioned away (and stops
    /// acknowledging writes); if none does, etcd itself is down and the cluster carries on
    /// with the membership it last read.
    #[serde(default)]
    pub etcd_reachable: bool,
}

/// One bucket's replica count, in the membership document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketReplicas {
    pub bucket: String,
    pub replicas: u32,
}

/// The key's position on the hash ring of `bucket`: hashed once per key, then mixed with each
/// node's hash, so choosing owners among M nodes costs one blake3 and M multiplications.
pub fn key_hash(bucket: &str, key: &str) -> u64 {
    let mut h = blake3::Hasher::new();
    h.update(b"yutu-placement-v1");
    h.update(&(bucket.len() as u64).to_le_bytes());
    h.update(bucket.as_bytes());
    h.update(key.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&h.finalize().as_bytes()[..8]);
    u64::from_le_bytes(first)
}

/// A node name's hash.
pub fn node_hash(name: &str) -> u64 {
    let digest = blake3::hash(name.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest.as_bytes()[..8]);
    u64::from_le_bytes(first)
}

/// The rendezvous score of a node for a key: a strong 64-bit mix (SplitMix64's finaliser) of
/// the two hashes, so that scores of different nodes for one key are independent.
pub fn score(key_hash: u64, node_hash: u64) -> u64 {
    let mut z = key_hash ^ node_hash.rotate_left(29);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// What placement needs to know of a node.
pub trait Placeable {
    fn placement_name(&self) -> &str;
    fn placement_zone(&self) -> Option<&str>;
    /// Draining nodes are chosen only when no other node is left.
    fn placement_excluded(&self) -> bool {
        false
    }
}

impl Placeable for Member {
    fn placement_name(&self) -> &str {
        &self.name
    }
    fn placement_zone(&self) -> Option<&str> {
        self.zone.as_deref()
    }
    fn placement_excluded(&self) -> bool {
        self.draining
    }
}

/// Indexes into `nodes` of the owners of (`bucket`, `key`), best first: the `n` nodes with the
/// highest rendezvous scores, taking at most one node per zone while unused zones remain (a
/// node without a zone is a zone of its own). A node joining or leaving changes the owners of
/// only the keys it wins or held, about 1/M of them.
pub fn owners<T: Placeable>(bucket: &str, key: &str, nodes: &[T], n: usize) -> Vec<usize> {
    owners_by_hash(key_hash(bucket, key), nodes, n)
}

/// [`owners`] for a precomputed [`key_hash`].
pub fn owners_by_hash<T: Placeable>(key_hash: u64, nodes: &[T], n: usize) -> Vec<usize> {
    let mut ranked: Vec<(bool, u64, usize)> = nodes
        .iter()
        .enumerate()
        .map(|(i, m)| {
            (
                m.placement_excluded(),
                score(key_hash, node_hash(m.placement_name())),
                i,
            )
        })
        .collect();
    // Not excluded first, then highest score (ties, which need equal names, by index).
    ranked.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
    let n = n.min(nodes.len());
    let mut chosen: Vec<usize> = Vec::with_capacity(n);
    let mut zones: Vec<&str> = Vec::new();
    // First pass: one node per zone (excluded nodes only if nothing else remains).
    for &(_, _, i) in &ranked {
        if chosen.len() == n {
            break;
        }
        match nodes[i].placement_zone() {
            Some(z) if zones.contains(&z) => continue,
            Some(z) => zones.push(z),
            None => {}
        }
        chosen.push(i);
    }
    // Fewer zones than replicas: the rest by score.
    for &(_, _, i) in &ranked {
        if chosen.len() == n {
            break;
        }
        if !chosen.contains(&i) {
            chosen.push(i);
        }
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(n: usize) -> Vec<Member> {
        (0..n)
            .map(|i| Member {
                name: format!("node-{i}"),
                url: format!("http://10.0.0.{i}:9000"),
                transfer: None,
                zone: None,
                memory: 0,
                nvme: 0,
                shards: 1,
                started_ms: 0,
                draining: false,
                instance: String::new(),
            })
            .collect()
    }

    /// The balance docs/operations.md quotes: 100 nodes, 1M keys, max/mean of keys per node, and the
    /// share of keys that move when a 101st node joins.
    #[test]
    fn balance_and_movement_over_100_nodes_and_1m_keys() {
        const KEYS: u64 = 1_000_000;
        let mut members = nodes(100);
        let hashes: Vec<u64> = members.iter().map(|m| node_hash(&m.name)).collect();
        let primary = |k: u64, hashes: &[u64]| -> usize {
            let kh = key_hash("bucket", &format!("key-{k}"));
            let mut best = (0u64, 0usize);
            for (i, &h) in hashes.iter().enumerate() {
                let s = score(kh, h);
                if s >= best.0 {
                    best = (s, i);
                }
            }
            best.1
        };
        let mut counts = vec![0u64; 100];
        let mut before = Vec::with_capacity(KEYS as usize);
        for k in 0..KEYS {
            let p = primary(k, &hashes);
            counts[p] += 1;
            before.push(p);
        }
        let mean = KEYS as f64 / 100.0;
        let max = *counts.iter().max().unwrap_or(&0) as f64;
        let min = *counts.iter().min().unwrap_or(&0) as f64;
        println!(
            "100 nodes, 1M keys: max/mean {:.3}, min/mean {:.3}",
            max / mean,
            min / mean
        );
        assert!(max / mean < 1.1, "max/mean {}", max / mean);
        assert!(min / mean > 0.9, "min/mean {}", min / mean);

        members.push(Member {
            name: "node-100".into(),
            ..members[0].clone()
        });
        let mut hashes = hashes;
        hashes.push(node_hash("node-100"));
        let mut moved = 0u64;
        for k in 0..KEYS {
            let p = primary(k, &hashes);
            if p != before[k as usize] {
                // Keys only ever move to the new node.
                assert_eq!(p, 100);
                moved += 1;
            }
        }
        let share = moved as f64 / KEYS as f64;
        println!(
            "one node joins 100: {:.4} of keys move (1/101 = 0.0099)",
            share
        );
        assert!((0.008..0.012).contains(&share), "moved share {share}");
    }

    #[test]
    fn owners_are_distinct_ordered_and_match_the_primary() {
        let members = nodes(5);
        for k in 0..1000 {
            let key = format!("k{k}");
            let o = owners("b", &key, &members, 3);
            assert_eq!(o.len(), 3);
            assert!(o[0] != o[1] && o[1] != o[2] && o[0] != o[2]);
            // The first two owners are the two best of the three.
            assert_eq!(owners("b", &key, &members, 2), o[..2]);
            assert_eq!(owners("b", &key, &members, 1), o[..1]);
        }
        assert_eq!(owners("b", "k", &members, 9).len(), 5);
        assert!(owners("b", "k", &Vec::<Member>::new(), 2).is_empty());
    }

    #[test]
    fn replicas_go_to_distinct_zones_while_zones_remain() {
        let mut members = nodes(6);
        for (i, m) in members.iter_mut().enumerate() {
            m.zone = Some(format!("z{}", i % 3));
        }
        for k in 0..1000 {
            let o = owners("b", &format!("k{k}"), &members, 3);
            let mut zones: Vec<_> = o.iter().map(|&i| members[i].zone.clone()).collect();
            zones.sort();
            zones.dedup();
            assert_eq!(zones.len(), 3, "owners {o:?}");
            // Four replicas over three zones: the fourth shares a zone.
            assert_eq!(owners("b", &format!("k{k}"), &members, 4).len(), 4);
        }
    }

    #[test]
    fn draining_nodes_own_nothing_while_others_remain() {
        let mut members = nodes(3);
        members[1].draining = true;
        for k in 0..500 {
            let o = owners("b", &format!("k{k}"), &members, 2);
            assert!(!o.contains(&1), "{o:?}");
            // With three replicas the draining node is the last resort.
            assert_eq!(owners("b", &format!("k{k}"), &members, 3)[2], 1);
        }
    }

    #[test]
    fn removing_a_node_moves_only_its_keys() {
        let members = nodes(10);
        let fewer: Vec<Member> = members
            .iter()
            .filter(|m| m.name != "node-3")
            .cloned()
            .collect();
        for k in 0..2000 {
            let key = format!("k{k}");
            let a = owners("b", &key, &members, 2);
            let b = owners("b", &key, &fewer, 2);
            let names = |o: &[usize], m: &[Member]| -> Vec<String> {
                o.iter().map(|&i| m[i].name.clone()).collect()
            };
            let (a, b) = (names(&a, &members), names(&b, &fewer));
            if !a.contains(&"node-3".to_string()) {
                assert_eq!(a, b);
            } else {
                // The surviving owner stays an owner.
                let survivor = a.iter().find(|n| *n != "node-3").cloned();
                assert!(b.contains(&survivor.unwrap_or_default()));
            }
        }
    }
}
