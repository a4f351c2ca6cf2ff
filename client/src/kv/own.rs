//! The client's own memory as one registration: this process's user address space,
//! registered with the engine once (on first use, never over a cluster) as one range of
//! process memory, for memory the client itself owns for the length of a call: a buffer it
//! just allocated for a get (a `Vec`, a Python `bytes`), the objects a put was given and
//! holds. The node on the same host copies straight into or out of them (cross-memory
//! attach), where staging cost a second copy of every byte.
//!
//! It is never used for an address a caller names (an engine's pointers stay checked against
//! its registrations, as in Mooncake): only this crate and the Python package mint
//! descriptors of it, each for one object they hold. It is made only with a node on this
//! host reached by the frames' Unix sockets: that node copies through the memory file the
//! client hands it with the registration (the whole address space, as for any process
//! memory an engine registers), and the kernel lets it use cross-memory attach only where
//! the client could do the same to the node (`yutu_transfer`'s `cross_memory`); a node on
//! another host never gets a descriptor of it.
//!
//! A call that ends without the node's answer (a timeout, a broken connection) may still be
//! copying on the node: its objects are then never freed ([`answered`], the callers leak
//! them), so a late copy can neither land in reused memory nor store bytes read from it.

use std::sync::Arc;

use super::{Buffer, FramesPath, KvClient, KvError, Parts, SmallValue, Span};

/// The addresses the registration covers: user space above the first 64 KiB, up to the
/// 47-bit limit of x86-64 and of the default `mmap` placement on aarch64. A span outside is
/// moved another way (staged).
const OWN_START: usize = 1 << 16;
const OWN_END: usize = 1 << 47;

/// Values up to this size come in the answer to a read; larger ones are written in place.
const INLINE_BYTES: u64 = 64 << 10;

impl KvClient {
    /// The own-memory registration, made on first use; `None` on a cluster or where the
    /// engine refuses it.
    pub(super) fn own_memory(&self) -> Option<Arc<Buffer>> {
        self.own
            .get_or_init(|| {
                let same_host = matches!(self.node().frames_path(), Some(FramesPath::Unix));
                if self.cluster_nodes() > 0 || !same_host {
                    return None;
                }
                // SAFETY: the range is never read or written through its pointer here: the
                // node copies only into the objects the callers of `own_parts` name, each
                // alive and owned by its caller for its call.
                match unsafe {
                    self.register_process_memory(OWN_START as *mut u8, (OWN_END - OWN_START) as u64)
                } {
                    Ok(buf) => Some(Arc::new(buf)),
                    Err(err) => {
                        tracing::debug!(%err, "own memory not registered: staged instead");
                        None
                    }
                }
            })
            .clone()
    }

    /// Whether the own-memory registration was made and is in use.
    pub fn own_memory_registered(&self) -> bool {
        matches!(self.own.get(), Some(Some(_)))
    }

    /// The bytes of `key` copied through its located slot into a new vector, without a
    /// call (see [`KvClient::locate`]); `None` when there is none or the copy did not stand.
    pub(super) fn get_located(&self, bucket: &str, key: &str) -> Option<Vec<u8>> {
        let loc = self.locate(bucket, key)?;
        if loc.len() > super::MAX_STAGED_BLOCK {
            return None;
        }
        let len = usize::try_from(loc.len()).ok()?;
        let mut out: Vec<u8> = Vec::with_capacity(len);
        // SAFETY: the vector's capacity is `len` bytes, and nothing else uses it.
        if !unsafe { self.copy_located(&loc, out.as_mut_ptr()) } {
            return None;
        }
        // SAFETY: `copy_located` wrote all `len` bytes of the capacity.
        unsafe { out.set_len(len) };
        Some(out)
    }

    /// Each block's spans as ranges of the own-memory registration; `None` when one lies
    /// outside it, is device memory, or a block has no bytes.
    pub(super) fn own_parts(blocks: &[&[Span]]) -> Option<Vec<Parts>> {
        blocks
            .iter()
            .map(|b| {
                let parts: Option<Parts> = b
                    .iter()
                    .filter(|s| s.len > 0)
                    .map(|s| {
                        let end = s.addr.checked_add(usize::try_from(s.len).ok()?)?;
                        (s.device.is_none() && s.addr >= OWN_START && end <= OWN_END)
                            .then(|| ((s.addr - OWN_START) as u64, s.len))
                    })
                    .collect();
                parts.filter(|p| !p.is_empty())
            })
            .collect()
    }

