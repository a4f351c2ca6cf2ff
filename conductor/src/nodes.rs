//! The storage nodes the conductor knows: name, base URL, and event feed.
//!
//! A node becomes known when it is registered (`POST /v1/nodes`, or as the node of an
//! instance), when it first pushes events, or, with `--etcd`, when it is listed in the
//! cluster's membership (which also gives its URL); any may come first. The URL is needed only
//! to fetch a snapshot, so events from a node registered without one are still applied, and
//! a resync waits until the URL is known. A node that leaves the membership keeps its id (ids
//! are never reused); its feed says it departed.

use std::collections::HashMap;

use crate::feed::Feed;
use crate::ids::NodeId;

/// One storage node.
#[derive(Debug)]
pub struct Node {
    pub name: String,
    pub url: Option<String>,
    pub feed: Feed,
}

/// Every known node, by dense id.
#[derive(Debug)]
pub struct NodeTable {
    nodes: Vec<Node>,
    ids: HashMap<String, NodeId>,
    max: usize,
    buffer_blocks: usize,
}

impl NodeTable {
    /// At most `max` nodes (names arrive from the network); each feed buffers at most
    /// `buffer_blocks` blocks of events during a resync.
    pub fn new(max: usize, buffer_blocks: usize) -> NodeTable {
        NodeTable {
            nodes: Vec::new(),
            ids: HashMap::new(),
            // The index stores node ids in 16 bits.
            max: max.min(crate::index::MAX_NODE_ID as usize + 1),
            buffer_blocks,
        }
    }

    /// The id of `name`, adding the node if there is room.
    pub fn intern(&mut self, name: &str) -> Option<NodeId> {
        if let Some(id) = self.ids.get(name) {
            return Some(*id);
        }
        if self.nodes.len() >= self.max {
            return None;
        }
        let id = NodeId(self.nodes.len() as u32);
        self.nodes.push(Node {
            name: name.to_owned(),
            url: None,
            feed: Feed::new(self.buffer_blocks),
        });
        self.ids.insert(name.to_owned(), id);
        Some(id)
    }

    pub fn get(&self, name: &str) -> Option<NodeId> {
        self.ids.get(name).copied()
    }

    pub fn node(&self, id: NodeId) -> Option<&Node> {
        self.nodes.get(id.index())
    }

    pub fn node_mut(&mut self, id: NodeId) -> Option<&mut Node> {
        self.nodes.get_mut(id.index())
    }

    pub fn name(&self, id: NodeId) -> &str {
        self.node(id).map_or("", |n| n.name.as_str())
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (NodeId, &Node)> {
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (NodeId(i as u32), n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_are_interned_up_to_the_bound() {
        let mut t = NodeTable::new(2, 10);
        let a = t.intern("a").expect("room");
        assert_eq!(t.intern("a"), Some(a));
        let b = t.intern("b").expect("room");
        assert_eq!(t.intern("c"), None);
        assert_eq!(t.name(b), "b");
        assert_eq!(t.get("a"), Some(a));
        assert_eq!(t.iter().count(), 2);
    }
}
