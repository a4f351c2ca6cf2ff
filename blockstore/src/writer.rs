//! The region buffer: records are appended to aligned in-memory chunks of the active region,
//! and each chunk becomes one O_DIRECT write as soon as it is full.
//!
//! The write path never blocks on the device. `append` copies a record into the current chunk
//! (crossing into new chunks as needed) and hands back the writes it made ready; the store
//! spawns them, so several are in flight while the next records are being copied. A chunk
//! stays in memory until every write covering it has completed, which is what lets a record be
//! read back the moment `append` returns, whether its bytes are still being filled, in flight,
//! or already on disk.
//!
//! Writes of one region never overlap. A full chunk is written from its own buffer without a
//! copy. A partial chunk (at a flush, or when the region is sealed) is first padded with zeros
//! to the I/O alignment, and its not-yet-written part is copied into a buffer of its own; the
//! next record then starts on the following aligned boundary, so no block is ever written
//! twice in one incarnation of a region. The price is at most one alignment unit (4 KiB) of
//! padding per flush.
//!
//! This module is pure bookkeeping: it allocates buffers from the device but never awaits.

use std::collections::{BTreeSet, HashMap};
use std::rc::Rc;

use crate::bdev::Bdev;
use crate::record::{align_record, SumKey};
use crate::region::{align_down, align_up, Geometry, RegionHeader};

/// A write the store must submit: `buf` goes to block `lba`.
pub(crate) struct PendingWrite<Buf> {
    pub id: u64,
    pub region: u32,
    pub chunk: u32,
    pub lba: u64,
    pub buf: Rc<Buf>,
}

/// One chunk of a region that is not (entirely) on disk yet.
struct MemChunk<Buf> {
    /// Still receiving records: the only mutable state.
    filling: Option<Buf>,
    /// No more records will land here; kept until its writes complete.
    frozen: Option<Rc<Buf>>,
    /// Writes covering this chunk that have not completed.
    outstanding: u32,
}

impl<Buf: AsRef<[u8]>> MemChunk<Buf> {
    fn bytes(&self) -> &[u8] {
        match (&self.filling, &self.frozen) {
            (Some(b), _) => b.as_ref(),
            (None, Some(b)) => b.as_ref().as_ref(),
            (None, None) => &[],
        }
    }
}

/// The region records are currently appended to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Active {
    pub region: u32,
    pub generation: u64,
    pub key: SumKey,
    /// Next free byte (record-aligned), relative to the region start.
    pub fill: u64,
    /// Bytes below this offset have been handed to writes (I/O-aligned).
    submitted: u64,
}

pub(crate) struct Writer<Buf> {
    geo: Geometry,
    chunk: u64,
    active: Option<Active>,
    chunks: HashMap<(u32, u32), MemChunk<Buf>>,
    pool: Vec<Buf>,
    pool_max: usize,
    next_id: u64,
    outstanding: BTreeSet<u64>,
}

impl<Buf: AsRef<[u8]> + AsMut<[u8]>> Writer<Buf> {
    pub fn new(geo: Geometry, chunk: usize, max_inflight: usize) -> Self {
        Writer {
            geo,
            chunk: chunk as u64,
            active: None,
            chunks: HashMap::new(),
            pool: Vec::new(),
            pool_max: max_inflight + 2,
            next_id: 1,
            outstanding: BTreeSet::new(),
        }
    }

    pub fn active(&self) -> Option<&Active> {
        self.active.as_ref()
    }

    /// Bytes still free in the active region (0 without one).
    pub fn room(&self) -> u64 {
        self.active
            .map_or(0, |a| self.geo.region_size.saturating_sub(a.fill))
    }

    /// Writes in flight.
    pub fn in_flight(&self) -> usize {
        self.outstanding.len()
    }

    /// The id of the last write handed out (0 before the first).
    pub fn last_id(&self) -> u64 {
        self.next_id - 1
    }

    /// Whether any write with an id up to `id` is still in flight.
    pub fn any_in_flight_upto(&self, id: u64) -> bool {
        self.outstanding.first().is_some_and(|&first| first <= id)
    }

    /// Whether any chunk of `region` is still held in memory.
    pub fn holds(&self, region: u32) -> bool {
        self.chunks.keys().any(|&(r, _)| r == region)
    }

    fn new_chunk_buf<B: Bdev<Buf = Buf>>(&mut self, bdev: &B) -> Buf {
        self.pool
            .pop()
            .unwrap_or_else(|| bdev.alloc_buf(self.chunk as usize))
    }

