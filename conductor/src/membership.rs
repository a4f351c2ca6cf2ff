//! The storage nodes of a cluster, as etcd lists them, and what changed between two reads.
//!
//! Each node of a cluster keeps a [`Member`] under `/yutu/<cluster>/members/<name>`, attached
//! to a lease: the key goes when the node stops (lease revoked) or dies (lease expired), and a
//! node that starts again writes it anew with a new `started_ms`. The conductor reads the
//! whole prefix every few hundred milliseconds and compares it with the previous read
//! ([`Roster::diff`]):
//!
//! - a member not in the previous read has **joined** (for the first time, or back after
//!   leaving): it is registered with its URL, and resynced if the conductor had dropped what
//!   it held;
//! - a member whose `started_ms` changed has **restarted** without its key ever going away (it
//!   came back within its old lease's TTL): what its previous run held in DRAM is gone;
//! - a member missing from a complete read has **left**: what it held is no longer routed to.
//!
//! A read that fails changes nothing: an etcd outage must not empty the conductor's view, so
//! it keeps routing on the last membership it read. Parsing and diffing do no I/O, so they
//! are tested here; [`crate::service`] does the reading.

use std::collections::BTreeMap;

use yutu_api::cluster::Member;
use yutu_api::events::validate_node_name;

use crate::etcd::KeyValue;
use crate::registry::validate_node_url;

/// The etcd prefix of a cluster's members.
pub fn members_prefix(cluster: &str) -> String {
    let mut p = yutu_api::cluster::member_key(cluster, "");
    if !p.ends_with('/') {
        p.push('/');
    }
    p
}

/// Why a key under the members prefix was not taken as a member.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemberError {
    #[error("key {0:?} is not under the members prefix")]
    Foreign(String),
    #[error("member {key:?} is not a member document: {message}")]
    Json { key: String, message: String },
    #[error("member {key:?} names itself {name:?}")]
    NameMismatch { key: String, name: String },
    #[error("member {0:?}: the name must be 1 to 128 printable ASCII characters without spaces")]
    BadName(String),
    #[error("member {key:?}: the URL must be http(s)://host:port, got {url:?}")]
    BadUrl { key: String, url: String },
}

impl MemberError {
    /// The etcd key the problem is about (to report each bad key once).
    pub fn key(&self) -> &str {
        match self {
            MemberError::Foreign(k) | MemberError::BadName(k) => k,
            MemberError::Json { key, .. }
            | MemberError::NameMismatch { key, .. }
            | MemberError::BadUrl { key, .. } => key,
        }
    }
}

/// The members in a read of the members prefix, sorted by name, and the keys that are not
/// usable members (a node of another version, a hand-written key): those are skipped rather
/// than failing the whole read, so that one bad key cannot hide the rest of the cluster.
pub fn parse_members(cluster: &str, kvs: &[KeyValue]) -> (Vec<Member>, Vec<MemberError>) {
    let prefix = members_prefix(cluster);
    let mut members = Vec::with_capacity(kvs.len());
    let mut problems = Vec::new();
    for kv in kvs {
        let key = String::from_utf8_lossy(&kv.key);
        match parse_member(&prefix, &key, &kv.value) {
            Ok(m) => members.push(m),
            Err(e) => problems.push(e),
        }
    }
    members.sort_by(|a, b| a.name.cmp(&b.name));
    members.dedup_by(|a, b| a.name == b.name);
    (members, problems)
}

fn parse_member(prefix: &str, key: &str, value: &[u8]) -> Result<Member, MemberError> {
    let short = || key.chars().take(200).collect::<String>();
    let name = key
        .strip_prefix(prefix)
        .ok_or_else(|| MemberError::Foreign(short()))?;
    let mut member: Member = serde_json::from_slice(value).map_err(|e| MemberError::Json {
        key: short(),
        message: e.to_string(),
    })?;
    if member.name != name {
        return Err(MemberError::NameMismatch {
            key: short(),
            name: member.name.chars().take(200).collect(),
        });
    }
    validate_node_name(name).map_err(|_| MemberError::BadName(short()))?;
    validate_node_url(&member.url).map_err(|_| MemberError::BadUrl {
        key: short(),
        url: member.url.chars().take(200).collect(),
    })?;
    member.url = member.url.trim_end_matches('/').to_owned();
    Ok(member)
}

/// What one member did between two reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Not in the previous read.
    Joined(Member),
    /// In both, with a different `started_ms`: a new run of the node.
    Restarted { member: Member, previous_ms: u64 },
    /// In both, same run, another URL.
    Moved(Member),
    /// In the previous read, not in this (complete) one.
    Left(String),
}

/// What the last read listed: name -> (URL, `started_ms`).
#[derive(Debug, Clone, Default)]
pub struct Roster {
    members: BTreeMap<String, (String, u64)>,
    /// The etcd revision of the last read applied; 0 before the first.
    revision: i64,
}

