//! kiln-log-ingest: the durable intake and the reading side of job logs.
//!
//! - [`writer`]: consumes `KILN_LOGS` in batches into the [`store::LogStore`], acking after the
//!   write; then wakes the followers of the jobs it wrote;
//! - [`grpc`]: `LogService.GetLogs`, with follow (a live tail that ends when the job ends);
//! - [`store`]: the store trait and its embedded SQLite implementation.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::sync::Arc;

use kiln_core::auth::AuthLayer;
use kiln_core::store::Store;
use kiln_core::streams::{self, Nats};
use kiln_proto::v1::log_service_server::LogServiceServer;
use tokio::net::TcpListener;
use tokio::sync::broadcast;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;

pub mod config;
pub mod error;
pub mod grpc;
pub mod points;
pub mod scylla_store;
pub mod store;
pub mod writer;

pub use config::Config;
pub use error::{Error, Result};

const SCHEMA_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// log-ingest, connected and listening, not yet serving.
pub struct LogIngest {
    config: Config,
    listener: TcpListener,
    store: Store,
    nats: Nats,
    logs: Arc<dyn store::LogStore>,
    points: Arc<dyn points::MetricStore>,
}

impl LogIngest {
    pub async fn bind(config: Config) -> Result<LogIngest> {
        let store = Store::connect(&config.database).await?;
        store.wait_for_schema(SCHEMA_WAIT).await?;
        let nats = streams::connect(&config.nats).await?;
        let logs: Arc<dyn store::LogStore> =
            Arc::new(store::SqliteLogStore::open(&config.log_store.sqlite_path).await?);
        let points: Arc<dyn points::MetricStore> = match config.metric_store {
            config::MetricStoreKind::Sqlite => {
                Arc::new(points::SqliteMetricStore::open(&config.log_store.metrics_sqlite_path).await?)
            }
            config::MetricStoreKind::Scylla => Arc::new(scylla_store::ScyllaMetricStore::open(&config.scylla).await?),
        };
        let listener = TcpListener::bind(config.grpc.listen)
            .await
            .map_err(|source| Error::Bind {
                addr: config.grpc.listen,
                source,
            })?;
        Ok(LogIngest {
            config,
            listener,
            store,
            nats,
            logs,
            points,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("a bound listener has an address")
    }

    pub async fn serve(self, shutdown: CancellationToken) -> Result<()> {
        let (written, _) = broadcast::channel(1024);
        let log_writer = Arc::new(writer::LogWriter {
            store: self.logs.clone(),
            written: written.clone(),
        });
        let metric_writer = Arc::new(writer::MetricWriter {
            store: self.points.clone(),
        });
        let batch_size = self.config.batch_size;
        let writers = [
            tokio::spawn(kiln_core::intake::run(
                self.nats.clone(),
                writer::LOGS,
                batch_size,
                log_writer,
                shutdown.clone(),
            )),
            tokio::spawn(kiln_core::intake::run(
                self.nats.clone(),
                writer::METRICS,
                batch_size,
                metric_writer,
                shutdown.clone(),
            )),
        ];
        let (health_reporter, health_service) = tonic_health::server::health_reporter();
        health_reporter.set_serving::<LogServiceServer<grpc::LogsApi>>().await;
        let api = grpc::LogsApi {
            store: self.store.clone(),
            logs: self.logs.clone(),
            written,
            nats: self.nats.clone(),
            points: self.points.clone(),
            known_keys: Default::default(),
        };
        tracing::info!(addr = %self.local_addr(), "log-ingest serving");
        let served = tonic::transport::Server::builder()
            .layer(AuthLayer::new(Arc::new(self.store.clone())))
            .add_service(health_service)
            .add_service(LogServiceServer::new(api).max_decoding_message_size(grpc::MAX_REQUEST_BYTES * 2))
            .serve_with_incoming_shutdown(
                TcpListenerStream::new(self.listener),
                shutdown.clone().cancelled_owned(),
            )
            .await;
        shutdown.cancel();
        for writer in writers {
            let _ = writer.await;
        }
        served?;
        Ok(())
    }
}

/// Runs log-ingest until `shutdown` is cancelled.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<()> {
    LogIngest::bind(config).await?.serve(shutdown).await
}
