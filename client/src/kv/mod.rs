//! [`KvClient`]: the KV block API (`/v1/kv/...`), with block bytes moved one-sidedly.
//!
//! The control documents are JSON over HTTP; the bytes never travel in them. The client runs
//! its own transfer engine and registers [`Buffer`]s with it, and one call moves a batch: a
//! put asks the server to read the blocks out of ranges of the buffer (put-from), a get asks
//! it to write them into ranges of the buffer (get-into). On the same host the server's
//! shards copy straight between their arenas and the mapped buffer; elsewhere its engine moves
//! the bytes one-sidedly over tcp (or rdma). [`KvClient::batch_put_two_phase`] is the form in
//! which this client writes into the server's arena itself (put-start, writes, put-end).
//!
//! ```no_run
//! # fn main() -> Result<(), yutu_client::kv::KvError> {
//! use yutu_client::kv::{KvClient, KvOptions};
//! let kv = KvClient::new("http://127.0.0.1:9000", KvOptions::default())?;
//! let buf = kv.register(8 << 20)?;
//! buf.write_at(0, b"kv block")?;
//! let keys = vec!["blk-0".to_string()];
//! kv.batch_put_from("models", &keys, &buf, &[0], &[8])?;
//! let copied = kv.batch_get_into("models", &keys, &buf, &[4 << 20])?;
//! assert_eq!(copied, vec![Some(8)]);
//! # Ok(())
//! # }
//! ```

use std::hash::{BuildHasher, Hasher};
use std::path::PathBuf;
use std::sync::Arc;

use yutu_transfer::{LocalSegment, NodeAddress, SegmentDescriptor, TransferEngine};

pub use yutu_api::block_hash::{BlockHash, BlockHasher};

mod arena;
mod checks;
mod cluster;
mod device;
mod error;
mod frames;
mod http;
mod lanes;
mod node;
mod options;
mod own;
mod parts;
mod presence;
mod rooms;
mod spans;
mod view_calls;
mod view_pages;

use checks::{check_batch, check_range, same_len};
pub use error::KvError;

/// What [`KvClient::get_small`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SmallValue {
    /// The whole value.
    Bytes(Vec<u8>),
    /// No such key.
    Missing,
    /// Stored, with this many bytes: more than the call's limit.
    Large(u64),
}
pub use frames::{FramesMode, FramesPath};
use http::{check_bucket, read_json};
pub use node::NodeClient;
pub use options::{KvOptions, PutMode, PutOptions};
pub use own::answered;
pub use parts::Parts;
pub use presence::Location;
pub use spans::{InPlace, Span, SpanStaging, MAX_STAGED_BLOCK};

pub use device::{
    BlockFailures, DeviceBuffer, Memory, STAGING_BUFFERS, STAGING_HALF, STAGING_WAIT,
};
pub use yutu_transfer::device::staging::{BlockError, DeviceBlock};
pub use yutu_transfer::device::{CancelToken, Device, DeviceError, DeviceMemory, HostDevice};

/// Most keys the server takes in one batch.
pub const MAX_BATCH: usize = yutu_api::kv::MAX_BATCH;

/// The engine and what must outlive it; the shm directory goes when the last user does.
struct Inner {
    engine: TransferEngine,
    /// The engine's address, sent with every call in which the server moves the bytes.
    address: NodeAddress,
    shm_dir: Option<PathBuf>,
    /// GPU ranges registered with the NIC, so that calls naming raw device blocks inside one
    /// use GPUDirect too; each entry leaves with its [`DeviceBuffer`].
    gpudirect: device::DirectRanges,
}

