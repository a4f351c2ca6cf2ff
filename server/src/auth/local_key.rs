//! The node's own token key, so that a node started without any configured key or user is
//! never open and its operator is never locked out.
//!
//! At the first start (unless `--no-auth`) the node draws 32 random bytes from the OS and
//! keeps them as 64 hex digits, the HS256 secret, in the data directory
//! ([`LOCAL_SECRET_FILE`], mode 0600) under the kid
//! [`LOCAL_KID`], and signs one admin token with it, which it prints and leaves in
//! [`FIRST_TOKEN_FILE`]. Later starts load the same secret, so tokens survive restarts;
//! `yutu token issue --data-dir DIR` signs more with it. Deleting the file revokes every token
//! it signed (a new secret is drawn at the next start).

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;
use std::time::Duration;

use yutu_api::token::{
    issue, parse_local_secret, Claims, SigningKey, TokenError, FIRST_TOKEN_FILE, LOCAL_KID,
    LOCAL_SECRET_FILE,
};

/// How long the first admin token lasts.
pub const FIRST_TOKEN_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// Why the local key cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum LocalKeyError {
    #[error("cannot {what} {path}: {source}")]
    Io {
        what: &'static str,
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Token(#[from] TokenError),
    #[error("cannot draw a random secret: {0}")]
    Random(String),
}

/// The local secret, and the first admin token when this call created the secret.
pub struct LocalKey {
    pub secret: Vec<u8>,
    pub first_token: Option<String>,
}

fn write_private(path: &Path, text: &str) -> Result<(), LocalKeyError> {
    let io = |what, source| LocalKeyError::Io {
        what,
        path: path.display().to_string(),
        source,
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| io("create", e))?;
    f.write_all(text.as_bytes()).map_err(|e| io("write", e))?;
    f.sync_all().map_err(|e| io("sync", e))
}

/// Loads the data directory's secret, or creates it (and the first admin token).
pub fn ensure(data_dir: &Path) -> Result<LocalKey, LocalKeyError> {
    let path = data_dir.join(LOCAL_SECRET_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            return Ok(LocalKey {
                secret: parse_local_secret(&text)?,
                first_token: None,
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(LocalKeyError::Io {
                what: "read",
                path: path.display().to_string(),
                source,
            })
        }
    }
    let dir = path.parent().unwrap_or(data_dir);
    std::fs::create_dir_all(dir).map_err(|source| LocalKeyError::Io {
        what: "create",
        path: dir.display().to_string(),
        source,
    })?;
    let mut random = [0u8; 32];
    getrandom::fill(&mut random).map_err(|e| LocalKeyError::Random(e.to_string()))?;
    let text = hex::encode(random);
    write_private(&path, &format!("{text}\n"))?;
    let secret = parse_local_secret(&text)?;
    let claims = Claims {
        admin: true,
        ..Claims::new("admin", FIRST_TOKEN_TTL)
    };
    let token = issue(&claims, LOCAL_KID, &SigningKey::Secret(secret.clone()))?;
    let token_path = data_dir.join(FIRST_TOKEN_FILE);
    let _ = std::fs::remove_file(&token_path);
    write_private(&token_path, &format!("{token}\n"))?;
    Ok(LocalKey {
        secret,
        first_token: Some(token),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use yutu_api::token::Keyring;

    #[test]
    fn the_first_start_makes_a_private_secret_and_an_admin_token_later_starts_reuse_it() {
        let dir = tempfile::tempdir().unwrap();
        let first = ensure(dir.path()).unwrap();
        let token = first.first_token.expect("a first token");
        let mode = std::fs::metadata(dir.path().join(LOCAL_SECRET_FILE))
            .unwrap()
            .permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
        let saved = std::fs::read_to_string(dir.path().join(FIRST_TOKEN_FILE)).unwrap();
        assert_eq!(saved.trim(), token);
        let again = ensure(dir.path()).unwrap();
        assert!(again.first_token.is_none());
        assert_eq!(again.secret, first.secret);
        let mut ring = Keyring::default();
        ring.add_secret(LOCAL_KID, &again.secret).unwrap();
        let claims = ring.verify(&token).unwrap();
        assert!(claims.admin && claims.sub == "admin");
    }
}
