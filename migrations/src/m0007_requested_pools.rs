//! Requested pools (issue 12): a job may name the one pool it runs on (`kiln run --pool`), as
//! an AWS Batch job names its queue; empty lets the scheduler pick any pool that fits.

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
                    .add_column(string("requested_pool").default(""))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(Table::alter().table("jobs").drop_column("requested_pool").to_owned())
            .await
    }
}
