//! Multipart uploads on the shard that owns the destination key.
//!
//! Parts are kept in the shard's DRAM arena like objects, charged to its capacity, but they
//! are never handed to the eviction policy: a part the client was told is stored must still be
//! there at CompleteMultipartUpload. Completion copies the parts, in order, into one extent and
//! publishes it in the same non-yielding step, so readers see the old object or the whole new
//! one. Uploads that are neither completed nor aborted are reaped after a timeout.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use md5::{Digest, Md5};

use super::arena::{Arena, Extent};
use super::shard::{ShardStore, Staged, ENTRY_OVERHEAD};
use crate::model::checksum::{Algorithm, Checksum, Hasher};
use crate::model::conditions::WriteConditions;
use crate::model::object::PartLayout;
use crate::model::{ObjectMeta, StoreError};

/// Smallest part, except the last (S3's limit).
pub const MIN_PART_SIZE: u64 = 5 << 20;
/// Part numbers run from 1 to this (S3's limit).
pub const MAX_PART_NUMBER: u32 = 10_000;

pub struct Part {
    extent: Extent,
    charge: u64,
    pub size: u64,
    /// Quoted MD5 of the part.
    pub etag: String,
    pub checksum: Option<String>,
    pub last_modified: SystemTime,
}

pub struct Upload {
    pub bucket: String,
    pub key: String,
    pub initiated: SystemTime,
    /// Headers and metadata the finished object will carry.
    pub template: ObjectMeta,
    pub checksum: Option<Algorithm>,
    /// Whether the finished object's checksum covers the whole object (`FULL_OBJECT`) rather
    /// than the part checksums (`COMPOSITE`).
    pub full_object_checksum: bool,
    pub parts: BTreeMap<u32, Part>,
    /// The object checksum the CompleteMultipartUpload being served names, if any: set in the
    /// same step that completes the upload (see [`ShardStore::claim_checksum`]).
    pub claimed: Option<ClaimedChecksum>,
}

/// The checksum a CompleteMultipartUpload names for the finished object
/// (`x-amz-checksum-<alg>`): for a composite checksum `base64(H(part checksums))`, with or
/// without its `-N`, for a full-object one the CRC of all the bytes. The object is published
/// only if the checksum it gets is this one; the upload is kept otherwise, as S3 keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimedChecksum {
    pub algorithm: Algorithm,
    pub value: String,
}

impl ClaimedChecksum {
    /// Whether `actual`, the checksum Yutu computed for the object, is the one claimed.
    pub fn matches(&self, actual: &Checksum) -> bool {
        if self.algorithm != actual.algorithm {
            return false;
        }
        match actual.composite_parts {
            Some(n) => self.value == actual.value || self.value == format!("{}-{n}", actual.value),
            None => self.value == actual.value,
        }
    }
}

/// What ListParts and ListMultipartUploads report.
#[derive(Debug, Clone)]
pub struct PartInfo {
    pub number: u32,
    pub size: u64,
    pub etag: String,
    pub last_modified: SystemTime,
}

#[derive(Debug, Clone)]
pub struct UploadInfo {
    pub key: String,
    pub upload_id: String,
    pub initiated: SystemTime,
    /// Who started it (the object it completes will be theirs).
    pub owner: String,
}

/// One part named in CompleteMultipartUpload.
#[derive(Debug, Clone)]
pub struct CompletePart {
    pub number: u32,
    pub etag: String,
    pub checksum: Option<String>,
}

/// A CompleteMultipartUpload list with each run of one part number cut to its last entry.
///
/// A client that sends a part again while the first try is still in flight records both
/// answers, in the order they come back, and lists the part once per answer: the last one
/// names the upload that finished last, which is the part the upload holds (a part uploaded
/// again replaces the first when it is stored). S3 and Ceph RGW complete such a list from
/// that last entry (ceph/s3-tests `test_multipart_resend_first_finishes_last`). Only
/// neighbours collapse: a number coming back after a higher one is still out of order.
pub fn collapse_resent(listed: &[CompletePart]) -> Vec<CompletePart> {
    let mut out: Vec<CompletePart> = Vec::with_capacity(listed.len());
    for p in listed {
        match out.last_mut() {
            Some(last) if last.number == p.number => *last = p.clone(),
            _ => out.push(p.clone()),
        }
    }
    out
}

impl ShardStore {
    fn upload_mut(&mut self, id: &str, bucket: &str, key: &str) -> Result<&mut Upload, StoreError> {
        match self.uploads.get_mut(id) {
            Some(u) if u.bucket == bucket && u.key == key => Ok(u),
            _ => Err(StoreError::NoSuchUpload),
        }
    }

