//! Object listings across shards.
//!
//! Keys of one bucket are spread over every shard, so a listing asks each shard for its first
//! `limit + 1` entries after the marker (with the delimiter already rolled up into common
//! prefixes) and merges them. Each shard's answer is a prefix of its own sorted sequence, and
//! the first `limit` entries of the merged sequence always come from those prefixes, so the
//! merge is exact; the listing is truncated exactly when the merge holds more than `limit`.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::time::SystemTime;

/// What a listing asks every shard.
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    pub prefix: String,
    pub delimiter: Option<String>,
    /// Exclusive lower bound: a key or a common prefix returned earlier.
    pub after: Option<String>,
    pub limit: usize,
}

/// One entry of a listing, in the order S3 returns them.
#[derive(Debug, Clone, PartialEq)]
pub enum ListItem {
    Object {
        key: String,
        size: u64,
        etag: String,
        last_modified: SystemTime,
    },
    Prefix(String),
}

impl ListItem {
    pub fn name(&self) -> &str {
        match self {
            ListItem::Object { key, .. } => key,
            ListItem::Prefix(p) => p,
        }
    }
}

/// Reads what a listed entry needs from a stored value.
pub trait Listable {
    fn size(&self) -> u64;
    fn etag(&self) -> &str;
    fn last_modified(&self) -> SystemTime;
}

/// The first `q.limit + 1` entries of one shard's part of a bucket.
pub fn shard_page<V: Listable>(objects: &BTreeMap<String, V>, q: &ListQuery) -> Vec<ListItem> {
    let want = q.limit.saturating_add(1);
    let mut out = Vec::new();
    let mut lower: Bound<String> = match &q.after {
        Some(a) if a.as_str() >= q.prefix.as_str() => Bound::Excluded(a.clone()),
        _ => Bound::Included(q.prefix.clone()),
    };
    'scan: loop {
        let range = objects.range::<String, _>((lower.clone(), Bound::Unbounded));
        for (key, value) in range {
            if !key.starts_with(&q.prefix) {
                break 'scan;
            }
            let rolled = q
                .delimiter
                .as_deref()
                .filter(|d| !d.is_empty())
                .and_then(|d| {
                    key[q.prefix.len()..]
                        .find(d)
                        .map(|pos| &key[..q.prefix.len() + pos + d.len()])
                });
            match rolled {
                Some(common) => {
                    if q.after.as_deref().is_none_or(|a| common > a) {
                        out.push(ListItem::Prefix(common.to_string()));
                        if out.len() >= want {
                            break 'scan;
                        }
                    }
                    // Jump past every key under this common prefix.
                    match successor(common) {
                        Some(next) => {
                            lower = Bound::Included(next);
                            continue 'scan;
                        }
                        None => continue,
                    }
                }
                None => {
                    out.push(ListItem::Object {
                        key: key.clone(),
                        size: value.size(),
                        etag: value.etag().to_string(),
                        last_modified: value.last_modified(),
                    });
                    if out.len() >= want {
                        break 'scan;
                    }
                }
            }
        }
        break;
    }
    out
}

/// The smallest string greater than every string that starts with `prefix`, when one exists:
/// the prefix with its last character replaced by the next one.
fn successor(prefix: &str) -> Option<String> {
    let last = prefix.chars().next_back()?;
    let next = (last as u32 + 1..=char::MAX as u32).find_map(char::from_u32)?;
    let mut s = prefix[..prefix.len() - last.len_utf8()].to_string();
    s.push(next);
    Some(s)
}

