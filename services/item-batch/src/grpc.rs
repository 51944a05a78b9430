//! `BatchService`: creating batches, taking their items, and reporting on them. Errors become
//! statuses at this edge only.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use kiln_core::authz::{Caller, Resource};
use kiln_core::ids::{new_id, now_ms, parse_id};
use kiln_proto::v1 as pb;
use kiln_proto::v1::batch_service_server::BatchService;
use tonic::{Request, Response, Status, Streaming};

use crate::Shared;
use crate::error::{Error, Result};
use crate::feed::{BatchChangesStream, Listed};
use crate::intake::Intake;
use crate::spec::Spec;
use crate::store::{self, BatchRecord, NewItem};

/// Items in one AddItems message, at most.
pub const MAX_ITEMS_PER_MESSAGE: usize = 10_000;
/// Longest item key and URI, in bytes.
pub const MAX_KEY_BYTES: usize = 512;
pub const MAX_URI_BYTES: usize = 4096;
/// Parameters of one item, at most.
pub const MAX_PARAMS: usize = 64;
/// Largest AddItems message (NATS and gRPC limits leave room for this).
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;
/// Default and largest page of ListItems.
const DEFAULT_PAGE: u32 = 100;
const LARGEST_PAGE: u32 = 10_000;

/// BatchApi serves `BatchService`.
#[derive(Clone)]
pub struct BatchApi {
    pub(crate) shared: Arc<Shared>,
}

#[tonic::async_trait]
impl BatchService for BatchApi {
    async fn create_batch(&self, request: Request<pb::CreateBatchRequest>) -> Result<Response<pb::Batch>, Status> {
        let caller = caller(&request)?;
        let mut spec = Spec::from_proto(request.into_inner().spec)?;
        spec.project = caller
            .named_project(&self.shared.store, &spec.project)
            .await
            .map_err(Error::from)?;
        if let Some(name) = self
            .shared
            .store
            .missing_secret(&spec.project, &spec.secrets)
            .await
            .map_err(Error::from)?
        {
            return Err(Error::FailedPrecondition(format!(
                "project {project} has no secret {name}; set it with `kiln secret set {name} --project {project}`",
                project = spec.project
            ))
            .into());
        }
        let record = BatchRecord {
            id: new_id(),
            owner_id: caller.user_id().to_string(),
            project: spec.project.clone(),
            name: spec.name.clone(),
            spec_json: spec.to_json(),
            state: store::OPEN.to_string(),
            created_at_ms: now_ms(),
            sealed_at_ms: None,
            finished_at_ms: None,
            stalled_reason: String::new(),
            worker_failures_since_ms: 0,
            paused_reason: String::new(),
        };
        self.shared.batches.insert_batch(record.clone()).await?;
        self.shared.ensure_consumer(&record.id).await?;
        tracing::info!(batch_id = %record.id, owner = %caller.principal.user_name, "batch created");
        Ok(Response::new(self.shared.describe(&record).await?))
    }

    async fn add_items(
        &self,
        request: Request<Streaming<pb::AddItemsRequest>>,
    ) -> Result<Response<pb::AddItemsResponse>, Status> {
        let caller = caller(&request)?;
        let mut messages = request.into_inner();
        let mut intake: Option<Intake> = None;
        while let Some(message) = messages.next().await {
            let message = message?;
            let intake = match &mut intake {
                None => {
                    let batch_id = self.visible(&caller, &message.batch_id).await?.id;
                    intake.insert(Intake::start(self.shared.clone(), batch_id))
                }
                Some(intake) if message.batch_id.is_empty() || message.batch_id == intake.batch_id() => intake,
                Some(intake) => {
                    return Err(Error::InvalidArgument(format!(
                        "one AddItems call adds to one batch: {}, not {}",
                        intake.batch_id(),
                        message.batch_id
                    ))
                    .into());
                }
            };
            intake.add(check_items(message.items)?).await?;
        }
        let Some(intake) = intake else {
            return Err(Error::InvalidArgument("no message named a batch".into()).into());
        };
        let batch_id = intake.batch_id().to_string();
        let (added, duplicates) = intake.finish().await?;
        let total = self.shared.batches.tally(&batch_id).await?.total;
        Ok(Response::new(pb::AddItemsResponse {
            added,
            duplicates,
            total,
        }))
    }

