//! The door to a shard's multipart uploads in progress (the parts live in DRAM until
//! completion, `store::multipart`; completing one is [`TieredStore::complete_upload`]).

use std::time::SystemTime;

use super::TieredStore;
use crate::model::checksum::{Algorithm, Checksum};
use crate::model::StoreError;
use crate::store::multipart::{ClaimedChecksum, CompletePart, PartInfo, Upload, UploadInfo};

impl TieredStore {
    /// Starts upload `id` (refused where a write of its key would be).
    pub fn create_upload(&self, id: String, upload: Upload) -> Result<(), StoreError> {
        self.store.borrow_mut().create_upload(id, upload)
    }

    /// Stores part `number` of upload `id` of `bucket/key`.
    #[allow(clippy::too_many_arguments)]
    pub fn upload_part(
        &self,
        id: &str,
        bucket: &str,
        key: &str,
        number: u32,
        data: &[u8],
        etag: String,
        checksum: Option<Checksum>,
    ) -> Result<(), StoreError> {
        self.store
            .borrow_mut()
            .upload_part(id, bucket, key, number, data, etag, checksum)
    }

    /// The upload's checksum algorithm and whether it is of the full object.
    pub fn upload_checksum(
        &self,
        id: &str,
        bucket: &str,
        key: &str,
    ) -> Result<(Option<Algorithm>, bool), StoreError> {
        self.store.borrow_mut().upload_checksum(id, bucket, key)
    }

    /// The size the object completed from `parts` would have.
    pub fn completed_size(&self, id: &str, parts: &[CompletePart]) -> u64 {
        self.store.borrow().completed_size(id, parts)
    }

    /// Records the object checksum the completion being served names.
    pub fn claim_checksum(&self, id: &str, claimed: Option<ClaimedChecksum>) {
        self.store.borrow_mut().claim_checksum(id, claimed)
    }

    /// Abandons upload `id` of `bucket/key` and frees its parts.
    pub fn abort_upload(&self, id: &str, bucket: &str, key: &str) -> Result<(), StoreError> {
        self.store.borrow_mut().abort_upload(id, bucket, key)
    }

    /// Up to `max` parts of upload `id` after part number `after`, and who started it.
    pub fn list_parts(
        &self,
        id: &str,
        bucket: &str,
        key: &str,
        after: u32,
        max: usize,
    ) -> Result<(Vec<PartInfo>, Option<String>), StoreError> {
        let mut store = self.store.borrow_mut();
        let parts = store.list_parts(id, bucket, key, after, max)?;
        Ok((parts, store.upload_owner(id)))
    }

    /// The uploads in progress in `bucket` under `prefix`.
    pub fn list_uploads(&self, bucket: &str, prefix: &str) -> Vec<UploadInfo> {
        self.store.borrow().list_uploads(bucket, prefix)
    }

    /// Drops the uploads started before `cutoff`; how many.
    pub fn reap_uploads(&self, cutoff: SystemTime) -> usize {
        self.store.borrow_mut().reap_uploads(cutoff)
    }
}
