//! The jobs of runners that went away. Each pass of the leader reads the jobs a runner holds
//! (PROVISIONING, RUNNING, SYNCING; a SCHEDULED job names no runner yet, and its launch waits in
//! the pool's work queue for any runner), then the runners' leases, and ends each job whose
//! runner's lease expired as that runner's lease says: LOST, or queued again as its next attempt
//! resuming from its synced outputs ([`kiln_core::runners::lose_job`], the code a restarted
//! runner uses too). Each change is a compare-and-set on the job's version read here, so a runner
//! that comes back and moves its job first wins, and one that comes back later finds its job
//! taken and kills what it still runs of it.
//!
//! The jobs are read before the leases: a job read here was taken by a runner holding its lease
//! then, so a missing lease is one that lapsed, not one not yet written. A runner whose lease
//! entry is gone altogether (the bucket forgets expired entries after an hour) is taken to have
//! said `on-lost = "fail"`.

use kiln_core::JobState;
use kiln_core::events::republish_pending;
use kiln_core::ids::now_ms;
use kiln_core::runners::{self, LostPolicy};
use kiln_core::store::{EXTERNAL_POOL, Store};
use kiln_core::streams::Nats;

use crate::error::Result;

/// The states in which a job names the runner holding it.
const HELD: [JobState; 3] = [JobState::Provisioning, JobState::Running, JobState::Syncing];

/// Ends or queues again the jobs of runners whose lease expired; returns how many it changed.
pub async fn take_back(store: &Store, nats: &Nats) -> Result<usize> {
    // LOST changes committed here (or by a runner gone since) but not published.
    republish_pending(nats, store, &[JobState::Lost]).await?;
    let held = store.jobs_in_states(&HELD).await?;
    let held: Vec<_> = held
        .into_iter()
        .filter(|job| job.pool != EXTERNAL_POOL && !job.runner_id.is_empty())
        .collect();
    if held.is_empty() {
        return Ok(0);
    }
    let leases = runners::leases(nats).await?;
    let now = now_ms();
    let mut changed = 0;
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
