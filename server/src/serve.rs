//! A running node: the runtime's shards with the HTTP service and KV event publishing on
//! each of them. The one place that knows every layer.

use std::sync::Arc;

use crate::auth::tokens::TokenVerifier;
use crate::config::Settings;
use crate::node::runtime::{self, Node, Serve, StartError};
use crate::node::shutdown::StopFlag;

/// Starts the node described by `settings`; returns once every shard accepts connections.
/// Raising `stop` drains and stops it.
pub fn start(settings: Settings, stop: StopFlag) -> Result<Node, StartError> {
    // One verifier (and cache of verified tokens) for all shards.
    let tokens = Arc::new(TokenVerifier::new(settings.keyring.clone()));
    let serve: Serve = Arc::new(move |shard, listener| {
        let tokens = tokens.clone();
        Box::pin(async move {
            let settings = shard.settings.clone();
            if let Some(conductor) = &settings.conductor {
                crate::events::spawn_flusher(shard.clone());
                if shard.id == 0 {
                    let advertise = settings.advertise_url.clone().unwrap_or_else(|| {
                        format!(
                            "http://{}",
                            listener
                                .local_addr()
                                .map(|a| a.to_string())
                                .unwrap_or_default()
                        )
                    });
                    crate::events::spawn_pusher(shard.clone(), conductor.clone(), advertise);
                }
            }
            crate::http::service::accept_loop(shard, listener, tokens).await;
        })
    });
    runtime::start(settings, serve, stop)
}
