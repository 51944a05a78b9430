//! What a pass decides from, read from the store and the capacity bucket, in the policy's
//! terms: queued jobs, the jobs that hold capacity, pools, quotas, weights. The leader's answers
//! to `kiln explain` read it the same way ([`read_as_leader`]), so an explanation is what its
//! next pass decides.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use kiln_core::capacity::{self, CapacityReport, PoolCapacity};
use kiln_core::provisioning::{self, PoolStatus};
use kiln_core::scheduling::{MarketPolicy, QuotaScope, class_of_priority};
use kiln_core::store::{EXTERNAL_POOL, JobRecord, QuotaRecord, Store, node_state};
use kiln_core::streams::Nats;
use kiln_core::{JobState, quotas, scheduling};

use crate::Config;
use crate::error::Result;
use crate::policy::{Input, PendingJob, Pool, Resources, Runner, RunningJob, Settings, Weights};
use crate::state::PassState;

/// A pass's input, and the records of its pending jobs (`input.pending[i]` is `queued[i]`).
pub struct Read {
    pub input: Input,
    pub queued: Vec<JobRecord>,
}

fn resources(job: &JobRecord) -> Resources {
    Resources::new(job.cpu_millis, job.memory_bytes, i64::from(job.gpus)).with_disk(job.disk_bytes)
}

/// How long a node of an ended attempt may go without a heartbeat and still count as holding
/// its runner's room (it is stopping: SIGTERM and the grace period).
const STOPPING_NODE_MS: i64 = 30_000;

/// The nodes past rank 0 of the active gang jobs, each holding its job's resources on its
/// runner until it has ended, and the nodes of attempts that ended but are still stopping
/// (heard from lately). A gang is never a preemption's victim: stopping one node stops them
/// all, which a victim's accounting would not count.
async fn gang_nodes(store: &Store, active: &[JobRecord], name_of: &impl Fn(&str) -> String) -> Result<Vec<RunningJob>> {
    let mut gangs: Vec<JobRecord> = active.iter().filter(|job| job.nodes > 1).cloned().collect();
    let keys: Vec<(String, i32)> = gangs.iter().map(|job| (job.id.clone(), job.attempt)).collect();
    let mut rows = store.nodes_of(&keys).await?;
    let since = kiln_core::ids::now_ms() - STOPPING_NODE_MS;
    for row in store.stopping_nodes(since).await? {
        if keys
            .iter()
            .any(|(id, attempt)| *id == row.job_id && *attempt == row.attempt)
        {
            continue;
        }
        if !gangs.iter().any(|job| job.id == row.job_id)
            && let Ok(job) = store.job(&row.job_id).await
        {
            gangs.push(job);
        }
        rows.push(row);
    }
    Ok(rows
        .iter()
        .filter(|row| row.rank > 0 && row.state != node_state::EXITED && row.state != node_state::LOST)
        .filter_map(|row| {
            let job = gangs.iter().find(|job| job.id == row.job_id)?;
            Some(RunningJob {
                id: format!("{}/{}/node{}", job.id, row.attempt, row.rank),
                user: name_of(&job.owner_id),
                project: job.project.clone(),
                priority: job.priority,
                resources: resources(job),
                pool: job.pool.clone(),
                runner: row.runner_id.clone(),
                market: scheduling::Market::parse(&job.market).unwrap_or(scheduling::Market::OnDemand),
                started_at_ms: job.started_at_ms.unwrap_or(job.updated_at_ms),
                preemptible: false,
                stopping: job.stop_requested,
            })
        })
        .collect())
}

