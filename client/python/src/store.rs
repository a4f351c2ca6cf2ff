//! `yutu.Store`: one bucket of a Yutu node, through the KV API (batches of blocks moved into
//! and out of the caller's memory, host or GPU) and the S3 API (bytes in and out of Python
//! objects).
//!
//! Every method releases the GIL while it waits on the node, so engine threads run in
//! parallel; the store is shared by threads (`frozen`: no per-call borrow of the object), and
//! `close()` waits for nothing: calls in flight finish on the session they started with, and
//! the session ends when the last of them returns.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyByteArray, PyBytes, PyInt, PyString};
use yutu_api::kv::{BlockPin, MAX_SOFT_PIN_SECS};
use yutu_client::kv::{
    answered, DeviceBuffer, KvClient, KvError, KvOptions, PutMode, PutOptions, SmallValue,
    SpanStaging as Staging, MAX_BATCH, MAX_STAGED_BLOCK,
};
use yutu_client::{Client, Credentials};
use yutu_transfer::device::DeviceMemory;

use crate::device::{self, Ctx, Devices};
use crate::errors::{Error, Result};
use crate::memory::{spans, Registry, Span};
use crate::slab::Slab;

/// Values of at most this many bytes come back in the answer to a `get`; larger ones through
/// a staging buffer (see `Store::value`).
const INLINE_GET: u64 = 64 << 10;

/// What an open store holds.
struct Session {
    kv: KvClient,
    s3: Client,
    bucket: String,
    staging: Staging,
    registry: Registry,
    /// The GPU ranges of `registry`, registered with the KV client too (by start address), so
    /// that blocks inside one move by GPUDirect RDMA where the host allows it.
    gpu_ranges: Mutex<HashMap<usize, DeviceBuffer>>,
    /// The GPUs this session has opened (on first use).
    devices: Devices,
    /// How the session authenticates, for the package's own calls to the node's JSON
    /// endpoints (`Store.cluster()`).
    auth: Auth,
}

impl Session {
    fn gpu_ranges_lock(&self) -> std::sync::MutexGuard<'_, HashMap<usize, DeviceBuffer>> {
        // Inserts and removals leave the map consistent.
        self.gpu_ranges.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn ctx(&self) -> Ctx<'_> {
        Ctx {
            kv: &self.kv,
            bucket: &self.bucket,
            staging: &self.staging,
            devices: &self.devices,
        }
    }
}

/// The credentials a session was opened with.
enum Auth {
    None,
    Token(String),
    Keys(Credentials),
}

/// The memory arguments of a put, as the Python half passes them (see `_put_spans`).
struct Spans {
    ptrs: Vec<usize>,
    sizes: Vec<u64>,
    checked: Vec<bool>,
    /// Per span its GPU (`None`: host memory); empty: all host memory.
    devices: Vec<Option<u32>>,
}

/// A connection to one bucket of a Yutu node.
#[pyclass(module = "yutu._native", subclass, frozen)]
pub struct Store {
    session: RwLock<Option<Arc<Session>>>,
    url: String,
    bucket: String,
    /// The size of the last value `get` found too large to answer inline (0: none yet, or
    /// the last one was small): engines store blocks of one size, so the next `get` reads
    /// straight into a new object of that size, in one call instead of two.
    size_hint: AtomicU64,
}

/// A store collected without `close()` (Mooncake's users rarely call it): ending the session
/// is a call to the node, made on a thread of its own so that the collector, which holds the
/// GIL, never waits for the network.
impl Drop for Store {
    fn drop(&mut self) {
        let session = self
            .session
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(session) = session {
            let _ = std::thread::Builder::new()
                .name("yutu-store-close".into())
                .spawn(move || drop(session));
        }
    }
}

impl Store {
    fn open(&self) -> Result<Arc<Session>> {
        self.session
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or(Error::Closed)
    }

    /// Stores each `keys[i]` from its span (`_put_spans` says how), without the GIL: the
    /// outcome, and whether the call ended without the node's answer (the node may still read
    /// the spans: their objects must be kept, `keep_if`).
    fn put_spans(
        &self,
        py: Python<'_>,
        keys: &[String],
        spans_of: &Spans,
        own: bool,
        options: &PutOptions,
    ) -> (PyResult<()>, bool) {
        let mut unanswered = false;
        let done = self.run(py, |s| {
            let Spans {
                ptrs,
                sizes,
                checked,
                devices,
            } = spans_of;
            let spans = spans(&s.registry, ptrs, sizes, checked, devices)?;
            if own && own_objects(checked, &spans) {
                let srcs: Vec<&[Span]> = spans.iter().map(std::slice::from_ref).collect();
                return s
                    .staging
                    .put_from_own(&s.kv, &s.bucket, keys, &srcs, options)
                    .map_err(|e| noted(e, &mut unanswered));
            }
            device::put_from(&s.ctx(), keys, &spans, options)
        });
        (done, unanswered)
    }

    /// Runs `f` on the open session with the GIL released.
    fn run<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&Session) -> Result<T> + Send,
    ) -> PyResult<T> {
        let s = self.open()?;
        Ok(py.detach(|| f(&s))?)
    }
}

/// Most polling `YUTU_FRAME_SPIN_US` may ask for.
const MAX_FRAME_SPIN_US: u64 = 10_000;

/// How long a call polls for its answer at most (`KvOptions::frame_spin`):
/// `YUTU_FRAME_SPIN_US` microseconds when set (0: never poll, for a host whose cores the
/// node needs more than the caller does), else the client's default.
fn frame_spin() -> Result<std::time::Duration> {
    let Ok(text) = std::env::var("YUTU_FRAME_SPIN_US") else {
        return Ok(KvOptions::default().frame_spin);
    };
    match text.trim().parse::<u64>() {
        Ok(us) if us <= MAX_FRAME_SPIN_US => Ok(std::time::Duration::from_micros(us)),
        _ => Err(Error::invalid(format!(
            "YUTU_FRAME_SPIN_US must be 0 to {MAX_FRAME_SPIN_US} microseconds, not {text:?}"
        ))),
    }
}

