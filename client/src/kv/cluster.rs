//! Routing a [`KvClient`](super::KvClient)'s calls over a cluster: the client learns the membership from a
//! node (`GET /v1/cluster`), computes each key's owners with the same rendezvous placement
//! the nodes use ([`yutu_api::cluster::owners`]), and moves the bytes straight to and from
//! the owning nodes. A put goes to every owner (all must confirm); a get, exists or single
//! read goes to the first owner and falls over to the next at once when that node cannot be
//! reached or does not have the key; a remove goes to every owner.
//!
//! One transfer engine serves every node (the clients per node share it), so a buffer
//! registered once is the source and target for all of them. The membership is read again
//! when it is older than [`REFRESH`] and whenever a node fails, so a client follows nodes
//! joining and leaving without being told.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use yutu_api::cluster::{Member, Membership, MEMBERSHIP_PATH};

use super::{Buffer, Inner, KvError, KvOptions, NodeClient, PutOptions, SmallValue};

/// How old the membership may get before a call reads it again.
const REFRESH: Duration = Duration::from_secs(2);

struct State {
    membership: Arc<Membership>,
    read_at: Instant,
}

/// Where a [`KvClient`](super::KvClient)'s calls go: the one place that decides. A node
/// alone (or one too old to say it is in a cluster) takes every call; in a cluster each call
/// goes to the owners of its keys.
pub(super) struct Routing {
    /// The node the client was made with.
    seed: Arc<NodeClient>,
    /// Its cluster, when it is in one.
    cluster: Option<Cluster>,
}

/// A cluster's membership as the client last read it, and a client per member.
struct Cluster {
    options: KvOptions,
    inner: Arc<Inner>,
    state: RwLock<State>,
    /// A client per member (by name, with the URL it was made for).
    nodes: Mutex<HashMap<String, (String, Arc<NodeClient>)>>,
}

/// Whether a failure says the node could not be reached or could not serve (so another owner
/// may), rather than that the request itself was refused.
fn node_failed(e: &KvError) -> bool {
    match e {
        KvError::Client(crate::ClientError::Transport(_)) => true,
        KvError::Client(crate::ClientError::Io(_)) => true,
        KvError::Client(crate::ClientError::S3 { status, .. }) => *status >= 500,
        KvError::Transfer(_) => true,
        _ => false,
    }
}

impl Routing {
    /// The routing of a client of `seed`: over its cluster when it is in one and
    /// `options.route` asks for that, else to `seed` alone.
    pub(super) fn new(seed: Arc<NodeClient>, options: &KvOptions) -> Result<Routing, KvError> {
        let cluster = match options.route {
            true => Cluster::discover(&seed, options)?,
            false => None,
        };
        Ok(Routing { seed, cluster })
    }

    pub(super) fn seed(&self) -> &NodeClient {
        &self.seed
    }

    /// How many nodes the calls are routed over (0: the seed alone).
    pub(super) fn members(&self) -> usize {
        self.cluster.as_ref().map_or(0, Cluster::members)
    }

    /// Whether the calls are routed over a cluster.
    pub(super) fn is_cluster(&self) -> bool {
        self.cluster.is_some()
    }

    /// True when every node a call may reach offers RDMA, so that a call may hand any of
    /// them a descriptor of GPU memory.
    pub(super) fn all_offer_rdma(&self) -> bool {
        match &self.cluster {
            None => self.seed.server.rdma.is_some(),
            Some(c) => c.all_offer_rdma(),
        }
    }

    pub(super) fn put_from(
        &self,
        bucket: &str,
        keys: &[String],
        buf: &Buffer,
        offsets: &[u64],
        lengths: &[u64],
        options: &PutOptions,
    ) -> Result<Vec<String>, KvError> {
        match &self.cluster {
            None => self
                .seed
                .batch_put_from_opts(bucket, keys, buf, offsets, lengths, options),
            Some(c) => c.put_from(bucket, keys, buf, offsets, lengths, options),
        }
    }

