//! The client engines registered for get-into and put-from: which user each session
//! belongs to, and the address its engine proved (see `yutu_api::kv::PEERS_PATH`).
//!
//! The node's transfer engine keeps one peer table keyed by node id, shared by every user.
//! Before sessions a request named its client address and the node added it to that table,
//! so one user could replace another's entry (and receive her blocks) by naming her node id.
//! Here a node id belongs to one live session, of one user, at a time; a user can replace
//! only their own; the number of sessions is bounded per user and in all; and a session
//! unused for the idle time ends (the caller then drops its peer entry and connections).
//!
//! Node-wide (every shard serves get-into), so behind a mutex held for one map operation;
//! it is consulted once per get-into or put-from call, not per block.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use yutu_transfer::{NodeAddress, NodeId};

/// How many sessions there may be, how long an unused one lives, and how many transfers
/// through the node's engine one user may have in flight at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerLimits {
    pub per_user: usize,
    pub total: usize,
    pub idle: Duration,
    /// With the engine's per-peer worker cap, bounds the workers one user can hold however
    /// many sessions they open (a stalled engine holds its workers until its deadlines).
    pub engine_calls_per_user: usize,
}

impl Default for PeerLimits {
    fn default() -> Self {
        PeerLimits {
            per_user: 64,
            total: 1024,
            idle: Duration::from_secs(600),
            engine_calls_per_user: 2,
        }
    }
}

/// Why a registration is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerError {
    #[error("node id {0} belongs to another live session; pick another (random) node id")]
    NodeTaken(NodeId),
    #[error("you hold {0} peer sessions, the most a user may; end one first")]
    TooManyForUser(usize),
    #[error("the node holds {0} peer sessions, the most it keeps; try again later")]
    Full(usize),
    #[error("you have {0} transfers through the node's engine in flight, the most a user may; retry when one ends")]
    Busy(usize),
}

struct Session {
    user: String,
    address: NodeAddress,
    last_used: Instant,
}

#[derive(Default)]
struct Sessions {
    by_id: HashMap<String, Session>,
    by_node: HashMap<NodeId, String>,
    per_user: HashMap<String, usize>,
    engine_calls: HashMap<String, usize>,
}

/// A transfer through the node's engine in flight for a user; ends when dropped.
pub struct EngineCall {
    peers: Arc<PeerSessions>,
    user: String,
}

impl Drop for EngineCall {
    fn drop(&mut self) {
        let mut s = self.peers.lock();
        if let Some(n) = s.engine_calls.get_mut(&self.user) {
            *n -= 1;
            if *n == 0 {
                s.engine_calls.remove(&self.user);
            }
        }
    }
}

/// The registry.
pub struct PeerSessions {
    sessions: Mutex<Sessions>,
    limits: PeerLimits,
}

impl Default for PeerSessions {
    fn default() -> Self {
        PeerSessions::new(PeerLimits::default())
    }
}

