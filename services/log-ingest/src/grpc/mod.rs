//! `LogService`: reading and following a job's lines, and `BatchLogService`: searching a
//! batch's item lines (`item_lines`). Errors become statuses here only.
//!
//! `logs` writes, searches and follows a job's lines; `metrics` writes and queries its metric
//! points; this module holds the API's state, answers the `LogService` calls and decides who
//! may see a job.

use std::collections::{HashMap, HashSet};
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use futures::Stream;
use kiln_core::authz::Caller;
use kiln_core::store::Store;
use kiln_proto::v1 as pb;
use kiln_proto::v1::log_service_server::LogService;
use tokio::sync::broadcast;
use tonic::{Request, Response, Status};

use crate::error::Error;
use crate::points::MetricStore;
use crate::store::{Cursor, LogStore};

mod checks;
mod item_lines;
mod logs;
mod metrics;

impl From<Error> for Status {
    fn from(error: Error) -> Status {
        kiln_core::error::status(error.kind(), &error)
    }
}

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
    /// How far the metric writers are, for read-your-writes (see [`crate::caught_up`]).
    pub(crate) caught_up: Arc<crate::caught_up::CaughtUp>,
    /// How far the item-line writers are, for searches of a batch's lines.
    pub(crate) items_caught_up: Arc<crate::caught_up::CaughtUp>,
    /// How long a metric read waits for the writers, at most.
    pub(crate) read_wait: std::time::Duration,
    /// Counts the reads that waited `read_wait` in vain.
    pub(crate) stale_reads: prometheus_client::metrics::counter::Counter,
}

/// Largest WriteMetrics request, in bytes.
pub const MAX_REQUEST_BYTES: usize = 4 << 20;
/// Longest metric key, in bytes.
pub const MAX_KEY_BYTES: usize = 250;
/// Most distinct keys one job may write.
pub const MAX_KEYS_PER_JOB: usize = 10_000;
/// Default and largest `lines` of TailLogs.
const DEFAULT_TAIL_LINES: u32 = 10;
const LARGEST_TAIL_LINES: u32 = 100_000;

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
        let caller = caller(&request)?;
        Ok(Response::new(self.search_logs(&caller, request.into_inner()).await?))
    }

    #[tracing::instrument(skip_all, fields(job_id = %request.get_ref().job_id))]
    async fn write_metrics(
        &self,
        request: Request<pb::WriteMetricsRequest>,
    ) -> Result<Response<pb::WriteMetricsResponse>, Status> {
        let caller = caller(&request)?;
        let accepted = self.write_metrics(&caller, request.into_inner()).await?;
        Ok(Response::new(pb::WriteMetricsResponse { accepted }))
    }

    #[tracing::instrument(skip_all)]
    async fn write_metrics_stream(
        &self,
        request: Request<tonic::Streaming<pb::WriteMetricsRequest>>,
    ) -> Result<Response<pb::WriteMetricsResponse>, Status> {
        use futures::StreamExt;
        let caller = caller(&request)?;
        let mut batches = request.into_inner();
        let mut accepted: u32 = 0;
        while let Some(batch) = batches.next().await {
            accepted = accepted.saturating_add(self.write_metrics(&caller, batch?).await?);
        }
        Ok(Response::new(pb::WriteMetricsResponse { accepted }))
    }

    #[tracing::instrument(skip_all)]
    async fn query_metrics(
        &self,
        request: Request<pb::QueryMetricsRequest>,
    ) -> Result<Response<pb::QueryMetricsResponse>, Status> {
        let caller = caller(&request)?;
        let series = self.query_metrics(&caller, request.into_inner()).await?;
        Ok(Response::new(pb::QueryMetricsResponse { series }))
    }

    #[tracing::instrument(skip_all, fields(job_id = %request.get_ref().job_id))]
    async fn list_metric_keys(
        &self,
        request: Request<pb::ListMetricKeysRequest>,
    ) -> Result<Response<pb::ListMetricKeysResponse>, Status> {
        let caller = caller(&request)?;
        let job = self.visible_job(&caller, &request.get_ref().job_id).await?;
        self.caught_up().await;
        let keys = self.points.keys(&job.id).await.map_err(Status::from)?;
        Ok(Response::new(pb::ListMetricKeysResponse { keys }))
    }

    #[tracing::instrument(skip_all)]
    async fn latest_metrics(
        &self,
        request: Request<pb::LatestMetricsRequest>,
    ) -> Result<Response<pb::LatestMetricsResponse>, Status> {
        let caller = caller(&request)?;
        let series = self.latest_metrics(&caller, request.into_inner()).await?;
        Ok(Response::new(pb::LatestMetricsResponse { series }))
    }

    #[tracing::instrument(skip_all, fields(job_id = %request.get_ref().job_id))]
    async fn get_logs(&self, request: Request<pb::GetLogsRequest>) -> Result<Response<Self::GetLogsStream>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        let job_id = self.visible_job(&caller, &request.job_id).await?.id;
        let log_id = kiln_core::subjects::node_log_id(&job_id, request.node);
        let from = match request.after_seq {
            0 => Cursor::default(),
            seq => self.resume_cursor(&log_id, seq).await?,
        };
        Ok(Response::new(self.spawn_lines(log_id, job_id, from, request.follow)))
    }

    #[tracing::instrument(skip_all, fields(job_id = %request.get_ref().job_id))]
    async fn tail_logs(&self, request: Request<pb::TailLogsRequest>) -> Result<Response<Self::TailLogsStream>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        let job_id = self.visible_job(&caller, &request.job_id).await?.id;
        let lines = match request.lines {
            0 => DEFAULT_TAIL_LINES,
            n => n.min(LARGEST_TAIL_LINES),
        };
        let log_id = kiln_core::subjects::node_log_id(&job_id, request.node);
        let from = self.logs.tail_cursor(&log_id, lines).await.map_err(Status::from)?;
        Ok(Response::new(self.spawn_lines(log_id, job_id, from, request.follow)))
    }

    #[tracing::instrument(skip_all, fields(job_id = %request.get_ref().job_id))]
    async fn write_logs(
        &self,
        request: Request<pb::WriteLogsRequest>,
    ) -> Result<Response<pb::WriteLogsResponse>, Status> {
        let caller = caller(&request)?;
        let accepted = self.write_logs(&caller, request.into_inner()).await?;
        Ok(Response::new(pb::WriteLogsResponse { accepted }))
    }
}

impl LogsApi {
    /// Waits until the writers have stored every metric point written before now (at most
    /// `read_wait`; past it the read goes on with what is stored, and counts as stale).
    pub(crate) async fn caught_up(&self) {
        if !self.caught_up.wait(self.read_wait).await {
            self.stale_reads.inc();
            tracing::warn!(
                wait_ms = self.read_wait.as_millis() as u64,
                "the metric writers are behind; answering a read with what is stored"
            );
        }
    }

    /// Reads a job the call may act on (see [`Caller::job`]).
    async fn visible_job(&self, caller: &Caller, job_id: &str) -> Result<kiln_core::store::JobRecord, Error> {
        Ok(caller.job(&self.store, job_id).await?)
    }
}

/// The caller the auth layer established for this request.
fn caller<T>(request: &Request<T>) -> Result<Caller, Status> {
    Caller::of(request).map_err(|denied| Status::from(Error::from(kiln_core::Error::from(denied))))
}
