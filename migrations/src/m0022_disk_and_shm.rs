//! Disk and shared memory (issue 28): a job's own disk (`--disk`, a size-limited volume on its
//! runner, counted in placement) and its `/dev/shm` size (`--shm`); 0 for neither.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

const COLUMNS: [&str; 2] = ["disk_bytes", "shm_bytes"];

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
