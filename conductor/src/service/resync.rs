//! Fetching a node's snapshot when its event stream cannot be trusted any more.
//!
//! One task per resync: it fetches `GET {node url}/admin/v1/kv/snapshot` on the blocking
//! pool (the fetch can be large and slow and must not hold the conductor's lock), hands it to
//! the conductor, and retries with backoff on failure for as long as that resync is still
//! the one wanted. A newer resync of the same node (another gap, a restart) supersedes it:
//! the old task notices and stops, and its late snapshot, if any, is ignored.

use std::io::BufReader;
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use ureq::tls::{parse_pem, Certificate, PemItem, RootCerts, TlsConfig};
use yutu_api::events::{KvSnapshot, SNAPSHOT_PATH};

use super::Shared;
use crate::feed::SnapshotOutcome;
use crate::ids::NodeId;

/// Why a snapshot could not be had.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("fetching the snapshot: {0}")]
    Http(#[from] ureq::Error),
    #[error("reading the snapshot: {0}")]
    Json(#[from] serde_json::Error),
    #[error("the snapshot fetch was cancelled")]
    Cancelled,
}

/// Fetches and parses the snapshot of the node at `base_url`.
/// `token` is sent as a bearer token (the node's admin API needs one when it authenticates);
/// `ca_pem` holds the certificates trusted for a node serving HTTPS.
pub fn fetch_snapshot(
    base_url: &str,
    timeout: Duration,
    max_bytes: u64,
    token: Option<&str>,
    ca_pem: Option<&[u8]>,
) -> Result<KvSnapshot, SnapshotError> {
    let mut config = ureq::Agent::config_builder().timeout_global(Some(timeout));
    if let Some(pem) = ca_pem {
        config = config.tls_config(trusting(pem));
    }
    let agent: ureq::Agent = config.build().into();
    let mut req = agent.get(format!("{base_url}{SNAPSHOT_PATH}"));
    if let Some(token) = token {
        req = req.header("authorization", format!("Bearer {}", token.trim()));
    }
    let mut resp = req.call()?;
    let reader = resp.body_mut().with_config().limit(max_bytes).reader();
    Ok(serde_json::from_reader(BufReader::new(reader))?)
}

/// A TLS configuration trusting exactly the certificates in `pem`.
pub fn trusting(pem: &[u8]) -> TlsConfig {
    let certs: Vec<Certificate<'static>> = parse_pem(pem)
        .filter_map(|item| match item {
            Ok(PemItem::Certificate(c)) => Some(c.to_owned()),
            _ => None,
        })
        .collect();
    TlsConfig::builder()
        .root_certs(RootCerts::Specific(Arc::new(certs)))
        .build()
}

/// Delays between snapshot fetches: 100 ms, doubling, at most 5 s, for as long as the resync
/// is wanted.
const BACKOFF: ExponentialBuilder = ExponentialBuilder::new()
    .with_min_delay(Duration::from_millis(100))
    .with_factor(2.0)
    .with_max_delay(Duration::from_secs(5))
    .without_max_times();

/// Starts serving resync `generation` of `node` in the background.
pub(crate) fn spawn(shared: Arc<Shared>, node: NodeId, generation: u64) {
    tokio::spawn(run(shared, node, generation));
}

async fn run(shared: Arc<Shared>, node: NodeId, mut generation: u64) {
    let mut delays = BACKOFF.build();
    loop {
        let backoff = delays.next().unwrap_or(Duration::from_secs(5));
        // No URL yet (the node pushed before it was registered): registration restarts this.
        let Some(url) = shared.core().resync_source(node, generation) else {
            return;
        };
        let (timeout, max) = (
            shared.limits.snapshot_timeout,
            shared.limits.max_snapshot_bytes,
        );
        let fetch_url = url.clone();
        let (token, ca) = (
            shared.auth.node_token.clone(),
            shared.auth.node_ca_pem.clone(),
        );
        let fetched = tokio::task::spawn_blocking(move || {
            fetch_snapshot(&fetch_url, timeout, max, token.as_deref(), ca.as_deref())
        })
        .await
        .unwrap_or(Err(SnapshotError::Cancelled));
        let failure = match fetched {
            Ok(snapshot) => {
                let outcome = shared.core().apply_snapshot(node, generation, &snapshot);
                match outcome {
                    Ok(SnapshotOutcome::Synced { replayed }) => {
                        tracing::info!(node = %snapshot.node, seq = snapshot.seq, replayed, "resynced from snapshot");
                        return;
                    }
                    Ok(SnapshotOutcome::Ignored) => return,
                    Ok(SnapshotOutcome::Again(next)) => {
                        tracing::info!(node = %snapshot.node, seq = snapshot.seq, "snapshot behind the events; fetching a newer one");
                        generation = next.generation;
                        None
                    }
                    Err(e) => Some(e.to_string()),
                }
            }
            Err(e) => Some(e.to_string()),
        };
        if let Some(error) = failure {
            shared.core().snapshot_failed();
            tracing::warn!(%url, %error, retry_in_ms = backoff.as_millis() as u64, "snapshot fetch failed");
        }
        if !shared.core().resync_wanted(node, generation) {
            return;
        }
        tokio::time::sleep(backoff).await;
    }
}
