//! The predictor's configuration.

use std::net::SocketAddr;

use kiln_core::config::{ConfigError, DatabaseConfig, GrpcConfig, NatsConfig};
use kiln_core::metrics::MetricsConfig;
use kiln_core::service::{ServiceConfig, problems_to_result};
use serde::{Deserialize, Serialize};

/// Default port of the Open Inference Protocol over gRPC.
pub const DEFAULT_PORT: u16 = 7077;

/// Default port of the Open Inference Protocol over HTTP (and `POST /predict`).
pub const DEFAULT_HTTP_PORT: u16 = 7078;

/// Default port of the predictor's `/metrics`.
pub const DEFAULT_METRICS_PORT: u16 = 9477;

/// How member requests reach the relays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Channel {
    Direct,
    Nats,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct Config {
    /// Where the Open Inference Protocol's gRPC service (`inference.GRPCInferenceService`)
    /// listens.
    pub grpc: GrpcConfig,
    /// Where the Open Inference Protocol's REST API listens; it speaks TLS (HTTP/1.1) with
    /// `grpc.tls`'s certificate, key and client CA when they are set.
    pub http_listen: SocketAddr,
    /// The REST API's base URL as clients reach it (`kiln serve status` shows it); empty for
    /// `http://<http-listen>`.
    pub http_advertise_url: String,
    pub metrics: MetricsConfig,
    /// The metadata database, where callers' tokens are checked.
    pub database: DatabaseConfig,
    /// Where the services' definitions are watched and the workers reached.
    pub nats: NatsConfig,
    /// The largest request body, in bytes; a member's request must also fit in a NATS message.
    pub max_body_bytes: usize,
    /// How long the controller's lease lasts without renewal (a standby takes over within it),
    /// in milliseconds; under 30 s.
    pub lease_ttl_ms: u64,
    /// How often the controller looks at every service's workers, in milliseconds.
    pub control_interval_ms: u64,
    /// The longest deadline a request may ask for (`parameters.timeout`), in milliseconds.
    pub max_deadline_ms: u64,
    /// How member requests reach the relays: `direct` (HTTP/1.1 to the relay a load report
    /// named, NATS when none is known) or `nats` (request/reply through nats-server only).
    pub channel: Channel,
    /// How long an inference call's accepted token is remembered, in milliseconds (a
    /// revocation or a role change reaches inference calls within it; kiln's own API checks
    /// every call); 0 checks every call in the database.
    pub token_cache_ms: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            grpc: GrpcConfig::local(DEFAULT_PORT),
            http_listen: SocketAddr::from(([127, 0, 0, 1], DEFAULT_HTTP_PORT)),
            http_advertise_url: String::new(),
            metrics: MetricsConfig::local(DEFAULT_METRICS_PORT),
            database: DatabaseConfig::default(),
            nats: NatsConfig::default(),
            max_body_bytes: 1 << 20,
            max_deadline_ms: 60_000,
            lease_ttl_ms: 10_000,
            control_interval_ms: 1_000,
            token_cache_ms: 5_000,
            channel: Channel::Direct,
        }
    }
}

impl ServiceConfig for Config {
    fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        self.database.validate(&mut problems);
        self.grpc.validate(&mut problems);
        self.nats.validate(&mut problems);
        self.metrics.validate(&mut problems);
        if self.max_body_bytes < 1024 {
            problems.push(format!("max-body-bytes is {}; give at least 1024", self.max_body_bytes));
        }
        if !(300..30_000).contains(&self.lease_ttl_ms) {
            problems.push(format!(
                "lease-ttl-ms is {}; give 300 to 29999 (the lease bucket forgets entries after 30 s)",
                self.lease_ttl_ms
            ));
        }
        if self.control_interval_ms == 0 {
            problems.push("control-interval-ms must be at least 1".into());
        }
        if self.token_cache_ms > 60_000 {
            problems.push(format!(
                "token-cache-ms is {}; give at most 60000, or a revoked token is served that long",
                self.token_cache_ms
            ));
        }
        if self.max_deadline_ms == 0 {
            problems.push("max-deadline-ms must be at least 1".into());
        }
        problems_to_result(problems)
    }
}
