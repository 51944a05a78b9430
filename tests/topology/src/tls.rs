//! A TLS-only topology: every gRPC listener serves a certificate of the topology's CA and
//! requires client certificates of it; runners hand jobs the CA and a client certificate; the
//! nats-servers require TLS, a client certificate and an NKey user (one per service)
//! ([`kiln_core::testing::NatsCluster::start_secure`]).

use std::collections::BTreeMap;
use std::path::Path;

use kiln_core::config::NatsConfig;
use kiln_core::testing::{CertFiles, TestCa};

use crate::compose::env_value;

/// The topology's CA and the certificates it signed.
pub struct TopologyTls {
    pub ca: TestCa,
    /// What every service serves.
    pub server: CertFiles,
    /// What runners give jobs (and so batch workers' agents).
    pub job: CertFiles,
    /// For the CLI and the SDK of the tests.
    pub client: CertFiles,
}

impl TopologyTls {
    /// Makes the CA and certificates in `dir`.
    pub fn new(dir: &Path) -> TopologyTls {
        std::fs::create_dir_all(dir).expect("a TLS directory");
        let ca = TestCa::new(dir, "topology");
        TopologyTls {
            server: ca.server_cert("service"),
            job: ca.client_cert("job"),
            client: ca.client_cert("client"),
            ca,
        }
    }

    /// Sets the env overrides of one instance (`prefix` is `KILN_<SVC>__`): `[grpc.tls]`, and for
    /// runners `job-tls` and `https://` addresses for jobs; for item-batch `https://` for workers,
    /// for the advisor for trials.
    pub fn overrides(&self, prefix: &str, service: &str, env: &mut BTreeMap<String, String>) {
        let path = |path: &Path| env_value(&toml::Value::String(path.display().to_string()));
        env.insert(format!("{prefix}GRPC__TLS__CERT_FILE"), path(&self.server.cert_file));
        env.insert(format!("{prefix}GRPC__TLS__KEY_FILE"), path(&self.server.key_file));
        env.insert(format!("{prefix}GRPC__TLS__CLIENT_CA_FILE"), path(&self.ca.ca_file));
        env.insert(format!("{prefix}GRPC__TLS__REQUIRE_CLIENT_CERT"), "true".into());
        let https = |env: &mut BTreeMap<String, String>, key: &str| {
            if let Some(value) = env.get_mut(&format!("{prefix}{key}")) {
                *value = value.replace("http://", "https://");
            }
        };
        match service {
            "kiln-runner" => {
                env.insert(format!("{prefix}JOB_TLS__CA_FILE"), path(&self.ca.ca_file));
                env.insert(format!("{prefix}JOB_TLS__CERT_FILE"), path(&self.job.cert_file));
                env.insert(format!("{prefix}JOB_TLS__KEY_FILE"), path(&self.job.key_file));
                https(env, "API_URL");
                https(env, "LOGS_URL");
            }
            "kiln-item-batch" | "kiln-advisor" => https(env, "ADVERTISE_URL"),
            _ => {}
        }
    }
}

/// Sets the NATS TLS and NKey overrides of `nats` (a secure cluster's config) for one instance.
pub fn nats_overrides(prefix: &str, nats: &NatsConfig, env: &mut BTreeMap<String, String>) {
    if nats.require_tls {
        env.insert(format!("{prefix}NATS__REQUIRE_TLS"), "true".into());
    }
    for (key, path) in [
        ("TLS_CA_FILE", &nats.tls_ca_file),
        ("TLS_CERT_FILE", &nats.tls_cert_file),
        ("TLS_KEY_FILE", &nats.tls_key_file),
        ("NKEY_SEED_FILE", &nats.nkey_seed_file),
        ("CREDENTIALS_FILE", &nats.credentials_file),
    ] {
        if let Some(path) = path {
            env.insert(
                format!("{prefix}NATS__{key}"),
                env_value(&toml::Value::String(path.display().to_string())),
            );
        }
    }
}