impl Roster {
    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.members.contains_key(name)
    }

    pub fn revision(&self) -> i64 {
        self.revision
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.members.keys().map(String::as_str)
    }

    /// The changes from the last read to `members` (read at `revision`), and records them.
    /// `complete` is false when the read was cut at its limit: members missing from it may
    /// well still be there, so none is taken to have left.
    ///
    /// Reads are not ordered by revision: they are linearizable (etcd's default), so no
    /// endpoint serves an older state than one already read, and an etcd rebuilt from scratch
    /// starts its revisions over, which must not freeze the view.
    pub fn update(&mut self, revision: i64, members: &[Member], complete: bool) -> Vec<Change> {
        self.revision = revision;
        let mut changes = Vec::new();
        for m in members {
            match self.members.get(&m.name) {
                None => changes.push(Change::Joined(m.clone())),
                Some((_, started)) if *started != m.started_ms => changes.push(Change::Restarted {
                    member: m.clone(),
                    previous_ms: *started,
                }),
                Some((url, _)) if *url != m.url => changes.push(Change::Moved(m.clone())),
                Some(_) => {}
            }
        }
        if complete {
            let present: std::collections::HashSet<&str> =
                members.iter().map(|m| m.name.as_str()).collect();
            for name in self.members.keys() {
                if !present.contains(name.as_str()) {
                    changes.push(Change::Left(name.clone()));
                }
            }
        }
        for c in &changes {
            match c {
                Change::Joined(m) | Change::Restarted { member: m, .. } | Change::Moved(m) => {
                    self.members
                        .insert(m.name.clone(), (m.url.clone(), m.started_ms));
                }
                Change::Left(name) => {
                    self.members.remove(name);
                }
            }
        }
        changes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(name: &str, port: u16, started_ms: u64) -> Member {
        Member {
            name: name.into(),
            url: format!("http://127.0.0.1:{port}"),
            transfer: None,
            zone: None,
            memory: 1 << 30,
            nvme: 0,
            shards: 2,
            started_ms,
            draining: false,
            instance: String::new(),
        }
    }

    fn kv(key: &str, value: &[u8]) -> KeyValue {
        KeyValue {
            key: key.as_bytes().to_vec(),
            value: value.to_vec(),
        }
    }

    fn json(m: &Member) -> Vec<u8> {
        serde_json::to_vec(m).expect("serializes")
    }

    #[test]
    fn the_prefix_is_the_nodes_key_without_a_name() {
        assert_eq!(members_prefix("yutu"), "/yutu/yutu/members/");
        assert_eq!(
            format!("{}node0", members_prefix("c1")),
            yutu_api::cluster::member_key("c1", "node0")
        );
    }

    #[test]
    fn good_members_are_kept_and_bad_keys_reported() {
        let a = member("node-a", 1, 10);
        let mut slash = member("node-b", 2, 20);
        slash.url.push('/');
        let kvs = vec![
            kv("/yutu/c/members/node-b", &json(&slash)),
            kv("/yutu/c/members/node-a", &json(&a)),
            kv("/yutu/c/members/node-x", b"{not json"),
            kv("/yutu/c/members/node-y", &json(&member("node-z", 3, 1))),
            kv("/yutu/c/members/bad name", &json(&member("bad name", 3, 1))),
            kv("/yutu/c/members/node-u", &{
                let mut m = member("node-u", 4, 1);
                m.url = "ftp://x".into();
                json(&m)
            }),
            kv("/yutu/other/members/node-a", &json(&a)),
            // An older node's document without the optional fields still reads.
            kv(
                "/yutu/c/members/node-c",
                br#"{"name":"node-c","url":"https://10.0.0.3:9000"}"#,
            ),
        ];
        let (members, problems) = parse_members("c", &kvs);
        let names: Vec<&str> = members.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["node-a", "node-b", "node-c"]);
        assert_eq!(
            members[1].url, "http://127.0.0.1:2",
            "trailing slash dropped"
        );
        assert_eq!(members[2].started_ms, 0);
        assert!(matches!(problems[0], MemberError::Json { .. }));
        assert!(matches!(problems[1], MemberError::NameMismatch { .. }));
        assert!(matches!(problems[2], MemberError::BadName(_)));
        assert!(matches!(problems[3], MemberError::BadUrl { .. }));
        assert!(matches!(problems[4], MemberError::Foreign(_)));
        assert_eq!(problems[0].key(), "/yutu/c/members/node-x");
        assert_eq!(problems.len(), 5);
    }

    #[test]
    fn reads_are_diffed_into_joins_restarts_moves_and_departures() {
        let mut r = Roster::default();
        let (a, b) = (member("a", 1, 100), member("b", 2, 200));
        assert_eq!(
            r.update(5, &[a.clone(), b.clone()], true),
            [Change::Joined(a.clone()), Change::Joined(b.clone())]
        );
        assert_eq!((r.len(), r.revision()), (2, 5));
        // The same read again: nothing.
        assert!(r.update(6, &[a.clone(), b.clone()], true).is_empty());
        // b leaves.
        assert_eq!(
            r.update(7, std::slice::from_ref(&a), true),
            [Change::Left("b".into())]
        );
        assert!(!r.contains("b"));
        // a restarts within its lease (new run, new port); b comes back.
        let a2 = member("a", 3, 300);
        assert_eq!(
            r.update(8, &[a2.clone(), b.clone()], true),
            [
                Change::Restarted {
                    member: a2.clone(),
                    previous_ms: 100
                },
                Change::Joined(b.clone())
            ]
        );
        // Same run, new URL.
        let b2 = member("b", 9, 200);
        assert_eq!(
            r.update(9, &[a2.clone(), b2.clone()], true),
            [Change::Moved(b2.clone())]
        );
        // A read cut at its limit does not make anyone leave.
        assert!(r.update(10, std::slice::from_ref(&a2), false).is_empty());
        assert_eq!(r.names().collect::<Vec<_>>(), ["a", "b"]);
        // An empty complete read (here from an etcd rebuilt from scratch, its revisions
        // started over): everyone left.
        assert_eq!(
            r.update(3, &[], true),
            [Change::Left("a".into()), Change::Left("b".into())]
        );
        assert!(r.is_empty());
        assert_eq!(r.revision(), 3);
    }
}
