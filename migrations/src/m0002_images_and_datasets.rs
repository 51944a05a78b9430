//! Container images, GPUs, run-time limits and datasets of jobs; the datasets table.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // SQLite adds one column per statement.
        let columns = [
            string("image").default("").take(),
            integer("gpus").default(0).take(),
            big_integer("max_runtime_secs").default(0).take(),
            text("datasets_json").default("[]").take(),
        ];
        for column in columns {
            manager
                .alter_table(Table::alter().table("jobs").add_column(column).to_owned())
                .await?;
        }
        manager
            .create_table(
                Table::create()
                    .table("datasets")
                    .if_not_exists()
                    .col(string("name").primary_key())
                    .col(string("digest"))
                    .col(big_integer("size"))
                    .col(string("created_by"))
                    .col(big_integer("created_at_ms"))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table("datasets").if_exists().to_owned())
            .await?;
        for column in ["image", "gpus", "max_runtime_secs", "datasets_json"] {
            manager
                .alter_table(Table::alter().table("jobs").drop_column(column).to_owned())
                .await?;
        }
        Ok(())
    }
}
