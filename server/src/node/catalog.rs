//! The bucket catalog on disk: bucket definitions survive restarts.
//!
//! Buckets change rarely, so the whole catalog is one small JSON file rewritten on every
//! change by the bucket coordinator (shard 0): written to a temporary file, synced, renamed
//! over the old one and the directory synced, so a crash leaves the old or the new catalog,
//! never a torn one.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::model::Durability;

/// One bucket as stored in the catalog.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketRecord {
    pub name: String,
    /// Milliseconds since the Unix epoch.
    pub created_ms: u64,
    pub owner: String,
    #[serde(default)]
    pub durability: Durability,
    /// Tells this bucket from an earlier one of the same name; catalogs written before it
    /// existed get one derived from the name and creation time.
    #[serde(default)]
    pub incarnation: u64,
    /// Most bytes of objects the bucket may hold; catalogs written before quotas have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<u64>,
    /// Grants beyond the owner's.
    #[serde(default, skip_serializing_if = "yutu_api::acl::Acl::is_empty")]
    pub acl: yutu_api::acl::Acl,
    /// The CORS configuration (`PUT ?cors`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cors: Option<yutu_api::cors::CorsConfiguration>,
    /// The bucket policy's text (`PUT ?policy`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// The public access block (`PUT ?publicAccessBlock`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_access_block: Option<yutu_api::public_access_block::PublicAccessBlock>,
    /// The object ownership (`PUT ?ownershipControls`), if set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ownership: Option<yutu_api::ownership::ObjectOwnership>,
}

impl BucketRecord {
    /// The incarnation, derived for records that predate the field.
    pub fn incarnation(&self) -> u64 {
        if self.incarnation != 0 {
            return self.incarnation;
        }
        let h = blake3::hash(format!("{}\0{}", self.name, self.created_ms).as_bytes());
        u64::from_le_bytes(h.as_bytes()[..8].try_into().unwrap_or([1; 8])) | 1
    }

    pub fn created(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.created_ms)
    }

    pub fn millis(t: SystemTime) -> u64 {
        t.duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("cannot read the bucket catalog {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the bucket catalog {path} is corrupt: {source}")]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("cannot write the bucket catalog {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

#[derive(Debug, Clone)]
pub struct Catalog {
    path: PathBuf,
}

#[derive(Serialize, Deserialize)]
struct File {
    version: u32,
    buckets: Vec<BucketRecord>,
}

impl Catalog {
    pub fn new(data_dir: &Path) -> Catalog {
        Catalog {
            path: data_dir.join("buckets.json"),
        }
    }

    /// The buckets on disk; none when there is no catalog yet.
    pub fn load(&self) -> Result<Vec<BucketRecord>, CatalogError> {
        let text = match std::fs::read(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(CatalogError::Read {
                    path: self.path.clone(),
                    source,
                })
            }
        };
        let file: File = serde_json::from_slice(&text).map_err(|source| CatalogError::Parse {
            path: self.path.clone(),
            source,
        })?;
        Ok(file.buckets)
    }

    /// Replaces the catalog with `buckets`, atomically and durably.
    pub fn save(&self, buckets: &[BucketRecord]) -> Result<(), CatalogError> {
        let err = |source| CatalogError::Write {
            path: self.path.clone(),
            source,
        };
        let tmp = self.path.with_extension("json.tmp");
        let body = serde_json::to_vec_pretty(&File {
            version: 1,
            buckets: buckets.to_vec(),
        })
        .map_err(|e| err(std::io::Error::other(e)))?;
        let mut f = std::fs::File::create(&tmp).map_err(err)?;
        f.write_all(&body).map_err(err)?;
        f.sync_all().map_err(err)?;
        std::fs::rename(&tmp, &self.path).map_err(err)?;
        if let Some(dir) = self.path.parent() {
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(err)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_corruption() {
        // Removed when the test ends (a fixed name under /tmp was left behind by every run).
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let c = Catalog::new(&dir);
        let _ = std::fs::remove_file(dir.join("buckets.json"));
        assert!(c.load().unwrap().is_empty());
        let recs = vec![BucketRecord {
            name: "b".into(),
            created_ms: 1,
            owner: "alice".into(),
            durability: Durability::Disk,
            incarnation: 7,
            quota: Some(1 << 20),
            acl: yutu_api::acl::Acl::canned(yutu_api::acl::Canned::PublicRead, "alice", "alice"),
            cors: None,
            policy: None,
            public_access_block: None,
            ownership: None,
        }];
        c.save(&recs).unwrap();
        assert_eq!(c.load().unwrap(), recs);
        std::fs::write(dir.join("buckets.json"), b"{not json").unwrap();
        assert!(matches!(c.load(), Err(CatalogError::Parse { .. })));
    }
}
