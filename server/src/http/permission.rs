//! What the bucket policy and the public access block say about a request: the policy action
//! an operation is evaluated as ([`action_name`]), the policy's decision ([`decide`]), and the
//! ACL the permission check weighs ([`effective_acl`]). Below the request context (`ctx.rs`),
//! which weighs them with ownership, grants and token scopes; the handlers that change a
//! bucket's policy or public access block are `bucket_policy.rs`.

use yutu_api::acl::{Acl, Grantee, Permission, Principal};
use yutu_api::bucket_policy::{actions, bucket_arn, object_arn, Context, Decision, Request};

use crate::auth::{Action, Identity};
use crate::http::endpoint::Op;
use crate::store::bucket_settings::BucketGuards;

/// The policy action a request is evaluated as: its operation's, or (for calls outside the
/// S3 operations: KV, Mooncake's queries, a copy's source) its permission's.
pub fn action_name(op: Op, action: Action) -> &'static str {
    use actions::*;
    super::endpoint::policy_action(op).unwrap_or(match action {
        Action::Read => GET_OBJECT,
        Action::List => LIST_BUCKET,
        Action::Write => PUT_OBJECT,
        Action::Delete => DELETE_OBJECT,
        Action::ReadAcl => GET_OBJECT_ACL,
        Action::WriteAcl => PUT_OBJECT_ACL,
        Action::Configure => PUT_BUCKET_CORS,
        Action::CreateBucket => CREATE_BUCKET,
        Action::DeleteBucket => DELETE_BUCKET,
        Action::ListBuckets => LIST_ALL_MY_BUCKETS,
    })
}

/// Whether an operation manages the policy itself: the bucket's owner may always do it, even
/// where the policy denies it, so no policy can lock its owner out for good (as AWS keeps
/// these open to the account's root).
fn manages_policy(op: Op) -> bool {
    matches!(
        op,
        Op::GetBucketPolicy | Op::PutBucketPolicy | Op::DeleteBucketPolicy
    )
}

/// What a policy check is about: who asks for which operation on which resource.
pub struct Asked<'a> {
    /// The request's identity, or a form's signer.
    pub who: &'a Identity,
    pub op: Op,
    pub action: Action,
    pub bucket: &'a str,
    /// The object (`None`: the bucket itself).
    pub key: Option<&'a str>,
    /// Stands for the request's `s3:prefix` (a read of a missing key asks whether the caller
    /// may list it).
    pub prefix: Option<&'a str>,
}

/// What the bucket's policy says about a request (`owner`: the bucket's). `context` gives
/// the request's condition values (see `Ctx::policy_context`), built only when the bucket
/// has a policy.
pub fn decide(
    asked: &Asked,
    owner: Option<&str>,
    guards: &BucketGuards,
    context: impl FnOnce(Option<&str>) -> Context,
) -> Decision {
    let Some(policy) = &guards.policy else {
        return Decision::NotApplicable;
    };
    let Asked {
        who,
        op,
        action,
        bucket,
        key,
        prefix,
    } = *asked;
    let is_owner = owner.is_some_and(|o| !o.is_empty() && who.name() == o);
    if (is_owner || who.is_admin()) && manages_policy(op) {
        return Decision::NotApplicable;
    }
    // A KV call (or a Mooncake query) names its keys in its body and stands for every key
    // of the bucket (`Ctx::policy_key`): it is weighed against every object at once, so that
    // a `Deny` of one prefix refuses it and only an `Allow` of all objects admits it. What
    // it asks of the bucket itself (listing, for a presence table) is weighed on the bucket,
    // as `ListObjects` is.
    let kv = matches!(op, Op::Kv | Op::MooncakeMaster);
    let every_object = kv && key.is_some() && action != Action::List;
    let resource = match key {
        _ if every_object => object_arn(bucket, ""),
        _ if kv => bucket_arn(bucket),
        Some(k) => object_arn(bucket, k),
        None => bucket_arn(bucket),
    };
    let context = context(prefix);
    let request = Request {
        principal: who.principal(),
        action: action_name(op, action),
        resource: &resource,
        context: &context,
    };
    let decision = if every_object {
        policy.evaluate_every_object(&request)
    } else {
        policy.evaluate(&request)
    };
    if decision == Decision::Allow
        && guards.block.restrict_public_buckets
        && !is_owner
        && matches!(who, Identity::Anonymous)
        && policy.is_public()
    {
        return Decision::NotApplicable;
    }
    decision
}

/// Whether an ACL grants anything to everyone or to every authenticated caller.
pub fn acl_is_public(acl: &Acl) -> bool {
    [
        Permission::Read,
        Permission::Write,
        Permission::ReadAcp,
        Permission::WriteAcp,
    ]
    .into_iter()
    .any(|p| acl.allows(Principal::Anonymous, p) || acl.allows(Principal::Authenticated, p))
}

/// `IgnorePublicAcls`: the ACL without its grants to everyone and to every authenticated
/// caller.
pub fn without_public(acl: &Acl) -> Acl {
    Acl {
        grants: acl
            .grants
            .iter()
            .filter(|g| matches!(g.grantee, Grantee::User(_)))
            .cloned()
            .collect(),
        exact: acl.exact,
    }
}

/// The ACL the permission check weighs: the bucket's or object's own, without its public
/// grants when the bucket's public access block ignores them.
pub fn effective_acl<'a>(
    acl: Option<&'a Acl>,
    guards: &BucketGuards,
) -> Option<std::borrow::Cow<'a, Acl>> {
    acl.map(|a| {
        if guards.block.ignore_public_acls {
            std::borrow::Cow::Owned(without_public(a))
        } else {
            std::borrow::Cow::Borrowed(a)
        }
    })
}
