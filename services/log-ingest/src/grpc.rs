//! `LogService`: reading and following a job's lines. Errors become statuses here only.

use std::collections::{HashMap, HashSet};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::Stream;
use kiln_core::auth::{Principal, Scope, principal, user_principal};
use kiln_core::ids::{now_ms, parse_id};
use kiln_core::store::{Store, StoreError};
use kiln_core::streams::MAX_LOG_LINE_BYTES;
use kiln_proto::v1 as pb;
use kiln_proto::v1::log_service_server::LogService;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::error::Error;
use crate::points::{MetricStore, append_columns, check_columns, split_columns};
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
    pub(crate) points: Arc<dyn MetricStore>,
    /// The metric keys of recently written jobs (see `admit_keys`).
    pub(crate) known_keys: Arc<Mutex<HashMap<String, HashSet<String>>>>,
}

/// Largest WriteMetrics request, in bytes.
pub const MAX_REQUEST_BYTES: usize = 4 << 20;
/// Longest metric key, in bytes.
pub const MAX_KEY_BYTES: usize = 250;
/// Most distinct keys one job may write.
pub const MAX_KEYS_PER_JOB: usize = 10_000;
/// Points per message published: about 25 bytes each in columns, well under NATS' default
/// payload limit of 1 MiB.
const POINTS_PER_MESSAGE: usize = 16_384;
/// Jobs whose metric keys are kept in memory, at most (then the cache starts over).
const KEY_CACHE_JOBS: usize = 1024;
/// Most lines of one WriteLogs request.
const MAX_LINES_PER_REQUEST: usize = 10_000;
/// Default and largest `lines` of TailLogs.
const DEFAULT_TAIL_LINES: u32 = 10;
const LARGEST_TAIL_LINES: u32 = 100_000;
/// Default and largest `max_points` of a query.
const DEFAULT_MAX_POINTS: usize = 1000;
const LARGEST_MAX_POINTS: usize = 100_000;

type LineStream = Pin<Box<dyn Stream<Item = Result<pb::LogLine, Status>> + Send>>;

#[tonic::async_trait]
impl LogService for LogsApi {
    type GetLogsStream = LineStream;
    type TailLogsStream = LineStream;

    #[tracing::instrument(skip_all, fields(job_id = %request.get_ref().job_id))]
    async fn search_logs(
        &self,
        request: Request<pb::SearchLogsRequest>,
    ) -> Result<Response<pb::SearchLogsResponse>, Status> {
        let principal = user_principal(&request)?;
        Ok(Response::new(self.search_logs(&principal, request.into_inner()).await?))
    }

    #[tracing::instrument(skip_all, fields(job_id = %request.get_ref().job_id))]
    async fn write_metrics(
        &self,
        request: Request<pb::WriteMetricsRequest>,
    ) -> Result<Response<pb::WriteMetricsResponse>, Status> {
        let principal = principal(&request)?;
        let accepted = self.write_metrics(&principal, request.into_inner()).await?;
        Ok(Response::new(pb::WriteMetricsResponse { accepted }))
    }

    #[tracing::instrument(skip_all)]
    async fn write_metrics_stream(
        &self,
        request: Request<tonic::Streaming<pb::WriteMetricsRequest>>,
    ) -> Result<Response<pb::WriteMetricsResponse>, Status> {
        use futures::StreamExt;
        let principal = principal(&request)?;
        let mut batches = request.into_inner();
        let mut accepted: u32 = 0;
        while let Some(batch) = batches.next().await {
            accepted = accepted.saturating_add(self.write_metrics(&principal, batch?).await?);
        }
        Ok(Response::new(pb::WriteMetricsResponse { accepted }))
    }

    #[tracing::instrument(skip_all)]
    async fn query_metrics(
        &self,
        request: Request<pb::QueryMetricsRequest>,
    ) -> Result<Response<pb::QueryMetricsResponse>, Status> {
        let principal = user_principal(&request)?;
        let series = self.query_metrics(&principal, request.into_inner()).await?;
        Ok(Response::new(pb::QueryMetricsResponse { series }))
    }

