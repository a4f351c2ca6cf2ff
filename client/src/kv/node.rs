//! [`NodeClient`]: the KV calls to one node, over HTTP (one connection per shard where the
//! node has several, `lanes`) or binary frames (`frames`), with this process's transfer
//! engine registered with the node as a peer. [`KvClient`](super::KvClient) routes each call
//! to the nodes that own its keys and uses one of these per node.

use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use ureq::Agent;
use yutu_api::kv::{
    CopiedResponse, EtagsResponse, ExistsResponse, GetIntoRequest, KeysRequest, KvOp, PeerRequest,
    PeerResponse, PeerSecret, PrefixResponse, PutFromBlock, PutFromRequest, PutIdsRequest,
    PutStartBlock, PutStartRequest, PutStartResponse, RemoveResponse, RevokeResponse, StartedPut,
    ENGINE_PATH, PEERS_PATH,
};
use yutu_transfer::{
    EngineConfig, HugePages, MemoryRegion, NodeAddress, NodeId, SegmentDescriptor, TransferEngine,
    TransferRequest,
};

use super::checks::{check_batch, check_range, expect_len, same_len};
use super::frames::{self, url_host, FramesMode};
use super::http::{
    call_get, check_bucket, check_status, keys_request, kv_agent, kv_path, read_json, signed_get,
};
use super::presence::Location;
use super::{device, lanes, random_node_id, remove_stale_dirs, Buffer, Inner, KvError, KvOptions};
use super::{PutMode, PutOptions, SmallValue};
use crate::address::encode_key;
use crate::error::Resource;
use crate::ClientError;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A blocking client for the KV block API of one Yutu node: its calls go to that node
/// only. [`KvClient`](super::KvClient) routes over a cluster's nodes, one of these per node.
pub struct NodeClient {
    pub(super) agent: Agent,
    /// What a lane's agent is made with: the ordinary agent's settings, one idle connection.
    pub(super) lane_config: ureq::config::Config,
    /// One connection per shard of the node, when it has several (see `lanes`).
    pub(super) lanes: Option<lanes::Lanes>,
    pub(super) base: String,
    /// The Host header of `base` (signed).
    pub(super) host: String,
    pub(super) credentials: Option<crate::Credentials>,
    pub(super) inner: Arc<Inner>,
    pub(super) server: NodeAddress,
    /// This client's registration with the node (get-into and put-from name it).
    pub(super) session: String,
    pub(super) put_ttl_ms: Option<u64>,
    /// The node's frame sockets, when it has them and this client may use them: every KV
    /// call then goes in a frame (see `frames`).
    pub(super) frames: Option<frames::Frames>,
    /// The node's presence tables this client maps (same host, Unix frames, unless
    /// [`super::KvOptions::presence`] is off).
    pub(super) presence: Option<super::presence::Tables>,
    /// The node's shard arenas, mapped here where the node lets this process view them
    /// (same host, Unix frames, see `arena`): large gets then copy here.
    pub(super) views: Option<super::arena::ArenaViews>,
    /// Rooms the node reserved for this client's next puts through views (see `rooms`).
    pub(super) rooms: super::rooms::Rooms,
}

impl std::fmt::Debug for NodeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeClient")
            .field("base", &self.base)
            .field("node", &self.inner.engine.node())
            .field("server", &self.server.node)
            .finish()
    }
}

/// Ends the session, so that the node drops its peer entry now rather than when it idles out
/// (a user may hold a bounded number). Best effort: a node that cannot be reached ends it
/// later by itself.
impl Drop for NodeClient {
    fn drop(&mut self) {
        // Rooms are the user's, not the session's: given back now rather than at their ttl.
        if let Some(frames) = &self.frames {
            super::rooms::revoke_rooms(frames, self.rooms.drain(), true);
        }
        if self.session.is_empty() {
            return;
        }
        let path = format!("{PEERS_PATH}/{}", self.session);
        let mut req = self
            .agent
            .delete(format!("{}{path}", self.base))
            .config()
            .timeout_global(Some(Duration::from_secs(2)))
            .build();
        if let Some(c) = &self.credentials {
            for (name, value) in c.sign(
                "DELETE",
                &self.host,
                &path,
                "",
                b"",
                std::time::SystemTime::now(),
            ) {
                req = req.header(name, value);
            }
        }
        let _ = req.call();
    }
}

impl NodeClient {
    /// Starts a transfer engine, asks `base_url` for its engine's address and peers with it.
    /// Every call goes to this node (see [`KvClient`](super::KvClient) for a cluster).
    pub fn new(base_url: &str, options: KvOptions) -> Result<NodeClient, KvError> {
        Self::connect(base_url, &options, None)
    }

