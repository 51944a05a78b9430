//! Records of the model registry: models, their immutable versions and files, tags, and aliases.
//! A model is named by its project and its name (names are unique per project), and so is
//! everything of it.
//!
//! A version number is taken by incrementing the model's `latest_version` inside the
//! transaction that inserts the version (on Postgres the row lock, on SQLite the write lock the
//! first statement takes, serialise concurrent registers). An alias is one row per (model,
//! alias): moving it is a single upsert, so at every instant exactly one version holds it.

use std::collections::BTreeMap;

use sea_orm::sea_query::{Expr, ExprTrait, LikeExpr, OnConflict, Query};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, Condition, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect,
    TransactionTrait,
};

pub mod entities;

use entities::{model, model_alias, model_file, model_tag, model_version};

use super::{Store, StoreResult};
use crate::authz::Visible;
use crate::ids::now_ms;

pub use model::Model as ModelRecord;
pub use model_file::Model as ModelFileRecord;
pub use model_version::Model as ModelVersionRecord;

/// A version to record, its files already stored as blobs.
#[derive(Debug, Clone, Default)]
pub struct NewModelVersion {
    pub model: String,
    /// The model's project (the source job's).
    pub project: String,
    pub created_by: String,
    pub job_id: String,
    pub description: String,
    pub lineage_json: String,
    pub digest: String,
    /// (path, sha256, size), sorted by path.
    pub files: Vec<(String, String, i64)>,
    pub tags: BTreeMap<String, String>,
    /// An alias to point at the new version in the same transaction.
    pub alias: Option<String>,
}

/// A filter of a model's versions.
#[derive(Debug, Clone, Default)]
pub struct VersionFilter {
    /// A substring of the description, the source job id or a tag value; empty for any.
    pub query: String,
    /// Tags a version must all have.
    pub tags: BTreeMap<String, String>,
    /// Only versions below this number (the page before); 0 for the newest.
    pub before_version: i64,
    pub limit: u64,
}

/// `%text%` with LIKE's wildcards in `text` escaped.
fn like_pattern(text: &str) -> LikeExpr {
    let escaped = text.replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_");
    LikeExpr::new(format!("%{escaped}%")).escape('\\')
}

impl Store {
    /// Records a new version of `new.model` of `new.project` (creating the model on its first
    /// version) and returns it with its number.
    pub async fn insert_model_version(&self, new: NewModelVersion) -> StoreResult<ModelVersionRecord> {
        let now = now_ms();
        let txn = self.db.begin().await?;
        // The first statement writes, so SQLite takes its write lock before any read.
        model::Entity::insert(model::ActiveModel {
            project: Set(new.project.clone()),
            name: Set(new.model.clone()),
            created_by: Set(new.created_by.clone()),
            created_at_ms: Set(now),
            latest_version: Set(0),
        })
        .on_conflict(
            OnConflict::columns([model::Column::Project, model::Column::Name])
                .do_nothing()
                .to_owned(),
        )
        .exec_without_returning(&txn)
        .await?;
        model::Entity::update_many()
            .col_expr(
                model::Column::LatestVersion,
                Expr::col(model::Column::LatestVersion).add(1),
            )
            .filter(model::Column::Project.eq(&new.project))
            .filter(model::Column::Name.eq(&new.model))
            .exec(&txn)
            .await?;
        let version = model::Entity::find_by_id((new.project.clone(), new.model.clone()))
            .one(&txn)
            .await?
            .map(|m| m.latest_version)
            .ok_or_else(|| {
                super::StoreError::Corrupt(format!(
                    "model {}/{} vanished in its transaction",
                    new.project, new.model
                ))
            })?;
        let record = ModelVersionRecord {
            project: new.project.clone(),
            model: new.model.clone(),
            version,
            digest: new.digest,
            size: new.files.iter().map(|(_, _, size)| size).sum(),
            job_id: new.job_id,
            description: new.description,
            lineage_json: new.lineage_json,
            created_by: new.created_by,
            created_at_ms: now,
        };
        model_version::Entity::insert(model_version::ActiveModel::from(record.clone()))
            .exec_without_returning(&txn)
            .await?;
        // In chunks: a version of many files stays under every backend's parameter limit.
        for chunk in new.files.chunks(500) {
            let rows = chunk.iter().map(|(path, sha256, size)| model_file::ActiveModel {
                project: Set(new.project.clone()),
                model: Set(new.model.clone()),
                version: Set(version),
                path: Set(path.clone()),
                sha256: Set(sha256.clone()),
                size: Set(*size),
            });
            model_file::Entity::insert_many(rows)
                .exec_without_returning(&txn)
                .await?;
        }
        let key = ModelKey::new(&new.project, &new.model);
        put_tags(&txn, &key, version, &new.tags).await?;
        if let Some(alias) = &new.alias {
            put_alias(&txn, &key, alias, version).await?;
        }
        txn.commit().await?;
        Ok(record)
    }

