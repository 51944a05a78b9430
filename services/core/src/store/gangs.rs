//! Gang jobs' nodes: one row per node of each attempt (`job_nodes`), written by the scheduler
//! when it places the gang and updated by each node's runner; the job's rank-0 runner reads
//! them to tell when every node is ready and when one has ended or gone quiet.

use sea_orm::sea_query::{Expr, OnConflict};
use sea_orm::{ActiveValue::Set, ColumnTrait, EntityTrait, QueryFilter, QueryOrder};

use super::entities::job_node;
use super::{Store, StoreResult};
use crate::ids::now_ms;

pub use job_node::Model as NodeRecord;

/// A node's states, as its runner reports them.
pub mod node_state {
    /// The scheduler placed it on its runner.
    pub const PLACED: &str = "placed";
    /// Its runner took the launch and is making its instance.
    pub const PROVISIONING: &str = "provisioning";
    /// Its instance is made; it starts once every node of the gang is ready.
    pub const READY: &str = "ready";
    pub const RUNNING: &str = "running";
    /// Its process ended (`exit_code`), or it never started (`reason`).
    pub const EXITED: &str = "exited";
    /// Its runner lost it (a preemption, a shutdown).
    pub const LOST: &str = "lost";
}

impl NodeRecord {
    pub fn to_proto(&self) -> kiln_proto::v1::JobNode {
        kiln_proto::v1::JobNode {
            rank: u32::try_from(self.rank).unwrap_or(0),
            runner_id: self.runner_id.clone(),
            state: self.state.clone(),
            exit_code: self.exit_code,
            reason: self.reason.clone(),
        }
    }
}

impl Store {
    /// Records where each node of an attempt goes (`runners[rank]`), replacing what an earlier,
    /// unfinished placement of the same attempt wrote.
    pub async fn place_gang(&self, job_id: &str, attempt: i32, runners: &[String]) -> StoreResult<()> {
        job_node::Entity::delete_many()
            .filter(job_node::Column::JobId.eq(job_id))
            .filter(job_node::Column::Attempt.eq(attempt))
            .exec(&self.db)
            .await?;
        let now = now_ms();
        let rows = runners.iter().enumerate().map(|(rank, runner)| job_node::ActiveModel {
            job_id: Set(job_id.to_string()),
            attempt: Set(attempt),
            rank: Set(i32::try_from(rank).unwrap_or(i32::MAX)),
            runner_id: Set(runner.clone()),
            state: Set(node_state::PLACED.to_string()),
            exit_code: Set(None),
            reason: Set(String::new()),
            heartbeat_ms: Set(now),
        });
        job_node::Entity::insert_many(rows)
            .on_conflict(
                OnConflict::columns([
                    job_node::Column::JobId,
                    job_node::Column::Attempt,
                    job_node::Column::Rank,
                ])
                .update_columns([job_node::Column::RunnerId, job_node::Column::State])
                .to_owned(),
            )
            .exec_without_returning(&self.db)
            .await?;
        Ok(())
    }

    /// The nodes of an attempt, by rank.
    pub async fn gang_nodes(&self, job_id: &str, attempt: i32) -> StoreResult<Vec<NodeRecord>> {
        Ok(job_node::Entity::find()
            .filter(job_node::Column::JobId.eq(job_id))
            .filter(job_node::Column::Attempt.eq(attempt))
            .order_by_asc(job_node::Column::Rank)
            .all(&self.db)
            .await?)
    }

    /// The nodes of the given jobs' attempts (`(job, attempt)`), for the scheduler's count of
    /// what running gangs hold on each runner.
    pub async fn nodes_of(&self, jobs: &[(String, i32)]) -> StoreResult<Vec<NodeRecord>> {
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<&str> = jobs.iter().map(|(id, _)| id.as_str()).collect();
        let rows = job_node::Entity::find()
            .filter(job_node::Column::JobId.is_in(ids))
            .all(&self.db)
            .await?;
        Ok(rows
            .into_iter()
            .filter(|row| {
                jobs.iter()
                    .any(|(id, attempt)| *id == row.job_id && *attempt == row.attempt)
            })
            .collect())
    }

    /// Nodes of any attempt not known to have ended whose heart beat since `since_ms`: a node of
    /// an attempt that just ended still holds its runner's room while it stops.
    pub async fn stopping_nodes(&self, since_ms: i64) -> StoreResult<Vec<NodeRecord>> {
        Ok(job_node::Entity::find()
            .filter(job_node::Column::State.is_not_in([node_state::EXITED, node_state::LOST]))
            .filter(job_node::Column::HeartbeatMs.gte(since_ms))
            .filter(job_node::Column::Rank.gt(0))
            .all(&self.db)
            .await?)
    }

    /// Records what a node's runner saw, and beats its heart.
    pub async fn report_node(
        &self,
        job_id: &str,
        attempt: i32,
        rank: i32,
        state: &str,
        exit_code: Option<i32>,
        reason: &str,
    ) -> StoreResult<()> {
        let mut update = node_row(job_id, attempt, rank)
            .col_expr(job_node::Column::State, Expr::value(state))
            .col_expr(job_node::Column::Reason, Expr::value(reason));
        if let Some(code) = exit_code {
            update = update.col_expr(job_node::Column::ExitCode, Expr::value(code));
        }
        update.exec(&self.db).await?;
        Ok(())
    }

    /// Beats a node's heart: its runner holds it and it is alive.
    pub async fn node_heartbeat(&self, job_id: &str, attempt: i32, rank: i32) -> StoreResult<()> {
        node_row(job_id, attempt, rank).exec(&self.db).await?;
        Ok(())
    }
}

/// An update of one node's row that beats its heart.
fn node_row(job_id: &str, attempt: i32, rank: i32) -> sea_orm::UpdateMany<job_node::Entity> {
    job_node::Entity::update_many()
        .col_expr(job_node::Column::HeartbeatMs, Expr::value(now_ms()))
        .filter(job_node::Column::JobId.eq(job_id))
        .filter(job_node::Column::Attempt.eq(attempt))
        .filter(job_node::Column::Rank.eq(rank))
}