    async fn add_items_from_objects(
        &self,
        request: Request<pb::AddItemsFromObjectsRequest>,
    ) -> Result<Response<pb::AddItemsResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        let batch = self.visible(&caller, &request.batch_id).await?;
        let (added, duplicates) = match request.source {
            Some(pb::add_items_from_objects_request::Source::Prefix(prefix)) => {
                crate::sources::add_from_prefix(&self.shared, &batch.id, &batch.project, &prefix).await?
            }
            Some(pb::add_items_from_objects_request::Source::Manifest(path)) => {
                crate::sources::add_from_manifest(&self.shared, &batch.id, &batch.project, &path).await?
            }
            None => return Err(Error::InvalidArgument("give a prefix or a manifest".into()).into()),
        };
        let mut response = pb::AddItemsResponse {
            added,
            duplicates,
            ..Default::default()
        };
        response.total = self.shared.batches.tally(&batch.id).await?.total;
        Ok(Response::new(response))
    }

    async fn seal_batch(&self, request: Request<pb::BatchRef>) -> Result<Response<pb::Batch>, Status> {
        let caller = caller(&request)?;
        let batch = self.visible(&caller, &request.get_ref().batch_id).await?;
        if batch.state != store::SEALED
            && !self
                .shared
                .batches
                .set_batch_state(&batch.id, &[store::OPEN], store::SEALED)
                .await?
        {
            let now = self.shared.batches.batch(&batch.id).await?;
            return Err(Error::FailedPrecondition(format!(
                "batch {} is {}; only an open batch can be sealed",
                batch.id, now.state
            ))
            .into());
        }
        let batch = self.shared.batches.batch(&batch.id).await?;
        Ok(Response::new(self.shared.describe(&batch).await?))
    }

    async fn cancel_batch(&self, request: Request<pb::BatchRef>) -> Result<Response<pb::Batch>, Status> {
        let caller = caller(&request)?;
        let batch = self.visible(&caller, &request.get_ref().batch_id).await?;
        if batch.state == store::DONE {
            return Err(Error::FailedPrecondition(format!("batch {} is done already", batch.id)).into());
        }
        self.shared.cancel(&batch.id).await?;
        let batch = self.shared.batches.batch(&batch.id).await?;
        Ok(Response::new(self.shared.describe(&batch).await?))
    }

    async fn get_batch(&self, request: Request<pb::BatchRef>) -> Result<Response<pb::Batch>, Status> {
        let caller = caller(&request)?;
        let batch = self.visible(&caller, &request.get_ref().batch_id).await?;
        let mut described = self.shared.describe(&batch).await?;
        described.usage = Some(self.shared.usage.of(&self.shared.batches, &batch).await?);
        Ok(Response::new(described))
    }

    async fn list_batches(
        &self,
        request: Request<pb::ListBatchesRequest>,
    ) -> Result<Response<pb::ListBatchesResponse>, Status> {
        let caller = caller(&request)?;
        let listed = Listed::of(&self.shared, &caller, request.get_ref()).await?;
        Ok(Response::new(pb::ListBatchesResponse {
            batches: listed.batches().await?,
        }))
    }

    type WatchBatchesStream = BatchChangesStream;

    async fn watch_batches(
        &self,
        request: Request<pb::WatchBatchesRequest>,
    ) -> Result<Response<BatchChangesStream>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        let listed = Listed::of(&self.shared, &caller, &request.list.unwrap_or_default()).await?;
        Ok(Response::new(listed.watch(request.after_seq).await?))
    }

    async fn list_items(
        &self,
        request: Request<pb::ListItemsRequest>,
    ) -> Result<Response<pb::ListItemsResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        let batch = self.visible(&caller, &request.batch_id).await?;
        let mut states = Vec::new();
        for state in &request.states {
            let state = pb::ItemState::try_from(*state)
                .ok()
                .and_then(store::item_state_name)
                .ok_or_else(|| Error::InvalidArgument(format!("{state} is not an item state")))?;
            states.push(state);
        }
        let limit = match request.limit {
            0 => DEFAULT_PAGE,
            n => n.min(LARGEST_PAGE),
        };
        let items = self
            .shared
            .batches
            .items(&batch.id, &states, &request.page_token, u64::from(limit) + 1)
            .await?;
        let more = items.len() > limit as usize;
        let items: Vec<pb::ItemStatus> = items
            .into_iter()
            .take(limit as usize)
            .map(|item| pb::ItemStatus {
                state: store::item_state_proto(&item.state) as i32,
                attempts: u32::try_from(item.attempts).unwrap_or(0),
                exit_code: item.exit_code,
                reason: item.reason,
                updated_at_ms: item.updated_at_ms,
                cpu_seconds: item.cpu_seconds,
                peak_memory_bytes: u64::try_from(item.peak_memory_bytes).unwrap_or(0),
                duration_ms: u64::try_from(item.duration_ms).unwrap_or(0),
                key: item.item_key,
                uri: item.uri,
            })
            .collect();
        let next_page_token = match (more, items.last()) {
            (true, Some(last)) => last.key.clone(),
            _ => String::new(),
        };
        Ok(Response::new(pb::ListItemsResponse { items, next_page_token }))
    }

    async fn get_item_logs(
        &self,
        request: Request<pb::GetItemLogsRequest>,
    ) -> Result<Response<pb::GetItemLogsResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        let batch = self.visible(&caller, &request.batch_id).await?;
        if self.shared.batches.item(&batch.id, &request.key).await?.is_none() {
            return Err(Error::InvalidArgument(format!("batch {} has no item {:?}", batch.id, request.key)).into());
        }
        let mut lines = Vec::new();
        for attempt in self.shared.batches.attempts(&batch.id, &request.key).await? {
            let kept: Vec<(i32, i64, String)> = serde_json::from_str(&attempt.lines_json).unwrap_or_default();
            for (seq, (stream, timestamp_ms, text)) in kept.into_iter().enumerate() {
                lines.push(pb::LogLine {
                    attempt: attempt.attempt,
                    seq: seq as u64 + 1,
                    stream,
                    timestamp_ms,
                    text,
                });
            }
        }
        Ok(Response::new(pb::GetItemLogsResponse { lines }))
    }

    async fn retry_failed(&self, request: Request<pb::BatchRef>) -> Result<Response<pb::RetryFailedResponse>, Status> {
        let caller = caller(&request)?;
        let batch = self.visible(&caller, &request.get_ref().batch_id).await?;
        if batch.state == store::CANCELLED {
            return Err(Error::FailedPrecondition(format!("batch {} is cancelled", batch.id)).into());
        }
        // A paused batch resumes only once its owner may run jobs again.
        if !batch.paused_reason.is_empty() {
            if let Err(error) = self.shared.store.check_owner(&batch.owner_id, &batch.project).await {
                return Err(match error.owner_revoked() {
                    Some(why) => Error::FailedPrecondition(format!(
                        "batch {} stays paused: {why}; re-enable the owner or restore their role first",
                        batch.id
                    )),
                    None => error.into(),
                }
                .into());
            }
            if self.shared.batches.clear_pause(&batch.id).await? {
                tracing::info!(batch_id = %batch.id, "paused batch resumed: asking for workers again");
            }
        }
        // Workers are asked for again, counting failures afresh: the cause may be fixed.
        let resumed = self.shared.batches.clear_stall(&batch.id).await? || !batch.paused_reason.is_empty();
        if resumed {
            tracing::info!(batch_id = %batch.id, "stalled batch retried: asking for workers again");
        }
        let retried = self.shared.batches.retry_dead(&batch.id).await?;
        if retried > 0 {
            // A done batch has work again.
            self.shared
                .batches
                .set_batch_state(&batch.id, &[store::DONE], store::SEALED)
                .await?;
            self.shared.ensure_consumer(&batch.id).await?;
            self.shared.publish_unpublished(&batch.id).await?;
        }
        self.shared.wake.notify_one();
        Ok(Response::new(pb::RetryFailedResponse { retried, resumed }))
    }
}

