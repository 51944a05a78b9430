//! The autoscaler: every `scale-interval-ms`, for each live batch, it samples the counters (for
//! the rate and ETA), publishes items a crash left unpublished, ends a sealed batch whose items
//! are all finished, and asks for workers: as many as the backlog needs at the measured rate per
//! worker, at most `max_workers`, none when there is no backlog. Workers leave by themselves when
//! they run out of work (their sessions tell them to stop), so the batch scales to zero; a
//! worker of an ended batch that was preempted and queued again is stopped before it starts.
//!
//! Every replica serves gRPC and intake, but only one runs the scaler: the holder of the
//! `item-batch-scaler` lease in `kiln_leases` ([`kiln_core::lease`]). Standbys keep trying and
//! take over within the lease TTL. A leader checks it still holds the lease before it asks for
//! or stops workers, and counts the workers the last leader asked for (they are job rows), so a
//! hand-over asks for none twice. A batch whose workers fail `max-worker-failures` times in a
//! row is stalled: it asks for none until `RetryFailed` ([`crate::store::BatchStore::stall`]).
//! A batch whose owner may no longer run jobs (disabled, or no longer a member of its project:
//! [`kiln_core::store::Store::check_owner`], made on each pass and again by every worker insert)
//! is paused: it asks for none, its workers are stopped, until `RetryFailed` finds the owner
//! back in good standing ([`crate::store::BatchStore::pause`]).
//! Standbys still sample their batches' counters, so the rate and
//! ETA they answer with are as good as the leader's.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kiln_core::events::{publish_job_change, stop_job};
use kiln_core::lease::Lease;
use kiln_core::scheduling::MarketPolicy;
use kiln_core::store::{JobRecord, NewJob, paused_reason};
use kiln_core::{JobState, subjects};
use kiln_proto::v1 as pb;
use tokio_util::sync::CancellationToken;

use crate::error::Result;
use crate::service_metrics::PassTotals;
use crate::spec::Spec;
use crate::store::{self, BatchRecord, Tally};
use crate::{Error, Shared};

/// Seconds of work a worker should have ahead of it at the measured rate: more backlog than
/// that asks for another worker.
const TARGET_DRAIN_SECS: f64 = 30.0;
/// Shortest time between two passes.
const MIN_PASS_GAP: Duration = Duration::from_millis(100);
/// Worker jobs submitted at once.
const SUBMIT_CONCURRENCY: usize = 32;
/// Where kiln-agent is inside a worker container (the runner puts it there).
pub const AGENT_IN_CONTAINER: &str = "/kiln/bin/kiln-agent";

