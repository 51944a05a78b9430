//! log-ingest's configuration.

use std::path::PathBuf;

use kiln_core::config::{ConfigError, DatabaseConfig, GrpcConfig, NatsConfig};
use kiln_core::metrics::MetricsConfig;
use kiln_core::service::{ServiceConfig, problems_to_result};
use serde::{Deserialize, Serialize};

use crate::scylla_store::ScyllaConfig;

pub const DEFAULT_PORT: u16 = 7071;

/// Default port of log-ingest's `/metrics`.
pub const DEFAULT_METRICS_PORT: u16 = 9471;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct Config {
    pub grpc: GrpcConfig,
    pub metrics: MetricsConfig,
    /// The metadata database, for tokens and job ownership.
    pub database: DatabaseConfig,
    pub nats: NatsConfig,
    /// Where log lines are kept: `sqlite` (embedded, one replica) or `scylla` (shared).
    pub log_store: StoreKind,
    /// Where metric points are kept: `sqlite` (embedded, one replica) or `scylla` (shared).
    pub metric_store: StoreKind,
    /// The files of the embedded stores.
    pub sqlite: SqliteConfig,
    pub scylla: ScyllaConfig,
    /// Messages taken from JetStream and written in one batch, at most.
    pub batch_size: usize,
    /// How long a metric read (QueryMetrics, LatestMetrics, ListMetricKeys) waits, at most, for
    /// the writers to store every point written before it (read-your-writes, see
    /// [`crate::caught_up`]); past it, the read answers what is stored and counts a stale read.
    /// 0: reads never wait.
    pub read_wait_ms: u64,
}

/// A store of log lines or metric points. An embedded SQLite store belongs to one log-ingest:
/// with it, log-ingest takes the `log-ingest` lease at start, so a second replica on the same
/// NATS account refuses to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StoreKind {
    Sqlite,
    Scylla,
}

/// The files of the embedded stores.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct SqliteConfig {
    /// SQLite file of the embedded log store.
    pub logs_path: PathBuf,
    /// SQLite file of the embedded metric store.
    pub metrics_path: PathBuf,
}

impl Default for SqliteConfig {
    fn default() -> Self {
        SqliteConfig {
            logs_path: PathBuf::from("./data/logs.db"),
            metrics_path: PathBuf::from("./data/metrics.db"),
        }
    }
}

impl Config {
    /// Whether either store is embedded (so this log-ingest must be the only one).
    pub fn uses_sqlite(&self) -> bool {
        self.log_store == StoreKind::Sqlite || self.metric_store == StoreKind::Sqlite
    }

    pub fn uses_scylla(&self) -> bool {
        self.log_store == StoreKind::Scylla || self.metric_store == StoreKind::Scylla
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            grpc: GrpcConfig::local(DEFAULT_PORT),
            metrics: MetricsConfig::local(DEFAULT_METRICS_PORT),
            database: DatabaseConfig::default(),
            nats: NatsConfig::default(),
            log_store: StoreKind::Sqlite,
            metric_store: StoreKind::Sqlite,
            sqlite: SqliteConfig::default(),
            scylla: ScyllaConfig::default(),
            batch_size: 500,
            read_wait_ms: 5000,
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
        if self.uses_scylla() {
            self.scylla.validate(&mut problems);
        }
        if !(1..=10_000).contains(&self.batch_size) {
            problems.push(format!("batch-size {} must be between 1 and 10000", self.batch_size));
        }
        if self.read_wait_ms > 600_000 {
            problems.push(format!(
                "read-wait-ms {} must be at most 600000 (ten minutes)",
                self.read_wait_ms
            ));
        }
        problems_to_result(problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_wait_over_ten_minutes_is_refused_with_its_key() {
        let wait = |read_wait_ms| Config {
            read_wait_ms,
            ..Config::default()
        };
        assert!(wait(0).validate().is_ok(), "0: reads never wait");
        assert!(wait(600_000).validate().is_ok());
        let refused = wait(600_001).validate().unwrap_err().to_string();
        assert!(refused.contains("read-wait-ms 600001"), "{refused}");
    }
}
