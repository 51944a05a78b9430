//! kiln-predictor: inference services. Each request for a service is fanned out to one worker
//! of each of its members, and the answers are combined by the service's ensemble rule and
//! returned by the deadline with what arrived, flagged partial when members are missing.
//!
//! - [`catalog`]: the services' live definitions, watched in `kiln_services`;
//! - [`fanout`]: one request to each member over NATS request/reply (the member's queue group
//!   picks a worker, so workers come and go without the predictor knowing their addresses);
//! - [`ensemble`]: the rules (mean, weighted mean, vote, first), exact and documented;
//! - [`infer`]: one inference whatever the protocol: lookup, access, input checks, deadline,
//!   quorum and the reply's `kiln.*` parameters;
//! - [`http`]: the Open Inference Protocol's REST API and [`predict`], SINGA-Auto's
//!   `POST /predict`; [`grpc`]: the Open Inference Protocol over gRPC, on the gRPC listener;
//! - [`manage`]: `ServeService`, services made, read, rolled, scaled and stopped, with their
//!   [`record`]s and [`revision`]s; [`controller`]: the lease holder keeping every service's
//!   worker jobs, switching rolls and splitting traffic, with the [`autoscale`]r;
//! - [`service_metrics`]: `kiln_predictor_*`, per service and member; [`traffic`]: each
//!   service's last five minutes of requests, for `GetService`.
//!
//! The predictor keeps no state of its own: replicas behind a load balancer answer alike.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kiln_core::auth::AuthLayer;
use kiln_core::metrics::Metrics;
use kiln_core::store::Store;
use kiln_core::streams::{self, Nats};
use kiln_formats::oip::Limits;
use kiln_proto::v1::serve_service_server::ServeServiceServer;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub mod autoscale;
pub mod catalog;
pub mod config;
pub mod controller;
pub mod direct;
pub mod ensemble;
pub mod error;
pub mod fanout;
mod feed;
pub mod grpc;
pub mod http;
pub mod infer;
pub mod manage;
pub mod predict;
pub mod record;
pub mod revision;
pub mod service_metrics;
pub mod traffic;

pub use config::Config;
pub use error::{Error, Result};

const SCHEMA_WAIT: Duration = Duration::from_secs(60);

/// What every request shares.
pub struct Shared {
    pub config: Config,
    /// Where tokens are checked (kiln's own API: every call).
    pub store: Store,
    /// Where inference calls' tokens are checked: the store, remembered for
    /// `token-cache-ms`.
    pub tokens: kiln_core::auth::CachedVerifier,
    pub nats: Nats,
    pub catalog: catalog::Catalog,
    pub metrics: service_metrics::PredictorMetrics,
    /// The bounds of a parsed request or a worker's answer.
    pub limits: Limits,
    pub services: record::ServiceStore,
    /// The REST API's base URL as clients reach it.
    pub http_url: String,
    /// Wakes the controller after a change.
    pub wake: tokio::sync::Notify,
    /// The workers' load, which the controller scales on.
    pub autoscaler: autoscale::Autoscaler,
    /// Requests this predictor answered for split services ([`infer`]'s traffic split).
    pub split_turns: std::sync::atomic::AtomicU64,
    /// Each service's recent requests, for `GetService`.
    pub traffic: traffic::Traffic,
    /// The relays' direct channels, from their load reports; `None` with `channel = "nats"`.
    pub directory: Option<direct::Directory>,
    /// Stopped services that had live workers at the controller's last pass: told to their
    /// watchers once more when the last has ended.
    pub draining: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl Shared {
    /// How member requests travel.
    pub fn channel(&self) -> fanout::Channel<'_> {
        fanout::Channel {
            nats: &self.nats.client,
            directory: self.directory.as_ref(),
        }
    }
}

/// The predictor, connected and listening, not yet serving.
pub struct Predictor {
    shared: Shared,
    http: TcpListener,
    /// kiln's own gRPC API (`ServeService`).
    grpc: TcpListener,
    metrics: Metrics,
}

