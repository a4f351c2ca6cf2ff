//! Bucket creation and deletion, serialised through shard 0 (the bucket coordinator), which
//! records them in the catalog and broadcasts them to every shard; every shard keeps a full
//! copy of the bucket list so that HeadBucket and ListBuckets are answered locally.

use std::rc::Rc;
use std::time::SystemTime;

use super::catalog::{BucketRecord, Catalog};
use super::shard::{Shard, ShardError};
use crate::model::Durability;
use yutu_api::acl::Acl;
use yutu_api::cors::CorsConfiguration;
use yutu_api::ownership::ObjectOwnership;
use yutu_api::public_access_block::PublicAccessBlock;

/// The shard that coordinates bucket changes.
const COORDINATOR: usize = 0;

/// Why a bucket-level operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BucketError {
    #[error("the bucket already exists and is yours")]
    AlreadyOwned,
    #[error("the bucket already exists and belongs to another user")]
    AlreadyExists,
    #[error("the bucket does not exist")]
    NoSuchBucket,
    #[error("the bucket is not empty")]
    NotEmpty,
    #[error("another operation on the bucket is in progress")]
    Conflict,
    #[error(transparent)]
    Shard(#[from] ShardError),
    #[error("{0}")]
    Catalog(String),
}

/// What a new bucket is made with.
#[derive(Debug, Clone, Default)]
pub struct NewBucket {
    pub name: String,
    pub owner: String,
    pub durability: Durability,
    /// Most bytes of objects it may hold (see [`super::quota`]).
    pub quota: Option<u64>,
    pub acl: Acl,
    pub ownership: Option<ObjectOwnership>,
}

/// Creates a bucket on every shard, once the catalog has it on disk.
pub async fn create(shard: &Rc<Shard>, new: NewBucket) -> Result<(), BucketError> {
    shard
        .run_async(COORDINATOR, move |s| coordinate_create(s, new))
        .await?
}

/// A change of one of the bucket settings that can change after creation.
#[derive(Debug, Clone, PartialEq)]
pub enum BucketChange {
    Acl(Acl),
    /// `None`: the configuration is deleted.
    Cors(Option<CorsConfiguration>),
    /// The policy's text (validated by the caller); `None`: deleted.
    Policy(Option<String>),
    /// `None`: deleted.
    PublicAccessBlock(Option<PublicAccessBlock>),
    /// `None`: deleted (the bucket behaves as `ObjectWriter`).
    Ownership(Option<ObjectOwnership>),
}

impl BucketChange {
    /// Applies the change to a catalog record; whether it changed anything.
    fn apply(&self, r: &mut BucketRecord) -> bool {
        match self {
            BucketChange::Acl(acl) if r.acl != *acl => r.acl = acl.clone(),
            BucketChange::Cors(cors) if r.cors != *cors => r.cors = cors.clone(),
            BucketChange::Policy(p) if r.policy != *p => r.policy = p.clone(),
            BucketChange::PublicAccessBlock(b) if r.public_access_block != *b => {
                r.public_access_block = *b
            }
            BucketChange::Ownership(o) if r.ownership != *o => r.ownership = *o,
            _ => return false,
        }
        true
    }

    fn apply_to_store(&self, s: &Shard, name: &str) {
        s.tier.update_bucket(name, |settings| match self {
            BucketChange::Acl(acl) => settings.acl = acl.clone(),
            BucketChange::Cors(cors) => settings.set_cors(cors.clone()),
            BucketChange::Policy(p) => settings.set_policy(name, p.as_deref()),
            BucketChange::PublicAccessBlock(b) => settings.public_access_block = *b,
            BucketChange::Ownership(o) => settings.ownership = *o,
        })
    }
}

/// Changes a bucket setting on every shard, once the catalog has it on disk.
pub async fn change(
    shard: &Rc<Shard>,
    name: String,
    change: BucketChange,
) -> Result<(), BucketError> {
    shard
        .run_async(COORDINATOR, move |s| coordinate_change(s, name, change))
        .await?
}

async fn coordinate_change(
    shard: Rc<Shard>,
    name: String,
    change: BucketChange,
) -> Result<(), BucketError> {
    let _permit = shard.bucket_lock.acquire_permit(1).await;
    let mut records = catalog_with(&shard, None, None);
    let Some(record) = records.iter_mut().find(|r| r.name == name) else {
        return Err(BucketError::NoSuchBucket);
    };
    if !change.apply(record) {
        return Ok(());
    }
    save(&shard, records).await?;
    shard
        .broadcast(move |s| change.apply_to_store(s, &name))
        .await?;
    Ok(())
}

