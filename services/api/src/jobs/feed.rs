//! `WatchJobs`: a list of jobs kept current from the job events on KILN_JOBS (see job.proto and
//! kiln_core::feed).

use kiln_core::authz::Caller;
use kiln_core::feed::{self, Feed, Source};
use kiln_core::store::{JobFilter, JobRecord};
use kiln_proto::v1 as pb;
use tonic::Status;

use super::JobsApi;
use crate::error::{Error, Result};

pub(super) type JobChangesStream = feed::Changed<pb::JobChanges>;

/// The jobs of `list` the caller may see (what ListJobs answers).
pub(super) async fn job_filter(api: &JobsApi, caller: &Caller, list: &pb::ListJobsRequest) -> Result<JobFilter> {
    let limit = match list.limit {
        0 => 100,
        n => u64::from(n.min(10_000)),
    };
    let projects = caller
        .listed_projects(&api.store, &list.project)
        .await
        .map_err(Error::from)?;
    Ok(JobFilter {
        owner_id: (!list.everyone && !caller.is_admin()).then(|| caller.user_id().to_string()),
        projects,
        all: list.all,
        sweep_id: (!list.sweep_id.is_empty()).then(|| list.sweep_id.clone()),
        limit,
    })
}

/// The jobs of one watcher's list.
struct Watched {
    api: JobsApi,
    filter: JobFilter,
}

#[tonic::async_trait]
impl Source for Watched {
    type Item = pb::Job;

    async fn list(&self) -> std::result::Result<Vec<pb::Job>, Status> {
        let listed = self
            .api
            .store
            .list_jobs_where(&self.filter)
            .await
            .map_err(Error::from)?;
        Ok(listed.iter().map(JobRecord::to_proto).collect())
    }

    async fn changed(&self, ids: Vec<String>) -> std::result::Result<Vec<pb::Job>, Status> {
        let changed = self
            .api
            .store
            .changed_jobs_where(&ids, &self.filter)
            .await
            .map_err(Error::from)?;
        Ok(changed.iter().map(JobRecord::to_proto).collect())
    }

    fn key(job: &pb::Job) -> String {
        job.id.clone()
    }
}

impl JobsApi {
    pub(super) async fn watch_jobs(
        &self,
        caller: &Caller,
        request: pb::WatchJobsRequest,
    ) -> std::result::Result<JobChangesStream, Status> {
        let filter = job_filter(self, caller, &request.list.unwrap_or_default()).await?;
        let watched = Watched {
            api: self.clone(),
            filter,
        };
        let pages = feed::watch(&self.nats.jetstream, Feed::JOBS, request.after_seq, watched).await?;
        Ok(feed::answers(pages))
    }
}