    /// The checksum algorithm upload `id` was created with and whether it is a full-object
    /// one (fixed for the upload's life).
    pub fn upload_checksum(
        &mut self,
        id: &str,
        bucket: &str,
        key: &str,
    ) -> Result<(Option<Algorithm>, bool), StoreError> {
        let u = self.upload_mut(id, bucket, key)?;
        Ok((u.checksum, u.full_object_checksum))
    }

    /// Records the checksum the CompleteMultipartUpload about to run names for the object (or
    /// that it names none), for [`ShardStore::stage_upload`] to check. An upload that does
    /// not exist is left for completion to refuse.
    pub fn claim_checksum(&mut self, id: &str, claimed: Option<ClaimedChecksum>) {
        if let Some(u) = self.uploads.get_mut(id) {
            u.claimed = claimed;
        }
    }

    pub fn create_upload(&mut self, id: String, upload: Upload) -> Result<(), StoreError> {
        self.check_write(&upload.bucket, &upload.key, &WriteConditions::default())?;
        self.uploads.insert(id, upload);
        Ok(())
    }

    /// Stores (or replaces) part `number` of an upload.
    #[allow(clippy::too_many_arguments)]
    pub fn upload_part(
        &mut self,
        id: &str,
        bucket: &str,
        key: &str,
        number: u32,
        data: &[u8],
        etag: String,
        checksum: Option<Checksum>,
    ) -> Result<(), StoreError> {
        let alg = self.upload_mut(id, bucket, key)?.checksum;
        // Parts of an upload with a checksum algorithm always carry one of that algorithm, for
        // the composite and the part reads; a client's checksum of another algorithm (verified
        // on the way in) does not describe the part in the object's terms. Parts of an upload
        // without one keep what the client sent, for the response to echo.
        let checksum = match (alg, checksum) {
            (Some(a), Some(c)) if c.algorithm == a => Some(c.value),
            (Some(a), _) => Some(a.digest(data)),
            (None, c) => c.map(|c| c.value),
        };
        let size = data.len() as u64;
        let charge = Arena::reservation_for(size) + ENTRY_OVERHEAD;
        let extent = self.reserve(size, charge)?;
        self.arena.bytes_mut(&extent).copy_from_slice(data);
        let part = Part {
            extent,
            charge,
            size,
            etag,
            checksum,
            last_modified: SystemTime::now(),
        };
        let old = self.upload_mut(id, bucket, key)?.parts.insert(number, part);
        if let Some(old) = old {
            self.release(old.extent, old.charge);
        }
        self.publish_gauges();
        Ok(())
    }

    pub fn abort_upload(&mut self, id: &str, bucket: &str, key: &str) -> Result<(), StoreError> {
        self.upload_mut(id, bucket, key)?;
        if let Some(upload) = self.uploads.remove(id) {
            self.free_parts(upload);
        }
        Ok(())
    }

    fn free_parts(&mut self, upload: Upload) {
        for (_, p) in upload.parts {
            self.drop_entry_charge(p.charge, p.extent);
        }
        self.publish_gauges();
    }

