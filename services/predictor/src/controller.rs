//! The controller: the predictor replica holding the `predictor-controller` lease keeps every
//! running service's workers as its record says, on each pass (every `control-interval-ms`,
//! and at once after a change through `ServeService`):
//!
//! - each member of the serving revision, and of the latest while it is ahead, has the live
//!   worker jobs the [`autoscale`](crate::autoscale)r wants (its fixed `replicas` when the
//!   service does not autoscale): a worker that failed, was lost or stopped is replaced (a
//!   preempted one is queued again by the scheduler and still counts); surplus ones are
//!   stopped, those not started first. The latest revision has at least one worker per member
//!   (so it can be ready), and during a roll as many as the serving member it replaces;
//! - a roll switches once every member of the latest revision answers a readiness probe (its
//!   relay is in rotation, so its worker loaded the model): the latest revision's live
//!   definition is published to `kiln_services` and recorded as serving, and the old
//!   revision's workers are stopped [`ROLL_GRACE`] later, when every predictor has switched;
//! - a latest revision tried with part of the traffic, or in shadow, is published as the
//!   serving definition's [`Split`] while it is ready, and left out while it is not;
//! - a stopped service's definition is removed from `kiln_services` and its workers stopped;
//! - a service whose owner may no longer run jobs (disabled, or no longer a member or
//!   maintainer of its project: [`kiln_core::store::Store::check_owner`], made again by every
//!   worker insert) is paused: stopped, with the reason in its status, like a stopped service.
//!
//! Workers are ordinary jobs (quotas, fair share and markets apply) whose environment names
//! the service, revision, member and model version ([`kiln_core::serving`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kiln_core::events::{publish_job_change, stop_job};
use kiln_core::ids::now_ms;
use kiln_core::lease::Lease;
use kiln_core::scheduling::MarketPolicy;
use kiln_core::serving::{ENV_MEMBER, ENV_MODEL, ENV_REVISION, ENV_SERVICE, ServiceSpec, Split};
use kiln_core::store::{JobRecord, NewJob, paused_reason};
use kiln_core::{JobState, subjects};
use tokio_util::sync::CancellationToken;

use crate::manage::workers_of;
use crate::record::{RUNNING, ServiceRecord};
use crate::revision::Revision;
use crate::{Error, Result, Shared};

/// How long after a roll switched the old revision's workers keep serving, for predictors
/// that have not read the switch yet.
pub const ROLL_GRACE: Duration = Duration::from_secs(3);

/// How long a readiness probe waits for a member's relay.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// What the predictors answer `record`'s service with at `revision`, without a split.
pub fn live(record: &ServiceRecord, revision: &Revision) -> ServiceSpec {
    let mut spec = revision.live(&record.name, &record.project);
    spec.cold_wait_ms = record.scaling().cold_wait_ms;
    spec
}

/// Writes `spec` as the live definition of its service (under its
/// [`kiln_core::serving::service_key`]), unless it is that already.
pub async fn publish(shared: &Shared, spec: &ServiceSpec) -> Result<()> {
    if shared
        .catalog
        .get(&spec.project, &spec.name)
        .await
        .ok()
        .flatten()
        .is_some_and(|current| *current == *spec)
    {
        return Ok(());
    }
    let value = serde_json::to_vec(spec).map_err(|error| Error::Internal(error.to_string()))?;
    shared
        .catalog
        .bucket()
        .put(spec.key(), value.into())
        .await
        .map_err(|error| Error::Unavailable(format!("cannot publish service {}: {error}", spec.qualified())))?;
    Ok(())
}

/// Removes the live definition of the service of `key` ([`ServiceRecord::key`]): the
/// predictors stop answering for it.
pub async fn forget(shared: &Shared, key: &str) -> Result<()> {
    shared
        .catalog
        .bucket()
        .delete(key)
        .await
        .map_err(|error| Error::Unavailable(format!("cannot remove service {key}: {error}")))?;
    Ok(())
}

