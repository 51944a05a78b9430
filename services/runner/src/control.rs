//! What stops or preempts the jobs this runner holds: stop and preempt requests on
//! `kiln.control.>`, and the provider's spot preemption notices.

use std::time::Duration;

use async_nats::jetstream::consumer::{self, pull};
use futures::StreamExt;
use kiln_core::subjects;
use kiln_proto::v1 as pb;
use prost::Message;
use tokio_util::sync::CancellationToken;

use crate::error::Result;
use crate::{Context, nats_error, provider};

/// Spot preemption notices from the provider, passed to the jobs they concern.
pub(super) async fn watch_preemptions(
    ctx: Context,
    mut notices: tokio::sync::mpsc::Receiver<provider::Preemption>,
    shutdown: CancellationToken,
) {
    loop {
        let notice = tokio::select! {
            _ = shutdown.cancelled() => return,
            notice = notices.recv() => notice,
        };
        let Some(notice) = notice else { return };
        if let Some(active) = ctx.active.lock().expect("active jobs lock").get(&notice.job_id) {
            tracing::warn!(job_id = %notice.job_id, notice_ms = notice.notice.as_millis() as u64, "spot preemption notice");
            active.controls.preempt(notice.notice);
        }
    }
}

/// Stop requests for jobs of this runner.
pub(super) async fn watch_controls(ctx: Context, shutdown: CancellationToken) {
    while !shutdown.is_cancelled() {
        if let Err(error) = consume_controls(&ctx, &shutdown).await {
            tracing::warn!(error = %error, "control consumer failed; restarting");
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }
}

async fn consume_controls(ctx: &Context, shutdown: &CancellationToken) -> Result<()> {
    let stream = ctx
        .nats
        .jetstream
        .get_stream(subjects::STREAM_CONTROL)
        .await
        .map_err(nats_error)?;
    let name = subjects::consumer_control(&ctx.config.runner_id);
    let consumer: consumer::PullConsumer = stream
        .get_or_create_consumer(
            &name,
            pull::Config {
                durable_name: Some(name.clone()),
                filter_subject: subjects::CONTROL_ALL.to_string(),
                deliver_policy: consumer::DeliverPolicy::New,
                ack_policy: consumer::AckPolicy::Explicit,
                inactive_threshold: Duration::from_secs(24 * 3600),
                ..Default::default()
            },
        )
        .await
        .map_err(nats_error)?;
    let mut messages = consumer.messages().await.map_err(nats_error)?;
    loop {
        let message = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            message = messages.next() => message,
        };
        let Some(message) = message else {
            return Err(nats_error("control consumer ended"));
        };
        let message = message.map_err(nats_error)?;
        if let Ok(request) = pb::ControlRequest::decode(message.payload.as_ref())
            && let Some(active) = ctx.active.lock().expect("active jobs lock").get(&request.job_id)
        {
            match pb::control_request::Action::try_from(request.action) {
                Ok(pb::control_request::Action::Stop) => {
                    tracing::info!(job_id = %request.job_id, "stop requested");
                    active.controls.stop.cancel();
                }
                Ok(pb::control_request::Action::Preempt) => {
                    tracing::warn!(job_id = %request.job_id, for_job = %request.for_job, "preempted for a higher priority");
                    let grace = Duration::from_millis(ctx.config.stop_grace_period_ms);
                    active.controls.preempt_for(request.for_job, grace);
                }
                _ => {}
            }
        }
        message.ack().await.map_err(nats_error)?;
    }
}
