//! Publishing KV events to the conductor, and the snapshot it resyncs from.
//!
//! A KV block is an object whose key is a block hash (64 lowercase hex characters). Each
//! shard records `stored` / `removed` / `cleared` events as its store changes and hands them,
//! every few milliseconds, to shard 0. Shard 0 numbers them (one sequence per node and
//! epoch, as `yutu_api::events` requires) and pushes batches to the conductor, retrying with
//! backoff; if the queue overflows while the conductor is away, the oldest events are dropped,
//! which the conductor sees as a gap and answers with a resync from `GET /admin/v1/kv/snapshot`.
//!
//! The snapshot is consistent with its `seq`: shard 0 reads the last assigned number first and
//! only then asks every shard for its blocks, so every event up to `seq` is already reflected
//! in what the shards report; events after it that are also reflected replay idempotently.

use std::rc::Rc;
use std::time::Duration;

use backon::{ExponentialBuilder, RetryableWithContext};
use yutu_api::events::{KvEventBatch, KvSnapshot, SnapshotGroup, EVENTS_PATH};
use yutu_api::route::NodeRegistration;

use crate::net::client::Client;
use crate::node::publisher::Publisher;
use crate::node::{Shard, ShardError};

/// Most events per pushed batch.
const MAX_BATCH: usize = 4096;

/// How often shards hand their events to shard 0, and shard 0 pushes.
const FLUSH_EVERY: Duration = Duration::from_millis(5);

/// Every shard: hand recorded events to shard 0 every few milliseconds.
pub fn spawn_flusher(shard: Rc<Shard>) {
    glommio::spawn_local(async move {
        loop {
            glommio::timer::sleep(FLUSH_EVERY).await;
            let events = shard.tier.take_events();
            if !events.is_empty() {
                let _ = shard
                    .run(0, move |s| {
                        if let Some(p) = &s.publisher {
                            p.append(events);
                        }
                    })
                    .await;
            }
        }
    })
    .detach();
}

/// Delays between attempts while the conductor is away or refuses the node: 100 ms, doubling,
/// at most 2 s, for as long as the node runs. Every `retry` starts the schedule afresh, so a
/// success resets it.
const BACKOFF: ExponentialBuilder = ExponentialBuilder::new()
    .with_min_delay(Duration::from_millis(100))
    .with_factor(2.0)
    .with_max_delay(Duration::from_secs(2))
    .without_max_times();

/// Shard 0: register with the conductor, then push numbered events in order, forever.
pub fn spawn_pusher(shard: Rc<Shard>, conductor: String, advertise: String) {
    glommio::spawn_local(async move {
        let Some(publisher) = shard.publisher.clone() else {
            return;
        };
        let client = Client::new(&conductor, Duration::from_secs(10)).and_then(|c| {
            match &shard.settings.conductor_token {
                Some(token) => c.with_bearer(token),
                None => Ok(c),
            }
        });
        let mut client = match client {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "KV events are not published");
                return;
            }
        };
        let registration = NodeRegistration {
            node: publisher.node.clone(),
            url: advertise,
        };
        let body = serde_json::to_vec(&registration).unwrap_or_default(); // plain strings: cannot fail
        loop {
            // The schedule never runs out: this returns once the node is registered.
            (client, _) = (|c| register(c, body.clone()))
                .retry(BACKOFF)
                .sleep(glommio::timer::sleep)
                .context(client)
                .await;
            tracing::info!(conductor = %conductor, node = %registration.node, "registered with the conductor");
            // After (re-)registering, the first push announces this epoch even with no events:
            // a restarted node publishes nothing for what it recovered from NVMe, and the new
            // epoch is what makes the conductor resync from the snapshot.
            let mut announce = true;
            loop {
                if !announce && publisher.peek(1).is_empty() {
                    glommio::timer::sleep(FLUSH_EVERY).await;
                    continue;
                }
                let pushed;
                (client, pushed) = (|c| push(c, publisher.clone()))
                    .retry(BACKOFF)
                    .sleep(glommio::timer::sleep)
                    .when(|e| matches!(e, PushError::Unreachable))
                    .context(client)
                    .await;
                match pushed {
                    Ok((sent, last)) => {
                        publisher.acknowledge(last);
                        announce = false;
                        shard.metrics.events_published.add(sent as u64);
                    }
                    Err(_) => break, // refused: register again, at once
                }
            }
        }
    })
    .detach();
}

/// One attempt at `POST /v1/nodes`. The client goes in and comes back out, for `backon`'s
/// retries with a context.
async fn register(mut client: Client, body: Vec<u8>) -> (Client, Result<(), ()>) {
    let registered = match client
        .send(http::Method::POST, "/v1/nodes", Some(body))
        .await
    {
        Ok(r) if (200..300).contains(&r.status) => Ok(()),
        Ok(r) => {
            tracing::warn!(
                status = r.status,
                "the conductor refused the node registration"
            );
            Err(())
        }
        Err(e) => {
            tracing::debug!(error = %e, "cannot reach the conductor");
            Err(())
        }
    };
    (client, registered)
}

/// Why a push of events did not go through.
enum PushError {
    /// No answer: push again after a delay.
    Unreachable,
    /// The conductor answered and refused (it restarted and forgot the node, say): register
    /// again first.
    Refused,
}

/// One attempt at pushing the oldest queued events (up to a batch; none to announce the
/// epoch). Answers how many it pushed and the last one's number.
async fn push(
    mut client: Client,
    publisher: Rc<Publisher>,
) -> (Client, Result<(usize, u64), PushError>) {
    let batch = publisher.peek(MAX_BATCH);
    let sent = batch.len();
    let last = batch.last().map_or(0, |e| e.seq);
    let body = KvEventBatch {
        node: publisher.node.clone(),
        epoch: publisher.epoch,
        events: batch,
    };
    let json = serde_json::to_vec(&body).unwrap_or_default();
    let pushed = match client
        .send(http::Method::POST, EVENTS_PATH, Some(json))
        .await
    {
        Ok(r) if (200..300).contains(&r.status) => Ok((sent, last)),
        Ok(r) => {
            tracing::warn!(status = r.status, body = %String::from_utf8_lossy(&r.body), "the conductor refused KV events; registering again");
            Err(PushError::Refused)
        }
        Err(e) => {
            tracing::debug!(error = %e, "cannot push KV events");
            Err(PushError::Unreachable)
        }
    };
    (client, pushed)
}

/// Shard 0: the snapshot at the current sequence number.
pub async fn snapshot(shard: &Rc<Shard>) -> Result<KvSnapshot, ShardError> {
    let (node, epoch, seq) = match &shard.publisher {
        Some(p) => (p.node.clone(), p.epoch, p.last_seq()),
        None => (shard.settings.node_name.clone(), shard.settings.epoch, 0),
    };
    let parts = shard.broadcast(|s| s.tier.blocks()).await?;
    let mut groups: Vec<SnapshotGroup> = Vec::new();
    for (bucket, tier, blocks) in parts.into_iter().flatten() {
        match groups
            .iter_mut()
            .find(|g| g.bucket == bucket && g.tier == tier)
        {
            Some(g) => g.blocks.extend(blocks),
            None => groups.push(SnapshotGroup {
                bucket,
                tier,
                blocks,
            }),
        }
    }
    Ok(KvSnapshot {
        node,
        epoch,
        seq,
        groups,
    })
}