/// Runs the controller until `shutdown`: a lease loop, passes while it holds the lease.
pub async fn run(shared: Arc<Shared>, shutdown: CancellationToken) {
    let name = format!("predictor-{}", kiln_core::ids::new_id());
    let ttl = Duration::from_millis(shared.config.lease_ttl_ms);
    let mut lease = loop {
        match Lease::new(&shared.nats, subjects::LEASE_PREDICTOR_CONTROLLER, &name, ttl).await {
            Ok(lease) => break lease,
            Err(error) => tracing::warn!(error = %error, "cannot open the controller lease; retrying"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    };
    let interval = Duration::from_millis(shared.config.control_interval_ms);
    let renew_every = ttl / 3;
    let mut last_tick: Option<tokio::time::Instant> = None;
    // Definitions written before names were per project go once a pass has written the
    // running services' under their new keys.
    let mut legacy_left = true;
    while !shutdown.is_cancelled() {
        if last_tick.is_none_or(|at| at.elapsed() >= renew_every) {
            last_tick = Some(tokio::time::Instant::now());
            if let Err(error) = lease.tick().await {
                tracing::warn!(error = %error, "cannot reach the controller lease; not controlling");
            }
        }
        if lease.is_held() {
            match pass(&shared).await {
                Err(error) => tracing::warn!(error = %error, "control pass failed"),
                Ok(()) if legacy_left => match shared.catalog.delete_legacy().await {
                    Ok(deleted) => {
                        legacy_left = false;
                        if deleted > 0 {
                            tracing::info!(deleted, "deleted the service definitions of global names");
                        }
                    }
                    Err(error) => {
                        tracing::warn!(error = %error, "cannot delete the service definitions of global names")
                    }
                },
                Ok(()) => {}
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = tokio::time::sleep(interval.min(renew_every)) => {}
            _ = shared.wake.notified() => {}
        }
    }
    if let Err(error) = lease.release().await {
        tracing::warn!(error = %error, "cannot release the controller lease; a standby takes over when it expires");
    }
}

/// One look at every service.
pub async fn pass(shared: &Shared) -> Result<()> {
    let mut kept = Vec::new();
    for record in shared.services.list(&kiln_core::authz::Visible::All, true).await? {
        if record.state == RUNNING {
            // Its workers' states and its recent traffic change without a write of its own.
            shared.services.touch(&record.id);
            kept.push((record.key(), record.revision as u64));
            kept.push((record.key(), record.latest_revision as u64));
            let tended = match shared.store.check_owner(&record.owner_id, &record.project).await {
                Ok(()) => tend(shared, &record).await,
                Err(error) => Err(error.into()),
            };
            match tended {
                Err(error) if error.owner_revoked().is_some() => pause(shared, &record, &error).await?,
                tended => tended?,
            }
        } else {
            let workers = shared.store.live_service_workers(&record.id).await?;
            {
                let mut draining = shared.draining.lock().expect("draining");
                // Told while it has workers, and once more after the last has ended.
                if draining.remove(&record.id) || !workers.is_empty() {
                    shared.services.touch(&record.id);
                }
                if !workers.is_empty() {
                    draining.insert(record.id.clone());
                }
            }
            stop_all(shared, workers, "the service was stopped").await?;
        }
    }
    shared.autoscaler.retain(&kept);
    Ok(())
}

/// Pauses a running service whose owner may no longer run jobs (`error` says why): it is
/// stopped with the reason, its definition removed from `kiln_services` and its workers stopped.
async fn pause(shared: &Shared, record: &ServiceRecord, error: &Error) -> Result<()> {
    let reason = paused_reason(error.owner_revoked().unwrap_or("its owner may no longer run jobs"));
    if shared.services.pause(&record.id, &reason).await? {
        tracing::warn!(service = %record.name, project = %record.project, reason = %reason, "service paused: its owner may no longer run jobs");
    }
    forget(shared, &record.key()).await?;
    let workers = shared.store.live_service_workers(&record.id).await?;
    stop_all(shared, workers, &reason).await
}

async fn tend(shared: &Shared, record: &ServiceRecord) -> Result<()> {
    let serving = shared.services.revision(&record.id, record.revision).await?;
    let mut spec = live(record, &serving);
    let mut wanted = vec![(serving, 0)];
    if record.latest_revision > record.revision {
        let latest = shared.services.revision(&record.id, record.latest_revision).await?;
        let rollout = record.rollout();
        if ready(shared, record, &latest).await {
            if rollout.rolls() {
                spec = live(record, &latest);
                publish(shared, &spec).await?;
                if shared
                    .services
                    .serve_revision(&record.id, record.latest_revision)
                    .await?
                {
                    tracing::info!(service = %record.name, revision = latest.revision, "service now serves its latest revision");
                }
            } else {
                spec.split = Some(Split {
                    spec: Box::new(live(record, &latest)),
                    traffic: rollout.traffic,
                    shadow: rollout.shadow,
                });
            }
        }
        // During a roll its members get the capacity of the ones they replace.
        wanted.push((latest, if rollout.rolls() { u32::MAX } else { 1 }));
    }
    publish(shared, &spec).await?;
    // The old revision's workers serve on through the grace after a switch.
    keep(shared, record, &wanted).await
}

/// Keeps the wanted workers for every member of `revisions` (each with the fewest its members
/// get: `u32::MAX` for as many as the serving revision's member of that name), and none for
/// any other revision.
async fn keep(shared: &Shared, record: &ServiceRecord, revisions: &[(Revision, u32)]) -> Result<()> {
    let workers = shared.store.live_service_workers(&record.id).await?;
    let scaling = record.scaling();
    let in_grace = now_ms() - record.updated_at_ms < ROLL_GRACE.as_millis() as i64;
    let mut kept: Vec<&str> = Vec::new();
    let mut counts: BTreeMap<&str, u32> = BTreeMap::new();
    for (revision, floor) in revisions {
        for member in &revision.members {
            let live: Vec<&JobRecord> = workers_of(&workers, revision.revision, &member.name)
                .filter(|job| !job.stop_requested)
                .collect();
            kept.extend(live.iter().map(|job| job.id.as_str()));
            let floor = match *floor {
                u32::MAX => counts.get(member.name.as_str()).copied().unwrap_or(1).max(1),
                floor => floor,
            };
            let replicas = shared.autoscaler.wanted(
                &record.key(),
                revision.revision,
                &member.name,
                &scaling,
                live.len() as u32,
                floor,
            );
            counts.entry(member.name.as_str()).or_insert(replicas);
            let replicas = replicas as usize;
            for _ in live.len()..replicas {
                submit(shared, record, revision, &member.name, &member.model_version()).await?;
            }
            if live.len() > replicas {
                let surplus: Vec<JobRecord> = unstarted_first(&live).into_iter().take(live.len() - replicas).collect();
                let reason = if scaling.autoscaled() {
                    "not needed: the member's load went down"
                } else {
                    "not needed: the service was scaled down"
                };
                stop_all(shared, surplus, reason).await?;
            }
        }
    }
    if in_grace {
        return Ok(());
    }
    let others: Vec<JobRecord> = workers
        .iter()
        .filter(|job| !kept.contains(&job.id.as_str()))
        .cloned()
        .collect();
    stop_all(shared, others, "not needed: the service serves another revision").await
}

fn unstarted_first(live: &[&JobRecord]) -> Vec<JobRecord> {
    let mut ordered: Vec<JobRecord> = live.iter().rev().map(|job| (*job).clone()).collect();
    ordered.sort_by_key(|job| !matches!(job.state(), Ok(JobState::Queued)));
    ordered
}

async fn stop_all(shared: &Shared, workers: Vec<JobRecord>, reason: &str) -> Result<()> {
    for job in workers {
        if job.stop_requested {
            continue;
        }
        tracing::info!(job_id = %job.id, reason, "stopping a service worker");
        stop_job(&shared.nats, &shared.store, job, reason).await?;
    }
    Ok(())
}

/// Whether every member of `revision` has a worker in rotation.
async fn ready(shared: &Shared, record: &ServiceRecord, revision: &Revision) -> bool {
    let spec = live(record, revision);
    crate::fanout::ready_members(&shared.nats.client, &spec, PROBE_TIMEOUT).await == spec.members.len()
}

async fn submit(shared: &Shared, record: &ServiceRecord, revision: &Revision, member: &str, model: &str) -> Result<()> {
    let worker = &revision.worker;
    let mut env: BTreeMap<String, String> = worker.env.clone();
    env.insert(ENV_SERVICE.into(), record.name.clone());
    env.insert(ENV_REVISION.into(), revision.revision.to_string());
    env.insert(ENV_MEMBER.into(), member.to_string());
    env.insert(ENV_MODEL.into(), model.to_string());
    // Only while the owner may still run jobs here (else `OwnerRevoked`: the service pauses).
    let job = shared
        .store
        .insert_controller_job(NewJob {
            owner_id: record.owner_id.clone(),
            project: record.project.clone(),
            name: format!("{}-{member}-r{}", record.name, revision.revision),
            command: worker.command.clone(),
            env,
            cpu_millis: worker.cpu_millis,
            memory_bytes: worker.memory_bytes,
            disk_bytes: worker.disk_bytes,
            shm_bytes: worker.shm_bytes,
            code_digest: worker.code_digest.clone(),
            image: worker.image.clone(),
            gpus: worker.gpus,
            priority_class: worker.priority_class.clone(),
            market_policy: MarketPolicy::parse(&worker.market),
            requested_pool: worker.pool.clone(),
            secrets: worker.secrets.clone(),
            service_id: record.id.clone(),
            ..NewJob::default()
        })
        .await?;
    tracing::info!(service = %record.name, member, revision = revision.revision, job_id = %job.id, "worker asked for");
    if let Err(error) = publish_job_change(&shared.nats, &shared.store, &job).await {
        tracing::warn!(job_id = %job.id, error = %error, "publish failed; the reconciler will retry");
    }
    Ok(())
}
