//! Submit idempotency keys (issue 12): a client that lost the answer to a submit (its api
//! replica died after the commit) retries with the same key and gets the same job, never a
//! second one. Unique per owner; NULL (no key) never collides, on Postgres as on SQLite.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

const INDEX: &str = "jobs_owner_submit_key";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table("jobs")
                    .add_column(string_null("submit_key"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name(INDEX)
                    .table("jobs")
                    .col("owner_id")
                    .col("submit_key")
                    .unique()
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(Index::drop().name(INDEX).table("jobs").to_owned())
            .await?;
        manager
            .alter_table(Table::alter().table("jobs").drop_column("submit_key").to_owned())
            .await
    }
}
