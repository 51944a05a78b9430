//! `JobService`: submit, read, list, stop and watch jobs.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use kiln_core::authz::Caller;
use kiln_core::events::{publish_job_change, stop_job};
use kiln_core::store::{Change, JobRecord, NewJob, Store};
use kiln_core::streams::{Nats, request};
use kiln_core::{JobState, subjects};
use kiln_proto::v1 as pb;
use kiln_proto::v1::explain_reply::Outcome;
use kiln_proto::v1::job_service_server::JobService;
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::access;
use crate::error::{Error, Result};

mod feed;
mod validate;

pub(crate) use validate::validate_dataset_name;
use validate::{validate_spec, validate_submit_key};

/// JobsApi serves `JobService`.
#[derive(Clone)]
pub struct JobsApi {
    pub(crate) store: Store,
    pub(crate) nats: Nats,
    pub(crate) watch_poll: Duration,
    /// How long an explanation waits for the scheduler leader.
    pub(crate) explain_timeout: Duration,
    pub(crate) metrics: crate::service_metrics::ApiMetrics,
}

impl JobsApi {
    async fn visible_job(&self, caller: &Caller, job_id: &str) -> Result<JobRecord> {
        access::job(&self.store, caller, job_id).await
    }

    async fn submit(&self, caller: &Caller, request: pb::SubmitJobRequest) -> Result<JobRecord> {
        let principal = &caller.principal;
        let mut new = validate_spec(principal, request.spec)?;
        new.project = access::project(&self.store, caller, &new.project).await?;
        new.submit_key = validate_submit_key(request.idempotency_key)?;
        new.datasets = self.named_datasets(caller, &new.project, &new.datasets).await?;
        if let Some(existing) = self.submitted_before(&new).await? {
            return Ok(existing);
        }
        // The code must be the project's, or of a project the caller reads (then it is this
        // one's too); a blob out of reach reads as one never uploaded.
        if !new.code_digest.is_empty()
            && caller
                .usable_blob(&self.store, &new.code_digest, &new.project)
                .await?
                .is_none()
        {
            return Err(Error::ArtifactMissing {
                digest: new.code_digest,
            });
        }
        if let Some(name) = self.store.missing_secret(&new.project, &new.secrets).await? {
            return Err(Error::SecretMissing {
                project: new.project,
                name,
            });
        }
        let job = match crate::quotas::submit_within_quota(&self.store, principal, new.clone()).await {
            // A concurrent submit with the same key won the insert: answer with its job.
            Err(Error::Store(error)) if error.is_unique_violation() && !new.submit_key.is_empty() => {
                return self.submitted_before(&new).await?.ok_or(Error::Store(error));
            }
            submitted => submitted?,
        };
        tracing::info!(job_id = %job.id, owner = %principal.user_name, "job submitted");
        self.metrics
            .jobs_submitted
            .get_or_create(&crate::service_metrics::ProjectLabels {
                project: job.project.clone(),
            })
            .inc();
        // The job is durable now; a failed publish is re-driven by the reconciler.
        if let Err(error) = publish_job_change(&self.nats, &self.store, &job).await {
            tracing::warn!(job_id = %job.id, error = %error, "publish failed; the reconciler will retry");
        }
        Ok(job)
    }

    /// The datasets a spec of `project` names, each checked against the caller's role in its own
    /// project and written as `project` writes it (see [`kiln_core::store::DatasetRef`]); one the
    /// caller may not read is refused in the words of a dataset that does not exist.
    async fn named_datasets(&self, caller: &Caller, project: &str, references: &[String]) -> Result<Vec<String>> {
        let mut named: Vec<String> = Vec::with_capacity(references.len());
        let mut mounts = std::collections::BTreeSet::new();
        for reference in references {
            let Some(dataset) = caller.readable_dataset(&self.store, project, reference).await? else {
                return Err(Error::DatasetMissing {
                    name: reference.clone(),
                });
            };
            // Each is mounted at /kiln/data/<name>: two of one name cannot both be.
            if !mounts.insert(dataset.name.clone()) {
                return Err(Error::InvalidArgument(format!(
                    "two datasets named {} would both mount at /kiln/data/{}",
                    dataset.name, dataset.name
                )));
            }
            let written = kiln_core::store::DatasetRef {
                project: dataset.project,
                name: dataset.name,
            }
            .relative_to(project);
            named.push(written);
        }
        Ok(named)
    }

    /// The job an earlier submit with the same idempotency key made, when it was for the same
    /// spec (the canonical hash of all of it); a key reused for another spec is refused.
    async fn submitted_before(&self, new: &NewJob) -> Result<Option<JobRecord>> {
        if new.submit_key.is_empty() {
            return Ok(None);
        }
        let Some(existing) = self.store.job_by_submit_key(&new.owner_id, &new.submit_key).await? else {
            return Ok(None);
        };
        let same = if existing.submit_hash.is_empty() {
            // Submitted before specs were hashed: the fields compared then.
            existing.name == new.name
                && existing.project == new.project
                && existing.command()? == new.command
                && existing.cpu_millis == new.cpu_millis
                && existing.memory_bytes == new.memory_bytes
                && existing.code_digest == new.code_digest
                && existing.image == new.image
                && existing.requested_pool == new.requested_pool
        } else {
            existing.submit_hash == new.spec_hash()?
        };
        if !same {
            return Err(Error::SubmitKeyReused {
                key: new.submit_key.clone(),
                job_id: existing.id,
            });
        }
        tracing::info!(job_id = %existing.id, "submit retried with its idempotency key; same job");
        Ok(Some(existing))
    }