/// Removes the shm directories (`yutu-kv-PID-RANDOM`) that clients killed before they could
/// clean up left in `tmp`: only this user's, and only where no process has that pid.
fn remove_stale_dirs(tmp: &std::path::Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("yutu-kv-"))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<i32>().ok())
            .filter(|pid| *pid > 0)
        else {
            continue;
        };
        let mine = entry.metadata().is_ok_and(|m| m.is_dir() && m.uid() == uid);
        // SAFETY: signal 0 only checks whether the process exists.
        let gone = unsafe { libc::kill(pid, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if mine && gone {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(dir) = &self.shm_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Memory registered with a [`KvClient`]'s engine: the source of puts and the target of gets.
/// Unregistered when dropped.
pub struct Buffer {
    segment: LocalSegment,
    inner: Arc<Inner>,
}

impl Buffer {
    /// Bytes in the buffer (at least what was asked for; rounded up to whole pages).
    pub fn len(&self) -> u64 {
        self.segment.len()
    }

    /// Always false: a buffer has at least one byte.
    pub fn is_empty(&self) -> bool {
        self.segment.is_empty()
    }

    /// Copies `src` into the buffer at `offset`.
    pub fn write_at(&self, offset: u64, src: &[u8]) -> Result<(), KvError> {
        Ok(self.segment.region().write_at(offset, src)?)
    }

    /// Copies bytes from `offset` into `dst`.
    pub fn read_at(&self, offset: u64, dst: &mut [u8]) -> Result<(), KvError> {
        Ok(self.segment.region().read_at(offset, dst)?)
    }

    /// The registered segment, for callers that drive the engine themselves.
    pub fn segment(&self) -> &LocalSegment {
        &self.segment
    }

    /// A descriptor for the whole buffer: the server checks it once and then addresses
    /// ranges of it, so one descriptor serves every call.
    fn whole(&self) -> Result<SegmentDescriptor, KvError> {
        Ok(self.segment.descriptor(0, self.segment.len())?)
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer")
            .field("segment", &self.segment.id())
            .field("len", &self.len())
            .finish()
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        self.inner.engine.unregister(&self.segment);
    }
}

/// A blocking client of the KV block API: each call goes to the nodes that own its keys. A
/// node alone is a cluster of one, whose calls all go to it; with a cluster the client
/// learns the membership from the node it is given and follows it (see `cluster`). The
/// calls to each node are a [`NodeClient`]'s.
pub struct KvClient {
    /// Where each call goes: the node given, or the owners of its keys in a cluster.
    route: cluster::Routing,
    /// The transfer engine every node's client shares (one registered buffer serves all).
    inner: Arc<Inner>,
    /// Pinned staging buffers for device memory, per device.
    staging: device::StagingPool,
    /// This process's own memory as one registration (`own.rs`), made on first use.
    own: std::sync::OnceLock<Option<Arc<Buffer>>>,
}

impl std::fmt::Debug for KvClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvClient")
            .field("node", self.route.seed())
            .field("cluster_nodes", &self.cluster_nodes())
            .finish()
    }
}

impl KvClient {
    /// Starts a transfer engine, asks `base_url` for its engine's address and peers with it.
    /// When the node is part of a cluster (and `options.route`), the client learns the
    /// membership from it and from then on sends each key to the nodes that own it.
    pub fn new(base_url: &str, options: KvOptions) -> Result<KvClient, KvError> {
        let seed = Arc::new(NodeClient::connect(base_url, &options, None)?);
        Ok(KvClient {
            inner: seed.inner.clone(),
            route: cluster::Routing::new(seed, &options)?,
            staging: device::StagingPool::default(),
            own: std::sync::OnceLock::new(),
        })
    }

    /// [`KvClient::new`] on the first of `seeds` (node URLs of one cluster) that answers.
    pub fn new_cluster(seeds: &[String], options: KvOptions) -> Result<KvClient, KvError> {
        let mut last = KvError::InvalidArgument("no seed URL given".into());
        for seed in seeds {
            match Self::new(seed, options.clone()) {
                Ok(c) => return Ok(c),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// How many nodes this client routes over (0 when it talks to one node only).
    pub fn cluster_nodes(&self) -> usize {
        self.route.members()
    }

    /// The client of the node this client was made with.
    pub fn node(&self) -> &NodeClient {
        self.route.seed()
    }

    /// The session the node registered this client's engine under.
    pub fn session(&self) -> &str {
        self.node().session()
    }

    /// The server's base URL.
    pub fn base_url(&self) -> &str {
        self.node().base_url()
    }

    /// This client's transfer engine.
    pub fn engine(&self) -> &TransferEngine {
        &self.inner.engine
    }

    /// The server engine's address, as the server announced it.
    pub fn server_address(&self) -> &NodeAddress {
        self.node().server_address()
    }

    /// Allocates and registers a buffer of at least `len` bytes (zeroed).
    pub fn register(&self, len: u64) -> Result<Buffer, KvError> {
        self.node().register(len)
    }

    /// How this client sends KV calls to its node: `None` over HTTP, else the way its frames
    /// go.
    pub fn frames_path(&self) -> Option<&FramesPath> {
        self.node().frames_path()
    }

    /// How many shards of the node this client holds a connection to (0 for a node of one
    /// shard): see `lanes`.
    pub fn shard_lanes(&self) -> usize {
        self.node().shard_lanes()
    }

    /// Stores `keys[i]` from `buf[offsets[i] .. offsets[i] + lengths[i]]`: the server reads
    /// the blocks out of the buffer (put-from). Returns the ETags, in order. Blocks are visible
    /// (also through S3) once this returns; each block is stored whole or not at all, and on
    /// an error the blocks before the failing one may be stored.
    pub fn batch_put_from<'a>(
        &self,
        bucket: &str,
        keys: &[String],
        buf: impl Into<Memory<'a>>,
        offsets: &[u64],
        lengths: &[u64],
    ) -> Result<Vec<String>, KvError> {
        self.batch_put_from_with(bucket, keys, buf, offsets, lengths, PutMode::Overwrite)
    }

    /// As [`KvClient::batch_put_from`]; with [`PutMode::IfAbsent`] a key already stored keeps
    /// its bytes and answers an empty ETag (Mooncake's `put`, where `upsert` overwrites).
    pub fn batch_put_from_with<'a>(
        &self,
        bucket: &str,
        keys: &[String],
        buf: impl Into<Memory<'a>>,
        offsets: &[u64],
        lengths: &[u64],
        mode: PutMode,
    ) -> Result<Vec<String>, KvError> {
        let options = PutOptions {
            mode,
            ..PutOptions::default()
        };
        self.batch_put_from_opts(bucket, keys, buf, offsets, lengths, &options)
    }

    /// As [`KvClient::batch_put_from`], with Mooncake's `ReplicateConfig` choices: the mode,
    /// how many copies (in a cluster), a preferred node, and a pin.
    ///
    /// From a [`DeviceBuffer`] the node reads the blocks by GPUDirect RDMA where the buffer
    /// is registered with the NIC and every node offers RDMA; otherwise they are staged
    /// through pinned host memory, and a device copy that fails fails its block only
    /// ([`KvError::Blocks`]).
    pub fn batch_put_from_opts<'a>(
        &self,
        bucket: &str,
        keys: &[String],
        buf: impl Into<Memory<'a>>,
        offsets: &[u64],
        lengths: &[u64],
        options: &PutOptions,
    ) -> Result<Vec<String>, KvError> {
        if let Some(r) = options.replicas {
            if !(1..=yutu_api::cluster::MAX_REPLICAS).contains(&r) {
                return Err(KvError::InvalidArgument(format!(
                    "replicas must be 1 to {}",
                    yutu_api::cluster::MAX_REPLICAS
                )));
            }
        }
        let buf = match buf.into() {
            Memory::Host(b) => b,
            Memory::Device(d) => match self.direct_buffer(d)? {
                Some(registered) => registered,
                None => {
                    same_len(keys, offsets.len(), "offsets")?;
                    same_len(keys, lengths.len(), "lengths")?;
                    let blocks = KvClient::device_blocks(d, offsets, lengths)?;
                    // SAFETY: the blocks lie inside the registered device buffer, whose
                    // registration vouched for the memory.
                    return unsafe {
                        self.batch_put_from_device(bucket, keys, d.device(), &blocks, options, None)
                    };
                }
            },
        };
        self.check_put(keys, buf, offsets, lengths)?;
        self.route
            .put_from(bucket, keys, buf, offsets, lengths, options)
    }

    /// As [`KvClient::batch_put_from`], with the client moving the bytes: put-start reserves
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
        self.route
            .put_two_phase(bucket, keys, buf, offsets, lengths)
    }

    /// Fetches `keys[i]` into `buf` at `offsets[i]`; the server writes the bytes one-sidedly.
    /// Each key may fill its offset up to the next larger offset (or the buffer's end), so
    /// offsets must differ. Returns each block's length, or `None` where the key is absent.
    pub fn batch_get_into<'a>(
        &self,
        bucket: &str,
        keys: &[String],
        buf: impl Into<Memory<'a>>,
        offsets: &[u64],
    ) -> Result<Vec<Option<u64>>, KvError> {
        let mut buf = buf.into();
        same_len(keys, offsets.len(), "offsets")?;
        let mut order: Vec<usize> = (0..offsets.len()).collect();
        order.sort_by_key(|&i| offsets[i]);
        let mut capacities = vec![0u64; offsets.len()];
        for (n, &i) in order.iter().enumerate() {
            let end = match order.get(n + 1) {
                Some(&next) if offsets[next] == offsets[i] => {
                    return Err(KvError::InvalidArgument(format!(
                        "keys {i} and {next} share offset {}",
                        offsets[i]
                    )))
                }
                Some(&next) => offsets[next],
                None => buf.len(),
            };
            capacities[i] = end.saturating_sub(offsets[i]);
        }
        if let Memory::Device(d) = buf {
            // Decided once here: the GPUDirect registration goes on as host-like memory.
            match self.direct_buffer(d)? {
                Some(registered) => buf = Memory::Host(registered),
                None => {
                    if let Some(&last) = order.last() {
                        device::cap_open_room(&mut capacities, last);
                    }
                }
            }
        }
        self.batch_get_into_ranges(bucket, keys, buf, offsets, &capacities)
    }

    /// As [`KvClient::batch_get_into`], with the room for each key given: key `i` may be
    /// written to `buf[offsets[i] .. offsets[i] + capacities[i]]` and no further; a block
    /// larger than its room fails the batch (`InvalidArgument` from the server).
    ///
    /// Into a [`DeviceBuffer`] the node writes the blocks by GPUDirect RDMA where the buffer
    /// is registered with the NIC and every node offers RDMA; otherwise they are staged
    /// through pinned host memory, and a device copy that fails fails its block only
    /// ([`KvError::Blocks`]).
    pub fn batch_get_into_ranges<'a>(
        &self,
        bucket: &str,
        keys: &[String],
        buf: impl Into<Memory<'a>>,
        offsets: &[u64],
        capacities: &[u64],
    ) -> Result<Vec<Option<u64>>, KvError> {
        same_len(keys, offsets.len(), "offsets")?;
        same_len(keys, capacities.len(), "capacities")?;
        check_batch(keys)?;
        let buf = match buf.into() {
            Memory::Host(b) => b,
            Memory::Device(d) => match self.direct_buffer(d)? {
                Some(registered) => registered,
                None => {
                    if let Some(i) = capacities.iter().position(|&c| c == 0) {
                        return Err(KvError::InvalidArgument(format!(
                            "key {i} has no room at offset {}",
                            offsets[i]
                        )));
                    }
                    let blocks = KvClient::device_blocks(d, offsets, capacities)?;
                    // SAFETY: the blocks lie inside the registered device buffer, whose
                    // registration vouched for the memory.
                    return unsafe {
                        self.batch_get_into_device(bucket, keys, d.device(), &blocks, None)
                    };
                }
            },
        };
        self.check_buffer(buf)?;
        // Checked whole before any node is asked (the nodes' parts are checked again).
        for (i, (&off, &cap)) in offsets.iter().zip(capacities).enumerate() {
            check_range(buf, i, off, cap)?;
            if cap == 0 {
                return Err(KvError::InvalidArgument(format!(
                    "key {i} has no room at offset {off}"
                )));
            }
        }
        self.route.get_into(bucket, keys, buf, offsets, capacities)
    }

    /// Whether each key is stored (in any tier).
    pub fn batch_exists(&self, bucket: &str, keys: &[String]) -> Result<Vec<bool>, KvError> {
        check_batch(keys)?;
        self.route.exists(bucket, keys)
    }

    /// Presence tables this client maps now (0 in a cluster, or when the node shares none
    /// with this client).
    pub fn presence_tables(&self) -> usize {
        self.node().presence_tables()
    }

    /// Values this client read from its node's value mirrors instead of asking the node
    /// (same host, small KV blocks: see `docs/kv-api.md`).
    pub fn mirror_hits(&self) -> u64 {
        self.node().mirror_hits()
    }

    /// The node's shard arenas this client maps (same host, where this process could read
    /// the node's memory anyway: see `docs/kv-api.md`, arena views).
    pub fn arena_views(&self) -> usize {
        self.node().arena_views()
    }

    /// Bytes of large get-into and put-from calls this client copied itself, through arena
    /// views, rather than the node.
    pub fn view_bytes(&self) -> u64 {
        self.node().view_bytes()
    }

    /// Puts this client made through rooms (a range the node reserved ahead of the key, so
    /// the put is one call: see `docs/kv-api.md`), and the rooms it holds now.
    pub fn rooms(&self) -> (u64, usize) {
        self.node().rooms()
    }

    /// How many leading keys of the chain `keys` are stored (the usable cached prefix).
    pub fn prefix(&self, bucket: &str, keys: &[String]) -> Result<usize, KvError> {
        check_batch(keys)?;
        self.route.prefix(bucket, keys)
    }

    /// Deletes the keys; `true` where one was there.
    pub fn remove(&self, bucket: &str, keys: &[String]) -> Result<Vec<bool>, KvError> {
        check_batch(keys)?;
        self.route.remove(bucket, keys)
    }

    /// The bytes of `key`, `None` when it is absent. On a node of its own, a value past
    /// 64 KiB is written by the node straight into the new vector (this process's own
    /// memory, see `own.rs`) rather than carried in the answer's frames.
    pub fn get_bytes(&self, bucket: &str, key: &str) -> Result<Option<Vec<u8>>, KvError> {
        check_bucket(bucket)?;
        if key.is_empty() {
            return Err(KvError::InvalidArgument("a key cannot be empty".into()));
        }
        if let Some(done) = self.get_bytes_own(bucket, key) {
            return done;
        }
        self.route.get_bytes(bucket, key)
    }

    /// The bytes of `key` when it holds at most `max` bytes, else only its size
    /// ([`SmallValue::Large`]), so that a caller moves a large value through registered
    /// memory (one `memcpy` on the node) rather than through the call's socket. Where the
    /// size cannot be asked first (a client without frames, or one routing over a cluster),
    /// the value comes whole whatever its size.
    pub fn get_small(&self, bucket: &str, key: &str, max: u64) -> Result<SmallValue, KvError> {
        check_bucket(bucket)?;
        if key.is_empty() {
            return Err(KvError::InvalidArgument("a key cannot be empty".into()));
        }
        self.route.get_small(bucket, key, max)
    }

    /// The bytes of `key` when its node's value mirror holds them (same host, a small KV
    /// block the node served once): a copy out of this process's own mapping, no call.
    /// `None` says nothing of the key (ask with [`KvClient::get_small`]).
    pub fn get_mirrored(&self, bucket: &str, key: &str) -> Option<Vec<u8>> {
        self.node().get_mirrored(bucket, key)
    }

    /// Where `key`'s block lies in its node's arena, when the node's table has a fresh
    /// located slot for it and this client a view of the arena (same host, one node): then
    /// [`KvClient::copy_located`] copies it without a call. `None` says nothing of the key.
    pub fn locate(&self, bucket: &str, key: &str) -> Option<Location> {
        if self.route.is_cluster() {
            return None;
        }
        self.node().locate(bucket, key)
    }

    /// Copies the block `loc` names into `dst`, `true` when the copy stands (see
    /// [`NodeClient::copy_located`]; on `false` ask the node).
    ///
    /// # Safety
    ///
    /// `dst` is valid for writes of `loc.len()` bytes and overlaps nothing else in use.
    pub unsafe fn copy_located(&self, loc: &Location, dst: *mut u8) -> bool {
        // SAFETY: the caller's contract.
        unsafe { self.node().copy_located(loc, dst) }
    }

    /// Blocks read through located slots, without a call (for tests and diagnostics).
    pub fn located_hits(&self) -> u64 {
        self.node().located_hits()
    }

    fn check_put(
        &self,
        keys: &[String],
        buf: &Buffer,
        offsets: &[u64],
        lengths: &[u64],
    ) -> Result<(), KvError> {
        check_put(&self.inner, keys, buf, offsets, lengths)
    }

    fn check_buffer(&self, buf: &Buffer) -> Result<(), KvError> {
        check_buffer(&self.inner, buf)
    }
}