    /// A project's model by name.
    pub async fn model(&self, project: &str, name: &str) -> StoreResult<Option<ModelRecord>> {
        Ok(model::Entity::find_by_id((project.to_string(), name.to_string()))
            .one(&self.db)
            .await?)
    }

    /// The projects that have a model called `name`, sorted.
    pub async fn model_projects(&self, name: &str) -> StoreResult<Vec<String>> {
        Ok(model::Entity::find()
            .filter(model::Column::Name.eq(name))
            .order_by_asc(model::Column::Project)
            .all(&self.db)
            .await?
            .into_iter()
            .map(|model| model.project)
            .collect())
    }

    /// Models of the visible projects whose name contains `query`, by name then project, after
    /// the model `after` (name, project); an empty project there means after every model of
    /// that name.
    pub async fn list_models(
        &self,
        visible: &Visible,
        query: &str,
        after: (&str, &str),
        limit: u64,
    ) -> StoreResult<Vec<ModelRecord>> {
        let (after_name, after_project) = after;
        let mut later = Condition::any().add(model::Column::Name.gt(after_name));
        if !after_project.is_empty() {
            later = later.add(
                Condition::all()
                    .add(model::Column::Name.eq(after_name))
                    .add(model::Column::Project.gt(after_project)),
            );
        }
        let mut select = model::Entity::find()
            .filter(later)
            .order_by_asc(model::Column::Name)
            .order_by_asc(model::Column::Project)
            .limit(limit);
        if let Visible::Only(projects) = visible {
            select = select.filter(model::Column::Project.is_in(projects.iter().cloned()));
        }
        if !query.is_empty() {
            select = select.filter(Expr::col(model::Column::Name).like(like_pattern(query)));
        }
        Ok(select.all(&self.db).await?)
    }

    pub async fn model_version(&self, key: &ModelKey, version: i64) -> StoreResult<Option<ModelVersionRecord>> {
        Ok(
            model_version::Entity::find_by_id((key.project.clone(), key.name.clone(), version))
                .one(&self.db)
                .await?,
        )
    }

    /// A model's versions matching `filter`, newest first.
    pub async fn list_model_versions(
        &self,
        key: &ModelKey,
        filter: &VersionFilter,
    ) -> StoreResult<Vec<ModelVersionRecord>> {
        let mut select = model_version::Entity::find()
            .filter(model_version::Column::Project.eq(&key.project))
            .filter(model_version::Column::Model.eq(&key.name))
            .order_by_desc(model_version::Column::Version)
            .limit(filter.limit);
        if filter.before_version > 0 {
            select = select.filter(model_version::Column::Version.lt(filter.before_version));
        }
        let of_model = || {
            Query::select()
                .column(model_tag::Column::Version)
                .from(model_tag::Entity)
                .and_where(model_tag::Column::Project.eq(key.project.as_str()))
                .and_where(model_tag::Column::Model.eq(key.name.as_str()))
                .to_owned()
        };
        for (key, value) in &filter.tags {
            let tagged = of_model()
                .and_where(model_tag::Column::Key.eq(key.as_str()))
                .and_where(model_tag::Column::Value.eq(value.as_str()))
                .to_owned();
            select = select.filter(model_version::Column::Version.in_subquery(tagged));
        }
        if !filter.query.is_empty() {
            let tag_values = of_model()
                .and_where(Expr::col(model_tag::Column::Value).like(like_pattern(&filter.query)))
                .to_owned();
            select = select.filter(
                Condition::any()
                    .add(Expr::col(model_version::Column::Description).like(like_pattern(&filter.query)))
                    .add(Expr::col(model_version::Column::JobId).like(like_pattern(&filter.query)))
                    .add(model_version::Column::Version.in_subquery(tag_values)),
            );
        }
        Ok(select.all(&self.db).await?)
    }

    /// The files of a version, by path.
    pub async fn model_files(&self, key: &ModelKey, version: i64) -> StoreResult<Vec<ModelFileRecord>> {
        Ok(model_file::Entity::find()
            .filter(model_file::Column::Project.eq(&key.project))
            .filter(model_file::Column::Model.eq(&key.name))
            .filter(model_file::Column::Version.eq(version))
            .order_by_asc(model_file::Column::Path)
            .all(&self.db)
            .await?)
    }

    /// The tags of some versions of a model, by version.
    pub async fn model_tags(
        &self,
        key: &ModelKey,
        versions: &[i64],
    ) -> StoreResult<BTreeMap<i64, BTreeMap<String, String>>> {
        let rows = model_tag::Entity::find()
            .filter(model_tag::Column::Project.eq(&key.project))
            .filter(model_tag::Column::Model.eq(&key.name))
            .filter(model_tag::Column::Version.is_in(versions.iter().copied()))
            .all(&self.db)
            .await?;
        let mut tags: BTreeMap<i64, BTreeMap<String, String>> = BTreeMap::new();
        for row in rows {
            tags.entry(row.version).or_default().insert(row.key, row.value);
        }
        Ok(tags)
    }