impl BatchApi {
    /// Reads a batch the call may act on; a batch of a project the caller is not in reads as
    /// not found.
    async fn visible(&self, caller: &Caller, batch_id: &str) -> Result<BatchRecord> {
        authorized_batch(&self.shared, caller, batch_id).await
    }
}

/// The caller the auth layer established for this request.
pub(crate) fn caller<T>(request: &Request<T>) -> Result<Caller> {
    Ok(Caller::of(request).map_err(kiln_core::Error::from)?)
}

/// Reads a batch and asks the caller's rule about it.
pub(crate) async fn authorized_batch(shared: &Shared, caller: &Caller, batch_id: &str) -> Result<BatchRecord> {
    let batch_id = parse_id("batch", batch_id).map_err(Error::InvalidArgument)?;
    let batch = shared.batches.batch(&batch_id).await?;
    caller
        .authorize(&batch_resource(&batch))
        .map_err(kiln_core::Error::from)?;
    Ok(batch)
}

/// A batch as the authorisation rule sees it.
pub(crate) fn batch_resource(batch: &BatchRecord) -> Resource<'_> {
    Resource::batch(&batch.id, &batch.project, &batch.owner_id)
}

/// Checks items and fills in their keys (the URI when none is given).
pub(crate) fn check_items(items: Vec<pb::Item>) -> Result<Vec<NewItem>> {
    if items.len() > MAX_ITEMS_PER_MESSAGE {
        return Err(Error::TooLarge(format!(
            "{} items in one message; send at most {MAX_ITEMS_PER_MESSAGE} per message",
            items.len()
        )));
    }
    items
        .into_iter()
        .enumerate()
        .map(|(n, item)| {
            let key = if item.key.is_empty() {
                item.uri.clone()
            } else {
                item.key
            };
            if key.is_empty() {
                return Err(Error::InvalidArgument(format!("item {n} has neither a key nor a URI")));
            }
            if key.len() > MAX_KEY_BYTES || key.chars().any(char::is_control) {
                return Err(Error::InvalidArgument(format!(
                    "item key {:?} must be at most {MAX_KEY_BYTES} bytes without control characters",
                    key.chars().take(40).collect::<String>()
                )));
            }
            if item.uri.len() > MAX_URI_BYTES {
                return Err(Error::InvalidArgument(format!(
                    "the URI of item {key:?} is longer than {MAX_URI_BYTES} bytes"
                )));
            }
            if item.params.len() > MAX_PARAMS {
                return Err(Error::InvalidArgument(format!(
                    "item {key:?} has {} parameters; the limit is {MAX_PARAMS}",
                    item.params.len()
                )));
            }
            let params: BTreeMap<String, String> = item.params.into_iter().collect();
            Ok(NewItem::new(key, item.uri, params))
        })
        .collect()
}
