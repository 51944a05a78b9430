//! This runner's lease in the `kiln_runners` bucket ([`kiln_core::runners`]): taken before the
//! runner reconciles or takes a launch, renewed every third of `lease-ttl-ms` until the runner
//! has ended its jobs, then given up. While the lease is not held (renewals failed, or the
//! runner was paused), launches are refused: the scheduling leader may already be ending this
//! runner's jobs and no longer counts its capacity. Jobs taken meanwhile are noticed by their
//! supervisors, which read their job every few seconds (see [`Holding`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kiln_core::JobState;
use kiln_core::lease::Lease;
use kiln_core::store::{JobHold, JobRecord};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::Context;
use crate::error::Result;

/// Whether this runner holds its lease, as the renewal task last found.
#[derive(Debug, Default)]
pub(crate) struct LeaseStatus {
    held_until: std::sync::Mutex<Option<Instant>>,
    /// Renewals are skipped while set (a test hook: a runner cut off from NATS, or paused).
    paused: AtomicBool,
}

impl LeaseStatus {
    /// Tells whether the lease is held now.
    pub fn is_held(&self) -> bool {
        self.held_until
            .lock()
            .expect("lease status lock")
            .is_some_and(|until| Instant::now() < until)
    }

    fn set(&self, lease: &Lease) {
        *self.held_until.lock().expect("lease status lock") = lease.held_until();
    }
}

/// Pauses and resumes a runner's lease renewals, as if it were cut off from NATS.
#[cfg(feature = "test-util")]
#[derive(Debug, Clone)]
pub struct LeasePause(pub(crate) std::sync::Arc<LeaseStatus>);

#[cfg(feature = "test-util")]
impl LeasePause {
    pub fn pause(&self) {
        self.0.paused.store(true, Ordering::SeqCst);
    }

    pub fn resume(&self) {
        self.0.paused.store(false, Ordering::SeqCst);
    }

    /// Tells whether the runner holds its lease now.
    pub fn is_held(&self) -> bool {
        self.0.is_held()
    }
}

/// Takes this runner's lease (it names the runner, so a restarted runner takes its own lease
/// at once, live or not).
pub(crate) async fn take_lease(ctx: &Context) -> Result<Lease> {
    let ttl = Duration::from_millis(ctx.config.lease_ttl_ms);
    let mut lease =
        kiln_core::runners::lease(&ctx.nats, &ctx.config.runner_id, ttl, &ctx.config.runner_lease()).await?;
    if !lease.tick().await? {
        tracing::warn!(runner_id = %ctx.config.runner_id, "cannot take this runner's lease yet; no launch is taken until it is held");
    }
    ctx.lease.set(&lease);
    Ok(lease)
}

/// Renews the lease every third of its TTL until `stop`, then gives it up.
pub(crate) async fn hold_lease(ctx: Context, mut lease: Lease, stop: CancellationToken) {
    let every = Duration::from_millis(ctx.config.lease_ttl_ms) / 3;
    let mut held = ctx.lease.is_held();
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(every) => {}
        }
        if !ctx.lease.paused.load(Ordering::SeqCst)
            && let Err(error) = lease.tick().await
        {
            tracing::warn!(error = %error, "cannot renew this runner's lease");
        }
        ctx.lease.set(&lease);
        let now_held = ctx.lease.is_held();
        if now_held != held {
            held = now_held;
            if held {
                tracing::info!(runner_id = %ctx.config.runner_id, "holding this runner's lease again");
            } else {
                tracing::warn!(runner_id = %ctx.config.runner_id, "this runner's lease lapsed; taking no launch until it is held again");
            }
        }
    }
    if let Err(error) = lease.release().await {
        tracing::warn!(error = %error, "cannot give the lease up; it expires on its own");
    }
}

/// Which attempt of a job is where, as far as taking it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Holding<'a> {
    pub state: Option<JobState>,
    pub attempt: i32,
    pub runner_id: &'a str,
}

impl Holding<'_> {
    pub fn of(job: &JobRecord) -> Holding<'_> {
        Holding {
            state: job.state().ok(),
            attempt: job.attempt,
            runner_id: &job.runner_id,
        }
    }

    pub fn of_hold(hold: &JobHold) -> Holding<'_> {
        Holding {
            state: hold.state,
            attempt: hold.attempt,
            runner_id: &hold.runner_id,
        }
    }

    /// Tells whether `current` (the job as the database has it now) shows that this attempt was
    /// taken from its runner: another attempt, another runner, or no longer active.
    pub fn is_taken_by(&self, current: Holding<'_>) -> bool {
        let active = matches!(
            current.state,
            Some(JobState::Provisioning | JobState::Running | JobState::Syncing)
        );
        !active || current.attempt != self.attempt || current.runner_id != self.runner_id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(state: JobState, attempt: i32, runner_id: &str) -> Holding<'_> {
        Holding {
            state: Some(state),
            attempt,
            runner_id,
        }
    }

    #[test]
    fn an_attempt_is_taken_once_it_is_not_its_runners_active_one() {
        let ours = at(JobState::Running, 1, "r1");
        assert!(!ours.is_taken_by(ours));
        assert!(!ours.is_taken_by(at(JobState::Syncing, 1, "r1")));
        assert!(ours.is_taken_by(at(JobState::Lost, 1, "r1")));
        assert!(ours.is_taken_by(at(JobState::Queued, 2, "")));
        assert!(ours.is_taken_by(at(JobState::Running, 2, "r2")));
        assert!(ours.is_taken_by(at(JobState::Running, 1, "r2")));
        assert!(ours.is_taken_by(Holding { state: None, ..ours }));
    }
}
