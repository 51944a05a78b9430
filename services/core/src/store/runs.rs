//! Run tracking: a job's config, summary values and sweep, and the files a run saved.

use sea_orm::sea_query::Expr;
use sea_orm::{ActiveValue::Set, ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect, TransactionTrait};

use super::entities::job::{Column, Entity as Jobs};
use super::entities::run_artifact;
use super::{JobRecord, Store, StoreError, StoreResult};
use crate::authz::Visible;
use crate::ids::now_ms;
use crate::runs::RunConfig;
use crate::state::JobState;

/// One file of a saved run artifact: `path` under the artifact `name` ("" when the artifact is
/// a single file), held by the content-addressed blob `digest` (sha256 hex) of `size` bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunArtifactFile {
    pub name: String,
    pub path: String,
    pub digest: String,
    pub size: i64,
}

/// Which jobs a listing returns, newest first.
#[derive(Debug, Clone)]
pub struct JobFilter {
    /// Only this owner's; `None` for every owner.
    pub owner_id: Option<String>,
    pub projects: Visible,
    /// Ended jobs too, not only live ones.
    pub all: bool,
    /// Only the trials of this sweep; `None` for any job.
    pub sweep_id: Option<String>,
    pub limit: u64,
}

/// The jobs of `filter`'s owner, projects and sweep.
fn whose(filter: &JobFilter) -> sea_orm::Select<Jobs> {
    let mut query = Jobs::find();
    if let Some(owner_id) = &filter.owner_id {
        query = query.filter(Column::OwnerId.eq(owner_id.as_str()));
    }
    if let Visible::Only(projects) = &filter.projects {
        query = query.filter(Column::Project.is_in(projects.iter().cloned()));
    }
    if let Some(sweep_id) = &filter.sweep_id {
        query = query.filter(Column::SweepId.eq(sweep_id.as_str()));
    }
    query
}

/// A config as stored in `config_json` / `summary_json`.
pub(super) fn config_json(config: &RunConfig) -> StoreResult<String> {
    serde_json::to_string(config).map_err(|e| StoreError::Corrupt(e.to_string()))
}

fn parse_config(text: &str) -> StoreResult<RunConfig> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("run config: {e}")))
}

impl JobRecord {
    /// The run's config: flat `a.b` keys with typed values.
    pub fn config(&self) -> StoreResult<RunConfig> {
        parse_config(&self.config_json)
    }

    /// The run's summary values (`kiln.summary`).
    pub fn summary(&self) -> StoreResult<RunConfig> {
        parse_config(&self.summary_json)
    }
}

impl Store {
    /// Jobs by `filter`, newest first.
    pub async fn list_jobs_where(&self, filter: &JobFilter) -> StoreResult<Vec<JobRecord>> {
        let mut query = whose(filter);
        if !filter.all {
            let live = JobState::ALL
                .into_iter()
                .filter(|s| !s.is_terminal())
                .map(JobState::as_str);
            query = query.filter(Column::State.is_in(live));
        }
        Ok(query
            .order_by_desc(Column::Id)
            .limit(filter.limit)
            .all(&self.db)
            .await?)
    }

    /// The jobs of `ids` whose owner, project and sweep `filter` lets through, in any state
    /// (`all` and `limit` aside): the changes of a watched list.
    pub async fn changed_jobs_where(&self, ids: &[String], filter: &JobFilter) -> StoreResult<Vec<JobRecord>> {
        let mut changed = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(500) {
            let rows = whose(filter)
                .filter(Column::Id.is_in(chunk.iter().map(String::as_str)))
                .all(&self.db)
                .await?;
            changed.extend(rows);
        }
        changed.sort_unstable_by(|a, b| b.id.cmp(&a.id));
        Ok(changed)
    }