    pub(super) fn put_two_phase(
        &self,
        bucket: &str,
        keys: &[String],
        buf: &Buffer,
        offsets: &[u64],
        lengths: &[u64],
    ) -> Result<Vec<String>, KvError> {
        match &self.cluster {
            None => self
                .seed
                .batch_put_two_phase(bucket, keys, buf, offsets, lengths),
            Some(c) => c.put_two_phase(bucket, keys, buf, offsets, lengths),
        }
    }

    pub(super) fn get_into(
        &self,
        bucket: &str,
        keys: &[String],
        buf: &Buffer,
        offsets: &[u64],
        capacities: &[u64],
    ) -> Result<Vec<Option<u64>>, KvError> {
        match &self.cluster {
            None => self
                .seed
                .batch_get_into_ranges(bucket, keys, buf, offsets, capacities),
            Some(c) => c.get_into(bucket, keys, buf, offsets, capacities),
        }
    }

    pub(super) fn exists(&self, bucket: &str, keys: &[String]) -> Result<Vec<bool>, KvError> {
        match &self.cluster {
            None => self.seed.batch_exists(bucket, keys),
            Some(c) => c.exists(bucket, keys),
        }
    }

    pub(super) fn prefix(&self, bucket: &str, keys: &[String]) -> Result<usize, KvError> {
        match &self.cluster {
            None => self.seed.prefix(bucket, keys),
            Some(c) => c.prefix(bucket, keys),
        }
    }

    pub(super) fn remove(&self, bucket: &str, keys: &[String]) -> Result<Vec<bool>, KvError> {
        match &self.cluster {
            None => self.seed.remove(bucket, keys),
            Some(c) => c.remove(bucket, keys),
        }
    }

    pub(super) fn get_bytes(&self, bucket: &str, key: &str) -> Result<Option<Vec<u8>>, KvError> {
        match &self.cluster {
            None => self.seed.get_bytes(bucket, key),
            Some(c) => c.get_bytes(bucket, key),
        }
    }

    pub(super) fn get_small(
        &self,
        bucket: &str,
        key: &str,
        max: u64,
    ) -> Result<SmallValue, KvError> {
        match &self.cluster {
            None => self.seed.get_small(bucket, key, max),
            Some(c) => Ok(match c.get_bytes(bucket, key)? {
                Some(data) => SmallValue::Bytes(data),
                None => SmallValue::Missing,
            }),
        }
    }
}

impl Cluster {
    /// The cluster `seed` is in; `None` when the node is alone (or too old to say).
    fn discover(seed: &NodeClient, options: &KvOptions) -> Result<Option<Cluster>, KvError> {
        let Some(membership) = read_membership(seed) else {
            return Ok(None);
        };
        if membership.members.is_empty() {
            return Ok(None);
        }
        Ok(Some(Cluster {
            options: KvOptions {
                route: false,
                ..options.clone()
            },
            inner: seed.inner.clone(),
            state: RwLock::new(State {
                membership: Arc::new(membership),
                read_at: Instant::now(),
            }),
            nodes: Mutex::new(HashMap::new()),
        }))
    }

    fn members(&self) -> usize {
        self.membership().members.len()
    }

    /// True when every member offers RDMA (connecting to those not met yet), so that a call
    /// may hand any of them a descriptor of GPU memory.
    fn all_offer_rdma(&self) -> bool {
        let membership = self.membership();
        !membership.members.is_empty()
            && membership
                .members
                .iter()
                .all(|m| self.node(m).is_ok_and(|c| c.server.rdma.is_some()))
    }

    fn membership(&self) -> Arc<Membership> {
        let (m, stale) = match self.state.read() {
            Ok(s) => (s.membership.clone(), s.read_at.elapsed() > REFRESH),
            Err(p) => {
                let s = p.into_inner();
                (s.membership.clone(), true)
            }
        };
        if stale {
            self.refresh();
            return match self.state.read() {
                Ok(s) => s.membership.clone(),
                Err(p) => p.into_inner().membership.clone(),
            };
        }
        m
    }

