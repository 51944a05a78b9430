//! Model and service names are unique per project, not across the instance (issue 26), as
//! dataset names became in m0016: the registry's tables are keyed by (project, model name)
//! (`project_models`, `project_model_versions`, `project_model_files`, `project_model_tags`,
//! `project_model_aliases` take over from `models`, `model_versions`, ...), and services are
//! unique on (project, name) instead of name (`project_services` takes over from `services`).
//! Every existing row keeps its name in its project.
//!
//! The tables take new names rather than the old ones back: on SQLite a connection of the pool
//! that read the schema before keeps it until a statement of its finds a table missing, and
//! would otherwise check an upsert's conflict target or a new table's name against the old one.
//!
//! Before the rekey, while a name still means one model, the references that named another
//! project's model by its bare name are qualified: a service revision's member (in
//! `service_revisions.spec_json`) and a worker job's `KILN_SERVE_MODEL` become `PROJECT/NAME`
//! when the model is not of the service's (the job's) project, since a bare name now means the
//! model of the naming project.

use std::collections::HashMap;

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{ConnectionTrait, Statement};

#[derive(DeriveMigrationName)]
pub struct Migration;

/// The registry's tables keyed by (project, model), each made anew and filled from the old one
/// (children take their model's project), and the services' unique per project. Statements
/// that run unchanged on SQLite and Postgres, in order.
const UP: &[&str] = &[
    "CREATE TABLE project_models (
        project VARCHAR NOT NULL,
        name VARCHAR NOT NULL,
        created_by VARCHAR NOT NULL,
        created_at_ms BIGINT NOT NULL,
        latest_version BIGINT NOT NULL DEFAULT 0,
        PRIMARY KEY (project, name)
    )",
    "INSERT INTO project_models (project, name, created_by, created_at_ms, latest_version)
        SELECT project, name, created_by, created_at_ms, latest_version FROM models",
    "CREATE TABLE project_model_versions (
        project VARCHAR NOT NULL,
        model VARCHAR NOT NULL,
        version BIGINT NOT NULL,
        digest VARCHAR NOT NULL,
        size BIGINT NOT NULL,
        job_id VARCHAR NOT NULL,
        description TEXT NOT NULL,
        lineage_json TEXT NOT NULL,
        created_by VARCHAR NOT NULL,
        created_at_ms BIGINT NOT NULL,
        PRIMARY KEY (project, model, version)
    )",
    "INSERT INTO project_model_versions (project, model, version, digest, size, job_id, description,
            lineage_json, created_by, created_at_ms)
        SELECT m.project, v.model, v.version, v.digest, v.size, v.job_id, v.description,
            v.lineage_json, v.created_by, v.created_at_ms
        FROM model_versions v JOIN models m ON m.name = v.model",
    "CREATE TABLE project_model_files (
        project VARCHAR NOT NULL,
        model VARCHAR NOT NULL,
        version BIGINT NOT NULL,
        path VARCHAR NOT NULL,
        sha256 VARCHAR NOT NULL,
        size BIGINT NOT NULL,
        PRIMARY KEY (project, model, version, path)
    )",
    "INSERT INTO project_model_files (project, model, version, path, sha256, size)
        SELECT m.project, f.model, f.version, f.path, f.sha256, f.size
        FROM model_files f JOIN models m ON m.name = f.model",
    "CREATE TABLE project_model_tags (
        project VARCHAR NOT NULL,
        model VARCHAR NOT NULL,
        version BIGINT NOT NULL,
        \"key\" VARCHAR NOT NULL,
        \"value\" VARCHAR NOT NULL,
        PRIMARY KEY (project, model, version, \"key\")
    )",
    "INSERT INTO project_model_tags (project, model, version, \"key\", \"value\")
        SELECT m.project, t.model, t.version, t.\"key\", t.\"value\"
        FROM model_tags t JOIN models m ON m.name = t.model",
    "CREATE TABLE project_model_aliases (
        project VARCHAR NOT NULL,
        model VARCHAR NOT NULL,
        alias VARCHAR NOT NULL,
        version BIGINT NOT NULL,
        updated_at_ms BIGINT NOT NULL,
        PRIMARY KEY (project, model, alias)
    )",
    "INSERT INTO project_model_aliases (project, model, alias, version, updated_at_ms)
        SELECT m.project, a.model, a.alias, a.version, a.updated_at_ms
        FROM model_aliases a JOIN models m ON m.name = a.model",
    // The old tables go with their indexes.
    "DROP TABLE model_aliases",
    "DROP TABLE model_tags",
    "DROP TABLE model_files",
    "DROP TABLE model_versions",
    "DROP TABLE models",
    // A bare name with no project resolves among the projects the caller may read.
    "CREATE INDEX project_models_by_name ON project_models (name)",
    "CREATE INDEX project_model_versions_by_job ON project_model_versions (job_id)",
    "CREATE INDEX project_model_files_by_sha256 ON project_model_files (sha256)",
    // Tag filters (`--tag stage=prod`) of one model's versions.
    "CREATE INDEX project_model_tags_by_value ON project_model_tags (project, model, \"key\", \"value\", version)",
    // Services: unique per project. SQLite cannot drop a column's UNIQUE, so the table is
    // made anew with every column m0014, m0015 and m0017 gave it.
    "CREATE TABLE project_services (
        id VARCHAR NOT NULL PRIMARY KEY,
        name VARCHAR NOT NULL,
        project VARCHAR NOT NULL,
        owner_id VARCHAR NOT NULL,
        state VARCHAR NOT NULL,
        revision BIGINT NOT NULL,
        latest_revision BIGINT NOT NULL,
        replicas INTEGER NOT NULL,
        reason TEXT NOT NULL,
        created_at_ms BIGINT NOT NULL,
        updated_at_ms BIGINT NOT NULL,
        scaling_json TEXT NOT NULL DEFAULT '',
        traffic INTEGER NOT NULL DEFAULT 100,
        shadow BOOLEAN NOT NULL DEFAULT FALSE,
        paused_reason TEXT NOT NULL DEFAULT '',
        UNIQUE (project, name)
    )",
    "INSERT INTO project_services (id, name, project, owner_id, state, revision, latest_revision,
            replicas, reason, created_at_ms, updated_at_ms, scaling_json, traffic, shadow,
            paused_reason)
        SELECT id, name, project, owner_id, state, revision, latest_revision, replicas, reason,
            created_at_ms, updated_at_ms, scaling_json, traffic, shadow, paused_reason
        FROM services",
    "DROP TABLE services",
    "CREATE INDEX project_services_by_name ON project_services (name)",
];

