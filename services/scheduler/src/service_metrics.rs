//! The scheduler's metrics (`kiln_scheduler_*`), registered once at start. The gauges describe
//! the leader's last reading; a standby clears them, so sums over replicas count each job once.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;

use kiln_core::metrics::{HistogramFamily, Metrics, RegistryExt, seconds_histogram, slow_seconds_histogram};
use kiln_core::scheduling::{Market, QuotaScope};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Unit;

use crate::policy::{Input, Plan, Wait};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolMarketLabels {
    pool: String,
    market: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HeldLabels {
    pool: String,
    market: &'static str,
    resource: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CapacityLabels {
    pool: String,
    resource: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ScopeLabels {
    scope: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CauseLabels {
    cause: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

type FloatGauge = Gauge<f64, AtomicU64>;

/// The handles the scheduler counts into; cloning shares them.
#[derive(Clone)]
pub struct SchedulerMetrics {
    pass_duration: Histogram,
    passes: Counter,
    leader: Gauge,
    pending: Family<PoolLabels, Gauge>,
    waiting: Family<ReasonLabels, Gauge>,
    running: Family<PoolMarketLabels, Gauge>,
    held: Family<HeldLabels, FloatGauge>,
    capacity: Family<CapacityLabels, FloatGauge>,
    queue_wait: HistogramFamily<PoolLabels>,
    placements: Family<PoolMarketLabels, Counter>,
    quota_refusals: Family<ScopeLabels, Counter>,
    preemptions: Family<CauseLabels, Counter>,
    lost_jobs: Counter,
}

/// A job's pool for a label: the one it asked for, or `any`.
fn pool_label(pool: &str) -> String {
    if pool.is_empty() {
        "any".into()
    } else {
        pool.to_string()
    }
}

fn market_label(market: Market) -> &'static str {
    match market {
        Market::Spot => "spot",
        Market::OnDemand => "on-demand",
    }
}

impl SchedulerMetrics {
    pub fn register(metrics: &Metrics) -> SchedulerMetrics {
        metrics.register("scheduler", |r| {
            kiln_core::metrics::register_build_info(r);
            let m = SchedulerMetrics {
                pass_duration: seconds_histogram(),
                passes: Counter::default(),
                leader: Gauge::default(),
                pending: Family::default(),
                waiting: Family::default(),
                running: Family::default(),
                held: Family::default(),
                capacity: Family::default(),
                queue_wait: HistogramFamily::new_with_constructor(slow_seconds_histogram as fn() -> _),
                placements: Family::default(),
                quota_refusals: Family::default(),
                preemptions: Family::default(),
                lost_jobs: Counter::default(),
            };
            // Known label values start at 0, so a rate reads 0 rather than nothing before the
            // first event.
            for scope in ["global", "project", "user"] {
                m.quota_refusals.get_or_create(&ScopeLabels { scope }).inc_by(0);
            }
            for cause in ["priority", "fair-share", "spot"] {
                m.preemptions.get_or_create(&CauseLabels { cause }).inc_by(0);
            }
            r.add_with_unit(
                "pass_duration",
                "Time a scheduling pass of the leader took",
                Unit::Seconds,
                m.pass_duration.clone(),
            );
            r.add("passes", "Scheduling passes the leader ran", m.passes.clone());
            r.add("leader", "1 while this scheduler holds the leader lease", m.leader.clone());
            r.add(
                "pending_jobs",
                "QUEUED jobs at the leader's last pass, by the pool they asked for (any: none)",
                m.pending.clone(),
            );
            r.add(
                "waiting_jobs",
                "QUEUED jobs the last pass did not place, by why they wait",
                m.waiting.clone(),
            );
            r.add(
                "running_jobs",
                "Jobs holding resources (SCHEDULED until released), by pool and market",
                m.running.clone(),
            );
            r.add(
                "held",
                "Resources held by those jobs, by pool, market and resource (cpu in cores, memory in bytes, gpu in GPUs)",
                m.held.clone(),
            );
            r.add(
                "capacity",
                "What the pools' live runners report, by resource (cpu in cores, memory in bytes, gpu in GPUs)",
                m.capacity.clone(),
            );
            r.add_with_unit(
                "queue_wait",
                "Time placed jobs waited in QUEUED, by pool",
                Unit::Seconds,
                m.queue_wait.clone(),
            );
            r.add(
                "placements",
                "Jobs placed (QUEUED to SCHEDULED), by pool and market",
                m.placements.clone(),
            );
            r.add(
                "quota_refusals",
                "Jobs a pass held back for a running quota, by the quota's scope kind (global, project, user); a job waiting through several passes counts in each",
                m.quota_refusals.clone(),
            );
            r.add(
                "preemptions",
                "Preemptions by cause: priority and fair-share ordered by the scheduler, spot taken back by the provider",
                m.preemptions.clone(),
            );
            r.add(
                "lost_jobs",
                "Jobs of runners whose lease lapsed that the leader ended or queued again",
                m.lost_jobs.clone(),
            );
            m
        })
    }

    pub(crate) fn leading(&self, leading: bool) {
        self.leader.set(i64::from(leading));
        if !leading {
            self.pending.clear();
            self.waiting.clear();
            self.running.clear();
            self.held.clear();
            self.capacity.clear();
        }
    }

    pub(crate) fn pass_took(&self, seconds: f64) {
        self.passes.inc();
        self.pass_duration.observe(seconds);
    }

    pub(crate) fn lost(&self, jobs: usize) {
        self.lost_jobs.inc_by(jobs as u64);
    }

    pub(crate) fn spot_preempted(&self) {
        self.preemptions.get_or_create(&CauseLabels { cause: "spot" }).inc();
    }

    /// Sets the gauges from what the pass read.
    pub(crate) fn read(&self, input: &Input) {
        let mut pending: HashMap<String, i64> = input.pools.iter().map(|p| (p.name.clone(), 0)).collect();
        pending.entry("any".into()).or_default();
        for job in &input.pending {
            *pending.entry(pool_label(&job.pool)).or_default() += 1;
        }
        self.pending.clear();
        for (pool, count) in pending {
            self.pending.get_or_create(&PoolLabels { pool }).set(count);
        }
        self.running.clear();
        self.held.clear();
        for pool in &input.pools {
            for market in [Market::Spot, Market::OnDemand] {
                let market = market_label(market);
                self.running
                    .get_or_create(&PoolMarketLabels {
                        pool: pool.name.clone(),
                        market,
                    })
                    .set(0);
                for resource in ["cpu", "memory", "gpu"] {
                    self.held
                        .get_or_create(&HeldLabels {
                            pool: pool.name.clone(),
                            market,
                            resource,
                        })
                        .set(0.0);
                }
            }
        }
        for job in &input.running {
            let market = market_label(job.market);
            self.running
                .get_or_create(&PoolMarketLabels {
                    pool: job.pool.clone(),
                    market,
                })
                .inc();
            let held = |resource| HeldLabels {
                pool: job.pool.clone(),
                market,
                resource,
            };
            self.held
                .get_or_create(&held("cpu"))
                .inc_by(job.resources.cpu_millis as f64 / 1000.0);
            self.held
                .get_or_create(&held("memory"))
                .inc_by(job.resources.memory_bytes as f64);
            self.held.get_or_create(&held("gpu")).inc_by(job.resources.gpus as f64);
        }
        self.capacity.clear();
        for pool in &input.pools {
            let capacity = |resource| CapacityLabels {
                pool: pool.name.clone(),
                resource,
            };
            self.capacity
                .get_or_create(&capacity("cpu"))
                .set(pool.capacity.cpu_millis as f64 / 1000.0);
            self.capacity
                .get_or_create(&capacity("memory"))
                .set(pool.capacity.memory_bytes as f64);
            self.capacity
                .get_or_create(&capacity("gpu"))
                .set(pool.capacity.gpus as f64);
        }
    }

    /// Counts what the plan decided: why jobs wait, quota refusals, preemptions ordered.
    pub(crate) fn planned(&self, plan: &Plan) {
        self.waiting.clear();
        for reason in [
            "quota",
            "no-pool-fits",
            "no-capacity",
            "reserved",
            "waiting-for-preemption",
            "gang",
        ] {
            self.waiting.get_or_create(&ReasonLabels { reason }).set(0);
        }
        for wait in &plan.waits {
            let reason = match &wait.reason {
                Wait::Quota { scope, .. } => {
                    let scope = match scope {
                        QuotaScope::Global => "global",
                        QuotaScope::Project(_) => "project",
                        QuotaScope::User(_) => "user",
                    };
                    self.quota_refusals.get_or_create(&ScopeLabels { scope }).inc();
                    "quota"
                }
                Wait::NoPoolFits { .. } => "no-pool-fits",
                Wait::NoCapacity { .. } => "no-capacity",
                Wait::Provisioning { .. } => "provisioning",
                Wait::Reserved { .. } => "reserved",
                Wait::WaitingForPreemption { .. } => "waiting-for-preemption",
                Wait::Gang { .. } => "gang",
            };
            self.waiting.get_or_create(&ReasonLabels { reason }).inc();
        }
        for preemption in &plan.preemptions {
            let cause = if preemption.fair_share {
                "fair-share"
            } else {
                "priority"
            };
            self.preemptions.get_or_create(&CauseLabels { cause }).inc();
        }
    }

    /// Counts a job placed, and how long it waited since it entered QUEUED.
    pub(crate) fn placed(&self, pool: &str, market: Market, queued_since_ms: i64) {
        let labels = PoolMarketLabels {
            pool: pool.to_string(),
            market: market_label(market),
        };
        self.placements.get_or_create(&labels).inc();
        let waited = (kiln_core::ids::now_ms() - queued_since_ms).max(0) as f64 / 1000.0;
        self.queue_wait
            .get_or_create(&PoolLabels { pool: pool.to_string() })
            .observe(waited);
    }
}
