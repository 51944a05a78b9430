//! `SweepService`: creating, reading, stopping and resuming sweeps, and a trial's
//! `ShouldStop`. Errors become statuses at this edge only.

use std::collections::HashMap;
use std::sync::Arc;

use kiln_core::authz::{Caller, Resource};
use kiln_core::ids::{new_id, now_ms, parse_id};
use kiln_core::runs::config_to_proto;
use kiln_proto::v1 as pb;
use kiln_proto::v1::sweep_service_server::SweepService;
use tonic::{Request, Response, Status};

use crate::Shared;
use crate::error::{Error, Result};
use crate::feed::{Listed, SweepChangesStream};
use crate::record::{self, SweepRecord};
use crate::spec;
use crate::state::{SweepView, TrialView};
use crate::trials;

/// Longest idempotency key.
const MAX_KEY_BYTES: usize = 128;

/// SweepApi serves `SweepService`.
#[derive(Clone)]
pub struct SweepApi {
    pub(crate) shared: Arc<Shared>,
}

#[tonic::async_trait]
impl SweepService for SweepApi {
    async fn create_sweep(&self, request: Request<pb::CreateSweepRequest>) -> Result<Response<pb::Sweep>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        Ok(Response::new(self.create(&caller, request).await?))
    }

    async fn get_sweep(&self, request: Request<pb::GetSweepRequest>) -> Result<Response<pb::Sweep>, Status> {
        let caller = caller(&request)?;
        let record = self.visible(&caller, &request.get_ref().sweep_id).await?;
        let view = self.view(record).await?;
        Ok(Response::new(self.describe(&view, true).await?))
    }

    async fn list_sweeps(
        &self,
        request: Request<pb::ListSweepsRequest>,
    ) -> Result<Response<pb::ListSweepsResponse>, Status> {
        let caller = caller(&request)?;
        let listed = Listed::of(self, &caller, request.get_ref()).await?;
        Ok(Response::new(pb::ListSweepsResponse {
            sweeps: listed.sweeps().await?,
        }))
    }

    type WatchSweepsStream = SweepChangesStream;

    async fn watch_sweeps(
        &self,
        request: Request<pb::WatchSweepsRequest>,
    ) -> Result<Response<SweepChangesStream>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        let listed = Listed::of(self, &caller, &request.list.unwrap_or_default()).await?;
        Ok(Response::new(listed.watch(request.after_seq).await?))
    }

    async fn stop_sweep(&self, request: Request<pb::GetSweepRequest>) -> Result<Response<pb::Sweep>, Status> {
        let caller = caller(&request)?;
        let record = self.visible(&caller, &request.get_ref().sweep_id).await?;
        let moved = self
            .shared
            .sweeps
            .set_state(&record.id, &[record::RUNNING], record::STOPPING, "stopped by request")
            .await?;
        if moved.is_none() && ![record::STOPPING, record::STOPPED].contains(&record.state.as_str()) {
            return Err(Error::FailedPrecondition(format!(
                "sweep {} is {}; only a running sweep stops",
                record.id, record.state
            ))
            .into());
        }
        tracing::info!(sweep_id = %record.id, "sweep stopping");
        let view = self.view(self.shared.sweeps.sweep(&record.id).await?).await?;
        Ok(Response::new(self.describe(&view, true).await?))
    }

    async fn resume_sweep(&self, request: Request<pb::GetSweepRequest>) -> Result<Response<pb::Sweep>, Status> {
        let caller = caller(&request)?;
        let record = self.visible(&caller, &request.get_ref().sweep_id).await?;
        // A paused sweep (or any) runs on only while its owner may still run jobs.
        if let Err(error) = self.shared.store.check_owner(&record.owner_id, &record.project).await {
            return Err(match error.owner_revoked() {
                Some(why) => Error::FailedPrecondition(format!(
                    "sweep {} cannot resume: {why}; re-enable the owner or restore their role first",
                    record.id
                )),
                None => error.into(),
            }
            .into());
        }
        let moved = self.shared.sweeps.resume(&record.id).await?;
        if moved.is_none() && record.state != record::RUNNING {
            return Err(Error::FailedPrecondition(format!(
                "sweep {} is {}; only a stopped sweep resumes",
                record.id, record.state
            ))
            .into());
        }
        tracing::info!(sweep_id = %record.id, "sweep resumed");
        let view = self.view(self.shared.sweeps.sweep(&record.id).await?).await?;
        Ok(Response::new(self.describe(&view, true).await?))
    }

    async fn best_trial(&self, request: Request<pb::GetSweepRequest>) -> Result<Response<pb::Trial>, Status> {
        let caller = caller(&request)?;
        let record = self.visible(&caller, &request.get_ref().sweep_id).await?;
        let view = self.view(record).await?;
        let best = view
            .best()
            .ok_or_else(|| Error::NotFound(format!("sweep {} has no trial with a value yet", view.record.id)))?;
        Ok(Response::new(self.trial(best, None).await?))
    }

    async fn should_stop(
        &self,
        request: Request<pb::ShouldStopRequest>,
    ) -> Result<Response<pb::ShouldStopResponse>, Status> {
        let caller = caller(&request)?;
        let job = caller
            .job(&self.shared.store, &request.get_ref().job_id)
            .await
            .map_err(Error::from)?;
        let env = job.env().map_err(Error::from)?;
        let (Some(sweep_id), Some(index)) = (env.get(trials::ENV_SWEEP_ID), env.get(trials::ENV_TRIAL_INDEX)) else {
            return Err(Error::FailedPrecondition(format!("job {} is not a sweep's trial", job.id)).into());
        };
        let index: i32 = index
            .parse()
            .map_err(|_| Error::Internal(format!("job {}: trial index {index:?}", job.id)))?;
        let stop = self
            .shared
            .sweeps
            .stops(sweep_id)
            .await?
            .into_iter()
            .find(|recorded| recorded.trial == index);
        let response = match stop {
            Some(recorded) => match recorded.event {
                record::Event::Stop { reason, rung, .. } => pb::ShouldStopResponse {
                    stop: true,
                    reason: format!("{reason} (at {rung})"),
                },
                _ => pb::ShouldStopResponse::default(),
            },
            None if job.stop_requested => pb::ShouldStopResponse {
                stop: true,
                reason: "the job was asked to stop".into(),
            },
            None => pb::ShouldStopResponse::default(),
        };
        Ok(Response::new(response))
    }
}

