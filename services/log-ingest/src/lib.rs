//! kiln-log-ingest: the durable intake and the reading side of job logs.
//!
//! - [`writer`]: consumes `KILN_LOGS` in batches into the [`store::LogStore`], acking after the
//!   write; then wakes the followers of the jobs it wrote;
//! - [`grpc`]: `LogService.GetLogs`, with follow (a live tail that ends when the job ends);
//! - [`caught_up`]: read-your-writes: a metric read waits for the writers to store what was
//!   written before it;
//! - [`store`], [`points`]: the store traits and their embedded SQLite implementations;
//! - [`scylla_store`]: both stores on ScyllaDB, shared by every replica;
//! - [`sole`]: with a SQLite store, the lease that keeps a second log-ingest out.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::sync::Arc;

use kiln_core::auth::AuthLayer;
use kiln_core::metrics::Metrics;
use kiln_core::metrics::rpc::RpcMetricsLayer;
use kiln_core::store::Store;
use kiln_core::streams::{self, Nats};
use kiln_proto::v1::batch_log_service_server::BatchLogServiceServer;
use kiln_proto::v1::log_service_server::LogServiceServer;
use tokio::net::TcpListener;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

pub mod caught_up;
pub mod config;
pub mod error;
pub mod grpc;
pub mod item_lines;
pub mod latest_values;
pub mod points;
pub mod scylla_store;
pub mod service_metrics;
pub mod sole;
pub mod store;
pub mod writer;

pub use config::{Config, StoreKind};
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
    lease: Option<sole::SoleLease>,
    metrics: Metrics,
}

impl LogIngest {
    pub async fn bind(config: Config) -> Result<LogIngest> {
        let store = Store::connect(&config.database).await?;
        store.wait_for_schema(SCHEMA_WAIT).await?;
        let nats = streams::connect_as(&config.nats, kiln_core::nats_auth::Service::LogIngest).await?;
        let scylla = match config.uses_scylla() {
            true => Some(scylla_store::connect(&config.scylla).await?),
            false => None,
        };
        let logs: Arc<dyn store::LogStore> = match &scylla {
            Some(session) if config.log_store == StoreKind::Scylla => {
                Arc::new(scylla_store::ScyllaLogStore::new(session.clone(), &config.scylla).await?)
            }
            _ => Arc::new(store::SqliteLogStore::open(&config.sqlite.logs_path).await?),
        };
        let points: Arc<dyn points::MetricStore> = match &scylla {
            Some(session) if config.metric_store == StoreKind::Scylla => {
                Arc::new(scylla_store::ScyllaMetricStore::new(session.clone(), &config.scylla).await?)
            }
            _ => Arc::new(points::SqliteMetricStore::open(&config.sqlite.metrics_path).await?),
        };
        // After the stores are open: the lease's holder name has their files' real paths.
        let lease = sole::SoleLease::take(&nats, &config).await?;
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
            lease,
            metrics: Metrics::default(),
        })
    }

    /// Registers log-ingest's metrics in `metrics` (the process's registry) instead of a
    /// private one.
    pub fn with_metrics(mut self, metrics: &Metrics) -> LogIngest {
        self.metrics = metrics.clone();
        self
    }

    pub fn nats(&self) -> &Nats {
        &self.nats
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("a bound listener has an address")
    }

    pub async fn serve(mut self, shutdown: CancellationToken) -> Result<()> {
        let addr = self.local_addr();
        let metrics = service_metrics::IngestMetrics::register(&self.metrics);
        let rpc_metrics = RpcMetricsLayer::new(&self.metrics, "log-ingest");
        self.store.count_transitions(&self.metrics, "log-ingest");
        let rate = tokio::spawn(metrics.clone().track_rate(shutdown.clone()));
        let held = self.lease.map(|lease| tokio::spawn(lease.hold(shutdown.clone())));
        let (written, _) = broadcast::channel(1024);
        let log_writer = Arc::new(writer::LogWriter {
            store: self.logs.clone(),
            written: written.clone(),
            counters: metrics.lines.clone(),
        });
        let metric_writer = Arc::new(writer::MetricWriter {
            store: self.points.clone(),
            counters: metrics.points.clone(),
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
            tokio::spawn(kiln_core::intake::run(
                self.nats.clone(),
                item_lines::ITEM_LINES,
                batch_size,
                Arc::new(item_lines::ItemLineWriter {
                    store: self.logs.clone(),
                }),
                shutdown.clone(),
            )),
        ];
        use kiln_core::subjects::{CONSUMER_ITEM_LINES, CONSUMER_METRICS, STREAM_ITEM_RESULTS, STREAM_METRICS};
        let caught_up = caught_up::CaughtUp::new(self.nats.clone(), STREAM_METRICS, CONSUMER_METRICS);
        let items_caught_up = caught_up::CaughtUp::new(self.nats.clone(), STREAM_ITEM_RESULTS, CONSUMER_ITEM_LINES);
        let marks = tokio::spawn(caught_up.clone().run(shutdown.clone()));
        let item_marks = tokio::spawn(items_caught_up.clone().run(shutdown.clone()));
        let (health_reporter, health_service) = tonic_health::server::health_reporter();
        health_reporter.set_serving::<LogServiceServer<grpc::LogsApi>>().await;
        let api = grpc::LogsApi {
            store: self.store.clone(),
            logs: self.logs.clone(),
            written,
            nats: self.nats.clone(),
            points: self.points.clone(),
            known_keys: Default::default(),
            caught_up,
            items_caught_up,
            read_wait: std::time::Duration::from_millis(self.config.read_wait_ms),
            stale_reads: metrics.stale_reads.clone(),
        };
        tokio::spawn(latest_values::serve(api.clone(), shutdown.clone()));
        tracing::info!(%addr, "log-ingest serving");
        let served = tonic::transport::Server::builder()
            .layer(rpc_metrics)
            .layer(AuthLayer::new(Arc::new(self.store.clone())))
            .add_service(health_service)
            .add_service(kiln_core::whoami::NodeApi::new("log-ingest").server())
            .add_service(BatchLogServiceServer::new(api.clone()))
            .add_service(LogServiceServer::new(api).max_decoding_message_size(grpc::MAX_REQUEST_BYTES * 2))
            .serve_with_incoming_shutdown(
                kiln_core::tls::incoming(self.listener, &self.config.grpc.tls)?,
                shutdown.clone().cancelled_owned(),
            )
            .await;
        shutdown.cancel();
        for writer in writers {
            let _ = writer.await;
        }
        let _ = rate.await;
        let _ = marks.await;
        let _ = item_marks.await;
        if let Some(held) = held {
            let lease = held
                .await
                .map_err(|e| Error::LogStore(format!("the lease task failed: {e}")))??;
            lease.release().await;
        }
        served?;
        Ok(())
    }
}

/// Runs log-ingest until `shutdown` is cancelled, serving `/metrics` as `[metrics]` says.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<()> {
    let metrics = Metrics::default();
    let service = LogIngest::bind(config.clone()).await?.with_metrics(&metrics);
    kiln_core::metrics::export(&config.metrics, &metrics, service.nats(), &shutdown).await?;
    service.serve(shutdown).await
}
