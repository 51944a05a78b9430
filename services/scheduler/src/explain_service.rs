//! Answers to `kiln explain`: the leader says why a queued job waits, from the same reading of
//! the state its pass decides from ([`input::read_as_leader`]: its own configuration, its
//! learnt preemption rates and budgets, the victims it ordered), so an explanation never
//! contradicts what the scheduler does. The api asks over NATS request/reply on
//! [`subjects::SCHEDULER_EXPLAIN`]; only the leader subscribes, so a standby stays silent and a
//! request finds no responder while nobody leads.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kiln_core::store::Store;
use kiln_core::streams::{Nats, NatsError};
use kiln_core::subjects;
use kiln_proto::v1 as pb;
use kiln_proto::v1::explain_reply::Outcome;
use prost::Message;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::error::Result;
use crate::input::{self, Read};
use crate::policy::{self, MarketPolicy, Plan};
use crate::state::PassState;

/// What the answers read from: the scheduler's own parts, shared with its pass.
#[derive(Clone)]
pub struct Explainer {
    pub config: Config,
    pub store: Store,
    pub nats: Nats,
    pub state: Arc<Mutex<PassState>>,
}

impl Explainer {
    /// Answers explain requests whenever `leading` says this scheduler leads, until `shutdown`.
    pub async fn serve(self, mut leading: watch::Receiver<bool>, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                led = until(&mut leading, true) => if !led { return },
            }
            if let Err(error) = self.answer_while_leading(&mut leading, &shutdown).await {
                tracing::warn!(error = %error, "explain subscription failed; subscribing again");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
            // The scheduler is gone (a crash drops its side of `leading`): answer no more.
            if leading.has_changed().is_err() {
                return;
            }
        }
    }

    /// Subscribes, and answers one request at a time until leadership or the service ends.
    async fn answer_while_leading(
        &self,
        leading: &mut watch::Receiver<bool>,
        shutdown: &CancellationToken,
    ) -> Result<(), NatsError> {
        let other = |e: &dyn std::fmt::Display| NatsError::Other(format!("{}: {e}", subjects::SCHEDULER_EXPLAIN));
        let mut requests = self
            .nats
            .client
            .subscribe(subjects::SCHEDULER_EXPLAIN)
            .await
            .map_err(|e| other(&e))?;
        tracing::info!("answering explain requests");
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = until(leading, false) => break,
                request = requests.next() => {
                    let Some(request) = request else { return Err(other(&"subscription ended")) };
                    // Leadership may have ended since the last change was seen.
                    if *leading.borrow() {
                        self.answer(request).await;
                    }
                }
            }
        }
        requests.unsubscribe().await.map_err(|e| other(&e))?;
        Ok(())
    }

    async fn answer(&self, request: async_nats::Message) {
        let Some(reply_to) = request.reply else {
            return;
        };
        let outcome = match pb::ExplainRequest::decode(request.payload.as_ref()) {
            Ok(asked) => match self.explain(&asked.job_id).await {
                Ok(explanation) => Outcome::Explanation(explanation),
                Err(error) => {
                    tracing::warn!(job_id = %asked.job_id, error = %error, "cannot explain a job");
                    Outcome::Error(format!("cannot read the scheduling state: {error}"))
                }
            },
            Err(error) => Outcome::Error(format!("the request is not an ExplainRequest: {error}")),
        };
        let body = pb::ExplainReply { outcome: Some(outcome) }.encode_to_vec();
        if let Err(error) = self.nats.client.publish(reply_to, body.into()).await {
            tracing::warn!(error = %error, "cannot send an explanation");
        }
    }

    /// What the next pass decides about queued job `job_id`, as `kiln explain` shows it.
    pub async fn explain(&self, job_id: &str) -> Result<pb::Explanation> {
        let read = input::read_as_leader(&self.config, &self.store, &self.nats, &self.state).await?;
        let mut explanation = pb::Explanation {
            job_id: job_id.to_string(),
            state: pb::JobState::Queued as i32,
            ..Default::default()
        };
        let Some(index) = read.queued.iter().position(|queued| queued.id == job_id) else {
            explanation.summary = "it left the queue while this was being read; ask again".into();
            return Ok(explanation);
        };
        let plan = policy::plan(&read.input);
        describe(&read, &plan, index, &mut explanation);
        if let Some(policy::JobWait {
            reason: policy::Wait::Provisioning { pools } | policy::Wait::Gang { pools, .. },
            ..
        }) = plan.wait_of(index)
        {
            let statuses = kiln_core::provisioning::statuses(&self.nats).await?;
            let said = provisioning(&statuses, job_id, pools);
            if let Some(first) = said.first() {
                explanation.summary = format!("{}: {first}", explanation.summary);
            }
            explanation.details.extend(said);
        }
        Ok(explanation)
    }
}