    /// Reads the membership again from the members (first that answers).
    fn refresh(&self) {
        let current = match self.state.read() {
            Ok(s) => s.membership.clone(),
            Err(p) => p.into_inner().membership.clone(),
        };
        for m in &current.members {
            let Ok(node) = self.node(m) else { continue };
            if let Some(fresh) = read_membership(&node) {
                if !fresh.members.is_empty() {
                    let mut s = match self.state.write() {
                        Ok(s) => s,
                        Err(p) => p.into_inner(),
                    };
                    if fresh.revision >= s.membership.revision {
                        s.membership = Arc::new(fresh);
                    }
                    s.read_at = Instant::now();
                    return;
                }
            }
        }
        // Nobody answered: keep the last view, and do not ask again before REFRESH.
        if let Ok(mut s) = self.state.write() {
            s.read_at = Instant::now();
        }
    }

    /// The membership as a node answers it after looking `bucket` up in etcd; `None` when no
    /// node answers. Kept as the current view.
    fn learn_bucket(&self, current: &Membership, bucket: &str) -> Option<Membership> {
        let path = format!(
            "{MEMBERSHIP_PATH}?bucket={}",
            percent_encoding::utf8_percent_encode(bucket, percent_encoding::NON_ALPHANUMERIC)
        );
        for m in &current.members {
            let Ok(node) = self.node(m) else { continue };
            if let Some(fresh) = read_membership_at(&node, &path) {
                if fresh.members.is_empty() {
                    continue;
                }
                if let Ok(mut s) = self.state.write() {
                    s.membership = Arc::new(fresh.clone());
                    s.read_at = Instant::now();
                }
                return Some(fresh);
            }
        }
        None
    }

    /// The client of member `m` (connected on first use, again when its URL changed).
    fn node(&self, m: &Member) -> Result<Arc<NodeClient>, KvError> {
        if let Ok(nodes) = self.nodes.lock() {
            if let Some((url, c)) = nodes.get(&m.name) {
                if *url == m.url {
                    return Ok(c.clone());
                }
            }
        }
        let client = Arc::new(NodeClient::connect(
            &m.url,
            &self.options,
            Some(self.inner.clone()),
        )?);
        if let Ok(mut nodes) = self.nodes.lock() {
            nodes.insert(m.name.clone(), (m.url.clone(), client.clone()));
        }
        Ok(client)
    }

    /// The owners of each key, best first (`None` for a bucket the cluster does not know:
    /// the caller then sends everything to one node).
    fn owners(
        &self,
        membership: &Membership,
        bucket: &str,
        keys: &[String],
    ) -> Option<Vec<Vec<usize>>> {
        let known = |m: &Membership| {
            m.buckets
                .iter()
                .find(|b| b.bucket == bucket)
                .map(|b| b.replicas as usize)
        };
        let replicas = match known(membership) {
            Some(r) => r,
            None => {
                // Created moments ago through another node? Ask a node to look it up.
                let fresh = self.learn_bucket(membership, bucket)?;
                known(&fresh)?
            }
        };
        Some(
            keys.iter()
                .map(|k| yutu_api::cluster::owners(bucket, k, &membership.members, replicas))
                .collect(),
        )
    }

    /// Runs `call` once, and once more on a fresh membership when a node failed.
    fn with_retry<T>(
        &self,
        mut call: impl FnMut(&Membership) -> Result<T, KvError>,
    ) -> Result<T, KvError> {
        let m = self.membership();
        match call(&m) {
            Err(e) if node_failed(&e) => {
                self.refresh();
                call(&self.membership())
            }
            other => other,
        }
    }