fn connect(
    urls: &[String],
    bucket: &str,
    token: Option<String>,
    credentials: Option<Credentials>,
    create_bucket: bool,
    staging: Staging,
    devices: Devices,
) -> Result<(String, Session)> {
    let mut last = None;
    let frame_spin = frame_spin()?;
    for url in urls {
        let options = KvOptions {
            credentials: credentials.clone(),
            token: token.clone(),
            // `YUTU_FRAMES=0`: every call over HTTP (to compare, or to rule frames out).
            frames: if std::env::var_os("YUTU_FRAMES").is_some_and(|v| v == "0") {
                yutu_client::kv::FramesMode::Off
            } else {
                yutu_client::kv::FramesMode::Auto
            },
            frame_spin,
            // `YUTU_PRESENCE=0`: every `is_exist` asked of the node, none looked up in its
            // presence tables (to compare, or to rule them out).
            presence: std::env::var_os("YUTU_PRESENCE").is_none_or(|v| v != "0"),
            ..KvOptions::default()
        };
        let kv = match KvClient::new(url, options) {
            Ok(kv) => kv,
            Err(e) => {
                last = Some(Error::from(e));
                continue;
            }
        };
        let s3 = match (&token, &credentials) {
            (Some(t), _) => Client::with_token(url, t)?,
            (None, c) => Client::with_credentials(url, c.clone())?,
        };
        match s3.head_bucket(bucket) {
            Ok(true) => {}
            Ok(false) if !create_bucket => {
                return Err(Error::Client(yutu_client::ClientError::S3 {
                    status: 404,
                    code: "NoSuchBucket".into(),
                    message: format!("The bucket {bucket:?} does not exist."),
                }))
            }
            Ok(false) => match s3.create_bucket(bucket) {
                Ok(()) => {}
                // Another client created it first.
                Err(e) if matches!(e.code(), Some("BucketAlreadyOwnedByYou")) => {}
                Err(e) => return Err(e.into()),
            },
            // The node answered KvClient::new but not this: try the next one.
            Err(e @ yutu_client::ClientError::Transport(_)) => {
                last = Some(e.into());
                continue;
            }
            Err(e) => return Err(e.into()),
        }
        let auth = match (&token, &credentials) {
            (Some(t), _) => Auth::Token(t.trim().to_string()),
            (None, Some(c)) => Auth::Keys(c.clone()),
            (None, None) => Auth::None,
        };
        let session = Session {
            kv,
            s3,
            bucket: bucket.to_string(),
            staging,
            registry: Registry::default(),
            gpu_ranges: Mutex::new(HashMap::new()),
            devices,
            auth,
        };
        return Ok((url.clone(), session));
    }
    Err(last.unwrap_or_else(|| Error::invalid("no node URL given")))
}

fn urls_of(url: &Bound<'_, PyAny>) -> Result<Vec<String>> {
    if let Ok(one) = url.extract::<String>() {
        return Ok(vec![one]);
    }
    url.extract::<Vec<String>>()
        .map_err(|_| Error::invalid("url must be a URL string or a list of them"))
}

/// Runs `call` over `keys` in batches the node takes, and joins the answers.
fn in_batches<T>(
    keys: &[String],
    mut call: impl FnMut(&[String]) -> std::result::Result<Vec<T>, yutu_client::KvError>,
) -> Result<Vec<T>> {
    let mut out = Vec::with_capacity(keys.len());
    for part in keys.chunks(MAX_BATCH) {
        out.extend(call(part)?);
    }
    Ok(out)
}

fn mode(if_absent: bool) -> PutMode {
    if if_absent {
        PutMode::IfAbsent
    } else {
        PutMode::Overwrite
    }
}

/// An integer argument (not a bool, which Python counts as one).
fn integer(value: &Bound<'_, PyAny>) -> Option<i128> {
    if value.is_instance_of::<PyBool>() || !value.is_instance_of::<PyInt>() {
        return None;
    }
    value.extract::<i128>().ok()
}

/// A put's keyword arguments as the client's [`PutOptions`]: `replicas` is 1 to
/// [`MAX_REPLICAS`](yutu_api::cluster::MAX_REPLICAS) copies, `preferred_node` a member's name,
/// `pin` either `"hard"` or a soft pin's TTL in whole seconds (1 to [`MAX_SOFT_PIN_SECS`]).
fn put_options(
    if_absent: bool,
    replicas: Option<&Bound<'_, PyAny>>,
    preferred_node: Option<&Bound<'_, PyAny>>,
    pin: Option<&Bound<'_, PyAny>>,
) -> Result<PutOptions> {
    let max = yutu_api::cluster::MAX_REPLICAS;
    let replicas = match replicas.filter(|r| !r.is_none()) {
        None => None,
        Some(r) => match integer(r) {
            Some(n) if (1..=i128::from(max)).contains(&n) => Some(n as u32),
            _ => {
                return Err(Error::invalid(format!(
                    "replicas must be an integer from 1 to {max}, not {r:?}"
                )))
            }
        },
    };
    let preferred_node = match preferred_node.filter(|n| !n.is_none()) {
        None => None,
        Some(n) => match n.cast::<PyString>().ok().map(|s| s.to_string()) {
            Some(name) if !name.is_empty() => Some(name),
            _ => {
                return Err(Error::invalid(format!(
                    "preferred_node must be a member's name, not {n:?}"
                )))
            }
        },
    };
    let pin = match pin.filter(|p| !p.is_none()) {
        None => None,
        Some(p) => {
            let hard = p
                .cast::<PyString>()
                .is_ok_and(|s| s.to_string().eq_ignore_ascii_case("hard"));
            match (hard, integer(p)) {
                (true, _) => Some(BlockPin {
                    soft_ttl_secs: None,
                }),
                (false, Some(secs)) if (1..=i128::from(MAX_SOFT_PIN_SECS)).contains(&secs) => {
                    Some(BlockPin {
                        soft_ttl_secs: Some(secs as u64),
                    })
                }
                _ => {
                    return Err(Error::invalid(format!(
                        "pin must be \"hard\" or a soft pin's TTL in seconds (1 to \
                         {MAX_SOFT_PIN_SECS}), not {p:?}"
                    )))
                }
            }
        }
    };
    Ok(PutOptions {
        mode: mode(if_absent),
        replicas,
        preferred_node,
        pin,
    })
}

/// A new `bytes` of `len` bytes whose contents are not initialised, and the address of its
/// contents: for a get to fill, where `PyBytes::new_with` would first zero every byte (a
/// whole extra pass over a large value, and the pass that faults its pages in). The caller
/// hands it out only once every byte is written.
fn uninit_bytes(py: Python<'_>, len: usize) -> PyResult<(Bound<'_, PyBytes>, usize)> {
    let n = pyo3::ffi::Py_ssize_t::try_from(len)
        .map_err(|_| Error::invalid(format!("{len} bytes do not fit a bytes object")))?;
    // SAFETY: a null source asks CPython for a new object with uninitialised contents of `n`
    // bytes; the GIL is held (`py`).
    let raw = unsafe { pyo3::ffi::PyBytes_FromStringAndSize(std::ptr::null(), n) };
    // SAFETY: `raw` is a new reference (or null with an exception set, which becomes the
    // error) to a `bytes` object.
    let obj = unsafe { Bound::from_owned_ptr_or_err(py, raw)?.cast_into_unchecked::<PyBytes>() };
    // SAFETY: `obj` is a live `bytes`; its buffer holds `len` bytes for as long as it lives.
    let addr = unsafe { pyo3::ffi::PyBytes_AsString(obj.as_ptr()) } as usize;
    if addr == 0 {
        return Err(PyErr::fetch(py));
    }
    Ok((obj, addr))
}