/// What the provisioner says about the job on `pools`: machines on their way for it, why it
/// holds it back, and which offerings it will not try for a while.
pub fn provisioning(statuses: &[kiln_core::provisioning::PoolStatus], job_id: &str, pools: &[String]) -> Vec<String> {
    let mut said = Vec::new();
    for status in statuses.iter().filter(|status| pools.contains(&status.pool)) {
        for launching in status.launching.iter().filter(|l| l.jobs.iter().any(|j| j == job_id)) {
            said.push(format!(
                "pool {}: launching {} {} machine{} for it (intent {})",
                status.pool,
                launching.instances,
                launching.capacity,
                if launching.instances == 1 { "" } else { "s" },
                launching.intent_id
            ));
        }
        for (_, why) in status.held_back.iter().filter(|(job, _)| job == job_id) {
            said.push(why.clone());
        }
        if !status.stopped.is_empty() {
            said.push(format!("pool {} launches nothing: {}", status.pool, status.stopped));
        }
        for unavailable in &status.unavailable {
            let minutes = ((unavailable.until_ms - kiln_core::ids::now_ms()) as f64 / 60_000.0)
                .ceil()
                .max(1.0);
            said.push(format!(
                "pool {}: {} unavailable for {minutes} min ({})",
                status.pool, unavailable.offering, unavailable.reason
            ));
        }
    }
    said
}

/// Waits until `leading` is `want`; false when the scheduler dropped its side.
async fn until(leading: &mut watch::Receiver<bool>, want: bool) -> bool {
    leading.wait_for(|leads| *leads == want).await.is_ok()
}

/// Fills in why `read.queued[index]` waits under `plan`, or where it starts, the market `auto`
/// gets on each pool offering spot, and each pool's free room.
fn describe(read: &Read, plan: &Plan, index: usize, explanation: &mut pb::Explanation) {
    let job = &read.queued[index];
    let pending = &read.input.pending[index];
    explanation.details.push(format!(
        "asks {} at priority {} ({}), market {}",
        pending.resources,
        job.priority_class,
        pending.priority,
        pending.market.as_str()
    ));
    match plan.wait_of(index) {
        Some(wait) => {
            explanation.summary = wait.to_string();
            explanation.jobs_ahead = u32::try_from(wait.ahead.total()).unwrap_or(u32::MAX);
            explanation.details.push(wait.ahead.to_string());
        }
        None => {
            let placement = plan.placements.iter().find(|placement| placement.job == index);
            explanation.summary = match placement {
                Some(placement) => format!(
                    "it starts at the scheduler's next pass, on pool {} ({})",
                    placement.pool, placement.market
                ),
                None => "it starts at the scheduler's next pass".into(),
            };
        }
    }
    let settings = &read.input.settings;
    for pool in &read.input.pools {
        if pending.market != MarketPolicy::Auto || !pool.spot_available || !pool.holds(&pending.resources) {
            continue;
        }
        let market = policy::choose_market(
            pending.market,
            pool,
            pending.preemptions,
            pending.expected_runtime_secs,
            settings,
        )
        .unwrap_or(policy::Market::OnDemand);
        let why = if pending.preemptions >= settings.max_spot_preemptions {
            format!(
                "it was preempted {} times (max-spot-preemptions {})",
                pending.preemptions, settings.max_spot_preemptions
            )
        } else {
            format!(
                "a spot restart is {:.0}% likely over its expected runtime at {:.2} preemptions per \
                 instance-hour (max-restart-probability {:.0}%)",
                100.0 * policy::restart_probability(pool.preemptions_per_hour, pending.expected_runtime_secs),
                pool.preemptions_per_hour,
                100.0 * settings.max_restart_probability
            )
        };
        explanation
            .details
            .push(format!("on pool {} it would run {market}: {why}", pool.name));
    }
    for pool in &read.input.pools {
        let held: policy::Resources = read
            .input
            .running
            .iter()
            .filter(|running| running.pool == pool.name)
            .map(|running| running.resources)
            .fold(policy::Resources::ZERO, |sum, r| sum + r);
        explanation.details.push(format!(
            "pool {}: {} of {} free",
            pool.name,
            (pool.capacity - held).clamp_negative(),
            pool.capacity
        ));
    }
}

#[cfg(test)]
mod tests {
    use kiln_core::provisioning::{Launching, PoolStatus, UnavailableOffering};

    use super::*;

    #[test]
    fn the_provisioners_word_on_a_job_is_named_per_pool() {
        let statuses = vec![
            PoolStatus {
                pool: "cpu".into(),
                launching: vec![Launching {
                    intent_id: "0193-a".into(),
                    capacity: "spot".into(),
                    instances: 2,
                    jobs: vec!["j1".into(), "j2".into()],
                }],
                unavailable: vec![UnavailableOffering {
                    offering: "spot c5.large in us-east-1a".into(),
                    reason: "no capacity".into(),
                    until_ms: kiln_core::ids::now_ms() + 90_000,
                }],
                ..PoolStatus::default()
            },
            PoolStatus {
                pool: "gpu".into(),
                held_back: vec![("j1".into(), "pool gpu at max-instances (2)".into())],
                ..PoolStatus::default()
            },
        ];
        let said = provisioning(&statuses, "j1", &["cpu".into(), "gpu".into()]);
        assert_eq!(
            said,
            [
                "pool cpu: launching 2 spot machines for it (intent 0193-a)",
                "pool cpu: spot c5.large in us-east-1a unavailable for 2 min (no capacity)",
                "pool gpu at max-instances (2)",
            ]
        );
        assert_eq!(
            provisioning(&statuses, "j1", &["gpu".into()]),
            ["pool gpu at max-instances (2)"]
        );
    }
}
