//! Checkpoints that outlive the instance (issue 28): a job records when its outputs were last
//! synced to object storage while it ran, and how many bytes they held then, for `kiln status`
//! (0 and 0 before the first sync).

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

const COLUMNS: [&str; 2] = ["outputs_synced_at_ms", "outputs_synced_bytes"];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // One column a statement: SQLite adds one at a time.
        for column in COLUMNS {
            manager
                .alter_table(
                    Table::alter()
                        .table("jobs")
                        .add_column(big_integer(column).default(0).to_owned())
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for column in COLUMNS {
            manager
                .alter_table(Table::alter().table("jobs").drop_column(column).to_owned())
                .await?;
        }
        Ok(())
    }
}
