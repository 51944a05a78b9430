//! Jobs: insert, read, and compare-and-set state transitions.

use std::collections::BTreeMap;

use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect};

use super::entities::job::{self, Column, Entity as Jobs};
use super::{JobRecord, Store, StoreError, StoreResult};
use crate::ids::now_ms;
use crate::scheduling::{Market, MarketPolicy};
use crate::state::JobState;

mod holding;
mod publication;
mod record;

pub use holding::JobHold;
pub(super) use record::new_record;

/// What a submit records.
#[derive(Debug, Clone, Default)]
pub struct NewJob {
    pub owner_id: String,
    pub project: String,
    pub name: String,
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    /// The job's own disk (`--disk`) and /dev/shm size (`--shm`) in bytes; 0 for none.
    pub disk_bytes: i64,
    pub shm_bytes: i64,
    /// Nodes of a gang job (`--nodes`); 0 and 1 mean one.
    pub nodes: i32,
    pub code_digest: String,
    pub image: String,
    pub gpus: i32,
    pub max_runtime_secs: i64,
    pub datasets: Vec<String>,
    /// The batch this job works for (a kiln-agent worker); empty for other jobs.
    pub batch_id: String,
    /// A priority class name (checked by the caller); empty is `normal`.
    pub priority_class: String,
    pub market_policy: MarketPolicy,
    /// The client's idempotency key (empty for none): a second submit with the same key by
    /// the same owner finds the first job instead of making another.
    pub submit_key: String,
    /// The one pool the job may run on; empty for any pool that fits.
    pub requested_pool: String,
    /// Names of the project secrets injected as environment variables.
    pub secrets: Vec<String>,
    /// The run's config (a sweep's knobs for a trial); `kiln.init(config=...)` merges into it.
    pub config: crate::runs::RunConfig,
    /// The sweep this job is a trial of; empty for other jobs.
    pub sweep_id: String,
    /// The inference service this job is a worker of; empty for other jobs.
    pub service_id: String,
}

impl NewJob {
    /// A canonical hash of everything the submitter asked for (all but the owner and the key), so
    /// an idempotency key reused for another spec is told apart from a retry of the same submit.
    pub fn spec_hash(&self) -> StoreResult<String> {
        use sha2::{Digest, Sha256};
        let mut canonical = serde_json::json!({
            "project": self.project,
            "name": self.name,
            "command": self.command,
            "env": self.env,
            "cpu_millis": self.cpu_millis,
            "memory_bytes": self.memory_bytes,
            "code_digest": self.code_digest,
            "image": self.image,
            "gpus": self.gpus,
            "max_runtime_secs": self.max_runtime_secs,
            "datasets": self.datasets,
            "batch_id": self.batch_id,
            "priority_class": self.priority_class,
            "market_policy": self.market_policy.as_str(),
            "requested_pool": self.requested_pool,
            "secrets": self.secrets,
            "config": self.config,
            "sweep_id": self.sweep_id,
            "service_id": self.service_id,
        });
        // Added later: only when asked, so a spec without them hashes as it did before.
        let nodes = Ord::max(i64::from(self.nodes), 1) - 1;
        for (key, value) in [
            ("disk_bytes", self.disk_bytes),
            ("shm_bytes", self.shm_bytes),
            ("extra_nodes", nodes),
        ] {
            if value != 0 {
                canonical[key] = value.into();
            }
        }
        // serde_json's maps are sorted (no preserve_order), so equal specs print equal bytes.
        let bytes = serde_json::to_vec(&canonical).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        Ok(hex::encode(Sha256::digest(bytes)))
    }
}

/// The pool of runs that execute outside kiln (they hold no capacity of any pool).
pub const EXTERNAL_POOL: &str = "external";

/// What active jobs hold of a pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    pub gpus: i64,
}

/// Fields a transition sets besides the state.
#[derive(Debug, Clone, Default)]
pub struct Change {
    pub pool: Option<String>,
    pub runner_id: Option<String>,
    pub instance_id: Option<String>,
    pub exit_code: Option<i32>,
    pub reason: Option<String>,
    /// Starts a new attempt (a re-queue).
    pub next_attempt: bool,
    /// The market the attempt runs on (set when it is placed).
    pub market: Option<Market>,
    /// Counts a preemption (spot, or by a higher priority).
    pub preempted: bool,
    /// Where the next attempt finds the outputs of this one.
    pub resume_from: Option<String>,
    /// Adds an attempt's cost and its on-demand cost, in millionths.
    pub cost_micros: Option<(i64, i64)>,
    /// Adds an attempt's GPU time (its GPUs times its run time), in milliseconds.
    pub gpu_ms: Option<i64>,
    /// A gang job's rendezvous address (`host:port`) for the attempt being placed.
    pub gang_master: Option<String>,
}

impl Store {
    /// Records a new QUEUED job at version 1, not yet published.
    pub async fn insert_job(&self, new: NewJob) -> StoreResult<JobRecord> {
        self.insert_record(new, JobState::Queued, "", "").await
    }