    /// Aborts every upload into `bucket` (the bucket is being deleted).
    pub(crate) fn drop_uploads_of(&mut self, bucket: &str) {
        let ids: Vec<String> = self
            .uploads
            .iter()
            .filter(|(_, u)| u.bucket == bucket)
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            if let Some(u) = self.uploads.remove(&id) {
                self.free_parts(u);
            }
        }
    }

    /// Aborts uploads initiated before `cutoff`; returns how many.
    pub fn reap_uploads(&mut self, cutoff: SystemTime) -> usize {
        let ids: Vec<String> = self
            .uploads
            .iter()
            .filter(|(_, u)| u.initiated < cutoff)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &ids {
            if let Some(u) = self.uploads.remove(id) {
                tracing::info!(bucket = %u.bucket, key = %u.key, upload_id = %id, "abandoned multipart upload reaped");
                self.free_parts(u);
            }
        }
        ids.len()
    }

    /// The size the object completed from `parts` of upload `id` would have (parts it does
    /// not hold count nothing: completion refuses them anyway).
    pub fn completed_size(&self, id: &str, parts: &[CompletePart]) -> u64 {
        let Some(upload) = self.uploads.get(id) else {
            return 0;
        };
        collapse_resent(parts)
            .iter()
            .filter_map(|p| upload.parts.get(&p.number))
            .map(|p| p.size)
            .sum()
    }

    /// Who started upload `id` (empty on an open node), `None` when it does not exist.
    pub fn upload_owner(&self, id: &str) -> Option<String> {
        self.uploads.get(id).map(|u| u.template.owner.clone())
    }

    pub fn list_parts(
        &mut self,
        id: &str,
        bucket: &str,
        key: &str,
        after: u32,
        max: usize,
    ) -> Result<Vec<PartInfo>, StoreError> {
        let upload = self.upload_mut(id, bucket, key)?;
        Ok(upload
            .parts
            .range(after + 1..)
            .take(max)
            .map(|(n, p)| PartInfo {
                number: *n,
                size: p.size,
                etag: p.etag.clone(),
                last_modified: p.last_modified,
            })
            .collect())
    }

    /// Uploads into `bucket` whose key starts with `prefix`, sorted by key then id.
    pub fn list_uploads(&self, bucket: &str, prefix: &str) -> Vec<UploadInfo> {
        let mut out: Vec<UploadInfo> = self
            .uploads
            .iter()
            .filter(|(_, u)| u.bucket == bucket && u.key.starts_with(prefix))
            .map(|(id, u)| UploadInfo {
                key: u.key.clone(),
                upload_id: id.clone(),
                initiated: u.initiated,
                owner: u.template.owner.clone(),
            })
            .collect();
        out.sort_by(|a, b| (&a.key, &a.upload_id).cmp(&(&b.key, &b.upload_id)));
        out
    }

    /// Assembles the listed parts into the object and publishes it.
    pub fn complete_upload(
        &mut self,
        id: &str,
        bucket: &str,
        key: &str,
        listed: &[CompletePart],
        cond: &WriteConditions,
    ) -> Result<Arc<ObjectMeta>, StoreError> {
        let staged = self.stage_upload(id, bucket, key, listed, cond)?;
        Ok(self.publish_staged(bucket, key, staged))
    }

    /// CompleteMultipartUpload up to, not including, publishing: the parts are assembled
    /// into one new extent and the upload is gone, but readers still see the old version.
    pub fn stage_upload(
        &mut self,
        id: &str,
        bucket: &str,
        key: &str,
        listed: &[CompletePart],
        cond: &WriteConditions,
    ) -> Result<Staged, StoreError> {
        self.check_write(bucket, key, cond)?;
        let upload = self.upload_mut(id, bucket, key)?;
        let listed = &collapse_resent(listed)[..];
        if listed.is_empty() {
            return Err(StoreError::InvalidPart(
                "You must specify at least one part.".into(),
            ));
        }
        if listed.windows(2).any(|w| w[0].number >= w[1].number) {
            return Err(StoreError::InvalidPartOrder);
        }
        let bare = |e: &str| e.trim().trim_matches('"').to_string();
        for (i, l) in listed.iter().enumerate() {
            let part = upload.parts.get(&l.number).ok_or_else(|| {
                StoreError::InvalidPart(format!("Part {} has not been uploaded.", l.number))
            })?;
            if bare(&part.etag) != bare(&l.etag) {
                return Err(StoreError::InvalidPart(format!(
                    "The ETag of part {} does not match.",
                    l.number
                )));
            }
            if let (Some(given), Some(stored)) = (&l.checksum, &part.checksum) {
                if given != stored {
                    return Err(StoreError::InvalidPart(format!(
                        "The checksum of part {} does not match.",
                        l.number
                    )));
                }
            }
            if i + 1 < listed.len() && part.size < MIN_PART_SIZE {
                return Err(StoreError::EntityTooSmall(format!(
                    "Part {} is {} bytes; every part but the last must be at least {MIN_PART_SIZE} bytes.",
                    l.number, part.size
                )));
            }
        }
        let total: u64 = listed.iter().map(|l| upload.parts[&l.number].size).sum();
        let sizes: Vec<u64> = listed
            .iter()
            .map(|l| upload.parts[&l.number].size)
            .collect();
        let alg = upload.checksum;
        let full = upload.full_object_checksum;
        let part_checksums: Vec<String> = if alg.is_some() {
            listed
                .iter()
                .filter_map(|l| upload.parts[&l.number].checksum.clone())
                .collect()
        } else {
            Vec::new()
        };
        let mut meta = upload.template.clone();
        meta.size = total;
        meta.etag = multipart_etag(listed);
        meta.last_modified = SystemTime::now();
        meta.parts = Some(PartLayout::new(id, &sizes, part_checksums));

        let charge = Self::charge_for(bucket, key, total, &meta);
        let dest = self.reserve(total, charge)?;
        let Some(upload) = self.uploads.remove(id) else {
            self.release(dest, charge);
            return Err(StoreError::NoSuchUpload);
        };
        let mut offset = 0usize;
        let mut composite = alg.map(Hasher::new);
        let mut whole = alg.filter(|_| full).map(Hasher::new);
        for l in listed {
            let part = &upload.parts[&l.number];
            let src = self.arena.bytes(&part.extent).to_vec();
            self.arena.bytes_mut(&dest)[offset..offset + src.len()].copy_from_slice(&src);
            offset += src.len();
            if let Some(h) = whole.as_mut() {
                h.update(&src);
            }
            if let (Some(h), Some(a)) = (composite.as_mut(), alg) {
                let value = part.checksum.clone().unwrap_or_else(|| a.digest(&src));
                h.update(&base64_decode(&value));
            }
        }
        meta.checksum = match (alg, whole, composite) {
            (Some(a), Some(h), _) => Some(Checksum {
                algorithm: a,
                value: h.finish(),
                composite_parts: None,
            }),
            (Some(a), None, Some(h)) => Some(Checksum {
                algorithm: a,
                value: h.finish(),
                composite_parts: Some(listed.len() as u32),
            }),
            _ => None,
        };
        if let Some(claimed) = upload.claimed.clone() {
            if !meta.checksum.as_ref().is_some_and(|c| claimed.matches(c)) {
                // The upload stays for the client to complete correctly.
                self.release(dest, charge);
                let mut upload = upload;
                upload.claimed = None;
                self.uploads.insert(id.to_string(), upload);
                return Err(StoreError::BadDigest(format!(
                    "The {} you specified did not match the calculated checksum.",
                    claimed.algorithm.name()
                )));
            }
        }
        self.free_parts(upload);
        Ok(Staged::new(dest, meta, charge))
    }
}