    /// Why a job waits: what the scheduler's next pass decides about it (the leader answers for
    /// a queued job), or what it is doing when it does not wait.
    async fn explain(&self, caller: &Caller, job_id: &str) -> Result<pb::Explanation> {
        let job = self.visible_job(caller, job_id).await?;
        let state = job.state()?;
        let mut explanation = pb::Explanation {
            job_id: job.id.clone(),
            state: state.to_proto() as i32,
            ..Default::default()
        };
        if state != JobState::Queued {
            explanation.summary = match state {
                JobState::Scheduled | JobState::Provisioning | JobState::Running | JobState::Syncing => format!(
                    "it is {} on pool {} ({}), attempt {}",
                    state.as_str().to_lowercase(),
                    job.pool,
                    if job.market.is_empty() {
                        "on-demand"
                    } else {
                        job.market.as_str()
                    },
                    job.attempt
                ),
                _ => format!(
                    "it has ended: {}",
                    if job.reason.is_empty() {
                        state.as_str()
                    } else {
                        job.reason.as_str()
                    }
                ),
            };
            return Ok(explanation);
        }
        self.explain_queued(&job.id).await
    }

    /// Asks the scheduler leader about a queued job: it explains from its own configuration and
    /// learnt preemption rates, what its next pass acts on.
    async fn explain_queued(&self, job_id: &str) -> Result<pb::Explanation> {
        let asked = pb::ExplainRequest {
            job_id: job_id.to_string(),
        };
        let answer = request(
            &self.nats,
            subjects::SCHEDULER_EXPLAIN,
            asked.encode_to_vec().into(),
            self.explain_timeout,
        )
        .await?
        .ok_or(Error::SchedulerUnavailable {
            waited: self.explain_timeout,
        })?;
        let reply = pb::ExplainReply::decode(answer.as_ref())
            .map_err(|error| Error::SchedulerFailed(format!("unreadable answer: {error}")))?;
        match reply.outcome {
            Some(Outcome::Explanation(explanation)) => Ok(explanation),
            Some(Outcome::Error(message)) => Err(Error::SchedulerFailed(message)),
            None => Err(Error::SchedulerFailed("an empty answer".into())),
        }
    }

    async fn stop(&self, caller: &Caller, job_id: &str) -> Result<JobRecord> {
        let job = self.visible_job(caller, job_id).await?;
        let reason = if job.owner_id == caller.user_id() {
            "stopped by user".to_string()
        } else {
            format!("stopped by {}", caller.principal.user_name)
        };
        Ok(stop_job(&self.nats, &self.store, job, &reason).await?)
    }
}

type JobStream = Pin<Box<dyn Stream<Item = Result<pb::Job, Status>> + Send>>;

#[tonic::async_trait]
impl JobService for JobsApi {
    #[tracing::instrument(skip_all)]
    async fn submit_job(
        &self,
        request: Request<pb::SubmitJobRequest>,
    ) -> Result<Response<pb::SubmitJobResponse>, Status> {
        let caller = access::caller(&request)?;
        let job = self.submit(&caller, request.into_inner()).await?;
        Ok(Response::new(pb::SubmitJobResponse {
            job: Some(job.to_proto()),
        }))
    }

    #[tracing::instrument(skip_all, fields(job_id = %request.get_ref().job_id))]
    async fn get_job(&self, request: Request<pb::GetJobRequest>) -> Result<Response<pb::Job>, Status> {
        let caller = access::caller(&request)?;
        let job = self.visible_job(&caller, &request.get_ref().job_id).await?;
        let mut shown = job.to_proto();
        if job.nodes > 1 {
            let nodes = self.store.gang_nodes(&job.id, job.attempt).await.map_err(Error::from)?;
            shown.nodes = nodes.iter().map(kiln_core::store::NodeRecord::to_proto).collect();
        }
        Ok(Response::new(shown))
    }

    #[tracing::instrument(skip_all)]
    async fn list_jobs(&self, request: Request<pb::ListJobsRequest>) -> Result<Response<pb::ListJobsResponse>, Status> {
        let caller = access::caller(&request)?;
        let filter = feed::job_filter(self, &caller, request.get_ref()).await?;
        let jobs = self.store.list_jobs_where(&filter).await.map_err(Error::from)?;
        Ok(Response::new(pb::ListJobsResponse {
            jobs: jobs.iter().map(JobRecord::to_proto).collect(),
        }))
    }

