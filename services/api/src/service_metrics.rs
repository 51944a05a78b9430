//! The api's metrics (`kiln_api_*`), registered once at start.

use kiln_core::metrics::{Metrics, RegistryExt};
use kiln_core::store::Store;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ProjectLabels {
    pub(crate) project: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StatePoolLabels {
    pub(crate) state: String,
    pub(crate) pool: String,
}

/// The handles the api counts into; cloning shares them.
#[derive(Clone)]
pub struct ApiMetrics {
    pub(crate) jobs_submitted: Family<ProjectLabels, Counter>,
    pub(crate) republished: Counter,
    jobs: Family<StatePoolLabels, Gauge>,
}

impl ApiMetrics {
    pub fn register(metrics: &Metrics) -> ApiMetrics {
        metrics.register("api", |registry| {
            kiln_core::metrics::register_build_info(registry);
            let jobs_submitted = Family::default();
            registry.add(
                "jobs_submitted",
                "Jobs accepted by SubmitJob, by project",
                jobs_submitted.clone(),
            );
            let republished = Counter::default();
            registry.add(
                "reconciler_republished",
                "Job changes committed but not published that the reconciler published",
                republished.clone(),
            );
            let jobs = Family::default();
            registry.add(
                "jobs",
                "Jobs not yet ended, by state and pool, as of the reconciler's last pass",
                jobs.clone(),
            );
            ApiMetrics {
                jobs_submitted,
                republished,
                jobs,
            }
        })
    }

    /// Reads the jobs not yet ended into `kiln_api_jobs`; a state with none reads 0 (pool `any`).
    pub(crate) async fn count_jobs(&self, store: &Store) -> Result<(), kiln_core::store::StoreError> {
        let rows = store.count_active_jobs().await?;
        self.jobs.clear();
        for state in kiln_core::JobState::ALL.iter().filter(|s| !s.is_terminal()) {
            self.jobs
                .get_or_create(&StatePoolLabels {
                    state: state.as_str().to_string(),
                    pool: "any".into(),
                })
                .set(0);
        }
        for (state, pool, count) in rows {
            // A queued job that asked for no pool has none yet.
            let pool = if pool.is_empty() { "any".into() } else { pool };
            self.jobs.get_or_create(&StatePoolLabels { state, pool }).set(count);
        }
        Ok(())
    }
}
