//! The prefill and decode instances requests are routed to.
//!
//! An instance registers with its role and the storage node whose cache it uses, then sends
//! heartbeats or load reports. One that has not been heard from for the liveness timeout is
//! not routed to (it keeps its slot and its bookkeeping, and comes back with its next
//! heartbeat). Ids are dense and never reused, so routing state can index arrays by them.

use std::collections::HashMap;

use yutu_api::route::Role;

use crate::ids::{InstanceId, NodeId};
use crate::load::{DecodeLoad, PrefillLoad};

/// Why an instance operation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error("no instance {0:?} is registered")]
    Unknown(String),
    #[error("instance id must be 1 to 256 printable ASCII characters without spaces")]
    BadId,
    #[error("a prefill instance needs the storage node it reads its cache from")]
    PrefillWithoutNode,
    #[error("instance {id:?} is registered as {registered:?}; deregister it before changing role")]
    RoleChange { id: String, registered: Role },
    #[error("too many instances (limit {0})")]
    Full(usize),
    #[error("too many storage nodes")]
    TooManyNodes,
    #[error("node name must be 1 to 128 printable ASCII characters without spaces")]
    BadNodeName,
    #[error("node URL must be http://host:port, got {0:?}")]
    BadUrl(String),
}

/// One inference instance.
#[derive(Debug, Clone)]
pub struct Instance {
    pub id: String,
    pub role: Role,
    pub node: Option<NodeId>,
    /// When it was last heard from (register, heartbeat, load report).
    pub last_seen_ms: f64,
    /// Deregistered instances keep their slot but are never routed to.
    pub registered: bool,
    pub prefill: PrefillLoad,
    pub decode: DecodeLoad,
    /// Requests routed here.
    pub routed: u64,
}

/// Every instance, by dense id, with the live ones of each role listed for routing.
#[derive(Debug, Default)]
pub struct Registry {
    instances: Vec<Instance>,
    ids: HashMap<String, InstanceId>,
    max: usize,
}

/// Checks an instance id: it is echoed in decisions and used as a metric label.
pub fn validate_instance_id(id: &str) -> Result<(), RegistryError> {
    let ok = !id.is_empty()
        && id.len() <= yutu_api::route::MAX_ID_LEN
        && id.bytes().all(|b| b.is_ascii_graphic() && b != b'"');
    if ok {
        Ok(())
    } else {
        Err(RegistryError::BadId)
    }
}

impl Registry {
    pub fn new(max: usize) -> Registry {
        Registry {
            instances: Vec::new(),
            ids: HashMap::new(),
            max,
        }
    }

    /// Registers `id` (or refreshes it: same role, possibly a new node).
    pub fn register(
        &mut self,
        id: &str,
        role: Role,
        node: Option<NodeId>,
        now_ms: f64,
    ) -> Result<InstanceId, RegistryError> {
        validate_instance_id(id)?;
        if role == Role::Prefill && node.is_none() {
            return Err(RegistryError::PrefillWithoutNode);
        }
        if let Some(&iid) = self.ids.get(id) {
            let inst = &mut self.instances[iid.index()];
            if inst.registered && inst.role != role {
                return Err(RegistryError::RoleChange {
                    id: id.to_owned(),
                    registered: inst.role,
                });
            }
            inst.role = role;
            inst.node = node;
            inst.last_seen_ms = now_ms;
            inst.registered = true;
            return Ok(iid);
        }
        if self.instances.len() >= self.max {
            return Err(RegistryError::Full(self.max));
        }
        let iid = InstanceId(self.instances.len() as u32);
        self.instances.push(Instance {
            id: id.to_owned(),
            role,
            node,
            last_seen_ms: now_ms,
            registered: true,
            prefill: PrefillLoad::default(),
            decode: DecodeLoad::default(),
            routed: 0,
        });
        self.ids.insert(id.to_owned(), iid);
        Ok(iid)
    }

    /// Stops routing to `id`. Returns whether it was registered.
    pub fn deregister(&mut self, id: &str) -> bool {
        match self.ids.get(id) {
            Some(iid) => {
                let inst = &mut self.instances[iid.index()];
                std::mem::replace(&mut inst.registered, false)
            }
            None => false,
        }
    }

