//! Recovery: rebuilding the index from the device when a store opens.
//!
//! Every owned region's header is read first. Blank regions are free; damaged headers are
//! counted and their regions reused (without the nonce their records cannot be validated);
//! headers of another layout are refused or, if asked, discarded. The regions in use are then
//! read whole, oldest generation first, and their records replayed in order: the newest valid
//! version of a key wins, and a tombstone hides every older version.
//!
//! Scanning a region: records are packed at 8-byte alignment after the header block. A record
//! whose header checks out but whose checksum does not (a torn tail, flipped bits in the value)
//! is counted and stepped over: the header checksum makes its length trustworthy. Where no
//! valid header starts, the scanner searches forward, 8 bytes at a time, for the next one;
//! non-zero bytes skipped between two valid records are counted as one corrupt record, while
//! whatever follows the last valid record (zeros, a torn write, records of the region's
//! previous incarnation, which fail their keyed checksum) is simply the end of the log.
//!
//! The newest region with room left is resumed as the active region after its last valid
//! record, so a restart does not waste the rest of it (and so a reclamation interrupted by a
//! crash finds room to finish its rewrites).

use std::collections::{BTreeMap, HashMap, VecDeque};

use bytes::Bytes;

use crate::bdev::Bdev;
use crate::config::StoreConfig;
use crate::error::StoreError;
use crate::index::Index;
use crate::location::Location;
use crate::record::{
    align_record, has_magic, parse_header, verify, RecordHeader, RecordKind, SumKey, HEADER_LEN,
    RECORD_ALIGN,
};
use crate::region::{Geometry, HeaderState, RegionHeader};
use crate::region_info::{Member, RegionInfo, RegionState};

/// What recovery found when the store opened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Regions with a valid header of this layout.
    pub regions_in_use: u32,
    /// Intact records (puts and tombstones) replayed.
    pub records: u64,
    /// Records skipped as torn or corrupt.
    pub corrupt_records: u64,
    /// Regions whose header was damaged.
    pub corrupt_regions: u32,
    /// Regions of another layout that were discarded (`discard_foreign`).
    pub foreign_regions: u32,
    /// The region appends continue in, if one had room left.
    pub resumed_region: Option<u32>,
}

/// One valid record found by [`scan_region`].
#[derive(Debug)]
pub(crate) struct Scanned<'a> {
    pub offset: u32,
    pub header: RecordHeader,
    pub bucket: &'a str,
    pub key: &'a str,
    pub meta: &'a [u8],
}

/// The result of scanning one region.
#[derive(Debug)]
pub(crate) struct Scan<'a> {
    pub records: Vec<Scanned<'a>>,
    pub corrupt: u64,
    /// Record-aligned end of the last valid record (the data start if there is none).
    pub end: u64,
}

/// Scans the records of one region (`data` is the whole region, header block included).
pub(crate) fn scan_region<'a>(geo: &Geometry, key: &SumKey, data: &'a [u8]) -> Scan<'a> {
    let size = data.len().min(geo.region_size as usize);
    let mut scan = Scan {
        records: Vec::new(),
        corrupt: 0,
        end: geo.data_start(),
    };
    let mut p = geo.data_start() as usize;
    // Start of bytes skipped since the last record (no valid header there).
    let mut skipped_from: Option<usize> = None;
    while p + HEADER_LEN <= size {
        let hdr = if has_magic(&data[p..]) {
            parse_header(key, p as u32, &data[p..size])
                .filter(|h| h.total_len() <= (size - p) as u64)
        } else {
            None
        };
        let Some(hdr) = hdr else {
            skipped_from.get_or_insert(p);
            p += RECORD_ALIGN as usize;
            continue;
        };
        if let Some(from) = skipped_from.take() {
            if data[from..p].iter().any(|&b| b != 0) {
                scan.corrupt += 1;
            }
        }
        let total = hdr.total_len() as usize;
        let rec = &data[p..p + total];
        let names = verify(key, p as u32, &hdr, rec).ok().and_then(|v| {
            Some((
                std::str::from_utf8(v.bucket).ok()?,
                std::str::from_utf8(v.key).ok()?,
                v.meta,
            ))
        });
        match names {
            Some((bucket, name, meta)) => {
                scan.records.push(Scanned {
                    offset: p as u32,
                    header: hdr,
                    bucket,
                    key: name,
                    meta,
                });
                scan.end = align_record((p + total) as u64);
            }
            None => scan.corrupt += 1,
        }
        p = align_record((p + total) as u64) as usize;
    }
    scan
}

/// A region to continue appending to.
pub(crate) struct Resume {
    pub header: RegionHeader,
    pub fill: u64,
    /// The device's bytes from the start of the chunk holding `fill` up to `fill`.
    pub chunk_prefix: Vec<u8>,
}