/// The arguments of a put: `buf` is the engine's, one offset and length per key, every range
/// inside `buf`.
fn check_put(
    inner: &Arc<Inner>,
    keys: &[String],
    buf: &Buffer,
    offsets: &[u64],
    lengths: &[u64],
) -> Result<(), KvError> {
    check_buffer(inner, buf)?;
    same_len(keys, offsets.len(), "offsets")?;
    same_len(keys, lengths.len(), "lengths")?;
    check_batch(keys)?;
    for (i, (&off, &len)) in offsets.iter().zip(lengths).enumerate() {
        check_range(buf, i, off, len)?;
    }
    Ok(())
}

/// `buf` was registered with the engine of `inner`.
fn check_buffer(inner: &Arc<Inner>, buf: &Buffer) -> Result<(), KvError> {
    if !Arc::ptr_eq(&buf.inner, inner) {
        return Err(KvError::InvalidArgument(
            "the buffer was registered by another KvClient".into(),
        ));
    }
    Ok(())
}

/// A random node id: unlikely to collide with the server's or another client's, and not
/// guessable by another user (a node id belongs to one session at a time on a node).
fn random_node_id() -> u64 {
    let mut raw = [0u8; 8];
    if getrandom::fill(&mut raw).is_err() {
        // No OS randomness: fall back to the hasher's per-process random keys and the clock.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            h.write_u128(t.as_nanos());
        }
        return h.finish();
    }
    u64::from_le_bytes(raw)
}

