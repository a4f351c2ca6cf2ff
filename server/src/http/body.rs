//! Reading request bodies within limits: size, the node's body budget, and time.
//!
//! A body's bytes are reserved in the node-wide [`BodyBudget`] before the first one is read
//! (its Content-Length, or the request's limit when it announces none), so the bodies held at
//! once never exceed the budget however many clients send; the reservation lives in the
//! returned [`ReadBody`] and ends with it. A body that cannot get its bytes within the body
//! timeout is refused with 503 SlowDown; one that goes silent for the body timeout, or arrives
//! slower than the minimum rate, with 400 RequestTimeout (which also drops the connection).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_lite::future;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use yutu_api::S3ErrorCode;

use super::ctx::Ctx;
use super::error::S3Error;
use crate::metrics::ShardMetrics;
use crate::net::budget::{BodyBudget, BodyPermit};

/// A body's share of the node's budget, counted in its shard's metrics while it lives.
#[derive(Debug)]
pub struct Reservation {
    _permit: BodyPermit,
    bytes: u64,
    metrics: Arc<ShardMetrics>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.metrics.body_reserved.sub(self.bytes);
    }
}

/// A whole request body and the budget it holds.
#[derive(Debug)]
pub struct ReadBody {
    pub data: Bytes,
    pub reservation: Reservation,
}

/// The request's Content-Length, when it sends one.
pub fn content_length(ctx: &Ctx) -> Result<Option<u64>, S3Error> {
    match ctx.header("content-length") {
        None => Ok(None),
        Some(v) => v
            .parse()
            .map(Some)
            .map_err(|_| S3Error::new(S3ErrorCode::InvalidArgument).msg("Invalid Content-Length.")),
    }
}

/// Waits for `bytes` of the node's budget, at most `timeout`.
async fn reserve(
    budget: &BodyBudget,
    metrics: &Arc<ShardMetrics>,
    bytes: u64,
    timeout: Duration,
) -> Result<Reservation, S3Error> {
    // Most bodies find their bytes free: no timer for them.
    let waited = match budget.try_reserve(bytes) {
        Ok(Some(permit)) => Some(Ok(permit)),
        Err(too_large) => Some(Err(too_large)),
        Ok(None) => {
            future::or(async { Some(budget.reserve(bytes).await) }, async {
                glommio::timer::Timer::new(timeout).await;
                None
            })
            .await
        }
    };
    match waited {
        Some(Ok(permit)) => {
            metrics.body_reserved.add(bytes);
            Ok(Reservation {
                _permit: permit,
                bytes,
                metrics: metrics.clone(),
            })
        }
        Some(Err(too_large)) => {
            metrics.body_too_large.inc();
            Err(S3Error::new(S3ErrorCode::EntityTooLarge).msg(format!(
                "Your proposed upload of {} bytes exceeds the {} bytes this node holds for one request body; use a multipart upload.",
                too_large.bytes, too_large.largest
            )))
        }
        None => {
            metrics.body_budget_wait.inc();
            Err(S3Error::new(S3ErrorCode::SlowDown).msg(format!(
                "The node is receiving as many request bodies as it holds at once and none ended within {} s; please retry.",
                timeout.as_secs()
            )))
        }
    }
}

/// Reads the whole body, refusing it as soon as it grows past `limit` bytes.
///
/// The Content-Length sizes the reservation and the buffer up front, so a large object is
/// received into one allocation; a body without one reserves (and may grow to) `limit`, or
/// what the budget holds for one body if that is less.
pub async fn read_limited(ctx: &Ctx, mut body: Incoming, limit: u64) -> Result<ReadBody, S3Error> {
    let expected = content_length(ctx)?;
    if let Some(n) = expected.filter(|n| *n > limit) {
        return Err(S3Error::new(S3ErrorCode::EntityTooLarge).msg(format!(
            "Your proposed upload of {n} bytes exceeds the maximum allowed size of {limit} bytes."
        )));
    }
    let shard = &ctx.shard;
    let limits = shard.settings.body;
    let budget = &shard.body_budget;
    let (want, cap) = match expected {
        Some(n) => (n, limit),
        None => {
            let n = limit.min(budget.largest());
            (n, n)
        }
    };
    let reservation = reserve(budget, &shard.metrics, want, limits.timeout).await?;
    let deadline = Instant::now() + limits.deadline(want);
    let mut buf = BytesMut::with_capacity(want as usize);
    loop {
        let now = Instant::now();
        let quiet = limits.timeout.min(deadline.saturating_duration_since(now));
        // A frame already received needs no timer (dropping an unfinished `frame()` loses
        // nothing: it only polls the body).
        let next = match future::poll_once(body.frame()).await {
            Some(frame) => Some(frame),
            None => {
                future::or(async { Some(body.frame().await) }, async {
                    glommio::timer::Timer::new(quiet).await;
                    None
                })
                .await
            }
        };
        let frame = match next {
            Some(Some(frame)) => frame,
            Some(None) => break,
            None => {
                shard.metrics.body_timeout.inc();
                return Err(S3Error::new(S3ErrorCode::RequestTimeout).msg(format!(
                    "The request body sent {} of {want} bytes and then nothing for {} s, or came slower than {} bytes/s.",
                    buf.len(),
                    quiet.as_secs(),
                    limits.min_rate
                )));
            }
        };
        let frame = frame.map_err(|e| {
            S3Error::new(S3ErrorCode::IncompleteBody).msg(format!("Reading the body failed: {e}."))
        })?;
        if let Ok(data) = frame.into_data() {
            if (buf.len() + data.len()) as u64 > cap {
                return Err(S3Error::new(S3ErrorCode::EntityTooLarge).msg(format!(
                    "Your proposed upload exceeds the maximum allowed size of {cap} bytes."
                )));
            }
            buf.extend_from_slice(&data);
        }
    }
    if let Some(n) = expected {
        if buf.len() as u64 != n {
            return Err(S3Error::new(S3ErrorCode::IncompleteBody));
        }
    }
    Ok(ReadBody {
        data: buf.freeze(),
        reservation,
    })
}
