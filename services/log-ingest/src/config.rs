//! log-ingest's configuration.

use std::path::PathBuf;

use kiln_core::config::{ConfigError, DatabaseConfig, GrpcConfig, NatsConfig};
use kiln_core::service::{ServiceConfig, problems_to_result};
use serde::{Deserialize, Serialize};

pub const DEFAULT_PORT: u16 = 7071;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct Config {
    pub grpc: GrpcConfig,
    /// The metadata database, for tokens and job ownership.
    pub database: DatabaseConfig,
    pub nats: NatsConfig,
    pub log_store: LogStoreConfig,
    /// Messages taken from JetStream and written in one batch, at most.
    pub batch_size: usize,
}

/// Where log lines are stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct LogStoreConfig {
    /// SQLite file of the embedded log store.
    pub sqlite_path: PathBuf,
    /// SQLite file of the embedded metric store.
    pub metrics_sqlite_path: PathBuf,
}

impl Default for LogStoreConfig {
    fn default() -> Self {
        LogStoreConfig {
            sqlite_path: PathBuf::from("./data/logs.db"),
            metrics_sqlite_path: PathBuf::from("./data/metrics.db"),
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            grpc: GrpcConfig::local(DEFAULT_PORT),
            database: DatabaseConfig::default(),
            nats: NatsConfig::default(),
            log_store: LogStoreConfig::default(),
            batch_size: 500,
        }
    }
}

impl ServiceConfig for Config {
    fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        self.database.validate(&mut problems);
        self.nats.validate(&mut problems);
        if !(1..=10_000).contains(&self.batch_size) {
            problems.push(format!("batch-size {} must be between 1 and 10000", self.batch_size));
        }
        problems_to_result(problems)
    }
}