#[cfg(test)]
mod tests {
    use super::http::kv_path;
    use super::*;
    use yutu_api::kv::KvOp;

    #[test]
    fn paths_are_checked() {
        assert_eq!(kv_path("b", KvOp::Get).unwrap(), "/v1/kv/b/get");
        assert!(matches!(
            kv_path("", KvOp::Get),
            Err(KvError::InvalidArgument(_))
        ));
        assert!(matches!(
            kv_path("a/b", KvOp::Get),
            Err(KvError::InvalidArgument(_))
        ));
    }

    #[test]
    fn batches_are_checked() {
        assert!(check_batch(&["a".into()]).is_ok());
        assert!(check_batch(&["".into()]).is_err());
        assert!(check_batch(&vec!["k".to_string(); MAX_BATCH + 1]).is_err());
        assert!(same_len(&["a".into()], 2, "offsets").is_err());
    }

    #[test]
    fn node_ids_differ() {
        assert_ne!(random_node_id(), random_node_id());
    }

    /// A killed client's directory is removed by the next one; a live process's, another
    /// name's, and a plain file are left alone.
    #[test]
    fn stale_shm_dirs_of_dead_clients_are_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let me = std::process::id();
        for name in [
            format!("yutu-kv-{dead}-00ff"),
            format!("yutu-kv-{me}-00ff"),
            "yutu-kv-00ff00ff00ff00ff".to_string(),
            "yutu-kv-x-1".to_string(),
        ] {
            std::fs::create_dir(tmp.path().join(name)).unwrap();
        }
        std::fs::write(tmp.path().join(format!("yutu-kv-{dead}-file")), b"x").unwrap();
        remove_stale_dirs(tmp.path());
        let mut left: Vec<String> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        let mut want = vec![
            format!("yutu-kv-{dead}-file"),
            format!("yutu-kv-{me}-00ff"),
            "yutu-kv-00ff00ff00ff00ff".to_string(),
            "yutu-kv-x-1".to_string(),
        ];
        want.sort();
        assert_eq!(left, want);
    }
}
