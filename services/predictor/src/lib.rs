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
//!   `POST /predict`;
//! - [`service_metrics`]: `kiln_predictor_*`, per service and member.
//!
//! The predictor keeps no state of its own: replicas behind a load balancer answer alike.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kiln_core::metrics::Metrics;
use kiln_core::store::Store;
use kiln_core::streams::{self, Nats};
use kiln_formats::oip::Limits;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub mod catalog;
pub mod config;
pub mod ensemble;
pub mod error;
pub mod fanout;
pub mod http;
pub mod infer;
pub mod predict;
pub mod service_metrics;

pub use config::Config;
pub use error::{Error, Result};

const SCHEMA_WAIT: Duration = Duration::from_secs(60);

/// What every request shares.
pub struct Shared {
    pub config: Config,
    /// Where tokens are checked.
    pub store: Store,
    pub nats: Nats,
    pub catalog: catalog::Catalog,
    pub metrics: service_metrics::PredictorMetrics,
    /// The bounds of a parsed request or a worker's answer.
    pub limits: Limits,
}

/// The predictor, connected and listening, not yet serving.
pub struct Predictor {
    shared: Shared,
    http: TcpListener,
    metrics: Metrics,
}

impl Predictor {
    pub async fn bind(config: Config) -> Result<Predictor> {
        let store = Store::connect(&config.database).await?;
        store.wait_for_schema(SCHEMA_WAIT).await?;
        let nats = streams::connect(&config.nats).await?;
        let catalog = catalog::Catalog::open(&nats).await?;
        let http = TcpListener::bind(config.http_listen)
            .await
            .map_err(|source| Error::Bind {
                addr: config.http_listen,
                source,
            })?;
        Ok(Predictor {
            shared: Shared {
                config,
                store,
                nats,
                catalog,
                metrics: Default::default(),
                limits: Limits::default(),
            },
            http,
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

    /// Where the REST API listens.
    pub fn http_addr(&self) -> SocketAddr {
        self.http.local_addr().expect("a bound listener has an address")
    }

    pub async fn serve(self, shutdown: CancellationToken) -> Result<()> {
        self.shared.metrics.register(&self.metrics);
        let shared = Arc::new(self.shared);
        let mut tasks = tokio::task::JoinSet::new();
        tasks.spawn(shared.catalog.clone().watch(shutdown.clone()));
        tracing::info!(http = %self.http.local_addr().map_err(|source| Error::Bind { addr: shared.config.http_listen, source })?, "predictor serving");
        let served = axum::serve(self.http, http::router(shared.clone()))
            .with_graceful_shutdown(shutdown.clone().cancelled_owned())
            .await;
        shutdown.cancel();
        while tasks.join_next().await.is_some() {}
        served.map_err(|error| Error::Internal(format!("HTTP server: {error}")))
    }
}

/// Runs the predictor until `shutdown` is cancelled, serving `/metrics` as `[metrics]` says.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<()> {
    let metrics = Metrics::default();
    let service = Predictor::bind(config.clone()).await?.with_metrics(&metrics);
    kiln_core::metrics::export(&config.metrics, &metrics, service.nats(), &shutdown).await?;
    service.serve(shutdown).await
}
