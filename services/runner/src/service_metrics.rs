//! The runner's Prometheus metrics (`kiln_runner_*`), labelled with its pool (one value a
//! runner) and fixed enums: instance state, stop reason, provider, market.
//!
//! Made when the runner binds, registered when it serves (into the registry `with_metrics`
//! gave). Instances by state are kept by a [`Phase`] each supervisor holds: it moves its
//! instance from state to state and takes it off the gauge when dropped, however the attempt
//! ends.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use kiln_core::metrics::{HistogramFamily, Metrics, RegistryExt, slow_seconds_histogram};
use kiln_core::scheduling::Market;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Unit;

/// Instance states of `kiln_runner_instances`.
pub(crate) const PROVISIONING: usize = 0;
pub(crate) const RUNNING: usize = 1;
pub(crate) const STOPPING: usize = 2;
pub(crate) const SYNCING: usize = 3;
const INSTANCE_STATES: [&str; 4] = ["provisioning", "running", "stopping", "syncing"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolStateLabels {
    pool: String,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolReasonLabels {
    pool: String,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolProviderLabels {
    pool: String,
    provider: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolMarketLabels {
    pool: String,
    market: &'static str,
}

type Dollars = Counter<f64, AtomicU64>;

/// The runner's metric families, and handles of its pool's series.
pub(crate) struct RunnerMetrics {
    pool: String,
    instances: Family<PoolStateLabels, Gauge>,
    launch_durations: HistogramFamily<PoolLabels>,
    launch_duration: Histogram,
    launch_counts: Family<PoolLabels, Counter>,
    pub launches: Counter,
    stops: Family<PoolReasonLabels, Counter>,
    idle_gpu_counts: Family<PoolLabels, Counter>,
    idle_gpu_kills: Counter,
    synced_bytes_counts: Family<PoolLabels, Counter>,
    synced_bytes: Counter,
    sync_durations: HistogramFamily<PoolLabels>,
    sync_duration: Histogram,
    provider_errors: Family<PoolProviderLabels, Counter>,
    /// 1 when the NVIDIA driver is loaded but NVML is not (the runner then reports no GPUs).
    pub nvml_load_failed: Gauge,
    spend: Family<PoolMarketLabels, Dollars>,
    /// The inference workers' relays (`serve_*`).
    pub relays: crate::relay::RelayMetrics,
}

impl RunnerMetrics {
    pub fn new(pool: &str) -> RunnerMetrics {
        let labels = PoolLabels { pool: pool.into() };
        let launch_durations = HistogramFamily::new_with_constructor(slow_seconds_histogram as fn() -> Histogram);
        let launch_counts = Family::<PoolLabels, Counter>::default();
        let idle_gpu_counts = Family::<PoolLabels, Counter>::default();
        let synced_bytes_counts = Family::<PoolLabels, Counter>::default();
        let sync_durations = HistogramFamily::new_with_constructor(slow_seconds_histogram as fn() -> Histogram);
        let instances = Family::<PoolStateLabels, Gauge>::default();
        for state in INSTANCE_STATES {
            instances
                .get_or_create(&PoolStateLabels {
                    pool: pool.into(),
                    state,
                })
                .set(0);
        }
        let launch_duration = launch_durations.get_or_create(&labels).clone();
        let launches = launch_counts.get_or_create(&labels).clone();
        let idle_gpu_kills = idle_gpu_counts.get_or_create(&labels).clone();
        let synced_bytes = synced_bytes_counts.get_or_create(&labels).clone();
        let sync_duration = sync_durations.get_or_create(&labels).clone();
        RunnerMetrics {
            pool: pool.into(),
            launch_duration,
            launches,
            idle_gpu_kills,
            synced_bytes,
            sync_duration,
            instances,
            launch_durations,
            launch_counts,
            stops: Family::default(),
            idle_gpu_counts,
            synced_bytes_counts,
            sync_durations,
            provider_errors: Family::default(),
            nvml_load_failed: Gauge::default(),
            spend: Family::default(),
            relays: Default::default(),
        }
    }

    pub fn register(&self, metrics: &Metrics) {
        metrics.register("runner", |registry| {
            kiln_core::metrics::register_build_info(registry);
            self.relays.register(registry);
            registry.add(
                "instances",
                "Instances this runner holds, by state",
                self.instances.clone(),
            );
            registry.add_with_unit(
                "launch_duration",
                "Time from a launch request's arrival to the job RUNNING",
                Unit::Seconds,
                self.launch_durations.clone(),
            );
            registry.add(
                "launches",
                "Launch requests taken (the job moved to PROVISIONING here)",
                self.launch_counts.clone(),
            );
            registry.add(
                "stops",
                "Attempts that ended on this runner, by reason",
                self.stops.clone(),
            );
            registry.add(
                "idle_gpu_kills",
                "Jobs stopped because their GPUs stayed idle",
                self.idle_gpu_counts.clone(),
            );
            registry.add_with_unit(
                "outputs_synced",
                "Bytes of outputs copied to object storage",
                Unit::Bytes,
                self.synced_bytes_counts.clone(),
            );
            registry.add_with_unit(
                "outputs_sync_duration",
                "Time one instance's outputs took to sync",
                Unit::Seconds,
                self.sync_durations.clone(),
            );
            registry.add(
                "provider_errors",
                "Calls to the provider that failed (provision, start, wait, signal, outputs, release), by provider",
                self.provider_errors.clone(),
            );
            registry.add(
                "nvml_load_failed",
                "1 when the NVIDIA driver is loaded but NVML did not load: the runner reports no GPUs",
                self.nvml_load_failed.clone(),
            );
            registry.add(
                "spend_dollars",
                "What the ended attempts cost, by market",
                self.spend.clone(),
            );
        });
    }

    /// A new instance, PROVISIONING.
    pub fn phase(&self) -> Phase {
        let gauge = |state| {
            self.instances
                .get_or_create(&PoolStateLabels {
                    pool: self.pool.clone(),
                    state,
                })
                .clone()
        };
        let mut phase = Phase {
            gauges: INSTANCE_STATES.map(gauge),
            current: None,
        };
        phase.enter(PROVISIONING);
        phase
    }

    pub fn launched(&self, took: Duration) {
        self.launch_duration.observe(took.as_secs_f64());
    }

    /// An attempt ended for `reason` (one of the stop reasons below).
    pub fn stopped(&self, reason: &'static str) {
        self.stops
            .get_or_create(&PoolReasonLabels {
                pool: self.pool.clone(),
                reason,
            })
            .inc();
        if reason == IDLE_GPU {
            self.idle_gpu_kills.inc();
        }
    }

    pub fn synced(&self, bytes: Option<u64>, took: Duration) {
        self.sync_duration.observe(took.as_secs_f64());
        if let Some(bytes) = bytes {
            self.synced_bytes.inc_by(bytes);
        }
    }

    /// Shows the error counter of each of `providers` (`docker+process` for `auto`) at 0.
    pub fn providers(&self, providers: &'static str) {
        for provider in providers.split('+') {
            let _ = self.provider_errors.get_or_create(&PoolProviderLabels {
                pool: self.pool.clone(),
                provider,
            });
        }
    }

    pub fn provider_error(&self, provider: &'static str) {
        self.provider_errors
            .get_or_create(&PoolProviderLabels {
                pool: self.pool.clone(),
                provider,
            })
            .inc();
    }

    /// Adds what an ended attempt cost, in millionths of a dollar.
    pub fn spent(&self, market: Market, cost_micros: i64) {
        self.spend
            .get_or_create(&PoolMarketLabels {
                pool: self.pool.clone(),
                market: market.as_str(),
            })
            .inc_by(cost_micros.max(0) as f64 / 1e6);
    }
}

/// Stop reasons of `kiln_runner_stops_total`.
pub(crate) const SUCCEEDED: &str = "succeeded";
pub(crate) const FAILED: &str = "failed";
pub(crate) const OOM: &str = "oom";
pub(crate) const STOPPED: &str = "stopped";
pub(crate) const TIMEOUT: &str = "timeout";
pub(crate) const IDLE_GPU: &str = "idle-gpu";
pub(crate) const PREEMPTED: &str = "preempted";
/// The runner went away while the job ran (it shut down, or restarted).
pub(crate) const LOST: &str = "lost";
/// The job was taken from this runner (its lease lapsed).
pub(crate) const TAKEN: &str = "taken";
/// The attempt never started (its code, datasets or instance failed).
pub(crate) const NOT_STARTED: &str = "not-started";

/// Where an instance is in its life, on the `instances` gauge until dropped.
pub(crate) struct Phase {
    gauges: [Gauge; 4],
    current: Option<usize>,
}

impl Phase {
    /// Moves the instance to `state` (one of the consts above).
    pub fn enter(&mut self, state: usize) {
        if self.current == Some(state) {
            return;
        }
        if let Some(current) = self.current {
            self.gauges[current].dec();
        }
        self.gauges[state].inc();
        self.current = Some(state);
    }
}

impl Drop for Phase {
    fn drop(&mut self) {
        if let Some(current) = self.current.take() {
            self.gauges[current].dec();
        }
    }
}
