//! A running node: the runtime's shards with the HTTP service and KV event publishing on
//! each of them. The one place that knows every layer.

use std::sync::Arc;

use crate::auth::tokens::TokenVerifier;
use crate::config::Settings;
use crate::http::service::Listening;
use crate::node::runtime::{self, Node, Serve, StartError};
use crate::node::shutdown::StopFlag;

/// How long a stopping node waits for its cluster agent to revoke its lease: the agent's own
/// deadline, and a little more for its last try to end.
const LEAVE_DEADLINE: std::time::Duration =
    crate::cluster::agent::LEAVE_DEADLINE.saturating_add(std::time::Duration::from_secs(1));

/// Starts the node described by `settings`; returns once every shard accepts connections.
/// Raising `stop` drains and stops it.
pub fn start(mut settings: Settings, stop: StopFlag) -> Result<Node, StartError> {
    // Before any copy: the helpers are made on the first large one.
    if !yutu_transfer::split_copy::set_threads(settings.copy_threads) {
        tracing::warn!(
            copy_threads = settings.copy_threads,
            "copy helpers already running in this process; --copy-threads left as it was"
        );
    }
    let tls = match &settings.tls {
        Some((cert, key)) => {
            Some(crate::net::tls::acceptor(cert, key).map_err(|e| StartError::Tls(e.to_string()))?)
        }
        None => None,
    };
    // One verifier (and cache of verified tokens) for all shards.
    let cluster = crate::cluster::Cluster::new(&settings);
    // The KV frame sockets: chosen (and the TCP ones bound) before the shards start, so every
    // shard can answer where all of them are.
    let frames = crate::http::kv::frames::plan(&settings).map_err(|source| StartError::Listen {
        addr: settings.listen,
        source,
    })?;
    settings.frames = frames.info;
    let frames_tcp = frames.tcp;
    let listening = Listening {
        tokens: Arc::new(TokenVerifier::new(settings.keyring.clone())),
        tls,
        cluster: cluster.clone(),
    };
    let serve: Serve = Arc::new(move |shard, listener| {
        let listening = listening.clone();
        let frames_tcp = frames_tcp.clone();
        Box::pin(async move {
            let settings = shard.settings.clone();
            // Where the conductor and the other nodes reach this node.
            let scheme = if settings.tls.is_some() {
                "https"
            } else {
                "http"
            };
            let advertise = settings.advertise_url.clone().unwrap_or_else(|| {
                format!(
                    "{scheme}://{}",
                    listener
                        .local_addr()
                        .map(|a| a.to_string())
                        .unwrap_or_default()
                )
            });
            if let Some(conductor) = &settings.conductor {
                crate::events::spawn_flusher(shard.clone());
                if shard.id == 0 {
                    crate::events::spawn_pusher(
                        shard.clone(),
                        conductor.clone(),
                        advertise.clone(),
                    );
                }
            }
            // Shard 0's cluster agent: waited for after the listener closes, so that it has
            // revoked the node's lease before the shard's executor ends (a detached agent
            // could be dropped mid-revoke, and the record would then outlive the node by a
            // whole lease).
            let mut agent = None;
            if let (Some(cluster), 0) = (&listening.cluster, shard.id) {
                let url = advertise;
                let transfer = shard
                    .transfer
                    .as_ref()
                    .and_then(|(engine, _)| engine.address().tcp)
                    .map(|a| a.to_string());
                let me = crate::cluster::agent::member(
                    &shard,
                    cluster,
                    url,
                    transfer,
                    cluster.settings.zone.clone(),
                );
                agent = Some(glommio::spawn_local(crate::cluster::agent::run(
                    shard.clone(),
                    cluster.clone(),
                    me,
                )));
                glommio::spawn_local(crate::cluster::rebalance::run(
                    shard.clone(),
                    cluster.clone(),
                ))
                .detach();
                glommio::spawn_local(crate::cluster::sync::run(shard.clone(), cluster.clone()))
                    .detach();
            }
            let tcp = frames_tcp
                .lock()
                .ok()
                .and_then(|mut l| l.get_mut(shard.id).and_then(Option::take));
            glommio::spawn_local(crate::http::kv::frames::serve(
                shard.clone(),
                listening.clone(),
                tcp,
            ))
            .detach();
            crate::http::service::accept_loop(shard, listener, listening).await;
            if let Some(agent) = agent {
                let left = futures_lite::future::or(
                    async {
                        agent.await;
                        true
                    },
                    async {
                        glommio::timer::sleep(LEAVE_DEADLINE).await;
                        false
                    },
                )
                .await;
                if !left {
                    tracing::warn!("stopping before the cluster agent left (etcd is slow)");
                }
            }
        })
    });
    runtime::start(settings, serve, stop)
}
