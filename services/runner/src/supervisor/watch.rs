//! Watching a running job: its end, and the stops on request, at the run-time limit, when its
//! GPUs stay idle, at shutdown, or when it was taken from this runner.

use std::sync::atomic::Ordering;
use std::time::Duration;

use kiln_core::store::JobRecord;
use nix::sys::signal::Signal;
use tokio_util::sync::CancellationToken;

use super::{Controls, Host, STOP_POLL, StopReason};

/// An inference worker's relay: its drain token and its task.
pub(super) type Relay = (CancellationToken, tokio::task::JoinHandle<crate::Result<()>>);
use crate::Context;
use crate::error::Result;
use crate::liveness::Holding;
use crate::provider::{Exit, Instance};
use crate::service_metrics as metrics;

/// Asks the running job to checkpoint (its control file, and SIGUSR1 when it handles that
/// signal), and starts a sync of its outputs so far; nothing is stopped.
async fn checkpoint_now(ctx: &Context, instance: &Instance, controls: &Controls, host: &mut Host) {
    let note = controls.checkpoint_note.lock().expect("controls lock").clone();
    match ctx.provider.ask_checkpoint(instance, &note).await {
        Ok(signalled) => tracing::info!(job_id = %instance.job_id, signalled, "job asked to checkpoint"),
        Err(error) => tracing::warn!(job_id = %instance.job_id, error = %error, "cannot ask the job to checkpoint"),
    }
    // Give the job a moment to write its checkpoint before it is copied.
    let _ = start_live_sync(ctx, instance, host, CHECKPOINT_SETTLE);
}

/// Starts a sync of the running instance's outputs after `settle`, unless one is under way;
/// returns whether it did.
fn start_live_sync(ctx: &Context, instance: &Instance, host: &mut Host, settle: Duration) -> bool {
    if host.checkpoint_sync.as_ref().is_some_and(|sync| !sync.is_finished()) {
        return false;
    }
    let (ctx, instance, outputs) = (ctx.clone(), instance.clone(), host.outputs.clone());
    host.checkpoint_sync = Some(tokio::spawn(async move {
        tokio::time::sleep(settle).await;
        super::sync_live_outputs(&ctx, &instance, &outputs).await;
    }));
    true
}

/// How long a job asked to checkpoint has before its outputs are synced.
const CHECKPOINT_SETTLE: Duration = Duration::from_secs(2);