    async fn insert_record(
        &self,
        new: NewJob,
        state: JobState,
        pool: &str,
        instance_id: &str,
    ) -> StoreResult<JobRecord> {
        let model = new_record(new, state, pool, instance_id)?;
        let id = model.id.clone().unwrap();
        Jobs::insert(model).exec_without_returning(&self.db).await?;
        self.job(&id).await
    }

    /// Records a run that executes outside kiln: RUNNING from the start (one insert, so no
    /// scheduler ever sees it queued), in no pool, never scheduled.
    pub async fn insert_external_run(&self, owner_id: &str, project: &str, name: &str) -> StoreResult<JobRecord> {
        let new = NewJob {
            owner_id: owner_id.to_string(),
            project: project.to_string(),
            name: name.to_string(),
            ..NewJob::default()
        };
        self.insert_record(new, JobState::Running, EXTERNAL_POOL, "external")
            .await
    }

    /// The job an owner submitted with an idempotency key, if any.
    pub async fn job_by_submit_key(&self, owner_id: &str, submit_key: &str) -> StoreResult<Option<JobRecord>> {
        Ok(Jobs::find()
            .filter(job::Column::OwnerId.eq(owner_id))
            .filter(job::Column::SubmitKey.eq(submit_key))
            .one(&self.db)
            .await?)
    }

    /// Returns a job, or `JobNotFound`.
    pub async fn job(&self, job_id: &str) -> StoreResult<JobRecord> {
        Jobs::find_by_id(job_id.to_string())
            .one(&self.db)
            .await?
            .ok_or_else(|| StoreError::JobNotFound {
                job_id: job_id.to_string(),
            })
    }

    /// Jobs newest first: of `owner_id` when given, in the visible projects, live ones unless `all`.
    pub async fn list_jobs(
        &self,
        owner_id: Option<&str>,
        projects: &crate::authz::Visible,
        all: bool,
        limit: u64,
    ) -> StoreResult<Vec<JobRecord>> {
        self.list_jobs_where(&super::JobFilter {
            owner_id: owner_id.map(str::to_string),
            projects: projects.clone(),
            all,
            sweep_id: None,
            limit,
        })
        .await
    }

    /// The worker jobs of a batch that have not ended (a preempted one is about to be queued
    /// again, so it counts), oldest first.
    pub async fn live_batch_workers(&self, batch_id: &str) -> StoreResult<Vec<JobRecord>> {
        self.live_workers(Column::BatchId, batch_id).await
    }

    /// Batch workers that have not started, of every batch: queued, placed on a runner that has
    /// not taken them, or preempted and about to be queued again; oldest first.
    pub async fn unstarted_batch_workers(&self) -> StoreResult<Vec<JobRecord>> {
        let unstarted = [JobState::Queued, JobState::Scheduled, JobState::Preempted].map(JobState::as_str);
        Ok(Jobs::find()
            .filter(Column::State.is_in(unstarted))
            .filter(Column::BatchId.ne(""))
            .order_by_asc(Column::Id)
            .all(&self.db)
            .await?)
    }

    /// The workers of an inference service not ended yet (a preempted one is queued again),
    /// oldest first.
    pub async fn live_service_workers(&self, service_id: &str) -> StoreResult<Vec<JobRecord>> {
        self.live_workers(Column::ServiceId, service_id).await
    }

    async fn live_workers(&self, owner: Column, id: &str) -> StoreResult<Vec<JobRecord>> {
        let live = JobState::ALL
            .into_iter()
            .filter(|s| !s.is_terminal() || *s == JobState::Preempted)
            .map(JobState::as_str);
        Ok(Jobs::find()
            .filter(owner.eq(id))
            .filter(Column::State.is_in(live))
            .order_by_asc(Column::Id)
            .all(&self.db)
            .await?)
    }

    /// Returns the jobs in any of `states`, oldest first.
    pub async fn jobs_in_states(&self, states: &[JobState]) -> StoreResult<Vec<JobRecord>> {
        Ok(Jobs::find()
            .filter(Column::State.is_in(states.iter().map(|s| s.as_str())))
            .order_by_asc(Column::CreatedAtMs)
            .order_by_asc(Column::Id)
            .all(&self.db)
            .await?)
    }

