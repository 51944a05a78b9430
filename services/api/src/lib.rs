//! kiln-api: the front door. It owns users, tokens, job records and artifacts, and is the only
//! writer of user-facing state.
//!
//! - [`jobs`]: `JobService` (submit, get, list, stop, watch);
//! - [`artifacts`]: `ArtifactService` (content-addressed code bundles, job outputs);
//! - [`datasets`]: `DatasetService` (named, immutable archives mounted read-only by jobs);
//! - [`models`]: `ModelService` (the model registry, over [`kiln_core::models`]);
//! - [`users`] and [`projects`]: `UserService` (users, tokens) and `ProjectService` (projects,
//!   members in roles); `access` finds what a call addresses for [`kiln_core::authz`];
//! - [`secrets`]: `SecretService` (project secrets, sealed at rest, never read back);
//! - reconciler: at start and then periodically, publishes QUEUED and STOPPED changes that
//!   were committed but not published (a crash or a NATS outage between the two);
//! - [`http`]: the web UI's files and its HTTP API, a transcoder of the gRPC services;
//! - [`config`], [`error`], [`grpc`]: configuration, the error type and its mapping to statuses.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use kiln_core::auth::AuthLayer;
use kiln_core::events::republish_pending;
use kiln_core::metrics::Metrics;
use kiln_core::metrics::rpc::RpcMetricsLayer;
use kiln_core::store::Store;
use kiln_core::streams::Nats;
use kiln_core::{JobState, objects, streams};
use kiln_proto::v1::artifact_service_server::ArtifactServiceServer;
use kiln_proto::v1::dataset_service_server::DatasetServiceServer;
use kiln_proto::v1::job_service_server::JobServiceServer;
use kiln_proto::v1::model_service_server::ModelServiceServer;
use kiln_proto::v1::quota_service_server::QuotaServiceServer;
use kiln_proto::v1::secret_service_server::SecretServiceServer;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

mod access;
pub mod artifacts;
pub mod config;
pub mod datasets;
pub mod discovery;
pub mod error;
pub mod grpc;
pub mod http;
pub mod jobs;
pub mod models;
pub mod projects;
pub mod quotas;
mod runs;
pub mod secrets;
pub mod service_metrics;
pub mod users;

pub use config::Config;
pub use error::{Error, Result};

/// The api, connected and listening, not yet serving.
pub struct Api {
    config: Config,
    listener: TcpListener,
    /// The HTTP side's, when `[http] listen` is set.
    http_listener: Option<TcpListener>,
    store: Store,
    nats: Nats,
    metrics: Metrics,
    /// The key secrets are sealed with, when the config names one.
    secrets_key: Option<std::sync::Arc<kiln_core::secrets::SecretsKey>>,
}

