//! item-batch's configuration.

use std::path::PathBuf;

use kiln_core::config::{ConfigError, DatabaseConfig, GrpcConfig, NatsConfig, ObjectStoreConfig};
use kiln_core::metrics::MetricsConfig;
use kiln_core::service::{ServiceConfig, problems_to_result};
use serde::{Deserialize, Serialize};

pub const DEFAULT_PORT: u16 = 7075;

/// Default port of item-batch's `/metrics`.
pub const DEFAULT_METRICS_PORT: u16 = 9475;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct Config {
    pub grpc: GrpcConfig,
    pub metrics: MetricsConfig,
    pub database: DatabaseConfig,
    pub nats: NatsConfig,
    /// Where AddItemsFromObjects lists prefixes and reads manifests.
    pub objects: ObjectStoreConfig,
    /// The address workers reach item-batch at (given to them as `KILN_ITEMS_ADDR`); empty for
    /// `http://<listen address>` (`https://` with `[grpc.tls]`).
    pub advertise_url: String,
    /// The kiln-agent program that process workers (batches without an image) run; empty for
    /// `kiln-agent` beside the running program.
    pub agent_path: PathBuf,
    /// How often the autoscaler looks at every live batch, in milliseconds.
    pub scale_interval_ms: u64,
    /// This replica's name in the scaler's leader lease; empty picks a random one.
    pub instance_name: String,
    /// How long the scaler leader's lease lasts without renewal: a standby replica takes over
    /// the scaler within it. Under 30 s (the lease bucket's max age).
    pub lease_ttl_ms: u64,
    /// A worker that had nothing to do for this long is told to stop, in milliseconds, unless
    /// items of its batch wait that no worker took (its fetches came back empty for another cause).
    pub idle_stop_ms: u64,
    /// How long an item may go without a heartbeat before JetStream gives it to another worker,
    /// in seconds (agents beat every few seconds).
    pub ack_wait_secs: u64,
    /// Wait before the second attempt of a failed item, in milliseconds; doubled per attempt,
    /// at most a minute.
    pub retry_backoff_ms: u64,
    /// Workers of a batch that may fail in a row (an image that cannot run, a runner without
    /// the agent binary) before the batch stalls: it asks for no more until `kiln batch retry`.
    /// 0 never stalls.
    pub max_worker_failures: u32,
    /// Output lines kept of each item attempt (its last ones; the earlier are counted), for
    /// `kiln batch logs`. At most 2,000, so an outcome stays well within a NATS message.
    pub item_lines_kept: u32,
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
            agent_path: PathBuf::new(),
            scale_interval_ms: 1_000,
            instance_name: String::new(),
            lease_ttl_ms: 10_000,
            idle_stop_ms: 10_000,
            ack_wait_secs: 30,
            retry_backoff_ms: 1_000,
            max_worker_failures: 5,
            item_lines_kept: 100,
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
        if self.scale_interval_ms == 0 {
            problems.push("scale-interval-ms must be at least 1".into());
        }
        if !(300..30_000).contains(&self.lease_ttl_ms) {
            problems.push(format!(
                "lease-ttl-ms is {}; give 300 to 29999 (the lease bucket forgets entries after 30 s)",
                self.lease_ttl_ms
            ));
        }
        if !(1..=2_000).contains(&self.item_lines_kept) {
            problems.push(format!("item-lines-kept is {}; give 1 to 2000", self.item_lines_kept));
        }
        if self.ack_wait_secs < 10 {
            problems.push(format!(
                "ack-wait-secs {} must be at least 10 (agents beat every 3 seconds)",
                self.ack_wait_secs
            ));
        }
        problems_to_result(problems)
    }
}
