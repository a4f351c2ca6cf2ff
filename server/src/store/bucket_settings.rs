//! A bucket's settings as every shard keeps them: who owns it, what it allows beyond its
//! owner (ACL, bucket policy, public access block, object ownership), its CORS rules and its
//! quota. They are set when the bucket is created or restored and by the bucket-settings
//! calls (`node::buckets` broadcasts each change to every shard), and read by the permission
//! checks, CORS and quota admission. None of it is about the bucket's objects: the object
//! index (`store.rs`) keeps only what a write or read needs (incarnation, durability).

use std::sync::Arc;
use std::time::SystemTime;

use yutu_api::acl::Acl;
use yutu_api::bucket_policy::BucketPolicy;
use yutu_api::cors::CorsConfiguration;
use yutu_api::ownership::ObjectOwnership;
use yutu_api::public_access_block::PublicAccessBlock;

/// One bucket's settings.
#[derive(Debug, Clone)]
pub struct BucketSettings {
    pub created: SystemTime,
    pub owner: String,
    /// Most bytes of objects the bucket may hold (node- or cluster-wide); checked on the
    /// way in by the node (`node::quota`), never by the store.
    pub quota: Option<u64>,
    /// The bucket's grants beyond its owner's (`x-amz-acl`, PutBucketAcl).
    pub acl: Acl,
    /// Its CORS configuration (PutBucketCors), shared with the requests that read it.
    pub cors: Option<Arc<CorsConfiguration>>,
    /// Its bucket policy (PutBucketPolicy), parsed once, shared with the checks that read it.
    pub policy: Option<Arc<BucketPolicy>>,
    /// Its public access block (PutPublicAccessBlock).
    pub public_access_block: Option<PublicAccessBlock>,
    /// Its object ownership (PutBucketOwnershipControls).
    pub ownership: Option<ObjectOwnership>,
}

/// What a bucket adds to the permission check besides its owner and ACL.
#[derive(Debug, Clone, Default)]
pub struct BucketGuards {
    pub policy: Option<Arc<BucketPolicy>>,
    /// Its public access block (all off when none is configured).
    pub block: PublicAccessBlock,
    /// Whether one is configured (GetPublicAccessBlock answers NoSuchPublicAccessBlockConfiguration otherwise).
    pub configured_block: bool,
    /// Its object ownership, if set (`ObjectWriter` otherwise).
    pub ownership: Option<ObjectOwnership>,
}

impl BucketSettings {
    /// A new bucket's: private, no quota, nothing configured.
    pub fn new(created: SystemTime, owner: &str) -> BucketSettings {
        BucketSettings {
            created,
            owner: owner.to_string(),
            quota: None,
            acl: Acl::default(),
            cors: None,
            policy: None,
            public_access_block: None,
            ownership: None,
        }
    }

    /// Replaces (or, with `None`, deletes) the CORS configuration.
    pub fn set_cors(&mut self, cors: Option<CorsConfiguration>) {
        self.cors = cors.map(Arc::new);
    }

    /// Replaces (or, with `None`, deletes) bucket `name`'s policy. The text was validated
    /// when it was put; one that no longer parses (a catalog edited by hand) is dropped with
    /// an error in the log rather than kept half-understood.
    pub fn set_policy(&mut self, name: &str, text: Option<&str>) {
        self.policy = text.and_then(|t| match BucketPolicy::parse(t, name) {
            Ok(p) => Some(Arc::new(p)),
            Err(e) => {
                tracing::error!(bucket = name, error = %e, "the bucket's stored policy does not parse: ignored");
                None
            }
        });
    }

    /// The policy, public access block and object ownership.
    pub fn guards(&self) -> BucketGuards {
        BucketGuards {
            policy: self.policy.clone(),
            block: self.public_access_block.unwrap_or_default(),
            configured_block: self.public_access_block.is_some(),
            ownership: self.ownership,
        }
    }
}
