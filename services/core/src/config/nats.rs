//! The NATS part of every service's configuration: servers, replicas, TLS and authentication.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// NatsConfig points at the NATS server with JetStream, or at servers of one cluster, and says
/// how to authenticate: TLS (a `tls://` URL or `require-tls`; `tls-ca-file` instead of the system
/// roots; a client certificate), and an NKey seed or a credentials file (JWT and seed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct NatsConfig {
    /// One server URL, or several separated by commas (`nats://a:4222,nats://b:4222`).
    pub url: String,
    /// Replicas of each stream and bucket: 1 for a single server, 3 for a cluster.
    pub replicas: usize,
    /// Refuses a server that does not offer TLS (implied by `tls://` URLs).
    pub require_tls: bool,
    /// PEM CA certificates the server's certificate is checked against.
    pub tls_ca_file: Option<PathBuf>,
    /// PEM client certificate and key, for servers that verify clients.
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    /// A file holding an NKey user seed (`SU…`), for servers with NKey users.
    pub nkey_seed_file: Option<PathBuf>,
    /// A `.creds` file (user JWT and seed), for servers in operator mode.
    pub credentials_file: Option<PathBuf>,
}

impl Default for NatsConfig {
    fn default() -> Self {
        NatsConfig {
            url: "nats://127.0.0.1:4222".into(),
            replicas: 1,
            require_tls: false,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            nkey_seed_file: None,
            credentials_file: None,
        }
    }
}

impl NatsConfig {
    /// The server URLs of `url`, trimmed, empty parts left out.
    pub fn servers(&self) -> Vec<&str> {
        self.url.split(',').map(str::trim).filter(|s| !s.is_empty()).collect()
    }

    pub fn validate(&self, problems: &mut Vec<String>) {
        let servers = self.servers();
        if servers.is_empty() {
            problems.push("nats.url is empty: give one server URL or several separated by commas".into());
        }
        for server in servers {
            if !server.starts_with("nats://") && !server.starts_with("tls://") {
                problems.push(format!("nats.url {server:?} must start with nats:// or tls://"));
            } else if let Err(error) = server.parse::<async_nats::ServerAddr>() {
                problems.push(format!("nats.url {server:?} is not a server URL: {error}"));
            }
        }
        if !(1..=5).contains(&self.replicas) {
            problems.push(format!("nats.replicas {} must be between 1 and 5", self.replicas));
        }
        if self.tls_cert_file.is_some() != self.tls_key_file.is_some() {
            problems.push("nats.tls-cert-file and nats.tls-key-file go together: set both or neither".into());
        }
        if self.nkey_seed_file.is_some() && self.credentials_file.is_some() {
            problems.push("nats.nkey-seed-file and nats.credentials-file exclude each other: set one".into());
        }
        for (key, path) in [
            ("tls-ca-file", &self.tls_ca_file),
            ("tls-cert-file", &self.tls_cert_file),
            ("tls-key-file", &self.tls_key_file),
            ("nkey-seed-file", &self.nkey_seed_file),
            ("credentials-file", &self.credentials_file),
        ] {
            if let Some(path) = path
                && let Err(error) = std::fs::File::open(path)
            {
                problems.push(format!("nats.{key} {}: {error}", path.display()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_problem_is_reported() {
        let mut problems = Vec::new();
        NatsConfig {
            url: "http://x".into(),
            replicas: 0,
            ..NatsConfig::default()
        }
        .validate(&mut problems);
        assert_eq!(problems.len(), 2, "{problems:?}");
    }

    #[test]
    fn nats_auth_files_are_checked() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let mut problems = Vec::new();
        NatsConfig {
            tls_cert_file: Some(file.path().to_path_buf()),
            nkey_seed_file: Some(file.path().to_path_buf()),
            credentials_file: Some("/nonexistent/kiln.creds".into()),
            ..NatsConfig::default()
        }
        .validate(&mut problems);
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].contains("tls-key-file go together"), "{problems:?}");
        assert!(problems[1].contains("exclude each other"), "{problems:?}");
        assert!(
            problems[2].contains("nats.credentials-file /nonexistent/kiln.creds"),
            "{problems:?}"
        );
    }

    #[test]
    fn every_server_of_a_list_is_checked() {
        let config = NatsConfig {
            url: " nats://a:4222, nats://b:4222 ,tls://c:4222".into(),
            replicas: 3,
            ..NatsConfig::default()
        };
        assert_eq!(config.servers(), ["nats://a:4222", "nats://b:4222", "tls://c:4222"]);
        let mut problems = Vec::new();
        config.validate(&mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        let mut problems = Vec::new();
        NatsConfig {
            url: "nats://a:4222,http://b:4222,nats://c:notaport".into(),
            replicas: 3,
            ..NatsConfig::default()
        }
        .validate(&mut problems);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("http://b:4222"), "{problems:?}");
        assert!(problems[1].contains("nats://c:notaport"), "{problems:?}");
        let mut problems = Vec::new();
        NatsConfig {
            url: " , ".into(),
            replicas: 1,
            ..NatsConfig::default()
        }
        .validate(&mut problems);
        assert_eq!(problems.len(), 1, "{problems:?}");
    }
}