impl Api {
    /// Connects to the database (applying migrations) and NATS, creates the bootstrap admin
    /// on first start, and binds the listener: everything that can fail fails here.
    pub async fn bind(config: Config) -> Result<Api> {
        let store = Store::connect(&config.database).await?;
        store.migrate().await?;
        if let Some(issued) = store.bootstrap_admin().await? {
            write_secret_file(&config.bootstrap_token_file, &issued.token)?;
            tracing::info!(path = %config.bootstrap_token_file.display(), "bootstrap admin token written");
        }
        let secrets_key = config.secrets.load()?.map(std::sync::Arc::new);
        if secrets_key.is_none() {
            tracing::warn!("no [secrets] key configured: `kiln secret set` is refused until one is");
        }
        let nats = streams::connect_as(&config.nats, kiln_core::nats_auth::Service::Api).await?;
        let listener = TcpListener::bind(config.grpc.listen)
            .await
            .map_err(|source| Error::Bind {
                addr: config.grpc.listen,
                source,
            })?;
        let http_listener = match config.http.listen {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .map_err(|source| Error::Bind { addr, source })?,
            ),
            None => None,
        };
        Ok(Api {
            config,
            listener,
            http_listener,
            store,
            nats,
            metrics: Metrics::default(),
            secrets_key,
        })
    }

    /// Sets the gRPC URLs the HTTP side calls log-ingest, item-batch, the advisor and the
    /// predictor at (known once they are bound, when they share a process with the api).
    pub fn with_http_upstreams(mut self, logs: String, batches: String, advisor: String, predictor: String) -> Api {
        let http = &mut self.config.http;
        (http.logs, http.batches, http.advisor, http.predictor) = (logs, batches, advisor, predictor);
        self
    }

    /// Registers the api's metrics in `metrics` (the process's registry) instead of a private one.
    pub fn with_metrics(mut self, metrics: &Metrics) -> Api {
        self.metrics = metrics.clone();
        self
    }

    pub fn nats(&self) -> &Nats {
        &self.nats
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("a bound listener has an address")
    }

    /// Where the web UI and the HTTP API listen, when they do.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_listener
            .as_ref()
            .map(|listener| listener.local_addr().expect("a bound listener has an address"))
    }

    /// Serves until `shutdown` is cancelled.
    pub async fn serve(mut self, shutdown: CancellationToken) -> Result<()> {
        let metrics = service_metrics::ApiMetrics::register(&self.metrics);
        let rpc_metrics = RpcMetricsLayer::new(&self.metrics, "api");
        self.store.count_transitions(&self.metrics, "api");
        let objects = objects::connect(&self.config.objects).await?;
        let (health_reporter, health_service) = tonic_health::server::health_reporter();
        health_reporter.set_serving::<JobServiceServer<jobs::JobsApi>>().await;
        let jobs = jobs::JobsApi {
            store: self.store.clone(),
            nats: self.nats.clone(),
            watch_poll: Duration::from_secs(1),
            explain_timeout: Duration::from_millis(self.config.explain_timeout_ms),
            metrics: metrics.clone(),
        };
        let artifacts = artifacts::ArtifactsApi {
            store: self.store.clone(),
            objects: objects.clone(),
            max_bytes: self.config.max_artifact_bytes,
        };
        let reconciler = tokio::spawn(reconcile(
            self.store.clone(),
            self.nats.clone(),
            metrics,
            Duration::from_millis(self.config.reconcile_interval_ms),
            shutdown.clone(),
        ));
        tracing::info!(addr = %self.local_addr(), "api serving");
        let routes = tonic::service::Routes::new(health_service)
            .add_service(kiln_core::whoami::NodeApi::new("api").server())
            .add_service(discovery::DiscoveryApi::new(&self.config, self.http_addr()).server())
            .add_service(JobServiceServer::new(jobs))
            .add_service(ArtifactServiceServer::new(artifacts))
            .add_service(DatasetServiceServer::new(datasets::DatasetsApi {
                store: self.store.clone(),
                objects: objects.clone(),
            }))
            .add_service(ModelServiceServer::new(models::ModelsApi {
                registry: kiln_core::models::Registry::new(self.store.clone(), objects, self.nats.clone()),
            }))
            .add_service(QuotaServiceServer::new(quotas::QuotasApi {
                store: self.store.clone(),
            }))
            .add_service(kiln_proto::v1::user_service_server::UserServiceServer::new(
                users::UsersApi {
                    store: self.store.clone(),
                    nats: self.nats.clone(),
                },
            ))
            .add_service(kiln_proto::v1::project_service_server::ProjectServiceServer::new(
                projects::ProjectsApi {
                    store: self.store.clone(),
                    nats: self.nats.clone(),
                },
            ))
            .add_service(SecretServiceServer::new(secrets::SecretsApi {
                store: self.store.clone(),
                key: self.secrets_key.clone(),
            }));
        let auth = AuthLayer::new(std::sync::Arc::new(self.store.clone()));
        let http = match self.http_listener.take() {
            Some(listener) => {
                // The HTTP side calls the api's own services through the same layers as a
                // gRPC client does, without a connection.
                let own = http::transcode::Upstream::new(
                    tower::ServiceBuilder::new()
                        .map_err(|never: std::convert::Infallible| -> tonic::Status { match never {} })
                        .layer(rpc_metrics.clone())
                        .layer(auth.clone())
                        .service(routes.clone()),
                );
                let gateway = http_gateway(&self.config, &self.store, own)?;
                tracing::info!(addr = %listener.local_addr().map_err(|source| Error::Bind { addr: self.config.http.listen.unwrap_or(self.config.grpc.listen), source })?, "web UI and HTTP API serving");
                let served = axum::serve(
                    kiln_core::tls::http_listener(listener, &self.config.grpc.tls)?,
                    http::router(std::sync::Arc::new(gateway)),
                )
                .with_graceful_shutdown(shutdown.clone().cancelled_owned());
                Some(tokio::spawn(async move { served.await }))
            }
            None => None,
        };
        let served = tonic::transport::Server::builder()
            .layer(rpc_metrics)
            .layer(auth)
            .add_routes(routes)
            .serve_with_incoming_shutdown(
                kiln_core::tls::incoming(self.listener, &self.config.grpc.tls)?,
                shutdown.clone().cancelled_owned(),
            )
            .await;
        shutdown.cancel();
        let _ = reconciler.await;
        if let Some(http) = http {
            match http.await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => tracing::error!(error = %error, "the HTTP side failed"),
                Err(error) => tracing::error!(error = %error, "the HTTP side panicked"),
            }
        }
        served?;
        Ok(())
    }
}

