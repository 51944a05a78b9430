//! item-batch's Prometheus metrics (`kiln_item_batch_*`).
//!
//! Counters are counted where items move, per call or per intake batch (`inc_by`), through
//! handles made once. The gauges describe the batches of the whole deployment and are set by
//! the scaler: the leader's full passes set the backlog, batches and workers (a standby reports
//! them as 0, so a sum over replicas is right), and every replica refreshes its own
//! `items_per_second` (the change of its finished counters over [`RATE_WINDOW`]) and
//! `scaler_leader`.

use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use kiln_core::metrics::{Metrics, RateWindow, RegistryExt};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::store::{self, Tally};

/// The window of `items_per_second`.
pub const RATE_WINDOW: Duration = Duration::from_secs(5);

/// Item states of `backlog_items` (`leased`: pending items a worker holds).
const ITEM_STATES: [&str; 5] = ["pending", "leased", store::SUCCEEDED, store::FAILED, store::DEAD];
/// Batch states of `batches`.
const BATCH_STATES: [&str; 4] = [store::OPEN, store::SEALED, store::DONE, store::CANCELLED];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

/// What one full pass of the scaler leader saw, summed over the live batches.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct PassTotals {
    pub pending: u64,
    pub leased: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub dead: u64,
    pub workers_requested: u64,
    pub workers_live: u64,
}

impl PassTotals {
    /// Adds a batch's counts; `in_flight` of its pending items are held by workers.
    pub fn add(&mut self, tally: &Tally, in_flight: u64) {
        let leased = in_flight.min(tally.pending);
        self.pending += tally.pending - leased;
        self.leased += leased;
        self.succeeded += tally.succeeded;
        self.failed += tally.failed;
        self.dead += tally.dead;
    }
}

/// The handles of item-batch's metrics. Made unregistered when the service binds, registered
/// when it serves (into the registry `with_metrics` gave).
pub struct BatchMetrics {
    pub items_added: Counter,
    pub items_dispatched: Counter,
    pub items_succeeded: Counter,
    pub items_failed: Counter,
    pub items_dead: Counter,
    workers_requested: Gauge,
    workers_live: Gauge,
    backlog: Family<StateLabels, Gauge>,
    batches: Family<StateLabels, Gauge>,
    items_per_second: Gauge<f64, AtomicU64>,
    scaler_leader: Gauge,
    /// (when, items finished) over the rate window.
    rate: Mutex<RateWindow>,
}

impl Default for BatchMetrics {
    fn default() -> Self {
        let metrics = BatchMetrics {
            items_added: Counter::default(),
            items_dispatched: Counter::default(),
            items_succeeded: Counter::default(),
            items_failed: Counter::default(),
            items_dead: Counter::default(),
            workers_requested: Gauge::default(),
            workers_live: Gauge::default(),
            backlog: Family::default(),
            batches: Family::default(),
            items_per_second: Gauge::default(),
            scaler_leader: Gauge::default(),
            rate: Mutex::new(RateWindow::new(RATE_WINDOW)),
        };
        // Every state reads 0 until the first pass.
        metrics.standby();
        metrics
    }
}

impl BatchMetrics {
    pub fn register(&self, metrics: &Metrics) {
        metrics.register("item-batch", |registry| {
            kiln_core::metrics::register_build_info(registry);
            registry.add("items_added", "Items added to batches (duplicates not counted)", self.items_added.clone());
            registry.add(
                "items_dispatched",
                "Items sent to workers (each delivery of an item counts)",
                self.items_dispatched.clone(),
            );
            registry.add("items_succeeded", "Items whose attempt succeeded", self.items_succeeded.clone());
            registry.add(
                "items_failed",
                "Attempts of items that failed, retried or not",
                self.items_failed.clone(),
            );
            registry.add(
                "items_dead",
                "Items that became dead letters (out of attempts)",
                self.items_dead.clone(),
            );
            registry.add(
                "workers_requested",
                "Workers the scaler wants for the live batches, as of its last pass",
                self.workers_requested.clone(),
            );
            registry.add(
                "workers_live",
                "Worker jobs of the live batches not yet ended, as of the scaler's last pass",
                self.workers_live.clone(),
            );
            registry.add(
                "backlog_items",
                "Items of the open and sealed batches by state (leased: held by a worker), as of the scaler's last pass",
                self.backlog.clone(),
            );
            registry.add(
                "batches",
                "Batches by state, as of the scaler's last pass",
                self.batches.clone(),
            );
            registry.add(
                "items_per_second",
                "Items finished (succeeded or dead) per second by this replica over the last 5 seconds",
                self.items_per_second.clone(),
            );
            registry.add(
                "scaler_leader",
                "1 while this replica holds the scaler lease",
                self.scaler_leader.clone(),
            );
        });
    }

    /// Counts the outcomes an intake batch applied.
    pub(crate) fn applied(&self, applied: &store::Applied) {
        self.items_succeeded.inc_by(applied.succeeded);
        self.items_failed.inc_by(applied.failed + applied.dead);
        self.items_dead.inc_by(applied.dead);
    }

    /// Publishes what a full pass of the leader saw, and the batches by state.
    pub(crate) fn leader_pass(&self, totals: &PassTotals, batches: &[(String, i64)]) {
        self.scaler_leader.set(1);
        let counts = [
            totals.pending,
            totals.leased,
            totals.succeeded,
            totals.failed,
            totals.dead,
        ];
        for (state, count) in ITEM_STATES.into_iter().zip(counts) {
            self.backlog
                .get_or_create(&StateLabels { state })
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
        for state in BATCH_STATES {
            let count = batches.iter().find(|(s, _)| s == state).map_or(0, |(_, n)| *n);
            self.batches.get_or_create(&StateLabels { state }).set(count);
        }
        self.workers_requested
            .set(i64::try_from(totals.workers_requested).unwrap_or(i64::MAX));
        self.workers_live
            .set(i64::try_from(totals.workers_live).unwrap_or(i64::MAX));
    }

    /// A standby reports no batches and no workers (the leader does).
    pub(crate) fn standby(&self) {
        self.scaler_leader.set(0);
        for state in ITEM_STATES {
            self.backlog.get_or_create(&StateLabels { state }).set(0);
        }
        for state in BATCH_STATES {
            self.batches.get_or_create(&StateLabels { state }).set(0);
        }
        self.workers_requested.set(0);
        self.workers_live.set(0);
    }

    /// Takes a sample of the finished counters and refreshes `items_per_second`.
    pub(crate) fn sample_rate(&self) {
        let finished = self.items_succeeded.get() + self.items_dead.get();
        let rate = self.rate.lock().expect("rate samples lock").sample(finished);
        self.items_per_second.set(rate);
    }
}
