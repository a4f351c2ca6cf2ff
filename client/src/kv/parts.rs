//! Engine memory and scattered blocks: a range of memory the process already has (a numpy
//! array, a torch tensor, an engine's host pool) registered as it is, and get-into / put-from
//! calls whose blocks are scattered over, or gathered from, several ranges of one buffer
//! (a layer-first engine keeps one span per layer of each block).
//!
//! With the node on the same host, the node copies straight between its arena and such
//! memory through this process's memory file (`yutu_transfer::MemoryRegion::process_memory`):
//! one copy, no staging buffer. Elsewhere the node's transfer engine reaches it over tcp.

use std::sync::Arc;

use super::node::borrowed;
use yutu_api::kv::{GetIntoRequest, PutFromBlock, MAX_SPANS};
use yutu_transfer::huge_backing::{self, HugeBacking};
use yutu_transfer::MemoryRegion;

use super::checks::{check_batch, check_range, same_len};
use super::{Buffer, KvClient, KvError, NodeClient, PutOptions};

/// One block's spans: `(offset, len)` ranges of the buffer, in order.
pub type Parts = Vec<(u64, u64)>;

impl KvClient {
    /// Registers `len` bytes at `ptr`, memory this process already has, as a [`Buffer`]: the
    /// node reads and writes it in place (no staging copy on the same host). Unregistered
    /// when the buffer is dropped.
    ///
    /// The 2 MiB-aligned part of the range is first advised to use transparent huge pages,
    /// and its wholly resident chunks are collapsed into them (`yutu_transfer::huge_backing`:
    /// the node's 2 MiB copies into and out of memory without huge pages of its own ran
    /// 12-25% faster); `YUTU_HUGE_PAGES=advise` skips the collapse, `YUTU_HUGE_PAGES=0` both.
    ///
    /// # Safety
    ///
    /// `[ptr, ptr + len)` must be readable and writable memory of this process that stays
    /// mapped until the returned buffer is dropped; the node writes into it during
    /// get-into calls that name it, as into any registered buffer.
    pub unsafe fn register_host(&self, ptr: *mut u8, len: u64) -> Result<Buffer, KvError> {
        if let Ok(n) = usize::try_from(len) {
            let report = huge_backing::back_with_huge_pages(ptr, n, HugeBacking::from_env());
            tracing::debug!(
                advised = report.advised,
                collapsed = report.collapsed,
                refused = report.refused.as_deref().unwrap_or(""),
                "huge pages for a registered range"
            );
        }
        // SAFETY: the caller's contract.
        unsafe { self.register_process_memory(ptr, len) }
    }

    /// [`KvClient::register_host`] without the huge-page advice: for the own-memory
    /// registration (`own.rs`), which spans the whole address space and so must not advise it.
    ///
    /// # Safety
    ///
    /// As [`KvClient::register_host`].
    pub(super) unsafe fn register_process_memory(
        &self,
        ptr: *mut u8,
        len: u64,
    ) -> Result<Buffer, KvError> {
        let len = usize::try_from(len)
            .map_err(|_| KvError::InvalidArgument(format!("{len} bytes do not fit in memory")))?;
        // SAFETY: the caller's contract is the region's.
        let region = unsafe { MemoryRegion::process_memory(ptr, len) }?;
        let segment = self.inner.engine.register(region)?;
        Ok(Buffer {
            segment,
            inner: Arc::clone(&self.inner),
        })
    }

    /// Registers the first `len` bytes of the memfd `fd` (memory the engine allocated through
    /// Yutu, e.g. `MooncakeHostMemAllocator`) as a [`Buffer`]: a node on the same host maps the
    /// memfd itself and copies with `memcpy`, the fastest path there is (no staging copy, and
    /// none of the per-page cost of reaching plain process memory). The buffer maps the memfd
    /// a second time, so it stays valid however the caller's own mapping is used. The memfd
    /// must allow sealing (`MFD_ALLOW_SEALING`): it is sealed against shrinking, which a node
    /// requires before it maps a peer's memory.
    pub fn register_memfd(
        &self,
        fd: std::os::fd::BorrowedFd<'_>,
        len: u64,
    ) -> Result<Buffer, KvError> {
        let len = usize::try_from(len)
            .map_err(|_| KvError::InvalidArgument(format!("{len} bytes do not fit in memory")))?;
        let region = MemoryRegion::map_memfd(fd, len)?;
        if !region.sealed() {
            return Err(KvError::InvalidArgument(
                "the memfd cannot be sealed against shrinking (create it with MFD_ALLOW_SEALING)"
                    .into(),
            ));
        }
        let segment = self.inner.engine.register(region)?;
        Ok(Buffer {
            segment,
            inner: Arc::clone(&self.inner),
        })
    }

