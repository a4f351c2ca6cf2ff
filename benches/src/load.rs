//! The load generator: a fixed number of keep-alive connections, each sending its next request
//! as soon as the previous one is answered (closed loop), for a fixed time after a warm-up.
//!
//! Closed-loop at fixed concurrency is what the design's comparisons need: both servers see the
//! same offered concurrency, and throughput and latency come from the same requests. Requests
//! finished during the warm-up, and requests still in flight when the window ends, are not
//! counted; a request only counts when its status and body length are what the workload
//! expects.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::http::Conn;

/// Keeps the hot loop from spinning on a dead server: errors are counted, then we back off.
const ERROR_BACKOFF: Duration = Duration::from_millis(10);

/// Error messages kept for the report; the rest are only counted.
const KEPT_ERRORS: usize = 3;

/// What every request of one case looks like.
pub struct Workload {
    pub method: &'static str,
    /// Request paths, used round-robin across all connections.
    pub paths: Arc<Vec<String>>,
    /// Request bodies, one per path (PUT); `None` sends no body (GET).
    pub bodies: Option<Arc<Vec<Vec<u8>>>>,
    /// The response body length a successful request must have; `None` accepts any (a PUT's
    /// answer carries no payload worth checking).
    pub expect_body_len: Option<u64>,
    /// Statuses that count as success.
    pub ok_status: &'static [u16],
    /// Payload bytes moved per successful request, for MB/s.
    pub payload_bytes: u64,
}

/// How hard and how long to push.
#[derive(Clone, Copy, Debug)]
pub struct LoadConfig {
    pub concurrency: usize,
    pub warmup: Duration,
    pub duration: Duration,
    /// Upper bound on one request, so a stuck server cannot stall the run.
    pub request_timeout: Duration,
}

/// What one case measured.
#[derive(Debug, Default)]
pub struct LoadResult {
    pub ops: u64,
    pub errors: u64,
    pub payload_bytes: u64,
    pub window: Duration,
    /// Latency of every counted request, in nanoseconds, sorted.
    pub latencies_ns: Vec<u64>,
    /// The first few distinct error messages, to say why `errors` is not zero.
    pub error_samples: Vec<String>,
}

/// Per-connection tallies, merged when the window closes.
#[derive(Default)]
struct Tally {
    ops: u64,
    errors: u64,
    latencies_ns: Vec<u64>,
    error_samples: Vec<String>,
}

impl Tally {
    fn error(&mut self, msg: String) {
        self.errors += 1;
        if self.error_samples.len() < KEPT_ERRORS && !self.error_samples.contains(&msg) {
            self.error_samples.push(msg);
        }
    }
}

/// Runs `workload` against `addr` and returns what was counted in the measurement window.
pub async fn run(addr: SocketAddr, workload: Arc<Workload>, cfg: LoadConfig) -> LoadResult {
    let started = Instant::now();
    let measure_from = started + cfg.warmup;
    let stop_at = measure_from + cfg.duration;
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::with_capacity(cfg.concurrency);
    for _ in 0..cfg.concurrency.max(1) {
        let workload = Arc::clone(&workload);
        let next = Arc::clone(&next);
        tasks.push(tokio::spawn(async move {
            connection_loop(
                addr,
                &workload,
                &next,
                measure_from,
                stop_at,
                cfg.request_timeout,
            )
            .await
        }));
    }
    let mut result = LoadResult {
        window: cfg.duration,
        ..LoadResult::default()
    };
    for task in tasks {
        match task.await {
            Ok(t) => {
                result.ops += t.ops;
                result.errors += t.errors;
                result.latencies_ns.extend(t.latencies_ns);
                for m in t.error_samples {
                    if result.error_samples.len() < KEPT_ERRORS
                        && !result.error_samples.contains(&m)
                    {
                        result.error_samples.push(m);
                    }
                }
            }
            Err(e) => {
                result.errors += 1;
                result.error_samples.push(format!("load task failed: {e}"));
            }
        }
    }
    result.payload_bytes = result.ops * workload.payload_bytes;
    result.latencies_ns.sort_unstable();
    result
}

