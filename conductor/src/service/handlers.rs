//! Request dispatch and the endpoint handlers (see the table in [`super`]).

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use serde::de::DeserializeOwned;
use serde::Serialize;
use yutu_api::events::KvEventBatch;
use yutu_api::route::{InstanceRegistration, LoadReport, NodeRegistration, RouteRequest};
use yutu_api::token::ConductorScope;

use super::{resync, Shared};
use crate::registry::RegistryError;
use crate::routing::RouteError;

type Reply = Response<Full<Bytes>>;

fn reply(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Reply {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    if let Ok(v) = http::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    r
}

fn json<T: Serialize>(status: StatusCode, value: &T) -> Reply {
    match serde_json::to_vec(value) {
        Ok(body) => reply(status, "application/json", body),
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            &e.to_string(),
        ),
    }
}

fn error(status: StatusCode, code: &str, message: &str) -> Reply {
    json(
        status,
        &serde_json::json!({"error": code, "message": message}),
    )
}

fn empty(status: StatusCode) -> Reply {
    reply(status, "text/plain", Bytes::new())
}

fn registry_error(e: &RegistryError) -> Reply {
    match e {
        RegistryError::Unknown(_) => {
            error(StatusCode::NOT_FOUND, "unknown_instance", &e.to_string())
        }
        RegistryError::Full(_) | RegistryError::TooManyNodes => {
            error(StatusCode::SERVICE_UNAVAILABLE, "full", &e.to_string())
        }
        RegistryError::RoleChange { .. } => error(StatusCode::CONFLICT, "conflict", &e.to_string()),
        _ => error(StatusCode::BAD_REQUEST, "bad_request", &e.to_string()),
    }
}

/// Reads a JSON body of at most the configured size.
async fn body<T: DeserializeOwned>(shared: &Shared, req: Request<Incoming>) -> Result<T, Reply> {
    let limited = Limited::new(req.into_body(), shared.limits.max_body_bytes);
    let bytes = match limited.collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) => {
            return Err(if e.is::<http_body_util::LengthLimitError>() {
                error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "too_large",
                    &format!("body over {} bytes", shared.limits.max_body_bytes),
                )
            } else {
                error(StatusCode::BAD_REQUEST, "bad_body", &e.to_string())
            })
        }
    };
    serde_json::from_slice(&bytes)
        .map_err(|e| error(StatusCode::BAD_REQUEST, "bad_json", &e.to_string()))
}

/// Dispatches one request.
pub(super) async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Reply {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let scope = match segments.as_slice() {
        ["v1", "route" | "instances", ..] => Some(ConductorScope::Route),
        ["v1", ..] => Some(ConductorScope::Events),
        _ => None,
    };
    if let Some(scope) = scope {
        if let Err((status, code, message)) = shared.auth.check(req.headers(), scope) {
            tracing::debug!(%method, %path, status = status.as_u16(), "refused");
            return error(status, code, &message);
        }
    }
    let result = match (&method, segments.as_slice()) {
        (&Method::GET, ["health"]) => Ok(reply(StatusCode::OK, "text/plain", "ok\n")),
        (&Method::GET, ["metrics"]) => {
            let now = shared.now_ms();
            let text = crate::metrics::render(&shared.core(), now);
            Ok(reply(StatusCode::OK, prometheus::TEXT_FORMAT, text))
        }
        (&Method::POST, ["v1", "route"]) => route(&shared, req).await,
        (&Method::POST, ["v1", "events"]) => events(&shared, req).await,
        (&Method::POST, ["v1", "nodes"]) => register_node(&shared, req).await,
        (&Method::GET, ["v1", "nodes"]) => Ok(json(StatusCode::OK, &shared.core().node_status())),
        (&Method::POST, ["v1", "instances"]) => register_instance(&shared, req).await,
        (&Method::GET, ["v1", "instances"]) => {
            let now = shared.now_ms();
            Ok(json(StatusCode::OK, &shared.core().instance_status(now)))
        }
        (&Method::DELETE, ["v1", "instances", id]) => {
            Ok(if shared.core().deregister_instance(id) {
                empty(StatusCode::NO_CONTENT)
            } else {
                registry_error(&RegistryError::Unknown((*id).to_owned()))
            })
        }
        (&Method::POST, ["v1", "instances", id, "heartbeat"]) => {
            let id = (*id).to_owned();
            let now = shared.now_ms();
            Ok(match shared.core().heartbeat(&id, now) {
                Ok(()) => empty(StatusCode::NO_CONTENT),
                Err(e) => registry_error(&e),
            })
        }
        (&Method::POST, ["v1", "instances", id, "load"]) => {
            let id = (*id).to_owned();
            load(&shared, req, &id).await
        }
        (_, ["health" | "metrics"])
        | (_, ["v1", "route" | "events" | "nodes" | "instances", ..]) => Ok(error(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "method not allowed",
        )),
        _ => Ok(error(
            StatusCode::NOT_FOUND,
            "not_found",
            "no such endpoint",
        )),
    };
    let reply = result.unwrap_or_else(|r| r);
    tracing::debug!(%method, %path, status = reply.status().as_u16(), "request");
    reply
}