    /// Fetches each `keys[i]` into the ranges `parts[i]` of `buf`, in order (scatter: the
    /// block's first bytes fill the first range; the room for it is their sum). One node call;
    /// each block's length, `None` where the key is absent. Talks to this client's node only
    /// (`InvalidArgument` for a client that routes over a cluster).
    pub fn batch_get_into_parts(
        &self,
        bucket: &str,
        keys: &[String],
        buf: &Buffer,
        parts: &[Parts],
    ) -> Result<Vec<Option<u64>>, KvError> {
        self.one_node()?
            .batch_get_into_parts(bucket, keys, buf, parts)
    }

    /// Stores each `keys[i]` as the concatenation of the ranges `parts[i]` of `buf` (gather),
    /// with the put's `options` (mode and pin; one node, as [`KvClient::batch_get_into_parts`]).
    /// One node call; the ETags in order (empty for a key kept by [`PutMode::IfAbsent`]).
    pub fn batch_put_from_parts(
        &self,
        bucket: &str,
        keys: &[String],
        buf: &Buffer,
        parts: &[Parts],
        options: &PutOptions,
    ) -> Result<Vec<String>, KvError> {
        self.one_node()?
            .batch_put_from_parts(bucket, keys, buf, parts, options)
    }

    /// The node scattered blocks go to: the client's own, unless it routes over a cluster.
    fn one_node(&self) -> Result<&NodeClient, KvError> {
        if self.route.is_cluster() {
            return Err(KvError::InvalidArgument(
                "scattered blocks go to one node; this client routes over a cluster".into(),
            ));
        }
        Ok(self.route.seed())
    }
}

impl NodeClient {
    /// [`KvClient::batch_get_into_parts`] on this node.
    pub fn batch_get_into_parts(
        &self,
        bucket: &str,
        keys: &[String],
        buf: &Buffer,
        parts: &[Parts],
    ) -> Result<Vec<Option<u64>>, KvError> {
        let (ranges, counts) = self.check_parts(keys, buf, parts)?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut body =
            GetIntoRequest::into_buffer(borrowed(keys), buf.whole()?, ranges, self.session.clone());
        body.parts = Some(counts);
        self.get_into_call(bucket, keys, buf, &body, |i| {
            parts[i].iter().map(|p| p.1).sum()
        })
    }

    /// [`KvClient::batch_put_from_parts`] on this node.
    pub fn batch_put_from_parts(
        &self,
        bucket: &str,
        keys: &[String],
        buf: &Buffer,
        parts: &[Parts],
        options: &PutOptions,
    ) -> Result<Vec<String>, KvError> {
        let (_, counts) = self.check_parts(keys, buf, parts)?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let blocks = keys
            .iter()
            .zip(parts)
            .flat_map(|(key, p)| {
                p.iter().map(|&(offset, len)| PutFromBlock {
                    key: key.as_str(),
                    offset,
                    len,
                })
            })
            .collect();
        self.put_from_call(bucket, keys, buf, blocks, options, Some(counts))
    }

    /// Checks a scattered batch before anything is sent: the flattened ranges and the count
    /// of each block's.
    fn check_parts(
        &self,
        keys: &[String],
        buf: &Buffer,
        parts: &[Parts],
    ) -> Result<(Parts, Vec<u32>), KvError> {
        self.check_buffer(buf)?;
        same_len(keys, parts.len(), "part lists")?;
        check_batch(keys)?;
        let spans: usize = parts.iter().map(Vec::len).sum();
        if spans > MAX_SPANS {
            return Err(KvError::InvalidArgument(format!(
                "{spans} spans in one batch; the server takes at most {MAX_SPANS}"
            )));
        }
        let mut ranges = Vec::with_capacity(spans);
        let mut counts = Vec::with_capacity(parts.len());
        for (i, p) in parts.iter().enumerate() {
            if p.is_empty() || p.iter().all(|&(_, len)| len == 0) {
                return Err(KvError::InvalidArgument(format!("key {i} has no room")));
            }
            for &(off, len) in p {
                check_range(buf, i, off, len)?;
                ranges.push((off, len));
            }
            counts.push(p.len() as u32);
        }
        Ok((ranges, counts))
    }
}