impl PeerSessions {
    pub fn new(limits: PeerLimits) -> PeerSessions {
        PeerSessions {
            sessions: Mutex::new(Sessions::default()),
            limits,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Sessions> {
        // Each critical section is a few map operations; the maps are consistent after a panic.
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `user` may register `node` now (checked again by [`PeerSessions::insert`]):
    /// asked before the node proves anything, so a refused call costs no connection.
    pub fn admit(&self, user: &str, node: NodeId) -> Result<(), PeerError> {
        check(&self.lock(), &self.limits, user, node)
    }

    /// Registers `address` for `user` under the new session `id`; a session of the same user
    /// for the same node id is replaced. Returns the replaced session's address.
    pub fn insert(
        &self,
        id: String,
        user: &str,
        address: NodeAddress,
    ) -> Result<Option<NodeAddress>, PeerError> {
        let mut s = self.lock();
        check(&s, &self.limits, user, address.node)?;
        let replaced = s
            .by_node
            .get(&address.node)
            .cloned()
            .and_then(|old| remove(&mut s, &old))
            .map(|old| old.address);
        s.by_node.insert(address.node, id.clone());
        *s.per_user.entry(user.to_string()).or_default() += 1;
        s.by_id.insert(
            id,
            Session {
                user: user.to_string(),
                address,
                last_used: Instant::now(),
            },
        );
        Ok(replaced)
    }

    /// The proven address of `user`'s session `id` (`None` for an unknown id or another
    /// user's), marking it used.
    pub fn lookup(&self, id: &str, user: &str) -> Option<NodeAddress> {
        let mut s = self.lock();
        let session = s.by_id.get_mut(id).filter(|x| x.user == user)?;
        session.last_used = Instant::now();
        Some(session.address.clone())
    }

    /// Ends `user`'s session `id`; its address, or `None` when it is not theirs.
    pub fn end(&self, id: &str, user: &str) -> Option<NodeAddress> {
        let mut s = self.lock();
        if s.by_id.get(id).is_none_or(|x| x.user != user) {
            return None;
        }
        remove(&mut s, id).map(|x| x.address)
    }

    /// Ends the sessions unused since `now - idle`; their addresses.
    pub fn expire(&self, now: Instant) -> Vec<NodeAddress> {
        let mut s = self.lock();
        let idle: Vec<String> = s
            .by_id
            .iter()
            .filter(|(_, x)| now.saturating_duration_since(x.last_used) >= self.limits.idle)
            .map(|(id, _)| id.clone())
            .collect();
        idle.iter()
            .filter_map(|id| remove(&mut s, id).map(|x| x.address))
            .collect()
    }

    /// Counts a transfer through the node's engine for `user`, refused past the limit.
    pub fn engine_call(self: &Arc<Self>, user: &str) -> Result<EngineCall, PeerError> {
        let mut s = self.lock();
        let n = s.engine_calls.entry(user.to_string()).or_default();
        if *n >= self.limits.engine_calls_per_user {
            return Err(PeerError::Busy(*n));
        }
        *n += 1;
        Ok(EngineCall {
            peers: Arc::clone(self),
            user: user.to_string(),
        })
    }

    /// Live sessions (a gauge).
    pub fn len(&self) -> usize {
        self.lock().by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn check(s: &Sessions, limits: &PeerLimits, user: &str, node: NodeId) -> Result<(), PeerError> {
    let owner = s.by_node.get(&node).and_then(|id| s.by_id.get(id));
    if owner.is_some_and(|o| o.user != user) {
        return Err(PeerError::NodeTaken(node));
    }
    // Replacing one's own session for the same node adds none.
    if owner.is_some() {
        return Ok(());
    }
    let held = s.per_user.get(user).copied().unwrap_or(0);
    if held >= limits.per_user {
        return Err(PeerError::TooManyForUser(held));
    }
    if s.by_id.len() >= limits.total {
        return Err(PeerError::Full(s.by_id.len()));
    }
    Ok(())
}

fn remove(s: &mut Sessions, id: &str) -> Option<Session> {
    let session = s.by_id.remove(id)?;
    if s.by_node.get(&session.address.node).map(String::as_str) == Some(id) {
        s.by_node.remove(&session.address.node);
    }
    if let Some(n) = s.per_user.get_mut(&session.user) {
        *n -= 1;
        if *n == 0 {
            s.per_user.remove(&session.user);
        }
    }
    Some(session)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(node: u64) -> NodeAddress {
        NodeAddress {
            node: NodeId(node),
            incarnation: 1,
            host: "h".into(),
            shm: None,
            tcp: Some("127.0.0.1:1".parse().unwrap()),
            rdma: None,
        }
    }

    #[test]
    fn a_node_id_belongs_to_one_user_and_sessions_are_bounded() {
        let p = PeerSessions::new(PeerLimits {
            per_user: 2,
            total: 3,
            idle: Duration::from_secs(60),
            engine_calls_per_user: 2,
        });
        p.insert("a1".into(), "alice", addr(1)).unwrap();
        // Bob can neither take alice's node id nor use her session.
        assert_eq!(
            p.admit("bob", NodeId(1)),
            Err(PeerError::NodeTaken(NodeId(1)))
        );
        assert_eq!(
            p.insert("b1".into(), "bob", addr(1)),
            Err(PeerError::NodeTaken(NodeId(1)))
        );
        assert_eq!(p.lookup("a1", "bob"), None);
        assert_eq!(p.end("a1", "bob"), None);
        assert_eq!(p.lookup("a1", "alice"), Some(addr(1)));
        // Alice replacing her own session for node 1 adds none and ends the old one.
        assert_eq!(p.insert("a2".into(), "alice", addr(1)), Ok(Some(addr(1))));
        assert_eq!(p.lookup("a1", "alice"), None);
        p.insert("a3".into(), "alice", addr(2)).unwrap();
        assert_eq!(
            p.insert("a4".into(), "alice", addr(3)),
            Err(PeerError::TooManyForUser(2))
        );
        p.insert("b2".into(), "bob", addr(4)).unwrap();
        assert_eq!(p.admit("carol", NodeId(5)), Err(PeerError::Full(3)));
        assert_eq!(p.end("a3", "alice"), Some(addr(2)));
        assert_eq!(p.len(), 2);
        p.insert("c1".into(), "carol", addr(5)).unwrap();
    }

    #[test]
    fn engine_calls_are_bounded_per_user() {
        let p = Arc::new(PeerSessions::new(PeerLimits {
            engine_calls_per_user: 2,
            ..PeerLimits::default()
        }));
        let a = p.engine_call("bob").unwrap();
        let _b = p.engine_call("bob").unwrap();
        assert_eq!(p.engine_call("bob").err(), Some(PeerError::Busy(2)));
        let _c = p.engine_call("alice").unwrap();
        drop(a);
        let _d = p.engine_call("bob").unwrap();
    }

    #[test]
    fn unused_sessions_expire() {
        let p = PeerSessions::new(PeerLimits {
            idle: Duration::from_secs(10),
            ..PeerLimits::default()
        });
        p.insert("a".into(), "alice", addr(1)).unwrap();
        p.insert("b".into(), "bob", addr(2)).unwrap();
        let later = Instant::now() + Duration::from_secs(5);
        assert!(p.expire(later).is_empty());
        assert!(p.lookup("b", "bob").is_some());
        let gone = p.expire(Instant::now() + Duration::from_secs(11));
        assert_eq!(gone.len(), 2);
        assert!(p.is_empty());
        // The node id is free again.
        p.insert("c".into(), "carol", addr(1)).unwrap();
    }
}