    /// Moves a job from the state and version in `job` to `to`: a compare-and-set that fails
    /// with `Conflict` when anyone changed the job since `job` was read. Returns the new record.
    pub async fn transition(&self, job: &JobRecord, to: JobState, change: Change) -> StoreResult<JobRecord> {
        let from = job.state()?;
        if !from.can_move_to(to) {
            return Err(StoreError::IllegalTransition {
                job_id: job.id.clone(),
                from: from.to_string(),
                to: to.to_string(),
            });
        }
        let now = now_ms();
        let mut update = Jobs::update_many()
            .col_expr(Column::State, Expr::value(to.as_str()))
            .col_expr(Column::Version, Expr::value(job.version + 1))
            .col_expr(Column::UpdatedAtMs, Expr::value(now));
        if let Some(pool) = change.pool {
            update = update.col_expr(Column::Pool, Expr::value(pool));
        }
        if let Some(runner_id) = change.runner_id {
            update = update.col_expr(Column::RunnerId, Expr::value(runner_id));
        }
        if let Some(instance_id) = change.instance_id {
            update = update.col_expr(Column::InstanceId, Expr::value(instance_id));
        }
        if let Some(exit_code) = change.exit_code {
            update = update.col_expr(Column::ExitCode, Expr::value(exit_code));
        }
        if let Some(reason) = change.reason {
            update = update.col_expr(Column::Reason, Expr::value(reason));
        }
        if change.next_attempt {
            update = update
                .col_expr(Column::Attempt, Expr::value(job.attempt + 1))
                .col_expr(Column::RunnerId, Expr::value(""))
                .col_expr(Column::InstanceId, Expr::value(""))
                .col_expr(Column::Pool, Expr::value(""));
        }
        if let Some(market) = change.market {
            update = update.col_expr(Column::Market, Expr::value(market.as_str()));
        }
        if change.preempted {
            update = update.col_expr(Column::Preemptions, Expr::value(job.preemptions + 1));
        }
        if let Some(resume_from) = change.resume_from {
            update = update.col_expr(Column::ResumeFrom, Expr::value(resume_from));
        }
        if let Some((cost, on_demand)) = change.cost_micros {
            update = update
                .col_expr(Column::CostMicros, Expr::value(job.cost_micros + cost))
                .col_expr(
                    Column::OnDemandCostMicros,
                    Expr::value(job.on_demand_cost_micros + on_demand),
                );
        }
        if let Some(gang_master) = change.gang_master {
            update = update.col_expr(Column::GangMaster, Expr::value(gang_master));
        }
        if let Some(gpu_ms) = change.gpu_ms {
            update = update.col_expr(Column::GpuMs, Expr::value(job.gpu_ms + Ord::max(gpu_ms, 0)));
        }
        if to == JobState::Running {
            update = update.col_expr(Column::StartedAtMs, Expr::value(now));
        }
        if to.is_terminal() {
            update = update.col_expr(Column::FinishedAtMs, Expr::value(now));
        }
        let result = update
            .filter(Column::Id.eq(job.id.as_str()))
            .filter(Column::Version.eq(job.version))
            .exec(&self.db)
            .await?;
        if result.rows_affected == 0 {
            let current = self.job(&job.id).await?;
            return Err(StoreError::Conflict {
                job_id: job.id.clone(),
                expected: job.version,
                actual: current.version,
                state: current.state,
            });
        }
        if let Some(transitions) = &self.transitions {
            transitions
                .get_or_create(&super::TransitionLabels { state: to.as_str() })
                .inc();
        }
        self.job(&job.id).await
    }

    /// Counts the jobs not yet ended by state and pool (the pool they run in, or asked for, or
    /// `""` while queued without one).
    pub async fn count_active_jobs(&self) -> StoreResult<Vec<(String, String, i64)>> {
        let active: Vec<&str> = JobState::ALL
            .iter()
            .filter(|state| !state.is_terminal())
            .map(|state| state.as_str())
            .collect();
        let rows: Vec<(String, String, i64)> = Jobs::find()
            .select_only()
            .column(Column::State)
            .column(Column::Pool)
            .column_as(Column::Id.count(), "count")
            .filter(Column::State.is_in(active))
            .group_by(Column::State)
            .group_by(Column::Pool)
            .into_tuple()
            .all(&self.db)
            .await?;
        Ok(rows)
    }

    /// Flags a job to be stopped. This is not a state change: the runner acts on the flag and
    /// makes the change, so the version stays.
    pub async fn request_stop(&self, job_id: &str) -> StoreResult<JobRecord> {
        Jobs::update_many()
            .col_expr(Column::StopRequested, Expr::value(true))
            .filter(Column::Id.eq(job_id))
            .exec(&self.db)
            .await?;
        self.job(job_id).await
    }

    /// Records a sync of the outputs of `attempt` while it runs (not a state change: the
    /// version stays). A sync of an attempt that is no longer the job's changes nothing.
    pub async fn record_outputs_sync(&self, job_id: &str, attempt: i32, at_ms: i64, bytes: u64) -> StoreResult<()> {
        Jobs::update_many()
            .col_expr(Column::OutputsSyncedAtMs, Expr::value(at_ms))
            .col_expr(
                Column::OutputsSyncedBytes,
                Expr::value(i64::try_from(bytes).unwrap_or(i64::MAX)),
            )
            .filter(Column::Id.eq(job_id))
            .filter(Column::Attempt.eq(attempt))
            .exec(&self.db)
            .await?;
        Ok(())
    }

    /// Sums the CPU, memory and GPUs held by active jobs of each pool.
    pub async fn active_usage_by_pool(&self) -> StoreResult<BTreeMap<String, Usage>> {
        let mut usage: BTreeMap<String, Usage> = BTreeMap::new();
        for job in self.jobs_in_states(&JobState::ACTIVE).await? {
            let entry = usage.entry(job.pool.clone()).or_default();
            entry.cpu_millis += job.cpu_millis;
            entry.memory_bytes += job.memory_bytes;
            entry.gpus += i64::from(job.gpus);
        }
        Ok(usage)
    }
}
