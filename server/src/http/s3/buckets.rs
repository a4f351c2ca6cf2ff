//! Bucket operations: ListBuckets, CreateBucket, DeleteBucket, HeadBucket, GetBucketLocation,
//! ListObjects (v1) and ListObjectsV2.

use bytes::Bytes;
use http::{header, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use yutu_api::bucket::{DURABILITY_HEADER, QUOTA_HEADER, USAGE_HEADER};
use yutu_api::ownership::{ObjectOwnership, OWNERSHIP_HEADER};
use yutu_api::xml::{
    to_xml, BucketEntry, Buckets, CommonPrefix, ListAllMyBucketsResult, ListBucketResult,
    ListVersionsResult, ObjectEntry, Owner, VersionEntry, S3_NS,
};
use yutu_api::{parse_size, validate_bucket_name, S3ErrorCode};

use crate::auth::can_see;
use crate::http::common::{bucket_error, empty, unavailable};
use crate::http::ctx::Ctx;
use crate::http::error::S3Error;
use crate::http::peer::forward;
use crate::http::target::Target;
use crate::http::{body, xml_response, Resp};
use crate::model::listing::{merge, ListItem, ListQuery};
use crate::model::Durability;
use crate::node::buckets;

/// Most keys one listing page returns, and the default (S3's).
pub const MAX_KEYS: usize = 1000;

/// An owner as listings show it: a user or token subject by name (S3's canonical id), or
/// `yutu` for what an open node (`--no-auth`) holds.
pub fn owner(name: &str) -> Owner {
    let name = if name.is_empty() { "yutu" } else { name };
    Owner {
        id: name.into(),
        display_name: name.into(),
    }
}

/// The owner of `bucket` as listings show it.
fn bucket_owner(ctx: &Ctx, bucket: &str) -> Owner {
    owner(&ctx.shard.tier.bucket_owner(bucket).unwrap_or_default())
}

/// Most buckets one ListBuckets page holds (`max-buckets`, S3's bound).
const MAX_BUCKETS: usize = 10_000;

/// ListBuckets: the buckets the caller may see, by name, from `continuation-token` (the hex of
/// the last name of the previous page) and under `prefix`, at most `max-buckets` of them.
pub fn list_buckets(ctx: &Ctx) -> Result<Resp, S3Error> {
    let t = &ctx.target;
    let bad = |m: &str| S3Error::new(S3ErrorCode::InvalidArgument).msg(m.to_string());
    let max = match t.param("max-buckets") {
        None => MAX_BUCKETS,
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_BUCKETS).contains(n))
            .ok_or_else(|| bad("max-buckets must be a number from 1 to 10000."))?,
    };
    let after = match t.param("continuation-token") {
        None => None,
        Some(tok) => Some(
            hex::decode(tok)
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .ok_or_else(|| bad("The continuation token is not one this node gave."))?,
        ),
    };
    let prefix = t.param("prefix").map(str::to_string);
    let mut visible: Vec<_> = ctx
        .shard
        .tier
        .buckets()
        .into_iter()
        .filter(|b| can_see(ctx.identity(), &b.name, &b.owner))
        .filter(|b| prefix.as_deref().is_none_or(|p| b.name.starts_with(p)))
        .filter(|b| after.as_deref().is_none_or(|a| b.name.as_str() > a))
        .collect();
    visible.sort_by(|a, b| a.name.cmp(&b.name));
    let more = visible.len() > max;
    visible.truncate(max);
    let continuation_token = more
        .then(|| visible.last().map(|b| hex::encode(b.name.as_bytes())))
        .flatten();
    let bucket = visible
        .into_iter()
        .map(|b| BucketEntry {
            name: b.name,
            creation_date: humantime::format_rfc3339_millis(b.created).to_string(),
        })
        .collect();
    let doc = ListAllMyBucketsResult {
        xmlns: S3_NS,
        owner: owner(&ctx.identity().name()),
        buckets: Buckets { bucket },
        continuation_token,
        prefix,
    };
    Ok(xml_response(
        StatusCode::OK,
        to_xml("ListAllMyBucketsResult", &doc),
    ))
}