/// Deletes an empty bucket from every shard and the catalog.
pub async fn delete(shard: &Rc<Shard>, name: String) -> Result<(), BucketError> {
    shard
        .run_async(COORDINATOR, move |s| coordinate_delete(s, name))
        .await?
}

/// The catalog as it will be with `add` added and `remove` removed (the coordinator knows
/// every bucket).
fn catalog_with(
    shard: &Shard,
    add: Option<BucketRecord>,
    remove: Option<&str>,
) -> Vec<BucketRecord> {
    let mut records: Vec<BucketRecord> = shard
        .tier
        .buckets()
        .into_iter()
        .filter(|b| Some(b.name.as_str()) != remove)
        .map(|b| BucketRecord {
            created_ms: BucketRecord::millis(b.created),
            name: b.name,
            owner: b.owner,
            durability: b.durability,
            incarnation: b.incarnation,
            quota: b.quota,
            acl: b.acl,
            cors: b.cors.map(|c| (*c).clone()),
            policy: b.policy.map(|p| p.text().to_string()),
            public_access_block: b.public_access_block,
            ownership: b.ownership,
        })
        .collect();
    records.extend(add);
    records
}

/// Writes the catalog on a blocking thread: an fsync must not stall the shard's event loop.
async fn save(shard: &Shard, records: Vec<BucketRecord>) -> Result<(), BucketError> {
    let catalog = Catalog::new(&shard.settings.data_dir);
    glommio::executor()
        .spawn_blocking(move || catalog.save(&records))
        .await
        .map_err(|e| BucketError::Catalog(e.to_string()))
}

/// A new incarnation number: random, never 0.
fn new_incarnation() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    if let Ok(t) = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    h.finish() | 1
}

async fn coordinate_create(shard: Rc<Shard>, new: NewBucket) -> Result<(), BucketError> {
    let NewBucket {
        name,
        owner,
        durability,
        quota,
        acl,
        ownership,
    } = new;
    let _permit = shard.bucket_lock.acquire_permit(1).await;
    if let Some(current) = shard.tier.bucket_owner(&name) {
        return Err(if current == owner {
            BucketError::AlreadyOwned
        } else {
            BucketError::AlreadyExists
        });
    }
    let created = SystemTime::now();
    let incarnation = new_incarnation();
    // The catalog is written first: a bucket is never acknowledged that a restart loses.
    let record = BucketRecord {
        name: name.clone(),
        created_ms: BucketRecord::millis(created),
        owner: owner.clone(),
        durability,
        incarnation,
        quota,
        acl: acl.clone(),
        cors: None,
        policy: None,
        public_access_block: None,
        ownership,
    };
    save(&shard, catalog_with(&shard, Some(record), None)).await?;
    let n = name.clone();
    shard
        .broadcast(move |s| {
            s.tier
                .add_bucket(&n, created, &owner, durability, incarnation, |settings| {
                    settings.quota = quota;
                    settings.acl = acl.clone();
                    settings.ownership = ownership;
                });
        })
        .await?;
    tracing::info!(bucket = %name, "bucket created");
    Ok(())
}

/// Two-phase delete: every shard closes the bucket to writes and reports whether it is
/// empty; only if all are empty is the delete committed, otherwise it is rolled back.
async fn coordinate_delete(shard: Rc<Shard>, name: String) -> Result<(), BucketError> {
    let _permit = shard.bucket_lock.acquire_permit(1).await;
    if !shard.tier.bucket_known(&name) {
        return Err(BucketError::NoSuchBucket);
    }
    let n = name.clone();
    let answers = shard.broadcast(move |s| s.tier.close_bucket(&n)).await?;
    let empty = answers.iter().all(|a| matches!(a, Ok(true)));
    let n = name.clone();
    shard
        .broadcast(move |s| s.tier.finish_close(&n, empty))
        .await?;
    if !empty {
        return Err(BucketError::NotEmpty);
    }
    if let Err(e) = save(&shard, catalog_with(&shard, None, Some(&name))).await {
        // The bucket is gone from memory; it would come back (empty) after a restart.
        tracing::error!(bucket = %name, error = %e, "cannot record the bucket deletion");
    }
    tracing::info!(bucket = %name, "bucket deleted");
    Ok(())
}
