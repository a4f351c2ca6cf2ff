//! Bearer tokens: signed JWTs that say who the holder is and what it may touch.
//!
//! A token is `Authorization: Bearer <jwt>`. Its header names the signing key (`kid`); its
//! claims ([`Claims`]) carry the subject, the validity window (`exp` required, `nbf`, `iat`)
//! and the scopes: per bucket or bucket prefix the operations allowed (`r`ead, `w`rite,
//! `d`elete, `l`ist), `admin` (everything), and the conductor's (`route`, `events`). A node or
//! conductor verifies it against a [`Keyring`]: several keys at once, selected by `kid`, so a
//! new key can be added before the old one is retired (rotation without downtime). HS256
//! keys are shared secrets; EdDSA and RS256 keys are public keys whose private halves stay
//! with whoever issues tokens.
//!
//! Signing and verification are `jsonwebtoken`'s; this module fixes what Yutu accepts: only
//! the algorithm of the key the `kid` names (never `none`, never a symmetric algorithm over a
//! public key), `exp` always required, five seconds of clock leeway.

use std::collections::HashMap;
use std::fmt;

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

/// Clock skew tolerated on `exp` and `nbf`, in seconds.
pub const LEEWAY_SECS: u64 = 5;

/// The HTTP header scheme: `Authorization: Bearer <token>`.
pub const BEARER: &str = "Bearer ";

/// The `kid` of the key a node generates for itself in its data directory.
pub const LOCAL_KID: &str = "local";
/// Where, under the data directory, that key's secret is kept (hex, mode 0600); `yutu token
/// issue --data-dir` signs with it.
pub const LOCAL_SECRET_FILE: &str = "auth/token-secret";
/// Where, under the data directory, the first start leaves its admin token (mode 0600).
pub const FIRST_TOKEN_FILE: &str = "auth/admin-token";

/// Reads the text of [`LOCAL_SECRET_FILE`]: 64 hex digits, whose text (not the bytes they
/// encode) is the HS256 secret, so the same line can be given as the `secret` of a
/// `[[token_keys]]` entry (kid [`LOCAL_KID`]) to a conductor or another node.
pub fn parse_local_secret(text: &str) -> Result<Vec<u8>, TokenError> {
    let text = text.trim();
    if text.len() != 64 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(TokenError::Key {
            kid: LOCAL_KID.into(),
            message: "the secret file must hold 64 hex digits".into(),
        });
    }
    Ok(text.as_bytes().to_vec())
}

/// A `[[token_keys]]` table of a node's or the conductor's config file: a key bearer tokens
/// may be signed with, named by the tokens' `kid`. Several at once let a new key come in
/// before the old one goes (rotation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyConfig {
    pub kid: String,
    /// `HS256` (a shared secret), `EdDSA` or `RS256` (a public key).
    #[serde(default = "default_algorithm")]
    pub alg: KeyAlgorithm,
    /// HS256: the secret, at least 32 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// EdDSA/RS256: the public key in PEM...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_key: Option<String>,
    /// ...or the file holding it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_key_file: Option<std::path::PathBuf>,
    /// The `iss` a token signed with this key must carry (an identity provider's key: a
    /// token it minted for another service is refused). Unset: not checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
    /// The audiences, one of which a token signed with this key must name in `aud`. Empty:
    /// not checked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub audience: Vec<String>,
}

fn default_algorithm() -> KeyAlgorithm {
    KeyAlgorithm::HS256
}

