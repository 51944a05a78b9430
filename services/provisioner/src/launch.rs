//! Launch intents (docs/provisioner.md section 3): recorded before the create call, with the
//! call's answer recorded after it, and reconciled by tag when no answer was recorded.
//!
//! In order: insert the intent `planned`; CAS `planned → calling`; send the call with the
//! intent's id as its idempotency token and tag; CAS `calling → launched | failed` and record
//! the instances. A crash (or a lost answer) between the second and the last step leaves `calling`:
//! [`reconcile`] lists the cloud by the intent's tag and adopts what it finds, and past the
//! consistency horizon sends the very same call once more (same token: the cloud answers the
//! first call's result if it ran), so nothing is launched twice and nothing is left unrecorded.

use kiln_cloud::{Cloud, CloudError, CloudInstance, IntentId, LaunchIntent, Launched, TagSelector};
use kiln_core::store::cloud::{instance_state, intent_state};
use kiln_core::store::{InstanceRecord, IntentRecord, Store};

use crate::error::{Error, Result};

/// How a launch ended.
#[derive(Debug)]
pub enum Outcome {
    /// The answer: instances (possibly none) and per-offering failures.
    Answered(Launched),
    /// Sent, no answer: the reconciler settles it.
    Ambiguous,
}

/// Records the intent, sends it, records the answer.
pub async fn launch(
    store: &Store,
    cloud: &dyn Cloud,
    intent: &LaunchIntent,
    demand: &[String],
    boot_timeout_ms: i64,
    now_ms: i64,
) -> Result<Outcome> {
    let request = serde_json::to_string(intent).map_err(|e| Error::Corrupt(e.to_string()))?;
    let planned = IntentRecord {
        id: intent.id.to_string(),
        cluster: intent.cluster.clone(),
        pool: intent.pool.clone(),
        capacity: intent.capacity.as_str().into(),
        count: intent.count as i32,
        min_count: intent.min_count as i32,
        single_zone: intent.single_zone,
        request,
        demand: serde_json::to_string(demand).map_err(|e| Error::Corrupt(e.to_string()))?,
        state: intent_state::PLANNED.into(),
        version: 1,
        created_at_ms: now_ms,
        called_at_ms: 0,
        settled_at_ms: 0,
        failures: "[]".into(),
        attempts: 0,
    };
    store.insert_intent(planned.clone()).await?;
    let calling = IntentRecord {
        state: intent_state::CALLING.into(),
        version: 2,
        called_at_ms: now_ms,
        attempts: 1,
        ..planned
    };
    if !store.update_intent(&calling).await? {
        // Only this leader knows a planned intent it has just written; a new leader drops it.
        return Err(Error::Corrupt(format!(
            "intent {} moved while it was planned",
            intent.id
        )));
    }
    send(store, cloud, intent, calling, boot_timeout_ms, now_ms).await
}

/// Sends the intent's call and records the answer against `calling`.
async fn send(
    store: &Store,
    cloud: &dyn Cloud,
    intent: &LaunchIntent,
    calling: IntentRecord,
    boot_timeout_ms: i64,
    now_ms: i64,
) -> Result<Outcome> {
    match cloud.create(intent).await {
        Ok(launched) => {
            settle(
                store,
                &calling,
                &launched.instances,
                &launched.failures,
                boot_timeout_ms,
                now_ms,
            )
            .await?;
            Ok(Outcome::Answered(launched))
        }
        Err(CloudError::Ambiguous(message)) => {
            tracing::warn!(intent = %intent.id, pool = %intent.pool, message, "no answer to a create call; the reconciler will find its instances by tag");
            Ok(Outcome::Ambiguous)
        }
        Err(error) => {
            // The cloud answered with an error: nothing was made.
            let failed = IntentRecord {
                state: intent_state::FAILED.into(),
                version: calling.version + 1,
                settled_at_ms: now_ms,
                failures: serde_json::to_string(&[error.to_string()]).unwrap_or_default(),
                ..calling
            };
            store.update_intent(&failed).await?;
            Err(Error::Cloud {
                pool: intent.pool.clone(),
                source: error,
            })
        }
    }
}

/// Records `instances` (kept once if already adopted) and moves the intent to launched or failed.
async fn settle(
    store: &Store,
    calling: &IntentRecord,
    instances: &[CloudInstance],
    failures: &[kiln_cloud::OfferingFailure],
    boot_timeout_ms: i64,
    now_ms: i64,
) -> Result<()> {
    let rows = instances
        .iter()
        .map(|instance| record_of(calling, instance, boot_timeout_ms, now_ms))
        .collect();
    store.insert_instances(rows).await?;
    let settled = IntentRecord {
        state: if instances.is_empty() {
            intent_state::FAILED
        } else {
            intent_state::LAUNCHED
        }
        .into(),
        version: calling.version + 1,
        settled_at_ms: now_ms,
        failures: serde_json::to_string(failures).map_err(|e| Error::Corrupt(e.to_string()))?,
        ..calling.clone()
    };
    // Lost to a racing reconciler: it recorded the same instances.
    store.update_intent(&settled).await?;
    Ok(())
}

