//! The changes committed and not published yet are few among every job ever written: a partial
//! index holds only those rows (by runner), so a runner's re-drive of its own and the scheduling
//! leader's sweep of those whose runner is gone read a handful of rows, not the table.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // sea-query builds no partial index; this statement is the same on SQLite and Postgres.
        manager
            .get_connection()
            .execute_unprepared("CREATE INDEX jobs_unpublished ON jobs (runner_id) WHERE published_version < version")
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(Index::drop().name("jobs_unpublished").table("jobs").to_owned())
            .await
    }
}
