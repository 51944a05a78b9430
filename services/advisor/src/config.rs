//! The advisor's configuration.

use kiln_core::config::{ConfigError, DatabaseConfig, GrpcConfig, NatsConfig, ObjectStoreConfig};
use kiln_core::metrics::MetricsConfig;
use kiln_core::service::{ServiceConfig, problems_to_result};
use serde::{Deserialize, Serialize};

pub const DEFAULT_PORT: u16 = 7076;

/// Default port of the advisor's `/metrics`.
pub const DEFAULT_METRICS_PORT: u16 = 9476;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct Config {
    pub grpc: GrpcConfig,
    pub metrics: MetricsConfig,
    pub database: DatabaseConfig,
    pub nats: NatsConfig,
    /// Where the best trial's outputs are copied from when a sweep registers it as a model.
    pub objects: ObjectStoreConfig,
    /// The address trials reach the advisor at (given to them as `KILN_ADVISOR_ADDR`, for
    /// `kiln.should_stop()`); empty for `http://<listen address>` (`https://` with `[grpc.tls]`).
    pub advertise_url: String,
    /// This replica's name in the leader lease; empty picks a random one.
    pub instance_name: String,
    /// How long the leader's lease lasts without renewal: a standby takes over the sweeps
    /// within it. Under 30 s (the lease bucket's max age).
    pub lease_ttl_ms: u64,
    /// How often the leader looks at every live sweep (and sooner when a trial's job changes
    /// state), in milliseconds.
    pub pass_interval_ms: u64,
    /// How long a trial stopped early may end by itself (it sees `kiln.should_stop()`) before
    /// its job is stopped, in milliseconds.
    pub stop_grace_ms: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            grpc: GrpcConfig::local(DEFAULT_PORT),
            metrics: MetricsConfig::local(DEFAULT_METRICS_PORT),
            database: DatabaseConfig::default(),
            nats: NatsConfig::default(),
            objects: ObjectStoreConfig::default(),
            advertise_url: String::new(),
            instance_name: String::new(),
            lease_ttl_ms: 10_000,
            pass_interval_ms: 1_000,
            stop_grace_ms: 10_000,
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
        if self.pass_interval_ms == 0 {
            problems.push("pass-interval-ms must be at least 1".into());
        }
        if !(300..30_000).contains(&self.lease_ttl_ms) {
            problems.push(format!(
                "lease-ttl-ms is {}; give 300 to 29999 (the lease bucket forgets entries after 30 s)",
                self.lease_ttl_ms
            ));
        }
        problems_to_result(problems)
    }
}
