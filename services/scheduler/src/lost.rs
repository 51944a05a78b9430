//! The jobs of runners that went away. Each pass of the leader reads the jobs a runner holds
//! (PROVISIONING, RUNNING, SYNCING), then the runners' leases, and ends each job whose
//! runner's lease expired as that runner's lease says: LOST, or queued again as its next attempt
//! resuming from its synced outputs ([`kiln_core::runners::lose_job`], the code a restarted
//! runner uses too). Each change is a compare-and-set on the job's version read here, so a runner
//! that comes back and moves its job first wins, and one that comes back later finds its job
//! taken and kills what it still runs of it.
//!
//! A SCHEDULED job names the runner it was placed on, and its launch waits on that runner's
//! subject: when that runner's lease lapses before it took the launch, the job is queued again
//! (SCHEDULED → QUEUED by compare-and-set; a runner that took it first wins), to be placed on a
//! live runner. Its launch goes stale. A SCHEDULED job that names no runner (placed on a
//! pool's sum by a scheduler before placement was per runner) is queued again the same way.
//!
//! A PREEMPTED job names the runner that ended it so, and that runner queues it again at once
//! (PREEMPTED → QUEUED, its next attempt). A runner gone between the two (its instance taken
//! back before it was done) left the job PREEMPTED for good: once its lease has lapsed, the
//! job is queued again here the same way, by compare-and-set.
//!
//! A runner commits each change of its jobs, then publishes it, and re-drives what it could not
//! publish; a runner gone between the two (its instance taken back) left a change no one
//! publishes (a job SUCCEEDED that nothing downstream hears of: a sweep's trial, a batch's
//! worker). Once its lease has lapsed, the leader publishes it, first, so the change it may then
//! make itself comes after.
//!
//! The jobs are read before the leases: a job read here was taken by a runner holding its lease
//! then, so a missing lease is one that lapsed, not one not yet written. A runner whose lease
//! entry is gone altogether (the bucket forgets expired entries after an hour) is taken to have
//! said `on-lost = "fail"`.

use kiln_core::JobState;
use kiln_core::events::{publish_job_change, republish_pending};
use kiln_core::ids::now_ms;
use kiln_core::runners::{self, LostPolicy};
use kiln_core::store::{Change, EXTERNAL_POOL, JobRecord, Store, StoreError};
use kiln_core::streams::Nats;

use crate::error::Result;

/// The states in which a job names the runner holding it.
const HELD: [JobState; 3] = [JobState::Provisioning, JobState::Running, JobState::Syncing];

/// The states whose jobs wait on a runner: placed on it, held by it, or preempted by it and not
/// queued again yet.
const ON_A_RUNNER: [JobState; 5] = [
    JobState::Scheduled,
    JobState::Provisioning,
    JobState::Running,
    JobState::Syncing,
    JobState::Preempted,
];

/// Ends or queues again the jobs of runners whose lease expired; returns how many it changed.
pub async fn take_back(store: &Store, nats: &Nats) -> Result<usize> {
    // LOST changes committed here (or by a runner gone since) but not published.
    republish_pending(nats, store, &[JobState::Lost]).await?;
    let unpublished = store.unpublished_runner_jobs().await?;
    // One read for all three kinds.
    let (mut held, mut placed, mut preempted) = (Vec::new(), Vec::new(), Vec::new());
    for job in store.jobs_in_states(&ON_A_RUNNER).await? {
        if job.pool == EXTERNAL_POOL {
            continue;
        }
        match job.state()? {
            // One that names no runner was placed on a pool's sum by an older scheduler: no
            // runner reads its pool-wide launch any more, so it is queued again as well.
            JobState::Scheduled => placed.push(job),
            JobState::Preempted if !job.runner_id.is_empty() => preempted.push(job),
            state if HELD.contains(&state) && !job.runner_id.is_empty() => held.push(job),
            _ => {}
        }
    }
    if held.is_empty() && placed.is_empty() && preempted.is_empty() && unpublished.is_empty() {
        return Ok(0);
    }
    let leases = runners::leases(nats).await?;
    let now = now_ms();
    for job in &unpublished {
        if leases.get(&job.runner_id).is_some_and(|lease| lease.is_live(now)) {
            continue;
        }
        tracing::info!(job_id = %job.id, version = job.version, state = %job.state, runner_id = %job.runner_id, "publishing a change its runner committed before it went away");
        publish_job_change(nats, store, job).await?;
    }
    let mut changed = 0;
    for job in &placed {
        if leases.get(&job.runner_id).is_some_and(|lease| lease.is_live(now)) {
            continue;
        }
        let reason = if job.runner_id.is_empty() {
            "placed on no runner in particular; queued again to be placed on one".to_string()
        } else {
            format!(
                "its runner {} stopped renewing its lease before it started; queued again",
                job.runner_id
            )
        };
        let change = Change {
            reason: Some(reason),
            ..Change::default()
        };
        changed += usize::from(queue_again(store, nats, job, change).await?);
    }
    for job in &preempted {
        if leases.get(&job.runner_id).is_some_and(|lease| lease.is_live(now)) {
            continue;
        }
        let change = Change {
            reason: Some(format!(
                "preempted; its runner {} stopped renewing its lease before it queued the job again; queued again",
                job.runner_id
            )),
            next_attempt: true,
            ..Change::default()
        };
        changed += usize::from(queue_again(store, nats, job, change).await?);
    }
    for job in &held {
        let lease = leases.get(&job.runner_id);
        if lease.is_some_and(|lease| lease.is_live(now)) {
            continue;
        }
        let policy = lease
            .and_then(|lease| lease.lease.as_ref())
            .map_or(LostPolicy::UNKNOWN, |lease| lease.lost);
        let why = format!("its runner {} stopped renewing its lease", job.runner_id);
        if runners::lose_job(nats, store, job, policy, &why).await?.is_some() {
            changed += 1;
        }
    }
    Ok(changed)
}

/// Queues `job` again (by compare-and-set on the version read) and publishes the change; false
/// when it changed meanwhile (its runner, or a stop, came first).
async fn queue_again(store: &Store, nats: &Nats, job: &JobRecord, change: Change) -> Result<bool> {
    match store.transition(job, JobState::Queued, change).await {
        Ok(queued) => {
            tracing::warn!(job_id = %queued.id, runner_id = %job.runner_id, from = %job.state, "its runner is gone; queued again");
            if let Err(error) = publish_job_change(nats, store, &queued).await {
                tracing::warn!(job_id = %queued.id, error = %error, "publish failed");
            }
            Ok(true)
        }
        Err(StoreError::Conflict { .. }) => Ok(false),
        Err(error) => Err(error.into()),
    }
}
