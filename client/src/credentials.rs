//! Where a client's access key and secret come from, in the order AWS tools use: explicit
//! values (flags, or the `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` environment), then a
//! profile of the shared credentials file (`AWS_SHARED_CREDENTIALS_FILE`, else
//! `~/.aws/credentials`; profile `AWS_PROFILE`, else `default`).

use std::path::{Path, PathBuf};

use crate::sigv4::Credentials;

/// Why credentials could not be found where they were asked for.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("an access key was given without a secret key, or the other way round")]
    Incomplete,
    #[error("cannot read the credentials file {path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("profile {profile:?} in {path} has no aws_access_key_id and aws_secret_access_key")]
    NoProfile { path: PathBuf, profile: String },
}

/// What the caller knows: explicit keys and a profile name, each optional.
#[derive(Debug, Default, Clone)]
pub struct CredentialSource {
    pub access_key: Option<String>,
    pub secret_key: Option<String>,
    /// A profile asked for by name: it must exist.
    pub profile: Option<String>,
    /// The shared credentials file; `None`: `~/.aws/credentials` (if `HOME` is set).
    pub file: Option<PathBuf>,
}

impl CredentialSource {
    /// Credentials to sign with, or `None` to send unsigned requests (nothing configured).
    pub fn resolve(&self) -> Result<Option<Credentials>, CredentialsError> {
        match (&self.access_key, &self.secret_key) {
            (Some(a), Some(s)) => return Ok(Some(Credentials::new(a.as_str(), s.as_str()))),
            (None, None) => {}
            _ => return Err(CredentialsError::Incomplete),
        }
        let path = match &self.file {
            Some(p) => p.clone(),
            None => match std::env::var_os("HOME") {
                Some(home) => Path::new(&home).join(".aws").join("credentials"),
                None => return Ok(None),
            },
        };
        let named = self.profile.is_some();
        let profile = self.profile.as_deref().unwrap_or("default");
        if !path.is_file() && !named {
            return Ok(None);
        }
        // As AWS's tools read the file: no quoting and no `\` escapes (a secret is taken
        // byte for byte).
        let options = ini::ParseOption {
            enabled_quote: false,
            enabled_escape: false,
            ..Default::default()
        };
        let ini =
            ini::Ini::load_from_file_opt(&path, options).map_err(|e| CredentialsError::File {
                path: path.clone(),
                message: e.to_string(),
            })?;
        let section = ini.section(Some(profile));
        let key = |k: &str| section.and_then(|s| s.get(k)).map(str::to_string);
        match (key("aws_access_key_id"), key("aws_secret_access_key")) {
            (Some(a), Some(s)) => Ok(Some(Credentials::new(a, s))),
            _ if named => Err(CredentialsError::NoProfile {
                path,
                profile: profile.to_string(),
            }),
            _ => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("credentials");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    const TEXT: &str = "[default]\naws_access_key_id = DEF\naws_secret_access_key = defsecret\n\n# comment\n[other]\naws_access_key_id=OTH\naws_secret_access_key=othsecret\n";

    #[test]
    fn explicit_keys_win_over_the_file() {
        let (_d, path) = file(TEXT);
        let src = CredentialSource {
            access_key: Some("FLAG".into()),
            secret_key: Some("flagsecret".into()),
            profile: Some("other".into()),
            file: Some(path),
        };
        assert_eq!(src.resolve().unwrap().unwrap().access_key, "FLAG");
    }

    #[test]
    fn profiles_from_the_file() {
        let (_d, path) = file(TEXT);
        let mut src = CredentialSource {
            file: Some(path),
            ..Default::default()
        };
        let c = src.resolve().unwrap().unwrap();
        assert_eq!(
            (c.access_key.as_str(), c.secret_key.as_str()),
            ("DEF", "defsecret")
        );
        src.profile = Some("other".into());
        assert_eq!(src.resolve().unwrap().unwrap().access_key, "OTH");
        src.profile = Some("missing".into());
        assert!(matches!(
            src.resolve(),
            Err(CredentialsError::NoProfile { .. })
        ));
    }

    #[test]
    fn values_are_taken_as_written() {
        let (_d, path) = file(
            "[default]\r\naws_access_key_id=K\r\naws_secret_access_key = a\\b\"c'd+/= \r\naws_session_token = t\r\n",
        );
        let c = CredentialSource {
            file: Some(path),
            ..Default::default()
        }
        .resolve()
        .unwrap()
        .unwrap();
        assert_eq!(
            (c.access_key.as_str(), c.secret_key.as_str()),
            ("K", "a\\b\"c'd+/=")
        );
    }

    #[test]
    fn a_profile_without_both_keys_is_an_error_only_when_asked_for() {
        let (_d, path) = file("[default]\nregion = us-east-1\n[half]\naws_access_key_id = A\n");
        let mut src = CredentialSource {
            file: Some(path),
            ..Default::default()
        };
        assert!(src.resolve().unwrap().is_none());
        src.profile = Some("half".into());
        assert!(matches!(
            src.resolve(),
            Err(CredentialsError::NoProfile { .. })
        ));
        src.file = Some(PathBuf::from("/nonexistent/credentials"));
        assert!(matches!(src.resolve(), Err(CredentialsError::File { .. })));
    }

    #[test]
    fn nothing_configured_means_unsigned_and_half_a_key_is_an_error() {
        let src = CredentialSource {
            file: Some(PathBuf::from("/nonexistent/credentials")),
            ..Default::default()
        };
        assert!(src.resolve().unwrap().is_none());
        let half = CredentialSource {
            access_key: Some("A".into()),
            ..src
        };
        assert!(matches!(half.resolve(), Err(CredentialsError::Incomplete)));
    }
}