/// `e` as the package's error, noting in `unanswered` when the call ended without the
/// node's answer (`yutu_client::kv::answered`): the node may still be copying.
fn noted(e: KvError, unanswered: &mut bool) -> Error {
    *unanswered |= !answered(&e);
    e.into()
}

/// Never frees `objects` when `unanswered`: the node may still copy into or out of their
/// memory (the client's own memory, reached in place), which must not be reused. Rare (a
/// timeout, a broken connection), and a leak is the price of never corrupting the heap.
fn keep_if(unanswered: bool, objects: Option<&Bound<'_, PyAny>>) {
    if let (true, Some(o)) = (unanswered, objects) {
        std::mem::forget(o.clone().unbind());
    }
}

/// Whether the spans can go through the client's own-memory registration
/// (`SpanStaging::get_into_own`): host memory, none of it a raw pointer checked against
/// `register_buffer`. The caller passes `own = True` only for spans of Python objects the
/// package holds for the call (`bytes`, `bytearray`, buffers), never for raw pointers.
fn own_objects(checked: &[bool], spans: &[Span]) -> bool {
    !spans.is_empty() && !checked.iter().any(|&c| c) && spans.iter().all(|s| s.device.is_none())
}

/// The spans of a scatter/gather call: `ptrs[i][j]` and `sizes[i][j]` for key `i`. Each span
/// is host memory unless it lies in a range registered as GPU memory; a null pointer or an
/// empty span is refused with its key's number, and so is a key with no spans. `devices`,
/// when given, names the GPU of each span of an object the Python half resolved (`None`:
/// look the pointer up among the registered ranges).
fn part_spans(
    registry: &Registry,
    keys: &[String],
    ptrs: &[Vec<usize>],
    sizes: &[Vec<u64>],
    devices: Option<&[Vec<Option<u32>>]>,
) -> Result<Vec<Vec<Span>>> {
    if ptrs.len() != keys.len() || sizes.len() != keys.len() {
        return Err(Error::invalid(format!(
            "{} keys but {} pointer lists and {} size lists",
            keys.len(),
            ptrs.len(),
            sizes.len()
        )));
    }
    let mut out = Vec::with_capacity(keys.len());
    for (i, (p, z)) in ptrs.iter().zip(sizes).enumerate() {
        if p.len() != z.len() {
            return Err(Error::invalid(format!(
                "key {i}: {} pointers but {} sizes",
                p.len(),
                z.len()
            )));
        }
        if p.is_empty() {
            return Err(Error::invalid(format!("key {i} names no buffers")));
        }
        let mut spans = Vec::with_capacity(p.len());
        for (j, (&addr, &len)) in p.iter().zip(z).enumerate() {
            let given = devices.and_then(|d| d.get(i)?.get(j).copied().flatten());
            if addr == 0 || len == 0 {
                return Err(Error::invalid(format!(
                    "key {i}: a buffer is a null pointer or has a size of 0"
                )));
            }
            if addr.checked_add(len as usize).is_none() {
                return Err(Error::invalid(format!(
                    "key {i}: {len} bytes at {addr:#x} wrap the address space"
                )));
            }
            spans.push(Span {
                addr,
                len,
                device: given.or_else(|| registry.device_of(addr, len)),
            });
        }
        out.push(spans);
    }
    Ok(out)
}

/// `f(key)` for every key, by up to 8 threads at once (each key is one request to the node),
/// in the keys' order; the first failure is the answer.
fn per_key_parallel<T: Send + Clone>(
    keys: &[String],
    f: impl Fn(&str) -> Result<T> + Sync,
) -> Result<Vec<Option<T>>> {
    const THREADS: usize = 8;
    let mut out: Vec<Option<T>> = vec![None; keys.len()];
    let per = keys.len().div_ceil(THREADS).max(1);
    let f = &f;
    std::thread::scope(|scope| -> Result<()> {
        let jobs: Vec<_> = keys
            .chunks(per)
            .zip(out.chunks_mut(per))
            .map(|(ks, outs)| {
                scope.spawn(move || -> Result<()> {
                    for (k, o) in ks.iter().zip(outs) {
                        *o = Some(f(k)?);
                    }
                    Ok(())
                })
            })
            .collect();
        for j in jobs {
            j.join()
                .unwrap_or_else(|_| Err(Error::invalid("a request thread panicked")))?;
        }
        Ok(())
    })?;
    Ok(out)
}

