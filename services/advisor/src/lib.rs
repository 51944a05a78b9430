//! kiln-advisor: hyper-parameter sweeps. A sweep's spec names a search space, an algorithm, an
//! early-stop rule and a budget; the advisor suggests each trial's knobs, runs the trial as an
//! ordinary job (quotas, fair share and markets apply), reads the objective the trial logs from
//! `KILN_METRICS`, stops losers early, and ends the sweep when its budget is spent, registering
//! the best trial as a model version when the spec asks.
//!
//! - [`space`]: the `parameters:` block of a sweep spec, validated into a [`space::Space`]
//!   (floats, ints, categoricals, log scales, steps, conditional `when` parameters);
//! - [`algo`]: suggestion algorithms (random, Sobol, Latin hypercube, grid, multivariate TPE
//!   with a constant liar), each a pure function of `(options, space, history, index)`, so an
//!   advisor that replays its record makes the same next suggestion;
//! - [`stop`]: early stopping (ASHA with optional Hyperband brackets, median stopping), a pure
//!   decision over a trial's learning curve and its peers';
//! - [`spec`]: the whole sweep spec, checked with every problem naming its field;
//! - [`record`]: the sweep tables and each sweep's append-only record; [`state`]: a sweep as
//!   its record tells it;
//! - [`leader`]: the lease holder's passes over the live sweeps, with [`observe`] (trials'
//!   points from `KILN_METRICS`), [`trials`] (trials as jobs) and [`register`] (the best trial
//!   into the model registry);
//! - [`grpc`]: `SweepService`, served by every replica; [`service_metrics`]: `kiln_advisor_*`.
//!
//! Values given to the algorithms are oriented so that lower is better; `goal: maximize`
//! objectives are negated ([`spec::Objective::oriented`]).
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kiln_core::auth::AuthLayer;
use kiln_core::metrics::Metrics;
use kiln_core::metrics::rpc::RpcMetricsLayer;
use kiln_core::store::Store;
use kiln_core::streams::{self, Nats};
use kiln_proto::v1::sweep_service_server::SweepServiceServer;
use object_store::ObjectStore;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub mod algo;
pub mod config;
pub mod error;
mod feed;
pub mod grpc;
pub mod leader;
pub mod observe;
pub mod record;
pub mod register;
pub mod service_metrics;
pub mod space;
pub mod spec;
pub mod state;
pub mod stop;
pub mod trials;

pub use config::Config;
pub use error::{Error, Result};

const SCHEMA_WAIT: Duration = Duration::from_secs(60);

/// What every part of the advisor shares.
pub struct Shared {
    pub config: Config,
    pub store: Store,
    pub sweeps: record::SweepStore,
    pub nats: Nats,
    pub objects: Arc<dyn ObjectStore>,
    /// Where trials reach this service (`KILN_ADVISOR_ADDR`).
    pub advertise_url: String,
    pub metrics: service_metrics::AdvisorMetrics,
}

/// The advisor, connected and listening, not yet serving.
pub struct Advisor {
    shared: Shared,
    listener: TcpListener,
    metrics: Metrics,
}

impl Advisor {
    pub async fn bind(config: Config) -> Result<Advisor> {
        let store = Store::connect(&config.database).await?;
        store.wait_for_schema(SCHEMA_WAIT).await?;
        let nats = streams::connect_as(&config.nats, kiln_core::nats_auth::Service::Advisor).await?;
        let objects = kiln_core::objects::connect(&config.objects)
            .await
            .map_err(|error| Error::Internal(format!("object store: {error}")))?;
        let listener = TcpListener::bind(config.grpc.listen)
            .await
            .map_err(|source| Error::Bind {
                addr: config.grpc.listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| Error::Bind {
            addr: config.grpc.listen,
            source,
        })?;
        let advertise_url = if config.advertise_url.is_empty() {
            let scheme = if config.grpc.tls.enabled() { "https" } else { "http" };
            format!("{scheme}://{addr}")
        } else {
            config.advertise_url.clone()
        };
        let shared = Shared {
            sweeps: record::SweepStore::new(&store).telling(kiln_core::feed::Changes::publish(
                nats.jetstream.clone(),
                kiln_core::subjects::CHANGES_SWEEPS,
            )),
            store,
            nats,
            objects,
            advertise_url,
            config,
            metrics: Default::default(),
        };
        Ok(Advisor {
            shared,
            listener,
            metrics: Metrics::default(),
        })
    }

    /// Registers the advisor's metrics in `metrics` (the process's registry) instead of a
    /// private one.
    pub fn with_metrics(mut self, metrics: &Metrics) -> Advisor {
        self.metrics = metrics.clone();
        self
    }

    pub fn nats(&self) -> &Nats {
        &self.shared.nats
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("a bound listener has an address")
    }

    pub async fn serve(self, shutdown: CancellationToken) -> Result<()> {
        let mut shared = self.shared;
        shared.store.count_transitions(&self.metrics, "advisor");
        shared.metrics.register(&self.metrics);
        let shared = Arc::new(shared);
        let rpc_metrics = RpcMetricsLayer::new(&self.metrics, "advisor");
        // A JoinSet aborts its tasks when dropped, so a serve future dropped mid-flight takes
        // the leader with it, as a process exit would.
        let mut tasks = tokio::task::JoinSet::new();
        tasks.spawn(leader::run(shared.clone(), shutdown.clone()));
        let (health_reporter, health_service) = tonic_health::server::health_reporter();
        health_reporter
            .set_serving::<SweepServiceServer<grpc::SweepApi>>()
            .await;
        let sweeps = grpc::SweepApi { shared: shared.clone() };
        tracing::info!(addr = %self.listener.local_addr().map_err(|source| Error::Bind { addr: shared.config.grpc.listen, source })?, "advisor serving");
        let served = tonic::transport::Server::builder()
            .layer(rpc_metrics)
            .layer(AuthLayer::new(Arc::new(shared.store.clone())))
            .add_service(health_service)
            .add_service(kiln_core::whoami::NodeApi::new("advisor").server())
            .add_service(SweepServiceServer::new(sweeps))
            .serve_with_incoming_shutdown(
                kiln_core::tls::incoming(self.listener, &shared.config.grpc.tls)?,
                shutdown.clone().cancelled_owned(),
            )
            .await;
        shutdown.cancel();
        while tasks.join_next().await.is_some() {}
        served?;
        Ok(())
    }
}

/// Runs the advisor until `shutdown` is cancelled, serving `/metrics` as `[metrics]` says.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<()> {
    let metrics = Metrics::default();
    let service = Advisor::bind(config.clone()).await?.with_metrics(&metrics);
    kiln_core::metrics::export(&config.metrics, &metrics, service.nats(), &shutdown).await?;
    service.serve(shutdown).await
}
