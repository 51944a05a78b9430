//! `BatchLogService`: the search across the kept lines of a batch's items. The caller must be
//! able to read the batch's project (`Caller::batch`, which reads the batch's scope from the
//! metadata store); item lines are written by [`crate::item_lines::ItemLineWriter`].

use kiln_proto::v1 as pb;
use kiln_proto::v1::batch_log_service_server::BatchLogService;
use tonic::{Request, Response, Status};

use super::{LogsApi, caller};
use crate::error::Error;
use crate::item_lines::{ItemSearch, Matcher};

/// Lines a search answers with by default, and at most.
const DEFAULT_LIMIT: usize = 1_000;
const LARGEST_LIMIT: usize = 100_000;

#[tonic::async_trait]
impl BatchLogService for LogsApi {
    #[tracing::instrument(skip_all, fields(batch_id = %request.get_ref().batch_id))]
    async fn search_batch_logs(
        &self,
        request: Request<pb::SearchBatchLogsRequest>,
    ) -> Result<Response<pb::SearchBatchLogsResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        let batch = caller
            .batch(&self.store, &request.batch_id)
            .await
            .map_err(|e| Status::from(Error::from(e)))?;
        let search = ItemSearch {
            batch_id: batch.id,
            matcher: Matcher::new(&request.pattern, request.regex)?,
            state: attempt_state(request.state)?,
            limit: match request.limit {
                0 => DEFAULT_LIMIT,
                n => (n as usize).min(LARGEST_LIMIT),
            },
        };
        // Read-your-writes: every outcome item-batch has counted is in the store.
        if !self.items_caught_up.wait(self.read_wait).await {
            self.stale_reads.inc();
            tracing::warn!("the item-line writers are behind; searching what is stored");
        }
        let found = self.logs.search_item_lines(&search).await?;
        let lines = found
            .lines
            .into_iter()
            .map(|line| pb::ItemLogLine {
                key: line.key,
                attempt: u32::try_from(line.attempt).unwrap_or(0),
                line: u32::try_from(line.line).unwrap_or(0),
                stream: line.stream,
                timestamp_ms: line.timestamp_ms,
                text: line.text,
                state: line.state,
            })
            .collect();
        Ok(Response::new(pb::SearchBatchLogsResponse {
            lines,
            truncated: found.truncated,
        }))
    }
}

/// The attempt outcome a search keeps to: none, or one an attempt can end with.
fn attempt_state(state: i32) -> Result<Option<i32>, Error> {
    use pb::ItemState;
    match ItemState::try_from(state) {
        Ok(ItemState::Unspecified) => Ok(None),
        Ok(ended @ (ItemState::Succeeded | ItemState::Failed | ItemState::Dead)) => Ok(Some(ended as i32)),
        other => Err(Error::InvalidArgument(format!(
            "state {} is not how an attempt ends: give SUCCEEDED, FAILED, DEAD or none",
            other.map_or_else(|_| state.to_string(), |s| s.as_str_name().to_string())
        ))),
    }
}