/// Back to names unique in the instance, in the tables of before: one model (and one service)
/// is kept per name, the one of the first project by name; the rest are dropped.
const DOWN: &[&str] = &[
    "CREATE TABLE models (
        name VARCHAR NOT NULL PRIMARY KEY,
        project VARCHAR NOT NULL,
        created_by VARCHAR NOT NULL,
        created_at_ms BIGINT NOT NULL,
        latest_version BIGINT NOT NULL DEFAULT 0
    )",
    "INSERT INTO models (name, project, created_by, created_at_ms, latest_version)
        SELECT m.name, m.project, m.created_by, m.created_at_ms, m.latest_version FROM project_models m
        WHERE m.project = (SELECT MIN(o.project) FROM project_models o WHERE o.name = m.name)",
    "CREATE TABLE model_versions (
        model VARCHAR NOT NULL,
        version BIGINT NOT NULL,
        digest VARCHAR NOT NULL,
        size BIGINT NOT NULL,
        job_id VARCHAR NOT NULL,
        description TEXT NOT NULL,
        lineage_json TEXT NOT NULL,
        created_by VARCHAR NOT NULL,
        created_at_ms BIGINT NOT NULL,
        PRIMARY KEY (model, version)
    )",
    "INSERT INTO model_versions (model, version, digest, size, job_id, description,
            lineage_json, created_by, created_at_ms)
        SELECT v.model, v.version, v.digest, v.size, v.job_id, v.description, v.lineage_json,
            v.created_by, v.created_at_ms
        FROM project_model_versions v JOIN models g ON g.name = v.model AND g.project = v.project",
    "CREATE TABLE model_files (
        model VARCHAR NOT NULL,
        version BIGINT NOT NULL,
        path VARCHAR NOT NULL,
        sha256 VARCHAR NOT NULL,
        size BIGINT NOT NULL,
        PRIMARY KEY (model, version, path)
    )",
    "INSERT INTO model_files (model, version, path, sha256, size)
        SELECT f.model, f.version, f.path, f.sha256, f.size
        FROM project_model_files f JOIN models g ON g.name = f.model AND g.project = f.project",
    "CREATE TABLE model_tags (
        model VARCHAR NOT NULL,
        version BIGINT NOT NULL,
        \"key\" VARCHAR NOT NULL,
        \"value\" VARCHAR NOT NULL,
        PRIMARY KEY (model, version, \"key\")
    )",
    "INSERT INTO model_tags (model, version, \"key\", \"value\")
        SELECT t.model, t.version, t.\"key\", t.\"value\"
        FROM project_model_tags t JOIN models g ON g.name = t.model AND g.project = t.project",
    "CREATE TABLE model_aliases (
        model VARCHAR NOT NULL,
        alias VARCHAR NOT NULL,
        version BIGINT NOT NULL,
        updated_at_ms BIGINT NOT NULL,
        PRIMARY KEY (model, alias)
    )",
    "INSERT INTO model_aliases (model, alias, version, updated_at_ms)
        SELECT a.model, a.alias, a.version, a.updated_at_ms
        FROM project_model_aliases a JOIN models g ON g.name = a.model AND g.project = a.project",
    "DROP TABLE project_model_aliases",
    "DROP TABLE project_model_tags",
    "DROP TABLE project_model_files",
    "DROP TABLE project_model_versions",
    "DROP TABLE project_models",
    "CREATE INDEX models_by_project ON models (project, name)",
    "CREATE INDEX model_versions_by_job ON model_versions (job_id)",
    "CREATE INDEX model_files_by_sha256 ON model_files (sha256)",
    "CREATE INDEX model_tags_by_value ON model_tags (model, \"key\", \"value\", version)",
    "CREATE TABLE services (
        id VARCHAR NOT NULL PRIMARY KEY,
        name VARCHAR NOT NULL UNIQUE,
        project VARCHAR NOT NULL,
        owner_id VARCHAR NOT NULL,
        state VARCHAR NOT NULL,
        revision BIGINT NOT NULL,
        latest_revision BIGINT NOT NULL,
        replicas INTEGER NOT NULL,
        reason TEXT NOT NULL,
        created_at_ms BIGINT NOT NULL,
        updated_at_ms BIGINT NOT NULL,
        scaling_json TEXT NOT NULL DEFAULT '',
        traffic INTEGER NOT NULL DEFAULT 100,
        shadow BOOLEAN NOT NULL DEFAULT FALSE,
        paused_reason TEXT NOT NULL DEFAULT ''
    )",
    "INSERT INTO services (id, name, project, owner_id, state, revision, latest_revision,
            replicas, reason, created_at_ms, updated_at_ms, scaling_json, traffic, shadow,
            paused_reason)
        SELECT s.id, s.name, s.project, s.owner_id, s.state, s.revision, s.latest_revision,
            s.replicas, s.reason, s.created_at_ms, s.updated_at_ms, s.scaling_json, s.traffic,
            s.shadow, s.paused_reason
        FROM project_services s
        WHERE s.project = (SELECT MIN(o.project) FROM project_services o WHERE o.name = s.name)",
    "DROP TABLE project_services",
];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    /// In one transaction on SQLite too (sea-orm makes one on Postgres only): all of the rekey
    /// or none of it.
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }

    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        qualify_cross_project_models(manager).await?;
        let db = manager.get_connection();
        for statement in UP {
            db.execute_unprepared(statement).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        for statement in DOWN {
            db.execute_unprepared(statement).await?;
        }
        Ok(())
    }
}

