//! Tenancy closes its holes (issue 26): dataset names are unique per project, not across the
//! instance (`project_datasets`, keyed by (project, name), takes over from `datasets`; every
//! existing dataset keeps its name in its project); blobs belong to projects (`artifact_projects`: a digest is usable where
//! one of its projects may be read), back-filled from every record that names a blob (jobs' code,
//! datasets, runs' saved files, model files) and from the projects of each blob's uploader; and a
//! submit's idempotency key is stored with a canonical hash of the whole spec (`submit_hash`).

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

/// Statements that run unchanged on SQLite and Postgres, in order.
const UP: &[&str] = &[
    "CREATE TABLE project_datasets (
        project VARCHAR NOT NULL,
        name VARCHAR NOT NULL,
        digest VARCHAR NOT NULL,
        size BIGINT NOT NULL,
        created_by VARCHAR NOT NULL,
        created_at_ms BIGINT NOT NULL,
        PRIMARY KEY (project, name)
    )",
    "INSERT INTO project_datasets (project, name, digest, size, created_by, created_at_ms)
        SELECT project, name, digest, size, created_by, created_at_ms FROM datasets",
    "DROP TABLE datasets",
    "CREATE TABLE artifact_projects (
        digest VARCHAR NOT NULL,
        project VARCHAR NOT NULL,
        PRIMARY KEY (digest, project)
    )",
    "INSERT INTO artifact_projects (digest, project)
        SELECT DISTINCT code_digest, project FROM jobs WHERE code_digest <> ''
        UNION SELECT digest, project FROM project_datasets
        UNION SELECT r.digest, j.project FROM run_artifacts r JOIN jobs j ON j.id = r.job_id
        UNION SELECT f.sha256, m.project FROM model_files f JOIN models m ON m.name = f.model
        UNION SELECT a.digest, p.project FROM artifacts a JOIN project_members p ON p.user_id = a.created_by",
];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        for statement in UP {
            db.execute_unprepared(statement).await?;
        }
        manager
            .create_index(
                Index::create()
                    .name("artifact_projects_by_project")
                    .table("artifact_projects")
                    .col("project")
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table("jobs")
                    .add_column(string("submit_hash").default("").to_owned())
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(Table::alter().table("jobs").drop_column("submit_hash").to_owned())
            .await?;
        manager
            .drop_table(Table::drop().table("artifact_projects").to_owned())
            .await?;
        // Names unique across the instance again: keeps one dataset per name.
        let db = manager.get_connection();
        for statement in [
            "CREATE TABLE datasets (
                name VARCHAR NOT NULL PRIMARY KEY,
                digest VARCHAR NOT NULL,
                size BIGINT NOT NULL,
                created_by VARCHAR NOT NULL,
                created_at_ms BIGINT NOT NULL,
                project VARCHAR NOT NULL DEFAULT 'default'
            )",
            "INSERT INTO datasets (name, digest, size, created_by, created_at_ms, project)
                SELECT name, MIN(digest), MIN(size), MIN(created_by), MIN(created_at_ms), MIN(project)
                FROM project_datasets GROUP BY name",
            "DROP TABLE project_datasets",
        ] {
            db.execute_unprepared(statement).await?;
        }
        Ok(())
    }
}
