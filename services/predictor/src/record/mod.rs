//! The service tables: a service's record (its name, project, state, serving and latest
//! revision, replicas) and its revisions, each recorded once and never changed. A service is
//! found by its project and name (names are unique per project).

use kiln_core::authz::Visible;
use kiln_core::feed::Changes;
use kiln_core::ids::{new_id, now_ms};
use kiln_core::serving::Scaling;
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveValue::Set, ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, QueryOrder, TransactionTrait,
};

use crate::revision::Revision;
use crate::{Error, Result};

pub mod entity;

use entity::{revision, service};

pub type ServiceRecord = service::Model;

pub const RUNNING: &str = "RUNNING";
pub const STOPPED: &str = "STOPPED";

/// How the latest revision is tried while it is ahead of the serving one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rollout {
    /// 1 to 100: the percent of requests it answers; 100 rolls to it once it is ready.
    pub traffic: u32,
    /// Copies of every request go to it; its answers are compared, never returned.
    pub shadow: bool,
}

impl Rollout {
    /// Roll to the latest revision as soon as it is ready.
    pub const ROLL: Rollout = Rollout {
        traffic: 100,
        shadow: false,
    };

    /// Whether the serving revision is left for the latest once the latest is ready.
    pub fn rolls(self) -> bool {
        self.traffic >= 100 && !self.shadow
    }
}

impl ServiceRecord {
    /// Its [`kiln_core::serving::service_key`].
    pub fn key(&self) -> String {
        kiln_core::serving::service_key(&self.project, &self.name)
    }

    /// How a person names it: `PROJECT/NAME`.
    pub fn qualified(&self) -> String {
        format!("{}/{}", self.project, self.name)
    }

    pub fn scaling(&self) -> Scaling {
        if self.scaling_json.is_empty() {
            return Scaling::fixed(u32::try_from(self.replicas).unwrap_or(1));
        }
        serde_json::from_str(&self.scaling_json).unwrap_or_else(|error| {
            tracing::warn!(service = %self.name, error = %error, "the recorded scaling does not read back; keeping its replicas fixed");
            Scaling::fixed(u32::try_from(self.replicas).unwrap_or(1))
        })
    }

    pub fn rollout(&self) -> Rollout {
        Rollout {
            traffic: u32::try_from(self.traffic).unwrap_or(100).clamp(1, 100),
            shadow: self.shadow,
        }
    }
}

fn scaling_json(scaling: &Scaling) -> String {
    serde_json::to_string(scaling).expect("scaling serializes")
}

/// The services of the visible projects.
fn of_projects(visible: &Visible) -> sea_orm::Select<service::Entity> {
    let query = service::Entity::find();
    match visible {
        Visible::Only(projects) => query.filter(service::Column::Project.is_in(projects.clone())),
        Visible::All => query,
    }
}

/// ServiceStore reads and writes the service tables.
#[derive(Clone)]
pub struct ServiceStore {
    db: DatabaseConnection,
    /// Whom each committed change of a service is told (WatchServices).
    changes: Changes,
}

fn corrupt(error: serde_json::Error) -> Error {
    Error::Internal(format!("a recorded revision does not read back: {error}"))
}

impl ServiceStore {
    pub fn new(store: &kiln_core::store::Store) -> ServiceStore {
        ServiceStore {
            db: store.connection().clone(),
            changes: Changes::default(),
        }
    }

    /// Tells `changes` the services each write changed.
    pub fn telling(self, changes: Changes) -> ServiceStore {
        ServiceStore { changes, ..self }
    }

    /// Tells the watchers of services that `service_id` changed (its workers or its recent
    /// traffic, which are not in its tables).
    pub fn touch(&self, service_id: &str) {
        self.changes.touch(service_id);
    }

    /// `changed` (rows updated), after telling the service's watchers when there were some.
    fn told(&self, service_id: &str, changed: bool) -> bool {
        if changed {
            self.touch(service_id);
        }
        changed
    }

