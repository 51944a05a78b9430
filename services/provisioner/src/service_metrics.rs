//! The provisioner's metrics (`kiln_provisioner_*`), registered once at start. The gauges
//! describe the leader's last cycle; a standby clears them, so sums over replicas count once.

use kiln_core::metrics::{Metrics, RegistryExt, seconds_histogram};
use kiln_core::provisioning::PoolStatus;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Unit;

use crate::cycle::Cycle;
use crate::release::Reaped;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabels {
    action: &'static str,
}

/// The handles the provisioner counts into; cloning shares them.
#[derive(Clone)]
pub struct ProvisionerMetrics {
    leader: Gauge,
    cycle_duration: Histogram,
    cycles: Counter,
    create_calls: Counter,
    launched: Counter,
    released: Family<ReasonLabels, Counter>,
    reaper: Family<ActionLabels, Counter>,
    intents_settled: Family<ActionLabels, Counter>,
    live: Family<PoolLabels, Gauge>,
    launching: Family<PoolLabels, Gauge>,
    unavailable: Family<PoolLabels, Gauge>,
    held_back: Family<PoolLabels, Gauge>,
}

impl ProvisionerMetrics {
    pub fn register(metrics: &Metrics) -> ProvisionerMetrics {
        metrics.register("provisioner", |r| {
            kiln_core::metrics::register_build_info(r);
            let m = ProvisionerMetrics {
                leader: Gauge::default(),
                cycle_duration: seconds_histogram(),
                cycles: Counter::default(),
                create_calls: Counter::default(),
                launched: Counter::default(),
                released: Family::default(),
                reaper: Family::default(),
                intents_settled: Family::default(),
                live: Family::default(),
                launching: Family::default(),
                unavailable: Family::default(),
                held_back: Family::default(),
            };
            for reason in ["idle", "boot-timeout", "lease-lapsed", "interrupted"] {
                m.released.get_or_create(&ReasonLabels { reason }).inc_by(0);
            }
            for action in ["adopted", "reaped", "gone"] {
                m.reaper.get_or_create(&ActionLabels { action }).inc_by(0);
            }
            for action in ["dropped", "adopted", "resent", "failed"] {
                m.intents_settled.get_or_create(&ActionLabels { action }).inc_by(0);
            }
            r.add("leader", "1 while this provisioner holds the leader lease", m.leader.clone());
            r.add_with_unit(
                "cycle_duration",
                "Time a provisioning cycle of the leader took, cloud calls included",
                Unit::Seconds,
                m.cycle_duration.clone(),
            );
            r.add("cycles", "Provisioning cycles the leader ran", m.cycles.clone());
            r.add(
                "create_calls",
                "Create calls sent to the clouds (EC2 CreateFleet), one per launch intent",
                m.create_calls.clone(),
            );
            r.add(
                "instances_launched",
                "Instances the create calls' answers made",
                m.launched.clone(),
            );
            r.add(
                "instances_released",
                "Instances terminated, by why: idle past the pool's idle timeout, no runner by its boot timeout, its runner's lease lapsed, a spot interruption notice",
                m.released.clone(),
            );
            r.add(
                "reaper",
                "What the reaper did with the cluster's tagged instances: adopted (its intent known), reaped (unknown past the grace), gone (recorded, no longer listed)",
                m.reaper.clone(),
            );
            r.add(
                "intents_reconciled",
                "Launch intents a crash or a lost answer left open, as the reconciler settled them",
                m.intents_settled.clone(),
            );
            r.add("live_instances", "Instances the pool pays for, at the last cycle", m.live.clone());
            r.add(
                "launching_instances",
                "Instances on their way for the pool (booting, or asked for without an answer yet)",
                m.launching.clone(),
            );
            r.add(
                "unavailable_offerings",
                "The pool's offerings not tried for a while (no capacity, a quota, a spot notice)",
                m.unavailable.clone(),
            );
            r.add(
                "held_back_jobs",
                "Jobs of the demand the pool holds back (no offering available, max-instances)",
                m.held_back.clone(),
            );
            m
        })
    }

    pub(crate) fn leading(&self, leading: bool) {
        self.leader.set(i64::from(leading));
        if !leading {
            self.live.clear();
            self.launching.clear();
            self.unavailable.clear();
            self.held_back.clear();
        }
    }

    pub(crate) fn cycled(&self, cycle: &Cycle, seconds: f64) {
        self.cycles.inc();
        self.cycle_duration.observe(seconds);
        self.create_calls.inc_by(cycle.calls as u64);
        self.launched.inc_by(cycle.launched as u64);
        let released = &cycle.released;
        let by = |reason| self.released.get_or_create(&ReasonLabels { reason });
        by("idle").inc_by(released.terminated_idle as u64);
        by("boot-timeout").inc_by(released.boot_timeouts as u64);
        by("lease-lapsed").inc_by(released.lapsed as u64);
        by("interrupted").inc_by(released.interrupted as u64);
        let reconciled = &cycle.reconciled;
        let settled = |action| self.intents_settled.get_or_create(&ActionLabels { action });
        settled("dropped").inc_by(reconciled.dropped as u64);
        settled("adopted").inc_by(reconciled.adopted as u64);
        settled("resent").inc_by(reconciled.resent as u64);
        settled("failed").inc_by(reconciled.failed as u64);
        for status in &cycle.statuses {
            self.pool(status);
        }
    }

    fn pool(&self, status: &PoolStatus) {
        let labels = PoolLabels {
            pool: status.pool.clone(),
        };
        self.live.get_or_create(&labels).set(i64::from(status.live_instances));
        let launching: u32 = status.launching.iter().map(|l| l.instances).sum();
        self.launching.get_or_create(&labels).set(i64::from(launching));
        self.unavailable
            .get_or_create(&labels)
            .set(status.unavailable.len() as i64);
        self.held_back.get_or_create(&labels).set(status.held_back.len() as i64);
    }

    pub(crate) fn reaped(&self, reaped: &Reaped) {
        let by = |action| self.reaper.get_or_create(&ActionLabels { action });
        by("adopted").inc_by(reaped.adopted as u64);
        by("reaped").inc_by(reaped.reaped as u64);
        by("gone").inc_by(reaped.gone as u64);
    }
}
