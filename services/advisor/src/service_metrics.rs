//! The advisor's Prometheus metrics (`kiln_advisor_*`), besides its RPC metrics.
//!
//! Counters are counted by the leader where it records: a trial submitted, stopped early or
//! ended, an objective point observed, a version registered. The gauges are the leader's:
//! `leader` is 1 on the replica holding the lease, `sweeps_live` and `trials_running` what its
//! last pass saw (a standby reports 0, so a sum over replicas is right).

use kiln_core::metrics::{Metrics, RegistryExt};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

/// The handles of the advisor's metrics. Made unregistered when the service binds, registered
/// when it serves (into the registry `with_metrics` gave).
#[derive(Clone, Debug, Default)]
pub struct AdvisorMetrics {
    pub(crate) leader: Gauge,
    pub(crate) sweeps_live: Gauge,
    pub(crate) trials_running: Gauge,
    pub(crate) trials_submitted: Counter,
    pub(crate) trials_stopped: Counter,
    pub(crate) trials_ended: Counter,
    pub(crate) observations: Counter,
    pub(crate) models_registered: Counter,
}

impl AdvisorMetrics {
    pub fn register(&self, metrics: &Metrics) {
        metrics.register("advisor", |registry| {
            kiln_core::metrics::register_build_info(registry);
            registry.add(
                "leader",
                "1 on the replica that holds the advisor lease (runs the sweeps), else 0",
                self.leader.clone(),
            );
            registry.add(
                "sweeps_live",
                "Sweeps running or stopping, as of the leader's last pass",
                self.sweeps_live.clone(),
            );
            registry.add(
                "trials_running",
                "Trials submitted and not ended, as of the leader's last pass",
                self.trials_running.clone(),
            );
            registry.add(
                "trials_submitted",
                "Trials whose job the leader submitted",
                self.trials_submitted.clone(),
            );
            registry.add(
                "trials_stopped",
                "Trials stopped early (by the early-stop rule or with their sweep)",
                self.trials_stopped.clone(),
            );
            registry.add(
                "trials_ended",
                "Trials whose job ended (succeeded, failed, stopped or lost)",
                self.trials_ended.clone(),
            );
            registry.add(
                "observations",
                "Objective points of trials recorded",
                self.observations.clone(),
            );
            registry.add(
                "models_registered",
                "Best trials registered as model versions",
                self.models_registered.clone(),
            );
        });
    }
}