    /// The bytes of `key` when the client has its own memory registered (a node of its own
    /// on this host): a small value from the answer to one read, a larger one written by the
    /// node straight into the new vector. `None` when that cannot be done (a cluster, a node
    /// on another host, a value that kept changing size): the caller reads it the usual way.
    pub(super) fn get_bytes_own(
        &self,
        bucket: &str,
        key: &str,
    ) -> Option<Result<Option<Vec<u8>>, KvError>> {
        // Without own memory (a cluster, a node on another host) a large value would cost a
        // second read: the caller's one read answers it whole.
        let own = self.own_memory()?;
        if let Some(found) = self.get_located(bucket, key) {
            return Some(Ok(Some(found)));
        }
        let keys = [key.to_string()];
        for _ in 0..3 {
            let n = match self.get_small(bucket, key, INLINE_BYTES) {
                Ok(SmallValue::Bytes(data)) => return Some(Ok(Some(data))),
                Ok(SmallValue::Missing) => return Some(Ok(None)),
                Ok(SmallValue::Large(n)) => n,
                Err(e) => return Some(Err(e)),
            };
            // A size past the largest block a get stages goes the usual way (an S3 GET
            // streams it) rather than into one allocation.
            if n > super::MAX_STAGED_BLOCK {
                return None;
            }
            let len = usize::try_from(n).ok()?;
            let mut out: Vec<u8> = Vec::with_capacity(len);
            let span = Span {
                addr: out.as_mut_ptr() as usize,
                len: n,
                device: None,
            };
            let parts = Self::own_parts(&[&[span]])?;
            match self.batch_get_into_parts(bucket, &keys, &own, &parts) {
                Ok(got) if got.first() == Some(&Some(n)) => {
                    // SAFETY: the node wrote all `n` bytes of the vector's capacity (it
                    // answered the block's length, `n`, for a room of `n`).
                    unsafe { out.set_len(len) };
                    return Some(Ok(Some(out)));
                }
                Ok(got) if got.first() == Some(&None) => return Some(Ok(None)),
                // Replaced by a value of another size meanwhile: asked again.
                Ok(_) => continue,
                Err(e) if !answered(&e) => {
                    // The node may still write into it: never freed.
                    std::mem::forget(out);
                    return Some(Err(e));
                }
                Err(e) if e.code() == Some("InvalidArgument") => continue,
                Err(e) => return Some(Err(e)),
            }
        }
        None
    }
}

/// Whether a failed call is over on the node's side too: it answered (an error of its own),
/// or the call was refused before anything was sent. Otherwise (a timeout, a broken
/// connection) the node may still be copying into or out of the call's memory, which must
/// then stay allocated.
pub fn answered(e: &KvError) -> bool {
    use crate::ClientError;
    matches!(
        e,
        KvError::Client(
            ClientError::S3 { .. }
                | ClientError::InvalidArgument(_)
                | ClientError::InvalidUrl { .. }
                | ClientError::InvalidResponse(_),
        ) | KvError::InvalidArgument(_)
            | KvError::InvalidResponse(_)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ClientError;

    #[test]
    fn only_an_answer_or_a_refusal_before_sending_ends_a_call() {
        let s3 = KvError::Client(ClientError::S3 {
            status: 400,
            code: "InvalidArgument".into(),
            message: "too small".into(),
        });
        assert!(answered(&s3));
        assert!(answered(&KvError::InvalidArgument("no keys".into())));
        let io = KvError::Client(ClientError::Io(std::io::ErrorKind::TimedOut.into()));
        assert!(!answered(&io));
        assert!(!answered(&KvError::Busy("staging".into())));
    }

    #[test]
    fn own_parts_take_only_host_spans_inside_the_range() {
        let span = |addr, len, device| Span { addr, len, device };
        let ok =
            KvClient::own_parts(&[&[span(OWN_START, 10, None), span(OWN_START + 100, 0, None)]]);
        assert_eq!(ok, Some(vec![vec![(0, 10)]]));
        assert_eq!(KvClient::own_parts(&[&[span(0x1000, 10, None)]]), None);
        assert_eq!(KvClient::own_parts(&[&[span(OWN_END - 5, 10, None)]]), None);
        assert_eq!(
            KvClient::own_parts(&[&[span(OWN_START, 10, Some(0))]]),
            None
        );
        assert_eq!(KvClient::own_parts(&[&[span(OWN_START, 0, None)]]), None);
    }
}