    /// Sets tags of a version (an empty value removes the tag), in one transaction.
    pub async fn set_model_tags(
        &self,
        key: &ModelKey,
        version: i64,
        tags: &BTreeMap<String, String>,
    ) -> StoreResult<()> {
        let txn = self.db.begin().await?;
        put_tags(&txn, key, version, tags).await?;
        txn.commit().await?;
        Ok(())
    }

    /// A model's aliases, alias -> version.
    pub async fn model_aliases(&self, key: &ModelKey) -> StoreResult<BTreeMap<String, i64>> {
        Ok(model_alias::Entity::find()
            .filter(model_alias::Column::Project.eq(&key.project))
            .filter(model_alias::Column::Model.eq(&key.name))
            .all(&self.db)
            .await?
            .into_iter()
            .map(|row| (row.alias, row.version))
            .collect())
    }

    /// The version an alias points at, if it exists.
    pub async fn model_alias(&self, key: &ModelKey, alias: &str) -> StoreResult<Option<i64>> {
        Ok(model_alias::Entity::find_by_id(alias_id(key, alias))
            .one(&self.db)
            .await?
            .map(|row| row.version))
    }

    /// Points `alias` at `version` (which the caller checked exists), moving it atomically.
    pub async fn set_model_alias(&self, key: &ModelKey, alias: &str, version: i64) -> StoreResult<()> {
        put_alias(&self.db, key, alias, version).await
    }

    /// Removes an alias; returns the version it pointed at, `None` when there was none.
    pub async fn delete_model_alias(&self, key: &ModelKey, alias: &str) -> StoreResult<Option<i64>> {
        let txn = self.db.begin().await?;
        let held = model_alias::Entity::find_by_id(alias_id(key, alias)).one(&txn).await?;
        model_alias::Entity::delete_by_id(alias_id(key, alias))
            .exec(&txn)
            .await?;
        txn.commit().await?;
        Ok(held.map(|row| row.version))
    }

    /// Tells whether a version of a model names the blob as one of its files.
    pub async fn blob_in_model(&self, digest: &str) -> StoreResult<bool> {
        Ok(model_file::Entity::find()
            .filter(model_file::Column::Sha256.eq(digest))
            .one(&self.db)
            .await?
            .is_some())
    }
}

/// A model as the store finds it: its project and its name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelKey {
    pub project: String,
    pub name: String,
}

impl ModelKey {
    pub fn new(project: &str, name: &str) -> ModelKey {
        ModelKey {
            project: project.to_string(),
            name: name.to_string(),
        }
    }

    /// The model as `home` writes it: its bare name in its own project, `PROJECT/NAME` elsewhere.
    pub fn relative_to(&self, home: &str) -> String {
        if self.project == home {
            self.name.clone()
        } else {
            format!("{}/{}", self.project, self.name)
        }
    }
}

impl std::fmt::Display for ModelKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.project, self.name)
    }
}

impl ModelRecord {
    pub fn key(&self) -> ModelKey {
        ModelKey::new(&self.project, &self.name)
    }
}

impl ModelVersionRecord {
    pub fn key(&self) -> ModelKey {
        ModelKey::new(&self.project, &self.model)
    }
}

fn alias_id(key: &ModelKey, alias: &str) -> (String, String, String) {
    (key.project.clone(), key.name.clone(), alias.to_string())
}

async fn put_tags(
    db: &impl ConnectionTrait,
    model: &ModelKey,
    version: i64,
    tags: &BTreeMap<String, String>,
) -> StoreResult<()> {
    for (key, value) in tags {
        if value.is_empty() {
            model_tag::Entity::delete_by_id((model.project.clone(), model.name.clone(), version, key.clone()))
                .exec(db)
                .await?;
            continue;
        }
        model_tag::Entity::insert(model_tag::ActiveModel {
            project: Set(model.project.clone()),
            model: Set(model.name.clone()),
            version: Set(version),
            key: Set(key.clone()),
            value: Set(value.clone()),
        })
        .on_conflict(
            OnConflict::columns([
                model_tag::Column::Project,
                model_tag::Column::Model,
                model_tag::Column::Version,
                model_tag::Column::Key,
            ])
            .update_column(model_tag::Column::Value)
            .to_owned(),
        )
        .exec_without_returning(db)
        .await?;
    }
    Ok(())
}

/// One upsert: the alias row either keeps its old version or gets the new one, never neither.
async fn put_alias(db: &impl ConnectionTrait, model: &ModelKey, alias: &str, version: i64) -> StoreResult<()> {
    model_alias::Entity::insert(model_alias::ActiveModel {
        project: Set(model.project.clone()),
        model: Set(model.name.clone()),
        alias: Set(alias.to_string()),
        version: Set(version),
        updated_at_ms: Set(now_ms()),
    })
    .on_conflict(
        OnConflict::columns([
            model_alias::Column::Project,
            model_alias::Column::Model,
            model_alias::Column::Alias,
        ])
        .update_columns([model_alias::Column::Version, model_alias::Column::UpdatedAtMs])
        .to_owned(),
    )
    .exec_without_returning(db)
    .await?;
    Ok(())
}
