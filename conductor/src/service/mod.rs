//! The conductor's HTTP service (hyper 1 on tokio).
//!
//! | method and path | body | answer |
//! |---|---|---|
//! | `POST /v1/route` | [`yutu_api::route::RouteRequest`] | 200 [`yutu_api::route::RouteDecision`]; 429 (SLO) or 503 (no instance) [`yutu_api::route::Reject`]; 400 |
//! | `POST /v1/events` | [`yutu_api::events::KvEventBatch`] | 200 `{"applied", "duplicates", "buffered", "stale", "departed", "resync"}`; 409 from a node not registered with a URL (register, then push again) |
//! | `POST /v1/nodes` | [`yutu_api::route::NodeRegistration`] | 200 |
//! | `GET /v1/nodes` | | nodes with their feed position, and whether they left the etcd membership |
//! | `POST /v1/instances` | [`yutu_api::route::InstanceRegistration`] | 200 |
//! | `GET /v1/instances` | | [`yutu_api::route::InstanceStatus`] rows |
//! | `DELETE /v1/instances/{id}` | | 204, 404 |
//! | `POST /v1/instances/{id}/heartbeat` | | 204, 404 |
//! | `POST /v1/instances/{id}/load` | [`yutu_api::route::LoadReport`] | 204, 404 |
//! | `GET /metrics` | | Prometheus text |
//! | `GET /health` | | `ok` |
//!
//! Errors are JSON: `{"error": "<code>", "message": "..."}`. With authentication on, every
//! `/v1/` call needs a bearer token with the conductor scope its endpoint asks (see
//! `auth`): 401 without a valid one, 403 without the scope.
//!
//! All state is one [`Conductor`] behind one mutex. A routing decision holds it for
//! microseconds and LLM requests arrive by the thousand per second at most, so a lock is far
//! from the bottleneck, and one consistent view of index and load is what makes decisions
//! right. Nothing slow happens under it: bodies are read and parsed before, snapshots and the
//! etcd membership are fetched on the blocking pool outside it.

mod auth;
mod handlers;
mod members;
mod resync;

use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use crate::conductor::Conductor;

pub use auth::ServiceAuth;
pub use members::MembershipWatch;
pub use resync::{fetch_snapshot, SnapshotError};

/// Limits of the service.
#[derive(Debug, Clone)]
pub struct ServiceLimits {
    /// Largest request body (an event batch of many blocks is the biggest).
    pub max_body_bytes: usize,
    /// Largest snapshot read from a node.
    pub max_snapshot_bytes: u64,
    /// Time allowed for one snapshot fetch.
    pub snapshot_timeout: Duration,
}

impl Default for ServiceLimits {
    fn default() -> Self {
        ServiceLimits {
            max_body_bytes: 64 << 20,
            max_snapshot_bytes: 4 << 30,
            snapshot_timeout: Duration::from_secs(60),
        }
    }
}

/// What every connection shares.
pub struct Shared {
    core: Mutex<Conductor>,
    start: Instant,
    limits: ServiceLimits,
    auth: ServiceAuth,
}

impl Shared {
    /// A service that lets every caller in (tests, `--no-auth`).
    pub fn new(conductor: Conductor, limits: ServiceLimits) -> Arc<Shared> {
        Self::with_auth(conductor, limits, ServiceAuth::default())
    }

    /// A service whose callers need tokens per `auth`.
    pub fn with_auth(
        conductor: Conductor,
        limits: ServiceLimits,
        auth: ServiceAuth,
    ) -> Arc<Shared> {
        Arc::new(Shared {
            core: Mutex::new(conductor),
            start: Instant::now(),
            limits,
            auth,
        })
    }

    /// Milliseconds since the service started: the conductor's clock.
    pub fn now_ms(&self) -> f64 {
        self.start.elapsed().as_secs_f64() * 1e3
    }

    /// The conductor. A panic while holding the lock cannot leave it half-updated in a way
    /// worse than a stale estimate, so a poisoned lock is taken over rather than propagated.
    pub fn core(&self) -> MutexGuard<'_, Conductor> {
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// How often [`Conductor::maintain`] runs.
const MAINTAIN_EVERY: Duration = Duration::from_millis(100);

/// Serves HTTP/1.1 on `listener` until the task is dropped, with the conductor's
/// housekeeping on a timer beside it.
pub async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let housekeeping = {
        let shared = shared.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(MAINTAIN_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let now = shared.now_ms();
                shared.core().maintain(now);
            }
        })
    };
    let _stop_housekeeping = AbortOnDrop(housekeeping);
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(handlers::handle(shared, req).await) }
            });
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(30))
                .serve_connection(TokioIo::new(stream), svc);
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
}

/// Stops a background task when the future that owns it is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
