//! The S3 API's handlers, one file per resource or operation family.

pub mod acl;
pub mod attributes;
pub mod bucket_policy;
pub mod buckets;
pub mod copy;
pub mod cors;
pub mod delete_many;
pub mod meta;
pub mod multipart;
pub mod objects;
pub mod ownership;
pub mod payload;
pub mod post_object;