    #[tracing::instrument(skip_all, fields(job_id = %request.get_ref().job_id))]
    async fn list_metric_keys(
        &self,
        request: Request<pb::ListMetricKeysRequest>,
    ) -> Result<Response<pb::ListMetricKeysResponse>, Status> {
        let principal = user_principal(&request)?;
        let job = self.visible_job(&principal, &request.get_ref().job_id).await?;
        let keys = self.points.keys(&job.id).await.map_err(Status::from)?;
        Ok(Response::new(pb::ListMetricKeysResponse { keys }))
    }

    #[tracing::instrument(skip_all)]
    async fn latest_metrics(
        &self,
        request: Request<pb::LatestMetricsRequest>,
    ) -> Result<Response<pb::LatestMetricsResponse>, Status> {
        let principal = user_principal(&request)?;
        let series = self.latest_metrics(&principal, request.into_inner()).await?;
        Ok(Response::new(pb::LatestMetricsResponse { series }))
    }

    #[tracing::instrument(skip_all, fields(job_id = %request.get_ref().job_id))]
    async fn get_logs(&self, request: Request<pb::GetLogsRequest>) -> Result<Response<Self::GetLogsStream>, Status> {
        let principal = user_principal(&request)?;
        let request = request.into_inner();
        let job_id = self.visible_job(&principal, &request.job_id).await?.id;
        Ok(Response::new(self.spawn_lines(
            job_id,
            Cursor::default(),
            request.follow,
        )))
    }

    #[tracing::instrument(skip_all, fields(job_id = %request.get_ref().job_id))]
    async fn tail_logs(&self, request: Request<pb::TailLogsRequest>) -> Result<Response<Self::TailLogsStream>, Status> {
        let principal = user_principal(&request)?;
        let request = request.into_inner();
        let job_id = self.visible_job(&principal, &request.job_id).await?.id;
        let lines = match request.lines {
            0 => DEFAULT_TAIL_LINES,
            n => n.min(LARGEST_TAIL_LINES),
        };
        let from = self.logs.tail_cursor(&job_id, lines).await.map_err(Status::from)?;
        Ok(Response::new(self.spawn_lines(job_id, from, request.follow)))
    }

    #[tracing::instrument(skip_all, fields(job_id = %request.get_ref().job_id))]
    async fn write_logs(
        &self,
        request: Request<pb::WriteLogsRequest>,
    ) -> Result<Response<pb::WriteLogsResponse>, Status> {
        let principal = principal(&request)?;
        let accepted = self.write_logs(&principal, request.into_inner()).await?;
        Ok(Response::new(pb::WriteLogsResponse { accepted }))
    }
}

impl LogsApi {
    /// Streams a job's lines after `from` from a task of their own.
    fn spawn_lines(&self, job_id: String, from: Cursor, follow: bool) -> LineStream {
        let (tx, rx) = mpsc::channel(256);
        let api = self.clone();
        let woken = self.written.subscribe();
        tokio::spawn(async move {
            if let Err(status) = api.stream_lines(&job_id, from, follow, woken, &tx).await {
                let _ = tx.send(Err(status)).await;
            }
        });
        Box::pin(ReceiverStream::new(rx))
    }