/// The ETag of the object completed from `listed` (resent parts collapsed): the MD5 of the
/// part MD5s, then `-` and the part count, as S3 computes it. The same list always gives the
/// same ETag, which lets a repeated CompleteMultipartUpload be recognised.
pub fn multipart_etag(listed: &[CompletePart]) -> String {
    let listed = collapse_resent(listed);
    let mut md5s = Md5::new();
    for l in &listed {
        let etag = l.etag.trim().trim_matches('"');
        md5s.update(hex::decode(etag).unwrap_or_default());
    }
    format!("\"{}-{}\"", hex::encode(md5s.finalize()), listed.len())
}

fn base64_decode(s: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(number: u32, etag: &str) -> CompletePart {
        CompletePart {
            number,
            etag: etag.to_string(),
            checksum: None,
        }
    }

    #[test]
    fn a_claimed_checksum_matches_with_or_without_its_part_count() {
        let composite = Checksum {
            algorithm: Algorithm::Sha256,
            value: "v=".into(),
            composite_parts: Some(3),
        };
        let claim = |alg, v: &str| ClaimedChecksum {
            algorithm: alg,
            value: v.into(),
        };
        assert!(claim(Algorithm::Sha256, "v=-3").matches(&composite));
        assert!(claim(Algorithm::Sha256, "v=").matches(&composite));
        assert!(!claim(Algorithm::Sha256, "v=-2").matches(&composite));
        assert!(!claim(Algorithm::Sha1, "v=-3").matches(&composite));
        let full = Checksum {
            composite_parts: None,
            ..composite
        };
        assert!(claim(Algorithm::Sha256, "v=").matches(&full));
        assert!(!claim(Algorithm::Sha256, "v=-3").matches(&full));
    }

    #[test]
    fn the_multipart_etag_is_of_the_listed_part_md5s() {
        let md5_of_a = "0cc175b9c0f1b6a831c399e269772661";
        let listed = [part(1, md5_of_a), part(2, &format!("\"{md5_of_a}\""))];
        let mut h = Md5::new();
        h.update(hex::decode(md5_of_a).unwrap());
        h.update(hex::decode(md5_of_a).unwrap());
        assert_eq!(
            multipart_etag(&listed),
            format!("\"{}-2\"", hex::encode(h.finalize()))
        );
    }

    #[test]
    fn a_resent_part_listed_twice_counts_once_by_its_last_entry() {
        let listed = [
            part(1, "b"),
            part(1, "a"),
            part(2, "c"),
            part(3, "d"),
            part(3, "e"),
        ];
        let kept: Vec<(u32, String)> = collapse_resent(&listed)
            .into_iter()
            .map(|p| (p.number, p.etag))
            .collect();
        assert_eq!(
            kept,
            [(1, "a".into()), (2, "c".into()), (3, "e".into())],
            "each run of one number keeps its last entry"
        );
        // A number after a higher one is not a resend: left for the order check to refuse.
        let kept = collapse_resent(&[part(1, "a"), part(2, "b"), part(1, "c")]);
        assert_eq!(kept.len(), 3);
        assert!(collapse_resent(&[]).is_empty());
    }
}