impl KeyConfig {
    /// Adds the key to `ring`; `read` reads `public_key_file` (this crate does no I/O).
    pub fn add_to(
        &self,
        ring: &mut Keyring,
        read: impl Fn(&std::path::Path) -> std::io::Result<Vec<u8>>,
    ) -> Result<(), TokenError> {
        let bad = |message: String| TokenError::Key {
            kid: self.kid.clone(),
            message,
        };
        let added = match (
            self.alg,
            &self.secret,
            &self.public_key,
            &self.public_key_file,
        ) {
            (KeyAlgorithm::HS256, Some(secret), None, None) => {
                ring.add_secret(&self.kid, secret.as_bytes())
            }
            (KeyAlgorithm::HS256, ..) => {
                Err(bad("an HS256 key has a secret and nothing else".into()))
            }
            (alg, None, Some(pem), None) => ring.add_public_pem(&self.kid, alg, pem.as_bytes()),
            (alg, None, None, Some(path)) => {
                let pem =
                    read(path).map_err(|e| bad(format!("cannot read {}: {e}", path.display())))?;
                ring.add_public_pem(&self.kid, alg, &pem)
            }
            _ => Err(bad(
                "an EdDSA or RS256 key has public_key or public_key_file, not a secret".into(),
            )),
        };
        added?;
        ring.expect(&self.kid, self.issuer.clone(), self.audience.clone())
    }
}

/// Operations a bucket scope may allow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Access {
    pub read: bool,
    pub write: bool,
    pub delete: bool,
    pub list: bool,
}

impl Access {
    pub const ALL: Access = Access {
        read: true,
        write: true,
        delete: true,
        list: true,
    };

    /// Parses letters out of `rwdl` (each at most once, at least one).
    pub fn parse(s: &str) -> Result<Access, TokenError> {
        let mut a = Access::default();
        for c in s.chars() {
            let slot = match c {
                'r' => &mut a.read,
                'w' => &mut a.write,
                'd' => &mut a.delete,
                'l' => &mut a.list,
                _ => {
                    return Err(TokenError::Scope(format!(
                        "access {s:?}: use the letters r (read), w (write), d (delete), l (list)"
                    )))
                }
            };
            if *slot {
                return Err(TokenError::Scope(format!("access {s:?} repeats {c:?}")));
            }
            *slot = true;
        }
        if a == Access::default() {
            return Err(TokenError::Scope(
                "an access names at least one of rwdl".into(),
            ));
        }
        Ok(a)
    }

    /// Whether every operation `other` allows is allowed here.
    pub fn covers(self, other: Access) -> bool {
        (self.read || !other.read)
            && (self.write || !other.write)
            && (self.delete || !other.delete)
            && (self.list || !other.list)
    }
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (on, c) in [
            (self.read, 'r'),
            (self.write, 'w'),
            (self.delete, 'd'),
            (self.list, 'l'),
        ] {
            if on {
                write!(f, "{c}")?;
            }
        }
        Ok(())
    }
}

impl Serialize for Access {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Access {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Access, D::Error> {
        let s = String::deserialize(d)?;
        Access::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// What a token may do to the buckets one pattern names: `name` exactly, or every bucket
/// starting with `prefix` when the pattern is `prefix*`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BucketScope {
    pub bucket: String,
    pub access: Access,
}

impl BucketScope {
    /// Parses the command-line form `PATTERN:rwdl` (e.g. `logs-*:rl`).
    pub fn parse(s: &str) -> Result<BucketScope, TokenError> {
        let (bucket, access) = s.rsplit_once(':').ok_or_else(|| {
            TokenError::Scope(format!("{s:?}: expected BUCKET:ACCESS, e.g. models:rl"))
        })?;
        let pattern = bucket.strip_suffix('*').unwrap_or(bucket);
        if pattern.contains('*') || (bucket.is_empty()) {
            return Err(TokenError::Scope(format!(
                "{s:?}: a bucket pattern is a name, or a prefix followed by one final *"
            )));
        }
        Ok(BucketScope {
            bucket: bucket.to_string(),
            access: Access::parse(access)?,
        })
    }

