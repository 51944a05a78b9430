//! The launch consumer: pulls `kiln.launch.<pool>` one request at a time, checks the request is
//! current and fits and that this runner holds its lease, moves the job SCHEDULED → PROVISIONING
//! and hands it to a supervisor.

use std::time::Duration;

use async_nats::jetstream::AckKind;
use async_nats::jetstream::consumer::{self, pull};
use futures::StreamExt;
use kiln_core::JobState;
use kiln_core::store::{Change, StoreError};
use kiln_core::subjects;
use kiln_proto::v1 as pb;
use prost::Message;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::error::Result;
use crate::{ActiveJob, Context, nats_error, supervisor};

/// Pulls launch requests one at a time and starts the jobs that are current and fit.
pub(super) async fn take_launches(ctx: &Context, jobs: &mut JoinSet<()>, shutdown: &CancellationToken) -> Result<()> {
    let stream = ctx
        .nats
        .jetstream
        .get_stream(subjects::STREAM_LAUNCH)
        .await
        .map_err(nats_error)?;
    let name = subjects::consumer_launch(&ctx.config.pool);
    let consumer: consumer::PullConsumer = stream
        .get_or_create_consumer(
            &name,
            pull::Config {
                durable_name: Some(name.clone()),
                filter_subject: subjects::launch(&ctx.config.pool),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: Duration::from_secs(30),
                ..Default::default()
            },
        )
        .await
        .map_err(nats_error)?;
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(1)
        .messages()
        .await
        .map_err(nats_error)?;
    loop {
        // Reap finished job tasks as we go.
        while jobs.try_join_next().is_some() {}
        let message = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            message = messages.next() => message,
        };
        let Some(message) = message else {
            return Err(nats_error("launch consumer ended"));
        };
        let message = message.map_err(nats_error)?;
        let received = std::time::Instant::now();
        let ack = match accept_launch(ctx, &message.payload, received, jobs, shutdown).await {
            Ok(Accepted::Started | Accepted::Stale) => AckKind::Ack,
            Ok(Accepted::NoRoom) => AckKind::Nak(Some(Duration::from_secs(1))),
            Err(error) => {
                tracing::warn!(error = %error, "launch failed; it will be retried");
                AckKind::Nak(Some(Duration::from_secs(2)))
            }
        };
        message.ack_with(ack).await.map_err(nats_error)?;
    }
}

enum Accepted {
    Started,
    Stale,
    NoRoom,
}

async fn accept_launch(
    ctx: &Context,
    payload: &[u8],
    received: std::time::Instant,
    jobs: &mut JoinSet<()>,
    shutdown: &CancellationToken,
) -> Result<Accepted> {
    let Ok(request) = pb::LaunchRequest::decode(payload) else {
        tracing::warn!("dropping a malformed launch request");
        return Ok(Accepted::Stale);
    };
    let job = match ctx.store.job(&request.job_id).await {
        Ok(job) => job,
        Err(StoreError::JobNotFound { .. }) => return Ok(Accepted::Stale),
        Err(error) => return Err(error.into()),
    };
    // A duplicate or an outdated request: the job has moved on.
    if job.version != request.version || job.state()? != JobState::Scheduled {
        return Ok(Accepted::Stale);
    }
    // Without its lease this runner may be counted as gone: another runner takes the launch.
    if !ctx.lease.is_held() || !ctx.fits(&job) {
        return Ok(Accepted::NoRoom);
    }
    let wanted = u32::try_from(job.gpus).unwrap_or(u32::MAX);
    let Some(gpu_devices) = ctx.gpus.lock().expect("gpu pool lock").take(wanted) else {
        return Ok(Accepted::NoRoom);
    };
    let controls = supervisor::Controls::default();
    let active = ActiveJob {
        controls: controls.clone(),
        cpu_millis: job.cpu_millis,
        memory_bytes: job.memory_bytes,
        gpu_devices: gpu_devices.clone(),
    };
    ctx.active
        .lock()
        .expect("active jobs lock")
        .insert(job.id.clone(), active);
    let change = Change {
        runner_id: Some(ctx.config.runner_id.clone()),
        ..Change::default()
    };
    let provisioning = match ctx.store.transition(&job, JobState::Provisioning, change).await {
        Ok(provisioning) => provisioning,
        Err(error) => {
            ctx.release_active(&job.id);
            return match error {
                StoreError::Conflict { .. } => Ok(Accepted::Stale),
                error => Err(error.into()),
            };
        }
    };
    ctx.metrics.launches.inc();
    supervisor::publish(ctx, &provisioning).await;
    jobs.spawn(supervisor::supervise(
        ctx.clone(),
        provisioning,
        gpu_devices,
        controls,
        shutdown.clone(),
        received,
    ));
    Ok(Accepted::Started)
}