    #[tracing::instrument(skip_all, fields(job_id = %request.get_ref().job_id))]
    async fn stop_job(&self, request: Request<pb::StopJobRequest>) -> Result<Response<pb::Job>, Status> {
        let caller = access::caller(&request)?;
        let job = self.stop(&caller, &request.get_ref().job_id).await?;
        Ok(Response::new(job.to_proto()))
    }

    #[tracing::instrument(skip_all, fields(job_id = %request.get_ref().job_id))]
    async fn explain_job(&self, request: Request<pb::GetJobRequest>) -> Result<Response<pb::Explanation>, Status> {
        let caller = access::caller(&request)?;
        let explanation = self.explain(&caller, &request.get_ref().job_id).await?;
        Ok(Response::new(explanation))
    }

    #[tracing::instrument(skip_all)]
    async fn create_run(&self, request: Request<pb::CreateRunRequest>) -> Result<Response<pb::Job>, Status> {
        let caller = access::caller(&request)?;
        let request = request.into_inner();
        let project = access::project(&self.store, &caller, &request.project).await?;
        if request.name.chars().count() > 128 {
            return Err(Error::InvalidArgument("name is longer than 128 characters".into()).into());
        }
        let name = if request.name.is_empty() {
            "run".to_string()
        } else {
            request.name
        };
        let run = self
            .store
            .insert_external_run(caller.user_id(), &project, &name)
            .await
            .map_err(Error::from)?;
        if let Err(error) = publish_job_change(&self.nats, &self.store, &run).await {
            tracing::warn!(job_id = %run.id, error = %error, "publish failed");
        }
        Ok(Response::new(run.to_proto()))
    }

    #[tracing::instrument(skip_all, fields(job_id = %request.get_ref().job_id))]
    async fn finish_run(&self, request: Request<pb::FinishRunRequest>) -> Result<Response<pb::Job>, Status> {
        let caller = access::caller(&request)?;
        let request = request.into_inner();
        let run = self.visible_job(&caller, &request.job_id).await?;
        if run.pool != kiln_core::store::EXTERNAL_POOL {
            return Err(Error::InvalidArgument(format!("job {} runs in kiln; it ends by itself", run.id)).into());
        }
        if run.state().map_err(Error::from)?.is_terminal() {
            return Ok(Response::new(run.to_proto()));
        }
        let (state, reason) = match request.exit_code {
            0 => (JobState::Succeeded, String::new()),
            code => (JobState::Failed, format!("exited with code {code}")),
        };
        let change = Change {
            exit_code: Some(request.exit_code),
            reason: Some(reason),
            ..Change::default()
        };
        let ended = self.store.transition(&run, state, change).await.map_err(Error::from)?;
        if let Err(error) = publish_job_change(&self.nats, &self.store, &ended).await {
            tracing::warn!(job_id = %ended.id, error = %error, "publish failed");
        }
        Ok(Response::new(ended.to_proto()))
    }

    #[tracing::instrument(skip_all, fields(job_id = %request.get_ref().job_id))]
    async fn update_run(&self, request: Request<pb::UpdateRunRequest>) -> Result<Response<pb::Job>, Status> {
        let caller = access::caller(&request)?;
        let run = self.update_run(&caller, request.into_inner()).await?;
        Ok(Response::new(run.to_proto()))
    }

    type WatchJobStream = JobStream;

    #[tracing::instrument(skip_all, fields(job_id = %request.get_ref().job_id))]
    async fn watch_job(&self, request: Request<pb::WatchJobRequest>) -> Result<Response<Self::WatchJobStream>, Status> {
        let caller = access::caller(&request)?;
        let job = self.visible_job(&caller, &request.get_ref().job_id).await?;
        let mut events = self
            .nats
            .client
            .subscribe(subjects::job_event(&job.id))
            .await
            .map_err(|e| Error::Nats(kiln_core::streams::NatsError::Other(e.to_string())))?;
        let (tx, rx) = mpsc::channel(16);
        let api = Arc::new(self.clone());
        tokio::spawn(async move {
            let mut last_version = 0;
            loop {
                let job = match api.store.job(&job.id).await {
                    Ok(job) => job,
                    Err(error) => {
                        let _ = tx.send(Err(Status::from(Error::from(error)))).await;
                        return;
                    }
                };
                if job.version != last_version {
                    last_version = job.version;
                    let terminal = job.state().map(JobState::is_terminal).unwrap_or(true);
                    if tx.send(Ok(job.to_proto())).await.is_err() || terminal {
                        return;
                    }
                }
                // Events wake us at once; the poll covers events missed while subscribing.
                tokio::select! {
                    _ = events.next() => {}
                    _ = tokio::time::sleep(api.watch_poll) => {}
                    _ = tx.closed() => return,
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    type WatchJobsStream = feed::JobChangesStream;

    #[tracing::instrument(skip_all)]
    async fn watch_jobs(
        &self,
        request: Request<pb::WatchJobsRequest>,
    ) -> Result<Response<Self::WatchJobsStream>, Status> {
        let caller = access::caller(&request)?;
        let changes = self.watch_jobs(&caller, request.into_inner()).await?;
        Ok(Response::new(changes))
    }
}