    /// Whether the pattern names `bucket`.
    pub fn matches(&self, bucket: &str) -> bool {
        match self.bucket.strip_suffix('*') {
            Some(prefix) => bucket.starts_with(prefix),
            None => self.bucket == bucket,
        }
    }
}

/// What the conductor lets a token do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ConductorScope {
    /// Ask for routing decisions.
    Route,
    /// Publish KV events and have the conductor fetch snapshots (what nodes do).
    Events,
}

impl ConductorScope {
    pub fn parse(s: &str) -> Result<ConductorScope, TokenError> {
        match s {
            "route" => Ok(ConductorScope::Route),
            "events" => Ok(ConductorScope::Events),
            _ => Err(TokenError::Scope(format!(
                "conductor scope {s:?}: use route or events"
            ))),
        }
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// A token's claims.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// Who holds it: recorded as the owner of buckets it creates and the holder of its leases.
    pub sub: String,
    /// Expiry, seconds since the Unix epoch (required).
    pub exp: u64,
    /// Not valid before, seconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbf: Option<u64>,
    /// Issued at, seconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iat: Option<u64>,
    /// Full access to every bucket and the admin API.
    #[serde(default, skip_serializing_if = "is_false")]
    pub admin: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub buckets: Vec<BucketScope>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conductor: Vec<ConductorScope>,
    /// Who minted it; checked when its key names an `issuer`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iss: Option<String>,
    /// Whom it is for (one name or a list); checked when its key names an `audience`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aud: Option<Audience>,
}

/// A token's `aud`: JWT allows one string or a list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Audience {
    One(String),
    Many(Vec<String>),
}

/// Seconds since the Unix epoch now (0 if the clock is before 1970): what `exp`, `nbf` and
/// `iat` count in.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Claims {
    /// Claims for `sub`, issued now and valid for `lifetime` (at least a second), allowing
    /// nothing yet: set `admin`, `buckets` or `conductor` with struct update syntax.
    pub fn new(sub: &str, lifetime: std::time::Duration) -> Claims {
        let now = unix_now();
        Claims {
            sub: sub.to_string(),
            exp: now + lifetime.as_secs().max(1),
            nbf: None,
            iat: Some(now),
            admin: false,
            buckets: Vec::new(),
            conductor: Vec::new(),
            iss: None,
            aud: None,
        }
    }

    /// What the token allows on `bucket`: the union of every scope naming it (everything for
    /// an admin token).
    pub fn access(&self, bucket: &str) -> Access {
        if self.admin {
            return Access::ALL;
        }
        self.buckets
            .iter()
            .filter(|s| s.matches(bucket))
            .fold(Access::default(), |a, s| Access {
                read: a.read || s.access.read,
                write: a.write || s.access.write,
                delete: a.delete || s.access.delete,
                list: a.list || s.access.list,
            })
    }

    /// Whether the token may use the conductor for `scope`.
    pub fn conductor_allows(&self, scope: ConductorScope) -> bool {
        self.admin || self.conductor.contains(&scope)
    }

    /// Whether the token is valid at `now` (seconds since the epoch), with the leeway.
    pub fn valid_at(&self, now: u64) -> Result<(), TokenError> {
        if now > self.exp.saturating_add(LEEWAY_SECS) {
            return Err(TokenError::Expired);
        }
        if self.nbf.is_some_and(|nbf| now + LEEWAY_SECS < nbf) {
            return Err(TokenError::NotYetValid);
        }
        Ok(())
    }
}

/// Why a token is refused or cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("the token is malformed: {0}")]
    Malformed(String),
    #[error("the token has expired")]
    Expired,
    #[error("the token is not valid yet")]
    NotYetValid,
    #[error("the token's signature does not verify")]
    BadSignature,
    #[error("the token names no key this server knows (kid {0:?})")]
    UnknownKey(Option<String>),
    #[error("the token's algorithm {0} is not its key's")]
    WrongAlgorithm(String),
    #[error("the token's issuer (iss) is missing or not the one its key is for")]
    WrongIssuer,
    #[error("the token's audience (aud) is missing or does not name this service")]
    WrongAudience,
    #[error("invalid scope: {0}")]
    Scope(String),
    #[error("invalid key {kid:?}: {message}")]
    Key { kid: String, message: String },
}

/// The algorithms a key may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum KeyAlgorithm {
    HS256,
    EdDSA,
    RS256,
}

