//! log-ingest's configuration.

use std::path::PathBuf;

use kiln_core::config::{ConfigError, DatabaseConfig, GrpcConfig, NatsConfig};
use kiln_core::service::{ServiceConfig, problems_to_result};
use serde::{Deserialize, Serialize};

use crate::scylla_store::ScyllaConfig;

pub const DEFAULT_PORT: u16 = 7071;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct Config {
    pub grpc: GrpcConfig,
    /// The metadata database, for tokens and job ownership.
    pub database: DatabaseConfig,
    pub nats: NatsConfig,
    pub log_store: LogStoreConfig,
    /// Where metric points are kept: `sqlite` (embedded) or `scylla`.
    pub metric_store: MetricStoreKind,
    pub scylla: ScyllaConfig,
    /// Messages taken from JetStream and written in one batch, at most.
    pub batch_size: usize,
}

/// The metric store to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MetricStoreKind {
    Sqlite,
    Scylla,
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
            metric_store: MetricStoreKind::Sqlite,
            scylla: ScyllaConfig::default(),
            batch_size: 500,
        }
    }
}

impl ServiceConfig for Config {
    fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        self.database.validate(&mut problems);
        self.nats.validate(&mut problems);
        if self.metric_store == MetricStoreKind::Scylla {
            self.scylla.validate(&mut problems);
        }
        if !(1..=10_000).contains(&self.batch_size) {
            problems.push(format!("batch-size {} must be between 1 and 10000", self.batch_size));
        }
        problems_to_result(problems)
    }
}
