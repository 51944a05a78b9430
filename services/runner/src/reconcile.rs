//! After a restart: the jobs this runner held are ended, their instances and anything else
//! labelled with it released, and unpublished changes of its jobs published again.

use kiln_core::JobState;
use kiln_core::events::publish_job_change;

use crate::error::Result;
use crate::{Context, supervisor};

/// Ends the jobs this runner held before it restarted, and publishes what was left unpublished.
pub(super) async fn reconcile(ctx: &Context) -> Result<()> {
    let held = ctx
        .store
        .jobs_in_states(&[JobState::Provisioning, JobState::Running, JobState::Syncing])
        .await?;
    for job in held.into_iter().filter(|job| job.runner_id == ctx.config.runner_id) {
        let scratch_dir = ctx.config.work_dir.join(format!("{}-{}", job.id, job.attempt));
        if let Some(instance) = ctx
            .provider
            .recover(&job.id, job.attempt, &job.instance_id, scratch_dir)
            .await?
        {
            tracing::warn!(job_id = %job.id, instance = %instance.id, "killing an instance left by the previous runner");
            ctx.provider
                .signal(&instance, nix::sys::signal::Signal::SIGKILL)
                .await?;
            supervisor::sync_outputs(ctx, &instance, &Default::default()).await;
            ctx.provider.release(&instance).await?;
        }
        supervisor::lose(ctx, &job, "the runner restarted while the job ran").await?;
        ctx.metrics.stopped(crate::service_metrics::LOST);
    }
    let released = ctx.provider.release_leftovers(&ctx.config.runner_id, &[]).await?;
    if released > 0 {
        tracing::warn!(released, "released instances left by the previous runner");
    }
    republish_own(ctx).await
}

pub(crate) async fn republish_own(ctx: &Context) -> Result<()> {
    let pending = ctx.store.unpublished_jobs_on(&ctx.config.runner_id).await?;
    for job in &pending {
        publish_job_change(&ctx.nats, &ctx.store, job).await?;
    }
    Ok(())
}
