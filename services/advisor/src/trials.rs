//! Trials as jobs: submitting a trial (with an idempotency key naming the sweep and the trial,
//! so a leader that crashed after the insert finds the same job, and adopts it), and what a
//! trial's job record says about its end.

use std::collections::BTreeMap;

use kiln_core::JobState;
use kiln_core::events::publish_job_change;
use kiln_core::runs::RunConfig;
use kiln_core::scheduling::MarketPolicy;
use kiln_core::store::{JobRecord, NewJob};
use kiln_proto::v1 as pb;

use crate::Shared;
use crate::error::Result;
use crate::record::{Event, SweepRecord};
use crate::spec::{self, Checked};
use crate::state::{SweepView, TrialView};

/// Environment variables a trial gets besides the spec's `env`.
pub const ENV_SWEEP_ID: &str = "KILN_SWEEP_ID";
pub const ENV_TRIAL_INDEX: &str = "KILN_TRIAL_INDEX";
/// The knobs as a JSON object (`kiln.init()` returns them as `kiln.config`).
pub const ENV_TRIAL_CONFIG: &str = "KILN_TRIAL_CONFIG";
/// Where the trial asks `ShouldStop`.
pub const ENV_ADVISOR_ADDR: &str = "KILN_ADVISOR_ADDR";

/// The idempotency key of a trial's job.
pub fn submit_key(sweep_id: &str, index: u32) -> String {
    format!("sweep:{sweep_id}:{index}")
}

/// Submits the job of trial `index` with `config`, or finds the one an earlier submit made
/// (whose knobs may differ: the caller records the job's).
pub async fn submit(
    shared: &Shared,
    sweep: &SweepRecord,
    checked: &Checked,
    index: u32,
    config: &RunConfig,
) -> Result<JobRecord> {
    let key = submit_key(&sweep.id, index);
    if let Some(job) = shared.store.job_by_submit_key(&sweep.owner_id, &key).await? {
        return Ok(job);
    }
    let new = new_job(shared, sweep, checked, index, config, key.clone());
    // Only while the owner may still run jobs here (else `OwnerRevoked`: the sweep pauses).
    let job = match shared.store.insert_controller_job(new).await {
        Err(error) if error.is_unique_violation() => shared
            .store
            .job_by_submit_key(&sweep.owner_id, &key)
            .await?
            .ok_or(error)?,
        inserted => inserted?,
    };
    tracing::info!(sweep_id = %sweep.id, trial = index, job_id = %job.id, "trial submitted");
    if let Err(error) = publish_job_change(&shared.nats, &shared.store, &job).await {
        tracing::warn!(job_id = %job.id, error = %error, "publish failed; the reconciler will retry");
    }
    Ok(job)
}

/// The `suggest` event of trial `index` as its job holds it.
pub fn suggestion(index: u32, job: &JobRecord) -> Result<(i32, Event)> {
    Ok((
        index as i32,
        Event::Suggest {
            config: job.config()?,
            job_id: job.id.clone(),
        },
    ))
}

/// The job of the trial after the last recorded one, when a leader submitted it and died
/// before recording it (a leader records each trial before it submits the next, so there is
/// at most one): the new leader adopts it rather than leave it running outside the sweep.
pub async fn unrecorded(shared: &Shared, view: &SweepView) -> Result<Option<JobRecord>> {
    let key = submit_key(&view.record.id, view.trials.len() as u32);
    Ok(shared.store.job_by_submit_key(&view.record.owner_id, &key).await?)
}

fn new_job(
    shared: &Shared,
    sweep: &SweepRecord,
    checked: &Checked,
    index: u32,
    config: &RunConfig,
    key: String,
) -> NewJob {
    let spec = &checked.spec.trial;
    let mut env: BTreeMap<String, String> = spec.env.clone();
    env.insert(ENV_SWEEP_ID.into(), sweep.id.clone());
    env.insert(ENV_TRIAL_INDEX.into(), index.to_string());
    env.insert(
        ENV_TRIAL_CONFIG.into(),
        serde_json::to_string(config).unwrap_or_else(|_| "{}".into()),
    );
    env.insert(ENV_ADVISOR_ADDR.into(), shared.advertise_url.clone());
    let market = match spec.market.as_str() {
        "spot" => pb::Market::Spot,
        "on-demand" => pb::Market::OnDemand,
        _ => pb::Market::Unspecified,
    };
    NewJob {
        owner_id: sweep.owner_id.clone(),
        project: sweep.project.clone(),
        name: format!("{}-{}", sweep.name, index),
        command: spec::trial_argv(&checked.argv, config),
        env,
        cpu_millis: i64::from(checked.cpu_millis),
        memory_bytes: i64::try_from(checked.memory_bytes).unwrap_or(i64::MAX),
        disk_bytes: i64::try_from(checked.disk_bytes).unwrap_or(i64::MAX),
        shm_bytes: i64::try_from(checked.shm_bytes).unwrap_or(i64::MAX),
        nodes: i32::try_from(spec.nodes).unwrap_or(1),
        code_digest: sweep.code_digest.clone(),
        image: spec.image.clone(),
        gpus: i32::try_from(spec.gpus).unwrap_or(i32::MAX),
        max_runtime_secs: i64::try_from(spec.max_runtime_secs).unwrap_or(i64::MAX),
        datasets: spec.datasets.clone(),
        market_policy: MarketPolicy::from_proto(market),
        submit_key: key,
        requested_pool: spec.pool.clone(),
        secrets: spec.secrets.clone(),
        // The knobs are the trial's config (`kiln status`, `kiln runs ls --sweep`).
        config: config.clone(),
        sweep_id: sweep.id.clone(),
        ..NewJob::default()
    }
}

/// The `end` event of a trial whose job is over, or `None` while it is not (a preempted job is
/// queued again: the trial goes on, and counts once).
pub fn end_of(trial: &TrialView, job: &JobRecord) -> Option<Event> {
    let state = job.state().ok()?;
    if !state.is_terminal() || state == JobState::Preempted {
        return None;
    }
    let name = match state {
        JobState::Succeeded => "succeeded",
        JobState::Stopped => "stopped",
        JobState::Lost => "lost",
        _ => "failed",
    };
    Some(Event::End {
        state: name.to_string(),
        value: trial.last_value(),
        preemptions: job.preemptions,
        gpu_hours: gpu_hours(job, kiln_core::ids::now_ms()),
    })
}

/// GPU-hours a job has held: the GPU time its runners recorded for its ended attempts
/// (preempted ones included), plus, while an attempt runs, its GPUs times its time so far.
pub fn gpu_hours(job: &JobRecord, now_ms: i64) -> f64 {
    let running = match job.started_at_ms {
        Some(started) if job.state == JobState::Running.as_str() => {
            f64::from(job.gpus.max(0)) * (now_ms - started).max(0) as f64
        }
        _ => 0.0,
    };
    (job.gpu_ms as f64 + running) / 3_600_000.0
}
