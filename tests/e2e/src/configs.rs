//! The configurations of the stack's services.

use std::net::SocketAddr;

use kiln_core::config::{DatabaseConfig, GrpcConfig, ObjectStoreConfig};
use kiln_core::nats_auth::Service;

use crate::{ServiceHandle, StackNats, ephemeral};

pub(crate) fn api_config(
    nats: &StackNats,
    database: &DatabaseConfig,
    objects: &ObjectStoreConfig,
    dir: &std::path::Path,
    listen: SocketAddr,
) -> kiln_api::Config {
    kiln_api::Config {
        grpc: GrpcConfig::at(listen),
        database: database.clone(),
        nats: nats.service_config(Service::Api),
        objects: objects.clone(),
        secrets: secrets_config(dir),
        bootstrap_token_file: dir.join("admin.token"),
        reconcile_interval_ms: 200,
        ..Default::default()
    }
}

/// The stack's log-ingest: SQLite stores in `dir`.
pub(crate) fn logs_config(
    nats: &StackNats,
    database: &DatabaseConfig,
    dir: &std::path::Path,
    grpc: GrpcConfig,
) -> kiln_log_ingest::Config {
    kiln_log_ingest::Config {
        grpc,
        database: database.clone(),
        nats: nats.service_config(Service::LogIngest),
        sqlite: kiln_log_ingest::config::SqliteConfig {
            logs_path: dir.join("logs.db"),
            metrics_path: dir.join("metrics.db"),
        },
        ..Default::default()
    }
}

/// The stack's secrets key (`secrets.key` in its dir, made on first use), for its api and runners.
pub fn secrets_config(dir: &std::path::Path) -> kiln_core::secrets::SecretsConfig {
    let key_file = dir.join("secrets.key");
    kiln_core::secrets::ensure_key_file(&key_file).expect("the stack's secrets key");
    kiln_core::secrets::SecretsConfig {
        key_file,
        ..Default::default()
    }
}

/// A scheduler configuration for a stack.
pub fn scheduler_config(nats: &StackNats, database: &DatabaseConfig, name: &str) -> kiln_scheduler::Config {
    kiln_scheduler::Config {
        grpc: ephemeral(),
        database: database.clone(),
        nats: nats.service_config(Service::Scheduler),
        pass_interval_ms: 100,
        instance_name: name.to_string(),
        lease_ttl_ms: 1_500,
        ..Default::default()
    }
}

/// Starts a scheduler (it leads once it holds the lease).
pub async fn spawn_scheduler(config: kiln_scheduler::Config) -> ServiceHandle {
    let scheduler = kiln_scheduler::Scheduler::bind(config).await.expect("scheduler binds");
    ServiceHandle::spawn(|token| scheduler.serve(token))
}