impl SweepApi {
    async fn create(&self, caller: &Caller, request: pb::CreateSweepRequest) -> Result<pb::Sweep> {
        // A project named in the request is checked before the spec is read, so a caller
        // outside it learns nothing from the spec's problems.
        if !request.project.is_empty() {
            self.project(caller, &request.project).await?;
        }
        let checked = spec::parse(&request.spec_yaml).map_err(Error::InvalidSpec)?;
        let project = if request.project.is_empty() {
            self.project(caller, &checked.spec.project).await?
        } else {
            request.project.clone()
        };
        if request.idempotency_key.len() > MAX_KEY_BYTES
            || !request.idempotency_key.chars().all(|c| c.is_ascii_graphic())
        {
            return Err(Error::InvalidArgument(format!(
                "idempotency_key must be at most {MAX_KEY_BYTES} printable ASCII characters"
            )));
        }
        if !request.idempotency_key.is_empty()
            && let Some(existing) = self
                .shared
                .sweeps
                .sweep_by_submit_key(caller.user_id(), &request.idempotency_key)
                .await?
        {
            return self.describe(&self.view(existing).await?, true).await;
        }
        let store = &self.shared.store;
        // The code and datasets must be the project's or of a project the caller reads; what is
        // out of reach reads as missing.
        if !request.code_digest.is_empty()
            && caller
                .usable_blob(store, &request.code_digest, &project)
                .await?
                .is_none()
        {
            return Err(Error::FailedPrecondition(format!(
                "code bundle {} is not uploaded; upload it with ArtifactService first",
                request.code_digest
            )));
        }
        for name in &checked.spec.trial.datasets {
            if caller.readable_dataset(store, &project, name).await?.is_none() {
                return Err(Error::FailedPrecondition(format!(
                    "dataset {name} does not exist (trial.datasets)"
                )));
            }
        }
        if let Some(name) = store.missing_secret(&project, &checked.spec.trial.secrets).await? {
            return Err(Error::FailedPrecondition(format!(
                "project {project} has no secret {name} (trial.secrets); set it with `kiln secret set {name} --project {project}`"
            )));
        }
        let record = SweepRecord {
            id: new_id(),
            owner_id: caller.user_id().to_string(),
            project,
            name: checked.spec.name.clone(),
            spec_yaml: request.spec_yaml,
            spec_json: serde_json::to_string(&checked.spec).map_err(|error| Error::Internal(error.to_string()))?,
            code_digest: request.code_digest,
            state: record::RUNNING.to_string(),
            reason: String::new(),
            submit_key: request.idempotency_key,
            registered: String::new(),
            created_at_ms: now_ms(),
            finished_at_ms: None,
            paused_reason: String::new(),
        };
        self.shared.sweeps.insert_sweep(record.clone()).await?;
        tracing::info!(sweep_id = %record.id, owner = %caller.principal.user_name, "sweep created");
        self.describe(&self.view(record).await?, true).await
    }

    /// The project a sweep is created in (empty: `default`), once the caller may create there.
    async fn project(&self, caller: &Caller, name: &str) -> Result<String> {
        let project = caller.named_project(&self.shared.store, name).await?;
        caller
            .authorize(&Resource::project(&project))
            .map_err(kiln_core::Error::from)?;
        Ok(project)
    }

