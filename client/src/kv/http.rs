//! The HTTP side of KV calls: the agent (every call a small JSON request sent in one write),
//! GETs signed when there are credentials, answers read as JSON within a bound, and error
//! answers turned into [`KvError`]s.

use std::io::Read;

use serde::de::DeserializeOwned;
use ureq::Agent;
use yutu_api::kv::{KeysRequest, KvOp};

use super::{lanes, KvError};
use crate::address::encode_key;
use crate::error::{error_from_response, Resource};
use crate::ClientError;

/// Largest JSON answer read (4096 descriptors fit in well under 2 MiB).
pub(super) const JSON_LIMIT: u64 = 16 << 20;

/// How much of an error body is read.
pub(super) const ERROR_BODY_LIMIT: u64 = 64 * 1024;

/// A GET of `path`; with the answer, the shard that served it.
#[allow(clippy::type_complexity)]
pub(super) fn call_get<T: DeserializeOwned>(
    agent: &Agent,
    base: &str,
    path: &str,
    signer: Option<(&crate::Credentials, &str)>,
) -> Result<(T, Option<(usize, usize)>), KvError> {
    let resp = signed_get(agent, base, path, signer)?;
    let served = lanes::served_by(&resp);
    Ok((read_json(resp)?, served))
}

/// Sends a GET of `path`, signed when there is a signer.
pub(super) fn signed_get(
    agent: &Agent,
    base: &str,
    path: &str,
    signer: Option<(&crate::Credentials, &str)>,
) -> Result<ureq::http::Response<ureq::Body>, KvError> {
    let mut req = agent.get(format!("{base}{path}"));
    if let Some((c, host)) = signer {
        let now = std::time::SystemTime::now();
        // As in `KvClient::call_post`: the path after the base URL is what the node receives.
        for (name, value) in c.sign("GET", host, path, "", b"", now) {
            req = req.header(name, value);
        }
    }
    Ok(req.call().map_err(ClientError::from)?)
}

/// An agent for KV calls. Every KV call is a small JSON request: sent in one write (see
/// `coalesce`).
pub(super) fn kv_agent(config: ureq::config::Config, https: bool) -> Agent {
    use crate::coalesce::CoalescingConnector;
    use ureq::unversioned::resolver::DefaultResolver;
    use ureq::unversioned::transport::{Connector, DefaultConnector};
    if https {
        // TLS (and proxies) as ureq does them.
        let chain = DefaultConnector::new().chain(CoalescingConnector);
        Agent::with_parts(config, chain, DefaultResolver::default())
    } else {
        let chain = ().chain(crate::tcp::KvTcpConnector).chain(CoalescingConnector);
        Agent::with_parts(config, chain, DefaultResolver::default())
    }
}

/// The body of exists, prefix and remove.
pub(super) fn keys_request(keys: &[String]) -> KeysRequest {
    KeysRequest {
        keys: keys.to_vec(),
        ttl_ms: None,
    }
}

/// `/v1/kv/{bucket}/{op}`, refusing buckets that would address something else.
pub(super) fn kv_path(bucket: &str, op: KvOp) -> Result<String, KvError> {
    check_bucket(bucket)?;
    Ok(op.path(&encode_key(bucket)))
}

/// Only what would make a path address something else is refused here; the node checks the
/// naming rules.
pub(super) fn check_bucket(bucket: &str) -> Result<(), KvError> {
    if bucket.is_empty() || bucket.contains('/') {
        return Err(KvError::InvalidArgument(format!(
            "bucket name {bucket:?} must be non-empty and without '/'"
        )));
    }
    Ok(())
}

pub(super) fn read_json<T: DeserializeOwned>(
    mut resp: ureq::http::Response<ureq::Body>,
) -> Result<T, KvError> {
    check_status(&mut resp, Resource::Bucket)?;
    let raw = resp
        .body_mut()
        .with_config()
        .limit(JSON_LIMIT)
        .read_to_vec()
        .map_err(ClientError::from)?;
    serde_json::from_slice(&raw)
        .map_err(|e| KvError::InvalidResponse(format!("malformed KV answer: {e}")))
}

/// An answer that is not a success as the error it carries (a 404 of `resource`: no such
/// bucket, or no such key).
pub(super) fn check_status(
    resp: &mut ureq::http::Response<ureq::Body>,
    resource: Resource,
) -> Result<(), KvError> {
    let status = resp.status().as_u16();
    if !(200..300).contains(&status) {
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let (code, message) = (header("x-amz-error-code"), header("x-amz-error-message"));
        let mut raw = Vec::new();
        let _ = resp
            .body_mut()
            .as_reader()
            .take(ERROR_BODY_LIMIT)
            .read_to_end(&mut raw);
        return Err(error_from_response(
            status,
            &String::from_utf8_lossy(&raw),
            code.as_deref(),
            message.as_deref(),
            resource,
        )
        .into());
    }
    Ok(())
}