    /// Marks `id` alive at `now_ms`.
    pub fn touch(&mut self, id: &str, now_ms: f64) -> Result<InstanceId, RegistryError> {
        let iid = self.lookup(id)?;
        self.instances[iid.index()].last_seen_ms = now_ms;
        Ok(iid)
    }

    /// The id of a registered instance.
    pub fn lookup(&self, id: &str) -> Result<InstanceId, RegistryError> {
        match self.ids.get(id) {
            Some(iid) if self.instances[iid.index()].registered => Ok(*iid),
            _ => Err(RegistryError::Unknown(id.to_owned())),
        }
    }

    pub fn get(&self, iid: InstanceId) -> &Instance {
        &self.instances[iid.index()]
    }

    pub fn get_mut(&mut self, iid: InstanceId) -> &mut Instance {
        &mut self.instances[iid.index()]
    }

    /// Every instance ever registered, with its id.
    pub fn iter(&self) -> impl Iterator<Item = (InstanceId, &Instance)> {
        self.instances
            .iter()
            .enumerate()
            .map(|(i, inst)| (InstanceId(i as u32), inst))
    }

    /// Whether `inst` may be routed to at `now_ms`.
    pub fn is_alive(inst: &Instance, now_ms: f64, ttl_ms: Option<f64>) -> bool {
        inst.registered && ttl_ms.is_none_or(|ttl| now_ms - inst.last_seen_ms <= ttl)
    }

    /// Fills `out` with the live instances of `role`.
    pub fn live(&self, role: Role, now_ms: f64, ttl_ms: Option<f64>, out: &mut Vec<InstanceId>) {
        out.clear();
        out.extend(
            self.iter()
                .filter(|(_, i)| i.role == role && Self::is_alive(i, now_ms, ttl_ms))
                .map(|(iid, _)| iid),
        );
    }
}

/// Checks a node URL: the conductor fetches snapshots from it over HTTP or HTTPS.
pub fn validate_node_url(url: &str) -> Result<(), RegistryError> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"));
    let ok = rest.is_some_and(|r| !r.is_empty())
        && url.len() <= 2048
        && url.bytes().all(|b| b.is_ascii_graphic());
    if ok {
        Ok(())
    } else {
        Err(RegistryError::BadUrl(url.chars().take(80).collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_refresh_and_liveness() {
        let mut r = Registry::new(3);
        let p = r
            .register("p0", Role::Prefill, Some(NodeId(0)), 0.0)
            .expect("ok");
        let d = r.register("d0", Role::Decode, None, 0.0).expect("ok");
        assert_eq!(
            r.register("p1", Role::Prefill, None, 0.0),
            Err(RegistryError::PrefillWithoutNode)
        );
        assert!(matches!(
            r.register("p0", Role::Decode, None, 0.0),
            Err(RegistryError::RoleChange { .. })
        ));
        assert_eq!(
            r.register("bad id", Role::Decode, None, 0.0),
            Err(RegistryError::BadId)
        );
        // Re-registering keeps the id and moves the node.
        assert_eq!(
            r.register("p0", Role::Prefill, Some(NodeId(4)), 10.0),
            Ok(p)
        );
        assert_eq!(r.get(p).node, Some(NodeId(4)));
        let mut live = Vec::new();
        r.live(Role::Prefill, 100.0, Some(1_000.0), &mut live);
        assert_eq!(live, vec![p]);
        r.live(Role::Prefill, 5_000.0, Some(1_000.0), &mut live);
        assert!(live.is_empty(), "silent for longer than the timeout");
        r.touch("p0", 5_000.0).expect("known");
        r.live(Role::Prefill, 5_000.0, Some(1_000.0), &mut live);
        assert_eq!(live, vec![p]);
        r.live(Role::Decode, 1e12, None, &mut live);
        assert_eq!(live, vec![d], "no timeout configured");
        assert!(r.deregister("d0"));
        assert!(!r.deregister("d0"));
        assert_eq!(r.lookup("d0"), Err(RegistryError::Unknown("d0".into())));
        r.live(Role::Decode, 0.0, None, &mut live);
        assert!(live.is_empty());
        // A deregistered instance may come back in another role.
        assert_eq!(r.register("d0", Role::Prefill, Some(NodeId(1)), 0.0), Ok(d));
        assert!(r.register("x", Role::Decode, None, 0.0).is_ok());
        assert_eq!(
            r.register("y", Role::Decode, None, 0.0),
            Err(RegistryError::Full(3))
        );
    }
}