pub async fn create(ctx: &Ctx, body_in: Incoming, bucket: &str) -> Result<Resp, S3Error> {
    let shard = &ctx.shard;
    validate_bucket_name(bucket)
        .map_err(|e| S3Error::new(S3ErrorCode::InvalidBucketName).msg(format!("{e}.")))?;
    // The optional CreateBucketConfiguration names a region; a single-region store accepts
    // any and ignores it, but still reads it (bounded) so the connection stays usable.
    body::read_limited(ctx, body_in, 64 * 1024).await?;
    let durability = match ctx.header(DURABILITY_HEADER) {
        None => shard.settings.durability,
        Some(d) => Durability::parse(d).ok_or_else(|| {
            S3Error::new(S3ErrorCode::InvalidArgument)
                .msg("x-yutu-durability must be memory or disk.")
        })?,
    };
    let replicas = match ctx.header(yutu_api::cluster::REPLICAS_HEADER) {
        None => None,
        Some(r) => Some(
            r.trim()
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=yutu_api::cluster::MAX_REPLICAS).contains(n))
                .ok_or_else(|| {
                    S3Error::new(S3ErrorCode::InvalidArgument).msg(format!(
                        "{} must be a number from 1 to {}.",
                        yutu_api::cluster::REPLICAS_HEADER,
                        yutu_api::cluster::MAX_REPLICAS
                    ))
                })?,
        ),
    };
    let quota = match ctx.header(QUOTA_HEADER) {
        None => None,
        Some(q) => Some(
            parse_size(q.trim())
                .ok()
                .filter(|q| *q > 0)
                .ok_or_else(|| {
                    S3Error::new(S3ErrorCode::InvalidArgument).msg(format!(
                        "{QUOTA_HEADER} must be a size above zero, such as 10GiB or 1048576."
                    ))
                })?,
        ),
    };
    let name = bucket.to_string();
    let owner = ctx.identity().name().to_string();
    let acl = super::acl::requested(ctx, &owner, &owner)?.unwrap_or_default();
    let ownership = ctx
        .header(OWNERSHIP_HEADER)
        .map(ObjectOwnership::parse)
        .transpose()
        .map_err(|e| S3Error::new(S3ErrorCode::InvalidArgument).msg(e.to_string()))?;
    if ownership == Some(ObjectOwnership::BucketOwnerEnforced) && !acl.is_empty() {
        return Err(S3Error::new(
            S3ErrorCode::InvalidBucketAclWithObjectOwnership,
        ));
    }
    match &ctx.cluster {
        Some(cluster) => {
            let replicas = replicas.unwrap_or(cluster.settings.replicas);
            let config = yutu_api::cluster::BucketConfig {
                owner,
                durability: durability.as_str().to_string(),
                replicas,
                created_ms: 0,
                quota,
                acl,
                cors: None,
                policy: None,
                public_access_block: None,
                ownership,
            };
            let created = crate::cluster::buckets::create(shard, cluster, &name, config);
            match created.await {
                Err(crate::cluster::buckets::ClusterBucketError::Local(
                    crate::node::BucketError::AlreadyOwned,
                )) if !shard.settings.bucket_exists_conflict => {}
                r => r.map_err(crate::http::common::bucket_error)?,
            }
        }
        None if replicas.is_some_and(|n| n > 1) => {
            return Err(S3Error::new(S3ErrorCode::InvalidArgument)
                .msg("More than one replica needs a cluster (start the node with --etcd)."))
        }
        None => match buckets::create(
            shard,
            buckets::NewBucket {
                name,
                owner,
                durability,
                quota,
                acl,
                ownership,
            },
        )
        .await
        {
            // us-east-1's answer: creating a bucket you already own succeeds.
            Err(buckets::BucketError::AlreadyOwned) if !shard.settings.bucket_exists_conflict => {}
            r => r?,
        },
    }
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(header::LOCATION, format!("/{bucket}"))
        .body(Full::new(Bytes::new()))
        .unwrap_or_default())
}

pub async fn delete(ctx: &Ctx, bucket: &str) -> Result<Resp, S3Error> {
    let shard = &ctx.shard;
    let name = bucket.to_string();
    buckets::delete(shard, name).await?;
    Ok(Response::builder()
        .status(StatusCode::NO_CONTENT)
        .body(Full::new(Bytes::new()))
        .unwrap_or_default())
}