    /// Starts a fresh incarnation of a region: its header goes at the start of chunk 0 and
    /// records follow from the next aligned block.
    pub fn activate<B: Bdev<Buf = Buf>>(&mut self, bdev: &B, header: &RegionHeader) {
        debug_assert!(self.active.is_none(), "one active region at a time");
        let mut buf = self.new_chunk_buf(bdev);
        let head = &mut buf.as_mut()[..self.geo.data_start() as usize];
        head.fill(0);
        header.encode(head);
        self.chunks.insert(
            (header.region, 0),
            MemChunk {
                filling: Some(buf),
                frozen: None,
                outstanding: 0,
            },
        );
        self.active = Some(Active {
            region: header.region,
            generation: header.generation,
            key: header.sum_key(),
            fill: self.geo.data_start(),
            submitted: 0,
        });
    }

    /// Continues appending to a region found at recovery, after its last valid record at
    /// `fill`. `chunk_prefix` holds the device's bytes from the start of the chunk containing
    /// `fill` up to `fill`; they are copied into the buffer, so
    /// the block holding the tail of the last record is rewritten with identical bytes when
    /// the chunk is written, and whatever torn bytes followed it are overwritten.
    pub fn resume<B: Bdev<Buf = Buf>>(
        &mut self,
        bdev: &B,
        header: &RegionHeader,
        fill: u64,
        chunk_prefix: &[u8],
    ) {
        debug_assert!(self.active.is_none(), "one active region at a time");
        let c = fill / self.chunk;
        let start = c * self.chunk;
        if fill > start {
            let mut buf = self.new_chunk_buf(bdev);
            let n = (fill - start) as usize;
            buf.as_mut()[..n].copy_from_slice(&chunk_prefix[..n]);
            self.chunks.insert(
                (header.region, c as u32),
                MemChunk {
                    filling: Some(buf),
                    frozen: None,
                    outstanding: 0,
                },
            );
        }
        self.active = Some(Active {
            region: header.region,
            generation: header.generation,
            key: header.sum_key(),
            fill,
            submitted: align_down(fill, self.geo.io_align),
        });
    }

    /// Copies one record (header, bucket, key, metadata, value) at the active region's fill
    /// point and pads it to the record alignment. The caller has checked [`Writer::room`].
    /// Chunks the record filled are queued on `out` (all at once: glommio hands the writes to
    /// the kernel only when the task yields anyway). Returns the record's offset.
    pub fn append<B: Bdev<Buf = Buf>>(
        &mut self,
        bdev: &B,
        parts: &[&[u8]],
        out: &mut Vec<PendingWrite<Buf>>,
    ) -> u64 {
        let a = self.active.expect("append needs an active region");
        let offset = a.fill;
        let total: u64 = parts.iter().map(|p| p.len() as u64).sum();
        let padded = align_record(offset + total);
        debug_assert!(padded <= self.geo.region_size);
        for part in parts {
            self.copy_in(bdev, part);
        }
        let pad = (padded - (offset + total)) as usize;
        if pad > 0 {
            self.copy_in(bdev, &[0u8; 8][..pad]);
        }
        self.submit_upto(bdev, padded - padded % self.chunk, out);
        offset
    }

    /// Copies bytes at the fill point, into as many chunks as needed. Submission is the
    /// caller's business.
    fn copy_in<B: Bdev<Buf = Buf>>(&mut self, bdev: &B, mut data: &[u8]) {
        while !data.is_empty() {
            let a = self.active.expect("active region");
            let c = (a.fill / self.chunk) as u32;
            let off = (a.fill % self.chunk) as usize;
            if !self.chunks.contains_key(&(a.region, c)) {
                let buf = self.new_chunk_buf(bdev);
                self.chunks.insert(
                    (a.region, c),
                    MemChunk {
                        filling: Some(buf),
                        frozen: None,
                        outstanding: 0,
                    },
                );
            }
            let mc = self
                .chunks
                .get_mut(&(a.region, c))
                .expect("chunk just ensured");
            let buf = mc
                .filling
                .as_mut()
                .expect("the chunk at the fill point is filling");
            let n = data.len().min(self.chunk as usize - off);
            buf.as_mut()[off..off + n].copy_from_slice(&data[..n]);
            data = &data[n..];
            self.set_fill(a.fill + n as u64);
        }
    }

    fn set_fill(&mut self, fill: u64) {
        if let Some(a) = self.active.as_mut() {
            a.fill = fill;
        }
    }

    /// Pads the active region to the I/O alignment and queues a write of everything not yet
    /// submitted, so that a following device flush covers every record appended so far.
    pub fn submit_tail<B: Bdev<Buf = Buf>>(&mut self, bdev: &B, out: &mut Vec<PendingWrite<Buf>>) {
        let Some(a) = self.active else { return };
        let end = align_up(a.fill, self.geo.io_align).min(self.geo.region_size);
        if end > a.fill {
            let c = (a.fill / self.chunk) as u32;
            let off = (a.fill % self.chunk) as usize;
            let len = (end - a.fill) as usize;
            if let Some(buf) = self
                .chunks
                .get_mut(&(a.region, c))
                .and_then(|mc| mc.filling.as_mut())
            {
                buf.as_mut()[off..off + len].fill(0);
            }
            self.set_fill(end);
        }
        self.submit_upto(bdev, end, out);
    }

