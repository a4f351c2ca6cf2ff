//! The admin API (`/admin/...`, admin users and admin tokens only): for now the KV snapshot the conductor
//! resyncs from.

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use http_body_util::Full;
use yutu_api::S3ErrorCode;

use super::ctx::Ctx;
use super::error::S3Error;
use super::Resp;

fn json(value: &impl serde::Serialize) -> Result<Resp, S3Error> {
    let body = serde_json::to_vec(value).map_err(|e| {
        tracing::error!(error = %e, "cannot encode an admin answer");
        S3Error::new(S3ErrorCode::InternalError)
    })?;
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_default())
}

pub async fn route(ctx: &Ctx) -> Result<Resp, S3Error> {
    if !ctx.identity().is_admin() {
        return Err(S3Error::new(S3ErrorCode::AccessDenied)
            .msg("The admin API needs an admin user or an admin token."));
    }
    // The target's key is the path after `/admin/`.
    let snapshot = yutu_api::events::SNAPSHOT_PATH.strip_prefix("/admin/");
    match (&ctx.method, ctx.target.key.as_deref()) {
        (&Method::GET, key) if key.is_some() && key == snapshot => {
            let snapshot = ctx
                .shard
                .run_async(0, |s| async move { crate::events::snapshot(&s).await })
                .await??;
            json(&snapshot)
        }
        _ => Err(S3Error::new(S3ErrorCode::InvalidRequest).msg("Unknown admin endpoint.")),
    }
}
