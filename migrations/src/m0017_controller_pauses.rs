//! Controllers pause when their owner may no longer run jobs (issue 26): a sweep, an inference
//! service or a batch whose owner was disabled, or removed from (or made a viewer of) its
//! project, makes no more jobs and says why in `paused_reason` (empty while it is not paused),
//! beside its state. See docs/security/controllers.md.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

/// The tables of the three controllers' records.
const TABLES: [&str; 3] = ["sweeps", "services", "batches"];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // One column a statement: SQLite adds one at a time.
        for table in TABLES {
            manager
                .alter_table(
                    Table::alter()
                        .table(table)
                        .add_column(text("paused_reason").default(""))
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in TABLES {
            manager
                .alter_table(Table::alter().table(table).drop_column("paused_reason").to_owned())
                .await?;
        }
        Ok(())
    }
}