/// HeadBucket, with Yutu's settings of the bucket and the bytes it holds (as this node knows
/// them: other shards' and nodes' figures are up to a second old).
pub fn head(ctx: &Ctx, bucket: &str) -> Result<Resp, S3Error> {
    let shard = &ctx.shard;
    let Some(info) = shard
        .tier
        .bucket_info(bucket)
        .filter(|_| shard.tier.bucket_exists(bucket))
    else {
        return Err(S3Error::new(S3ErrorCode::NoSuchBucket));
    };
    let mut resp = Response::builder()
        .status(StatusCode::OK)
        .header("x-amz-bucket-region", "us-east-1")
        .header(DURABILITY_HEADER, info.durability.as_str())
        .header(USAGE_HEADER, shard.usage.used(bucket).to_string());
    if let Some(q) = info.quota {
        resp = resp.header(QUOTA_HEADER, q.to_string());
    }
    Ok(resp.body(Full::new(Bytes::new())).unwrap_or_default())
}

pub fn location(ctx: &Ctx, bucket: &str) -> Result<Resp, S3Error> {
    let shard = &ctx.shard;
    if !shard.tier.bucket_exists(bucket) {
        return Err(S3Error::new(S3ErrorCode::NoSuchBucket));
    }
    let xml = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<LocationConstraint xmlns=\"{S3_NS}\"/>"
    );
    Ok(xml_response(StatusCode::OK, xml))
}

/// Characters S3 leaves unencoded with `encoding-type=url`.
const URL_SAFE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'/');

fn invalid(msg: &str) -> S3Error {
    S3Error::new(S3ErrorCode::InvalidArgument).msg(msg)
}

/// The parameters every listing flavour shares.
struct ListParams {
    max_keys: usize,
    url_encode: bool,
    prefix: String,
    delimiter: Option<String>,
}

fn list_params(t: &Target) -> Result<ListParams, S3Error> {
    Ok(ListParams {
        max_keys: match t.param("max-keys") {
            None => MAX_KEYS,
            Some(s) => s
                .parse::<usize>()
                .map_err(|_| invalid("max-keys must be a non-negative integer."))?
                .min(MAX_KEYS),
        },
        url_encode: match t.param("encoding-type") {
            None => false,
            Some("url") => true,
            Some(_) => return Err(invalid("Invalid Encoding Method specified in Request")),
        },
        prefix: t.param("prefix").unwrap_or("").to_string(),
        delimiter: t
            .param("delimiter")
            .filter(|d| !d.is_empty())
            .map(str::to_string),
    })
}

/// One page of a bucket's entries after `after`, merged across shards (and, for a cluster
/// bucket, across the members: every node holds part of it).
async fn page(
    ctx: &Ctx,
    bucket: &str,
    p: &ListParams,
    after: Option<String>,
) -> Result<(Vec<ListItem>, bool), S3Error> {
    let shard = &ctx.shard;
    if !shard.tier.bucket_exists(bucket) {
        return Err(S3Error::new(S3ErrorCode::NoSuchBucket));
    }
    if p.max_keys == 0 {
        return Ok((Vec::new(), false));
    }
    let query = ListQuery {
        prefix: p.prefix.clone(),
        delimiter: p.delimiter.clone(),
        after,
        limit: p.max_keys,
    };
    let remote = match (&ctx.cluster, &ctx.peer) {
        (Some(cluster), None) if cluster.view().buckets.contains_key(bucket) => {
            crate::http::peer::cluster::member_pages(cluster, bucket, &query).await
        }
        _ => Vec::new(),
    };
    let pages = shard
        .broadcast({
            let bucket = bucket.to_string();
            move |s| s.tier.list(&bucket, &query)
        })
        .await?;
    let mut pages = pages.into_iter().collect::<Result<Vec<_>, _>>()?;
    pages.extend(remote);
    Ok(merge(pages, p.max_keys))
}

fn encoder(url_encode: bool) -> impl Fn(&str) -> String {
    move |s: &str| {
        if url_encode {
            utf8_percent_encode(s, URL_SAFE).to_string()
        } else {
            s.to_string()
        }
    }
}

