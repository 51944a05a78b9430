//! Publishing job changes after they are committed (the outbox side of the state machine).
//!
//! A change is committed first, then published with the message id `<job>:<version>`, then
//! marked published. A crash in between leaves `published_version < version`, and the
//! reconciler of the service owning that state publishes again on start; JetStream drops the
//! duplicate within its window and every consumer checks versions, so nothing is applied twice.
//! A job change is therefore published once ([`try_publish`]) and left to the reconciler when
//! that fails (a cluster electing a stream leader), rather than hold its caller up; a control
//! request has no outbox and is sent again until stored ([`publish`]).

use bytes::Bytes;
use kiln_proto::v1 as pb;
use prost::Message;

use crate::Error;
use crate::state::JobState;
use crate::store::{Change, JobRecord, Store, StoreError};
use crate::streams::{Nats, publish, try_publish};
use crate::subjects;

/// Publishes the job's current state (and, for SCHEDULED, its launch request), then records it
/// as published.
pub async fn publish_job_change(nats: &Nats, store: &Store, job: &JobRecord) -> Result<(), Error> {
    publish_job_change_on(nats, store, job, None).await
}

/// The offering (instance type, zone) an attempt ran on, carried by its job event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Offering {
    pub instance_type: String,
    pub zone: String,
}

/// [`publish_job_change`], with the event naming the `offering` the attempt ran on (a runner
/// that knows its instance, on a spot preemption). A change published again later (by a
/// reconciler) names none.
pub async fn publish_job_change_on(
    nats: &Nats,
    store: &Store,
    job: &JobRecord,
    offering: Option<&Offering>,
) -> Result<(), Error> {
    let state = job.state()?;
    let msg_id = subjects::job_msg_id(&job.id, job.version);
    let event = pb::JobEvent {
        job_id: job.id.clone(),
        version: job.version,
        state: state.to_proto() as i32,
        pool: job.pool.clone(),
        market: job.market.clone(),
        reason: job.reason.clone(),
        instance_type: offering.map(|o| o.instance_type.clone()).unwrap_or_default(),
        zone: offering.map(|o| o.zone.clone()).unwrap_or_default(),
    };
    let subject = if state == JobState::Queued {
        subjects::JOB_QUEUED.to_string()
    } else {
        subjects::job_event(&job.id)
    };
    try_publish(&nats.jetstream, subject, &msg_id, Bytes::from(event.encode_to_vec())).await?;
    if state == JobState::Scheduled {
        let launch = pb::LaunchRequest {
            job_id: job.id.clone(),
            version: job.version,
            attempt: job.attempt,
            node_rank: 0,
        };
        // A job placed on a runner goes to that runner alone.
        let subject = if job.runner_id.is_empty() {
            subjects::launch(&job.pool)
        } else {
            subjects::launch_on(&job.pool, &job.runner_id)
        };
        try_publish(&nats.jetstream, subject, &msg_id, Bytes::from(launch.encode_to_vec())).await?;
        // A gang's other nodes, each to its runner.
        if job.nodes > 1 {
            for node in store
                .gang_nodes(&job.id, job.attempt)
                .await?
                .iter()
                .filter(|node| node.rank > 0)
            {
                let launch = pb::LaunchRequest {
                    node_rank: u32::try_from(node.rank).unwrap_or(0),
                    ..launch.clone()
                };
                let subject = subjects::launch_on(&job.pool, &node.runner_id);
                let msg_id = format!("{msg_id}:{}", node.rank);
                try_publish(&nats.jetstream, subject, &msg_id, Bytes::from(launch.encode_to_vec())).await?;
            }
        }
    }
    store.mark_published(&job.id, job.version).await?;
    Ok(())
}

/// Publishes every change of a job in `states` that is committed but not yet published; each
/// service calls this at start for the states it owns.
pub async fn republish_pending(nats: &Nats, store: &Store, states: &[JobState]) -> Result<usize, Error> {
    let pending = store.unpublished_jobs(states).await?;
    for job in &pending {
        tracing::info!(job_id = %job.id, version = job.version, state = %job.state, "publishing a committed change");
        publish_job_change(nats, store, job).await?;
    }
    Ok(pending.len())
}

/// Stops a job. One that has not started (or was preempted and waits to be queued again) ends
/// STOPPED at once; a running one is asked to stop, and its runner sends SIGTERM, then SIGKILL
/// after the grace period. An ended job is left as it is. Returns the job as it is now.
pub async fn stop_job(nats: &Nats, store: &Store, job: JobRecord, reason: &str) -> Result<JobRecord, Error> {
    let mut job = job;
    // A few rounds: the job may change state between our read and our write.
    for round in 0..5 {
        if round > 0 {
            job = store.job(&job.id).await?;
        }
        let state = job.state()?;
        if state.is_terminal() && state != JobState::Preempted {
            return Ok(job);
        }
        if matches!(state, JobState::Queued | JobState::Scheduled | JobState::Preempted) {
            let change = Change {
                reason: Some(reason.to_string()),
                ..Change::default()
            };
            match store.transition(&job, JobState::Stopped, change).await {
                Ok(stopped) => {
                    if let Err(error) = publish_job_change(nats, store, &stopped).await {
                        tracing::warn!(job_id = %stopped.id, error = %error, "publish failed; the reconciler will retry");
                    }
                    return Ok(stopped);
                }
                Err(StoreError::Conflict { .. }) if round < 4 => continue,
                Err(error) => return Err(error.into()),
            }
        }
        let job = store.request_stop(&job.id).await?;
        send_control(nats, &job, pb::control_request::Action::Stop, "").await?;
        tracing::info!(job_id = %job.id, "stop requested");
        return Ok(job);
    }
    Ok(job)
}

/// Stops every job of `owner_id` (in `project` when given) that runs or may run again, its own
/// and those its sweeps, services and batches made: the owner was disabled, or lost the right
/// to run jobs in the project. `reason` is each job's reason. Returns how many it stopped.
pub async fn stop_owner_jobs(
    nats: &Nats,
    store: &Store,
    owner_id: &str,
    project: Option<&str>,
    reason: &str,
) -> Result<usize, Error> {
    let jobs = store.owner_live_jobs(owner_id, project).await?;
    let count = jobs.len();
    for job in jobs {
        stop_job(nats, store, job, reason).await?;
    }
    Ok(count)
}

/// Asks the runner of an active job to preempt it for `for_job`: it is stopped like a spot
/// preemption (SIGTERM, the grace period, outputs synced) and queued again.
pub async fn preempt_job(nats: &Nats, job: &JobRecord, for_job: &str) -> Result<(), Error> {
    send_control(nats, job, pb::control_request::Action::Preempt, for_job).await
}

/// Publishes a control request for the job's current attempt (one per action and attempt: the
/// message id drops repeats).
async fn send_control(
    nats: &Nats,
    job: &JobRecord,
    action: pb::control_request::Action,
    for_job: &str,
) -> Result<(), Error> {
    let control = pb::ControlRequest {
        job_id: job.id.clone(),
        action: action as i32,
        for_job: for_job.to_string(),
    };
    let msg_id = format!("{}:{}:{}", job.id, action.as_str_name(), job.attempt);
    publish(
        &nats.jetstream,
        subjects::control(&job.id),
        &msg_id,
        Bytes::from(control.encode_to_vec()),
    )
    .await?;
    Ok(())
}