    /// A client of one node; with `inner`, on an engine that already runs (a cluster's
    /// clients share one engine, so one registered buffer serves every node).
    pub(super) fn connect(
        base_url: &str,
        options: &KvOptions,
        shared: Option<Arc<Inner>>,
    ) -> Result<NodeClient, KvError> {
        // Checks the URL the same way the S3 client does.
        let base = crate::Client::new(base_url)?.base_url().to_string();
        let bearer = match &options.token {
            Some(token) => Some(crate::bearer::Bearer::new(token).ok_or_else(|| {
                KvError::InvalidArgument("the token has characters a header cannot".into())
            })?),
            None => None,
        };
        let config = |idle_per_host: usize, idle_age: Duration| {
            let mut config = Agent::config_builder();
            if let Some(bearer) = &bearer {
                config = config.middleware(bearer.clone());
            }
            config
                .http_status_as_error(false)
                .max_redirects(0)
                .max_redirects_will_error(false)
                .timeout_connect(Some(CONNECT_TIMEOUT))
                .max_idle_connections_per_host(idle_per_host)
                .max_idle_age(idle_age)
                // A node is reached directly, as its transfer engine is: the environment's
                // HTTP proxy (if any) is not for KV calls, and the KV chain has no proxy
                // connector.
                .proxy(None)
                .user_agent(concat!("yutu-client/", env!("CARGO_PKG_VERSION")))
                .build()
        };
        // The ordinary agent keeps ureq's default of idle connections per host; a lane's
        // agent keeps the one connection that makes it a lane.
        let https = base.starts_with("https://");
        let agent = kv_agent(config(3, Duration::from_secs(15)), https);
        // A lane is worth its connection only while the connection lasts.
        let lane_config = config(1, Duration::from_secs(600));
        let inner = match shared {
            Some(inner) => inner,
            None => Self::start_engine(options)?,
        };
        let host = crate::sigv4::host_of(&base);
        let signer = options.credentials.as_ref().map(|c| (c, host.as_str()));
        let (server, served): (NodeAddress, _) = call_get(&agent, &base, ENGINE_PATH, signer)?;
        if server.node == inner.engine.node() {
            return Err(KvError::InvalidArgument(format!(
                "node id {} is the server's own; pick another",
                server.node
            )));
        }
        inner.engine.add_peer(server.clone());
        // The node reaches this engine only after it proves to be at the address it gives:
        // the engine answers the node's challenges with a secret only the two share.
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret)
            .map_err(|e| KvError::InvalidArgument(format!("no randomness for a secret: {e}")))?;
        inner.engine.trust(server.node, secret);
        let mut client = NodeClient {
            agent,
            lane_config,
            lanes: served.and_then(|(_, shards)| lanes::Lanes::new(shards)),
            base,
            host,
            credentials: options.credentials.clone(),
            inner,
            server,
            session: String::new(),
            put_ttl_ms: options.put_ttl_ms,
            frames: None,
            presence: None,
            views: None,
            rooms: Default::default(),
        };
        let registered: PeerResponse = client.call_post(
            PEERS_PATH,
            &PeerRequest {
                client: client.inner.address.clone(),
                secret: PeerSecret(secret),
            },
        )?;
        client.session = registered.session;
        // Frames carry a bearer token (or nothing, to an open node), not SigV4 signatures.
        if options.frames != FramesMode::Off && options.credentials.is_none() {
            // A node without frames (an older one) answers an error: HTTP it is.
            if let Ok((info, _)) = call_get::<yutu_api::kv_frame::FramesInfo>(
                &client.agent,
                &client.base,
                yutu_api::kv_frame::FRAMES_PATH,
                None,
            ) {
                let host = url_host(&client.base);
                client.frames = frames::Frames::open(
                    info,
                    &host,
                    client.base.starts_with("https://"),
                    options.token.clone(),
                    options.frames,
                    options.frame_spin,
                );
                client.presence = client
                    .frames
                    .as_ref()
                    .filter(|f| options.presence && *f.path() == frames::FramesPath::Unix)
                    .map(|f| super::presence::Tables::new(f.shards()));
                client.views = client
                    .frames
                    .as_ref()
                    .filter(|f| super::arena::enabled() && *f.path() == frames::FramesPath::Unix)
                    .map(|f| super::arena::ArenaViews::new(f.shards()));
            }
        }
        Ok(client)
    }

    /// Starts this client's transfer engine (with its shm directory when asked).
    pub(super) fn start_engine(options: &KvOptions) -> Result<Arc<Inner>, KvError> {
        let node = options.node_id.unwrap_or_else(random_node_id);
        let mut cfg = EngineConfig::new(NodeId(node));
        let shm_dir = if options.shm {
            // Named by the pid and a random value, not the node id: the name is visible to
            // every local user. The pid lets a later client remove what a killed one left.
            let tmp = std::env::temp_dir();
            remove_stale_dirs(&tmp);
            let dir = tmp.join(format!(
                "yutu-kv-{}-{:016x}",
                std::process::id(),
                random_node_id()
            ));
            std::fs::create_dir_all(&dir).map_err(ClientError::Io)?;
            Some(dir)
        } else {
            None
        };
        cfg.shm_dir = shm_dir.clone();
        if let Some(listen) = options.tcp_listen {
            cfg.tcp_listen = Some(listen);
        }
        cfg.tcp_advertise = options.tcp_advertise;
        let engine = match TransferEngine::start(cfg) {
            Ok(e) => e,
            Err(e) => {
                if let Some(dir) = &shm_dir {
                    let _ = std::fs::remove_dir_all(dir);
                }
                return Err(e.into());
            }
        };
        let inner = Arc::new(Inner {
            address: engine.address(),
            engine,
            shm_dir,
            gpudirect: device::DirectRanges::default(),
        });
        Ok(inner)
    }

    /// The session the node registered this client's engine under.
    pub fn session(&self) -> &str {
        &self.session
    }

    /// The server's base URL.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// This client's transfer engine.
    pub fn engine(&self) -> &TransferEngine {
        &self.inner.engine
    }

    /// The server engine's address, as the server announced it.
    pub fn server_address(&self) -> &NodeAddress {
        &self.server
    }

    /// Allocates and registers a buffer of at least `len` bytes (zeroed).
    pub fn register(&self, len: u64) -> Result<Buffer, KvError> {
        let len = usize::try_from(len)
            .map_err(|_| KvError::InvalidArgument(format!("{len} bytes do not fit in memory")))?;
        if len == 0 {
            return Err(KvError::InvalidArgument(
                "a buffer needs at least one byte".into(),
            ));
        }
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let name = format!("yutu-kv-buf-{}", SEQ.fetch_add(1, Ordering::Relaxed));
        let region = MemoryRegion::allocate(&name, len, HugePages::Auto)?;
        let segment = self.inner.engine.register(region)?;
        Ok(Buffer {
            segment,
            inner: self.inner.clone(),
        })
    }

    /// Stores `keys[i]` from `buf[offsets[i] .. offsets[i] + lengths[i]]` on this node: the
    /// node reads the blocks out of the buffer (put-from). Returns the ETags, in order.
    pub fn batch_put_from_opts(
        &self,
        bucket: &str,
        keys: &[String],
        buf: &Buffer,
        offsets: &[u64],
        lengths: &[u64],
        options: &PutOptions,
    ) -> Result<Vec<String>, KvError> {
        self.check_put(keys, buf, offsets, lengths)?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let blocks = keys
            .iter()
            .zip(offsets.iter().zip(lengths))
            .map(|(key, (&offset, &len))| PutFromBlock {
                key: key.as_str(),
                offset,
                len,
            })
            .collect();
        self.put_from_call(bucket, keys, buf, blocks, options, None)
    }

    /// The put-from call to this client's node: `blocks` of `buf` (grouped by `parts`, see
    /// [`PutFromRequest::parts`]) stored under `keys`; the ETags in order.
    pub(super) fn put_from_call(
        &self,
        bucket: &str,
        keys: &[String],
        buf: &Buffer,
        blocks: Vec<PutFromBlock<&str>>,
        options: &PutOptions,
        parts: Option<Vec<u32>>,
    ) -> Result<Vec<String>, KvError> {
        if let Some(done) =
            self.put_through_views(bucket, keys, buf, &blocks, parts.as_deref(), options)
        {
            return done;
        }
        self.put_from_plain(bucket, keys, buf, blocks, options, parts)
    }

    /// The put-from call itself: the node copies.
    pub(super) fn put_from_plain(
        &self,
        bucket: &str,
        keys: &[String],
        buf: &Buffer,
        blocks: Vec<PutFromBlock<&str>>,
        options: &PutOptions,
        parts: Option<Vec<u32>>,
    ) -> Result<Vec<String>, KvError> {
        let body = PutFromRequest {
            blocks,
            buffer: buf.whole()?,
            session: self.session.clone(),
            if_absent: options.mode == PutMode::IfAbsent,
            pin: options.pin,
            parts,
        };
        self.call_batch(
            bucket,
            KvOp::PutFrom,
            keys,
            &body,
            PutFromRequest::subset,
            |a: EtagsResponse| a.etags,
        )
    }

    /// The get-into call to this client's node; `rooms[i]` is the room key `i` was given, and
    /// an answer claiming more is refused.
    pub(super) fn get_into_call(
        &self,
        bucket: &str,
        keys: &[String],
        buf: &Buffer,
        body: &GetIntoRequest<&str>,
        rooms: impl Fn(usize) -> u64,
    ) -> Result<Vec<Option<u64>>, KvError> {
        let copied = match self.get_through_views(bucket, keys, buf, body) {
            Some(done) => done?,
            None => self.get_into_plain(bucket, keys, body)?,
        };
        for (i, c) in copied.iter().enumerate() {
            let room = rooms(i);
            if let Some(n) = c.filter(|n| *n > room) {
                return Err(KvError::InvalidResponse(format!(
                    "get-into claims {n} bytes for key {i}, which had room for {room}"
                )));
            }
        }
        Ok(copied)
    }

    /// The get-into call itself: the node copies.
    fn get_into_plain(
        &self,
        bucket: &str,
        keys: &[String],
        body: &GetIntoRequest<&str>,
    ) -> Result<Vec<Option<u64>>, KvError> {
        self.call_batch(
            bucket,
            KvOp::GetInto,
            keys,
            body,
            GetIntoRequest::subset,
            |a: CopiedResponse| a.copied,
        )
    }

    /// As [`NodeClient::batch_put_from_opts`], with the client moving the bytes: put-start reserves
    /// the ranges and returns their descriptors, this client writes into the node's arena
    /// one-sidedly (the path an RDMA- or GPU-capable engine takes), put-end publishes; the
    /// reserved puts are revoked when a write fails. Three round trips instead of one.
    pub fn batch_put_two_phase(
        &self,
        bucket: &str,
        keys: &[String],
        buf: &Buffer,
        offsets: &[u64],
        lengths: &[u64],
    ) -> Result<Vec<String>, KvError> {
        self.check_put(keys, buf, offsets, lengths)?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let body = PutStartRequest {
            blocks: keys
                .iter()
                .zip(lengths)
                .map(|(key, &len)| PutStartBlock {
                    key: key.clone(),
                    len,
                })
                .collect(),
            ttl_ms: self.put_ttl_ms,
        };
        let started: PutStartResponse = self.call_kv(bucket, KvOp::PutStart, Some(keys), &body)?;
        let put_ids = PutIdsRequest {
            put_ids: started.puts.iter().map(|p| p.put_id).collect(),
        };
        let result = self
            .write_blocks(keys, buf, offsets, lengths, &started.puts)
            .and_then(|()| {
                let ended: EtagsResponse = self.call_kv(bucket, KvOp::PutEnd, None, &put_ids)?;
                expect_len(ended.etags.len(), keys.len(), "put-end")?;
                Ok(ended.etags)
            });
        if result.is_err() && !put_ids.put_ids.is_empty() {
            // Best effort: frees the reserved space now instead of at the ttl. Puts already
            // ended are not revoked (the server answers false for them).
            let _ = self.call_kv::<RevokeResponse>(bucket, KvOp::Revoke, None, &put_ids);
        }
        result
    }

    /// Checks put-start's answer against the request, then writes every block one-sidedly.
    fn write_blocks(
        &self,
        keys: &[String],
        buf: &Buffer,
        offsets: &[u64],
        lengths: &[u64],
        puts: &[StartedPut],
    ) -> Result<(), KvError> {
        if puts.len() != keys.len() {
            return Err(KvError::InvalidResponse(format!(
                "put-start answered {} puts for {} blocks",
                puts.len(),
                keys.len()
            )));
        }
        let mut requests = Vec::with_capacity(puts.len());
        for (i, p) in puts.iter().enumerate() {
            if p.key != keys[i] {
                return Err(KvError::InvalidResponse(format!(
                    "put {i} is for key {:?}, not {:?}",
                    p.key, keys[i]
                )));
            }
            self.check_descriptor(&p.descriptor, i, lengths[i])?;
            if lengths[i] > 0 {
                requests.push(
                    TransferRequest::write(&buf.segment, offsets[i], &p.descriptor)
                        .range(0, lengths[i]),
                );
            }
        }
        if !requests.is_empty() {
            self.inner.engine.transfer(requests)?;
        }
        Ok(())
    }

    /// A descriptor from the server must name the server's engine and cover `len` bytes.
    fn check_descriptor(&self, d: &SegmentDescriptor, i: usize, len: u64) -> Result<(), KvError> {
        if d.node != self.server.node {
            return Err(KvError::InvalidResponse(format!(
                "block {i}'s descriptor names node {}, not the server's {}",
                d.node, self.server.node
            )));
        }
        if d.len < len {
            return Err(KvError::InvalidResponse(format!(
                "block {i}'s descriptor covers {} bytes, not {len}",
                d.len
            )));
        }
        Ok(())
    }

    /// Fetches `keys[i]` into `buf[offsets[i] .. offsets[i] + capacities[i]]` from this node
    /// (the node writes the bytes); each block's length, `None` where the key is absent.
    pub fn batch_get_into_ranges(
        &self,
        bucket: &str,
        keys: &[String],
        buf: &Buffer,
        offsets: &[u64],
        capacities: &[u64],
    ) -> Result<Vec<Option<u64>>, KvError> {
        same_len(keys, offsets.len(), "offsets")?;
        same_len(keys, capacities.len(), "capacities")?;
        check_batch(keys)?;
        self.check_buffer(buf)?;
        let mut ranges = Vec::with_capacity(keys.len());
        for (i, (&off, &cap)) in offsets.iter().zip(capacities).enumerate() {
            check_range(buf, i, off, cap)?;
            if cap == 0 {
                return Err(KvError::InvalidArgument(format!(
                    "key {i} has no room at offset {off}"
                )));
            }
            ranges.push((off, cap));
        }
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let body =
            GetIntoRequest::into_buffer(borrowed(keys), buf.whole()?, ranges, self.session.clone());
        self.get_into_call(bucket, keys, buf, &body, |i| capacities[i])
    }

    /// The bytes of `key` when the node's value mirror holds them (see `presence`).
    pub fn get_mirrored(&self, bucket: &str, key: &str) -> Option<Vec<u8>> {
        let (Some(frames), Some(tables)) = (&self.frames, &self.presence) else {
            return None;
        };
        if check_bucket(bucket).is_err() || key.is_empty() {
            return None;
        }
        let mut value = Vec::new();
        tables
            .read(frames, bucket, key, &mut value)
            .then_some(value)
    }

    /// Where `key`'s block lies in its shard's arena, when the node's table says so in a
    /// fresh located slot and this client has a view of that arena to copy it from (same
    /// host, see `presence` and `arena`); `None` says nothing of the key (ask the node).
    pub fn locate(&self, bucket: &str, key: &str) -> Option<Location> {
        let (Some(frames), Some(tables), Some(views)) = (&self.frames, &self.presence, &self.views)
        else {
            return None;
        };
        if check_bucket(bucket).is_err() || key.is_empty() {
            return None;
        }
        let loc = tables.locate(frames, bucket, key)?;
        views.view(frames, loc.shard)?;
        Some(loc)
    }

    /// Copies the block `loc` names into `dst` and then checks that its slot did not
    /// change meanwhile: `true` when `dst` now holds the block's `loc.len()` bytes, one
    /// whole version of it, as the node would have answered at some moment during the copy;
    /// `false` when the copy does not stand (the block changed or went, its pages are not
    /// the node's, or it is not inside the view): `dst` then holds garbage, and the caller
    /// asks the node.
    ///
    /// # Safety
    ///
    /// `dst` is valid for writes of `loc.len()` bytes and overlaps nothing else in use.
    pub unsafe fn copy_located(&self, loc: &Location, dst: *mut u8) -> bool {
        let (Some(frames), Some(tables), Some(views)) = (&self.frames, &self.presence, &self.views)
        else {
            return false;
        };
        if !tables.owns(loc) {
            return false;
        }
        let Some(view) = views.view(frames, loc.shard) else {
            return false;
        };
        let Ok(len) = usize::try_from(loc.len()) else {
            return false;
        };
        let Some(src) = view.at(loc.at.offset, loc.len()) else {
            return false;
        };
        // Pages the node has not allocated (or swapped out) are the node's to read.
        if !view.prepare(src, len) {
            return false;
        }
        // SAFETY: the source lies inside the view's mapping, which lives as long as this
        // client; a write to it racing the copy (the block's bytes reused after its slot
        // was emptied) only makes `dst` garbage, which the check below then refuses. The
        // destination is the caller's (this function's contract).
        unsafe { super::arena::copy(&[(src.cast_const(), dst, len)], false) };
        if !loc.still() {
            return false;
        }
        views.count(loc.len());
        tables.count_located();
        true
    }

    /// Blocks this client read through located slots (same host, see `presence`).
    pub fn located_hits(&self) -> u64 {
        self.presence.as_ref().map_or(0, |t| t.located_hits())
    }

    /// Values this client read from the node's value mirrors (same host, see `presence`).
    pub fn mirror_hits(&self) -> u64 {
        self.presence.as_ref().map_or(0, |t| t.mirror_hits())
    }

    /// The node's shard arenas this client has mapped (arena views, see `arena`).
    pub fn arena_views(&self) -> usize {
        self.views.as_ref().map_or(0, |v| v.mapped())
    }

    /// Bytes this client copied itself through arena views.
    pub fn view_bytes(&self) -> u64 {
        self.views.as_ref().map_or(0, |v| v.copied())
    }

    /// Puts this client made through rooms (one call each), and the rooms it holds now.
    pub fn rooms(&self) -> (u64, usize) {
        (self.rooms.taken(), self.rooms.count())
    }

    /// Whether each key is stored (in any tier).
    pub fn batch_exists(&self, bucket: &str, keys: &[String]) -> Result<Vec<bool>, KvError> {
        check_batch(keys)?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let (Some(frames), Some(tables)) = (&self.frames, &self.presence) else {
            return self.per_key(bucket, KvOp::Exists, keys, |a: ExistsResponse| a.exists);
        };
        check_bucket(bucket)?;
        check_keys(keys)?;
        let mut found = tables.lookup(frames, bucket, keys);
        let ask: Vec<usize> = (0..keys.len()).filter(|&i| found[i].is_none()).collect();
        if !ask.is_empty() {
            let asked: Vec<String> = ask.iter().map(|&i| keys[i].clone()).collect();
            let answers =
                self.per_key(bucket, KvOp::Exists, &asked, |a: ExistsResponse| a.exists)?;
            for (i, a) in ask.into_iter().zip(answers) {
                found[i] = Some(a);
            }
        }
        Ok(found.into_iter().map(|f| f.unwrap_or(false)).collect())
    }

    /// Presence tables this client maps now.
    pub fn presence_tables(&self) -> usize {
        self.presence.as_ref().map_or(0, |t| t.mapped())
    }

    /// A call of `op` on `keys` whose answer is one flag per key (exists, remove), split by
    /// owning shard where frames allow ([`NodeClient::split_by_shard`]).
    fn per_key<T: DeserializeOwned>(
        &self,
        bucket: &str,
        op: KvOp,
        keys: &[String],
        flags: impl Fn(T) -> Vec<bool>,
    ) -> Result<Vec<bool>, KvError> {
        let request = keys_request(keys);
        self.call_batch(
            bucket,
            op,
            keys,
            &request,
            |r: &KeysRequest, idx| {
                Some(keys_request(
                    &idx.iter().map(|&i| r.keys[i].clone()).collect::<Vec<_>>(),
                ))
            },
            flags,
        )
    }

    /// A batch call of `op` on `keys` whose answer has one entry per key (`each` takes the
    /// list out of an answer): split by owning shard where frames allow
    /// ([`NodeClient::split_by_shard`], `subset` making each shard's request), else one call.
    fn call_batch<R: Serialize, T: DeserializeOwned, X: Default>(
        &self,
        bucket: &str,
        op: KvOp,
        keys: &[String],
        body: &R,
        subset: impl Fn(&R, &[usize]) -> Option<R>,
        each: impl Fn(T) -> Vec<X>,
    ) -> Result<Vec<X>, KvError> {
        let out = match self.split_by_shard(bucket, keys) {
            Some((frames, groups)) => {
                let parts =
                    self.call_groups(frames, bucket, op, &groups, |idx| subset(body, idx))?;
                merge_groups(keys.len(), parts, &each, op.as_str())?
            }
            None => each(self.call_kv(bucket, op, Some(keys), body)?),
        };
        expect_len(out.len(), keys.len(), op.as_str())?;
        Ok(out)
    }

    /// With frames, and `keys` owned by more than one of the node's shards: each owning
    /// shard with the indices of its keys (request order kept within each). Each shard's part
    /// then goes straight to it, every part sent before any answer is read, so the shards work
    /// at once and none forwards to another (from Python, a 256-key get-into of 4 KiB blocks
    /// on two shards took about 1.0 ms through one of them, 0.7 ms when one shard held every
    /// key, and 0.57-0.67 ms split). `None`: one call does it all.
    fn split_by_shard(
        &self,
        bucket: &str,
        keys: &[String],
    ) -> Option<(&frames::Frames, Vec<ShardGroup>)> {
        let frames = self.frames.as_ref().filter(|_| keys.len() > 1)?;
        let groups = shard_groups(bucket, keys, frames.shards());
        (groups.len() > 1).then_some((frames, groups))
    }

    /// One call of `op` per group of [`NodeClient::split_by_shard`], its body made by
    /// `request` from the group's indices (`None`: the request cannot be split, an error);
    /// each group's indices with its answer.
    fn call_groups<'g, R: Serialize, T: DeserializeOwned>(
        &self,
        frames: &frames::Frames,
        bucket: &str,
        op: KvOp,
        groups: &'g [ShardGroup],
        request: impl Fn(&[usize]) -> Option<R>,
    ) -> Result<Vec<(&'g [usize], T)>, KvError> {
        check_bucket(bucket)?;
        let calls = groups
            .iter()
            .map(|(shard, idx)| {
                let body = request(idx).ok_or_else(|| {
                    KvError::InvalidArgument(format!(
                        "the {op} request's spans do not fit its keys"
                    ))
                })?;
                yutu_api::kv_frame::encode_call(bucket, &body)
                    .map(|body| (*shard, body))
                    .map_err(|e| KvError::InvalidArgument(e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let answers: Vec<T> =
            frames.call_each(yutu_api::kv_frame::FrameOp::Kv(op), &calls, op.is_read())?;
        Ok(groups
            .iter()
            .map(|(_, idx)| idx.as_slice())
            .zip(answers)
            .collect())
    }

    /// How many leading keys of the chain `keys` are stored (the usable cached prefix).
    pub fn prefix(&self, bucket: &str, keys: &[String]) -> Result<usize, KvError> {
        check_batch(keys)?;
        if keys.is_empty() {
            return Ok(0);
        }
        if let (Some(frames), Some(tables)) = (&self.frames, &self.presence) {
            check_bucket(bucket)?;
            check_keys(keys)?;
            let found = tables.lookup(frames, bucket, keys);
            let known = found.iter().take_while(|f| **f == Some(true)).count();
            if known == keys.len() || found.get(known) == Some(&Some(false)) {
                return Ok(known);
            }
        }
        let answer: PrefixResponse =
            self.call_kv(bucket, KvOp::Prefix, Some(keys), &keys_request(keys))?;
        match usize::try_from(answer.present) {
            Ok(n) if n <= keys.len() => Ok(n),
            _ => Err(KvError::InvalidResponse(format!(
                "prefix claims {} of {} keys",
                answer.present,
                keys.len()
            ))),
        }
    }

    /// Deletes the keys; `true` where one was there.
    pub fn remove(&self, bucket: &str, keys: &[String]) -> Result<Vec<bool>, KvError> {
        check_batch(keys)?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        self.per_key(bucket, KvOp::Remove, keys, |a: RemoveResponse| a.removed)
    }

    fn check_put(
        &self,
        keys: &[String],
        buf: &Buffer,
        offsets: &[u64],
        lengths: &[u64],
    ) -> Result<(), KvError> {
        super::check_put(&self.inner, keys, buf, offsets, lengths)
    }

    pub(super) fn check_buffer(&self, buf: &Buffer) -> Result<(), KvError> {
        super::check_buffer(&self.inner, buf)
    }

    fn call_post<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &impl Serialize,
    ) -> Result<T, KvError> {
        self.call_post_keys(None, path, body)
    }

    /// Opens a connection in search of a lane: a new agent, and the shard its first call
    /// reached.
    fn open_lane(&self) -> Option<(Agent, usize)> {
        let agent = kv_agent(self.lane_config.clone(), self.base.starts_with("https://"));
        let signer = self.credentials.as_ref().map(|c| (c, self.host.as_str()));
        let (_, served): (NodeAddress, _) =
            call_get(&agent, &self.base, ENGINE_PATH, signer).ok()?;
        Some((agent, served?.0))
    }

    /// A per-bucket call of the KV API: in a frame to the shard that owns `keys` (the first
    /// key's, when they span shards) when the node takes frames, else as an HTTP POST.
    pub(super) fn call_kv<T: DeserializeOwned>(
        &self,
        bucket: &str,
        op: KvOp,
        keys: Option<&[String]>,
        body: &impl Serialize,
    ) -> Result<T, KvError> {
        if let Some(frames) = &self.frames {
            check_bucket(bucket)?;
            let shard = keys.and_then(|k| k.first()).map_or(0, |k| {
                yutu_api::placement::shard_for(bucket, k, frames.shards())
            });
            return frames.call_kv(shard, bucket, op, body);
        }
        self.call_post_keys(keys.map(|k| (bucket, k)), &kv_path(bucket, op)?, body)
    }

    /// How this client sends KV calls: `None` over HTTP, else the way its frames go.
    pub fn frames_path(&self) -> Option<&frames::FramesPath> {
        self.frames.as_ref().map(|f| f.path())
    }

    /// A POST whose keys (of `keys.0`) are `keys.1`: sent on the lane of the shard that owns
    /// them all, when there is one.
    fn call_post_keys<T: DeserializeOwned>(
        &self,
        keys: Option<(&str, &[String])>,
        path: &str,
        body: &impl Serialize,
    ) -> Result<T, KvError> {
        let raw = serde_json::to_vec(body)
            .map_err(|e| KvError::InvalidArgument(format!("cannot encode the request: {e}")))?;
        let lane = keys.and_then(|(bucket, keys)| self.lane(bucket, keys));
        let agent = lane.as_ref().map_or(&self.agent, |(_, a)| a);
        let mut req = agent
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json");
        if let Some(c) = &self.credentials {
            let now = std::time::SystemTime::now();
            // The path after the base URL is signed, not a path prefix of the base URL: a
            // node serves at its root, so a prefix is one a proxy strips before the node
            // verifies the signature over what it receives (tests/kv_prefix.rs).
            for (name, value) in c.sign("POST", &self.host, path, "", &raw, now) {
                req = req.header(name, value);
            }
        }
        let resp = req.send(&raw[..]).map_err(ClientError::from)?;
        self.answered_on(&lane, &resp);
        read_json(resp)
    }

    /// The lane of the shard that owns all of `keys` (of `bucket`), when there is one: its
    /// shard and its agent.
    fn lane(&self, bucket: &str, keys: &[String]) -> Option<(usize, Agent)> {
        let lanes = self.lanes.as_ref()?;
        let shard = lanes.owner(bucket, keys)?;
        Some((shard, lanes.agent(shard, || self.open_lane())?))
    }

    /// Checks that an answer sent on `lane` came from its shard (`lanes::Lanes::answered`).
    fn answered_on<B>(&self, lane: &Option<(usize, Agent)>, resp: &ureq::http::Response<B>) {
        if let (Some(lanes), Some((shard, _))) = (&self.lanes, lane) {
            lanes.answered(*shard, lanes::served_by(resp));
        }
    }

    /// The bytes of `key` (through the node's S3 GET, on the owning shard's lane), `None`
    /// when it is absent: for a small read where staging it through a registered buffer
    /// would cost more than it saves.
    pub fn get_bytes(&self, bucket: &str, key: &str) -> Result<Option<Vec<u8>>, KvError> {
        match self.get_small(bucket, key, u64::MAX)? {
            SmallValue::Bytes(data) => Ok(Some(data)),
            SmallValue::Missing => Ok(None),
            // Too large to answer inline: an S3 GET streams it.
            SmallValue::Large(_) => self.get_streamed(bucket, key),
        }
    }

    /// The bytes of `key` when it holds at most `max` bytes, else its size
    /// ([`SmallValue::Large`]), in one frame to the owning shard; a client without frames
    /// reads the value whole over HTTP whatever its size (it never answers `Large`).
    pub fn get_small(&self, bucket: &str, key: &str, max: u64) -> Result<SmallValue, KvError> {
        check_bucket(bucket)?;
        if key.is_empty() {
            return Err(KvError::InvalidArgument("a key cannot be empty".into()));
        }
        let Some(frames) = &self.frames else {
            return Ok(match self.get_streamed(bucket, key)? {
                Some(data) => SmallValue::Bytes(data),
                None => SmallValue::Missing,
            });
        };
        if let Some(value) = self.get_mirrored(bucket, key) {
            let len = value.len() as u64;
            return Ok(if len <= max {
                SmallValue::Bytes(value)
            } else {
                SmallValue::Large(len)
            });
        }
        use yutu_api::kv_frame::{InlineValue, ReadRequest, ReadResponse};
        let shard = yutu_api::placement::shard_for(bucket, key, frames.shards());
        // A node too old to take the limit answers values whole, as it always did.
        let limited = frames.read_limit() && max < yutu_api::kv_frame::MAX_INLINE;
        let req = ReadRequest {
            keys: vec![key.to_string()],
            value_max: limited.then_some(max),
        };
        let body = yutu_api::kv_frame::encode_call(bucket, &req)
            .map_err(|e| KvError::InvalidArgument(e.to_string()))?;
        let answer: ReadResponse =
            frames.call(shard, yutu_api::kv_frame::FrameOp::Read, &body, true)?;
        expect_len(answer.values.len(), 1, "read")?;
        Ok(match answer.values.into_iter().next() {
            Some(InlineValue::Bytes(data)) => SmallValue::Bytes(data),
            Some(InlineValue::Missing) | None => SmallValue::Missing,
            Some(InlineValue::TooLarge(n)) => SmallValue::Large(n),
        })
    }

    /// The bytes of `key` by an S3 GET, `None` when it is absent.
    fn get_streamed(&self, bucket: &str, key: &str) -> Result<Option<Vec<u8>>, KvError> {
        let path = format!("/{}/{}", encode_key(bucket), encode_key(key));
        let lane = self.lane(bucket, &[key.to_string()]);
        let agent = lane.as_ref().map_or(&self.agent, |(_, a)| a);
        let signer = self.credentials.as_ref().map(|c| (c, self.host.as_str()));
        let mut resp = signed_get(agent, &self.base, &path, signer)?;
        self.answered_on(&lane, &resp);
        match check_status(&mut resp, Resource::Object) {
            Ok(()) => {}
            Err(e) if e.code() == Some("NoSuchKey") => return Ok(None),
            Err(e) => return Err(e),
        }
        let mut out = Vec::new();
        resp.body_mut()
            .as_reader()
            .read_to_end(&mut out)
            .map_err(ClientError::Io)?;
        Ok(Some(out))
    }

    /// How many shards of the node this client holds a connection to (0 for a node of one
    /// shard): see `lanes`.
    pub fn shard_lanes(&self) -> usize {
        self.lanes.as_ref().map_or(0, |l| l.found())
    }
}

/// The keys of a batch as borrowed strings, for a request serialized from them (see the
/// request types in `yutu_api::kv`): no key is copied to make a call.
pub(super) fn borrowed(keys: &[String]) -> Vec<&str> {
    keys.iter().map(String::as_str).collect()
}

/// A shard, and the indices of a request's keys it owns.
pub(super) type ShardGroup = (usize, Vec<usize>);

/// The shards of a node of `shards` that own some of `keys`, each with the indices of its
/// keys (request order kept within each), in shard order.
pub(super) fn shard_groups(bucket: &str, keys: &[String], shards: usize) -> Vec<ShardGroup> {
    let mut groups: Vec<Vec<usize>> = vec![Vec::new(); shards];
    for (i, k) in keys.iter().enumerate() {
        groups[yutu_api::placement::shard_for(bucket, k, shards)].push(i);
    }
    groups
        .into_iter()
        .enumerate()
        .filter(|(_, g)| !g.is_empty())
        .collect()
}

/// The per-key answers of the groups of a split call (each group's indices with its answer,
/// `each` taking an answer's per-key list) back in the order of the `n` keys.
fn merge_groups<T, X: Default>(
    n: usize,
    parts: Vec<(&[usize], T)>,
    each: impl Fn(T) -> Vec<X>,
    what: &str,
) -> Result<Vec<X>, KvError> {
    let mut out: Vec<X> = (0..n).map(|_| X::default()).collect();
    for (idx, answer) in parts {
        let part = each(answer);
        expect_len(part.len(), idx.len(), what)?;
        for (&i, x) in idx.iter().zip(part) {
            out[i] = x;
        }
    }
    Ok(out)
}

/// Keys the node would refuse, refused here too: a lookup in a table must fail as the call
/// would.
fn check_keys(keys: &[String]) -> Result<(), KvError> {
    keys.iter().try_for_each(|k| {
        yutu_api::validate_object_key(k)
            .map_err(|e| KvError::InvalidArgument(format!("{k:?}: {e}")))
    })
}