impl KeyAlgorithm {
    fn jwt(self) -> Algorithm {
        match self {
            KeyAlgorithm::HS256 => Algorithm::HS256,
            KeyAlgorithm::EdDSA => Algorithm::EdDSA,
            KeyAlgorithm::RS256 => Algorithm::RS256,
        }
    }
}

/// The keys tokens may be signed with, by `kid`.
#[derive(Clone, Default)]
pub struct Keyring {
    keys: HashMap<String, (KeyAlgorithm, DecodingKey)>,
    /// Per kid: the issuer and audiences its tokens must carry (keys of identity providers;
    /// the node's own and the cluster's keys have none).
    expected: HashMap<String, (Option<String>, Vec<String>)>,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut kids: Vec<_> = self.keys.iter().map(|(k, (a, _))| (k, a)).collect();
        kids.sort();
        f.debug_struct("Keyring").field("keys", &kids).finish()
    }
}

impl Keyring {
    /// Adds an HS256 secret (at least 32 bytes).
    pub fn add_secret(&mut self, kid: &str, secret: &[u8]) -> Result<(), TokenError> {
        if secret.len() < 32 {
            return Err(TokenError::Key {
                kid: kid.into(),
                message: "an HS256 secret has at least 32 bytes".into(),
            });
        }
        self.insert(kid, KeyAlgorithm::HS256, DecodingKey::from_secret(secret))
    }

    /// Adds an EdDSA or RS256 public key in PEM.
    pub fn add_public_pem(
        &mut self,
        kid: &str,
        alg: KeyAlgorithm,
        pem: &[u8],
    ) -> Result<(), TokenError> {
        let key = match alg {
            KeyAlgorithm::EdDSA => DecodingKey::from_ed_pem(pem),
            KeyAlgorithm::RS256 => DecodingKey::from_rsa_pem(pem),
            KeyAlgorithm::HS256 => {
                return Err(TokenError::Key {
                    kid: kid.into(),
                    message: "HS256 keys are secrets, not public keys".into(),
                })
            }
        }
        .map_err(|e| TokenError::Key {
            kid: kid.into(),
            message: e.to_string(),
        })?;
        self.insert(kid, alg, key)
    }