/// Splits a page into object entries and common prefixes, names encoded by `enc`, each
/// object shown with `owner` when given.
fn split(
    items: Vec<ListItem>,
    enc: &dyn Fn(&str) -> String,
    owner: Option<&Owner>,
) -> (Vec<ObjectEntry>, Vec<CommonPrefix>) {
    let mut contents = Vec::new();
    let mut common_prefixes = Vec::new();
    for item in items {
        match item {
            ListItem::Object {
                key,
                size,
                etag,
                last_modified,
            } => contents.push(ObjectEntry {
                key: enc(&key),
                last_modified: humantime::format_rfc3339_millis(last_modified).to_string(),
                etag,
                size,
                owner: owner.cloned(),
                storage_class: "STANDARD",
            }),
            ListItem::Prefix(p) => common_prefixes.push(CommonPrefix { prefix: enc(&p) }),
        }
    }
    (contents, common_prefixes)
}

/// ListObjectVersions: every object is its only version, with version id `null`.
pub async fn list_versions(ctx: &Ctx, bucket: &str) -> Result<Resp, S3Error> {
    let p = list_params(&ctx.target)?;
    let key_marker = ctx.target.param("key-marker").unwrap_or("").to_string();
    let after = (!key_marker.is_empty()).then(|| key_marker.clone());
    let (items, truncated) = page(ctx, bucket, &p, after).await?;
    let enc = encoder(p.url_encode);
    let last = items.last().map(|i| i.name().to_string());
    let (objects, common_prefixes) = split(items, &enc, None);
    let owner = bucket_owner(ctx, bucket);
    let version = objects
        .into_iter()
        .map(|o| VersionEntry {
            key: o.key,
            version_id: "null",
            is_latest: true,
            last_modified: o.last_modified,
            etag: o.etag,
            size: o.size,
            storage_class: "STANDARD",
            owner: owner.clone(),
        })
        .collect();
    let doc = ListVersionsResult {
        xmlns: S3_NS,
        name: bucket.to_string(),
        prefix: enc(&p.prefix),
        key_marker: enc(&key_marker),
        version_id_marker: String::new(),
        next_key_marker: last.filter(|_| truncated).map(|l| enc(&l)),
        next_version_id_marker: truncated.then(|| "null".to_string()),
        max_keys: p.max_keys,
        delimiter: p.delimiter.as_deref().map(&enc),
        encoding_type: p.url_encode.then_some("url"),
        is_truncated: truncated,
        version,
        common_prefixes,
    };
    Ok(xml_response(
        StatusCode::OK,
        to_xml("ListVersionsResult", &doc),
    ))
}

/// ListObjectsV2 when `list-type=2`, ListObjects (v1) otherwise.
pub async fn list_objects(ctx: &Ctx, bucket: &str) -> Result<Resp, S3Error> {
    let t = &ctx.target;
    let v2 = match t.param("list-type") {
        None => false,
        Some("2") => true,
        Some(_) => return Err(invalid("Invalid list-type; only 2 is supported.")),
    };
    let p = list_params(t)?;
    let (max_keys, url_encode) = (p.max_keys, p.url_encode);
    let (prefix, delimiter) = (p.prefix.clone(), p.delimiter.clone());
    let token = t.param("continuation-token").map(str::to_string);
    let after = if v2 {
        match &token {
            Some(tok) => Some(
                hex::decode(tok)
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok())
                    .ok_or_else(|| invalid("The continuation token provided is incorrect"))?,
            ),
            None => t.param("start-after").map(str::to_string),
        }
    } else {
        t.param("marker").map(str::to_string)
    };
    let (items, truncated) = page(ctx, bucket, &p, after).await?;

    let enc = encoder(url_encode);
    let last = items.last().map(|i| i.name().to_string());
    // Objects are shown with their bucket's owner: listings do not read each object's.
    let fetch_owner = !v2 || t.param("fetch-owner") == Some("true");
    let owner = fetch_owner.then(|| bucket_owner(ctx, bucket));
    let (contents, common_prefixes) = split(items, &enc, owner.as_ref());
    let mut doc = ListBucketResult {
        xmlns: S3_NS,
        name: bucket.to_string(),
        // botocore decodes ListObjects V1's Marker, Delimiter and keys but not its Prefix (as
        // S3 leaves it): only V2 encodes it.
        prefix: if v2 { enc(&prefix) } else { prefix.clone() },
        max_keys,
        delimiter: delimiter.as_deref().map(&enc),
        encoding_type: url_encode.then_some("url"),
        is_truncated: truncated,
        ..Default::default()
    };
    if v2 {
        doc.key_count = Some(contents.len() + common_prefixes.len());
        doc.continuation_token = token;
        doc.start_after = t.param("start-after").map(&enc);
        if truncated {
            doc.next_continuation_token = last.map(|l| hex::encode(l.as_bytes()));
        }
    } else {
        doc.marker = Some(enc(t.param("marker").unwrap_or("")));
        if truncated && delimiter.is_some() {
            doc.next_marker = last.map(|l| enc(&l));
        }
    }
    doc.contents = contents;
    doc.common_prefixes = common_prefixes;
    Ok(xml_response(
        StatusCode::OK,
        to_xml("ListBucketResult", &doc),
    ))
}

