//! The api's configuration.

use std::net::SocketAddr;
use std::path::PathBuf;

use kiln_core::config::{ConfigError, DatabaseConfig, GrpcConfig, NatsConfig, ObjectStoreConfig};
use kiln_core::metrics::MetricsConfig;
use kiln_core::secrets::SecretsConfig;
use kiln_core::service::{ServiceConfig, problems_to_result};
use kiln_core::tls::ClientTlsConfig;
use serde::{Deserialize, Serialize};

/// Default port of the api.
pub const DEFAULT_PORT: u16 = 7070;

/// Default port of the api's `/metrics`.
pub const DEFAULT_METRICS_PORT: u16 = 9470;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct Config {
    pub grpc: GrpcConfig,
    pub metrics: MetricsConfig,
    pub database: DatabaseConfig,
    pub nats: NatsConfig,
    pub objects: ObjectStoreConfig,
    /// The key project secrets are sealed with (the runners need the same one to open them).
    pub secrets: SecretsConfig,
    /// Where the bootstrap admin token is written (mode 0600) when the first start creates it.
    pub bootstrap_token_file: PathBuf,
    /// Largest artifact accepted, in bytes: a dataset's archive is one artifact, so this is the
    /// largest dataset (runners cap code bundles themselves).
    pub max_artifact_bytes: u64,
    /// How often unpublished changes are re-driven, in milliseconds.
    pub reconcile_interval_ms: u64,
    /// How long `ExplainJob` waits for the scheduler leader's answer, in milliseconds.
    pub explain_timeout_ms: u64,
    /// The web UI and its HTTP API.
    pub http: HttpConfig,
    /// Where clients reach the other services, as `DiscoveryService` tells them.
    pub public: PublicConfig,
}

/// The URLs clients reach the other services and the web UI at (`DiscoveryService`), when they
/// differ from what the api calls them at: empty takes `[http]`'s `logs`, `batches`, `advisor`
/// and `predictor`, and for `ui` the address the HTTP side listens on (when it is not every
/// address).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct PublicConfig {
    pub logs: String,
    pub batches: String,
    pub advisor: String,
    pub predictor: String,
    pub ui: String,
}

impl PublicConfig {
    fn validate(&self, problems: &mut Vec<String>) {
        for (name, url) in [
            ("logs", &self.logs),
            ("batches", &self.batches),
            ("advisor", &self.advisor),
            ("predictor", &self.predictor),
            ("ui", &self.ui),
        ] {
            if !(url.is_empty() || url.starts_with("http://") || url.starts_with("https://")) {
                problems.push(format!("public.{name} {url:?} must be an http:// or https:// URL"));
            }
        }
    }
}

/// The web UI and its HTTP API (docs/http-api.md): a transcoder of kiln's gRPC services, the
/// api's own in-process and the others' at their URLs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct HttpConfig {
    /// Where to serve it (over HTTPS with `[grpc.tls]`'s files when they are set); unset: no
    /// HTTP side.
    pub listen: Option<SocketAddr>,
    /// The built web UI (`ui/dist`); unset: the HTTP API alone.
    pub ui_dir: Option<PathBuf>,
    /// The gRPC URLs of log-ingest, item-batch, the advisor and the predictor; empty: that
    /// service's calls are answered UNAVAILABLE.
    pub logs: String,
    pub batches: String,
    pub advisor: String,
    pub predictor: String,
    /// Whom the api trusts at `https://` URLs, and the client certificate it presents.
    pub tls: ClientTlsConfig,
    /// How long a browser session made by a login code (`kiln ui`) lasts, in hours.
    pub session_hours: u64,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            listen: None,
            ui_dir: None,
            logs: "http://127.0.0.1:7071".into(),
            batches: "http://127.0.0.1:7075".into(),
            advisor: "http://127.0.0.1:7076".into(),
            predictor: "http://127.0.0.1:7077".into(),
            tls: ClientTlsConfig::default(),
            session_hours: 12,
        }
    }
}

impl HttpConfig {
    fn validate(&self, problems: &mut Vec<String>) {
        for (name, url) in [
            ("logs", &self.logs),
            ("batches", &self.batches),
            ("advisor", &self.advisor),
            ("predictor", &self.predictor),
        ] {
            if !url.is_empty()
                && let Err(error) = kiln_core::tls::endpoint(url, &self.tls)
            {
                problems.push(format!("http.{name}: {error}"));
            }
        }
        if !(1..=24 * 30).contains(&self.session_hours) {
            problems.push(format!(
                "http.session-hours must be 1 to 720, not {}",
                self.session_hours
            ));
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            grpc: GrpcConfig::local(DEFAULT_PORT),
            metrics: MetricsConfig::local(DEFAULT_METRICS_PORT),
            database: DatabaseConfig::default(),
            nats: NatsConfig::default(),
            objects: ObjectStoreConfig::default(),
            secrets: SecretsConfig::default(),
            bootstrap_token_file: PathBuf::from("./data/admin.token"),
            max_artifact_bytes: 1 << 40,
            reconcile_interval_ms: if cfg!(test) { 200 } else { 5_000 },
            explain_timeout_ms: 5_000,
            http: HttpConfig::default(),
            public: PublicConfig::default(),
        }
    }
}

impl ServiceConfig for Config {
    fn apply_env(&mut self, env: &std::collections::HashMap<String, String>) {
        self.objects.apply_env(env);
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        self.database.validate(&mut problems);
        self.grpc.validate(&mut problems);
        self.nats.validate(&mut problems);
        self.objects.validate(&mut problems);
        self.metrics.validate(&mut problems);
        self.secrets.validate(&mut problems);
        self.http.validate(&mut problems);
        self.public.validate(&mut problems);
        if self.max_artifact_bytes == 0 {
            problems.push("max-artifact-bytes must be at least 1".into());
        }
        if self.reconcile_interval_ms == 0 {
            problems.push("reconcile-interval-ms must be at least 1".into());
        }
        if self.explain_timeout_ms == 0 {
            problems.push("explain-timeout-ms must be at least 1".into());
        }
        problems_to_result(problems)
    }
}
