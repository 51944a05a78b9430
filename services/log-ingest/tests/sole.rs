//! One log-ingest per NATS account while a store is SQLite (the `log-ingest` lease), and any
//! number on the ScyllaDB stores. Real nats-server; Cassandra (`KILN_TEST_SCYLLA_NODES`) for the
//! replicas.

use crate::common;

use std::path::Path;

use kiln_core::config::{DatabaseConfig, GrpcConfig};
use kiln_core::store::Store;
use kiln_core::testing::{NatsServer, sqlite_config};
use kiln_log_ingest::config::SqliteConfig;
use kiln_log_ingest::{Config, LogIngest, StoreKind};
use tokio_util::sync::CancellationToken;

async fn migrated(dir: &Path) -> DatabaseConfig {
    let database = sqlite_config(dir);
    Store::connect(&database).await.unwrap().migrate().await.unwrap();
    database
}

/// A log-ingest on its own SQLite files under `dir`.
fn config(nats: &NatsServer, database: &DatabaseConfig, dir: &Path) -> Config {
    Config {
        grpc: GrpcConfig::local(0),
        database: database.clone(),
        nats: nats.config(),
        sqlite: SqliteConfig {
            logs_path: dir.join("logs.db"),
            metrics_path: dir.join("metrics.db"),
        },
        ..Default::default()
    }
}

fn refusal(bound: kiln_log_ingest::Result<LogIngest>) -> String {
    match bound {
        Ok(_) => panic!("a second log-ingest with SQLite stores started"),
        Err(error) => error.to_string(),
    }
}

#[tokio::test]
async fn a_second_log_ingest_with_sqlite_is_refused_until_the_first_stops() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let database = migrated(dir.path()).await;
    let first = LogIngest::bind(config(&nats, &database, &dir.path().join("a")))
        .await
        .unwrap();
    let shutdown = CancellationToken::new();
    let served = tokio::spawn(first.serve(shutdown.clone()));

    let second = config(&nats, &database, &dir.path().join("b"));
    let message = refusal(LogIngest::bind(second.clone()).await);
    assert!(
        message.contains("set log-store = \"scylla\" and metric-store = \"scylla\""),
        "{message}"
    );
    assert!(
        message.contains(&format!("{}", dir.path().join("a").display())),
        "names the first: {message}"
    );
    // Past a renewal, still held; a metrics-only SQLite log-ingest is refused too.
    tokio::time::sleep(kiln_log_ingest::sole::TTL / 2).await;
    let logs_shared = Config {
        log_store: StoreKind::Scylla,
        ..second.clone()
    };
    assert!(kiln_log_ingest::sole::holder_name(&logs_shared).ends_with("metrics.db"));
    refusal(LogIngest::bind(second.clone()).await);

    shutdown.cancel();
    served.await.unwrap().unwrap();
    let again = LogIngest::bind(second)
        .await
        .expect("after the first stops, another starts");
    drop(again);
}

#[tokio::test]
async fn a_crashed_log_ingest_takes_its_own_lease_back_on_restart() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let database = migrated(dir.path()).await;
    let own = config(&nats, &database, &dir.path().join("a"));
    let first = LogIngest::bind(own.clone()).await.unwrap();
    // Aborted like `ServiceHandle::crash`: the lease is not given up.
    let served = tokio::spawn(first.serve(CancellationToken::new()));
    served.abort();
    let _ = served.await;

    refusal(LogIngest::bind(config(&nats, &database, &dir.path().join("b"))).await);
    let restarted = LogIngest::bind(own)
        .await
        .expect("the same files take their lease back");
    let shutdown = CancellationToken::new();
    let served = tokio::spawn(restarted.serve(shutdown.clone()));
    shutdown.cancel();
    served.await.unwrap().unwrap();
    LogIngest::bind(config(&nats, &database, &dir.path().join("b")))
        .await
        .expect("released at shutdown");
}

#[tokio::test]
async fn log_ingests_on_the_scylla_stores_run_side_by_side() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let database = migrated(dir.path()).await;
    // One keyspace for both replicas: the stores they share.
    let scylla = common::cassandra_config();
    let shared = |name: &str| Config {
        log_store: StoreKind::Scylla,
        metric_store: StoreKind::Scylla,
        scylla: scylla.clone(),
        ..config(&nats, &database, &dir.path().join(name))
    };
    let first = LogIngest::bind(shared("a")).await.unwrap();
    let second = LogIngest::bind(shared("b"))
        .await
        .expect("replicas on the shared stores");
    drop((first, second));
}