    /// Queues writes for `[submitted, upto)` of the active region, one per chunk touched, and
    /// freezes chunks that are now complete.
    fn submit_upto<B: Bdev<Buf = Buf>>(
        &mut self,
        bdev: &B,
        upto: u64,
        out: &mut Vec<PendingWrite<Buf>>,
    ) {
        let Some(mut a) = self.active else { return };
        while a.submitted < upto {
            let c = (a.submitted / self.chunk) as u32;
            let chunk_start = u64::from(c) * self.chunk;
            let chunk_end = chunk_start + self.chunk;
            let to = upto.min(chunk_end);
            let from = a.submitted;
            let id = self.next_id;
            let Some(mc) = self.chunks.get_mut(&(a.region, c)) else {
                debug_assert!(false, "submitting a chunk that is not in memory");
                break;
            };
            let whole = from == chunk_start && to == chunk_end;
            let buf = if whole && mc.filling.is_some() {
                let rc = Rc::new(mc.filling.take().expect("checked"));
                mc.frozen = Some(rc.clone());
                rc
            } else {
                let mut copy = bdev.alloc_buf((to - from) as usize);
                let src = &mc.bytes()[(from - chunk_start) as usize..(to - chunk_start) as usize];
                copy.as_mut().copy_from_slice(src);
                if to == chunk_end {
                    if let Some(b) = mc.filling.take() {
                        mc.frozen = Some(Rc::new(b));
                    }
                }
                Rc::new(copy)
            };
            mc.outstanding += 1;
            self.next_id += 1;
            self.outstanding.insert(id);
            out.push(PendingWrite {
                id,
                region: a.region,
                chunk: c,
                lba: self.geo.lba(a.region, from),
                buf,
            });
            a.submitted = to;
        }
        self.active = Some(a);
    }

    /// Stops appending to the active region: its tail is padded and queued, its chunks are
    /// frozen until their writes complete. Returns the region and its final fill.
    pub fn seal<B: Bdev<Buf = Buf>>(
        &mut self,
        bdev: &B,
        out: &mut Vec<PendingWrite<Buf>>,
    ) -> Option<(u32, u64)> {
        self.submit_tail(bdev, out);
        let a = self.active.take()?;
        let keys: Vec<(u32, u32)> = self
            .chunks
            .keys()
            .filter(|&&(r, _)| r == a.region)
            .copied()
            .collect();
        for key in keys {
            if let Some(mc) = self.chunks.get_mut(&key) {
                if let Some(b) = mc.filling.take() {
                    mc.frozen = Some(Rc::new(b));
                }
            }
            self.maybe_release(key);
        }
        Some((a.region, a.fill))
    }

    /// Records the completion of write `id`; frees its chunk's buffer once nothing needs it.
    pub fn complete(&mut self, id: u64, region: u32, chunk: u32) {
        self.outstanding.remove(&id);
        if let Some(mc) = self.chunks.get_mut(&(region, chunk)) {
            mc.outstanding = mc.outstanding.saturating_sub(1);
        }
        self.maybe_release((region, chunk));
    }

    fn maybe_release(&mut self, key: (u32, u32)) {
        let done = self
            .chunks
            .get(&key)
            .is_some_and(|mc| mc.filling.is_none() && mc.outstanding == 0);
        if !done {
            return;
        }
        if let Some(MemChunk {
            frozen: Some(rc), ..
        }) = self.chunks.remove(&key)
        {
            if let Ok(buf) = Rc::try_unwrap(rc) {
                if buf.as_ref().len() == self.chunk as usize && self.pool.len() < self.pool_max {
                    self.pool.push(buf);
                }
            }
        }
    }

    /// Copies the parts of `[start, start + out.len())` of `region` that are held in memory
    /// into `out`, and returns the sub-ranges (region offsets) that must come from the device.
    pub fn read_mem(&self, region: u32, start: u64, out: &mut [u8]) -> Vec<(u64, u64)> {
        let end = start + out.len() as u64;
        let mut missing: Vec<(u64, u64)> = Vec::new();
        let mut pos = start;
        while pos < end {
            let c = pos / self.chunk;
            let chunk_start = c * self.chunk;
            let to = end.min(chunk_start + self.chunk);
            match self.chunks.get(&(region, c as u32)) {
                Some(mc) => {
                    let src =
                        &mc.bytes()[(pos - chunk_start) as usize..(to - chunk_start) as usize];
                    out[(pos - start) as usize..(to - start) as usize].copy_from_slice(src);
                }
                None => match missing.last_mut() {
                    Some(last) if last.1 == pos => last.1 = to,
                    _ => missing.push((pos, to)),
                },
            }
            pos = to;
        }
        missing
    }