    /// Runs `call` for every (node, keys) group, the groups on different nodes in parallel
    /// (the calling thread takes one); each result with its node and keys.
    #[allow(clippy::type_complexity)]
    fn each_node<T: Send>(
        &self,
        m: &Membership,
        groups: BTreeMap<usize, Vec<usize>>,
        call: impl Fn(&NodeClient, &[usize]) -> Result<T, KvError> + Sync,
    ) -> Vec<(usize, Vec<usize>, Result<T, KvError>)> {
        let run =
            |node: usize, idx: &[usize]| self.node(&m.members[node]).and_then(|c| call(&c, idx));
        if groups.len() <= 1 {
            return groups
                .into_iter()
                .map(|(node, idx)| {
                    let r = run(node, &idx);
                    (node, idx, r)
                })
                .collect();
        }
        let mut groups: Vec<(usize, Vec<usize>)> = groups.into_iter().collect();
        let (first_node, first_idx) = groups.remove(0);
        std::thread::scope(|scope| {
            let handles: Vec<_> = groups
                .into_iter()
                .map(|(node, idx)| {
                    let run = &run;
                    scope.spawn(move || {
                        let r = run(node, &idx);
                        (node, idx, r)
                    })
                })
                .collect();
            let mut out = vec![{
                let r = run(first_node, &first_idx);
                (first_node, first_idx, r)
            }];
            for h in handles {
                match h.join() {
                    Ok(x) => out.push(x),
                    Err(p) => std::panic::resume_unwind(p),
                }
            }
            out
        })
    }

    /// The client of the first member, for a bucket the cluster does not know.
    fn any(&self, m: &Membership) -> Result<Arc<NodeClient>, KvError> {
        let first = m
            .members
            .first()
            .ok_or_else(|| KvError::InvalidResponse("the cluster has no members".into()))?;
        self.node(first)
    }

    fn put_from(
        &self,
        bucket: &str,
        keys: &[String],
        buf: &Buffer,
        offsets: &[u64],
        lengths: &[u64],
        options: &PutOptions,
    ) -> Result<Vec<String>, KvError> {
        self.with_retry(|m| {
            let Some(mut owners) = self.owners(m, bucket, keys) else {
                return self
                    .any(m)?
                    .batch_put_from_opts(bucket, keys, buf, offsets, lengths, options);
            };
            if let Some(n) = options.replicas {
                // The placement order beyond the bucket's owners (or short of them).
                for (o, k) in owners.iter_mut().zip(keys) {
                    *o = yutu_api::cluster::owners(bucket, k, &m.members, n as usize);
                }
            }
            if let Some(node) = &options.preferred_node {
                let i = m
                    .members
                    .iter()
                    .position(|x| &x.name == node)
                    .ok_or_else(|| {
                        KvError::InvalidArgument(format!("no member is named {node:?}"))
                    })?;
                for o in owners.iter_mut() {
                    if !o.contains(&i) {
                        o.push(i);
                    }
                }
            }
            let mut etags = vec![String::new(); keys.len()];
            // One call per node with every key it owns (at any rank), the nodes in parallel;
            // the first owners' ETags are the answer.
            let results = self.each_node(m, by_node(&owners), |client, idx| {
                let ks: Vec<String> = idx.iter().map(|&i| keys[i].clone()).collect();
                let os: Vec<u64> = idx.iter().map(|&i| offsets[i]).collect();
                let ls: Vec<u64> = idx.iter().map(|&i| lengths[i]).collect();
                client.batch_put_from_opts(bucket, &ks, buf, &os, &ls, options)
            });
            for (node, idx, got) in results {
                let got = got?;
                for (&i, e) in idx.iter().zip(got) {
                    if owners[i].first() == Some(&node) {
                        etags[i] = e;
                    }
                }
            }
            Ok(etags)
        })
    }

