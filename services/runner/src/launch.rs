//! The launch consumer: pulls `kiln.launch.<pool>.<runner>`, the launches of the jobs the
//! scheduler placed on this runner, one request at a time, checks the request is current and
//! fits and that this runner holds its lease, moves the job SCHEDULED → PROVISIONING and hands
//! it to a supervisor. A launch that does not fit (the scheduler read an older report) is tried
//! again a few times, then its job is queued again by compare-and-set, to be placed on fresh
//! numbers: it never bounces for ever.

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
    let name = subjects::consumer_launch_on(&ctx.config.runner_id);
    let consumer: consumer::PullConsumer = stream
        .get_or_create_consumer(
            &name,
            pull::Config {
                durable_name: Some(name.clone()),
                filter_subject: subjects::launch_on(&ctx.config.pool, &ctx.config.runner_id),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: Duration::from_secs(30),
                // A runner gone for good leaves no consumer behind; the scheduler queues its
                // jobs again when its lease lapses.
                inactive_threshold: Duration::from_secs(3600),
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
            Ok(Accepted::NoRoom) => {
                let delivered = message.info().map_or(0, |info| info.delivered);
                if delivered < NO_ROOM_TRIES {
                    AckKind::Nak(Some(Duration::from_secs(1)))
                } else {
                    give_back(ctx, &message.payload).await?;
                    AckKind::Ack
                }
            }
            Err(error) => {
                tracing::warn!(error = %error, "launch failed; it will be retried");
                AckKind::Nak(Some(Duration::from_secs(2)))
            }
        };
        message.ack_with(ack).await.map_err(nats_error)?;
    }
}

/// How many times a launch that does not fit is delivered before its job is queued again.
const NO_ROOM_TRIES: i64 = 5;

/// Queues again (SCHEDULED → QUEUED, by compare-and-set on the version the request names) the
/// job of a launch this runner has no room for, so the scheduler places it on fresh numbers.
async fn give_back(ctx: &Context, payload: &[u8]) -> Result<()> {
    let Ok(request) = pb::LaunchRequest::decode(payload) else {
        return Ok(());
    };
    let job = match ctx.store.job(&request.job_id).await {
        Ok(job) => job,
        Err(StoreError::JobNotFound { .. }) => return Ok(()),
        Err(error) => return Err(error.into()),
    };
    if job.version != request.version || job.state()? != JobState::Scheduled {
        return Ok(());
    }
    let change = Change {
        reason: Some(format!(
            "runner {} had no room for it when its launch came; queued again",
            ctx.config.runner_id
        )),
        ..Change::default()
    };
    match ctx.store.transition(&job, JobState::Queued, change).await {
        Ok(queued) => {
            tracing::warn!(job_id = %queued.id, "no room for a launch; its job is queued again");
            if let Err(error) = kiln_core::events::publish_job_change(&ctx.nats, &ctx.store, &queued).await {
                tracing::warn!(job_id = %queued.id, error = %error, "publish failed");
            }
            Ok(())
        }
        Err(StoreError::Conflict { .. }) => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// Takes the launch of node `request.node_rank` (> 0) of a gang job: current while the job's
/// attempt is the request's and not over, and this runner is the node's.
async fn accept_node(
    ctx: &Context,
    job: &kiln_core::store::JobRecord,
    request: &pb::LaunchRequest,
    jobs: &mut JoinSet<()>,
    shutdown: &CancellationToken,
) -> Result<Accepted> {
    let goes_on = matches!(
        job.state()?,
        JobState::Scheduled | JobState::Provisioning | JobState::Running
    );
    if job.attempt != request.attempt || !goes_on {
        return Ok(Accepted::Stale);
    }
    let rank = i32::try_from(request.node_rank).unwrap_or(i32::MAX);
    let nodes = ctx.store.gang_nodes(&job.id, job.attempt).await?;
    let Some(node) = nodes.iter().find(|node| node.rank == rank) else {
        return Ok(Accepted::Stale);
    };
    if node.runner_id != ctx.config.runner_id || node.state != kiln_core::store::node_state::PLACED {
        return Ok(Accepted::Stale);
    }
    let key = subjects::node_log_id(&job.id, request.node_rank);
    if ctx.active.lock().expect("active jobs lock").contains_key(&key) {
        return Ok(Accepted::Stale);
    }
    let Some((gpu_devices, controls)) = hold(ctx, job, key) else {
        return Ok(Accepted::NoRoom);
    };
    ctx.metrics.launches.inc();
    jobs.spawn(supervisor::gang::supervise_node(
        ctx.clone(),
        job.clone(),
        rank,
        gpu_devices,
        controls,
        shutdown.clone(),
    ));
    Ok(Accepted::Started)
}

/// Takes the room and GPUs of `job` on this runner under `key` (its id, or a gang node's log
/// id), with the controls its supervisor answers to; `None` when there is no room. Without its
/// lease this runner may be counted as gone (another runner takes the launch), and a cordoned
/// one (its instance is to be taken back) has no room for anything new.
fn hold(ctx: &Context, job: &kiln_core::store::JobRecord, key: String) -> Option<(Vec<u32>, supervisor::Controls)> {
    if !ctx.lease.is_held() || ctx.is_cordoned() || !ctx.fits(job) {
        return None;
    }
    let wanted = u32::try_from(job.gpus).unwrap_or(u32::MAX);
    let gpu_devices = ctx.gpus.lock().expect("gpu pool lock").take(wanted)?;
    let controls = supervisor::Controls::default();
    let active = ActiveJob {
        controls: controls.clone(),
        cpu_millis: job.cpu_millis,
        memory_bytes: job.memory_bytes,
        disk_bytes: job.disk_bytes,
        gpu_devices: gpu_devices.clone(),
    };
    ctx.active.lock().expect("active jobs lock").insert(key, active);
    Some((gpu_devices, controls))
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
    if request.node_rank > 0 {
        return accept_node(ctx, &job, &request, jobs, shutdown).await;
    }
    // A duplicate or an outdated request: the job has moved on.
    if job.version != request.version || job.state()? != JobState::Scheduled {
        return Ok(Accepted::Stale);
    }
    let Some((gpu_devices, controls)) = hold(ctx, &job, job.id.clone()) else {
        return Ok(Accepted::NoRoom);
    };
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
