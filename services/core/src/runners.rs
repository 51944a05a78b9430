//! Runner liveness. Each runner holds a lease named by its id in the `kiln_runners` bucket (a
//! [`Lease`], renewed every third of its TTL) whose entry carries what the scheduling leader needs
//! to act for it once it is gone ([`RunnerLease`]): its pool, its `on-lost` policy and
//! `max-attempts`. Only runners with a live lease count: the leader ignores the capacity reports
//! of the others and ends or queues again the jobs they held, with [`lose_job`], the same code a
//! restarted runner uses for the jobs it finds it held.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::Error;
use crate::auth::Scope;
use crate::events::publish_job_change;
use crate::ids::now_ms;
use crate::lease::Lease;
use crate::state::JobState;
use crate::store::{Change, JobRecord, Store, StoreError};
use crate::streams::{Nats, NatsError};
use crate::subjects::BUCKET_RUNNERS;

/// What happens to a job whose runner went away while it ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnLost {
    /// The job ends LOST.
    Fail,
    /// The job is queued again as a new attempt, up to `max-attempts`, then ends LOST.
    Requeue,
}

/// A runner's policy for the jobs it loses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct LostPolicy {
    pub on_lost: OnLost,
    /// Attempts a job gets when `on_lost` is `Requeue`.
    pub max_attempts: i32,
}

impl LostPolicy {
    /// What is done for a runner whose lease is gone altogether: its jobs end LOST.
    pub const UNKNOWN: LostPolicy = LostPolicy {
        on_lost: OnLost::Fail,
        max_attempts: 1,
    };

    /// Tells whether a lost attempt of `job` is queued again (never when a stop was asked).
    pub fn requeues(&self, job: &JobRecord) -> bool {
        self.on_lost == OnLost::Requeue && job.attempt < self.max_attempts && !job.stop_requested
    }
}

/// What a runner's lease entry carries besides its holder and expiry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct RunnerLease {
    pub pool: String,
    #[serde(flatten)]
    pub lost: LostPolicy,
}

/// A runner's lease as it stands, live or expired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerEntry {
    pub expires_at_ms: i64,
    /// `None` when the entry does not say (a lease written by something else than a runner).
    pub lease: Option<RunnerLease>,
}

impl RunnerEntry {
    pub fn is_live(&self, now_ms: i64) -> bool {
        self.expires_at_ms >= now_ms
    }
}

/// The lease of runner `runner_id`, not yet taken: [`Lease::tick`] takes and renews it.
pub async fn lease(nats: &Nats, runner_id: &str, ttl: Duration, lease: &RunnerLease) -> Result<Lease, NatsError> {
    let data = serde_json::to_value(lease).map_err(|e| NatsError::Other(e.to_string()))?;
    Lease::in_bucket(nats, BUCKET_RUNNERS, runner_id, runner_id, ttl, Some(data)).await
}

/// Every runner lease by runner id, expired ones included.
pub async fn leases(nats: &Nats) -> Result<HashMap<String, RunnerEntry>, NatsError> {
    let entries = Lease::all(nats, BUCKET_RUNNERS).await?;
    Ok(entries
        .into_iter()
        .map(|(runner_id, holder)| {
            let entry = RunnerEntry {
                expires_at_ms: holder.expires_at_ms,
                lease: holder.data.and_then(|data| serde_json::from_value(data).ok()),
            };
            (runner_id, entry)
        })
        .collect())
}

/// The ids of the runners whose lease is live now.
pub async fn live(nats: &Nats) -> Result<HashSet<String>, NatsError> {
    let now = now_ms();
    Ok(leases(nats)
        .await?
        .into_iter()
        .filter(|(_, entry)| entry.is_live(now))
        .map(|(runner_id, _)| runner_id)
        .collect())
}

/// Ends a job whose runner went away: LOST, or queued again as its next attempt when `policy`
/// says so, resuming like a preempted job from the outputs synced so far (`resume_from` names
/// them; a caller that can sync what the attempt left does so first). A compare-and-set on the
/// version read: returns `None` when the job changed since (its runner is back, or someone else
/// ended it), else the committed record, published (a failed publish is re-driven by the
/// reconcilers). An ended job's tokens are revoked.
pub async fn lose_job(
    nats: &Nats,
    store: &Store,
    job: &JobRecord,
    policy: LostPolicy,
    why: &str,
) -> Result<Option<JobRecord>, Error> {
    let (state, change) = if policy.requeues(job) {
        let change = Change {
            reason: Some(format!("{why}; queued again")),
            next_attempt: true,
            resume_from: Some(crate::objects::outputs_prefix(&job.id).to_string()),
            ..Change::default()
        };
        (JobState::Queued, change)
    } else {
        let change = Change {
            reason: Some(why.to_string()),
            ..Change::default()
        };
        (JobState::Lost, change)
    };
    let changed = match store.transition(job, state, change).await {
        Ok(changed) => changed,
        Err(StoreError::Conflict { .. }) => return Ok(None),
        Err(error) => return Err(error.into()),
    };
    tracing::warn!(job_id = %changed.id, state = %changed.state, attempt = job.attempt, why, "job lost its runner");
    if let Err(error) = publish_job_change(nats, store, &changed).await {
        tracing::warn!(job_id = %changed.id, error = %error, "publish failed; the reconciler will retry");
    }
    // A queued job's next attempt gets a token of its own and revokes the job's tokens when it ends.
    if state == JobState::Lost
        && let Err(error) = store.revoke_tokens(&Scope::Job(changed.id.clone())).await
    {
        tracing::warn!(job_id = %changed.id, error = %error, "cannot revoke the job's tokens");
    }
    Ok(Some(changed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runner_lease_reads_in_kebab_case() {
        let lease = RunnerLease {
            pool: "gpu".into(),
            lost: LostPolicy {
                on_lost: OnLost::Requeue,
                max_attempts: 3,
            },
        };
        let json = serde_json::to_value(&lease).expect("json");
        assert_eq!(
            json,
            serde_json::json!({"pool": "gpu", "on-lost": "requeue", "max-attempts": 3})
        );
        assert_eq!(serde_json::from_value::<RunnerLease>(json).expect("back"), lease);
    }
}