    /// Publishes lines for a job that has not ended, one record each, under message ids made of
    /// the writer's name and line numbers (so a retried request is stored once).
    async fn write_logs(&self, principal: &Principal, request: pb::WriteLogsRequest) -> Result<u32, Error> {
        use prost::Message;
        let size = request.encoded_len();
        if size > MAX_REQUEST_BYTES {
            return Err(Error::TooLarge(format!(
                "the request is {size} bytes; the limit is {MAX_REQUEST_BYTES} bytes (4 MiB): send fewer lines at a time"
            )));
        }
        if request.lines.len() > MAX_LINES_PER_REQUEST {
            return Err(Error::TooLarge(format!(
                "{} lines in one request; the limit is {MAX_LINES_PER_REQUEST}",
                request.lines.len()
            )));
        }
        if request.writer.len() > MAX_KEY_BYTES || request.writer.contains(['.', '*', '>', ' ']) {
            return Err(Error::InvalidArgument(format!(
                "writer {:?} must be at most {MAX_KEY_BYTES} bytes without '.', '*', '>' or spaces",
                request.writer.chars().take(40).collect::<String>()
            )));
        }
        if let Some((n, line)) = request
            .lines
            .iter()
            .enumerate()
            .find(|(_, line)| line.text.len() > MAX_LOG_LINE_BYTES)
        {
            return Err(Error::InvalidArgument(format!(
                "line {n} is {} bytes; the limit is {MAX_LOG_LINE_BYTES} bytes (16 KiB): split it",
                line.text.len()
            )));
        }
        let job = self.visible_job(principal, &request.job_id).await?;
        let state = job.state()?;
        if state.is_terminal() {
            return Err(Error::FailedPrecondition(format!(
                "job {} has ended ({state}); its log takes no more lines",
                job.id
            )));
        }
        let subject = kiln_core::subjects::logs(&job.id);
        let now = now_ms();
        let accepted = u32::try_from(request.lines.len()).unwrap_or(u32::MAX);
        let records: Vec<(String, bytes::Bytes)> = request
            .lines
            .into_iter()
            .enumerate()
            .map(|(n, line)| {
                let record = pb::LogRecord {
                    job_id: job.id.clone(),
                    attempt: job.attempt,
                    seq: 0,
                    stream: match line.stream {
                        0 => pb::LogStream::Stdout as i32,
                        stream => stream,
                    },
                    timestamp_ms: if line.timestamp_ms == 0 { now } else { line.timestamp_ms },
                    text: line.text,
                    end: false,
                };
                let msg_id = match request.writer.as_str() {
                    "" => kiln_core::ids::new_id(),
                    writer => format!("{}:w:{writer}:{}", job.id, request.first_index + n as u64),
                };
                (msg_id, record.encode_to_vec().into())
            })
            .collect();
        kiln_core::streams::publish_all(&self.nats.jetstream, &subject, records).await?;
        Ok(accepted)
    }

    /// Reads a job the caller may see (owner or admin); others' jobs read as not found.
    async fn visible_job(&self, principal: &Principal, job_id: &str) -> Result<kiln_core::store::JobRecord, Error> {
        let job_id = parse_id("job", job_id).map_err(Error::InvalidArgument)?;
        let job = match self.store.job(&job_id).await {
            Ok(job) => job,
            Err(StoreError::JobNotFound { job_id }) => return Err(Error::JobNotFound { job_id }),
            Err(error) => return Err(error.into()),
        };
        let allowed = match &principal.scope {
            Scope::User => job.owner_id == principal.user_id || principal.is_admin,
            Scope::Job(own) => {
                if *own != job.id {
                    return Err(Error::PermissionDenied(format!(
                        "this token belongs to job {own}; it cannot write job {}",
                        job.id
                    )));
                }
                true
            }
        };
        if !allowed {
            return Err(Error::JobNotFound { job_id });
        }
        Ok(job)
    }

