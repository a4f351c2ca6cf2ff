//! Buckets of a cluster: created and deleted in etcd (one transaction each, so two nodes
//! creating the same name cannot both win), then mirrored into every node's local bucket list.

use std::collections::BTreeMap;
use std::rc::Rc;

use yutu_api::cluster::{bucket_key, BucketConfig};

use super::etcd::{Etcd, EtcdError};
use super::Cluster;
use crate::model::Durability;
use crate::node::buckets::BucketChange;
use crate::node::{buckets, BucketError, Shard};

#[derive(Debug, thiserror::Error)]
pub enum ClusterBucketError {
    #[error(transparent)]
    Local(#[from] BucketError),
    #[error("the cluster's bucket configuration cannot be changed now: {0}")]
    Etcd(#[from] EtcdError),
}

/// Creates a bucket cluster-wide: in etcd first (the one transaction that decides who wins
/// the name), then on this node; the other nodes create it when they read it (or on first
/// use, [`ensure`]). `config` is the bucket's settings (its creation time is set here).
pub async fn create(
    shard: &Rc<Shard>,
    cluster: &Cluster,
    name: &str,
    mut config: BucketConfig,
) -> Result<(), ClusterBucketError> {
    config.created_ms = yutu_api::token::unix_now() * 1000;
    let owner = config.owner.clone();
    let durability = Durability::parse(&config.durability).unwrap_or_default();
    let key = bucket_key(&cluster.settings.name, name);
    let mut etcd = Etcd::new(&cluster.settings.etcd);
    let value = serde_json::to_vec(&config).unwrap_or_default();
    if !etcd.create(&key, &value).await? {
        let existing = etcd
            .get(&key)
            .await?
            .and_then(|v| serde_json::from_slice::<BucketConfig>(&v).ok());
        return Err(match existing {
            Some(c) if c.owner == owner => BucketError::AlreadyOwned.into(),
            _ => BucketError::AlreadyExists.into(),
        });
    }
    cluster.mark_mirrored(name);
    match buckets::create(shard, new_bucket(name, &owner, durability, &config)).await {
        Ok(()) | Err(BucketError::AlreadyOwned) => {}
        Err(e) => return Err(e.into()),
    }
    cluster.learn_bucket(name, config);
    Ok(())
}

/// Changes a bucket setting (its ACL, its CORS configuration) cluster-wide: in its etcd
/// record (compare-and-swap, so a concurrent change or delete is never overwritten), then
/// here; the others apply it when they read it.
pub async fn change(
    shard: &Rc<Shard>,
    cluster: &Cluster,
    name: &str,
    change: BucketChange,
) -> Result<(), ClusterBucketError> {
    let key = bucket_key(&cluster.settings.name, name);
    let mut etcd = Etcd::new(&cluster.settings.etcd);
    let mut config = None;
    for _ in 0..8 {
        let Some(raw) = etcd.get(&key).await? else {
            return Err(BucketError::NoSuchBucket.into());
        };
        let Ok(mut c) = serde_json::from_slice::<BucketConfig>(&raw) else {
            let e = BucketError::Catalog("the bucket's etcd record cannot be read".into());
            return Err(e.into());
        };
        match &change {
            BucketChange::Acl(acl) => c.acl = acl.clone(),
            BucketChange::Cors(cors) => c.cors = cors.clone(),
            BucketChange::Policy(p) => c.policy = p.clone(),
            BucketChange::PublicAccessBlock(b) => c.public_access_block = *b,
            BucketChange::Ownership(o) => c.ownership = *o,
        }
        let new = serde_json::to_vec(&c).unwrap_or_default();
        if etcd.replace(&key, &raw, &new).await? {
            config = Some(c);
            break;
        }
    }
    let Some(config) = config else {
        return Err(BucketError::Conflict.into());
    };
    buckets::change(shard, name.to_string(), change).await?;
    cluster.learn_bucket(name, config);
    Ok(())
}

/// Deletes a bucket cluster-wide once the caller has checked that no node holds an object of
/// it: from etcd, then here; the others drop it when they read the change.
pub async fn delete(
    shard: &Rc<Shard>,
    cluster: &Cluster,
    name: &str,
) -> Result<(), ClusterBucketError> {
    let mut etcd = Etcd::new(&cluster.settings.etcd);
    if !etcd
        .delete(&bucket_key(&cluster.settings.name, name))
        .await?
    {
        return Err(BucketError::NoSuchBucket.into());
    }
    cluster.forget_bucket(name);
    match buckets::delete(shard, name.to_string()).await {
        Ok(()) | Err(BucketError::NoSuchBucket) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Makes a bucket etcd has, and this node does not know yet, known here: a request can reach
/// a node before its next poll. Whether the bucket exists in the cluster.
pub async fn ensure(shard: &Rc<Shard>, cluster: &Cluster, name: &str) -> Result<bool, EtcdError> {
    let mut etcd = Etcd::new(&cluster.settings.etcd);
    let Some(raw) = etcd.get(&bucket_key(&cluster.settings.name, name)).await? else {
        return Ok(false);
    };
    let Ok(config) = serde_json::from_slice::<BucketConfig>(&raw) else {
        return Ok(false);
    };
    create_local(shard, cluster, name, &config).await;
    cluster.learn_bucket(name, config);
    Ok(true)
}

/// The local bucket a cluster bucket's configuration makes.
fn new_bucket(
    name: &str,
    owner: &str,
    durability: Durability,
    config: &BucketConfig,
) -> buckets::NewBucket {
    buckets::NewBucket {
        name: name.to_string(),
        owner: owner.to_string(),
        durability,
        quota: config.quota,
        acl: config.acl.clone(),
        ownership: config.ownership,
    }
}

async fn create_local(shard: &Rc<Shard>, cluster: &Cluster, name: &str, config: &BucketConfig) {
    cluster.mark_mirrored(name);
    let durability = Durability::parse(&config.durability).unwrap_or_default();
    let created = buckets::create(shard, new_bucket(name, &config.owner, durability, config));
    match created.await {
        Ok(()) => tracing::info!(bucket = %name, "bucket created (cluster)"),
        Err(BucketError::AlreadyOwned) => {}
        Err(e) => tracing::warn!(bucket = %name, error = %e, "cannot create a cluster bucket here"),
    }
}

/// Brings the local bucket list in line with etcd's: creates what appeared, deletes what
/// disappeared (only buckets this node mirrored from etcd, so a node's own local buckets
/// from before it joined stay).
pub async fn apply(shard: &Rc<Shard>, cluster: &Cluster, now: &BTreeMap<String, BucketConfig>) {
    for (name, config) in now {
        let local = shard.tier.bucket_info(name);
        let Some(local) = local else {
            create_local(shard, cluster, name, config).await;
            continue;
        };
        cluster.mark_mirrored(name);
        // Settings changed through another node (PutBucketAcl, PutBucketCors).
        let mut changes = Vec::new();
        if local.acl != config.acl {
            changes.push(BucketChange::Acl(config.acl.clone()));
        }
        if local.cors.as_deref() != config.cors.as_ref() {
            changes.push(BucketChange::Cors(config.cors.clone()));
        }
        if local.policy.as_ref().map(|p| p.text()) != config.policy.as_deref() {
            changes.push(BucketChange::Policy(config.policy.clone()));
        }
        if local.public_access_block != config.public_access_block {
            changes.push(BucketChange::PublicAccessBlock(config.public_access_block));
        }
        if local.ownership != config.ownership {
            changes.push(BucketChange::Ownership(config.ownership));
        }
        for c in changes {
            if let Err(e) = buckets::change(shard, name.clone(), c).await {
                tracing::warn!(bucket = %name, error = %e, "cannot apply a bucket's new settings");
            }
        }
    }
    for name in cluster.take_vanished(now) {
        match buckets::delete(shard, name.clone()).await {
            Ok(()) => tracing::info!(bucket = %name, "bucket deleted (cluster)"),
            Err(BucketError::NoSuchBucket) => {}
            Err(e) => {
                tracing::warn!(bucket = %name, error = %e, "cannot delete a cluster bucket here")
            }
        }
    }
}
