//! `kiln up`'s TLS flags, and its refusal to listen beyond loopback in plain text.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Result, bail};
use kiln_core::tls::{ClientTlsConfig, ServerTlsConfig};

#[derive(Debug, Clone, Default, clap::Args)]
pub struct TlsArgs {
    /// PEM certificate (chain) every gRPC listener serves; with --tls-key, TLS is on. Read
    /// again when it changes.
    #[arg(long, env = "KILN_TLS_CERT", value_name = "PATH", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "KILN_TLS_KEY", value_name = "PATH", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// The CA that signed --tls-cert: written to credentials.toml as ca-file, and given to jobs
    /// and batch workers (default: clients use the system roots).
    #[arg(long, env = "KILN_TLS_CA", value_name = "PATH", requires = "tls_cert")]
    pub tls_ca: Option<PathBuf>,
    /// PEM CA of client certificates: every listener then requires a client certificate it
    /// signed (the CLI's --client-cert).
    #[arg(long, env = "KILN_TLS_CLIENT_CA", value_name = "PATH", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// A client certificate and key of --tls-client-ca given to jobs and batch workers, for
    /// listeners that require one.
    #[arg(long, value_name = "PATH", requires_all = ["tls_client_ca", "job_client_key"])]
    pub job_client_cert: Option<PathBuf>,
    #[arg(long, value_name = "PATH", requires = "job_client_cert")]
    pub job_client_key: Option<PathBuf>,
    /// Allows listening on an address other than loopback without TLS.
    #[arg(long)]
    pub insecure: bool,
}

impl TlsArgs {
    pub fn enabled(&self) -> bool {
        self.tls_cert.is_some()
    }

    /// `[grpc.tls]` of every service, checked: a bad file fails `kiln up` before it binds.
    pub fn server(&self) -> Result<ServerTlsConfig> {
        let tls = ServerTlsConfig {
            cert_file: self.tls_cert.clone(),
            key_file: self.tls_key.clone(),
            client_ca_file: self.tls_client_ca.clone(),
            require_client_cert: self.tls_client_ca.is_some(),
        };
        let mut problems = Vec::new();
        tls.validate("TLS (--tls-*)", &mut problems);
        if !problems.is_empty() {
            bail!("{}", problems.join("; "));
        }
        Ok(tls)
    }

    /// A warning for settings that leave jobs and batch workers unable to reach kiln.
    pub fn warning(&self) -> Option<&'static str> {
        (self.tls_client_ca.is_some() && self.job_client_cert.is_none()).then_some(
            "--tls-client-ca without --job-client-cert/--job-client-key: jobs and batch workers have no client certificate, so they cannot reach kiln",
        )
    }

    /// What jobs and batch workers trust and present (the runner's `job-tls`).
    pub fn jobs(&self) -> ClientTlsConfig {
        ClientTlsConfig {
            ca_file: self.tls_ca.clone(),
            cert_file: self.job_client_cert.clone(),
            key_file: self.job_client_key.clone(),
        }
    }

    /// The URL scheme clients use.
    pub fn scheme(&self) -> &'static str {
        if self.enabled() { "https" } else { "http" }
    }

    /// Refuses plain text on any listener (flag name, address) that is not loopback, unless
    /// `--insecure`.
    pub fn check_exposure(&self, listeners: &[(&str, SocketAddr)]) -> Result<()> {
        if self.enabled() || self.insecure {
            return Ok(());
        }
        let exposed: Vec<String> = listeners
            .iter()
            .filter(|(_, addr)| !addr.ip().is_loopback())
            .map(|(flag, addr)| format!("{flag} {addr}"))
            .collect();
        if !exposed.is_empty() {
            bail!(
                "refusing to serve plain text beyond loopback ({}): pass --tls-cert and --tls-key, or --insecure to allow it",
                exposed.join(", ")
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_stays_on_loopback_unless_insecure() {
        let loopback: SocketAddr = "127.0.0.1:7070".parse().unwrap();
        let everywhere: SocketAddr = "0.0.0.0:7075".parse().unwrap();
        let plain = TlsArgs::default();
        plain.check_exposure(&[("--api-addr", loopback)]).unwrap();
        let error = plain
            .check_exposure(&[("--api-addr", loopback), ("--batch-addr", everywhere)])
            .unwrap_err()
            .to_string();
        assert!(error.contains("--batch-addr 0.0.0.0:7075"), "{error}");
        assert!(error.contains("--insecure"), "{error}");
        let insecure = TlsArgs {
            insecure: true,
            ..TlsArgs::default()
        };
        insecure.check_exposure(&[("--batch-addr", everywhere)]).unwrap();
        let tls = TlsArgs {
            tls_cert: Some("cert.pem".into()),
            tls_key: Some("key.pem".into()),
            ..TlsArgs::default()
        };
        tls.check_exposure(&[("--batch-addr", everywhere)]).unwrap();
    }
}