/// Passes run every `scale-interval-ms`, and sooner when outcomes arrive (so a batch is done as
/// soon as its last item is), but at most every [`MIN_PASS_GAP`]. Only the lease holder tends
/// batches; the others sample them.
pub async fn run(shared: Arc<Shared>, shutdown: CancellationToken) {
    let name = if shared.config.instance_name.is_empty() {
        format!("item-batch-{}", kiln_core::ids::new_id())
    } else {
        shared.config.instance_name.clone()
    };
    let ttl = Duration::from_millis(shared.config.lease_ttl_ms);
    let mut lease = loop {
        match Lease::new(&shared.nats, subjects::LEASE_ITEM_BATCH_SCALER, &name, ttl).await {
            Ok(lease) => break lease,
            Err(error) => tracing::warn!(error = %error, "cannot open the scaler lease; retrying"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    };
    let interval = Duration::from_millis(shared.config.scale_interval_ms);
    let renew_every = ttl / 3;
    let mut last_tick: Option<tokio::time::Instant> = None;
    let mut leading = false;
    let mut woken = false;
    // A full pass is due every interval however often outcomes wake the loop: with outcomes
    // arriving every few milliseconds, every pass used to be a woken one, so a busy batch was
    // never sampled (its rate read 0) nor scaled after its first workers.
    let mut last_full = tokio::time::Instant::now();
    while !shutdown.is_cancelled() {
        if last_tick.is_none_or(|at| at.elapsed() >= renew_every) {
            last_tick = Some(tokio::time::Instant::now());
            if let Err(error) = lease.tick().await {
                tracing::warn!(error = %error, "cannot reach the scaler lease; not scaling");
            }
        }
        if lease.is_held() != leading {
            leading = lease.is_held();
            tracing::info!(name, leading, "item-batch scaler leadership changed");
        }
        if !woken {
            last_full = tokio::time::Instant::now();
        }
        let passed = if leading {
            pass(&shared, woken, &|| lease.is_held()).await
        } else {
            shared.metrics.standby();
            sample_live(&shared).await
        };
        shared.metrics.sample_rate();
        if let Err(error) = passed {
            tracing::warn!(error = %error, "scaling pass failed");
        }
        // Wake for the next renewal too, so a slow interval cannot let the lease lapse.
        let nap = interval.min(renew_every);
        woken = tokio::select! {
            _ = shutdown.cancelled() => false,
            _ = tokio::time::sleep(nap) => false,
            _ = shared.wake.notified() => {
                tokio::time::sleep(MIN_PASS_GAP.min(interval)).await;
                last_full.elapsed() < interval
            }
        };
    }
    if let Err(error) = lease.release().await {
        tracing::warn!(error = %error, "cannot release the scaler lease; a standby takes over when it expires");
    }
}

/// A standby's pass: the counters of every live batch, for the rate and ETA it answers with.
async fn sample_live(shared: &Shared) -> Result<()> {
    for batch in shared
        .batches
        .list_batches(None, &kiln_core::authz::Visible::All, false)
        .await?
    {
        let tally = shared.batches.tally(&batch.id).await?;
        shared.sample(&batch.id, tally.finished());
    }
    Ok(())
}

/// One look at every live batch; a pass woken by outcomes only looks at sealed batches that
/// have no backlog left (one index probe each), to end them at once. `leading` tells whether
/// this replica still holds the scaler lease; workers are asked for or stopped only while it does.
/// A full pass also sets the backlog, batch and worker gauges.
pub async fn pass(shared: &Arc<Shared>, woken: bool, leading: &(dyn Fn() -> bool + Sync)) -> Result<()> {
    let mut totals = PassTotals::default();
    for batch in shared
        .batches
        .list_batches(None, &kiln_core::authz::Visible::All, false)
        .await?
    {
        if woken && (batch.state != store::SEALED || shared.batches.has_backlog(&batch.id).await?) {
            continue;
        }
        if !leading() {
            return Ok(());
        }
        if let Err(error) = tend(shared, &batch, leading, &mut totals).await {
            tracing::warn!(batch_id = %batch.id, error = %error, "cannot tend batch");
        }
        if !woken {
            // Its workers, items in flight and rate change without a write of its own.
            shared.batches.touch(&batch.id);
        }
    }
    if !woken && leading() {
        if let Err(error) = stop_workers_of_ended_batches(shared).await {
            tracing::warn!(error = %error, "cannot stop the unstarted workers of ended batches");
        }
        let batches = shared.batches.count_batches().await?;
        shared.metrics.leader_pass(&totals, &batches);
    }
    Ok(())
}

async fn tend(
    shared: &Arc<Shared>,
    batch: &BatchRecord,
    leading: &(dyn Fn() -> bool + Sync),
    totals: &mut PassTotals,
) -> Result<()> {
    shared.publish_stranded(&batch.id).await?;
    let tally = shared.batches.tally(&batch.id).await?;
    shared.sample(&batch.id, tally.finished());
    let in_flight = match tally.pending {
        0 => 0,
        _ => shared.in_flight(&batch.id).await.unwrap_or(0),
    };
    if batch.state == store::SEALED && tally.backlog() == 0 {
        if shared
            .batches
            .set_batch_state(&batch.id, &[store::SEALED], store::DONE)
            .await?
        {
            shared.forget_state(&batch.id);
            shared.drop_queue(&batch.id).await?;
            shared.forget_progress(&batch.id);
            tracing::info!(batch_id = %batch.id, succeeded = tally.succeeded, dead = tally.dead, "batch done");
            // Running workers are told to stop by their sessions; those not started yet go now.
            let live = shared.store.live_batch_workers(&batch.id).await?;
            stop_unstarted(shared, live, 0).await?;
        }
        // Done: not a live batch's items any more, though this pass listed it as sealed.
        return Ok(());
    }
    totals.add(&tally, in_flight);
    let spec = Spec::from_json(&batch.spec_json)?;
    let live = shared.store.live_batch_workers(&batch.id).await?;
    if !batch.paused_reason.is_empty() {
        return stop_paused(shared, live, &batch.paused_reason, leading).await;
    }
    if let Err(error) = shared.store.check_owner(&batch.owner_id, &batch.project).await {
        return pause(shared, batch, live, error.into(), leading).await;
    }
    let wanted = desired_workers(&tally, spec.max_workers, shared.rate(&batch.id), live.len());
    totals.workers_live += live.len() as u64;
    totals.workers_requested += wanted as u64;
    if !leading() {
        return Ok(());
    }
    if wanted < live.len() {
        stop_unstarted(shared, live, wanted).await?;
    } else if wanted > live.len() && !stalled(shared, batch).await? {
        // Several at a time: a thousand one by one would take the database's round trips each.
        let submitted: Vec<Result<()>> = futures::stream::iter(live.len()..wanted)
            .map(|_| submit_worker(shared, batch, &spec))
            .buffer_unordered(SUBMIT_CONCURRENCY)
            .collect()
            .await;
        if let Some(revoked) = submitted.into_iter().filter_map(Result::err).next() {
            // The owner lost the right between the check above and the insert.
            let live = shared.store.live_batch_workers(&batch.id).await?;
            return pause(shared, batch, live, revoked, leading).await;
        }
    }
    Ok(())
}

/// Pauses a live batch for `error` when it is [`kiln_core::store::StoreError::OwnerRevoked`]
/// (and returns any other error): it asks for no more workers, and its workers stop.
async fn pause(
    shared: &Shared,
    batch: &BatchRecord,
    live: Vec<JobRecord>,
    error: Error,
    leading: &(dyn Fn() -> bool + Sync),
) -> Result<()> {
    let Some(why) = error.owner_revoked() else {
        return Err(error);
    };
    let reason = paused_reason(why);
    if !leading() {
        return Ok(());
    }
    if shared.batches.pause(&batch.id, &reason).await? {
        tracing::warn!(batch_id = %batch.id, reason = %reason, "batch paused: its owner may no longer run jobs");
    }
    stop_paused(shared, live, &reason, leading).await
}

/// Stops every live worker of a paused batch, started or not.
async fn stop_paused(
    shared: &Shared,
    live: Vec<JobRecord>,
    reason: &str,
    leading: &(dyn Fn() -> bool + Sync),
) -> Result<()> {
    for job in live.into_iter().filter(|job| !job.stop_requested) {
        if !leading() {
            return Ok(());
        }
        stop_job(&shared.nats, &shared.store, job, reason).await?;
    }
    Ok(())
}

/// Whether the batch asks for no more workers: it is stalled, or is found so now, after
/// `max-worker-failures` of its workers failed in a row ([`crate::store::BatchStore::failing_workers`]).
async fn stalled(shared: &Shared, batch: &BatchRecord) -> Result<bool> {
    if !batch.stalled_reason.is_empty() {
        return Ok(true);
    }
    let limit = shared.config.max_worker_failures;
    let Some(reason) = shared.batches.failing_workers(batch, limit).await? else {
        return Ok(false);
    };
    let reason = if reason.is_empty() {
        "no reason given".into()
    } else {
        reason
    };
    let stalled_reason = format!("{limit} workers in a row failed, the last with: {reason}");
    if shared.batches.stall(&batch.id, &stalled_reason).await? {
        tracing::warn!(batch_id = %batch.id, reason = %stalled_reason, "batch stalled: no more workers until it is retried");
    }
    Ok(true)
}

/// Stops workers that have not started (newest first) until at most `keep` are left: those
/// queued, placed on a runner that has not taken them yet (the runner's compare-and-set then
/// finds them stopped and takes nothing), or preempted and waiting to be queued again.
async fn stop_unstarted(shared: &Shared, live: Vec<JobRecord>, keep: usize) -> Result<()> {
    let surplus = live.len().saturating_sub(keep);
    let unstarted = live
        .into_iter()
        .rev()
        .filter(|job| {
            matches!(
                job.state(),
                Ok(JobState::Queued | JobState::Scheduled | JobState::Preempted)
            )
        })
        .take(surplus);
    for job in unstarted {
        stop_job(&shared.nats, &shared.store, job, "not needed: the batch has no backlog").await?;
    }
    Ok(())
}

/// Stops the workers not started yet of batches that have ended. A batch stops its unstarted
/// workers when it is done, but a worker running then and preempted after is queued again by the
/// scheduler, which does not know batches: it would get a machine of its own only to find no
/// work. Batches are read only for the workers found.
async fn stop_workers_of_ended_batches(shared: &Shared) -> Result<()> {
    let unstarted = shared.store.unstarted_batch_workers().await?;
    if unstarted.is_empty() {
        return Ok(());
    }
    let mut batch_ids: Vec<String> = unstarted.iter().map(|job| job.batch_id.clone()).collect();
    batch_ids.sort_unstable();
    batch_ids.dedup();
    let ended: std::collections::HashSet<String> = shared
        .batches
        .changed_batches(&batch_ids, None, &kiln_core::authz::Visible::All)
        .await?
        .into_iter()
        .filter(|batch| batch.state == store::DONE || batch.state == store::CANCELLED)
        .map(|batch| batch.id)
        .collect();
    for job in unstarted.into_iter().filter(|job| ended.contains(&job.batch_id)) {
        stop_job(&shared.nats, &shared.store, job, "not needed: the batch has ended").await?;
    }
    Ok(())
}

/// Workers wanted: none without backlog; else enough to finish the backlog within
/// [`TARGET_DRAIN_SECS`] at the rate per worker measured so far (one per item while there is no
/// measure yet), at least one, at most `max_workers`.
pub fn desired_workers(tally: &Tally, max_workers: u32, rate: Option<f64>, live: usize) -> usize {
    let backlog = tally.backlog();
    if backlog == 0 {
        return 0;
    }
    let per_worker = match rate {
        Some(rate) if rate > 0.0 && live > 0 => rate / live as f64,
        _ => return backlog.min(u64::from(max_workers)) as usize,
    };
    let needed = (backlog as f64 / (per_worker * TARGET_DRAIN_SECS)).ceil() as u64;
    // Never ask for fewer than are running: those leave by themselves when idle.
    needed
        .clamp(1, u64::from(max_workers))
        .max(live as u64)
        .min(u64::from(max_workers)) as usize
}

async fn submit_worker(shared: &Shared, batch: &BatchRecord, spec: &Spec) -> Result<()> {
    let program = if spec.image.is_empty() {
        agent_path(shared)?
    } else {
        AGENT_IN_CONTAINER.to_string()
    };
    let mut env = spec.env.clone();
    env.insert("KILN_BATCH_ID".into(), batch.id.clone());
    env.insert("KILN_ITEMS_ADDR".into(), shared.advertise_url.clone());
    env.insert("KILN_AGENT_SLOTS".into(), spec.slots.to_string());
    // Only while the owner may still run jobs here (else `OwnerRevoked`: the batch pauses).
    let job = shared
        .store
        .insert_controller_job(NewJob {
            owner_id: batch.owner_id.clone(),
            project: batch.project.clone(),
            name: format!("{}-worker", spec.name),
            command: vec![program],
            env,
            cpu_millis: i64::from(spec.cpu_millis) * i64::from(spec.slots),
            memory_bytes: i64::try_from(
                spec.memory_mb
                    .saturating_mul(1 << 20)
                    .saturating_mul(u64::from(spec.slots)),
            )
            .unwrap_or(i64::MAX),
            gpus: i32::try_from(spec.gpus).unwrap_or(0),
            disk_bytes: i64::try_from(spec.disk_bytes).unwrap_or(i64::MAX),
            shm_bytes: i64::try_from(spec.shm_bytes).unwrap_or(i64::MAX),
            image: spec.image.clone(),
            batch_id: batch.id.clone(),
            market_policy: MarketPolicy::from_proto(pb::Market::try_from(spec.market).unwrap_or_default()),
            requested_pool: spec.pool.clone(),
            // The runner opens them and injects them into the worker, whose items inherit them.
            secrets: spec.secrets.clone(),
            ..NewJob::default()
        })
        .await?;
    tracing::info!(batch_id = %batch.id, job_id = %job.id, "worker asked for");
    if let Err(error) = publish_job_change(&shared.nats, &shared.store, &job).await {
        tracing::warn!(job_id = %job.id, error = %error, "publish failed; the reconciler will retry");
    }
    Ok(())
}

/// The kiln-agent that process workers run: the configured one, or the one beside this program.
fn agent_path(shared: &Shared) -> Result<String> {
    if !shared.config.agent_path.as_os_str().is_empty() {
        return Ok(shared.config.agent_path.display().to_string());
    }
    let beside = agent_beside_program().ok_or_else(|| {
        Error::FailedPrecondition("kiln-agent is not beside this program; set item-batch's agent-path".into())
    })?;
    Ok(beside.display().to_string())
}

/// `kiln-agent` in the running program's directory, when there (a workspace build's).
pub fn agent_beside_program() -> Option<std::path::PathBuf> {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("kiln-agent")))
        .filter(|path| path.try_exists().unwrap_or(false))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backlog(pending: u64) -> Tally {
        Tally {
            total: pending,
            pending,
            ..Tally::default()
        }
    }

    #[test]
    fn workers_follow_the_backlog_within_bounds() {
        assert_eq!(desired_workers(&backlog(0), 10, Some(5.0), 3), 0);
        assert_eq!(desired_workers(&backlog(3), 10, None, 0), 3);
        assert_eq!(desired_workers(&backlog(1_000_000), 1000, None, 0), 1000);
        // 2 workers doing 10 items/s each: 600 items is 30 s of work for 2.
        assert_eq!(desired_workers(&backlog(600), 10, Some(20.0), 2), 2);
        assert_eq!(desired_workers(&backlog(6000), 10, Some(20.0), 2), 10);
        assert_eq!(
            desired_workers(&backlog(10), 10, Some(20.0), 4),
            4,
            "never below what runs"
        );
    }
}