    /// Merges `config` and `summary` into the job's (a key given again takes the new value;
    /// the others stay). Not a state change: the version stays. Returns the new record.
    pub async fn update_run(&self, job_id: &str, config: &RunConfig, summary: &RunConfig) -> StoreResult<JobRecord> {
        // A compare-and-set on the stored texts, retried: two concurrent merges both land.
        for _ in 0..32 {
            let job = self.job(job_id).await?;
            let mut merged_config = job.config()?;
            merged_config.extend(config.iter().map(|(k, v)| (k.clone(), v.clone())));
            let mut merged_summary = job.summary()?;
            merged_summary.extend(summary.iter().map(|(k, v)| (k.clone(), v.clone())));
            let result = Jobs::update_many()
                .col_expr(Column::ConfigJson, Expr::value(config_json(&merged_config)?))
                .col_expr(Column::SummaryJson, Expr::value(config_json(&merged_summary)?))
                .filter(Column::Id.eq(job_id))
                .filter(Column::ConfigJson.eq(job.config_json.as_str()))
                .filter(Column::SummaryJson.eq(job.summary_json.as_str()))
                .exec(&self.db)
                .await?;
            if result.rows_affected > 0 {
                return self.job(job_id).await;
            }
        }
        let job = self.job(job_id).await?;
        Err(StoreError::Conflict {
            job_id: job.id,
            expected: job.version,
            actual: job.version,
            state: job.state,
        })
    }

    /// Records the files of a run artifact `name` (a file: one file with path ""; a directory:
    /// its files by relative path), replacing what was saved under that name before, at once.
    pub async fn save_run_artifact(&self, job_id: &str, name: &str, files: &[RunArtifactFile]) -> StoreResult<()> {
        let now = now_ms();
        let rows: Vec<run_artifact::ActiveModel> = files
            .iter()
            .map(|file| run_artifact::ActiveModel {
                job_id: Set(job_id.to_string()),
                name: Set(name.to_string()),
                path: Set(file.path.clone()),
                digest: Set(file.digest.clone()),
                size: Set(file.size),
                created_at_ms: Set(now),
            })
            .collect();
        let txn = self.db.begin().await?;
        run_artifact::Entity::delete_many()
            .filter(run_artifact::Column::JobId.eq(job_id))
            .filter(run_artifact::Column::Name.eq(name))
            .exec(&txn)
            .await?;
        // Postgres takes at most 65535 parameters a statement: 6 a row.
        for chunk in rows.chunks(5000) {
            run_artifact::Entity::insert_many(chunk.to_vec())
                .exec_without_returning(&txn)
                .await?;
        }
        txn.commit().await?;
        Ok(())
    }

    /// Every file a run saved, by artifact name then path: what `kiln.save` stored, for
    /// listings, downloads and the registry (which copies the blobs by digest).
    pub async fn run_artifact_files(&self, job_id: &str) -> StoreResult<Vec<RunArtifactFile>> {
        let rows = run_artifact::Entity::find()
            .filter(run_artifact::Column::JobId.eq(job_id))
            .order_by_asc(run_artifact::Column::Name)
            .order_by_asc(run_artifact::Column::Path)
            .all(&self.db)
            .await?;
        Ok(rows.into_iter().map(RunArtifactFile::from).collect())
    }

    /// One file of a run artifact, if it was saved.
    pub async fn run_artifact_file(
        &self,
        job_id: &str,
        name: &str,
        path: &str,
    ) -> StoreResult<Option<RunArtifactFile>> {
        Ok(
            run_artifact::Entity::find_by_id((job_id.to_string(), name.to_string(), path.to_string()))
                .one(&self.db)
                .await?
                .map(RunArtifactFile::from),
        )
    }

    /// Whether a saved run artifact names the blob.
    pub(super) async fn run_artifact_names_blob(&self, digest: &str) -> StoreResult<bool> {
        Ok(run_artifact::Entity::find()
            .filter(run_artifact::Column::Digest.eq(digest))
            .one(&self.db)
            .await?
            .is_some())
    }
}

impl From<run_artifact::Model> for RunArtifactFile {
    fn from(row: run_artifact::Model) -> Self {
        RunArtifactFile {
            name: row.name,
            path: row.path,
            digest: row.digest,
            size: row.size,
        }
    }
}
