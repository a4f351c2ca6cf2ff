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
use super::store::{ShardStore, Staged, ENTRY_OVERHEAD};
use crate::model::checksum::{Algorithm, Checksum, Hasher};
use crate::model::conditions::WriteConditions;
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

impl ShardStore {
    fn upload_mut(&mut self, id: &str, bucket: &str, key: &str) -> Result<&mut Upload, StoreError> {
        match self.uploads.get_mut(id) {
            Some(u) if u.bucket == bucket && u.key == key => Ok(u),
            _ => Err(StoreError::NoSuchUpload),
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
        checksum: Option<String>,
    ) -> Result<(), StoreError> {
        let alg = self.upload_mut(id, bucket, key)?.checksum;
        // Parts of an upload with a checksum algorithm always carry one, for the composite.
        let checksum = checksum.or_else(|| alg.map(|a| a.digest(data)));
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
        parts
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
        let mut md5s = Md5::new();
        for l in listed {
            let etag = bare(&upload.parts[&l.number].etag);
            md5s.update(hex::decode(&etag).unwrap_or_default());
        }
        let etag = format!("\"{}-{}\"", hex::encode(md5s.finalize()), listed.len());
        let mut meta = upload.template.clone();
        meta.size = total;
        meta.etag = etag;
        meta.last_modified = SystemTime::now();
        meta.parts = Some(listed.len() as u32);
        let alg = upload.checksum;
        let full = upload.full_object_checksum;

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
        self.free_parts(upload);
        Ok(Staged::new(dest, meta, charge))
    }
}

fn base64_decode(s: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .unwrap_or_default()
}