    /// Whether any byte of `[start, end)` of `region` is held in memory.
    pub fn touches_memory(&self, region: u32, start: u64, end: u64) -> bool {
        let first = start / self.chunk;
        let last = (end.max(start + 1) - 1) / self.chunk;
        (first..=last).any(|c| self.chunks.contains_key(&(region, c as u32)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bdev::ram::RamBdev;
    use crate::record::{encode_header, parse_header, verify, Parts, RecordKind, HEADER_LEN};
    use crate::region::new_nonce;

    /// Appends `value` under key "k" of bucket "b"; returns the record's offset.
    fn put(
        w: &mut Writer<Vec<u8>>,
        dev: &RamBdev,
        value: &[u8],
        out: &mut Vec<PendingWrite<Vec<u8>>>,
    ) -> u64 {
        let a = *w.active().expect("active");
        let parts = Parts {
            bucket: b"b",
            key: b"k",
            meta: b"",
            value,
        };
        let head = encode_header(&a.key, a.fill as u32, RecordKind::Put, &parts, 1);
        w.append(dev, &[&head, b"b", b"k", b"", value], out)
    }

    fn geo() -> Geometry {
        Geometry {
            block_size: 512,
            io_align: 4096,
            region_size: 64 << 10,
        }
    }

    fn header(region: u32) -> RegionHeader {
        RegionHeader {
            io_align: 4096,
            region_size: 64 << 10,
            region,
            shard: 0,
            nshards: 1,
            generation: 1,
            nonce: new_nonce(),
        }
    }

    #[test]
    fn full_chunks_are_written_without_copy_and_tails_padded() {
        let dev = RamBdev::new(512, 512);
        let mut w: Writer<Vec<u8>> = Writer::new(geo(), 16 << 10, 4);
        w.activate(&dev, &header(1));
        let mut out = Vec::new();
        // 4 KiB header block + a 13 KiB record: crosses into chunk 1.
        let value = vec![0x5A; 13 << 10];
        let off = put(&mut w, &dev, &value, &mut out);
        assert_eq!(off, 4096);
        assert_eq!(out.len(), 1, "chunk 0 filled");
        assert_eq!(out[0].lba, geo().region_lba(1));
        assert_eq!(out[0].buf.len(), 16 << 10);
        // Bytes still filling are readable from memory, header patched in and valid.
        let mut back = vec![0u8; HEADER_LEN + 2 + value.len()];
        assert!(w.read_mem(1, off, &mut back).is_empty());
        let key = w.active().expect("active").key;
        let hdr = parse_header(&key, off as u32, &back).expect("header in place");
        assert!(verify(&key, off as u32, &hdr, &back).is_ok());
        assert_eq!(&back[hdr.value_offset()..], &value[..]);
        // The tail write covers [16 KiB, 20 KiB): padded to 4 KiB, copied.
        let mut tail = Vec::new();
        w.submit_tail(&dev, &mut tail);
        assert_eq!(tail.len(), 1);
        assert_eq!(tail[0].lba, geo().lba(1, 16 << 10));
        assert_eq!(tail[0].buf.len(), 4096);
        assert_eq!(w.active().expect("active").fill, 20 << 10);
        assert_eq!(w.in_flight(), 2);
        // Once the full chunk's write completes, its bytes must come from the device.
        w.complete(out[0].id, 1, 0);
        let missing = w.read_mem(1, off, &mut back);
        assert_eq!(missing, vec![(4096, 16 << 10)]);
        assert!(w.any_in_flight_upto(tail[0].id));
        w.complete(tail[0].id, 1, 1);
        assert!(!w.any_in_flight_upto(u64::MAX));
    }

    #[test]
    fn sealing_freezes_and_releases_chunks() {
        let dev = RamBdev::new(512, 512);
        let mut w: Writer<Vec<u8>> = Writer::new(geo(), 16 << 10, 4);
        w.activate(&dev, &header(2));
        let mut out = Vec::new();
        put(&mut w, &dev, b"abc", &mut out);
        assert!(out.is_empty());
        assert_eq!(w.seal(&dev, &mut out), Some((2, 8192)));
        assert_eq!(out.len(), 1);
        assert!(w.holds(2));
        w.complete(out[0].id, 2, 0);
        assert!(!w.holds(2));
        assert_eq!(w.room(), 0);
    }
}