/// The HTTP side: the api's own services through `own`, the others over channels to their
/// URLs in `[http]`.
fn http_gateway(config: &Config, store: &Store, own: http::transcode::Upstream) -> Result<http::Gateway> {
    use http::transcode::Upstream;
    let mut upstreams = std::collections::HashMap::new();
    for service in [
        "JobService",
        "ArtifactService",
        "DatasetService",
        "ModelService",
        "QuotaService",
        "UserService",
        "ProjectService",
        "SecretService",
        "NodeService",
    ] {
        upstreams.insert(service.to_string(), own.clone());
    }
    let settings = &config.http;
    for (service, url) in [
        ("LogService", &settings.logs),
        ("BatchLogService", &settings.logs),
        ("BatchService", &settings.batches),
        ("SweepService", &settings.advisor),
        ("ServeService", &settings.predictor),
    ] {
        if url.is_empty() {
            continue;
        }
        let channel = kiln_core::tls::endpoint(url, &settings.tls)?.connect_lazy();
        let upstream = tower::ServiceBuilder::new()
            .map_err({
                let url = url.clone();
                move |error: tonic::transport::Error| {
                    tonic::Status::unavailable(format!("{service} is not reachable at {url}: {error}"))
                }
            })
            .service(channel);
        upstreams.insert(service.to_string(), Upstream::new(upstream));
    }
    Ok(http::Gateway {
        transcoder: http::transcode::Transcoder::new(upstreams),
        store: store.clone(),
        session_ms: i64::try_from(settings.session_hours).unwrap_or(720) * 3_600_000,
        secure: config.grpc.tls.enabled(),
        files: http::Files::find(settings.ui_dir.clone()),
    })
}

/// Runs the api until `shutdown` is cancelled, serving `/metrics` as `[metrics]` says.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<()> {
    let metrics = Metrics::default();
    let api = Api::bind(config.clone()).await?.with_metrics(&metrics);
    kiln_core::metrics::export(&config.metrics, &metrics, api.nats(), &shutdown).await?;
    api.serve(shutdown).await
}

/// Publishes committed but unpublished changes of the states the api makes.
/// Also counts the jobs not yet ended for `kiln_api_jobs`.
async fn reconcile(
    store: Store,
    nats: Nats,
    metrics: service_metrics::ApiMetrics,
    interval: Duration,
    shutdown: CancellationToken,
) {
    loop {
        match republish_pending(&nats, &store, &[JobState::Queued, JobState::Stopped]).await {
            Ok(0) => {}
            Ok(count) => {
                metrics.republished.inc_by(count as u64);
                tracing::info!(count, "re-drove unpublished job changes");
            }
            Err(error) => tracing::warn!(error = %error, "reconcile failed; retrying"),
        }
        if let Err(error) = metrics.count_jobs(&store).await {
            tracing::warn!(error = %error, "cannot count the jobs for kiln_api_jobs");
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

/// Writes a secret to a file only its owner can read.
fn write_secret_file(path: &Path, secret: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let io_error = |source| Error::Io {
        path: path.display().to_string(),
        source,
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(io_error)?;
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io_error)?;
    file.write_all(secret.as_bytes()).map_err(io_error)?;
    file.write_all(b"\n").map_err(io_error)
}
