//! How an attempt's end is recorded: its end state and cost, a preempted job queued again as
//! its next attempt, a job whose runner went away ended LOST or queued again
//! ([`kiln_core::runners::lose_job`], shared with the scheduler).

use kiln_core::JobState;
use kiln_core::events::{publish_job_change, publish_job_change_on};
use kiln_core::scheduling::{Market, SPOT_PREEMPTION};
use kiln_core::store::{Change, JobRecord, StoreError};

use super::{Outcome, StopReason};
use crate::Context;
use crate::error::Result;
use crate::service_metrics as metrics;

/// Records the end of the attempt.
/// `preempted_for` names the job a priority preemption made room for.
pub(super) async fn conclude(
    ctx: &Context,
    job: JobRecord,
    outcome: &Outcome,
    preempted_for: Option<String>,
    gang_trouble: String,
) -> Result<()> {
    let cost = attempt_cost(ctx, &job);
    let gpu_ms = attempt_gpu_ms(ctx, &job);
    let change = |exit_code: Option<i32>, reason: &str| Change {
        exit_code,
        reason: Some(reason.to_string()),
        cost_micros: cost,
        gpu_ms,
        ..Change::default()
    };
    let (state, change) = match outcome.clone() {
        // Never concluded: the new state is someone else's.
        Outcome::Exited {
            stopped: Some(StopReason::Taken),
            ..
        } => return Ok(()),
        Outcome::Exited {
            stopped: Some(StopReason::Shutdown),
            ..
        } => {
            return lose(ctx, &job, "the runner shut down while the job ran").await;
        }
        Outcome::Exited {
            exit,
            stopped: Some(StopReason::Preempted),
        } => {
            return requeue_preempted(ctx, job, exit.code, preempted_for, (cost, gpu_ms)).await;
        }
        Outcome::Exited {
            exit,
            stopped: Some(StopReason::User),
        } => (JobState::Stopped, change(Some(exit.code), "stopped by user")),
        Outcome::Exited {
            stopped: Some(StopReason::GangLost),
            ..
        } => {
            return lose(ctx, &job, &gang_trouble).await;
        }
        Outcome::Exited {
            exit,
            stopped: Some(StopReason::GangFailed),
        } => (JobState::Failed, change(Some(exit.code), &gang_trouble)),
        Outcome::Exited {
            exit,
            stopped: Some(StopReason::Timeout),
        } => (JobState::Stopped, change(Some(exit.code), "timeout")),
        Outcome::Exited {
            exit,
            stopped: Some(StopReason::IdleGpu),
        } => (JobState::Stopped, change(Some(exit.code), "idle GPU")),
        Outcome::Exited { exit, stopped: None } if exit.code == 0 => (JobState::Succeeded, change(Some(0), "")),
        Outcome::Exited { exit, stopped: None } if exit.oom_killed => {
            let reason = format!("out of memory: the limit is {} bytes", job.memory_bytes);
            (JobState::Failed, change(Some(exit.code), &reason))
        }
        Outcome::Exited { exit, stopped: None } if exit.disk_full => {
            let reason = format!(
                "its disk is full: it wrote past --disk ({} bytes) in /kiln/code, /kiln/outputs or /tmp (exit code {}); ask for a larger --disk",
                job.disk_bytes, exit.code
            );
            (JobState::Failed, change(Some(exit.code), &reason))
        }
        Outcome::Exited { exit, stopped: None } => {
            let reason = if exit.code > 128 {
                format!("killed by signal {}", exit.code - 128)
            } else {
                format!("exited with code {}", exit.code)
            };
            (JobState::Failed, change(Some(exit.code), &reason))
        }
        Outcome::NotStarted {
            reason,
            exit_code,
            stopped,
        } => {
            let state = if stopped { JobState::Stopped } else { JobState::Failed };
            (state, change(exit_code, &reason))
        }
    };
    let ended = ctx.store.transition(&job, state, change).await?;
    if let Some((spent, _)) = cost {
        ctx.metrics.spent(market_of(ctx, &job), spent);
    }
    tracing::info!(job_id = %ended.id, state = %ended.state, exit_code = ?ended.exit_code, reason = %ended.reason, "job ended");
    publish(ctx, &ended).await;
    Ok(())
}

/// The market of an attempt: the instance's (a runner reading its instance metadata), else the
/// scheduler's choice, or (for a job placed before schedulers
/// chose) spot when the provider offers it.
pub(super) fn market_of(ctx: &Context, job: &JobRecord) -> Market {
    // On a cloud instance the machine's own market is the truth.
    if let Some(identity) = &ctx.identity {
        return if identity.is_spot() {
            Market::Spot
        } else {
            Market::OnDemand
        };
    }
    Market::parse(&job.market).unwrap_or(if ctx.offer().spot {
        Market::Spot
    } else {
        Market::OnDemand
    })
}

/// What the attempt cost from its start until now, and what on-demand would have cost, in
/// millionths; `None` when it never ran.
fn attempt_cost(ctx: &Context, job: &JobRecord) -> Option<(i64, i64)> {
    let hours = attempt_ms(ctx, job)? / 3_600_000.0;
    let offer = ctx.offer();
    let asked = (job.cpu_millis, job.memory_bytes, u32::try_from(job.gpus).unwrap_or(0));
    let cost = |market| (offer.cost_per_hour(&ctx.capacity, asked, market) * hours * 1e6).round() as i64;
    Some((cost(market_of(ctx, job)), cost(Market::OnDemand)))
}