/// Reads the state; `rate_of` gives a pool's observed spot preemptions per instance-hour.
pub async fn read(store: &Store, nats: &Nats, settings: Settings, rate_of: impl Fn(&str) -> f64) -> Result<Read> {
    let queued = store.jobs_in_states(&[JobState::Queued]).await?;
    let active = store.jobs_in_states(&JobState::ACTIVE).await?;
    let names = store.user_names().await?;
    let name_of = |owner_id: &str| names.get(owner_id).cloned().unwrap_or_else(|| owner_id.to_string());
    let pending: Vec<PendingJob> = queued
        .iter()
        .map(|job| PendingJob {
            id: job.id.clone(),
            user: name_of(&job.owner_id),
            project: job.project.clone(),
            priority: job.priority,
            resources: resources(job),
            submitted_at_ms: job.created_at_ms,
            market: MarketPolicy::parse(&job.market_policy),
            preemptions: u32::try_from(job.preemptions).unwrap_or(0),
            expected_runtime_secs: job.max_runtime_secs as f64,
            pool: job.requested_pool.clone(),
            nodes: u32::try_from(job.nodes.max(1)).unwrap_or(1),
        })
        .collect();
    let mut running: Vec<RunningJob> = active
        .iter()
        .filter(|job| job.pool != EXTERNAL_POOL)
        .map(|job| RunningJob {
            id: job.id.clone(),
            user: name_of(&job.owner_id),
            project: job.project.clone(),
            priority: job.priority,
            resources: resources(job),
            pool: job.pool.clone(),
            runner: job.runner_id.clone(),
            market: scheduling::Market::parse(&job.market).unwrap_or(scheduling::Market::OnDemand),
            started_at_ms: job.started_at_ms.unwrap_or(job.updated_at_ms),
            // A class that may preempt others is not preempted itself, nor is a gang.
            preemptible: job.nodes <= 1 && !class_of_priority(job.priority).is_some_and(|class| class.may_preempt),
            stopping: job.stop_requested,
        })
        .collect();
    running.extend(gang_nodes(store, &active, &name_of).await?);
    // A runner the provisioner is releasing takes no new job, as one its instance cordoned.
    let released = store.released_runners().await?;
    let reports: Vec<CapacityReport> = capacity::runners(nats)
        .await?
        .into_iter()
        .map(|report| CapacityReport {
            cordoned: report.cordoned || released.contains(&report.runner_id),
            ..report
        })
        .collect();
    let statuses = provisioning::statuses(nats).await?;
    let mut pools = pools(&capacity::sum_by_pool(&reports), &rate_of);
    let mut runners = runners(&reports);
    with_provisioned(&mut pools, &mut runners, &statuses, &rate_of);
    let rows = store.quotas().await?;
    let members = pending
        .iter()
        .map(|job| (&job.project, &job.user))
        .chain(running.iter().map(|job| (&job.project, &job.user)));
    let weights = weights_of(&rows, members);
    let quotas = quotas::from_records(rows);
    Ok(Read {
        input: Input {
            pending,
            running,
            pools,
            runners,
            quotas,
            weights,
            settings,
        },
        queued,
    })
}

/// The pools the runners report, in the policy's terms.
pub fn pools(reported: &BTreeMap<String, PoolCapacity>, rate_of: &impl Fn(&str) -> f64) -> Vec<Pool> {
    reported
        .iter()
        .map(|(name, pool)| Pool {
            name: name.clone(),
            capacity: Resources::new(pool.cpu_millis, pool.memory_bytes, pool.gpus).with_disk(pool.disk_bytes),
            instance: Resources::new(pool.instance.cpu_millis, pool.instance.memory_bytes, pool.instance.gpus)
                .with_disk(pool.instance.disk_bytes),
            on_demand_per_hour: pool.on_demand_per_hour,
            spot_per_hour: pool.spot_per_hour,
            spot_available: pool.spot,
            preemptions_per_hour: rate_of(name),
        })
        .collect()
}

/// Adds the pools the provisioner can launch machines for: a job one of its machines could hold
/// is eligible for the pool even when no live runner holds it (it is the provisioner's demand),
/// and a pool with no live runner is still eligible (it scales from zero). Such a pool gets a
/// runner with no room, so nothing is placed on it until a real runner reports; its capacity
/// counts one machine of its largest offering. The provisioner's prices stand in where no runner
/// reported one.
pub fn with_provisioned(
    pools: &mut Vec<Pool>,
    runners: &mut Vec<Runner>,
    statuses: &[PoolStatus],
    rate_of: impl Fn(&str) -> f64,
) {
    let larger = |a: Resources, b: Resources| {
        Resources::new(
            a.cpu_millis.max(b.cpu_millis),
            a.memory_bytes.max(b.memory_bytes),
            a.gpus.max(b.gpus),
        )
        .with_disk(a.disk_bytes.max(b.disk_bytes))
    };
    for status in statuses {
        // Disk too: a pool whose machines' volumes are sized for jobs' disks holds `--disk` jobs.
        let largest = Resources::new(
            status.largest.cpu_millis,
            status.largest.memory_bytes,
            status.largest.gpus,
        )
        .with_disk(status.largest.disk_bytes);
        if largest == Resources::ZERO {
            continue;
        }
        match pools.iter_mut().find(|pool| pool.name == status.pool) {
            Some(pool) => {
                pool.instance = larger(pool.instance, largest);
                pool.capacity = larger(pool.capacity, largest);
                pool.spot_available |= status.spot_offered;
                if pool.on_demand_per_hour == 0.0 {
                    pool.on_demand_per_hour = status.on_demand_per_hour;
                }
                if pool.spot_per_hour == 0.0 {
                    pool.spot_per_hour = status.spot_per_hour;
                }
            }
            None => {
                pools.push(Pool {
                    name: status.pool.clone(),
                    capacity: largest,
                    instance: largest,
                    on_demand_per_hour: status.on_demand_per_hour,
                    spot_per_hour: status.spot_per_hour,
                    spot_available: status.spot_offered,
                    preemptions_per_hour: rate_of(&status.pool),
                });
                runners.push(Runner {
                    id: format!("(launching for {})", status.pool),
                    pool: status.pool.clone(),
                    capacity: Resources::ZERO,
                    instance: Resources::ZERO,
                    cordoned: true,
                    spot_offering: None,
                });
            }
        }
    }
}