    /// Records a new service with its first revision; ALREADY_EXISTS when its project has a
    /// service of that name.
    pub async fn create(
        &self,
        name: &str,
        project: &str,
        owner_id: &str,
        scaling: &Scaling,
        first: &Revision,
    ) -> Result<ServiceRecord> {
        if self.by_name(project, name).await?.is_some() {
            return Err(Error::AlreadyExists(format!(
                "project {project} has a service named {name}; pick another name, or `kiln serve update {name} --project {project}`"
            )));
        }
        let now = now_ms();
        let record = ServiceRecord {
            id: new_id(),
            name: name.to_string(),
            project: project.to_string(),
            owner_id: owner_id.to_string(),
            state: RUNNING.to_string(),
            revision: first.revision as i64,
            latest_revision: first.revision as i64,
            replicas: scaling.min_replicas as i32,
            reason: String::new(),
            created_at_ms: now,
            updated_at_ms: now,
            scaling_json: scaling_json(scaling),
            traffic: 100,
            shadow: false,
            paused_reason: String::new(),
        };
        let spec_json = serde_json::to_string(first).map_err(corrupt)?;
        let inserted = record.clone();
        self.db
            .transaction::<_, (), sea_orm::DbErr>(|tx| {
                Box::pin(async move {
                    service::Entity::insert(service::ActiveModel::from(inserted.clone()))
                        .exec_without_returning(tx)
                        .await?;
                    revision::Entity::insert(revision::ActiveModel {
                        service_id: Set(inserted.id.clone()),
                        revision: Set(inserted.revision),
                        spec_json: Set(spec_json),
                        created_at_ms: Set(now),
                    })
                    .exec_without_returning(tx)
                    .await?;
                    Ok(())
                })
            })
            .await
            .map_err(|error| match error {
                // Two creates raced for the name: the unique index refused the second.
                sea_orm::TransactionError::Transaction(error)
                    if error.to_string().contains("UNIQUE") || error.to_string().contains("unique") =>
                {
                    Error::AlreadyExists(format!(
                        "project {project} has a service named {name}; pick another name"
                    ))
                }
                other => Error::Internal(format!("cannot record service {name}: {other}")),
            })?;
        self.touch(&record.id);
        Ok(record)
    }

    /// Service `name` of `project`.
    pub async fn by_name(&self, project: &str, name: &str) -> Result<Option<ServiceRecord>> {
        Ok(service::Entity::find()
            .filter(service::Column::Project.eq(project))
            .filter(service::Column::Name.eq(name))
            .one(&self.db)
            .await
            .map_err(kiln_core::store::StoreError::from)?)
    }

    /// The projects that have a service called `name` (running or stopped).
    pub async fn projects_named(&self, name: &str) -> Result<Vec<String>> {
        Ok(service::Entity::find()
            .filter(service::Column::Name.eq(name))
            .order_by_asc(service::Column::Project)
            .all(&self.db)
            .await
            .map_err(kiln_core::store::StoreError::from)?
            .into_iter()
            .map(|record| record.project)
            .collect())
    }

    /// Services of the visible projects, by name then project; running ones only unless `all`.
    pub async fn list(&self, visible: &Visible, all: bool) -> Result<Vec<ServiceRecord>> {
        let mut query = of_projects(visible);
        if !all {
            query = query.filter(service::Column::State.eq(RUNNING));
        }
        Ok(query
            .order_by_asc(service::Column::Name)
            .order_by_asc(service::Column::Project)
            .all(&self.db)
            .await
            .map_err(kiln_core::store::StoreError::from)?)
    }

    /// Those of `service_ids` in the visible projects, running or stopped, as [`Self::list`]
    /// orders them.
    pub async fn changed(&self, service_ids: &[String], visible: &Visible) -> Result<Vec<ServiceRecord>> {
        let mut changed = Vec::with_capacity(service_ids.len());
        for chunk in service_ids.chunks(500) {
            let query = of_projects(visible).filter(service::Column::Id.is_in(chunk.iter().cloned()));
            changed.extend(
                query
                    .order_by_asc(service::Column::Name)
                    .order_by_asc(service::Column::Project)
                    .all(&self.db)
                    .await
                    .map_err(kiln_core::store::StoreError::from)?,
            );
        }
        Ok(changed)
    }

    pub async fn revision(&self, service_id: &str, number: i64) -> Result<Revision> {
        let row = revision::Entity::find_by_id((service_id.to_string(), number))
            .one(&self.db)
            .await
            .map_err(kiln_core::store::StoreError::from)?
            .ok_or_else(|| Error::Internal(format!("service {service_id} has no revision {number}")))?;
        serde_json::from_str(&row.spec_json).map_err(corrupt)
    }