/// The bytes of each key (`None` where absent).
fn fetch_all(s: &Session, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>> {
    let got = per_key_parallel(keys, |k| Ok(s.kv.get_bytes(&s.bucket, k)?))?;
    Ok(got.into_iter().map(Option::flatten).collect())
}

/// The size of each key (`None` where absent), asked with HEAD.
fn sizes_of(s: &Session, keys: &[String]) -> Result<Vec<Option<u64>>> {
    let got = per_key_parallel(keys, |k| match s.s3.head_object(&s.bucket, k) {
        Ok(info) => Ok(Some(info.size)),
        Err(e) if e.code() == Some("NoSuchKey") || e.status() == Some(404) => Ok(None),
        Err(e) => Err(e.into()),
    })?;
    Ok(got.into_iter().map(Option::flatten).collect())
}

impl Store {
    /// The bytes of `key` in a new `bytes`, `None` when it is absent. A small value comes in
    /// the answer to one call; a larger one ([`INLINE_GET`]) is written by the node straight
    /// into the new object (the client's own memory, `SpanStaging::get_into_own`; through a
    /// staging buffer and one more copy where that cannot be), where carrying it through the
    /// call's socket took several round trips of the socket's buffer. A value replaced by
    /// one of another size between the two calls is asked again.
    fn value<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let keys = [key.to_string()];
        // A small value the node mirrors is a copy (`get_small` reads the mirror first too;
        // the hinted path, taken after a large value, does not), and so is a large block
        // its table locates in an arena this client has a view of.
        if self.size_hint.load(Ordering::Relaxed) > INLINE_GET {
            if let Some(found) = self.value_located(py, key)? {
                return Ok(Some(found));
            }
            if let Some(d) = self.run(py, |s| Ok(s.kv.get_mirrored(&s.bucket, key)))? {
                return Ok(Some(PyBytes::new(py, &d)));
            }
        }
        if let Some(found) = self.value_as_hinted(py, &keys)? {
            return Ok(found);
        }
        for _ in 0..3 {
            let small = self.run(py, |s| Ok(s.kv.get_small(&s.bucket, key, INLINE_GET)?))?;
            let n = match small {
                SmallValue::Bytes(d) => return Ok(Some(PyBytes::new(py, &d))),
                SmallValue::Missing => return Ok(None),
                SmallValue::Large(n) if n <= MAX_STAGED_BLOCK => n,
                SmallValue::Large(_) => break,
            };
            let len = usize::try_from(n).map_err(|_| Error::invalid("value too large"))?;
            let (bytes, _, got) = self.read_into_new(py, &keys, len)?;
            let got = got.ok();
            match got.as_deref() {
                Some([Some(m)]) if *m == n => {
                    self.size_hint.store(n, Ordering::Relaxed);
                    return Ok(Some(bytes));
                }
                Some([None]) => return Ok(None),
                _ => continue,
            }
        }
        // Whole, whatever its size (and with the error, if there is one).
        let data = self.run(py, |s| Ok(s.kv.get_bytes(&s.bucket, key)?))?;
        Ok(data.map(|d| PyBytes::new(py, &d)))
    }

    /// The bytes of `key` in a new `bytes`, copied by this thread out of the arena view
    /// its located slot names (`KvClient::locate`), without a call; `None` when there is
    /// no such slot or the copy did not stand (the object is dropped: nothing else ever
    /// saw it).
    fn value_located<'py>(
        &self,
        py: Python<'py>,
        key: &str,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let s = self.open()?;
        // A keyed hash and a few loads, but the first on a shard asks the node for its table
        // and arena view: without the GIL.
        let Some(loc) = py.detach(|| s.kv.locate(&s.bucket, key)) else {
            return Ok(None);
        };
        if loc.len() > MAX_STAGED_BLOCK {
            return Ok(None);
        }
        let len = usize::try_from(loc.len()).map_err(|_| Error::invalid("value too large"))?;
        let (bytes, addr) = uninit_bytes(py, len)?;
        // The copy without the GIL. SAFETY: `bytes` is a new object of `len` bytes that no
        // other code has seen; it is handed out only when the copy wrote all of them.
        let copied = py.detach(|| unsafe { s.kv.copy_located(&loc, addr as *mut u8) });
        Ok(copied.then_some(bytes))
    }

    /// Reads `keys[0]` into a new `bytes` of `len` bytes, created uninitialised: the node
    /// writes it in place (the client's own memory) or it is staged. The object is reachable
    /// from nowhere else while the GIL is released, and the callers hand it out only when
    /// every byte of it was written (the block's length is `len`), or copy out the bytes
    /// written; a call that ended without the node's answer keeps it for good (`keep_if`).
    /// The object, the address of its contents, and the read's answer.
    #[allow(clippy::type_complexity)]
    fn read_into_new<'py>(
        &self,
        py: Python<'py>,
        keys: &[String; 1],
        len: usize,
    ) -> PyResult<(Bound<'py, PyBytes>, usize, PyResult<Vec<Option<u64>>>)> {
        let (bytes, addr) = uninit_bytes(py, len)?;
        let span = Span {
            addr,
            len: len as u64,
            device: None,
        };
        let mut unanswered = false;
        let got = self.run(py, |s| {
            s.staging
                .get_into_own(&s.kv, &s.bucket, keys, &[&[span]])
                .map_err(|e| noted(e, &mut unanswered))
        });
        keep_if(unanswered, Some(bytes.as_any()));
        Ok((bytes, addr, got))
    }

    /// `get` in one call when the last large value's size ([`Store::size_hint`]) is known:
    /// the node writes the value into a new object of that size. `Some(answer)` when that
    /// settled it (a value of that size, a shorter one, copied into an object of its own
    /// size, or an absent key); `None` when the value is larger or the call failed (the
    /// caller asks its size first, as without a hint).
    fn value_as_hinted<'py>(
        &self,
        py: Python<'py>,
        keys: &[String; 1],
    ) -> PyResult<Option<Option<Bound<'py, PyBytes>>>> {
        let hint = self.size_hint.load(Ordering::Relaxed);
        if hint <= INLINE_GET || hint > MAX_STAGED_BLOCK {
            return Ok(None);
        }
        let len = usize::try_from(hint).map_err(|_| Error::invalid("value too large"))?;
        let (bytes, addr, got) = self.read_into_new(py, keys, len)?;
        Ok(match got.as_deref() {
            Ok([Some(m)]) if *m == hint => Some(Some(bytes)),
            Ok([Some(m)]) => {
                // Shorter than the hint: its bytes are the object's first `m`.
                let m = usize::try_from(*m).unwrap_or(len).min(len);
                // SAFETY: the node wrote the object's first `m` bytes (the block's length);
                // only those are read, while `bytes` keeps them alive.
                let written = unsafe { std::slice::from_raw_parts(addr as *const u8, m) };
                let found = PyBytes::new(py, written);
                if (m as u64) <= INLINE_GET {
                    self.size_hint.store(0, Ordering::Relaxed);
                }
                Some(Some(found))
            }
            Ok([None]) => Some(None),
            // Larger than the hint (refused as too large for its room), or failed.
            _ => None,
        })
    }
}

