//! Small dense ids for storage nodes, buckets and instances.
//!
//! The index is touched for every block of every request, so it stores 4-byte ids instead of
//! names; the tables that own the names map back at the edges (HTTP, metrics).

use std::collections::HashMap;

/// A storage node, as numbered by this conductor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

/// A bucket (one per model).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BucketId(pub u32);

/// A prefill or decode instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InstanceId(pub u32);

impl NodeId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl InstanceId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Interns bucket names, up to a bound: names come from clients, and an unbounded table
/// would let them grow the conductor's memory without limit.
#[derive(Debug, Clone)]
pub struct Buckets {
    names: Vec<String>,
    ids: HashMap<String, BucketId>,
    max: usize,
}

impl Buckets {
    pub fn new(max: usize) -> Buckets {
        Buckets {
            names: Vec::new(),
            ids: HashMap::new(),
            max,
        }
    }

    /// The id of `name`, adding it if there is room; `None` when the table is full (the
    /// bucket is then treated as holding nothing).
    pub fn intern(&mut self, name: &str) -> Option<BucketId> {
        if let Some(id) = self.ids.get(name) {
            return Some(*id);
        }
        if self.names.len() >= self.max {
            return None;
        }
        let id = BucketId(self.names.len() as u32);
        self.names.push(name.to_owned());
        self.ids.insert(name.to_owned(), id);
        Some(id)
    }

    /// The id of a known bucket.
    pub fn get(&self, name: &str) -> Option<BucketId> {
        self.ids.get(name).copied()
    }

    pub fn name(&self, id: BucketId) -> &str {
        self.names.get(id.0 as usize).map_or("", String::as_str)
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interning_is_stable_and_bounded() {
        let mut b = Buckets::new(2);
        let a = b.intern("a").expect("room");
        assert_eq!(b.intern("a"), Some(a));
        assert!(b.intern("b").is_some());
        assert_eq!(b.intern("c"), None);
        assert_eq!(b.get("c"), None);
        assert_eq!(b.name(a), "a");
        assert_eq!(b.len(), 2);
    }
}