    fn put_two_phase(
        &self,
        bucket: &str,
        keys: &[String],
        buf: &Buffer,
        offsets: &[u64],
        lengths: &[u64],
    ) -> Result<Vec<String>, KvError> {
        self.with_retry(|m| {
            let Some(owners) = self.owners(m, bucket, keys) else {
                return self
                    .any(m)?
                    .batch_put_two_phase(bucket, keys, buf, offsets, lengths);
            };
            let mut etags = vec![String::new(); keys.len()];
            let ranks = owners.iter().map(Vec::len).max().unwrap_or(0);
            for rank in 0..ranks {
                for (node, idx) in group(&owners, rank) {
                    let client = self.node(&m.members[node])?;
                    let ks: Vec<String> = idx.iter().map(|&i| keys[i].clone()).collect();
                    let os: Vec<u64> = idx.iter().map(|&i| offsets[i]).collect();
                    let ls: Vec<u64> = idx.iter().map(|&i| lengths[i]).collect();
                    let got = client.batch_put_two_phase(bucket, &ks, buf, &os, &ls)?;
                    if rank == 0 {
                        for (&i, e) in idx.iter().zip(got) {
                            etags[i] = e;
                        }
                    }
                }
            }
            Ok(etags)
        })
    }

    fn get_into(
        &self,
        bucket: &str,
        keys: &[String],
        buf: &Buffer,
        offsets: &[u64],
        capacities: &[u64],
    ) -> Result<Vec<Option<u64>>, KvError> {
        self.with_retry(|m| {
            let Some(owners) = self.owners(m, bucket, keys) else {
                return self
                    .any(m)?
                    .batch_get_into_ranges(bucket, keys, buf, offsets, capacities);
            };
            self.first_found(
                m,
                &owners,
                |c, idx| {
                    let ks: Vec<String> = idx.iter().map(|&i| keys[i].clone()).collect();
                    let os: Vec<u64> = idx.iter().map(|&i| offsets[i]).collect();
                    let cs: Vec<u64> = idx.iter().map(|&i| capacities[i]).collect();
                    c.batch_get_into_ranges(bucket, &ks, buf, &os, &cs)
                },
                Option::is_some,
            )
        })
    }

    fn exists(&self, bucket: &str, keys: &[String]) -> Result<Vec<bool>, KvError> {
        self.with_retry(|m| {
            let Some(owners) = self.owners(m, bucket, keys) else {
                return self.any(m)?.batch_exists(bucket, keys);
            };
            self.first_found(
                m,
                &owners,
                |c, idx| {
                    let ks: Vec<String> = idx.iter().map(|&i| keys[i].clone()).collect();
                    c.batch_exists(bucket, &ks)
                },
                |f: &bool| *f,
            )
        })
    }

    /// Asks each key's owners in turn (the nodes of one rank in parallel) until one `found`
    /// it: an owner that cannot be reached, or that does not have the key (one that joined
    /// lately), passes it to the next. A key no owner could be asked about fails the call
    /// (with the last node failure); one every owner lacks is answered as the last said.
    fn first_found<T: Send + Clone + Default>(
        &self,
        m: &Membership,
        owners: &[Vec<usize>],
        call: impl Fn(&NodeClient, &[usize]) -> Result<Vec<T>, KvError> + Sync,
        found: impl Fn(&T) -> bool,
    ) -> Result<Vec<T>, KvError> {
        let mut out = vec![T::default(); owners.len()];
        let mut answered = vec![false; owners.len()];
        let mut pending: Vec<usize> = (0..owners.len()).collect();
        let mut failure = None;
        let ranks = owners.iter().map(Vec::len).max().unwrap_or(0);
        for rank in 0..ranks {
            if pending.is_empty() {
                break;
            }
            let mut next = Vec::new();
            for (_, idx, got) in self.each_node(m, group_of(owners, rank, &pending), &call) {
                match got {
                    Ok(got) => {
                        for (&i, g) in idx.iter().zip(got) {
                            answered[i] = true;
                            if !found(&g) {
                                next.push(i);
                            }
                            out[i] = g;
                        }
                    }
                    Err(e) if node_failed(&e) => {
                        next.extend(idx);
                        failure = Some(e);
                    }
                    Err(e) => return Err(e),
                }
            }
            pending = next;
        }
        match failure {
            Some(e) if answered.iter().any(|a| !a) => Err(e),
            _ => Ok(out),
        }
    }

