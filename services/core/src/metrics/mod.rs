//! Prometheus metrics: one registry a process, one sub-registry a service, served as text at
//! `/metrics` on a port of each service's own (`[metrics] listen`).
//!
//! - [`Metrics`] is the registry handle. A service registers its metrics once, at start, under
//!   `kiln_<service>_` ([`Metrics::register`]); `kiln up` hands every service the same handle, so
//!   one endpoint serves them all.
//! - [`rpc`]: the tower layer every gRPC server wears, counting requests, errors by gRPC code
//!   and latency by method.
//! - [`nats`]: JetStream consumer lag read by kiln itself, and nats-server's `/varz`, as
//!   `kiln_nats_*`.
//! - [`export`] binds the endpoint and starts what the configuration asks for.
//!
//! Names read `kiln_<service>_<what>_<unit>`; histograms are classic ones with the explicit
//! buckets below. Labels never carry a job, run, item, batch or user id: their values come from
//! bounded sets (gRPC method, state, pool, market, reason, project).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use prometheus_client::registry::{Metric, Registry, Unit};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::streams::Nats;

pub mod nats;
pub mod rpc;
mod text;
mod varz;

pub use text::{reference, to_text_format};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

/// Buckets of a latency in seconds, 1 ms to 60 s.
pub const SECONDS_BUCKETS: [f64; 15] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Buckets of a slow duration in seconds (a launch, an upload), 100 ms to 1 h.
pub const SLOW_SECONDS_BUCKETS: [f64; 12] = [0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0];

/// A family of histograms, made by one of the constructors below
/// (`HistogramFamily::new_with_constructor(seconds_histogram)`).
pub type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// A histogram of [`SECONDS_BUCKETS`].
pub fn seconds_histogram() -> Histogram {
    Histogram::new(SECONDS_BUCKETS)
}

/// A histogram of [`SLOW_SECONDS_BUCKETS`].
pub fn slow_seconds_histogram() -> Histogram {
    Histogram::new(SLOW_SECONDS_BUCKETS)
}

/// Registration that keeps a family in the exposition (its `# HELP` and `# TYPE`) before its
/// first sample, so every metric a service has shows at `/metrics` from the start and the
/// metrics reference ([`reference`]) lists them all. Use it instead of `Registry::register`.
pub trait RegistryExt {
    fn add(&mut self, name: &str, help: &str, metric: impl Metric);
    fn add_with_unit(&mut self, name: &str, help: &str, unit: Unit, metric: impl Metric);
}

impl RegistryExt for Registry {
    fn add(&mut self, name: &str, help: &str, metric: impl Metric) {
        self.register(name, help, Described(metric));
    }

    fn add_with_unit(&mut self, name: &str, help: &str, unit: Unit, metric: impl Metric) {
        self.register_with_unit(name, help, unit, Described(metric));
    }
}

/// A metric that is never empty to the encoder.
#[derive(Debug)]
struct Described<M>(M);

impl<M: Metric> prometheus_client::encoding::EncodeMetric for Described<M> {
    fn encode(&self, encoder: prometheus_client::encoding::MetricEncoder) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> prometheus_client::metrics::MetricType {
        self.0.metric_type()
    }
}

/// Registers `build_info{version}` = 1 (the crate version of kiln-core, which every service
/// shares), so a scrape tells which release answers.
pub fn register_build_info(registry: &mut Registry) {
    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    struct Version {
        version: &'static str,
    }
    let info: Family<Version, Gauge> = Family::default();
    info.get_or_create(&Version {
        version: env!("CARGO_PKG_VERSION"),
    })
    .set(1);
    registry.add("build_info", "1, labelled with the version of kiln serving", info);
}

/// A "per second" gauge's source: samples of a counter over the last `window`, the rate being
/// the change between the first and the last (0 until half a second has passed).
#[derive(Debug)]
pub struct RateWindow {
    window: std::time::Duration,
    samples: std::collections::VecDeque<(std::time::Instant, u64)>,
}

impl RateWindow {
    pub fn new(window: std::time::Duration) -> RateWindow {
        RateWindow {
            window,
            samples: std::collections::VecDeque::new(),
        }
    }

    /// Adds the counter's value now and returns the rate over the window.
    pub fn sample(&mut self, total: u64) -> f64 {
        self.sample_at(std::time::Instant::now(), total)
    }

    pub fn sample_at(&mut self, now: std::time::Instant, total: u64) -> f64 {
        self.samples.push_back((now, total));
        while self.samples.len() > 2
            && self
                .samples
                .front()
                .is_some_and(|(at, _)| now.duration_since(*at) > self.window)
        {
            self.samples.pop_front();
        }
        match (self.samples.front(), self.samples.back()) {
            (Some(first), Some(last)) => {
                let seconds = last.0.duration_since(first.0).as_secs_f64();
                if seconds < 0.5 {
                    0.0
                } else {
                    last.1.saturating_sub(first.1) as f64 / seconds
                }
            }
            _ => 0.0,
        }
    }
}

/// The process's registry. Cloning shares it.
#[derive(Clone, Default)]
pub struct Metrics {
    registry: Arc<Mutex<Registry>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    /// Registers a service's metrics: `build` gets the sub-registry that prefixes every name
    /// with `kiln_<service>_` and returns the handles the service keeps.
    pub fn register<T>(&self, service: &str, build: impl FnOnce(&mut Registry) -> T) -> T {
        let mut registry = self
            .registry
            .lock()
            .expect("the metrics registry lock is never poisoned");
        let prefix = format!("kiln_{}", service.replace('-', "_"));
        build(registry.sub_registry_with_prefix(prefix))
    }

