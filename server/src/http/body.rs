//! Reading request bodies within limits: size, the node's body budget, and time.
//!
//! A body's bytes are reserved in the node-wide [`BodyBudget`] before the first one is read
//! (its Content-Length, or the request's limit when it announces none), so the bodies held at
//! once never exceed the budget however many clients send; the reservation lives in the
//! returned [`ReadBody`] and ends with it. A body that cannot get its bytes within the body
//! timeout is refused with 503 SlowDown; one that goes silent for the body timeout, or falls
//! behind the minimum rate at any point, with 400 RequestTimeout (which also drops the
//! connection). Anonymous bodies draw from a pool of their own, and every client from its
//! share of a pool (see [`crate::net::budget`]).

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
use crate::net::budget::{BodyBudget, BodyClient, BodyPermit};

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

/// Waits for `bytes` of the node's budget for `client`, at most `timeout`.
async fn reserve(
    budget: &BodyBudget,
    metrics: &Arc<ShardMetrics>,
    client: &BodyClient,
    bytes: u64,
    timeout: Duration,
) -> Result<Reservation, S3Error> {
    // Most bodies find their bytes free: no timer for them.
    let waited = match budget.try_reserve(client, bytes) {
        Ok(Some(permit)) => Some(Ok(permit)),
        Err(too_large) => Some(Err(too_large)),
        Ok(None) => {
            future::or(async { Some(budget.reserve(client, bytes).await) }, async {
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
            let whose = if client.anonymous {
                "an unauthenticated request"
            } else {
                "one request"
            };
            Err(S3Error::new(S3ErrorCode::EntityTooLarge).msg(format!(
                "Your proposed upload of {} bytes exceeds the {} bytes this node holds for {whose}'s body; use a multipart upload.",
                too_large.bytes, too_large.largest
            )))
        }
        None => {
            metrics.body_budget_wait.inc();
            Err(S3Error::new(S3ErrorCode::SlowDown).msg(format!(
                "The node is receiving as many request bodies as it holds at once (or as many as it holds for you) and none ended within {} s; please retry.",
                timeout.as_secs()
            )))
        }
    }
}

/// Reserves `bytes` of the node's body budget for `client` (waiting at most the body
/// timeout): what [`read_limited`] does before the first byte, for callers that read a body
/// in steps (POST Object reserves its file only once the form's signature is checked).
pub async fn reserve_for(
    ctx: &Ctx,
    client: &BodyClient,
    bytes: u64,
) -> Result<Reservation, S3Error> {
    let shard = &ctx.shard;
    reserve(
        &shard.body_budget,
        &shard.metrics,
        client,
        bytes,
        shard.settings.body.timeout,
    )
    .await
}

/// Reads a body's frames under the node's time limits: none may be `timeout` apart, and the
/// body must keep up the minimum rate all along (after `timeout` of grace, `min_rate` bytes
/// a second on average), so a trickle holds its reservation for at most about the timeout,
/// not for the time its whole length would take at the minimum rate.
pub struct BodyReader<'a> {
    ctx: &'a Ctx,
    body: &'a mut Incoming,
    started: Instant,
    received: u64,
    /// Bytes received before `started` (see [`BodyReader::resume`]).
    credited: u64,
}

impl<'a> BodyReader<'a> {
    pub fn new(ctx: &'a Ctx, body: &'a mut Incoming) -> BodyReader<'a> {
        BodyReader {
            ctx,
            body,
            started: Instant::now(),
            received: 0,
            credited: 0,
        }
    }

    /// Starts the clock again after the caller stopped reading for a while (waiting for the
    /// budget): the time it spent is not the client's.
    pub fn resume(&mut self) {
        self.started = Instant::now();
        self.credited = self.received;
    }

    /// Bytes read so far.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// The next chunk of data; `None` at the end of the body.
    pub async fn next(&mut self) -> Result<Option<Bytes>, S3Error> {
        let shard = &self.ctx.shard;
        let limits = shard.settings.body;
        loop {
            // The next byte is due when the bytes so far are used up at the minimum rate.
            let due = self.started + limits.deadline(self.received - self.credited);
            let quiet = limits
                .timeout
                .min(due.saturating_duration_since(Instant::now()));
            // A frame already received needs no timer (dropping an unfinished `frame()` loses
            // nothing: it only polls the body).
            let next = match future::poll_once(self.body.frame()).await {
                Some(frame) => Some(frame),
                None => {
                    let body = &mut *self.body;
                    future::or(async { Some(body.frame().await) }, async {
                        glommio::timer::Timer::new(quiet).await;
                        None
                    })
                    .await
                }
            };
            let frame = match next {
                Some(Some(frame)) => frame,
                Some(None) => return Ok(None),
                None => {
                    shard.metrics.body_timeout.inc();
                    return Err(S3Error::new(S3ErrorCode::RequestTimeout).msg(format!(
                        "The request body sent {} bytes and then nothing for {} s, or came slower than {} bytes/s.",
                        self.received,
                        quiet.as_secs(),
                        limits.min_rate
                    )));
                }
            };
            let frame = frame.map_err(|e| {
                S3Error::new(S3ErrorCode::IncompleteBody)
                    .msg(format!("Reading the body failed: {e}."))
            })?;
            if let Ok(data) = frame.into_data() {
                self.received += data.len() as u64;
                return Ok(Some(data));
            }
        }
    }

    /// Reads the rest of the body into `buf`, refusing it as soon as `buf` grows past `cap`.
    pub async fn read_to_end(&mut self, buf: &mut BytesMut, cap: u64) -> Result<(), S3Error> {
        while let Some(data) = self.next().await? {
            if (buf.len() + data.len()) as u64 > cap {
                return Err(S3Error::new(S3ErrorCode::EntityTooLarge).msg(format!(
                    "Your proposed upload exceeds the maximum allowed size of {cap} bytes."
                )));
            }
            buf.extend_from_slice(&data);
        }
        Ok(())
    }
}

/// Refuses a Content-Length above `limit` before anything is reserved.
pub fn check_announced(expected: Option<u64>, limit: u64) -> Result<(), S3Error> {
    match expected.filter(|n| *n > limit) {
        Some(n) => Err(S3Error::new(S3ErrorCode::EntityTooLarge).msg(format!(
            "Your proposed upload of {n} bytes exceeds the maximum allowed size of {limit} bytes."
        ))),
        None => Ok(()),
    }
}

/// Reads the whole body, refusing it as soon as it grows past `limit` bytes.
///
/// The Content-Length sizes the reservation and the buffer up front, so a large object is
/// received into one allocation; a body without one reserves (and may grow to) `limit`, or
/// what the budget holds for one body if that is less.
pub async fn read_limited(ctx: &Ctx, mut body: Incoming, limit: u64) -> Result<ReadBody, S3Error> {
    let expected = content_length(ctx)?;
    check_announced(expected, limit)?;
    let client = ctx.body_client();
    let budget = &ctx.shard.body_budget;
    let (want, cap) = match expected {
        Some(n) => (n, limit),
        None => {
            let most = if client.anonymous {
                budget.largest_anonymous()
            } else {
                budget.largest()
            };
            let n = limit.min(most);
            (n, n)
        }
    };
    let reservation = reserve_for(ctx, &client, want).await?;
    let mut buf = BytesMut::with_capacity(want as usize);
    BodyReader::new(ctx, &mut body)
        .read_to_end(&mut buf, cap)
        .await?;
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
