//! Syncing an instance's outputs to object storage, while it runs and when it ends (the SYNCING
//! step before its release): one sync at a time per instance, each recorded on the job.

use kiln_core::JobState;
use kiln_core::store::{Change, JobRecord};

use super::SyncedOutputs;
use super::end::publish;
use crate::Context;
use crate::provider::Instance;

/// Copies an ended instance's outputs to object storage; a failure is logged, not fatal.
pub(crate) async fn sync_outputs(ctx: &Context, instance: &Instance, outputs: &SyncedOutputs) {
    sync(ctx, instance, outputs, false).await
}

/// Copies a running instance's outputs so far to object storage (periodic, or asked for).
pub(crate) async fn sync_live_outputs(ctx: &Context, instance: &Instance, outputs: &SyncedOutputs) {
    sync(ctx, instance, outputs, true).await
}

async fn sync(ctx: &Context, instance: &Instance, outputs: &SyncedOutputs, live: bool) {
    let mut manifest = outputs.lock().await;
    let started = std::time::Instant::now();
    let read = match live {
        true => ctx.provider.live_outputs(instance).await,
        false => ctx.provider.outputs(instance).await,
    };
    let synced = match read {
        // A failed sync leaves a fresh manifest: the next one sends everything again.
        Ok(read) => {
            crate::outputs::sync(
                ctx.objects.clone(),
                &instance.job_id,
                read,
                std::mem::take(&mut *manifest),
            )
            .await
        }
        Err(error) => {
            ctx.metrics.provider_error(instance.provider);
            Err(error)
        }
    };
    ctx.metrics.synced(
        synced.as_ref().ok().map(|(report, _)| report.written.bytes),
        started.elapsed(),
    );
    match synced {
        Ok((report, kept)) => {
            *manifest = kept;
            tracing::info!(
                job_id = %instance.job_id,
                live,
                sent_files = report.written.files,
                sent_bytes = report.written.bytes,
                files = report.total.files,
                bytes = report.total.bytes,
                deleted = report.deleted,
                took_ms = started.elapsed().as_millis() as u64,
                "outputs synced"
            );
            let at = kiln_core::ids::now_ms();
            if let Err(error) = ctx
                .store
                .record_outputs_sync(&instance.job_id, instance.attempt, at, report.total.bytes)
                .await
            {
                tracing::warn!(job_id = %instance.job_id, error = %error, "cannot record the outputs sync");
            }
        }
        Err(error) => tracing::error!(job_id = %instance.job_id, error = %error, "cannot sync the outputs"),
    }
}

/// SYNCING: copies the outputs to object storage, then releases the instance.
pub(super) async fn finish_instance(
    ctx: &Context,
    job: JobRecord,
    instance: &Instance,
    outputs: &SyncedOutputs,
) -> JobRecord {
    let job = match job.state() {
        Ok(JobState::Running) => match ctx.store.transition(&job, JobState::Syncing, Change::default()).await {
            Ok(syncing) => {
                publish(ctx, &syncing).await;
                syncing
            }
            Err(error) => {
                tracing::warn!(job_id = %job.id, error = %error, "cannot record SYNCING");
                job
            }
        },
        _ => job,
    };
    sync_outputs(ctx, instance, outputs).await;
    if let Err(error) = ctx.provider.release(instance).await {
        ctx.metrics.provider_error(instance.provider);
        tracing::error!(job_id = %job.id, error = %error, "cannot release the instance; it is released at the next restart");
    }
    job
}