async fn route(shared: &Shared, req: Request<Incoming>) -> Result<Reply, Reply> {
    let request: RouteRequest = body(shared, req).await?;
    let now = shared.now_ms();
    let mut core = shared.core();
    let started = Instant::now();
    let result = core.route_request(&request, now);
    core.stats.observe_route(started.elapsed().as_secs_f64());
    drop(core);
    Ok(match result {
        Ok(decision) => json(StatusCode::OK, &decision),
        Err(RouteError::Rejected(reject)) => {
            let status = StatusCode::from_u16(reject.reason.status())
                .unwrap_or(StatusCode::TOO_MANY_REQUESTS);
            json(status, &reject)
        }
        Err(e @ RouteError::BadRequest(_)) => {
            error(StatusCode::BAD_REQUEST, "bad_request", &e.to_string())
        }
    })
}

async fn events(shared: &Arc<Shared>, req: Request<Incoming>) -> Result<Reply, Reply> {
    let batch: KvEventBatch = body(shared, req).await?;
    let outcome = {
        let mut core = shared.core();
        // Without a URL a gap could never be repaired: have the node register (it does so
        // when its push is refused) and send the batch again. This is also how nodes learn
        // that the conductor restarted.
        let known = core
            .node_id(&batch.node)
            .and_then(|id| core.node_url(id))
            .is_some();
        if !known {
            return Err(error(
                StatusCode::CONFLICT,
                "register_first",
                &format!(
                    "node {:?} is not registered with a URL: POST /v1/nodes first",
                    batch.node
                ),
            ));
        }
        core.ingest(&batch)
    };
    match outcome {
        Ok(o) => {
            if let Some(r) = o.batch.resync {
                tracing::info!(node = %batch.node, reason = r.reason.as_str(), "node resync started");
                resync::spawn(shared.clone(), o.node, r.generation);
            }
            Ok(json(
                StatusCode::OK,
                &serde_json::json!({
                    "applied": o.batch.applied,
                    "duplicates": o.batch.duplicates,
                    "buffered": o.batch.buffered,
                    "stale": o.batch.stale,
                    "departed": o.batch.departed,
                    "resync": o.batch.resync.is_some(),
                }),
            ))
        }
        Err(e) => Err(error(StatusCode::BAD_REQUEST, "bad_events", &e.to_string())),
    }
}

async fn register_node(shared: &Arc<Shared>, req: Request<Incoming>) -> Result<Reply, Reply> {
    let reg: NodeRegistration = body(shared, req).await?;
    let result = shared.core().register_node(&reg.node, Some(&reg.url));
    match result {
        Ok((node, pending)) => {
            if let Some(generation) = pending {
                resync::spawn(shared.clone(), node, generation);
            }
            Ok(json(StatusCode::OK, &reg))
        }
        Err(e) => Err(registry_error(&e)),
    }
}

async fn register_instance(shared: &Arc<Shared>, req: Request<Incoming>) -> Result<Reply, Reply> {
    let reg: InstanceRegistration = body(shared, req).await?;
    let now = shared.now_ms();
    let result = shared.core().register_instance(&reg, now);
    match result {
        Ok((_, pending)) => {
            if let Some((node, generation)) = pending {
                resync::spawn(shared.clone(), node, generation);
            }
            Ok(json(StatusCode::OK, &reg))
        }
        Err(e) => Err(registry_error(&e)),
    }
}

async fn load(shared: &Shared, req: Request<Incoming>, id: &str) -> Result<Reply, Reply> {
    let report: LoadReport = body(shared, req).await?;
    let now = shared.now_ms();
    let result = shared.core().report_load(id, &report, now);
    match result {
        Ok(()) => Ok(empty(StatusCode::NO_CONTENT)),
        Err(e) => Err(registry_error(&e)),
    }
}
