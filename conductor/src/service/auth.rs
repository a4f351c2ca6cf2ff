//! Who may call the conductor: bearer tokens with conductor scopes.
//!
//! `POST /v1/route` and the instance endpoints (registration, heartbeats, load reports) need
//! the `route` scope: they are what routers and engines call. `/v1/events` and `/v1/nodes`
//! need `events`: they are what storage nodes call. An admin token may do both. `/health` and
//! `/metrics` answer anyone. Tokens are the nodes' own format (`yutu_api::token`), so one
//! issuer serves both.

use hyper::header::AUTHORIZATION;
use hyper::{HeaderMap, StatusCode};
use yutu_api::token::{ConductorScope, Keyring, TokenError, BEARER};

/// The service's authentication.
#[derive(Debug, Clone, Default)]
pub struct ServiceAuth {
    /// `None`: every caller is allowed (`--no-auth`).
    pub keyring: Option<Keyring>,
    /// Sent as a bearer token to nodes when fetching their snapshots.
    pub node_token: Option<String>,
    /// Certificates trusted for nodes that serve HTTPS (PEM); `None`: the public web roots.
    pub node_ca_pem: Option<Vec<u8>>,
}

/// Why a call is refused: the status, an error code and a message.
pub type Refusal = (StatusCode, &'static str, String);

impl ServiceAuth {
    /// Whether the request's token allows `scope`.
    pub fn check(&self, headers: &HeaderMap, scope: ConductorScope) -> Result<(), Refusal> {
        let Some(keyring) = &self.keyring else {
            return Ok(());
        };
        let unauthorized = |code, message: String| (StatusCode::UNAUTHORIZED, code, message);
        let token = headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                (v.len() > BEARER.len() && v[..BEARER.len()].eq_ignore_ascii_case(BEARER))
                    .then(|| v[BEARER.len()..].trim())
            })
            .ok_or_else(|| {
                unauthorized(
                    "unauthorized",
                    "send a bearer token (Authorization: Bearer ...)".into(),
                )
            })?;
        let claims = keyring.verify(token).map_err(|e| match e {
            TokenError::Expired => unauthorized("expired_token", e.to_string()),
            _ => unauthorized("invalid_token", e.to_string()),
        })?;
        if claims.conductor_allows(scope) {
            Ok(())
        } else {
            Err((
                StatusCode::FORBIDDEN,
                "access_denied",
                format!("the token lacks the conductor scope {scope:?}"),
            ))
        }
    }
}
