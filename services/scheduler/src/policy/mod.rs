//! The scheduling policy: which queued jobs start now, on which pool and market, which running
//! jobs a higher priority preempts, and why every other job waits.
//!
//! Pure decision logic: plain data in ([`Input`]), plain data out ([`Plan`]); no I/O, no clock,
//! no store types. The scheduler's pass, its answers to `kiln explain` and the `sched-sim`
//! study all call the same [`plan`].
//!
//! - [`plan`] orders the queue by priority, then weighted dominant-resource fair share (DRF):
//!   by default ([`Order::FairShareRatio`]) users across projects by held share over their
//!   demand-capped hierarchical DRF share, or ([`Order::Hierarchical`]) between projects and
//!   then between users inside a project; then submit time; places what fits
//!   at the lowest cost; makes jobs over a running quota wait without blocking others; holds
//!   room for a job that cannot fit (one reservation per pool) so small jobs backfill only
//!   around it; and lets opted-in priorities preempt lower ones within a per-pass budget.
//! - With the hierarchical order, inside a project, once a user's job waits for capacity, its
//!   project-mates with larger shares yield: they are walked after every other project's jobs (`Settings::yield_within_project`).
//! - Fair-share preemption (opt-in, `Settings::fair_share_preemption`): a job that cannot fit may
//!   stop preemptible jobs of the same or lower priority on one pool, the lowest priority and then
//!   the youngest first (the least work lost), only while the victim's owner (the project or,
//!   inside its own project, the user; across projects also the victim's user) stays at or above
//!   the job's share once the job starts, so the order never inverts and nothing preempts back.
//!   A budget of its own; priority preemption goes first.
//! - [`choose_market`] picks spot or on-demand for `auto` from the pool's [`PreemptionRate`].
//! - [`Wait`] and [`JobWait`] say why a job waits, as data and as sentences.
//! - [`jain_index`] measures fairness, for the study.

mod explain;
mod market;
mod model;
mod pass;
#[cfg(test)]
mod tests;

pub use explain::{Ahead, JobWait, Wait};
pub use market::{DEFAULT_RUNTIME_SECS, PreemptionRate, choose_market, restart_probability};
pub use model::{
    Input, Market, MarketPolicy, Order, PendingJob, Pool, Quota, QuotaResource, QuotaScope, Resources, Runner,
    RunningJob, Settings, Weights,
};
pub use pass::{Placement, Plan, Preemption, plan, water_fill};

/// Jain's fairness index of `values`: `(Σx)² / (n · Σx²)`, 1 when all are equal, `1/n` when one
/// has everything. An empty or all-zero slice counts as fair (1).
pub fn jain_index(values: &[f64]) -> f64 {
    let sum: f64 = values.iter().sum();
    let sum_of_squares: f64 = values.iter().map(|value| value * value).sum();
    if values.is_empty() || sum_of_squares == 0.0 {
        return 1.0;
    }
    sum * sum / (values.len() as f64 * sum_of_squares)
}
