//! The door to a shard's buckets: their lifecycle as the store sees it (added, closed,
//! gone) and their settings (`store::bucket_settings`), for the layers above, which never
//! reach the store itself.

use std::sync::Arc;
use std::time::SystemTime;

use yutu_api::cors::CorsConfiguration;

use super::TieredStore;
use crate::model::{BucketInfo, Durability};
use crate::store::bucket_settings::{BucketGuards, BucketSettings};

impl TieredStore {
    /// Adds a bucket (nothing when it is there already) and gives it its settings.
    pub fn add_bucket(
        &self,
        name: &str,
        created: SystemTime,
        owner: &str,
        durability: Durability,
        incarnation: u64,
        settings: impl FnOnce(&mut BucketSettings),
    ) {
        let mut store = self.store.borrow_mut();
        store.add_bucket(name, created, owner, durability, incarnation);
        if let Some(s) = store.bucket_settings_mut(name) {
            settings(s);
        }
    }

    /// Changes a bucket's settings (nothing when it does not exist).
    pub fn update_bucket(&self, name: &str, change: impl FnOnce(&mut BucketSettings)) {
        if let Some(s) = self.store.borrow_mut().bucket_settings_mut(name) {
            change(s);
        }
    }

    /// Reads a bucket's settings and incarnation in place (`None`: no such bucket), without
    /// copying them: the permission check of every request does.
    pub fn with_bucket<R>(
        &self,
        name: &str,
        read: impl FnOnce(Option<(&BucketSettings, u64)>) -> R,
    ) -> R {
        read(self.store.borrow().bucket_access(name))
    }

    /// The bucket exists and is not being deleted.
    pub fn bucket_exists(&self, name: &str) -> bool {
        self.store.borrow().bucket_exists(name)
    }

    /// The bucket exists, even while a delete of it is in progress.
    pub fn bucket_known(&self, name: &str) -> bool {
        self.store.borrow().bucket_known(name)
    }

    /// Every bucket of the shard with its settings, by name.
    pub fn buckets(&self) -> Vec<BucketInfo> {
        self.store.borrow().buckets()
    }

    /// One bucket with its settings, `None` when it does not exist.
    pub fn bucket_info(&self, name: &str) -> Option<BucketInfo> {
        self.store.borrow().bucket_info(name)
    }

    /// A bucket's owner, `None` when it does not exist.
    pub fn bucket_owner(&self, name: &str) -> Option<String> {
        self.with_bucket(name, |b| b.map(|(s, _)| s.owner.clone()))
    }

    /// A bucket's quota, `None` when it has none or does not exist.
    pub fn bucket_quota(&self, name: &str) -> Option<u64> {
        self.with_bucket(name, |b| b.and_then(|(s, _)| s.quota))
    }

    /// A bucket's CORS configuration, if it exists and has one.
    pub fn bucket_cors(&self, name: &str) -> Option<Arc<CorsConfiguration>> {
        self.with_bucket(name, |b| b.and_then(|(s, _)| s.cors.clone()))
    }

    /// A bucket's policy, public access block and object ownership (`None`: no such
    /// bucket).
    pub fn bucket_guards(&self, name: &str) -> Option<BucketGuards> {
        self.with_bucket(name, |b| b.map(|(s, _)| s.guards()))
    }

    /// Second phase of a bucket delete ([`TieredStore::close_bucket`] is the first): the
    /// bucket is gone (commit) or open again (abort).
    pub fn finish_close(&self, name: &str, commit: bool) {
        self.store.borrow_mut().finish_close(name, commit)
    }
}