impl Predictor {
    pub async fn bind(config: Config) -> Result<Predictor> {
        let store = Store::connect(&config.database).await?;
        store.wait_for_schema(SCHEMA_WAIT).await?;
        let nats = streams::connect_as(&config.nats, kiln_core::nats_auth::Service::Predictor).await?;
        let catalog = catalog::Catalog::open(&nats).await?;
        let http = TcpListener::bind(config.http_listen)
            .await
            .map_err(|source| Error::Bind {
                addr: config.http_listen,
                source,
            })?;
        let grpc = TcpListener::bind(config.grpc.listen)
            .await
            .map_err(|source| Error::Bind {
                addr: config.grpc.listen,
                source,
            })?;
        let http_url = if config.http_advertise_url.is_empty() {
            let addr = http.local_addr().map_err(|source| Error::Bind {
                addr: config.http_listen,
                source,
            })?;
            let scheme = if config.grpc.tls.cert_file.is_some() {
                "https"
            } else {
                "http"
            };
            format!("{scheme}://{addr}")
        } else {
            config.http_advertise_url.clone()
        };
        Ok(Predictor {
            shared: Shared {
                services: record::ServiceStore::new(&store).telling(kiln_core::feed::Changes::publish(
                    nats.jetstream.clone(),
                    kiln_core::subjects::CHANGES_SERVICES,
                )),
                draining: Default::default(),
                http_url,
                wake: tokio::sync::Notify::new(),
                autoscaler: Default::default(),
                split_turns: Default::default(),
                traffic: Default::default(),
                directory: (config.channel == config::Channel::Direct).then(direct::Directory::default),
                tokens: kiln_core::auth::CachedVerifier::new(
                    Arc::new(store.clone()),
                    Duration::from_millis(config.token_cache_ms),
                ),
                config,
                store,
                nats,
                catalog,
                metrics: Default::default(),
                limits: Limits::default(),
            },
            http,
            grpc,
            metrics: Metrics::default(),
        })
    }

    /// Registers the predictor's metrics in `metrics` (the process's registry) instead of a
    /// private one.
    pub fn with_metrics(mut self, metrics: &Metrics) -> Predictor {
        self.metrics = metrics.clone();
        self
    }

    pub fn nats(&self) -> &Nats {
        &self.shared.nats
    }

    /// The REST API's base URL as clients reach it (`https://` with TLS).
    pub fn http_url(&self) -> &str {
        &self.shared.http_url
    }

    /// Where the REST API listens.
    pub fn http_addr(&self) -> SocketAddr {
        self.http.local_addr().expect("a bound listener has an address")
    }

    /// Where the gRPC services listen: kiln's `ServeService` and the Open Inference Protocol's
    /// `inference.GRPCInferenceService`.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc.local_addr().expect("a bound listener has an address")
    }

    pub async fn serve(mut self, shutdown: CancellationToken) -> Result<()> {
        self.shared.metrics.register(&self.metrics);
        self.shared.store.count_transitions(&self.metrics, "predictor");
        let shared = Arc::new(self.shared);
        let rpc_metrics = kiln_core::metrics::rpc::RpcMetricsLayer::new(&self.metrics, "predictor");
        // A JoinSet aborts its tasks when dropped, so a serve future dropped mid-flight takes
        // the controller with it, as a process exit would.
        let mut tasks = tokio::task::JoinSet::new();
        tasks.spawn(shared.catalog.clone().watch(shutdown.clone()));
        tasks.spawn(controller::run(shared.clone(), shutdown.clone()));
        tasks.spawn(autoscale::listen(shared.clone(), shutdown.clone()));
        let (health_reporter, health_service) = tonic_health::server::health_reporter();
        health_reporter
            .set_serving::<ServeServiceServer<manage::ServeApi>>()
            .await;
        tracing::info!(http = %self.http.local_addr().map_err(|source| Error::Bind { addr: shared.config.http_listen, source })?, grpc = %self.grpc.local_addr().map_err(|source| Error::Bind { addr: shared.config.grpc.listen, source })?, "predictor serving");
        let grpc = tonic::transport::Server::builder()
            .layer(rpc_metrics)
            // The inference service authenticates its own calls (ServerLive and ServerReady
            // take no token); kiln's AuthLayer guards the rest.
            .layer(grpc::ExceptInference::new(AuthLayer::new(Arc::new(
                shared.store.clone(),
            ))))
            .add_service(health_service)
            .add_service(kiln_core::whoami::NodeApi::new("predictor").server())
            .add_service(ServeServiceServer::new(manage::ServeApi { shared: shared.clone() }))
            .add_service(grpc::InferenceApi::new(shared.clone()).server())
            .serve_with_incoming_shutdown(
                kiln_core::tls::incoming(self.grpc, &shared.config.grpc.tls)?,
                shutdown.clone().cancelled_owned(),
            );
        let http = axum::serve(
            kiln_core::tls::http_listener(self.http, &shared.config.grpc.tls)?,
            http::router(shared.clone()),
        )
        .with_graceful_shutdown(shutdown.clone().cancelled_owned());
        let (grpc, http) = tokio::join!(grpc, async { http.await });
        shutdown.cancel();
        while tasks.join_next().await.is_some() {}
        grpc.map_err(|error| Error::Internal(format!("gRPC server: {error}")))?;
        http.map_err(|error| Error::Internal(format!("HTTP server: {error}")))
    }
}

/// Runs the predictor until `shutdown` is cancelled, serving `/metrics` as `[metrics]` says.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<()> {
    let metrics = Metrics::default();
    let service = Predictor::bind(config.clone()).await?.with_metrics(&metrics);
    kiln_core::metrics::export(&config.metrics, &metrics, service.nats(), &shutdown).await?;
    service.serve(shutdown).await
}