    async fn search_logs(
        &self,
        principal: &Principal,
        request: pb::SearchLogsRequest,
    ) -> Result<pb::SearchLogsResponse, Error> {
        let job = self.visible_job(principal, &request.job_id).await?;
        if request.pattern.is_empty() {
            return Err(Error::InvalidArgument("pattern is empty".into()));
        }
        let matcher: Box<dyn Fn(&str) -> bool + Send> = if request.regex {
            let regex = regex::RegexBuilder::new(&request.pattern)
                .size_limit(1 << 20)
                .build()
                .map_err(|e| Error::InvalidArgument(format!("pattern is not a valid regular expression: {e}")))?;
            Box::new(move |text| regex.is_match(text))
        } else {
            let pattern = request.pattern.clone();
            Box::new(move |text| text.contains(&pattern))
        };
        let limit = match request.limit {
            0 => 1000,
            n => (n as usize).min(100_000),
        };
        let until = if request.until_ms == 0 {
            i64::MAX
        } else {
            request.until_ms
        };
        let mut cursor = Cursor::default();
        let mut lines = Vec::new();
        loop {
            let page = self.logs.read(&job.id, cursor, PAGE).await?;
            let full = page.len() == PAGE as usize;
            for line in page {
                cursor = Cursor {
                    attempt: line.attempt,
                    seq: line.seq,
                };
                let in_time = line.timestamp_ms >= request.since_ms && line.timestamp_ms < until;
                if line.end || !in_time || !matcher(&line.text) {
                    continue;
                }
                if lines.len() == limit {
                    return Ok(pb::SearchLogsResponse { lines, truncated: true });
                }
                lines.push(pb::LogLine {
                    attempt: line.attempt,
                    seq: u64::try_from(line.seq).unwrap_or(0),
                    stream: line.stream,
                    timestamp_ms: line.timestamp_ms,
                    text: line.text,
                });
            }
            if !full {
                return Ok(pb::SearchLogsResponse {
                    lines,
                    truncated: false,
                });
            }
        }
    }

    async fn write_metrics(&self, principal: &Principal, request: pb::WriteMetricsRequest) -> Result<u32, Error> {
        use prost::Message;
        let size = request.encoded_len();
        if size > MAX_REQUEST_BYTES {
            return Err(Error::TooLarge(format!(
                "the batch is {size} bytes; the limit is {MAX_REQUEST_BYTES} bytes (4 MiB): send smaller batches"
            )));
        }
        let job = self.visible_job(principal, &request.job_id).await?;
        let columns = request.columns.unwrap_or_default();
        check_columns(&columns).map_err(Error::InvalidArgument)?;
        let mut keys: Vec<&str> = request
            .points
            .iter()
            .map(|p| p.key.as_str())
            .chain(columns.keys.iter().map(String::as_str))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        for key in &keys {
            if key.is_empty() || key.len() > MAX_KEY_BYTES || key.chars().any(char::is_control) {
                return Err(Error::InvalidArgument(format!(
                    "metric key {:?} is {} bytes; keys are 1 to {MAX_KEY_BYTES} bytes without control characters",
                    key.chars().take(40).collect::<String>(),
                    key.len()
                )));
            }
        }
        self.admit_keys(&job.id, &keys).await?;
        let mut all = pb::MetricColumns::default();
        append_columns(&mut all, request.points, columns, kiln_core::ids::now_ms());
        let accepted = u32::try_from(all.steps.len()).unwrap_or(u32::MAX);
        // Answered once durable: every part is acknowledged by JetStream. Points are keyed by
        // (job, key, step), so a retried request stores nothing twice.
        for part in split_columns(&all, POINTS_PER_MESSAGE) {
            let batch = pb::MetricBatch {
                job_id: job.id.clone(),
                attempt: job.attempt,
                points: Vec::new(),
                columns: Some(part),
            };
            let msg_id = kiln_core::ids::new_id();
            kiln_core::streams::publish(
                &self.nats.jetstream,
                kiln_core::subjects::metrics(&job.id),
                &msg_id,
                batch.encode_to_vec().into(),
            )
            .await?;
        }
        Ok(accepted)
    }