    /// Registers metrics whose names are already complete (`kiln_nats_*`).
    pub fn register_root<T>(&self, build: impl FnOnce(&mut Registry) -> T) -> T {
        let mut registry = self
            .registry
            .lock()
            .expect("the metrics registry lock is never poisoned");
        build(&mut registry)
    }

    /// The exposition in Prometheus's text format 0.0.4 ([`to_text_format`]).
    pub fn encode(&self) -> String {
        let registry = self
            .registry
            .lock()
            .expect("the metrics registry lock is never poisoned");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("writing to a String cannot fail");
        to_text_format(&text)
    }
}

/// MetricsConfig says where a service serves `/metrics` and what else it reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct MetricsConfig {
    /// Whether `/metrics` is served at all.
    pub enabled: bool,
    pub listen: SocketAddr,
    /// Reports the lag of every kiln JetStream consumer as `kiln_nats_consumer_*` (one service
    /// of a deployment does it: the scheduler by default).
    pub consumer_lag: bool,
    /// nats-server monitoring endpoints (`http://host:8222`) whose `/varz` become
    /// `kiln_nats_server_*`.
    pub nats_monitor: Vec<String>,
    /// How often the consumer lag and `/varz` are read, in milliseconds.
    pub refresh_ms: u64,
}

impl MetricsConfig {
    /// Serves on 127.0.0.1:`port`, reporting nothing of NATS.
    pub fn local(port: u16) -> Self {
        MetricsConfig {
            enabled: true,
            listen: SocketAddr::from(([127, 0, 0, 1], port)),
            consumer_lag: false,
            nats_monitor: Vec::new(),
            refresh_ms: 5_000,
        }
    }

    pub fn validate(&self, problems: &mut Vec<String>) {
        for url in &self.nats_monitor {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                problems.push(format!(
                    "metrics.nats-monitor {url:?} must be an http:// or https:// URL (nats-server's -m port)"
                ));
            }
        }
        if self.refresh_ms < 100 {
            problems.push(format!("metrics.refresh-ms {} must be at least 100", self.refresh_ms));
        }
    }
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig::local(9470)
    }
}

/// MetricsError says why the endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("cannot listen for /metrics on {addr}: {source} (set metrics.listen, or metrics.enabled = false)")]
    Bind { addr: SocketAddr, source: std::io::Error },
}

/// Binds `/metrics` and starts the NATS readers the configuration asks for; returns the bound
/// address, or `None` when the endpoint is disabled. Everything stops with `shutdown`.
pub async fn export(
    config: &MetricsConfig,
    metrics: &Metrics,
    nats: &Nats,
    shutdown: &CancellationToken,
) -> Result<Option<SocketAddr>, MetricsError> {
    if !config.enabled {
        return Ok(None);
    }
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| MetricsError::Bind {
            addr: config.listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| MetricsError::Bind {
        addr: config.listen,
        source,
    })?;
    nats::start(config, metrics, nats, shutdown);
    tokio::spawn(serve(listener, metrics.clone(), shutdown.clone()));
    tracing::info!(%addr, "metrics: http://{addr}/metrics");
    Ok(Some(addr))
}

/// Serves `GET /metrics` on `listener` until `shutdown`.
pub async fn serve(listener: tokio::net::TcpListener, metrics: Metrics, shutdown: CancellationToken) {
    use axum::http::header::CONTENT_TYPE;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let metrics = metrics.clone();
            async move {
                (
                    [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
                    metrics.encode(),
                )
            }
        }),
    );
    if let Err(error) = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
    {
        tracing::warn!(error = %error, "the /metrics endpoint stopped");
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::metrics::counter::Counter;

    use super::*;

    #[test]
    fn a_rate_is_the_change_over_its_window() {
        let start = std::time::Instant::now();
        let mut rate = RateWindow::new(std::time::Duration::from_secs(5));
        assert_eq!(rate.sample_at(start, 100), 0.0);
        let at = |secs| start + std::time::Duration::from_secs(secs);
        assert_eq!(rate.sample_at(at(2), 300), 100.0);
        assert_eq!(rate.sample_at(at(4), 500), 100.0);
        // The samples at 0 s and 2 s are older than the window now: 60 over the 4 s from 4 s.
        assert_eq!(rate.sample_at(at(8), 560), 15.0);
    }

    #[test]
    fn counters_are_named_with_their_total_in_the_text_format() {
        let metrics = Metrics::default();
        metrics.register("api", |registry| {
            let counter = Counter::<u64>::default();
            counter.inc_by(3);
            registry.register("jobs_submitted", "Jobs accepted", counter);
            let gauge = Gauge::<i64>::default();
            gauge.set(2);
            registry.register_with_unit("held", "Bytes held", prometheus_client::registry::Unit::Bytes, gauge);
        });
        let text = metrics.encode();
        assert_eq!(
            text,
            "# HELP kiln_api_jobs_submitted_total Jobs accepted.\n\
             # TYPE kiln_api_jobs_submitted_total counter\n\
             kiln_api_jobs_submitted_total 3\n\
             # HELP kiln_api_held_bytes Bytes held.\n\
             # TYPE kiln_api_held_bytes gauge\n\
             kiln_api_held_bytes 2\n"
        );
    }
}