/// Qualifies every bare reference to a model of another project than the one naming it (a
/// service's revisions, a service worker's environment), while names are still global.
async fn qualify_cross_project_models(manager: &SchemaManager<'_>) -> Result<(), DbErr> {
    let db = manager.get_connection();
    let backend = db.get_database_backend();
    let rows = |sql: &str| Statement::from_string(backend, sql.to_string());
    let mut model_projects = HashMap::new();
    for row in db.query_all_raw(rows("SELECT name, project FROM models")).await? {
        model_projects.insert(
            row.try_get::<String>("", "name")?,
            row.try_get::<String>("", "project")?,
        );
    }
    if model_projects.is_empty() {
        return Ok(());
    }
    let revisions = db
        .query_all_raw(rows(
            "SELECT r.service_id, r.revision, r.spec_json, s.project FROM service_revisions r
             JOIN services s ON s.id = r.service_id",
        ))
        .await?;
    for row in revisions {
        let service_id: String = row.try_get("", "service_id")?;
        let revision: i64 = row.try_get("", "revision")?;
        let project: String = row.try_get("", "project")?;
        let spec_json: String = row.try_get("", "spec_json")?;
        let Some(qualified) = qualify_revision(&spec_json, &project, &model_projects) else {
            continue;
        };
        let update = Query::update()
            .table("service_revisions")
            .value("spec_json", qualified)
            .and_where(Expr::col("service_id").eq(service_id))
            .and_where(Expr::col("revision").eq(revision))
            .to_owned();
        db.execute(&update).await?;
    }
    let workers = db
        .query_all_raw(rows(
            "SELECT id, project, env_json FROM jobs WHERE service_id <> '' AND env_json LIKE '%KILN_SERVE_MODEL%'",
        ))
        .await?;
    for row in workers {
        let id: String = row.try_get("", "id")?;
        let project: String = row.try_get("", "project")?;
        let env_json: String = row.try_get("", "env_json")?;
        let Some(qualified) = qualify_worker_env(&env_json, &project, &model_projects) else {
            continue;
        };
        let update = Query::update()
            .table("jobs")
            .value("env_json", qualified)
            .and_where(Expr::col("id").eq(id))
            .to_owned();
        db.execute(&update).await?;
    }
    Ok(())
}