/// Waits for the job to end, stopping it on request, on timeout, when its GPUs stay idle, or
/// at shutdown; an inference worker's relay (in `host`) is drained before the worker is
/// signalled.
pub(super) async fn watch(
    ctx: &Context,
    job: &JobRecord,
    instance: &Instance,
    gpu_devices: Vec<u32>,
    controls: &Controls,
    shutdown: &CancellationToken,
    host: &mut Host,
) -> (Result<Exit>, Option<StopReason>) {
    let deadline = (job.max_runtime_secs > 0).then(|| {
        tokio::time::Instant::now() + Duration::from_secs(u64::try_from(job.max_runtime_secs).unwrap_or(u64::MAX / 2))
    });
    let wait = ctx.provider.wait(instance);
    tokio::pin!(wait);
    let idle_gpu = async {
        match &ctx.sampler {
            Some(sampler) => crate::gpu::idle(sampler.clone(), gpu_devices, ctx.config.idle_gpu.clone()).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(idle_gpu);
    let mut stopping: Option<StopReason> = None;
    // Outputs are synced every `sync-interval-secs` while the job runs, and when it asks.
    let sync_every = Duration::from_secs(ctx.config.outputs_sync_interval_secs);
    let mut next_sync = tokio::time::Instant::now() + sync_every;
    // A marker already there was written by this attempt (it is never synced, so never
    // restored): it counts too.
    let mut asked: Option<i64> = None;
    // One timer across the loop's turns: a sleep made anew each turn would never end while
    // another branch (a sync every second) wakes the loop more often than it.
    let mut poll = tokio::time::interval_at(tokio::time::Instant::now() + STOP_POLL, STOP_POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            exit = &mut wait => return (exit, stopping),
            _ = controls.stop.cancelled(), if stopping.is_none() => stopping = Some(StopReason::User),
            _ = controls.preempted.cancelled(), if stopping.is_none() => stopping = Some(StopReason::Preempted),
            _ = shutdown.cancelled(), if stopping.is_none() => stopping = Some(StopReason::Shutdown),
            _ = tokio::time::sleep_until(deadline.unwrap_or_else(tokio::time::Instant::now)), if stopping.is_none() && deadline.is_some() => {
                stopping = Some(StopReason::Timeout);
            }
            _ = &mut idle_gpu, if stopping.is_none() => stopping = Some(StopReason::IdleGpu),
            _ = controls.checkpoint.notified(), if stopping.is_none() => {
                checkpoint_now(ctx, instance, controls, host).await;
            }
            _ = tokio::time::sleep_until(next_sync), if stopping.is_none() && !sync_every.is_zero() => {
                let _ = start_live_sync(ctx, instance, host, Duration::ZERO);
                next_sync = tokio::time::Instant::now() + sync_every;
            }
            _ = poll.tick(), if stopping.is_none() => {
                // A sync under way leaves the ask for the next poll.
                if let Ok(now) = ctx.provider.sync_asked(instance).await
                    && now.is_some()
                    && now != asked
                    && start_live_sync(ctx, instance, host, Duration::ZERO)
                {
                    asked = now;
                    tracing::info!(job_id = %job.id, "the job asked for its outputs to be synced");
                }
                if job.nodes > 1
                    && let Ok(nodes) = ctx.store.gang_nodes(&job.id, job.attempt).await
                    && let Some(trouble) = super::gang::trouble(&nodes, kiln_core::ids::now_ms(), super::gang::quiet_ms(ctx))
                {
                    let (reason, why) = match trouble {
                        super::gang::Trouble::Failed(why) => (StopReason::GangFailed, why),
                        super::gang::Trouble::Lost(why) => (StopReason::GangLost, why),
                    };
                    tracing::warn!(job_id = %job.id, why, "a node of the gang ended the attempt");
                    *controls.gang_trouble.lock().expect("controls lock") = why;
                    stopping = Some(reason);
                }
                match ctx.store.job_hold(&job.id).await {
                    Ok(current) if Holding::of(job).is_taken_by(Holding::of_hold(&current)) => {
                        tracing::warn!(job_id = %job.id, state = ?current.state, attempt = current.attempt, "the job was taken from this runner: SIGKILL");
                        controls.taken.cancel();
                        let _ = ctx.provider.signal(instance, Signal::SIGKILL).await;
                        return (wait.await, Some(StopReason::Taken));
                    }
                    Ok(current) if current.stop_requested => stopping = Some(StopReason::User),
                    _ => {}
                }
            }
        }
        if let Some(reason) = stopping {
            host.phase.enter(metrics::STOPPING);
            if let Some((drain, task)) = host.relay.take() {
                // An inference worker drains first: out of rotation, its requests in flight
                // answered; then it is stopped.
                tracing::info!(job_id = %job.id, ?reason, "draining the inference worker");
                drain.cancel();
                let _ = task.await;
            }
            tracing::info!(job_id = %job.id, ?reason, grace_ms = ctx.config.stop_grace_period_ms, "stopping job: SIGTERM");
            if let Err(error) = ctx.provider.signal(instance, Signal::SIGTERM).await {
                ctx.metrics.provider_error(instance.provider);
                tracing::warn!(job_id = %job.id, error = %error, "SIGTERM failed");
            }
            // A preempted job has the notice period to checkpoint; the cloud ends it after.
            let grace = match reason {
                StopReason::Preempted => Duration::from_millis(controls.notice_ms.load(Ordering::SeqCst)),
                _ => Duration::from_millis(ctx.config.stop_grace_period_ms),
            };
            if let Ok(exit) = tokio::time::timeout(grace, &mut wait).await {
                return (exit, stopping);
            }
            tracing::info!(job_id = %job.id, "grace period over: SIGKILL");
            if let Err(error) = ctx.provider.signal(instance, Signal::SIGKILL).await {
                ctx.metrics.provider_error(instance.provider);
                tracing::warn!(job_id = %job.id, error = %error, "SIGKILL failed");
            }
            return (wait.await, stopping);
        }
    }
}