/// How long the attempt ran, in the provider's time (a simulated provider's may run faster).
/// The attempt's instance time: how long it ran, times its nodes (a gang's nodes are alike, and
/// each costs what rank 0's does), in milliseconds.
fn attempt_ms(ctx: &Context, job: &JobRecord) -> Option<f64> {
    let started = job.started_at_ms?;
    let nodes = f64::from(job.nodes.max(1));
    Some((kiln_core::ids::now_ms() - started).max(0) as f64 * ctx.offer().time_scale * nodes)
}

/// The attempt's GPU time: its GPUs times how long it ran, in milliseconds.
fn attempt_gpu_ms(ctx: &Context, job: &JobRecord) -> Option<i64> {
    Some((attempt_ms(ctx, job)? * job.gpus.max(0) as f64).round() as i64)
}

/// The instance was taken back (a spot preemption) or a higher priority needs the room: the job
/// ends PREEMPTED and is queued again as a new attempt, keeping its id, with `resume_from`
/// naming its synced outputs (checkpoints included): the next attempt finds them in its outputs
/// directory, which `KILN_RESUME_FROM` names.
async fn requeue_preempted(
    ctx: &Context,
    job: JobRecord,
    exit_code: i32,
    for_job: Option<String>,
    (cost_micros, gpu_ms): (Option<(i64, i64)>, Option<i64>),
) -> Result<()> {
    let spot = for_job.is_none();
    let reason = match for_job {
        Some(for_job) => format!("preempted for {for_job}, of a higher priority"),
        None => SPOT_PREEMPTION.to_string(),
    };
    let change = Change {
        exit_code: Some(exit_code),
        reason: Some(reason),
        preempted: true,
        resume_from: Some(kiln_core::objects::outputs_prefix(&job.id).to_string()),
        cost_micros,
        gpu_ms,
        ..Change::default()
    };
    let preempted = ctx.store.transition(&job, JobState::Preempted, change).await?;
    if let Some((spent, _)) = cost_micros {
        ctx.metrics.spent(market_of(ctx, &job), spent);
    }
    // A spot preemption names the offering it happened on, when this runner knows its instance:
    // the scheduler learns the rate per pool, instance type and zone.
    let offering = ctx
        .identity
        .as_ref()
        .filter(|_| spot)
        .map(|identity| identity.offering());
    if let Err(error) = publish_job_change_on(&ctx.nats, &ctx.store, &preempted, offering.as_ref()).await {
        tracing::warn!(job_id = %preempted.id, error = %error, "publish failed; the reconciler will retry");
    }
    let change = Change {
        reason: Some("preempted; queued again".into()),
        next_attempt: true,
        ..Change::default()
    };
    let queued = match ctx.store.transition(&preempted, JobState::Queued, change).await {
        Ok(queued) => queued,
        // Stopped by its user in the meantime: it stays stopped.
        Err(StoreError::Conflict { .. }) => return Ok(()),
        Err(error) => return Err(error.into()),
    };
    tracing::warn!(job_id = %queued.id, attempt = queued.attempt, "job preempted; queued again");
    publish(ctx, &queued).await;
    Ok(())
}

/// Ends a job whose runner went away (this one, restarted or shutting down): LOST, or queued
/// again as `on-lost` says, resuming from the outputs synced so far (the callers sync what the
/// dead attempt left before they call this). A job changed meanwhile is left as it is.
pub(crate) async fn lose(ctx: &Context, job: &JobRecord, why: &str) -> Result<()> {
    kiln_core::runners::lose_job(&ctx.nats, &ctx.store, job, ctx.config.lost_policy(), why).await?;
    Ok(())
}

/// Publishes a committed change; a failure is re-driven by the reconciler.
pub(crate) async fn publish(ctx: &Context, job: &JobRecord) {
    if let Err(error) = publish_job_change(&ctx.nats, &ctx.store, job).await {
        tracing::warn!(job_id = %job.id, error = %error, "publish failed; the reconciler will retry");
    }
}

/// The reason of `kiln_runner_stops_total` an attempt ended with (`taken`: it was taken from
/// this runner).
pub(super) fn stop_reason(outcome: &Outcome, taken: bool) -> &'static str {
    if taken {
        return metrics::TAKEN;
    }
    match outcome {
        Outcome::Exited {
            stopped: Some(reason), ..
        } => match reason {
            StopReason::User => metrics::STOPPED,
            StopReason::Timeout => metrics::TIMEOUT,
            StopReason::IdleGpu => metrics::IDLE_GPU,
            StopReason::Preempted => metrics::PREEMPTED,
            StopReason::Shutdown => metrics::LOST,
            StopReason::Taken => metrics::TAKEN,
            StopReason::GangFailed => metrics::FAILED,
            StopReason::GangLost => metrics::LOST,
        },
        Outcome::Exited { exit, stopped: None } if exit.code == 0 => metrics::SUCCEEDED,
        Outcome::Exited { exit, stopped: None } if exit.oom_killed => metrics::OOM,
        Outcome::Exited { stopped: None, .. } => metrics::FAILED,
        Outcome::NotStarted { stopped: true, .. } => metrics::STOPPED,
        Outcome::NotStarted { stopped: false, .. } => metrics::NOT_STARTED,
    }
}