/// Everything recovery rebuilt.
pub(crate) struct Recovered {
    pub regions: BTreeMap<u32, RegionInfo>,
    pub free: VecDeque<u32>,
    pub sealed: VecDeque<u32>,
    pub index: Index,
    pub next_seq: u64,
    pub next_gen: u64,
    pub report: RecoveryReport,
    pub resume: Option<Resume>,
}

fn region_info(h: Option<&RegionHeader>) -> RegionInfo {
    RegionInfo {
        generation: h.map_or(0, |h| h.generation),
        key: h.map_or(SumKey([0; 32]), |h| h.sum_key()),
        state: RegionState::Free,
        fill: 0,
        live_bytes: 0,
        members: Vec::new(),
    }
}

/// Reads the owned regions of `bdev` and rebuilds the store's state from them.
pub(crate) async fn recover<B: Bdev>(
    bdev: &B,
    geo: Geometry,
    cfg: &StoreConfig,
    owned: &[u32],
) -> Result<Recovered, StoreError> {
    let mut report = RecoveryReport::default();
    let mut regions = BTreeMap::new();
    let mut free = VecDeque::new();
    let mut in_use: Vec<RegionHeader> = Vec::new();
    let mut max_gen = 0u64;
    let header_blocks = geo.io_align / geo.block_size;
    for &r in owned {
        let block = bdev.read_blocks(geo.region_lba(r), header_blocks).await?;
        let header = match RegionHeader::decode(block.as_ref()) {
            HeaderState::Blank => None,
            HeaderState::Garbage => {
                report.corrupt_regions += 1;
                tracing::warn!(region = r, "damaged region header; region reused");
                None
            }
            HeaderState::Valid(h) if h.region != r => {
                report.corrupt_regions += 1;
                None
            }
            HeaderState::Valid(h)
                if h.shard != cfg.shard
                    || h.nshards != cfg.nshards
                    || h.region_size != geo.region_size
                    || u64::from(h.io_align) != geo.io_align =>
            {
                if !cfg.discard_foreign {
                    return Err(StoreError::ForeignRegion {
                        region: r,
                        shard: h.shard,
                        nshards: h.nshards,
                        region_size: h.region_size,
                        my_shard: cfg.shard,
                        my_nshards: cfg.nshards,
                        my_region_size: geo.region_size,
                    });
                }
                report.foreign_regions += 1;
                None
            }
            HeaderState::Valid(h) => Some(h),
        };
        if let Some(h) = &header {
            max_gen = max_gen.max(h.generation);
            in_use.push(*h);
        } else {
            free.push_back(r);
        }
        regions.insert(r, region_info(header.as_ref()));
    }
    report.regions_in_use = in_use.len() as u32;
    in_use.sort_by_key(|h| h.generation);

    let mut index = Index::default();
    let mut tombstones: HashMap<(String, String), u64> = HashMap::new();
    let mut sealed = VecDeque::new();
    let mut max_seq = 0u64;
    let mut newest: Option<Resume> = None;
    for h in &in_use {
        let data = bdev
            .read_blocks(geo.region_lba(h.region), geo.region_blocks())
            .await?;
        let key = h.sum_key();
        let scan = scan_region(&geo, &key, data.as_ref());
        report.corrupt_records += scan.corrupt;
        if scan.corrupt > 0 {
            tracing::warn!(
                region = h.region,
                corrupt = scan.corrupt,
                "skipped corrupt records"
            );
        }
        if scan.records.is_empty() {
            free.push_back(h.region);
            continue;
        }
        for rec in &scan.records {
            report.records += 1;
            let seq = rec.header.seq;
            max_seq = max_seq.max(seq);
            match rec.header.kind {
                RecordKind::Put => {
                    let hidden = tombstones
                        .get(&(rec.bucket.to_owned(), rec.key.to_owned()))
                        .is_some_and(|&t| t >= seq);
                    let newer = index.get(rec.bucket, rec.key).is_some_and(|l| l.seq >= seq);
                    if !hidden && !newer {
                        index.insert(
                            rec.bucket,
                            rec.key,
                            Location {
                                region: h.region,
                                offset: rec.offset,
                                record_len: rec.header.total_len() as u32,
                                value_len: rec.header.value_len as u32,
                                generation: h.generation,
                                seq,
                            },
                            Bytes::copy_from_slice(rec.meta),
                        );
                    }
                }
                RecordKind::Tombstone => {
                    let t = tombstones
                        .entry((rec.bucket.to_owned(), rec.key.to_owned()))
                        .or_insert(0);
                    *t = (*t).max(seq);
                    if index.get(rec.bucket, rec.key).is_some_and(|l| l.seq < seq) {
                        index.remove(rec.bucket, rec.key);
                    }
                }
            }
        }
        if let Some(info) = regions.get_mut(&h.region) {
            info.state = RegionState::Sealed;
            info.fill = scan.end;
        }
        sealed.push_back(h.region);
        let chunk = cfg.write_chunk as u64;
        let start = scan.end / chunk * chunk;
        newest = Some(Resume {
            header: *h,
            fill: scan.end,
            chunk_prefix: data.as_ref()[start as usize..scan.end as usize].to_vec(),
        });
    }

    // Live bytes and member lists, from the final index.
    for (bucket, key, loc) in index.entries() {
        if let Some(info) = regions.get_mut(&loc.region) {
            info.live_bytes += loc.record_len();
            info.members.push(Member { bucket, key, loc });
        }
    }
    for info in regions.values_mut() {
        info.members.sort_by_key(|m| m.loc.offset);
    }

    let resume = newest.filter(|n| geo.region_size - n.fill >= geo.io_align);
    if let Some(n) = &resume {
        sealed.retain(|&r| r != n.header.region);
        report.resumed_region = Some(n.header.region);
    }
    Ok(Recovered {
        regions,
        free,
        sealed,
        index,
        next_seq: max_seq + 1,
        next_gen: max_gen + 1,
        report,
        resume,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{encode_header, Parts};
    use crate::region::new_nonce;

    fn geo() -> Geometry {
        Geometry {
            block_size: 512,
            io_align: 4096,
            region_size: 64 << 10,
        }
    }

    fn key() -> SumKey {
        RegionHeader {
            io_align: 4096,
            region_size: 64 << 10,
            region: 0,
            shard: 0,
            nshards: 1,
            generation: 1,
            nonce: new_nonce(),
        }
        .sum_key()
    }

    /// Writes records into a region image; returns their offsets.
    fn fill(data: &mut [u8], key: &SumKey, values: &[&[u8]]) -> Vec<usize> {
        let mut p = 4096usize;
        let mut offsets = Vec::new();
        for (i, v) in values.iter().enumerate() {
            let name = format!("k{i}");
            let parts = Parts {
                bucket: b"b",
                key: name.as_bytes(),
                meta: b"",
                value: v,
            };
            let h = encode_header(key, p as u32, RecordKind::Put, &parts, i as u64 + 1);
            let rec = [&h[..], b"b", name.as_bytes(), v].concat();
            data[p..p + rec.len()].copy_from_slice(&rec);
            offsets.push(p);
            p = align_record((p + rec.len()) as u64) as usize;
        }
        offsets
    }

    #[test]
    fn finds_every_record_and_the_end() {
        let k = key();
        let mut data = vec![0u8; 64 << 10];
        let offs = fill(&mut data, &k, &[b"one", &[7; 1000], b""]);
        let scan = scan_region(&geo(), &k, &data);
        assert_eq!(scan.corrupt, 0);
        let got: Vec<usize> = scan.records.iter().map(|r| r.offset as usize).collect();
        assert_eq!(got, offs);
        assert_eq!(scan.records[1].key, "k1");
        assert_eq!(scan.end, align_record(offs[2] as u64 + 72 + 1 + 2));
    }

    #[test]
    fn skips_damaged_records_and_resynchronises() {
        let k = key();
        let mut data = vec![0u8; 64 << 10];
        let offs = fill(&mut data, &k, &[b"aaaa", &[1; 500], b"cccc", b"dddd"]);
        data[offs[1] + 100] ^= 0xFF; // payload damage: header still valid
        data[offs[2] + 1] ^= 0xFF; // header damage: must search for the next record
        let scan = scan_region(&geo(), &k, &data);
        let keys: Vec<&str> = scan.records.iter().map(|r| r.key).collect();
        assert_eq!(keys, ["k0", "k3"]);
        assert_eq!(scan.corrupt, 2);
    }

    #[test]
    fn torn_tail_is_counted_and_other_keys_records_are_invisible() {
        let k = key();
        let mut data = vec![0u8; 64 << 10];
        let offs = fill(&mut data, &k, &[b"x", &[9; 3000]]);
        let cut = offs[1] + 1000;
        data[cut..].fill(0);
        let scan = scan_region(&geo(), &k, &data);
        assert_eq!(scan.records.len(), 1);
        assert_eq!(scan.corrupt, 1);
        assert_eq!(scan.end, align_record(offs[0] as u64 + 72 + 1 + 2 + 1));
        // The same bytes under another incarnation's key are just the end of the log.
        let other = scan_region(&geo(), &key(), &data);
        assert!(other.records.is_empty());
        assert_eq!(other.corrupt, 0);
    }
}
