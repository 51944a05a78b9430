//! log-ingest's own Prometheus metrics (`kiln_log_ingest_*`), not to be confused with the jobs'
//! metric points it stores ([`crate::points`]).
//!
//! The writers count per batch (`inc_by`), through handles taken once, so the intake's hot path
//! pays two atomic adds and a histogram observation a batch. `points_per_second` is the change
//! of `points_stored` over the last [`RATE_WINDOW`], refreshed by a small task.

use std::time::Duration;

use kiln_core::metrics::{HistogramFamily, Metrics, RateWindow, RegistryExt, seconds_histogram};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Unit;
use std::sync::atomic::AtomicU64;
use tokio_util::sync::CancellationToken;

/// The window of `points_per_second`.
pub const RATE_WINDOW: Duration = Duration::from_secs(5);
/// How often `points_per_second` is refreshed.
const RATE_REFRESH: Duration = Duration::from_secs(1);

/// Buckets of rows per written batch (the intake's batch size is at most 10 000 messages; a
/// metric message holds up to 16 384 points).
const BATCH_SIZE_BUCKETS: [f64; 10] = [
    1.0, 10.0, 50.0, 100.0, 500.0, 1000.0, 5000.0, 10_000.0, 50_000.0, 100_000.0,
];

fn batch_size_histogram() -> Histogram {
    Histogram::new(BATCH_SIZE_BUCKETS)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StoreLabels {
    store: &'static str,
}

/// One store's handles: what its writer counts into.
#[derive(Clone, Default)]
pub struct StoreCounters {
    pub received: Counter,
    pub stored: Counter,
    pub errors: Counter,
    pub duration: Option<Histogram>,
    pub size: Option<Histogram>,
}

impl StoreCounters {
    /// Records a write of `rows` that took `took` and ended as `ok` says.
    pub fn wrote(&self, rows: usize, took: Duration, ok: bool) {
        if let Some(duration) = &self.duration {
            duration.observe(took.as_secs_f64());
        }
        if let Some(size) = &self.size {
            size.observe(rows as f64);
        }
        if ok {
            self.stored.inc_by(rows as u64);
        } else {
            self.errors.inc();
        }
    }
}

/// The handles of log-ingest's metrics, registered in the process's registry.
#[derive(Clone)]
pub struct IngestMetrics {
    pub points: StoreCounters,
    pub lines: StoreCounters,
    /// Metric reads answered before the writers had caught up with them (see `read-wait-ms`).
    pub stale_reads: Counter,
    points_per_second: Gauge<f64, AtomicU64>,
}

impl IngestMetrics {
    pub fn register(metrics: &Metrics) -> IngestMetrics {
        metrics.register("log-ingest", |registry| {
            kiln_core::metrics::register_build_info(registry);
            let points = StoreCounters::default();
            let lines = StoreCounters::default();
            registry.add(
                "points_received",
                "Metric points taken from KILN_METRICS (a redelivered batch counts again)",
                points.received.clone(),
            );
            registry.add(
                "points_stored",
                "Metric points written to the metric store",
                points.stored.clone(),
            );
            registry.add(
                "log_lines_received",
                "Log records taken from KILN_LOGS (a redelivered batch counts again)",
                lines.received.clone(),
            );
            registry.add(
                "log_lines_stored",
                "Log records written to the log store",
                lines.stored.clone(),
            );
            let duration: HistogramFamily<StoreLabels> =
                HistogramFamily::new_with_constructor(seconds_histogram as fn() -> Histogram);
            registry.add_with_unit(
                "write_batch_duration",
                "Time one batch took to write, by store (metrics or logs)",
                Unit::Seconds,
                duration.clone(),
            );
            let size: HistogramFamily<StoreLabels> =
                HistogramFamily::new_with_constructor(batch_size_histogram as fn() -> Histogram);
            registry.add("write_batch_size", "Rows per written batch, by store", size.clone());
            let errors: Family<StoreLabels, Counter> = Family::default();
            registry.add(
                "store_errors",
                "Batch writes that failed (the batch comes again), by store",
                errors.clone(),
            );
            let stale_reads = Counter::default();
            registry.add(
                "stale_reads",
                "Metric reads answered from the store before the writers had stored every point written before them (they waited read-wait-ms)",
                stale_reads.clone(),
            );
            let points_per_second = Gauge::<f64, AtomicU64>::default();
            registry.add(
                "points_per_second",
                "Metric points stored per second over the last 5 seconds",
                points_per_second.clone(),
            );
            let handles = |counters: StoreCounters, store: &'static str| StoreCounters {
                errors: errors.get_or_create(&StoreLabels { store }).clone(),
                duration: Some(duration.get_or_create(&StoreLabels { store }).clone()),
                size: Some(size.get_or_create(&StoreLabels { store }).clone()),
                ..counters
            };
            IngestMetrics {
                points: handles(points, "metrics"),
                lines: handles(lines, "logs"),
                stale_reads,
                points_per_second,
            }
        })
    }

    /// Refreshes `points_per_second` until `shutdown`.
    pub async fn track_rate(self, shutdown: CancellationToken) {
        let mut rate = RateWindow::new(RATE_WINDOW);
        loop {
            self.points_per_second.set(rate.sample(self.points.stored.get()));
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(RATE_REFRESH) => {}
            }
        }
    }
}
