//! Stalled batches (issue 13): a batch whose workers keep failing to start stops asking for
//! more. `stalled_reason` says why (empty while the batch is not stalled); worker failures
//! count only among the workers asked for at or after `worker_failures_since_ms`, which
//! `RetryFailed` moves to its own time, so a retry after a fix starts the count afresh.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // One column per statement: SQLite adds one at a time.
        manager
            .alter_table(
                Table::alter()
                    .table("batches")
                    .add_column(text("stalled_reason").default(""))
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table("batches")
                    .add_column(big_integer("worker_failures_since_ms").default(0))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for column in ["worker_failures_since_ms", "stalled_reason"] {
            manager
                .alter_table(Table::alter().table("batches").drop_column(column).to_owned())
                .await?;
        }
        Ok(())
    }
}