    fn insert(&mut self, kid: &str, alg: KeyAlgorithm, key: DecodingKey) -> Result<(), TokenError> {
        if kid.is_empty() || self.keys.contains_key(kid) {
            return Err(TokenError::Key {
                kid: kid.into(),
                message: "every key needs a kid of its own".into(),
            });
        }
        self.keys.insert(kid.to_string(), (alg, key));
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Makes tokens signed with `kid` carry `issuer` as `iss` (when set) and name one of
    /// `audience` in `aud` (when not empty).
    pub fn expect(
        &mut self,
        kid: &str,
        issuer: Option<String>,
        audience: Vec<String>,
    ) -> Result<(), TokenError> {
        if !self.keys.contains_key(kid) {
            return Err(TokenError::Key {
                kid: kid.into(),
                message: "no such key".into(),
            });
        }
        if issuer.as_deref() == Some("") || audience.iter().any(String::is_empty) {
            return Err(TokenError::Key {
                kid: kid.into(),
                message: "an issuer or audience cannot be empty".into(),
            });
        }
        if issuer.is_some() || !audience.is_empty() {
            self.expected.insert(kid.to_string(), (issuer, audience));
        }
        Ok(())
    }

    /// Verifies `token` (signature, algorithm, `exp`, `nbf`) and returns its claims.
    pub fn verify(&self, token: &str) -> Result<Claims, TokenError> {
        let header =
            jsonwebtoken::decode_header(token).map_err(|e| TokenError::Malformed(e.to_string()))?;
        let (alg, key) = header
            .kid
            .as_deref()
            .and_then(|kid| self.keys.get(kid))
            .ok_or_else(|| TokenError::UnknownKey(header.kid.clone()))?;
        if header.alg != alg.jwt() {
            return Err(TokenError::WrongAlgorithm(format!("{:?}", header.alg)));
        }
        let mut validation = Validation::new(alg.jwt());
        validation.leeway = LEEWAY_SECS;
        validation.validate_nbf = true;
        validation.validate_aud = false;
        let mut required = vec!["exp", "sub"];
        if let Some((issuer, audience)) = header.kid.as_deref().and_then(|k| self.expected.get(k)) {
            if let Some(iss) = issuer {
                validation.set_issuer(&[iss]);
                required.push("iss");
            }
            if !audience.is_empty() {
                validation.set_audience(audience);
                validation.validate_aud = true;
                required.push("aud");
            }
        }
        validation.set_required_spec_claims(&required);
        jsonwebtoken::decode::<Claims>(token, key, &validation)
            .map(|data| data.claims)
            .map_err(|e| {
                use jsonwebtoken::errors::ErrorKind;
                match e.kind() {
                    ErrorKind::ExpiredSignature => TokenError::Expired,
                    ErrorKind::ImmatureSignature => TokenError::NotYetValid,
                    ErrorKind::InvalidSignature => TokenError::BadSignature,
                    ErrorKind::InvalidIssuer => TokenError::WrongIssuer,
                    ErrorKind::InvalidAudience => TokenError::WrongAudience,
                    ErrorKind::MissingRequiredClaim(c) if c == "iss" => TokenError::WrongIssuer,
                    ErrorKind::MissingRequiredClaim(c) if c == "aud" => TokenError::WrongAudience,
                    ErrorKind::InvalidAlgorithm => {
                        TokenError::WrongAlgorithm(format!("{:?}", header.alg))
                    }
                    _ => TokenError::Malformed(e.to_string()),
                }
            })
    }
}

/// A key tokens are signed with, for issuing them.
pub enum SigningKey {
    Secret(Vec<u8>),
    Pem(KeyAlgorithm, Vec<u8>),
}

/// Signs `claims` with `key` under `kid`.
pub fn issue(claims: &Claims, kid: &str, key: &SigningKey) -> Result<String, TokenError> {
    let err = |message: String| TokenError::Key {
        kid: kid.into(),
        message,
    };
    let (alg, key) = match key {
        SigningKey::Secret(s) => {
            if s.len() < 32 {
                return Err(err("an HS256 secret has at least 32 bytes".into()));
            }
            (KeyAlgorithm::HS256, EncodingKey::from_secret(s))
        }
        SigningKey::Pem(KeyAlgorithm::EdDSA, pem) => (
            KeyAlgorithm::EdDSA,
            EncodingKey::from_ed_pem(pem).map_err(|e| err(e.to_string()))?,
        ),
        SigningKey::Pem(KeyAlgorithm::RS256, pem) => (
            KeyAlgorithm::RS256,
            EncodingKey::from_rsa_pem(pem).map_err(|e| err(e.to_string()))?,
        ),
        SigningKey::Pem(KeyAlgorithm::HS256, _) => {
            return Err(err("HS256 keys are secrets, not PEM files".into()))
        }
    };
    let mut header = Header::new(alg.jwt());
    header.kid = Some(kid.to_string());
    jsonwebtoken::encode(&header, claims, &key).map_err(|e| err(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn now() -> u64 {
        unix_now()
    }

    fn claims() -> Claims {
        Claims {
            buckets: vec![
                BucketScope::parse("models:rl").unwrap(),
                BucketScope::parse("kv-*:rwdl").unwrap(),
            ],
            conductor: vec![ConductorScope::Route],
            ..Claims::new("alice", std::time::Duration::from_secs(3600))
        }
    }

    fn ring() -> Keyring {
        let mut k = Keyring::default();
        k.add_secret("k1", SECRET).unwrap();
        k
    }

    #[test]
    fn scopes_parse_match_and_combine() {
        let c = claims();
        assert_eq!(c.access("models"), Access::parse("rl").unwrap());
        assert_eq!(c.access("models2"), Access::default());
        assert_eq!(c.access("kv-a"), Access::ALL);
        assert!(c.conductor_allows(ConductorScope::Route));
        assert!(!c.conductor_allows(ConductorScope::Events));
        for bad in ["models", "m:x", "m:rr", "m:", "a*b:r", ":r", "*x:r"] {
            assert!(BucketScope::parse(bad).is_err(), "{bad}");
        }
        assert!(BucketScope::parse("*:r").unwrap().matches("anything"));
        assert_eq!(Access::parse("dl").unwrap().to_string(), "dl");
    }

    #[test]
    fn a_token_round_trips_and_every_tampering_is_refused() {
        let original = claims();
        let token = issue(&original, "k1", &SigningKey::Secret(SECRET.to_vec())).unwrap();
        assert_eq!(ring().verify(&token).unwrap(), original);

        // Wrong secret.
        let other = issue(&claims(), "k1", &SigningKey::Secret(vec![7; 32])).unwrap();
        assert_eq!(ring().verify(&other), Err(TokenError::BadSignature));
        // Unknown kid.
        let unknown = issue(&claims(), "k9", &SigningKey::Secret(SECRET.to_vec())).unwrap();
        assert_eq!(
            ring().verify(&unknown),
            Err(TokenError::UnknownKey(Some("k9".into())))
        );
        // Expired and not yet valid.
        let expired = Claims {
            exp: now() - 60,
            ..claims()
        };
        let t = issue(&expired, "k1", &SigningKey::Secret(SECRET.to_vec())).unwrap();
        assert_eq!(ring().verify(&t), Err(TokenError::Expired));
        let early = Claims {
            nbf: Some(now() + 600),
            ..claims()
        };
        let t = issue(&early, "k1", &SigningKey::Secret(SECRET.to_vec())).unwrap();
        assert_eq!(ring().verify(&t), Err(TokenError::NotYetValid));
        // alg: none, with the claims unchanged.
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let payload = token.split('.').nth(1).unwrap();
        let none = format!(
            "{}.{payload}.",
            b64.encode(br#"{"alg":"none","typ":"JWT","kid":"k1"}"#)
        );
        assert!(ring().verify(&none).is_err());
        // A widened scope under the original signature.
        let mut wider = claims();
        wider.admin = true;
        let forged = format!(
            "{}.{}.{}",
            token.split('.').next().unwrap(),
            b64.encode(serde_json::to_vec(&wider).unwrap()),
            token.split('.').nth(2).unwrap()
        );
        assert_eq!(ring().verify(&forged), Err(TokenError::BadSignature));
        // Garbage.
        for junk in ["", "a.b.c", "Bearer x", "..", "a.b"] {
            assert!(ring().verify(junk).is_err(), "{junk}");
        }
    }

    /// A test-only Ed25519 key pair (made with `openssl genpkey -algorithm ed25519`).
    const ED_PRIVATE: &[u8] = b"-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIFOzD/2ln0rtT31ZPzD7KiQ7/Olp4Neu9yppS2uqTOHY\n-----END PRIVATE KEY-----\n";
    const ED_PUBLIC: &[u8] = b"-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAEZHe7zDBeUqKmipw0O6R6zOmSPcmXSWJ3mWu60xsEKU=\n-----END PUBLIC KEY-----\n";

    #[test]
    fn eddsa_tokens_verify_with_the_public_key_beside_an_hs256_key() {
        let mut k = ring();
        k.add_public_pem("ops", KeyAlgorithm::EdDSA, ED_PUBLIC)
            .unwrap();
        let original = claims();
        let t = issue(
            &original,
            "ops",
            &SigningKey::Pem(KeyAlgorithm::EdDSA, ED_PRIVATE.to_vec()),
        )
        .unwrap();
        assert_eq!(k.verify(&t).unwrap(), original);
        // The same signature under the HS256 key's kid is not accepted.
        let parts: Vec<&str> = t.split('.').collect();
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let relabelled = format!(
            "{}.{}.{}",
            b64.encode(br#"{"alg":"EdDSA","kid":"k1"}"#),
            parts[1],
            parts[2]
        );
        assert!(matches!(
            k.verify(&relabelled),
            Err(TokenError::WrongAlgorithm(_))
        ));
    }

    #[test]
    fn rs256_tokens_verify_with_the_public_key() {
        // A test-only RSA key pair (made with `openssl genpkey -algorithm RSA`).
        let private = include_bytes!("../tests/keys/rsa-test.pem");
        let public = include_bytes!("../tests/keys/rsa-test.pub");
        let mut k = ring();
        k.add_public_pem("rsa", KeyAlgorithm::RS256, public)
            .unwrap();
        let original = claims();
        let t = issue(
            &original,
            "rsa",
            &SigningKey::Pem(KeyAlgorithm::RS256, private.to_vec()),
        )
        .unwrap();
        assert_eq!(k.verify(&t).unwrap(), original);
        // Signed by another key under the same kid: refused.
        let other = issue(
            &original,
            "rsa",
            &SigningKey::Pem(KeyAlgorithm::EdDSA, ED_PRIVATE.to_vec()),
        )
        .unwrap();
        assert!(k.verify(&other).is_err());
    }

    #[test]
    fn the_key_a_kid_names_decides_the_algorithm() {
        // An HS256 token whose kid names an EdDSA public key: refused, whatever the secret.
        let mut k = Keyring::default();
        let pem = b"-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=\n-----END PUBLIC KEY-----\n";
        k.add_public_pem("ed", KeyAlgorithm::EdDSA, pem).unwrap();
        let t = issue(&claims(), "ed", &SigningKey::Secret(pem[..40].to_vec())).unwrap();
        assert!(matches!(k.verify(&t), Err(TokenError::WrongAlgorithm(_))));
        assert!(k.add_secret("ed", SECRET).is_err(), "one key per kid");
        assert!(k.add_secret("short", b"short").is_err());
    }

    #[test]
    fn a_key_with_an_issuer_and_audience_takes_only_tokens_minted_for_it() {
        let mut k = ring();
        k.add_secret("idp", SECRET).unwrap();
        k.expect(
            "idp",
            Some("https://idp".into()),
            vec!["yutu".into(), "kv".into()],
        )
        .unwrap();
        let key = SigningKey::Secret(SECRET.to_vec());
        let with = |iss: Option<&str>, aud: Option<Audience>| Claims {
            iss: iss.map(str::to_string),
            aud,
            ..Claims::new("svc", std::time::Duration::from_secs(60))
        };
        let one = |a: &str| Some(Audience::One(a.into()));
        let ok = issue(&with(Some("https://idp"), one("kv")), "idp", &key).unwrap();
        assert_eq!(k.verify(&ok).unwrap().sub, "svc");
        let many = Some(Audience::Many(vec!["other".into(), "yutu".into()]));
        let ok = issue(&with(Some("https://idp"), many), "idp", &key).unwrap();
        assert!(k.verify(&ok).is_ok());
        for (claims, want) in [
            (
                with(Some("https://evil"), one("yutu")),
                TokenError::WrongIssuer,
            ),
            (with(None, one("yutu")), TokenError::WrongIssuer),
            (
                with(Some("https://idp"), one("billing")),
                TokenError::WrongAudience,
            ),
            (with(Some("https://idp"), None), TokenError::WrongAudience),
        ] {
            let t = issue(&claims, "idp", &key).unwrap();
            assert_eq!(k.verify(&t), Err(want), "{claims:?}");
        }
        // Keys without expectations (the node's own) ignore both.
        let t = issue(&with(Some("anyone"), one("anything")), "k1", &key).unwrap();
        assert!(k.verify(&t).is_ok());
        assert!(k.expect("nope", None, vec![]).is_err());
        assert!(k.expect("k1", Some(String::new()), vec![]).is_err());
    }
}
