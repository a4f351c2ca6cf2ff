//! TLS on the HTTP listener, with rustls.
//!
//! Optional: plain HTTP stays the default (a node on loopback or a private cluster network
//! behind its own encryption); `--tls-cert` and `--tls-key` (PEM) turn it on for every
//! connection of the listener. The handshake runs on the shard that accepted the connection,
//! under a deadline, so a client that stalls it holds nothing but its own socket.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures_rustls::TlsAcceptor;
use rustls::crypto::ring::default_provider;
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// How long a client has to finish the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why TLS cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read the certificate chain {path}: {message}")]
    Certificates { path: String, message: String },
    #[error("cannot read the private key {path}: {message}")]
    Key { path: String, message: String },
    #[error("the certificate and key do not make a TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// An acceptor serving the certificate chain in `cert` with the private key in `key` (PEM).
pub fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, TlsError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<_, _>>())
        .map_err(|e| TlsError::Certificates {
            path: cert.display().to_string(),
            message: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Certificates {
            path: cert.display().to_string(),
            message: "no certificate in the file".into(),
        });
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::Key {
        path: key.display().to_string(),
        message: e.to_string(),
    })?;
    let mut config = ServerConfig::builder_with_provider(Arc::new(default_provider()))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}