    fn prefix(&self, bucket: &str, keys: &[String]) -> Result<usize, KvError> {
        let found = self.exists(bucket, keys)?;
        Ok(found.iter().take_while(|f| **f).count())
    }

    fn remove(&self, bucket: &str, keys: &[String]) -> Result<Vec<bool>, KvError> {
        self.with_retry(|m| {
            let Some(owners) = self.owners(m, bucket, keys) else {
                return self.any(m)?.remove(bucket, keys);
            };
            let mut out = vec![false; keys.len()];
            let ranks = owners.iter().map(Vec::len).max().unwrap_or(0);
            for rank in 0..ranks {
                for (node, idx) in group(&owners, rank) {
                    let ks: Vec<String> = idx.iter().map(|&i| keys[i].clone()).collect();
                    let got = self.node(&m.members[node])?.remove(bucket, &ks)?;
                    for (&i, g) in idx.iter().zip(got) {
                        out[i] |= g;
                    }
                }
            }
            Ok(out)
        })
    }

    fn get_bytes(&self, bucket: &str, key: &str) -> Result<Option<Vec<u8>>, KvError> {
        let keys = [key.to_string()];
        self.with_retry(|m| {
            let Some(owners) = self.owners(m, bucket, &keys) else {
                return self.any(m)?.get_bytes(bucket, key);
            };
            let mut failure = None;
            for &node in &owners[0] {
                match self
                    .node(&m.members[node])
                    .and_then(|c| c.get_bytes(bucket, key))
                {
                    Ok(Some(b)) => return Ok(Some(b)),
                    Ok(None) => {}
                    Err(e) if node_failed(&e) => failure = Some(e),
                    Err(e) => return Err(e),
                }
            }
            match failure {
                Some(e) => Err(e),
                None => Ok(None),
            }
        })
    }
}

/// Keys grouped by node, whatever their rank among the key's owners.
fn by_node(owners: &[Vec<usize>]) -> BTreeMap<usize, Vec<usize>> {
    let mut out: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (i, o) in owners.iter().enumerate() {
        for &node in o {
            out.entry(node).or_default().push(i);
        }
    }
    out
}

/// Keys grouped by their owner of rank `rank` (keys with fewer owners are left out).
fn group(owners: &[Vec<usize>], rank: usize) -> BTreeMap<usize, Vec<usize>> {
    let all: Vec<usize> = (0..owners.len()).collect();
    group_of(owners, rank, &all)
}

/// [`group`] over the keys `among`.
fn group_of(owners: &[Vec<usize>], rank: usize, among: &[usize]) -> BTreeMap<usize, Vec<usize>> {
    let mut out: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for &i in among {
        if let Some(&node) = owners[i].get(rank) {
            out.entry(node).or_default().push(i);
        }
    }
    out
}

/// `GET /v1/cluster` of a node; `None` when it does not answer one (a node too old to know).
fn read_membership(node: &NodeClient) -> Option<Membership> {
    read_membership_at(node, MEMBERSHIP_PATH)
}

fn read_membership_at(node: &NodeClient, target: &str) -> Option<Membership> {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let mut req = node.agent.get(format!("{}{target}", node.base));
    if let Some(c) = &node.credentials {
        for (name, value) in c.sign(
            "GET",
            &node.host,
            path,
            query,
            b"",
            std::time::SystemTime::now(),
        ) {
            req = req.header(name, value);
        }
    }
    let resp = req.call().ok()?;
    if resp.status() != 200 {
        return None;
    }
    super::read_json(resp).ok()
}
