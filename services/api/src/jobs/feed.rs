//! `WatchJobs`: a list of jobs kept current from the job events on KILN_JOBS, so a page that
//! shows a list receives what changed instead of asking for the whole list again (see
//! job.proto). The events' stream sequence is the list's version: a client that comes back
//! with the last one it got is sent only the changes after it.

use std::collections::HashSet;
use std::pin::Pin;
use std::time::Duration;

use async_nats::jetstream::consumer::DeliverPolicy;
use async_nats::jetstream::consumer::pull::OrderedConfig;
use futures::{Stream, StreamExt};
use kiln_core::authz::Caller;
use kiln_core::store::{JobFilter, JobRecord};
use kiln_core::streams::NatsError;
use kiln_core::subjects::STREAM_JOBS;
use kiln_proto::v1 as pb;
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use super::JobsApi;
use crate::error::{Error, Result};

pub(super) type JobChangesStream = Pin<Box<dyn Stream<Item = std::result::Result<pb::JobChanges, Status>> + Send>>;

/// Jobs per answer of the first list (a 10,000-job list is 20 answers, none near gRPC's 4 MiB).
const PAGE: usize = 500;
/// Events read before the jobs they name are read and sent, when that many are waiting.
const EVENTS_PER_ANSWER: usize = 1000;
/// How long one watch lasts: the client comes back with its `seq`, and its access is checked
/// again (a member removed from a project stops seeing its jobs change within this).
const LIFETIME: Duration = Duration::from_secs(300);

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

fn nats_error(what: &str, error: impl std::fmt::Display) -> Error {
    Error::Nats(NatsError::Other(format!("{what}: {error}")))
}

impl JobsApi {
    pub(super) async fn watch_jobs(&self, caller: &Caller, request: pb::WatchJobsRequest) -> Result<JobChangesStream> {
        let filter = job_filter(self, caller, &request.list.unwrap_or_default()).await?;
        let mut stream = self
            .nats
            .jetstream
            .get_stream(STREAM_JOBS)
            .await
            .map_err(|e| nats_error("cannot find KILN_JOBS", e))?;
        let state = stream
            .info()
            .await
            .map_err(|e| nats_error("cannot read KILN_JOBS", e))?
            .state
            .clone();
        // Changes after `after_seq` can be replayed while the stream still holds the next one;
        // otherwise (too old, or a sequence this stream never had) the list starts over.
        let after = request.after_seq;
        let resumed =
            after > 0 && after < u64::MAX && after + 1 >= state.first_sequence && after <= state.last_sequence;
        let from = if resumed { after } else { state.last_sequence };
        let events = stream
            .create_consumer(OrderedConfig {
                deliver_policy: DeliverPolicy::ByStartSequence {
                    start_sequence: from + 1,
                },
                ..Default::default()
            })
            .await
            .map_err(|e| nats_error("cannot read KILN_JOBS", e))?
            .messages()
            .await
            .map_err(|e| nats_error("cannot read KILN_JOBS", e))?;
        let (tx, rx) = mpsc::channel(4);
        let api = self.clone();
        tokio::spawn(async move {
            let watched = async {
                if !resumed {
                    let listed = api.store.list_jobs_where(&filter).await.map_err(Error::from)?;
                    for answer in first_list(listed.iter().map(JobRecord::to_proto).collect(), from) {
                        if tx.send(Ok(answer)).await.is_err() {
                            return Ok(());
                        }
                    }
                }
                let mut events = events.ready_chunks(EVENTS_PER_ANSWER);
                while let Some(read) = events.next().await {
                    let mut seq = 0;
                    let mut ids = Vec::new();
                    let mut seen = HashSet::new();
                    for message in read {
                        let message = message.map_err(|e| nats_error("reading KILN_JOBS failed", e))?;
                        seq = seq.max(message.info().map(|info| info.stream_sequence).unwrap_or(0));
                        match pb::JobEvent::decode(message.payload.clone()) {
                            Ok(event) if seen.insert(event.job_id.clone()) => ids.push(event.job_id),
                            Ok(_) => {}
                            Err(error) => tracing::warn!(error = %error, "an undecodable job event"),
                        }
                    }
                    // Another tenant's changes are not told, not even as a bare sequence.
                    let jobs = api.store.changed_jobs_where(&ids, &filter).await.map_err(Error::from)?;
                    if jobs.is_empty() {
                        continue;
                    }
                    let answer = pb::JobChanges {
                        jobs: jobs.iter().map(JobRecord::to_proto).collect(),
                        seq,
                        reset: false,
                    };
                    if tx.send(Ok(answer)).await.is_err() {
                        return Ok(());
                    }
                }
                Ok::<_, Error>(())
            };
            tokio::select! {
                ended = watched => {
                    if let Err(error) = ended {
                        let _ = tx.send(Err(Status::from(error))).await;
                    }
                }
                _ = tokio::time::sleep(LIFETIME) => {}
                _ = tx.closed() => {}
            }
        });
        Ok(Box::pin(ReceiverStream::new(rx)))
    }
}

/// The answers of a first list current to `seq`: pages of [`PAGE`] jobs, the first a reset,
/// the last (only) carrying `seq`; one empty reset for an empty list.
fn first_list(jobs: Vec<pb::Job>, seq: u64) -> Vec<pb::JobChanges> {
    let mut pages: Vec<Vec<pb::Job>> = Vec::new();
    let mut jobs = jobs.into_iter().peekable();
    while jobs.peek().is_some() || pages.is_empty() {
        pages.push(jobs.by_ref().take(PAGE).collect());
    }
    let last = pages.len() - 1;
    pages
        .into_iter()
        .enumerate()
        .map(|(n, jobs)| pb::JobChanges {
            jobs,
            seq: if n == last { seq } else { 0 },
            reset: n == 0,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_first_list_goes_in_pages_of_which_only_the_last_carries_its_seq() {
        let jobs = |n: usize| {
            (0..n)
                .map(|i| pb::Job {
                    id: format!("j{i}"),
                    ..Default::default()
                })
                .collect()
        };
        let pages = first_list(jobs(1001), 42);
        let shape: Vec<(usize, u64, bool)> = pages.iter().map(|p| (p.jobs.len(), p.seq, p.reset)).collect();
        assert_eq!(shape, [(500, 0, true), (500, 0, false), (1, 42, false)]);
        assert_eq!(pages[2].jobs[0].id, "j1000");
        let shape: Vec<(usize, u64, bool)> = first_list(jobs(0), 7)
            .iter()
            .map(|p| (p.jobs.len(), p.seq, p.reset))
            .collect();
        assert_eq!(shape, [(0, 7, true)], "an empty list is one answer");
        assert_eq!(first_list(jobs(500), 7).len(), 1);
    }
}