    /// Records `next` as the service's newest revision, tried as `rollout` says, if the newest
    /// is still `after` (an update raced by another is refused).
    pub async fn add_revision(&self, record: &ServiceRecord, next: &Revision, rollout: Rollout) -> Result<()> {
        let spec_json = serde_json::to_string(next).map_err(corrupt)?;
        let service_id = record.id.clone();
        let after = record.latest_revision;
        let number = next.revision as i64;
        let moved = self
            .db
            .transaction::<_, bool, sea_orm::DbErr>(|tx| {
                Box::pin(async move {
                    let updated = service::Entity::update_many()
                        .col_expr(service::Column::LatestRevision, Expr::value(number))
                        .col_expr(service::Column::Traffic, Expr::value(rollout.traffic as i32))
                        .col_expr(service::Column::Shadow, Expr::value(rollout.shadow))
                        .col_expr(service::Column::UpdatedAtMs, Expr::value(now_ms()))
                        .filter(service::Column::Id.eq(service_id.as_str()))
                        .filter(service::Column::LatestRevision.eq(after))
                        .filter(service::Column::State.eq(RUNNING))
                        .exec(tx)
                        .await?;
                    if updated.rows_affected == 0 {
                        return Ok(false);
                    }
                    revision::Entity::insert(revision::ActiveModel {
                        service_id: Set(service_id),
                        revision: Set(number),
                        spec_json: Set(spec_json),
                        created_at_ms: Set(now_ms()),
                    })
                    .exec_without_returning(tx)
                    .await?;
                    Ok(true)
                })
            })
            .await
            .map_err(|error| Error::Internal(format!("cannot record the revision: {error}")))?;
        if self.told(&record.id, moved) {
            Ok(())
        } else {
            Err(Error::FailedPrecondition(format!(
                "service {} changed meanwhile (or was stopped); read it again and retry",
                record.name
            )))
        }
    }

    /// Makes `number` the serving revision, if it is newer than the serving one.
    pub async fn serve_revision(&self, service_id: &str, number: i64) -> Result<bool> {
        let updated = service::Entity::update_many()
            .col_expr(service::Column::Revision, Expr::value(number))
            .col_expr(service::Column::UpdatedAtMs, Expr::value(now_ms()))
            .filter(service::Column::Id.eq(service_id))
            .filter(service::Column::Revision.lt(number))
            .exec(&self.db)
            .await
            .map_err(kiln_core::store::StoreError::from)?;
        Ok(self.told(service_id, updated.rows_affected > 0))
    }

    /// Sets a service's worker bounds and targets. (Its `updated_at_ms` is left alone: it
    /// times a roll's grace.)
    pub async fn set_scaling(&self, service_id: &str, scaling: &Scaling) -> Result<()> {
        service::Entity::update_many()
            .col_expr(service::Column::Replicas, Expr::value(scaling.min_replicas as i32))
            .col_expr(service::Column::ScalingJson, Expr::value(scaling_json(scaling)))
            .filter(service::Column::Id.eq(service_id))
            .exec(&self.db)
            .await
            .map_err(kiln_core::store::StoreError::from)?;
        self.touch(service_id);
        Ok(())
    }

    /// Changes how the latest revision is tried, if it is still `latest` and ahead of the
    /// serving one.
    pub async fn set_rollout(&self, record: &ServiceRecord, rollout: Rollout) -> Result<()> {
        let updated = service::Entity::update_many()
            .col_expr(service::Column::Traffic, Expr::value(rollout.traffic as i32))
            .col_expr(service::Column::Shadow, Expr::value(rollout.shadow))
            .filter(service::Column::Id.eq(record.id.as_str()))
            .filter(service::Column::LatestRevision.eq(record.latest_revision))
            .filter(service::Column::Revision.lt(record.latest_revision))
            .exec(&self.db)
            .await
            .map_err(kiln_core::store::StoreError::from)?;
        if !self.told(&record.id, updated.rows_affected > 0) {
            return Err(Error::FailedPrecondition(format!(
                "service {} has no revision being tried (its latest serves all requests); `kiln serve update {}` with a new definition first",
                record.name, record.name
            )));
        }
        Ok(())
    }

    /// Pauses a running service because its owner may no longer run jobs: it is stopped, with
    /// `reason` as its reason and paused reason. False when it was stopped already.
    pub async fn pause(&self, service_id: &str, reason: &str) -> Result<bool> {
        let updated = service::Entity::update_many()
            .col_expr(service::Column::State, Expr::value(STOPPED))
            .col_expr(service::Column::Reason, Expr::value(reason))
            .col_expr(service::Column::PausedReason, Expr::value(reason))
            .col_expr(service::Column::UpdatedAtMs, Expr::value(now_ms()))
            .filter(service::Column::Id.eq(service_id))
            .filter(service::Column::State.eq(RUNNING))
            .exec(&self.db)
            .await
            .map_err(kiln_core::store::StoreError::from)?;
        Ok(self.told(service_id, updated.rows_affected > 0))
    }

    /// Stops a running service; false when it was stopped already.
    pub async fn stop(&self, service_id: &str, reason: &str) -> Result<bool> {
        let updated = service::Entity::update_many()
            .col_expr(service::Column::State, Expr::value(STOPPED))
            .col_expr(service::Column::Reason, Expr::value(reason))
            .col_expr(service::Column::UpdatedAtMs, Expr::value(now_ms()))
            .filter(service::Column::Id.eq(service_id))
            .filter(service::Column::State.eq(RUNNING))
            .exec(&self.db)
            .await
            .map_err(kiln_core::store::StoreError::from)?;
        Ok(self.told(service_id, updated.rows_affected > 0))
    }
}