/// Merges shard pages into one page of at most `limit` entries; `true` when more remain.
pub fn merge(pages: Vec<Vec<ListItem>>, limit: usize) -> (Vec<ListItem>, bool) {
    let mut all: Vec<ListItem> = pages.into_iter().flatten().collect();
    all.sort_by(|a, b| a.name().cmp(b.name()));
    all.dedup_by(|a, b| a.name() == b.name());
    let truncated = all.len() > limit;
    all.truncate(limit);
    (all, truncated)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct V;
    impl Listable for V {
        fn size(&self) -> u64 {
            1
        }
        fn etag(&self) -> &str {
            "\"e\""
        }
        fn last_modified(&self) -> SystemTime {
            SystemTime::UNIX_EPOCH
        }
    }

    fn names(items: &[ListItem]) -> Vec<&str> {
        items.iter().map(|i| i.name()).collect()
    }

    fn shard(keys: &[&str]) -> BTreeMap<String, V> {
        keys.iter().map(|k| (k.to_string(), V)).collect()
    }

    #[test]
    fn rolls_up_and_pages_across_shards() {
        let a = shard(&["a/1", "a/2", "b", "c/x/1", "d"]);
        let b = shard(&["a/3", "c/y", "e"]);
        let mut q = ListQuery {
            delimiter: Some("/".into()),
            limit: 2,
            ..Default::default()
        };
        let mut seen = vec![];
        loop {
            let (page, more) = merge(vec![shard_page(&a, &q), shard_page(&b, &q)], q.limit);
            seen.extend(names(&page).iter().map(|s| s.to_string()));
            if !more {
                break;
            }
            q.after = Some(page.last().unwrap().name().to_string());
        }
        assert_eq!(seen, ["a/", "b", "c/", "d", "e"]);
    }

    #[test]
    fn prefix_and_after() {
        let a = shard(&["p/1", "p/2", "p/3", "q"]);
        let q = ListQuery {
            prefix: "p/".into(),
            after: Some("p/1".into()),
            limit: 10,
            ..Default::default()
        };
        assert_eq!(names(&shard_page(&a, &q)), ["p/2", "p/3"]);
        let q = ListQuery {
            prefix: "p/".into(),
            after: Some("a".into()),
            limit: 1,
            ..Default::default()
        };
        assert_eq!(names(&shard_page(&a, &q)), ["p/1", "p/2"]);
    }

    /// The listing a single sorted key list gives, computed the obvious way.
    fn model(keys: &[String], prefix: &str, delim: Option<&str>) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for k in keys.iter().filter(|k| k.starts_with(prefix)) {
            let name = match delim.and_then(|d| k[prefix.len()..].find(d).map(|p| (p, d))) {
                Some((p, d)) => k[..prefix.len() + p + d.len()].to_string(),
                None => k.clone(),
            };
            if out.last() != Some(&name) {
                out.push(name);
            }
        }
        out
    }

    #[test]
    fn paging_over_shards_matches_the_model() {
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let mut rand = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let alphabet = ["a", "b", "/", "-", "é", "z"];
        for _ in 0..300 {
            let nshards = 1 + rand(4) as usize;
            let mut shards: Vec<BTreeMap<String, V>> =
                (0..nshards).map(|_| BTreeMap::new()).collect();
            let mut keys = Vec::new();
            for _ in 0..rand(60) {
                let len = 1 + rand(6);
                let k: String = (0..len).map(|_| alphabet[rand(6) as usize]).collect();
                shards[rand(nshards as u64) as usize].insert(k.clone(), V);
                keys.push(k);
            }
            keys.sort();
            keys.dedup();
            // A key may have landed on two shards; real placement forbids it, so keep one.
            for k in &keys {
                let holders: Vec<usize> = (0..nshards)
                    .filter(|s| shards[*s].contains_key(k))
                    .collect();
                for s in holders.iter().skip(1) {
                    shards[*s].remove(k);
                }
            }
            let prefix = ["", "a", "a/", "b"][rand(4) as usize];
            let delim = [None, Some("/"), Some("-"), Some("é")][rand(4) as usize];
            let limit = 1 + rand(7) as usize;
            let mut q = ListQuery {
                prefix: prefix.into(),
                delimiter: delim.map(str::to_string),
                after: None,
                limit,
            };
            let mut got = Vec::new();
            for _ in 0..1000 {
                let pages = shards.iter().map(|s| shard_page(s, &q)).collect();
                let (page, more) = merge(pages, limit);
                assert!(page.len() <= limit);
                got.extend(page.iter().map(|i| i.name().to_string()));
                if !more {
                    break;
                }
                q.after = Some(page.last().unwrap().name().to_string());
            }
            assert_eq!(
                got,
                model(&keys, prefix, delim),
                "prefix {prefix:?} delim {delim:?} limit {limit}"
            );
        }
    }

    #[test]
    fn successor_skips_the_whole_prefix() {
        assert_eq!(successor("a/").as_deref(), Some("a0"));
        assert!(successor("a/").unwrap().as_str() > "a/\u{10FFFF}zzz");
        assert_eq!(successor(""), None);
    }
}
