//! A job's row: the values its JSON columns hold, the row of a new job, and the job as the API
//! shows it.

use std::collections::BTreeMap;

use sea_orm::ActiveValue::Set;

use super::NewJob;
use crate::ids::{new_id, now_ms};
use crate::scheduling::{MarketPolicy, priority_class};
use crate::state::JobState;
use crate::store::entities::job;
use crate::store::{JobRecord, StoreError, StoreResult};

impl JobRecord {
    pub fn state(&self) -> StoreResult<JobState> {
        self.state.parse().map_err(StoreError::Corrupt)
    }

    pub fn command(&self) -> StoreResult<Vec<String>> {
        serde_json::from_str(&self.command_json).map_err(|e| StoreError::Corrupt(e.to_string()))
    }

    pub fn env(&self) -> StoreResult<BTreeMap<String, String>> {
        serde_json::from_str(&self.env_json).map_err(|e| StoreError::Corrupt(e.to_string()))
    }

    pub fn datasets(&self) -> StoreResult<Vec<String>> {
        serde_json::from_str(&self.datasets_json).map_err(|e| StoreError::Corrupt(e.to_string()))
    }

    pub fn secrets(&self) -> StoreResult<Vec<String>> {
        serde_json::from_str(&self.secrets_json).map_err(|e| StoreError::Corrupt(e.to_string()))
    }
}

/// The row of a new job in `state`.
pub(in crate::store) fn new_record(
    new: NewJob,
    state: JobState,
    pool: &str,
    instance_id: &str,
) -> StoreResult<job::ActiveModel> {
    let now = now_ms();
    let class = priority_class(&new.priority_class)
        .ok_or_else(|| StoreError::Corrupt(format!("priority class {:?} is not a class", new.priority_class)))?;
    let submit_hash = if new.submit_key.is_empty() {
        String::new()
    } else {
        new.spec_hash()?
    };
    Ok(job::ActiveModel {
        id: Set(new_id()),
        owner_id: Set(new.owner_id),
        project: Set(new.project),
        name: Set(new.name),
        command_json: Set(serde_json::to_string(&new.command).map_err(|e| StoreError::Corrupt(e.to_string()))?),
        env_json: Set(serde_json::to_string(&new.env).map_err(|e| StoreError::Corrupt(e.to_string()))?),
        cpu_millis: Set(new.cpu_millis),
        memory_bytes: Set(new.memory_bytes),
        code_digest: Set(new.code_digest),
        state: Set(state.as_str().to_string()),
        version: Set(1),
        published_version: Set(0),
        attempt: Set(1),
        pool: Set(pool.to_string()),
        runner_id: Set(String::new()),
        instance_id: Set(instance_id.to_string()),
        exit_code: Set(None),
        reason: Set(String::new()),
        stop_requested: Set(false),
        created_at_ms: Set(now),
        updated_at_ms: Set(now),
        started_at_ms: Set((state == JobState::Running).then_some(now)),
        finished_at_ms: Set(None),
        image: Set(new.image),
        gpus: Set(new.gpus),
        max_runtime_secs: Set(new.max_runtime_secs),
        datasets_json: Set(serde_json::to_string(&new.datasets).map_err(|e| StoreError::Corrupt(e.to_string()))?),
        secrets_json: Set(serde_json::to_string(&new.secrets).map_err(|e| StoreError::Corrupt(e.to_string()))?),
        batch_id: Set(new.batch_id),
        priority: Set(class.value),
        priority_class: Set(class.name.to_string()),
        market_policy: Set(new.market_policy.as_str().to_string()),
        market: Set(String::new()),
        preemptions: Set(0),
        resume_from: Set(String::new()),
        cost_micros: Set(0),
        on_demand_cost_micros: Set(0),
        gpu_ms: Set(0),
        outputs_synced_at_ms: Set(0),
        outputs_synced_bytes: Set(0),
        disk_bytes: Set(new.disk_bytes),
        shm_bytes: Set(new.shm_bytes),
        nodes: Set(new.nodes.max(1)),
        gang_master: Set(String::new()),
        submit_hash: Set(submit_hash),
        submit_key: Set(Some(new.submit_key).filter(|key| !key.is_empty())),
        requested_pool: Set(new.requested_pool),
        config_json: Set(super::super::runs::config_json(&new.config)?),
        summary_json: Set("{}".to_string()),
        sweep_id: Set(new.sweep_id),
        service_id: Set(new.service_id),
    })
}

impl JobRecord {
    /// Returns the job as the API shows it.
    pub fn to_proto(&self) -> kiln_proto::v1::Job {
        use kiln_proto::v1 as pb;
        let state = self
            .state()
            .map(JobState::to_proto)
            .unwrap_or(pb::JobState::Unspecified);
        pb::Job {
            id: self.id.clone(),
            spec: Some(pb::JobSpec {
                name: self.name.clone(),
                command: self.command().unwrap_or_default(),
                env: self.env().unwrap_or_default().into_iter().collect(),
                resources: Some(pb::Resources {
                    cpu_millis: u32::try_from(self.cpu_millis).unwrap_or(u32::MAX),
                    memory_bytes: u64::try_from(self.memory_bytes).unwrap_or(0),
                    disk_bytes: u64::try_from(self.disk_bytes).unwrap_or(0),
                    shm_bytes: u64::try_from(self.shm_bytes).unwrap_or(0),
                }),
                code_digest: self.code_digest.clone(),
                project: self.project.clone(),
                image: self.image.clone(),
                gpus: u32::try_from(self.gpus).unwrap_or(0),
                max_runtime_secs: u64::try_from(self.max_runtime_secs).unwrap_or(0),
                datasets: self.datasets().unwrap_or_default(),
                priority_class: self.priority_class.clone(),
                market: MarketPolicy::parse(&self.market_policy).to_proto() as i32,
                pool: self.requested_pool.clone(),
                secrets: self.secrets().unwrap_or_default(),
                nodes: u32::try_from(self.nodes).unwrap_or(1),
            }),
            state: state as i32,
            version: self.version,
            exit_code: self.exit_code,
            reason: self.reason.clone(),
            owner: self.owner_id.clone(),
            pool: self.pool.clone(),
            runner_id: self.runner_id.clone(),
            instance_id: self.instance_id.clone(),
            attempt: self.attempt,
            stop_requested: self.stop_requested,
            created_at_ms: self.created_at_ms,
            started_at_ms: self.started_at_ms.unwrap_or(0),
            finished_at_ms: self.finished_at_ms.unwrap_or(0),
            preemptions: self.preemptions,
            market: self.market.clone(),
            cost: self.cost_micros as f64 / 1e6,
            on_demand_cost: self.on_demand_cost_micros as f64 / 1e6,
            resume_from: self.resume_from.clone(),
            config: crate::runs::config_to_proto(&self.config().unwrap_or_default()),
            summary: crate::runs::config_to_proto(&self.summary().unwrap_or_default()),
            sweep_id: self.sweep_id.clone(),
            outputs_synced_at_ms: self.outputs_synced_at_ms,
            outputs_synced_bytes: u64::try_from(self.outputs_synced_bytes).unwrap_or(0),
            nodes: Vec::new(),
            rendezvous: self.gang_master.clone(),
        }
    }
}
