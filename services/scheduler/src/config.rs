//! The scheduler's configuration.

use kiln_core::config::{ConfigError, DatabaseConfig, GrpcConfig, NatsConfig};
use kiln_core::service::{ServiceConfig, problems_to_result};
use serde::{Deserialize, Serialize};

pub const DEFAULT_PORT: u16 = 7073;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct Config {
    /// Health endpoint.
    pub grpc: GrpcConfig,
    pub database: DatabaseConfig,
    pub nats: NatsConfig,
    /// Longest wait between scheduling passes, in milliseconds; job events wake it sooner.
    pub pass_interval_ms: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            grpc: GrpcConfig::local(DEFAULT_PORT),
            database: DatabaseConfig::default(),
            nats: NatsConfig::default(),
            pass_interval_ms: if cfg!(test) { 100 } else { 1_000 },
        }
    }
}

impl ServiceConfig for Config {
    fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        self.database.validate(&mut problems);
        self.nats.validate(&mut problems);
        if self.pass_interval_ms == 0 {
            problems.push("pass-interval-ms must be at least 1".into());
        }
        problems_to_result(problems)
    }
}
