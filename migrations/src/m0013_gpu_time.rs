//! GPU time (issue 15): a job keeps the GPU-milliseconds of its attempts so far (its GPUs times
//! the time each attempt ran, as its runner measured it), so a sweep's GPU-hour budget counts
//! the attempts before a preemption too.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table("jobs")
                    .add_column(big_integer("gpu_ms").default(0).to_owned())
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(Table::alter().table("jobs").drop_column("gpu_ms").to_owned())
            .await
    }
}