async fn connection_loop(
    addr: SocketAddr,
    w: &Workload,
    next: &AtomicUsize,
    measure_from: Instant,
    stop_at: Instant,
    request_timeout: Duration,
) -> Tally {
    let mut conn = Conn::new(addr);
    let mut tally = Tally::default();
    let n = w.paths.len().max(1);
    // One timer for the whole loop, so the end of the window interrupts a request in flight.
    let window_end = tokio::time::sleep_until(stop_at.into());
    tokio::pin!(window_end);
    loop {
        let t0 = Instant::now();
        if t0 >= stop_at {
            break;
        }
        let i = next.fetch_add(1, Ordering::Relaxed) % n;
        let Some(path) = w.paths.get(i) else {
            tally.error("workload has no paths".to_owned());
            break;
        };
        let body = w
            .bodies
            .as_ref()
            .and_then(|b| b.get(i))
            .map_or(&[][..], |b| &b[..]);
        let request =
            tokio::time::timeout(request_timeout, conn.request(w.method, path, body, false));
        let outcome = tokio::select! {
            outcome = request => outcome,
            // In flight when the window closed: neither a success nor a failure of the server.
            () = &mut window_end => break,
        };
        let t1 = Instant::now();
        if t1 >= stop_at {
            break;
        }
        let failure = match outcome {
            Err(_) => {
                conn.reset();
                Some(format!(
                    "{} {path}: no response within {request_timeout:?}",
                    w.method
                ))
            }
            Ok(Err(e)) => Some(format!("{} {path}: {e:#}", w.method)),
            Ok(Ok(r)) if !w.ok_status.contains(&r.status) => {
                Some(format!("{} {path}: status {}", w.method, r.status))
            }
            Ok(Ok(r)) if w.expect_body_len.is_some_and(|n| n != r.body_len) => Some(format!(
                "{} {path}: body of {} bytes, expected {}",
                w.method,
                r.body_len,
                w.expect_body_len.unwrap_or_default()
            )),
            Ok(Ok(_)) => None,
        };
        match failure {
            Some(msg) => {
                tally.error(msg);
                tokio::time::sleep(ERROR_BACKOFF).await;
            }
            None if t1 >= measure_from => {
                tally.ops += 1;
                tally.latencies_ns.push(nanos(t1 - t0));
            }
            None => {}
        }
    }
    tally
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl LoadResult {
    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.window.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    /// Payload megabytes (10^6 bytes) per second.
    pub fn mb_per_sec(&self) -> f64 {
        self.payload_bytes as f64 / 1e6 / self.window.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    /// Nearest-rank percentile of the counted latencies, in microseconds; `None` with no data.
    pub fn percentile_us(&self, p: f64) -> Option<f64> {
        if self.latencies_ns.is_empty() {
            return None;
        }
        let rank = ((p / 100.0) * self.latencies_ns.len() as f64).ceil() as usize;
        let idx = rank.clamp(1, self.latencies_ns.len()) - 1;
        Some(self.latencies_ns[idx] as f64 / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let r = LoadResult {
            latencies_ns: (1..=100).map(|us| us * 1000).collect(),
            ..LoadResult::default()
        };
        assert_eq!(r.percentile_us(50.0), Some(50.0));
        assert_eq!(r.percentile_us(99.0), Some(99.0));
        assert_eq!(r.percentile_us(100.0), Some(100.0));
        assert_eq!(LoadResult::default().percentile_us(50.0), None);
    }

    #[tokio::test]
    async fn a_dead_server_yields_errors_not_throughput() {
        // Bind then drop: nothing listens on this port during the run.
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port");
        let w = Arc::new(Workload {
            method: "GET",
            paths: Arc::new(vec!["/x".to_owned()]),
            bodies: None,
            expect_body_len: Some(1),
            ok_status: &[200],
            payload_bytes: 1,
        });
        let cfg = LoadConfig {
            concurrency: 2,
            warmup: Duration::ZERO,
            duration: Duration::from_millis(100),
            request_timeout: Duration::from_secs(1),
        };
        let r = run(addr, w, cfg).await;
        assert_eq!(r.ops, 0);
        assert!(r.errors > 0);
        assert!(!r.error_samples.is_empty());
    }
}