#[pymethods]
impl Store {
    /// Connects to the first node of `url` (a URL or a list of them) that answers, and to
    /// `bucket` on it (created when missing, unless `create_bucket=False`). Authenticates with
    /// `token`, or `access_key`/`secret_key`, or the `YUTU_TOKEN` environment variable.
    #[new]
    #[pyo3(signature = (url, *, bucket = "default", token = None, access_key = None,
        secret_key = None, create_bucket = true, staging_chunk = 32 << 20, staging_buffers = 4))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        url: &Bound<'_, PyAny>,
        bucket: &str,
        token: Option<String>,
        access_key: Option<String>,
        secret_key: Option<String>,
        create_bucket: bool,
        staging_chunk: u64,
        staging_buffers: usize,
    ) -> PyResult<Store> {
        let urls = urls_of(url)?;
        let credentials = match (access_key, secret_key) {
            (Some(a), Some(s)) => Some(Credentials::new(a, s)),
            (None, None) => None,
            _ => {
                return Err(Error::invalid("access_key and secret_key go together").into());
            }
        };
        let token = match (&token, &credentials) {
            (None, None) => std::env::var("YUTU_TOKEN").ok().filter(|t| !t.is_empty()),
            _ => token,
        };
        if staging_chunk == 0 || staging_chunk > 1 << 30 {
            return Err(Error::invalid("staging_chunk must be 1 byte to 1 GiB").into());
        }
        let staging = Staging::new(staging_chunk, staging_buffers);
        // Read once, here: `YUTU_TEST_DEVICE=host` makes this store's GPUs stand-ins.
        let devices = Devices::from_env()?;
        let bucket_name = bucket.to_string();
        let (url, session) = py.detach(|| {
            connect(
                &urls,
                &bucket_name,
                token,
                credentials,
                create_bucket,
                staging,
                devices,
            )
        })?;
        Ok(Store {
            session: RwLock::new(Some(Arc::new(session))),
            url,
            bucket: bucket_name,
            size_hint: AtomicU64::new(0),
        })
    }

    /// The node this store talks to.
    #[getter]
    fn url(&self) -> &str {
        &self.url
    }

    /// The bucket every key lives in.
    #[getter]
    fn bucket(&self) -> &str {
        &self.bucket
    }

    /// True once `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.session
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }

    /// Ends the session with the node and frees the staging buffers. Further calls raise
    /// `yutu.Closed`; closing twice is harmless.
    fn close(&self, py: Python<'_>) {
        let session = self
            .session
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        // Ending the session is a call to the node: without the GIL.
        py.detach(move || drop(session));
    }

    /// The bytes stored under `key`; raises `yutu.NotFound`.
    fn get<'py>(&self, py: Python<'py>, key: String) -> PyResult<Bound<'py, PyBytes>> {
        self.value(py, &key)?
            .ok_or_else(|| Error::NotFound(format!("The key {key:?} does not exist.")).into())
    }

    /// The bytes of each key, `None` where it is absent.
    fn get_batch<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
    ) -> PyResult<Vec<Option<Bound<'py, PyBytes>>>> {
        keys.iter().map(|k| self.value(py, k)).collect()
    }

    /// Declares `size` bytes at address `ptr` as memory the store may read and write: raw
    /// pointers passed to the other calls must lie inside a registered range. `device` is
    /// the CUDA ordinal of the GPU the range is memory of (`None`: host memory); the device
    /// checks that it is (opening it on first use: `yutu.DeviceError` without a driver).
    /// `memfd` is `(fd, map_base, map_len)` when the range lies in the caller's `MAP_SHARED`
    /// mapping of a sealable memfd from its offset 0 (`MooncakeHostMemAllocator` memory): a
    /// node on the same host then maps the memfd and copies with `memcpy`.
    #[pyo3(signature = (ptr, size, device = None, memfd = None))]
    fn register_buffer(
        &self,
        py: Python<'_>,
        ptr: usize,
        size: u64,
        device: Option<u32>,
        memfd: Option<(i32, usize, u64)>,
    ) -> PyResult<()> {
        self.run(py, |s| {
            // A range registered without a device is asked of the CUDA driver (when there is
            // one): Mooncake's signature has no device, and engines register GPU tensors
            // through it.
            let device = device.or_else(|| s.devices.detect(ptr));
            if let Some(ordinal) = device {
                if ptr != 0 && size != 0 {
                    s.devices.check(ordinal, ptr, size)?;
                }
            }
            s.registry.register(ptr, size, device)?;
            if device.is_none() {
                if std::env::var_os("YUTU_IN_PLACE").is_some_and(|v| v == "0") {
                    // Everything staged: to compare, or to rule the in-place path out.
                    s.staging
                        .in_place
                        .register_staged(ptr, "YUTU_IN_PLACE=0".into());
                } else if let Some((fd, map_base, map_len)) = memfd.filter(|m| m.0 >= 0) {
                    // SAFETY: the caller vouches that the fd is open and that the range lies
                    // in its mapping of it at `map_base` (checked again there), and keeps the
                    // range mapped until it unregisters it (`register_buffer`'s contract);
                    // the fd is only borrowed for the call (the engine maps its own copy).
                    unsafe {
                        let fd = std::os::fd::BorrowedFd::borrow_raw(fd);
                        s.staging
                            .in_place
                            .register_memfd(&s.kv, ptr, size, fd, map_base, map_len)
                    };
                } else {
                    // SAFETY: the caller registers the range as transfer memory it keeps
                    // mapped until it unregisters it (the contract of `register_buffer`), and
                    // the registry has just accepted it.
                    unsafe { s.staging.in_place.register(&s.kv, ptr, size) };
                }
            }
            if let Some(ordinal) = device {
                let memory = DeviceMemory {
                    ordinal,
                    ptr: ptr as u64,
                    len: size,
                };
                // SAFETY: the caller registers the range as transfer memory of this GPU and
                // keeps it allocated until it unregisters it (the contract of
                // `register_buffer`); the driver has just checked that it is this GPU's.
                let registered = s
                    .devices
                    .get(ordinal)
                    .and_then(|gpu| Ok(unsafe { s.kv.register_device(gpu, memory) }?));
                match registered {
                    Ok(buf) => {
                        s.gpu_ranges_lock().insert(ptr, buf);
                    }
                    Err(e) => {
                        s.registry.unregister(ptr);
                        return Err(e);
                    }
                }
            }
            Ok(())
        })
    }

    /// The GPU of the registered range holding each `(ptrs[i], sizes[i])`: its CUDA ordinal,
    /// or `None` for host memory and for pointers outside every registered range (for calls
    /// that take unregistered pointers, as Mooncake's do).
    fn _devices_of(&self, ptrs: Vec<usize>, sizes: Vec<u64>) -> PyResult<Vec<Option<u32>>> {
        let s = self.open()?;
        Ok(ptrs
            .iter()
            .zip(&sizes)
            .map(|(&p, &n)| s.registry.device_of(p, n))
            .collect())
    }

    /// The bytes from `ptr` to the end of the registered range holding it (0: none does).
    fn _room(&self, ptr: usize) -> PyResult<u64> {
        Ok(self.open()?.registry.room(ptr))
    }

    /// Whether the client's own memory is registered with its engine, so that the node
    /// copies straight into the `bytes` a get returns and out of the objects a put stores
    /// (made on the first such call; never on a cluster).
    fn _own_memory(&self) -> PyResult<bool> {
        Ok(self.open()?.kv.own_memory_registered())
    }

    /// The node's shard arenas this client maps (arena views: same host, and only where this
    /// process could read the node's memory anyway), and the bytes of large calls it copied
    /// through them itself.
    fn _arena_views(&self) -> PyResult<(usize, u64)> {
        let s = self.open()?;
        Ok((s.kv.arena_views(), s.kv.view_bytes()))
    }

    /// Puts this client made through rooms (one call each, see docs/kv-api.md), and the rooms
    /// it holds now.
    fn _rooms(&self) -> PyResult<(u64, usize)> {
        Ok(self.open()?.kv.rooms())
    }

    /// Large blocks this client read through the node's located slots, without a call
    /// (same host, with an arena view).
    fn _located_hits(&self) -> PyResult<u64> {
        Ok(self.open()?.kv.located_hits())
    }

    /// The port of this client's own transfer engine (its tcp listener), for Mooncake's
    /// `get_hostname`; None when it has no tcp listener.
    fn _engine_port(&self) -> PyResult<Option<u16>> {
        Ok(self.open()?.kv.engine().address().tcp.map(|a| a.port()))
    }

    /// How GPU memory travels between this store and its node, and why: GPUDirect RDMA for
    /// registered GPU ranges when this host allows it, else staged through pinned host
    /// buffers, with the reason.
    fn device_path(&self) -> PyResult<String> {
        Ok(self.open()?.kv.device_path())
    }

    /// Forgets the range registered at `ptr`; False when none was.
    fn unregister_buffer(&self, ptr: usize) -> PyResult<bool> {
        let s = self.open()?;
        s.gpu_ranges_lock().remove(&ptr);
        s.staging.in_place.unregister(ptr);
        Ok(s.registry.unregister(ptr))
    }

    /// How the blocks of the range registered at `ptr` travel: for a GPU range
    /// `"gpudirect: ..."` when the NIC reaches it, for a host range `"in place"` when the
    /// node reaches it without staging; else `"staged: "` and why. None when no registered
    /// range starts at `ptr`.
    fn buffer_path(&self, ptr: usize) -> PyResult<Option<String>> {
        let s = self.open()?;
        let path = s.gpu_ranges_lock().get(&ptr).map(|b| b.path().to_string());
        Ok(path.or_else(|| s.staging.in_place.path(ptr)))
    }

    /// How the KV control calls travel: `"frames: unix"` or `"frames: tcp HOST"` (binary
    /// frames to the owning shard), else `"http"`.
    fn control_path(&self) -> PyResult<String> {
        let s = self.open()?;
        Ok(match s.kv.frames_path() {
            Some(yutu_client::kv::FramesPath::Unix) => "frames: unix".into(),
            Some(yutu_client::kv::FramesPath::Tcp(host)) => format!("frames: tcp {host}"),
            None => "http".into(),
        })
    }

    /// Stores each `keys[i]` from `sizes[i]` bytes at `ptrs[i]`, which must lie in a
    /// registered range where `checked[i]` (the Python half resolves objects into spans).
    /// An unchecked span is memory of GPU `devices[i]` (`None`, or no `devices`: host
    /// memory); a checked one is where its range was registered. `replicas`,
    /// `preferred_node` and `pin` are the put's options (see `put_options`), checked before
    /// anything is sent.
    #[pyo3(signature = (keys, ptrs, sizes, checked, if_absent, replicas = None,
        preferred_node = None, pin = None, devices = None, own = false, keep = None))]
    #[allow(clippy::too_many_arguments)]
    fn _put_spans(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        ptrs: Vec<usize>,
        sizes: Vec<u64>,
        checked: Vec<bool>,
        if_absent: bool,
        replicas: Option<Bound<'_, PyAny>>,
        preferred_node: Option<Bound<'_, PyAny>>,
        pin: Option<Bound<'_, PyAny>>,
        devices: Option<Vec<Option<u32>>>,
        own: bool,
        keep: Option<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let options = put_options(
            if_absent,
            replicas.as_ref(),
            preferred_node.as_ref(),
            pin.as_ref(),
        )?;
        let spans = Spans {
            ptrs,
            sizes,
            checked,
            devices: devices.unwrap_or_default(),
        };
        let (done, unanswered) = self.put_spans(py, &keys, &spans, own, &options);
        keep_if(unanswered, keep.as_ref());
        done
    }

    /// Stores each `keys[i]` from the `bytes` object `values[i]`: `_put_spans` of the
    /// objects' own memory, without the Python half resolving each into a span first. A put
    /// of bytes is what Mooncake's tests and engines' small objects make, from many threads
    /// at once, and the Python code around a call runs under the GIL: with 8 threads putting
    /// 1 MiB values on 2 cores, this path moved about 15% more puts a second than the general
    /// one. A value that is not a `bytes` object is refused; options as `_put_spans`.
    #[pyo3(signature = (keys, values, if_absent, replicas = None, preferred_node = None,
        pin = None))]
    #[allow(clippy::too_many_arguments)]
    fn _put_bytes(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        values: Bound<'_, pyo3::types::PyList>,
        if_absent: bool,
        replicas: Option<Bound<'_, PyAny>>,
        preferred_node: Option<Bound<'_, PyAny>>,
        pin: Option<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        if keys.len() != values.len() {
            return Err(
                Error::invalid(format!("{} keys but {} values", keys.len(), values.len())).into(),
            );
        }
        // Owned references: the list may change under the call (the GIL is released), the
        // objects it held may not go away.
        let held: Vec<Bound<'_, PyBytes>> = values
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.cast_into::<PyBytes>()
                    .map_err(|_| Error::invalid(format!("value {i} is not bytes")))
            })
            .collect::<Result<_>>()?;
        let ptrs: Vec<usize> = held
            .iter()
            .map(|b| b.as_bytes().as_ptr() as usize)
            .collect();
        let sizes: Vec<u64> = held.iter().map(|b| b.as_bytes().len() as u64).collect();
        let (copies, node) = (replicas.as_ref(), preferred_node.as_ref());
        let options = put_options(if_absent, copies, node, pin.as_ref())?;
        if held.is_empty() {
            return Ok(());
        }
        let spans = Spans {
            checked: vec![false; ptrs.len()],
            ptrs,
            sizes,
            devices: Vec::new(),
        };
        let (done, unanswered) = self.put_spans(py, &keys, &spans, true, &options);
        for b in &held {
            keep_if(unanswered, Some(b.as_any()));
        }
        done
    }

    /// How many nodes the store routes its blocks over: the cluster's members, or 0 when its
    /// node is not in a cluster.
    fn cluster_nodes(&self) -> PyResult<usize> {
        Ok(self.open()?.kv.cluster_nodes())
    }

    /// The headers that authenticate a request to this store's node as its own calls are:
    /// `method` on `path` (as sent, without the base URL's path prefix) with the raw `query`,
    /// sent with the Host header `host`. For the package's calls to JSON endpoints.
    fn _auth_headers(
        &self,
        method: &str,
        host: &str,
        path: &str,
        query: &str,
    ) -> PyResult<Vec<(String, String)>> {
        let s = self.open()?;
        Ok(match &s.auth {
            Auth::None => Vec::new(),
            Auth::Token(t) => vec![("authorization".into(), format!("Bearer {t}"))],
            Auth::Keys(c) => c
                .sign(method, host, path, query, b"", std::time::SystemTime::now())
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
        })
    }

    /// Reads each `keys[i]` into at most `sizes[i]` bytes at `ptrs[i]` (see `_put_spans`);
    /// returns each block's length, `None` where the key is absent.
    #[pyo3(signature = (keys, ptrs, sizes, checked, devices = None, own = false, keep = None))]
    #[allow(clippy::too_many_arguments)]
    fn _get_spans(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        ptrs: Vec<usize>,
        sizes: Vec<u64>,
        checked: Vec<bool>,
        devices: Option<Vec<Option<u32>>>,
        own: bool,
        keep: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Vec<Option<u64>>> {
        let mut unanswered = false;
        let done = self.run(py, |s| {
            let devices = devices.unwrap_or_default();
            let spans = spans(&s.registry, &ptrs, &sizes, &checked, &devices)?;
            if own && own_objects(&checked, &spans) {
                let dests: Vec<&[Span]> = spans.iter().map(std::slice::from_ref).collect();
                return s
                    .staging
                    .get_into_own(&s.kv, &s.bucket, &keys, &dests)
                    .map_err(|e| noted(e, &mut unanswered));
            }
            device::get_into(&s.ctx(), &keys, &spans)
        });
        keep_if(unanswered, keep.as_ref());
        done
    }

    /// Stores each `keys[i]` as the concatenation of the spans `ptrs[i][j]`, `sizes[i][j]`
    /// bytes each (gather: Mooncake's `batch_put_from_multi_buffers`), in one node call per
    /// staging chunk. Pointers need no registration (as Mooncake's over tcp); one inside a
    /// range registered as GPU memory is copied from the GPU. Options as `_put_spans`.
    #[pyo3(signature = (keys, ptrs, sizes, if_absent, replicas = None, preferred_node = None,
        pin = None, devices = None, own = false, keep = None))]
    #[allow(clippy::too_many_arguments)]
    fn _put_parts(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        ptrs: Vec<Vec<usize>>,
        sizes: Vec<Vec<u64>>,
        if_absent: bool,
        replicas: Option<Bound<'_, PyAny>>,
        preferred_node: Option<Bound<'_, PyAny>>,
        pin: Option<Bound<'_, PyAny>>,
        devices: Option<Vec<Vec<Option<u32>>>>,
        own: bool,
        keep: Option<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let options = put_options(
            if_absent,
            replicas.as_ref(),
            preferred_node.as_ref(),
            pin.as_ref(),
        )?;
        let mut unanswered = false;
        let done = self.run(py, |s| {
            let parts = part_spans(&s.registry, &keys, &ptrs, &sizes, devices.as_deref())?;
            if own && parts.iter().flatten().all(|s| s.device.is_none()) {
                let srcs: Vec<&[Span]> = parts.iter().map(Vec::as_slice).collect();
                return s
                    .staging
                    .put_from_own(&s.kv, &s.bucket, &keys, &srcs, &options)
                    .map_err(|e| noted(e, &mut unanswered));
            }
            device::put_from_parts(&s.ctx(), &keys, &parts, &options)
        });
        keep_if(unanswered, keep.as_ref());
        done
    }

    /// Reads each `keys[i]` into the spans `ptrs[i][j]` (`sizes[i][j]` bytes each) in order
    /// (scatter: Mooncake's `batch_get_into_multi_buffers`); each block's length, `None`
    /// where the key is absent.
    fn _get_parts(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        ptrs: Vec<Vec<usize>>,
        sizes: Vec<Vec<u64>>,
    ) -> PyResult<Vec<Option<u64>>> {
        self.run(py, |s| {
            let parts = part_spans(&s.registry, &keys, &ptrs, &sizes, None)?;
            device::get_into_parts(&s.ctx(), &keys, &parts)
        })
    }

    /// Reads each `keys[i]` into `handles[i]` (a `bytearray`, or a subclass of it, which is
    /// resized to `rooms[i]` bytes first, without zeroing, and then cut to the block's
    /// length); each block's length, `None` where the key is absent (its handle is left
    /// empty). One staged batch: the node writes the blocks into the staging buffer and each
    /// is copied once, into its handle. A block larger than its room fails the call with
    /// the node's argument error, and the handles are left empty.
    fn _get_into_handles(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        handles: Vec<Bound<'_, PyByteArray>>,
        rooms: Vec<u64>,
    ) -> PyResult<Vec<Option<u64>>> {
        if keys.len() != handles.len() || keys.len() != rooms.len() {
            return Err(Error::invalid("keys, handles and rooms differ in length").into());
        }
        let mut spans = Vec::with_capacity(keys.len());
        for (h, &room) in handles.iter().zip(&rooms) {
            let n = isize::try_from(room)
                .ok()
                .filter(|_| room > 0 && room <= yutu_client::kv::MAX_STAGED_BLOCK)
                .ok_or_else(|| Error::invalid(format!("a room of {room} bytes")))?;
            // SAFETY: `h` is a live bytearray (the GIL is held); resizing a bytearray that
            // exports no buffer is allowed, and its new bytes are uninitialised until written.
            if unsafe { pyo3::ffi::PyByteArray_Resize(h.as_ptr(), n) } != 0 {
                return Err(PyErr::fetch(py));
            }
            // SAFETY: as above; the storage stays put until the array is resized again, which
            // only this function does, after the copies.
            let addr = unsafe { pyo3::ffi::PyByteArray_AsString(h.as_ptr()) } as usize;
            spans.push(Span {
                addr,
                len: room,
                device: None,
            });
        }
        // The handles are only reachable through `handles` while the GIL is released: nobody
        // resizes them meanwhile (a caller's thread could, through a reference it kept, which
        // is the caller's data race, as with any buffer it passes).
        let got = self.run(py, |s| {
            Ok(s.staging.get_into(&s.kv, &s.bucket, &keys, &spans)?)
        });
        let lens = match got {
            Ok(lens) => lens,
            Err(e) => {
                for h in &handles {
                    // SAFETY: a live bytearray with no exports (see above).
                    unsafe { pyo3::ffi::PyByteArray_Resize(h.as_ptr(), 0) };
                }
                return Err(e);
            }
        };
        for (h, n) in handles.iter().zip(&lens) {
            let n = n.unwrap_or(0) as isize;
            // SAFETY: shrinking a live bytearray with no exports.
            if unsafe { pyo3::ffi::PyByteArray_Resize(h.as_ptr(), n) } != 0 {
                return Err(PyErr::fetch(py));
            }
        }
        Ok(lens)
    }

    /// A new buffer of at least `len` bytes registered with this store's transfer engine, for
    /// buffer handles (see `slab.rs`).
    fn _slab(&self, py: Python<'_>, len: u64) -> PyResult<Slab> {
        if len == 0 || len > 1 << 40 {
            return Err(Error::invalid(format!("a slab of {len} bytes")).into());
        }
        let buf = self.run(py, |s| Ok(s.kv.register(len)?))?;
        Ok(Slab { buf: Arc::new(buf) })
    }

    /// Reads each `keys[i]` into `[offsets[i], offsets[i] + rooms[i])` of `slab` (the node
    /// writes it there: one node call per batch of `MAX_BATCH` keys); each block's length,
    /// `None` where the key is absent. A block larger than its room fails the call.
    fn _get_into_slab(
        &self,
        py: Python<'_>,
        slab: &Slab,
        keys: Vec<String>,
        offsets: Vec<u64>,
        rooms: Vec<u64>,
    ) -> PyResult<Vec<Option<u64>>> {
        if keys.len() != offsets.len() || keys.len() != rooms.len() {
            return Err(Error::invalid("keys, offsets and rooms differ in length").into());
        }
        for (&o, &r) in offsets.iter().zip(&rooms) {
            if r == 0 || o.checked_add(r).is_none_or(|end| end > slab.buf.len()) {
                return Err(Error::invalid(format!(
                    "a room of {r} bytes at {o} is outside the {}-byte slab",
                    slab.buf.len()
                ))
                .into());
            }
        }
        let buf = slab.buf.clone();
        self.run(py, |s| {
            let mut out = Vec::with_capacity(keys.len());
            for (i, part) in keys.chunks(MAX_BATCH).enumerate() {
                let at = i * MAX_BATCH;
                let end = at + part.len();
                out.extend(s.kv.batch_get_into_ranges(
                    &s.bucket,
                    part,
                    &*buf,
                    &offsets[at..end],
                    &rooms[at..end],
                )?);
            }
            Ok(out)
        })
    }

    /// The size of each key, `None` where it is absent (HEAD requests, 8 at a time).
    fn _sizes(&self, py: Python<'_>, keys: Vec<String>) -> PyResult<Vec<Option<u64>>> {
        self.run(py, |s| sizes_of(s, &keys))
    }

    /// The bytes of each key in a new buffer made by `factory(n)` (a `bytearray` or a subclass
    /// of it, of `n` bytes), `None` where the key is absent: Mooncake's `batch_get_buffer`.
    /// The keys are fetched concurrently, at most 8 at a time.
    fn _get_buffers<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
        factory: Bound<'py, PyAny>,
    ) -> PyResult<Vec<Option<Bound<'py, PyAny>>>> {
        let data = self.run(py, |s| fetch_all(s, &keys))?;
        data.into_iter()
            .map(|d| {
                let Some(d) = d else { return Ok(None) };
                let obj = factory.call1((d.len(),))?;
                let array = obj
                    .cast::<PyByteArray>()
                    .map_err(|_| Error::invalid("the buffer factory must make a bytearray"))?;
                if array.len() != d.len() {
                    return Err(Error::invalid(
                        "the buffer factory made a buffer of the wrong size",
                    )
                    .into());
                }
                // SAFETY: the GIL is held and nothing else references the new array, so no
                // other code resizes or reads it while it is filled.
                unsafe { array.as_bytes_mut() }.copy_from_slice(&d);
                Ok(Some(obj))
            })
            .collect()
    }

    /// Whether `key` is stored.
    fn is_exist(&self, py: Python<'_>, key: String) -> PyResult<bool> {
        Ok(self.batch_is_exist(py, vec![key])? == [true])
    }

    /// Whether each key is stored.
    fn batch_is_exist(&self, py: Python<'_>, keys: Vec<String>) -> PyResult<Vec<bool>> {
        self.run(py, |s| {
            in_batches(&keys, |part| s.kv.batch_exists(&s.bucket, part))
        })
    }

    /// The length of the block stored under `key`; raises `yutu.NotFound`. One frame to the
    /// owning shard (a read that answers sizes only); an S3 HEAD where frames cannot ask it
    /// (no frames, or a client routing over a cluster).
    fn get_size(&self, py: Python<'_>, key: String) -> PyResult<u64> {
        self.run(py, |s| {
            if s.kv.cluster_nodes() == 0 && s.kv.frames_path().is_some() {
                return match s.kv.get_small(&s.bucket, &key, 0)? {
                    SmallValue::Large(n) => Ok(n),
                    SmallValue::Bytes(d) => Ok(d.len() as u64),
                    SmallValue::Missing => {
                        Err(Error::NotFound(format!("The key {key:?} does not exist.")))
                    }
                };
            }
            Ok(s.s3.head_object(&s.bucket, &key)?.size)
        })
    }

    /// Deletes `key`; False when it was not stored.
    fn remove(&self, py: Python<'_>, key: String) -> PyResult<bool> {
        Ok(self.batch_remove(py, vec![key])? == [true])
    }

    /// Deletes the keys; True where one was stored.
    fn batch_remove(&self, py: Python<'_>, keys: Vec<String>) -> PyResult<Vec<bool>> {
        self.run(py, |s| {
            in_batches(&keys, |part| s.kv.remove(&s.bucket, part))
        })
    }

    /// Every key of the bucket (under `prefix`, when given), in order.
    #[pyo3(signature = (prefix = None))]
    fn list_keys(&self, py: Python<'_>, prefix: Option<String>) -> PyResult<Vec<String>> {
        self.run(py, |s| {
            let mut keys = Vec::new();
            for page in s.s3.list_pages(&s.bucket, prefix.as_deref(), None) {
                keys.extend(page?.objects.into_iter().map(|o| o.key));
            }
            Ok(keys)
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "yutu.Store(url={:?}, bucket={:?}{})",
            self.url,
            self.bucket,
            if self.closed() { ", closed" } else { "" }
        )
    }
}
