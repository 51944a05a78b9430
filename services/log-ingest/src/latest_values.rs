//! Answers the model registry's question "what is each metric key's latest value of this
//! job?" over core NATS request/reply on [`subjects::INGEST_LATEST_VALUES`], in a queue group so
//! one replica answers each request. The registry records the answer in a version's lineage.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use kiln_core::subjects;
use kiln_proto::v1 as pb;
use prost::Message;
use tokio_util::sync::CancellationToken;

use crate::grpc::LogsApi;
use crate::points::MetricStore;

/// Subscribes and answers until `shutdown`; subscribes again after a failure. Each answer first
/// waits for the writers, as a metric read does (read-your-writes, [`crate::caught_up`]).
pub async fn serve(api: LogsApi, shutdown: CancellationToken) {
    let nats = &api.nats;
    loop {
        let subscribed = nats
            .client
            .queue_subscribe(
                subjects::INGEST_LATEST_VALUES,
                subjects::QUEUE_INGEST_LATEST_VALUES.to_string(),
            )
            .await;
        let mut requests = match subscribed {
            Ok(requests) => requests,
            Err(error) => {
                tracing::warn!(error = %error, "cannot subscribe to latest-value requests; retrying");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                }
            }
        };
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => {
                    let _ = requests.unsubscribe().await;
                    return;
                }
                request = requests.next() => match request {
                    Some(request) => answer(&api, request).await,
                    None => break,
                },
            }
        }
    }
}

async fn answer(api: &LogsApi, request: async_nats::Message) {
    let Some(reply_to) = request.reply else {
        return;
    };
    api.caught_up().await;
    let (nats, points) = (&api.nats, api.points.as_ref());
    let reply = match pb::LatestValuesRequest::decode(request.payload.as_ref()) {
        Ok(asked) => match latest_values(points, &asked.job_id).await {
            Ok(values) => pb::LatestValuesReply {
                values,
                error: String::new(),
            },
            Err(error) => {
                tracing::warn!(job_id = %asked.job_id, error = %error, "cannot read latest metric values");
                pb::LatestValuesReply {
                    values: HashMap::new(),
                    error: format!("cannot read the metric store: {error}"),
                }
            }
        },
        Err(error) => pb::LatestValuesReply {
            values: HashMap::new(),
            error: format!("the request is not a LatestValuesRequest: {error}"),
        },
    };
    if let Err(error) = nats.client.publish(reply_to, reply.encode_to_vec().into()).await {
        tracing::warn!(error = %error, "cannot send latest metric values");
    }
}

/// Each key's value at its highest step.
async fn latest_values(points: &dyn MetricStore, job_id: &str) -> crate::Result<HashMap<String, f64>> {
    let mut values = HashMap::new();
    for key in points.keys(job_id).await? {
        if let Some(point) = points.latest(job_id, &key).await? {
            values.insert(key, point.value);
        }
    }
    Ok(values)
}