    /// Reads a sweep and asks the caller's rule about it.
    async fn visible(&self, caller: &Caller, sweep_id: &str) -> Result<SweepRecord> {
        let sweep_id = parse_id("sweep", sweep_id).map_err(Error::InvalidArgument)?;
        let record = self.shared.sweeps.sweep(&sweep_id).await?;
        caller
            .authorize(&Resource::owned("sweep", &record.id, &record.project, &record.owner_id))
            .map_err(kiln_core::Error::from)?;
        Ok(record)
    }

    pub(crate) async fn view(&self, record: SweepRecord) -> Result<SweepView> {
        let events = self.shared.sweeps.events(&record.id).await?;
        let mut view = SweepView::new(record)?;
        view.apply(events);
        Ok(view)
    }

    pub(crate) async fn describe(&self, view: &SweepView, with_trials: bool) -> Result<pb::Sweep> {
        let spec = view.spec();
        let mut jobs = HashMap::new();
        for trial in &view.trials {
            if let Some(job_id) = &trial.job_id {
                jobs.insert(job_id.clone(), self.shared.store.job(job_id).await?);
            }
        }
        let mut counts = pb::TrialCounts {
            suggested: view.trials.len() as u32,
            ..Default::default()
        };
        let mut described = Vec::new();
        let mut running_gpu_hours = 0.0;
        for trial in &view.trials {
            let job = trial.job_id.as_ref().and_then(|id| jobs.get(id));
            let described_trial = describe_trial(trial, job);
            match described_trial.state.as_str() {
                "succeeded" => counts.succeeded += 1,
                "stopped" => counts.stopped += 1,
                "failed" | "lost" => counts.failed += 1,
                _ => counts.running += 1,
            }
            if trial.is_live()
                && let Some(job) = job
            {
                running_gpu_hours += trials::gpu_hours(job, now_ms());
            }
            if with_trials {
                described.push(described_trial);
            }
        }
        let best = match view.best() {
            Some(trial) => Some(self.trial(trial, None).await?),
            None => None,
        };
        Ok(pb::Sweep {
            id: view.record.id.clone(),
            name: view.record.name.clone(),
            project: view.record.project.clone(),
            owner: view.record.owner_id.clone(),
            state: view.record.state.clone(),
            reason: view.record.reason.clone(),
            spec_yaml: view.record.spec_yaml.clone(),
            objective_metric: spec.objective.metric.clone(),
            goal: match spec.objective.goal {
                spec::Goal::Minimize => "minimize".into(),
                spec::Goal::Maximize => "maximize".into(),
            },
            algorithm: serde_json::to_value(&spec.algorithm)
                .ok()
                .and_then(|value| value.get("name").and_then(|name| name.as_str()).map(str::to_string))
                .unwrap_or_default(),
            early_stop: serde_json::to_value(&spec.early_stop)
                .ok()
                .and_then(|value| value.get("name").and_then(|name| name.as_str()).map(str::to_string))
                .unwrap_or_else(|| "none".into()),
            max_trials: spec.budget.max_trials,
            max_parallel: spec.budget.max_parallel,
            trials: described,
            counts: Some(counts),
            gpu_hours: view.gpu_hours() + running_gpu_hours,
            created_at_ms: view.record.created_at_ms,
            finished_at_ms: view.record.finished_at_ms.unwrap_or(0),
            best,
            registered: view.record.registered.clone(),
            paused_reason: view.record.paused_reason.clone(),
        })
    }

    async fn trial(&self, trial: &TrialView, job: Option<&kiln_core::store::JobRecord>) -> Result<pb::Trial> {
        let fetched = match (job, &trial.job_id) {
            (None, Some(job_id)) => Some(self.shared.store.job(job_id).await?),
            _ => None,
        };
        Ok(describe_trial(trial, job.or(fetched.as_ref())))
    }
}

fn describe_trial(trial: &TrialView, job: Option<&kiln_core::store::JobRecord>) -> pb::Trial {
    let job_state = job
        .and_then(|job| job.state().ok())
        .map(|state| state.as_str().to_ascii_lowercase());
    let reason = match (&trial.stop, job) {
        (Some((rung, reason, _)), _) => format!("stopped early at {rung}: {reason}"),
        (None, Some(job)) => job.reason.clone(),
        (None, None) => String::new(),
    };
    pb::Trial {
        index: trial.index,
        job_id: trial.job_id.clone().unwrap_or_default(),
        state: trial.state_name(job_state.as_deref()),
        config: config_to_proto(&trial.config),
        value: trial.last_value(),
        resource: trial.resource(),
        reason,
        preemptions: job.map_or(0, |job| job.preemptions),
    }
}

/// The caller the auth layer established for this request.
fn caller<T>(request: &Request<T>) -> Result<Caller> {
    Ok(Caller::of(request).map_err(kiln_core::Error::from)?)
}