/// DeleteBucket in a cluster: refused while any member holds an object of the bucket, then
/// deleted in etcd (every node drops it when it reads the change).
pub async fn delete_in_cluster(ctx: &Ctx, bucket: &str) -> Result<Resp, S3Error> {
    let Some(cluster) = ctx.cluster.clone() else {
        return Err(S3Error::new(S3ErrorCode::InternalError));
    };
    let view = cluster.view();
    if !view.buckets.contains_key(bucket) {
        // A bucket of this node alone (from before it joined).
        return delete(ctx, bucket).await;
    }
    let path = format!(
        "/{}?list-type=2&max-keys=1",
        utf8_percent_encode(bucket, crate::cluster::replica::PATH)
    );
    for member in &view.members {
        let peer = forward::authority(&member.url)
            .ok_or_else(|| unavailable(format!("Member {} has no http:// URL.", member.name)))?;
        let mut req = http::Request::builder()
            .method(http::Method::GET)
            .uri(&path)
            .body(forward::empty_body())
            .map_err(|e| S3Error::new(S3ErrorCode::InternalError).msg(e.to_string()))?;
        let h = req.headers_mut();
        forward::set(h, "host", peer);
        forward::set(h, yutu_api::cluster::FORWARDED_HEADER, &cluster.node);
        if let Some(token) = cluster.node_token() {
            forward::set(h, "authorization", &format!("Bearer {token}"));
        }
        let answer = async {
            let sender = forward::connect(peer).await?;
            forward::exchange_raw(peer, sender, req, std::time::Duration::from_secs(10), 1 << 20).await
        }
        .await
        .map_err(|e| {
            unavailable(format!(
                "Cannot check that member {} holds nothing of the bucket ({e}); nothing was deleted.",
                member.name
            ))
        })?;
        let (head, body) = answer;
        if head.status == StatusCode::NOT_FOUND {
            continue;
        }
        if !head.status.is_success() {
            return Err(unavailable(format!(
                "Member {} answered {} to the emptiness check; nothing was deleted.",
                member.name, head.status
            )));
        }
        if memchr_contains(&body, b"<Key>") {
            return Err(S3Error::new(S3ErrorCode::BucketNotEmpty));
        }
    }
    crate::cluster::buckets::delete(&ctx.shard, &cluster, bucket)
        .await
        .map_err(bucket_error)?;
    Ok(empty(StatusCode::NO_CONTENT))
}

fn memchr_contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Serves this file's bucket operations (the table is
/// [`Op::handler`](crate::http::endpoint::Op::handler)), once the caller may
/// (`incarnation`: the bucket's, as the permission was checked against).
pub async fn serve_bucket(
    ctx: &Ctx,
    op: crate::http::endpoint::Op,
    b: &str,
    body: Incoming,
    _incarnation: Option<u64>,
) -> Result<Resp, S3Error> {
    use crate::http::endpoint::Op;
    match op {
        Op::CreateBucket => create(ctx, body, b).await,
        Op::DeleteBucket if ctx.cluster.is_some() && ctx.peer.is_none() => {
            delete_in_cluster(ctx, b).await
        }
        Op::DeleteBucket => delete(ctx, b).await,
        Op::HeadBucket => head(ctx, b),
        Op::GetBucketLocation => location(ctx, b),
        Op::ListObjectVersions => list_versions(ctx, b).await,
        Op::ListObjects => list_objects(ctx, b).await,
        _ => Err(crate::http::endpoint::not_served(op)),
    }
}
