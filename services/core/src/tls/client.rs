//! The client side: one way to make a channel to a kiln service from a URL.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::pki_types::PrivateKeyDer;
use rustls::pki_types::pem::PemObject;
use serde::{Deserialize, Serialize};
use tonic::transport::{Certificate, Endpoint, Identity};

use super::{TlsError, load_certified_key, load_certs, load_roots, provider, read};

/// ClientTlsConfig says whom an `https://` client trusts and who it is: `ca-file` (PEM CA
/// certificates; the system roots when unset) and, for servers that require one, a client
/// certificate (`cert-file`, `key-file`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct ClientTlsConfig {
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

/// Returns the endpoint of `url`: TLS for `https://` (trusting `tls.ca-file`, else the system
/// roots, and presenting the client certificate when one is set), plain for `http://`.
pub fn endpoint(url: &str, tls: &ClientTlsConfig) -> Result<Endpoint, TlsError> {
    let url_error = |message: String| TlsError::Url {
        url: url.to_string(),
        message,
    };
    let endpoint = Endpoint::from_shared(url.to_string()).map_err(|e| url_error(e.to_string()))?;
    match endpoint.uri().scheme_str() {
        Some("http") => return Ok(endpoint),
        Some("https") => {}
        _ => return Err(url_error("must start with http:// or https://".into())),
    }
    let mut config = tonic::transport::ClientTlsConfig::new();
    config = match &tls.ca_file {
        Some(path) => {
            // Read here (not by tonic) so a bad file is named, not reported as a handshake error.
            load_certs(path)?;
            config.ca_certificate(Certificate::from_pem(read(path)?))
        }
        None => config.with_native_roots(),
    };
    match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => {
            super::load_certified_key(cert, key)?;
            config = config.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        (None, None) => {}
        _ => {
            return Err(TlsError::Invalid(
                "a client certificate needs both its cert file and its key file".into(),
            ));
        }
    }
    endpoint.tls_config(config).map_err(|e| url_error(e.to_string()))
}

/// The variables jobs and batch workers find their TLS settings in, as PEM text (kiln-agent and
/// the Python SDK read them; the agent, which does not link this crate, spells them itself).
pub const ENV_CA_PEM: &str = "KILN_CA_PEM";
pub const ENV_CLIENT_CERT_PEM: &str = "KILN_CLIENT_CERT_PEM";
pub const ENV_CLIENT_KEY_PEM: &str = "KILN_CLIENT_KEY_PEM";

impl ClientTlsConfig {
    /// A rustls client configuration (the `ring` provider) for clients other than tonic's (the
    /// Scylla driver): trusting `ca-file`, which it needs, and presenting the client certificate
    /// when one is set.
    pub fn rustls_config(&self) -> Result<Arc<rustls::ClientConfig>, TlsError> {
        let ca = self
            .ca_file
            .as_ref()
            .ok_or_else(|| TlsError::Invalid("TLS to this server needs a CA file".into()))?;
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Invalid(e.to_string()))?
            .with_root_certificates(load_roots(ca)?);
        let config = match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key)) => {
                load_certified_key(cert, key)?;
                let key_der = PrivateKeyDer::from_pem_slice(&read(key)?).map_err(|e| TlsError::Pem {
                    path: key.clone(),
                    what: "private key",
                    message: e.to_string(),
                })?;
                builder
                    .with_client_auth_cert(load_certs(cert)?, key_der)
                    .map_err(|e| TlsError::Invalid(e.to_string()))?
            }
            (None, None) => builder.with_no_client_auth(),
            _ => {
                return Err(TlsError::Invalid(
                    "a client certificate needs both its cert file and its key file".into(),
                ));
            }
        };
        Ok(Arc::new(config))
    }

    /// Adds what is wrong with the files to `problems`, prefixing each with `section`.
    pub fn validate(&self, section: &str, problems: &mut Vec<String>) {
        if let Some(path) = &self.ca_file
            && let Err(error) = load_certs(path)
        {
            problems.push(format!("{section}: {error}"));
        }
        match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key)) => {
                if let Err(error) = super::load_certified_key(cert, key) {
                    problems.push(format!("{section}: {error}"));
                }
            }
            (None, None) => {}
            _ => problems.push(format!(
                "{section}.cert-file and {section}.key-file go together: set both or neither"
            )),
        }
    }

    /// The environment a job gets for these settings: the files' PEM text, read now, so a
    /// renewed file reaches the next job.
    pub fn job_env(&self) -> Result<Vec<(&'static str, String)>, TlsError> {
        let mut env = Vec::new();
        for (name, path) in [
            (ENV_CA_PEM, &self.ca_file),
            (ENV_CLIENT_CERT_PEM, &self.cert_file),
            (ENV_CLIENT_KEY_PEM, &self.key_file),
        ] {
            if let Some(path) = path {
                let text = String::from_utf8(read(path)?).map_err(|e| TlsError::Pem {
                    path: path.clone(),
                    what: "text",
                    message: e.to_string(),
                })?;
                env.push((name, text));
            }
        }
        Ok(env)
    }
}
