//! Checkpoints that outlive the instance (issue 28): a job records when its outputs were last
//! synced to object storage while it ran, and how many bytes they held then, for `kiln status`
//! (0 and 0 before the first sync).

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

const COLUMNS: [&str; 2] = ["outputs_synced_at_ms", "outputs_synced_bytes"];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        crate::columns::add_big_integers(manager, "jobs", &COLUMNS).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        crate::columns::drop(manager, "jobs", &COLUMNS).await
    }
}
