//! Who holds a job, read as often as the runners and the provisioner ask (every few seconds for
//! every running job, every cycle for every active one): the columns they need, not whole rows.

use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QuerySelect};

use crate::state::JobState;
use crate::store::entities::job::{Column, Entity as Jobs};
use crate::store::{Store, StoreError, StoreResult};

/// Who holds a job and whether it was asked to stop ([`Store::job_hold`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobHold {
    /// `None` for a state this build does not know.
    pub state: Option<JobState>,
    pub attempt: i32,
    pub runner_id: String,
    pub stop_requested: bool,
}

impl Store {
    /// Who holds a job now (a runner watching its job asks every few seconds, for each job it
    /// runs): four columns, not the whole row.
    pub async fn job_hold(&self, job_id: &str) -> StoreResult<JobHold> {
        let row: Option<(String, i32, String, bool)> = Jobs::find_by_id(job_id.to_string())
            .select_only()
            .column(Column::State)
            .column(Column::Attempt)
            .column(Column::RunnerId)
            .column(Column::StopRequested)
            .into_tuple()
            .one(&self.db)
            .await?;
        let (state, attempt, runner_id, stop_requested) = row.ok_or_else(|| StoreError::JobNotFound {
            job_id: job_id.to_string(),
        })?;
        Ok(JobHold {
            state: state.parse().ok(),
            attempt,
            runner_id,
            stop_requested,
        })
    }

    /// The runners with an active job placed on them (the provisioner asks every cycle which
    /// machines are busy): one column of the active jobs, not their rows.
    pub async fn busy_runners(&self) -> StoreResult<Vec<String>> {
        Ok(Jobs::find()
            .select_only()
            .column(Column::RunnerId)
            .distinct()
            .filter(Column::State.is_in(JobState::ACTIVE.iter().map(|s| s.as_str())))
            .filter(Column::RunnerId.ne(""))
            .into_tuple()
            .all(&self.db)
            .await?)
    }
}