/// The live runners, each with its own capacity, in the policy's terms.
pub fn runners(reports: &[CapacityReport]) -> Vec<Runner> {
    reports
        .iter()
        .map(|report| {
            let instance = report.largest_job();
            Runner {
                id: report.runner_id.clone(),
                pool: report.pool.clone(),
                capacity: Resources::new(report.cpu_millis, report.memory_bytes, report.gpus)
                    .with_disk(report.disk_bytes),
                instance: Resources::new(instance.cpu_millis, instance.memory_bytes, instance.gpus)
                    .with_disk(instance.disk_bytes),
                cordoned: report.cordoned,
                spot_offering: match (&report.market, &report.instance_type, &report.zone) {
                    (Some(market), Some(instance_type), Some(zone)) if market == "spot" => {
                        Some(format!("{instance_type}/{zone}"))
                    }
                    _ => None,
                },
            }
        })
        .collect()
}

/// The fair-share weights of the rows' scopes: a project's, and a user's in each project where
/// `members` (project, user) shows them (a user's weight counts in every project they work in).
fn weights_of<'a>(rows: &[QuotaRecord], members: impl Iterator<Item = (&'a String, &'a String)>) -> Weights {
    let mut weights = Weights::default();
    let mut users = HashMap::new();
    for row in rows {
        let Some(weight) = row.weight else { continue };
        match QuotaScope::parse(&row.scope) {
            Ok(QuotaScope::Project(project)) => {
                weights.projects.insert(project, weight);
            }
            Ok(QuotaScope::User(user)) => {
                users.insert(user, weight);
            }
            Ok(QuotaScope::Global) | Err(_) => {}
        }
    }
    for (project, user) in members {
        if let Some(weight) = users.get(user) {
            weights.users.insert((project.clone(), user.clone()), *weight);
        }
    }
    weights
}

/// The settings of a pass from the scheduler's configuration. The fair-share preemption budget
/// is a full bucket; the leader's pass sets it from its own bucket.
pub fn settings(config: &Config, preemption_budget: usize) -> Settings {
    Settings {
        max_restart_probability: config.max_restart_probability,
        max_spot_preemptions: config.max_spot_preemptions,
        preemption_budget,
        preempting_priorities: scheduling::PRIORITY_CLASSES
            .iter()
            .filter(|class| class.may_preempt)
            .map(|class| class.value)
            .collect(),
        reservations: true,
        fair_share_preemption: config.fair_share_preemption,
        fair_share_preemption_budget: usize::try_from(config.fair_share_preemptions_per_minute).unwrap_or(0),
        yield_within_project: config.yield_within_project,
        order: config.order,
    }
}

/// What the leader's pass decides from, now: the state, with the leader's preemption budgets,
/// its pools' learnt preemption rates, and the victims it ordered counted as stopping. The pass
/// and the answers to `kiln explain` both read through here, so they cannot disagree.
pub async fn read_as_leader(config: &Config, store: &Store, nats: &Nats, state: &Mutex<PassState>) -> Result<Read> {
    let ((budget, fair_share_budget), rates) = {
        let mut pass_state = state.lock().expect("pass state lock");
        (pass_state.budgets(), pass_state.rates_per_hour())
    };
    let mut pass_settings = settings(config, budget);
    pass_settings.fair_share_preemption_budget = fair_share_budget;
    let mut state_read = read(store, nats, pass_settings, |pool| {
        rates.get(pool).copied().unwrap_or(0.0)
    })
    .await?;
    state
        .lock()
        .expect("pass state lock")
        .observe_running(&mut state_read.input.running, &state_read.input.runners);
    Ok(state_read)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(scope: &str, weight: Option<f64>) -> QuotaRecord {
        QuotaRecord {
            scope: scope.into(),
            cpu_millis: None,
            memory_bytes: None,
            gpus: Some(4),
            running_jobs: None,
            queued_jobs: None,
            updated_at_ms: 0,
            weight,
        }
    }

    #[test]
    fn weights_come_from_the_scopes_rows_and_a_users_counts_in_each_of_their_projects() {
        let rows = [
            row("project:vision", Some(2.0)),
            row("user:alice", Some(3.0)),
            row("user:bob", None),
            row("global", None),
        ];
        let (vision, nlp, alice, bob) = (
            "vision".to_string(),
            "nlp".to_string(),
            "alice".to_string(),
            "bob".to_string(),
        );
        let members = [(&vision, &alice), (&nlp, &alice), (&vision, &bob)];
        let weights = weights_of(&rows, members.into_iter());
        assert_eq!((weights.project("vision"), weights.project("nlp")), (2.0, 1.0));
        assert_eq!(
            (
                weights.user("vision", "alice"),
                weights.user("nlp", "alice"),
                weights.user("vision", "bob")
            ),
            (3.0, 3.0, 1.0)
        );
        // Limits still come through, weight or not.
        assert_eq!(quotas::from_records(rows.to_vec()).len(), 4);
    }
}
