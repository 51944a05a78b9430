//! TLS for every gRPC connection: servers (rustls, certificate and key files reloaded when they
//! change, optional client certificates) and clients (`https://` with a CA file or the system
//! roots, an optional client certificate).
//!
//! - [`ServerTlsConfig`] is `[grpc.tls]` of every service; [`incoming`] turns a bound listener
//!   into the connection stream `serve_with_incoming_shutdown` takes, plain or TLS;
//! - [`ClientTlsConfig`] and [`endpoint`] make the channel of every client.
//!
//! Only the `ring` provider is used (the agent is a static musl binary); it is named
//! explicitly because `aws-lc-rs` is in the build too (object_store's HTTP client), and rustls
//! refuses to guess between two; [`install_default_provider`] makes it the default for the
//! libraries that do not name one (async-nats).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use serde::{Deserialize, Serialize};

use crate::ErrorKind;

mod client;
mod server;

pub use client::{ClientTlsConfig, endpoint};
pub use server::{Conn, HttpListener, Incoming, http_listener, incoming};

/// TlsError says why a certificate, key or CA file cannot be used, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path} holds no PEM {what}: {message}")]
    Pem {
        path: PathBuf,
        what: &'static str,
        message: String,
    },
    #[error("the key {key} does not match the certificate {cert}: {message}")]
    KeyMismatch {
        cert: PathBuf,
        key: PathBuf,
        message: String,
    },
    #[error("cannot use the client CA {path}: {message}")]
    ClientCa { path: PathBuf, message: String },
    #[error("invalid TLS setting: {0}")]
    Invalid(String),
    #[error("invalid address {url:?}: {message}")]
    Url { url: String, message: String },
}

impl TlsError {
    pub fn kind(&self) -> ErrorKind {
        ErrorKind::InvalidArgument
    }
}

/// ServerTlsConfig is `[grpc.tls]`: off unless `cert-file` is set. The certificate and key are
/// read again when either file changes (checked at most once a second, on a new connection);
/// a broken new pair is logged and the old one kept.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct ServerTlsConfig {
    /// PEM certificate chain, the server's own certificate first.
    pub cert_file: Option<PathBuf>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of that certificate.
    pub key_file: Option<PathBuf>,
    /// PEM CA certificates that client certificates are verified against.
    pub client_ca_file: Option<PathBuf>,
    /// Refuses clients without a certificate signed by `client-ca-file`.
    pub require_client_cert: bool,
}

impl ServerTlsConfig {
    pub fn enabled(&self) -> bool {
        self.cert_file.is_some()
    }

    /// Adds what is wrong (missing pairs, unreadable files, a key of another certificate) to
    /// `problems`, prefixing each with `section` (`grpc.tls`).
    pub fn validate(&self, section: &str, problems: &mut Vec<String>) {
        match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key)) => {
                if let Err(error) = load_certified_key(cert, key) {
                    problems.push(format!("{section}: {error}"));
                }
            }
            (None, None) => {
                if self.client_ca_file.is_some() || self.require_client_cert {
                    problems.push(format!(
                        "{section}.client-ca-file and require-client-cert need TLS: set {section}.cert-file and key-file"
                    ));
                }
                return;
            }
            _ => problems.push(format!(
                "{section}.cert-file and {section}.key-file go together: set both or neither"
            )),
        }
        match &self.client_ca_file {
            Some(path) => {
                if let Err(error) = load_roots(path) {
                    problems.push(format!("{section}: {error}"));
                }
            }
            None if self.require_client_cert => problems.push(format!(
                "{section}.require-client-cert needs {section}.client-ca-file (the CA that signs client certificates)"
            )),
            None => {}
        }
    }
}

/// The one crypto provider of kiln's TLS.
pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Makes `ring` the process's default rustls provider, for libraries that ask rustls for the
/// default (async-nats does, and panics when both ring and aws-lc-rs are built in). Idempotent;
/// a provider installed before wins.
pub fn install_default_provider() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

pub(crate) fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads the PEM certificates of `path` (at least one).
pub(crate) fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem_error = |message: String| TlsError::Pem {
        path: path.to_path_buf(),
        what: "certificate",
        message,
    };
    let certs = CertificateDer::pem_slice_iter(&read(path)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(e.to_string()))?;
    if certs.is_empty() {
        return Err(pem_error("no CERTIFICATE block".into()));
    }
    Ok(certs)
}

/// Reads a certificate chain and its key, checking that they belong together.
pub(crate) fn load_certified_key(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    let chain = load_certs(cert)?;
    let key_der = PrivateKeyDer::from_pem_slice(&read(key)?).map_err(|e| TlsError::Pem {
        path: key.to_path_buf(),
        what: "private key",
        message: e.to_string(),
    })?;
    CertifiedKey::from_der(chain, key_der, &provider()).map_err(|e| TlsError::KeyMismatch {
        cert: cert.to_path_buf(),
        key: key.to_path_buf(),
        message: e.to_string(),
    })
}

/// Reads CA certificates into a root store.
pub(crate) fn load_roots(path: &Path) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in load_certs(path)? {
        roots.add(cert).map_err(|e| TlsError::ClientCa {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
    }
    Ok(roots)
}
