//! The owner check of controllers: a sweep, an inference service or a batch makes jobs as its
//! owner, long after the owner created it. Each job it inserts goes through
//! [`Store::insert_controller_job`], which inserts only while the owner is enabled and still
//! holds at least the `member` role in the project (an instance admin needs no membership),
//! and otherwise fails with [`StoreError::OwnerRevoked`]: the controller then pauses with that
//! reason instead of trying again. [`Store::check_owner`] is the same check alone, which the
//! controllers make on each pass so a controller that makes no job notices too.
//!
//! The check and the insert are one transaction that reads the owner's user and membership rows
//! under a shared row lock (Postgres; SQLite takes its database write lock first): a
//! `DisableUser` or `RemoveMember` that commits first is seen, and one that comes later waits
//! for the insert, so the job is among those it stops afterwards.

use sea_orm::{
    ColumnTrait, ConnectionTrait, DbBackend, EntityTrait, QueryFilter, QueryOrder, QuerySelect, TransactionTrait,
};

use super::entities::{job, project_member, user};
use super::jobs::new_record;
use super::{JobRecord, NewJob, Store, StoreError, StoreResult};
use crate::authz::Role;
use crate::state::JobState;

/// The prefix of the status reason of a paused controller.
pub const PAUSED: &str = "paused";

/// The reason a controller shows when `check` fails: `paused: <why>`.
pub fn paused_reason(why: &str) -> String {
    format!("{PAUSED}: {why}")
}

impl StoreError {
    /// Why the owner may no longer have jobs made for them, when this is that refusal.
    pub fn owner_revoked(&self) -> Option<&str> {
        match self {
            StoreError::OwnerRevoked { reason, .. } => Some(reason),
            _ => None,
        }
    }
}

impl Store {
    /// Fails with [`StoreError::OwnerRevoked`] unless `owner_id` is enabled and may still submit
    /// jobs in `project` (a member or maintainer, or an instance admin).
    pub async fn check_owner(&self, owner_id: &str, project: &str) -> StoreResult<()> {
        check_owner(&self.db, owner_id, project).await
    }

    /// Records a new QUEUED job that a controller (sweep, service, batch) makes for its owner,
    /// if [`Store::check_owner`] passes in the same transaction; otherwise inserts nothing and
    /// fails with [`StoreError::OwnerRevoked`].
    pub async fn insert_controller_job(&self, new: NewJob) -> StoreResult<JobRecord> {
        let (owner_id, project) = (new.owner_id.clone(), new.project.clone());
        let model = new_record(new, JobState::Queued, "", "")?;
        let id = model.id.clone().unwrap();
        let txn = self.db.begin().await?;
        if txn.get_database_backend() == DbBackend::Sqlite {
            // A write, even of no row, takes the write lock: no disable or removal can commit
            // between the check and the insert.
            txn.execute_unprepared("UPDATE users SET disabled = disabled WHERE 0 = 1")
                .await?;
        }
        if let Err(refused) = check_owner(&txn, &owner_id, &project).await {
            txn.rollback().await?;
            return Err(refused);
        }
        job::Entity::insert(model).exec_without_returning(&txn).await?;
        txn.commit().await?;
        self.job(&id).await
    }
}

impl Store {
    /// The jobs of `owner_id` (in `project` when given) that run or may run again: not ended,
    /// or preempted (queued again soon). Runs that execute outside kiln are left out: kiln
    /// runs nothing of theirs.
    pub async fn owner_live_jobs(&self, owner_id: &str, project: Option<&str>) -> StoreResult<Vec<JobRecord>> {
        let live = JobState::ALL
            .into_iter()
            .filter(|state| !state.is_terminal() || *state == JobState::Preempted)
            .map(JobState::as_str);
        let mut query = job::Entity::find()
            .filter(job::Column::OwnerId.eq(owner_id))
            .filter(job::Column::State.is_in(live))
            .filter(job::Column::Pool.ne(super::EXTERNAL_POOL));
        if let Some(project) = project {
            query = query.filter(job::Column::Project.eq(project));
        }
        Ok(query.order_by_asc(job::Column::Id).all(&self.db).await?)
    }
}

/// The check, on a connection or in a transaction (where the rows it reads stay locked on
/// Postgres until the transaction ends; SQLite ignores the lock clause).
async fn check_owner(db: &impl ConnectionTrait, owner_id: &str, project: &str) -> StoreResult<()> {
    let revoked = |owner: &str, reason: String| StoreError::OwnerRevoked {
        owner_id: owner.to_string(),
        reason,
    };
    let Some(owner) = user::Entity::find_by_id(owner_id.to_string())
        .lock_shared()
        .one(db)
        .await?
    else {
        return Err(revoked(owner_id, format!("owner {owner_id} no longer exists")));
    };
    if owner.disabled {
        return Err(revoked(owner_id, format!("owner {} was disabled", owner.name)));
    }
    if owner.is_admin {
        return Ok(());
    }
    let membership = project_member::Entity::find()
        .filter(project_member::Column::Project.eq(project))
        .filter(project_member::Column::UserId.eq(owner_id))
        .lock_shared()
        .one(db)
        .await?;
    match membership.map(|row| Role::parse(&row.role)) {
        None => Err(revoked(
            owner_id,
            format!("owner {} is no longer a member of project {project}", owner.name),
        )),
        Some(Some(role)) if role >= Role::Member => Ok(()),
        Some(role) => Err(revoked(
            owner_id,
            format!(
                "owner {} is only a {} of project {project}",
                owner.name,
                role.map(Role::as_str).unwrap_or("viewer")
            ),
        )),
    }
}