/// The record of an instance the cloud made for `intent`.
pub fn record_of(intent: &IntentRecord, instance: &CloudInstance, boot_timeout_ms: i64, now_ms: i64) -> InstanceRecord {
    let price = serde_json::from_str::<LaunchIntent>(&intent.request)
        .ok()
        .and_then(|request| {
            request
                .candidates
                .into_iter()
                .find(|candidate| candidate.key == instance.key)
                .map(|candidate| candidate.price_per_hour)
        })
        .unwrap_or(0.0);
    InstanceRecord {
        instance_id: instance.id.0.clone(),
        cluster: intent.cluster.clone(),
        intent_id: intent.id.clone(),
        pool: intent.pool.clone(),
        instance_type: instance.key.instance_type.clone(),
        zone: instance.key.zone.clone(),
        capacity: instance.key.capacity.as_str().into(),
        price_per_hour: price,
        state: instance_state::BOOTING.into(),
        version: 1,
        launched_at_ms: now_ms,
        boot_deadline_ms: now_ms + boot_timeout_ms,
        runner_id: String::new(),
        registered_at_ms: 0,
        cordoned_at_ms: 0,
        released_at_ms: 0,
        reason: String::new(),
    }
}

/// What reconciling one cluster's open intents did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Reconciled {
    pub dropped: usize,
    pub adopted: usize,
    pub resent: usize,
    pub failed: usize,
}

/// Settles the intents a crash or a lost answer left open: `planned` ones are dropped (no call
/// was sent; their demand is planned again), `calling` ones adopt the instances tagged with
/// their id, and past `horizon_ms` without any are sent once more, then failed.
pub async fn reconcile(
    store: &Store,
    cloud_of: &(dyn Fn(&str) -> Option<std::sync::Arc<dyn Cloud>> + Sync),
    cluster: &str,
    boot_timeout_of: &(dyn Fn(&str) -> i64 + Sync),
    horizon_ms: i64,
    now_ms: i64,
) -> Result<Reconciled> {
    let mut done = Reconciled::default();
    for open in store
        .intents(cluster, &[intent_state::PLANNED, intent_state::CALLING])
        .await?
    {
        if open.state == intent_state::PLANNED {
            let dropped = IntentRecord {
                state: intent_state::DROPPED.into(),
                version: open.version + 1,
                settled_at_ms: now_ms,
                ..open
            };
            if store.update_intent(&dropped).await? {
                done.dropped += 1;
            }
            continue;
        }
        let Some(cloud) = cloud_of(&open.pool) else {
            continue;
        };
        let Some(id) = IntentId::parse(&open.id) else {
            return Err(Error::Corrupt(format!("intent id {:?}", open.id)));
        };
        let selector = TagSelector {
            cluster: cluster.into(),
            pool: None,
            intent: Some(id),
            live_only: false,
        };
        let found = cloud.list(&selector).await.map_err(crate::error::in_pool(&open.pool))?;
        let boot_timeout_ms = boot_timeout_of(&open.pool);
        if !found.is_empty() {
            tracing::info!(intent = %open.id, pool = %open.pool, instances = found.len(), "adopting the instances of an unanswered call");
            done.adopted += found.len();
            settle(store, &open, &found, &[], boot_timeout_ms, now_ms).await?;
            continue;
        }
        if now_ms - open.called_at_ms < horizon_ms {
            continue;
        }
        if open.attempts < 2 {
            let intent: LaunchIntent =
                serde_json::from_str(&open.request).map_err(|e| Error::Corrupt(e.to_string()))?;
            let resending = IntentRecord {
                version: open.version + 1,
                attempts: open.attempts + 1,
                called_at_ms: now_ms,
                ..open
            };
            if store.update_intent(&resending).await? {
                tracing::info!(intent = %resending.id, pool = %resending.pool, "no instance found past the horizon; sending the same call once more");
                done.resent += 1;
                // An error here is recorded on the intent; the cycle goes on.
                let _ = send(store, cloud.as_ref(), &intent, resending, boot_timeout_ms, now_ms).await;
            }
            continue;
        }
        let failed = IntentRecord {
            state: intent_state::FAILED.into(),
            version: open.version + 1,
            settled_at_ms: now_ms,
            failures: r#"["no instance carries its tag after two calls"]"#.into(),
            ..open
        };
        if store.update_intent(&failed).await? {
            done.failed += 1;
        }
    }
    Ok(done)
}
