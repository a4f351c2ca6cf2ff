//! Bearer-token verification for the node, with a cache of tokens already verified.
//!
//! Checking a signature costs microseconds (HS256) to tens of microseconds (RS256) — as much as
//! serving a small GET — and an engine sends the same token with every call, so verified
//! tokens are kept (by a hash of the token, at most [`CACHE_ENTRIES`], each for at most
//! [`CACHE_TTL`]) in a `moka` cache the shards share. A cached token is still checked against
//! the clock on every use, so it stops working at its `exp` like any other.

use std::sync::Arc;
use std::time::Duration;

use yutu_api::token::{unix_now, Claims, Keyring, TokenError};
use yutu_api::S3ErrorCode;

use super::AuthError;

/// Most verified tokens remembered.
pub const CACHE_ENTRIES: u64 = 10_000;
/// Longest a verified token is remembered before its signature is checked again.
pub const CACHE_TTL: Duration = Duration::from_secs(300);

/// The node's keyring and its cache of verified tokens.
#[derive(Debug)]
pub struct TokenVerifier {
    keyring: Keyring,
    cache: moka::sync::Cache<[u8; 32], Arc<Claims>>,
}

/// The error a refused token is answered with: 401 in every case.
fn refusal(e: TokenError) -> AuthError {
    let code = match e {
        TokenError::Expired => S3ErrorCode::ExpiredToken,
        _ => S3ErrorCode::InvalidToken,
    };
    AuthError::new(code).msg(format!("{e}."))
}

impl TokenVerifier {
    pub fn new(keyring: Keyring) -> TokenVerifier {
        TokenVerifier {
            keyring,
            cache: moka::sync::Cache::builder()
                .max_capacity(CACHE_ENTRIES)
                .time_to_live(CACHE_TTL)
                .build(),
        }
    }

    /// Whether claims verified earlier are still valid now (`exp` and `nbf`, with the
    /// leeway): what a cached token is checked against on every use.
    pub fn still_valid(&self, claims: &Claims) -> Result<(), AuthError> {
        claims.valid_at(unix_now()).map_err(refusal)
    }

    /// The claims of `token`, if it verifies and is valid now.
    pub fn verify(&self, token: &str) -> Result<Arc<Claims>, AuthError> {
        let key = *blake3::hash(token.as_bytes()).as_bytes();
        let now = unix_now();
        if let Some(claims) = self.cache.get(&key) {
            claims.valid_at(now).map_err(refusal)?;
            return Ok(claims);
        }
        let claims = Arc::new(self.keyring.verify(token).map_err(refusal)?);
        self.cache.insert(key, claims.clone());
        Ok(claims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use yutu_api::token::{issue, SigningKey};

    #[test]
    fn verified_tokens_are_cached_but_still_expire() {
        let secret = vec![9u8; 32];
        let mut ring = Keyring::default();
        ring.add_secret("k", &secret).unwrap();
        let v = TokenVerifier::new(ring);
        let claims = |exp| Claims {
            exp,
            ..Claims::new("s", Duration::from_secs(1))
        };
        let t = issue(
            &claims(unix_now() + 60),
            "k",
            &SigningKey::Secret(secret.clone()),
        )
        .unwrap();
        assert_eq!(v.verify(&t).unwrap().sub, "s");
        assert_eq!(v.verify(&t).unwrap().sub, "s");
        // A cached entry past its exp is refused (planted, as waiting for the clock would be
        // a sleep).
        let old = "an old token";
        v.cache.insert(
            *blake3::hash(old.as_bytes()).as_bytes(),
            Arc::new(claims(unix_now() - 60)),
        );
        assert_eq!(v.verify(old).unwrap_err().code, S3ErrorCode::ExpiredToken);
        assert_eq!(
            v.verify("x.y.z").unwrap_err().code,
            S3ErrorCode::InvalidToken
        );
    }
}