    /// Refuses keys that would take a job over [`MAX_KEYS_PER_JOB`]. The keys a job has are read
    /// from the store once, then kept in memory (for a bounded number of jobs): another replica's
    /// new keys are seen when this one reads the job again.
    async fn admit_keys(&self, job_id: &str, keys: &[&str]) -> Result<(), Error> {
        let cached = {
            let known = self.known_keys.lock().expect("the key cache is never poisoned");
            known.get(job_id).map(|set| keys.iter().all(|key| set.contains(*key)))
        };
        if cached == Some(true) {
            return Ok(());
        }
        if cached.is_none() {
            let stored: HashSet<String> = self.points.keys(job_id).await?.into_iter().collect();
            let mut known = self.known_keys.lock().expect("the key cache is never poisoned");
            if known.len() >= KEY_CACHE_JOBS {
                known.clear();
            }
            known.entry(job_id.to_string()).or_default().extend(stored);
        }
        let mut known = self.known_keys.lock().expect("the key cache is never poisoned");
        let set = known.entry(job_id.to_string()).or_default();
        let new = keys.iter().filter(|key| !set.contains(**key)).count();
        if set.len() + new > MAX_KEYS_PER_JOB {
            return Err(Error::TooLarge(format!(
                "job {job_id} would have {} metric keys; the limit is {MAX_KEYS_PER_JOB} keys per job",
                set.len() + new
            )));
        }
        set.extend(keys.iter().map(|key| (*key).to_string()));
        Ok(())
    }

    /// The keys to read of a job: those asked for, or all it has.
    async fn keys_of(&self, job_id: &str, keys: &[String]) -> Result<Vec<String>, Error> {
        if keys.is_empty() {
            self.points.keys(job_id).await
        } else {
            Ok(keys.to_vec())
        }
    }

    async fn query_metrics(
        &self,
        principal: &Principal,
        request: pb::QueryMetricsRequest,
    ) -> Result<Vec<pb::MetricSeries>, Error> {
        let max_points = match request.max_points {
            0 => DEFAULT_MAX_POINTS,
            n => (n as usize).min(LARGEST_MAX_POINTS),
        };
        let min_step = request.min_step.unwrap_or(i64::MIN);
        let max_step = request.max_step.unwrap_or(i64::MAX);
        let mut out = Vec::new();
        for job_id in &request.job_ids {
            let job = self.visible_job(principal, job_id).await?;
            for key in self.keys_of(&job.id, &request.keys).await? {
                let series = self
                    .points
                    .series(&job.id, &key, min_step, max_step, max_points)
                    .await?;
                out.push(pb::MetricSeries {
                    job_id: job.id.clone(),
                    points: series.points.into_iter().map(to_proto).collect(),
                    key,
                    total_points: series.total,
                });
            }
        }
        Ok(out)
    }

    async fn latest_metrics(
        &self,
        principal: &Principal,
        request: pb::LatestMetricsRequest,
    ) -> Result<Vec<pb::MetricSeries>, Error> {
        let mut out = Vec::new();
        for job_id in &request.job_ids {
            let job = self.visible_job(principal, job_id).await?;
            for key in self.keys_of(&job.id, &request.keys).await? {
                if let Some(point) = self.points.latest(&job.id, &key).await? {
                    out.push(pb::MetricSeries {
                        job_id: job.id.clone(),
                        key,
                        points: vec![to_proto(point)],
                        total_points: 1,
                    });
                }
            }
        }
        Ok(out)
    }

    /// Sends the stored lines, then (with `follow`) new ones until the job has ended and its
    /// last line is out.
    async fn stream_lines(
        &self,
        job_id: &str,
        from: Cursor,
        follow: bool,
        mut woken: broadcast::Receiver<String>,
        tx: &mpsc::Sender<Result<pb::LogLine, Status>>,
    ) -> Result<(), Status> {
        let mut cursor = from;
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

fn to_proto(point: crate::points::Point) -> pb::MetricPoint {
    pb::MetricPoint {
        key: point.key.to_string(),
        step: point.step,
        value: point.value,
        timestamp_ms: point.timestamp_ms,
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
