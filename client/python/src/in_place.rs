//! Engine memory the node reaches in place: the host ranges registered with
//! `register_buffer` are also registered with the client's transfer engine as they are
//! (`KvClient::register_host`), and a batch whose spans all lie in one of them is one node
//! call that names those spans (`batch_get_into_parts` / `batch_put_from_parts`). The node
//! on the same host copies straight between its arena and the engine's memory through this
//! process's memory file; no staging buffer and no copy in this process.
//!
//! Anything else (spans in several ranges, unregistered memory, a cluster, a range the
//! engine would not register) goes through the staging buffers as before (`staging.rs`), and
//! so does everything when `YUTU_IN_PLACE=0` is set (to compare, or to rule the path out).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use yutu_client::kv::{Buffer, KvClient, Parts, PutOptions, MAX_BATCH};

use crate::errors::Result;
use crate::memory::Span;

/// Spans one node call names at most (the node takes 65,536).
const MAX_CALL_SPANS: usize = 16_384;

/// What became of a host range registered with `register_buffer`.
enum Registered {
    /// Registered with the engine as it is: its length and the registration.
    InPlace(u64, Arc<Buffer>),
    /// Staged, and why.
    Staged(String),
}

/// The registered host ranges, by start address (they never overlap: `Registry` refuses it).
#[derive(Default)]
pub struct InPlace {
    ranges: Mutex<BTreeMap<usize, Registered>>,
}

impl InPlace {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<usize, Registered>> {
        self.ranges.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers `[addr, addr + len)` with the engine. A failure is not an error: the range
    /// then goes through staging, as it always could, and [`InPlace::path`] says why.
    ///
    /// # Safety
    ///
    /// The range must stay mapped until [`InPlace::unregister`] (the contract of Mooncake's
    /// `register_buffer`, which the caller has already checked the range against).
    pub unsafe fn register(&self, kv: &KvClient, addr: usize, len: u64) {
        let registered = if kv.cluster_nodes() > 0 {
            Registered::Staged("the client routes over a cluster".into())
        } else if std::env::var_os("YUTU_IN_PLACE").is_some_and(|v| v == "0") {
            Registered::Staged("YUTU_IN_PLACE=0".into())
        } else {
            // SAFETY: the caller's contract.
            match unsafe { kv.register_host(addr as *mut u8, len) } {
                Ok(buf) => Registered::InPlace(len, Arc::new(buf)),
                Err(err) => Registered::Staged(err.to_string()),
            }
        };
        self.lock().insert(addr, registered);
    }

    /// How the host range registered at `addr` travels: `"in place"`, or `"staged: "` and
    /// why; `None` when no host range starts there.
    pub fn path(&self, addr: usize) -> Option<String> {
        self.lock().get(&addr).map(|r| match r {
            Registered::InPlace(..) => "in place".to_string(),
            Registered::Staged(why) => format!("staged: {why}"),
        })
    }

    /// Forgets the range registered at `addr` (the engine unregisters it once no call uses it).
    pub fn unregister(&self, addr: usize) {
        self.lock().remove(&addr);
    }

    /// The registration holding every span, and each block's spans as ranges of it; `None`
    /// when the spans are not all in one registered host range.
    fn resolve(&self, blocks: &[&[Span]]) -> Option<(Arc<Buffer>, Vec<Parts>)> {
        let first = blocks.iter().flat_map(|b| b.iter()).find(|s| s.len > 0)?;
        let ranges = self.lock();
        let (&base, Registered::InPlace(len, buf)) = ranges.range(..=first.addr).next_back()?
        else {
            return None;
        };
        let end = base.checked_add(*len as usize)?;
        let mut parts = Vec::with_capacity(blocks.len());
        for b in blocks {
            let mut p = Vec::with_capacity(b.len());
            for s in b.iter().filter(|s| s.len > 0) {
                let inside = s.device.is_none()
                    && s.addr >= base
                    && s.addr.checked_add(s.len as usize).is_some_and(|e| e <= end);
                if !inside {
                    return None;
                }
                p.push(((s.addr - base) as u64, s.len));
            }
            if p.is_empty() {
                return None;
            }
            parts.push(p);
        }
        Some((Arc::clone(buf), parts))
    }

    /// Fetches `keys[i]` into the spans `dests[i]` in place; `None` when the spans are not
    /// in one registered range (the caller stages instead).
    pub fn get_into(
        &self,
        kv: &KvClient,
        bucket: &str,
        keys: &[String],
        dests: &[&[Span]],
    ) -> Option<Result<Vec<Option<u64>>>> {
        let (buf, parts) = self.resolve(dests)?;
        let mut out = Vec::with_capacity(keys.len());
        for (ks, ps) in batches(keys, &parts) {
            match kv.batch_get_into_parts(bucket, ks, &buf, ps) {
                Ok(got) => out.extend(got),
                Err(e) => return Some(Err(e.into())),
            }
        }
        Some(Ok(out))
    }

    /// Stores `keys[i]` from the spans `srcs[i]` in place; `None` as for `get_into`.
    pub fn put_from(
        &self,
        kv: &KvClient,
        bucket: &str,
        keys: &[String],
        srcs: &[&[Span]],
        options: &PutOptions,
    ) -> Option<Result<()>> {
        let (buf, parts) = self.resolve(srcs)?;
        for (ks, ps) in batches(keys, &parts) {
            if let Err(e) = kv.batch_put_from_parts(bucket, ks, &buf, ps, options) {
                return Some(Err(e.into()));
            }
        }
        Some(Ok(()))
    }
}

/// `keys` and their parts cut into node calls of at most `MAX_BATCH` keys and
/// `MAX_CALL_SPANS` spans.
fn batches<'a>(keys: &'a [String], parts: &'a [Parts]) -> Vec<(&'a [String], &'a [Parts])> {
    let mut out = Vec::new();
    let (mut start, mut spans) = (0, 0);
    for (i, p) in parts.iter().enumerate() {
        if i > start && (i - start == MAX_BATCH || spans + p.len() > MAX_CALL_SPANS) {
            out.push((&keys[start..i], &parts[start..i]));
            (start, spans) = (i, 0);
        }
        spans += p.len();
    }
    if start < keys.len() {
        out.push((&keys[start..], &parts[start..]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_respect_both_limits() {
        let keys: Vec<String> = (0..5000).map(|i| i.to_string()).collect();
        let parts: Vec<Parts> = (0..5000).map(|_| vec![(0, 1)]).collect();
        let b = batches(&keys, &parts);
        assert_eq!(b.len(), 2);
        assert_eq!(b[0].0.len(), MAX_BATCH);
        let wide: Vec<Parts> = (0..3).map(|_| vec![(0, 1); 10_000]).collect();
        let b = batches(&keys[..3], &wide);
        assert_eq!(b.len(), 3);
        assert!(batches(&[], &[]).is_empty());
    }
}
