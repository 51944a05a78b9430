//! `LogService`: reading and following a job's lines. Errors become statuses here only.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use kiln_core::auth::user_principal;
use kiln_core::ids::{now_ms, parse_id};
use kiln_core::store::{Store, StoreError};
use kiln_proto::v1 as pb;
use kiln_proto::v1::log_service_server::LogService;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::error::Error;
use crate::store::{Cursor, LogStore};

impl From<Error> for Status {
    fn from(error: Error) -> Status {
        kiln_core::error::status(error.kind(), &error)
    }
}

/// Lines read from the store per query.
const PAGE: u32 = 1000;
/// A follower re-reads at least this often, in case a wake-up was missed.
const FOLLOW_POLL: Duration = Duration::from_millis(500);
/// How long after a job's end a follower waits for an end marker that may never come (its
/// runner died).
const END_GRACE_MS: i64 = 3_000;

/// LogsApi serves `LogService`.
#[derive(Clone)]
pub struct LogsApi {
    pub(crate) store: Store,
    pub(crate) logs: Arc<dyn LogStore>,
    pub(crate) written: broadcast::Sender<String>,
    pub(crate) nats: kiln_core::streams::Nats,
}

type LineStream = Pin<Box<dyn Stream<Item = Result<pb::LogLine, Status>> + Send>>;

#[tonic::async_trait]
impl LogService for LogsApi {
    type GetLogsStream = LineStream;

    #[tracing::instrument(skip_all, fields(job_id = %request.get_ref().job_id))]
    async fn get_logs(&self, request: Request<pb::GetLogsRequest>) -> Result<Response<Self::GetLogsStream>, Status> {
        let principal = user_principal(&request)?;
        let request = request.into_inner();
        let job_id = parse_id("job", &request.job_id).map_err(Error::InvalidArgument)?;
        let job = match self.store.job(&job_id).await {
            Ok(job) => job,
            Err(StoreError::JobNotFound { job_id }) => {
                return Err(Error::JobNotFound { job_id }.into());
            }
            Err(error) => return Err(Error::from(error).into()),
        };
        if job.owner_id != principal.user_id && !principal.is_admin {
            return Err(Error::JobNotFound { job_id }.into());
        }
        let (tx, rx) = mpsc::channel(256);
        let api = self.clone();
        let woken = self.written.subscribe();
        tokio::spawn(async move {
            if let Err(status) = api.stream_lines(&job_id, request.follow, woken, &tx).await {
                let _ = tx.send(Err(status)).await;
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

impl LogsApi {
    /// Sends the stored lines, then (with `follow`) new ones until the job has ended and its
    /// last line is out.
    async fn stream_lines(
        &self,
        job_id: &str,
        follow: bool,
        mut woken: broadcast::Receiver<String>,
        tx: &mpsc::Sender<Result<pb::LogLine, Status>>,
    ) -> Result<(), Status> {
        let mut cursor = Cursor::default();
        let mut ended_attempt = 0;
        // The job's state changes wake a follower too: its end comes after its last line.
        let mut job_events = match follow {
            true => self
                .nats
                .client
                .subscribe(kiln_core::subjects::job_event(job_id))
                .await
                .ok(),
            false => None,
        };
        loop {
            let lines = self.logs.read(job_id, cursor, PAGE).await?;
            let full_page = lines.len() == PAGE as usize;
            for line in lines {
                cursor = Cursor {
                    attempt: line.attempt,
                    seq: line.seq,
                };
                if line.end {
                    ended_attempt = ended_attempt.max(line.attempt);
                    continue;
                }
                let out = pb::LogLine {
                    attempt: line.attempt,
                    seq: u64::try_from(line.seq).unwrap_or(0),
                    stream: line.stream,
                    timestamp_ms: line.timestamp_ms,
                    text: line.text,
                };
                if tx.send(Ok(out)).await.is_err() {
                    return Ok(());
                }
            }
            if full_page {
                continue;
            }
            if !follow {
                return Ok(());
            }
            let job = self.store.job(job_id).await.map_err(Error::from)?;
            let state = job.state().map_err(Error::from)?;
            if state.is_terminal() && state != kiln_core::JobState::Preempted {
                let never_ran = job.started_at_ms.is_none() || job.instance_id.is_empty();
                let waited = now_ms() - job.finished_at_ms.unwrap_or(0) > END_GRACE_MS;
                if ended_attempt >= job.attempt || never_ran || waited {
                    return Ok(());
                }
            }
            tokio::select! {
                _ = wait_for(&mut woken, job_id) => {}
                Some(_) = next_event(&mut job_events) => {}
                _ = tokio::time::sleep(FOLLOW_POLL) => {}
                _ = tx.closed() => return Ok(()),
            }
        }
    }
}

/// Returns the next job event, or never when there is no subscription.
async fn next_event(events: &mut Option<async_nats::Subscriber>) -> Option<async_nats::Message> {
    use futures::StreamExt;
    match events {
        Some(events) => events.next().await,
        None => std::future::pending().await,
    }
}

/// Returns when lines of `job_id` were written (or wake-ups were lost).
async fn wait_for(woken: &mut broadcast::Receiver<String>, job_id: &str) {
    loop {
        match woken.recv().await {
            Ok(id) if id == job_id => return,
            Ok(_) => {}
            Err(broadcast::error::RecvError::Lagged(_)) => return,
            Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
        }
    }
}
