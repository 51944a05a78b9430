//! Every runner re-drives the unpublished changes of its own jobs each report interval: an index
//! on the runner keeps that read off a scan of every job ever written (a thousand runners
//! scanned the whole table several hundred times a second).

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

const INDEX: &str = "jobs_by_runner";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_index(Index::create().name(INDEX).table("jobs").col("runner_id").to_owned())
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(Index::drop().name(INDEX).table("jobs").to_owned())
            .await
    }
}