/// `name` as `project` names it: bare for its own models, `PROJECT/NAME` for another's.
fn qualified(name: &str, project: &str, model_projects: &HashMap<String, String>) -> Option<String> {
    match model_projects.get(name) {
        Some(owner) if owner != project && !name.contains('/') => Some(format!("{owner}/{name}")),
        _ => None,
    }
}

/// A revision (its JSON) with each member's model qualified where needed; `None` when
/// nothing changes.
fn qualify_revision(spec_json: &str, project: &str, model_projects: &HashMap<String, String>) -> Option<String> {
    let mut spec: serde_json::Value = serde_json::from_str(spec_json).ok()?;
    let mut changed = false;
    for member in spec.get_mut("members")?.as_array_mut()? {
        let Some(model) = member.get("model").and_then(|model| model.as_str()).map(str::to_string) else {
            continue;
        };
        let Some(full) = qualified(&model, project, model_projects) else {
            continue;
        };
        member["model"] = serde_json::Value::String(full.clone());
        // What was asked (`NAME@alias`, `NAME:3`, `NAME`) keeps its suffix.
        if let Some(asked) = member.get("asked").and_then(|asked| asked.as_str())
            && asked.starts_with(model.as_str())
        {
            member["asked"] = serde_json::Value::String(format!("{full}{}", &asked[model.len()..]));
        }
        changed = true;
    }
    changed.then(|| spec.to_string())
}

/// A worker's environment (its JSON) with `KILN_SERVE_MODEL` (`NAME:VERSION`) qualified where
/// needed; `None` when nothing changes.
fn qualify_worker_env(env_json: &str, project: &str, model_projects: &HashMap<String, String>) -> Option<String> {
    let mut env: serde_json::Map<String, serde_json::Value> = serde_json::from_str(env_json).ok()?;
    let model = env.get("KILN_SERVE_MODEL")?.as_str()?.to_string();
    let (name, version) = model.rsplit_once(':')?;
    let full = qualified(name, project, model_projects)?;
    env.insert(
        "KILN_SERVE_MODEL".into(),
        serde_json::Value::String(format!("{full}:{version}")),
    );
    Some(serde_json::Value::Object(env).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owners() -> HashMap<String, String> {
        HashMap::from([
            ("resnet".to_string(), "alpha".to_string()),
            ("bert".to_string(), "beta".to_string()),
        ])
    }

    #[test]
    fn only_another_projects_models_are_qualified() {
        let revision = r#"{"revision":1,"members":[
            {"name":"resnet","asked":"resnet@prod","model":"resnet","version":3,"weight":1.0},
            {"name":"bert","asked":"bert","model":"bert","version":1,"weight":1.0}]}"#;
        let qualified: serde_json::Value =
            serde_json::from_str(&qualify_revision(revision, "beta", &owners()).unwrap()).unwrap();
        assert_eq!(qualified["members"][0]["model"], "alpha/resnet");
        assert_eq!(qualified["members"][0]["asked"], "alpha/resnet@prod");
        assert_eq!(qualified["members"][1]["model"], "bert");
        assert_eq!(qualified["revision"], 1);
        // A service of the models' own project changes nothing.
        let own = r#"{"members":[{"name":"bert","asked":"bert","model":"bert","version":1,"weight":1.0}]}"#;
        assert_eq!(qualify_revision(own, "beta", &owners()), None);
    }

    #[test]
    fn a_workers_model_is_qualified_with_its_version() {
        let env = r#"{"KILN_SERVE_MODEL":"resnet:3","KILN_SERVE_SERVICE":"digits"}"#;
        let qualified: serde_json::Value =
            serde_json::from_str(&qualify_worker_env(env, "beta", &owners()).unwrap()).unwrap();
        assert_eq!(qualified["KILN_SERVE_MODEL"], "alpha/resnet:3");
        assert_eq!(qualified["KILN_SERVE_SERVICE"], "digits");
        assert_eq!(qualify_worker_env(env, "alpha", &owners()), None);
        assert_eq!(qualify_worker_env(r#"{"X":"1"}"#, "beta", &owners()), None);
    }
}
