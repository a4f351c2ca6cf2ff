//! Bucket policies and public access blocks: parsing a policy never panics; a parsed policy
//! keeps its text exactly, is within the size limit, has statements, and parses again to
//! the same policy; evaluating requests made of the input never panics, and a decision
//! always has a statement of its effect behind it; a request for every object at once is
//! denied whenever one object's request is, and allowed only when each object's is; a
//! public policy has an Allow statement.
//! A public access block or policy status that parses writes out as XML that parses back to
//! the same settings.
#![no_main]

use libfuzzer_sys::fuzz_target;
use yutu_api::acl::Principal;
use yutu_api::bucket_policy::{
    actions, bucket_arn, object_arn, BucketPolicy, Context, Decision, Effect, Request,
    MAX_POLICY_LEN,
};
use yutu_api::public_access_block::{PolicyStatus, PublicAccessBlock};

const BUCKET: &str = "fuzz-bucket";

fn exercise(policy: &BucketPolicy, text: &str, context: &Context) {
    assert_eq!(policy.text(), text);
    assert!(text.len() <= MAX_POLICY_LEN);
    assert!(!policy.statements().is_empty());
    match BucketPolicy::parse(text, BUCKET) {
        Ok(again) => assert_eq!(&again, policy, "{text}"),
        Err(e) => panic!("{text} parsed once, then not: {e}"),
    }

    let has = |effect: Effect| policy.statements().iter().any(|s| s.effect == effect);
    if policy.is_public() {
        assert!(has(Effect::Allow), "public without an Allow: {text}");
    }

    // Requests of the input's own words as well as the usual names.
    let words: Vec<&str> = text
        .split(|c: char| c == '"' || c.is_whitespace())
        .filter(|w| !w.is_empty())
        .take(8)
        .collect();
    let principals = [
        Principal::Anonymous,
        Principal::Authenticated,
        Principal::User("alice"),
        Principal::User(words.first().copied().unwrap_or("")),
    ];
    let mut resources = vec![bucket_arn(BUCKET), object_arn(BUCKET, "a/b.txt")];
    resources.extend(words.iter().map(|w| object_arn(BUCKET, w)));
    resources.extend(words.iter().map(|w| w.to_string()));
    let mut names = vec![actions::GET_OBJECT, actions::LIST_BUCKET, "s3:PutObject"];
    names.extend(words.iter().copied());
    // Object keys the every-object evaluation must agree with.
    let mut keys = vec!["a/b.txt"];
    keys.extend(words.iter().copied());
    let every_prefix = object_arn(BUCKET, "");
    for principal in principals {
        for action in &names {
            // A request for every object at once (a KV call): denied when any key's own
            // request is, and allowed only when every key's is.
            let every = policy.evaluate_every_object(&Request {
                principal,
                action,
                resource: &every_prefix,
                context,
            });
            for key in &keys {
                let one = policy.evaluate(&Request {
                    principal,
                    action,
                    resource: &object_arn(BUCKET, key),
                    context,
                });
                if one == Decision::ExplicitDeny {
                    assert_eq!(every, Decision::ExplicitDeny, "{key}: {text}");
                }
                if every == Decision::Allow {
                    assert_eq!(one, Decision::Allow, "{key}: {text}");
                }
            }
            for resource in &resources {
                let decision = policy.evaluate(&Request {
                    principal,
                    action,
                    resource,
                    context,
                });
                match decision {
                    Decision::ExplicitDeny => assert!(has(Effect::Deny), "{text}"),
                    Decision::Allow => assert!(has(Effect::Allow), "{text}"),
                    Decision::NotApplicable => {}
                }
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);

    // A condition context of the input's lines, `key=value`.
    let mut context = Context::new();
    for line in text.lines().take(32) {
        let (key, value) = line.split_once('=').unwrap_or((line, ""));
        context.insert(key, value);
    }
    context.insert("aws:SourceIp", "10.1.2.3");
    context.insert("aws:SecureTransport", "true");
    context.insert("aws:CurrentTime", "2024-06-01T12:00:00Z");
    context.insert("aws:username", "alice");

    if let Ok(policy) = BucketPolicy::parse(&text, BUCKET) {
        exercise(&policy, &text, &context);
    }

    if let Ok(block) = PublicAccessBlock::parse(&text) {
        match PublicAccessBlock::parse(&block.to_xml()) {
            Ok(again) => assert_eq!(again, block),
            Err(e) => panic!("{block:?} does not read back: {e}"),
        }
    }
    if let Ok(status) = PolicyStatus::parse(&text) {
        assert_eq!(PolicyStatus::parse(&status.to_xml()), Ok(status));
    }
});
