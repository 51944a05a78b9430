//! Inference services (issue 16): the service records (the serving revision's definition as
//! JSON, with every revision kept in `service_revisions`), and the service whose worker a job
//! is (`jobs.service_id`; the member and revision it serves are in its environment).

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table("services")
                    .if_not_exists()
                    .col(string("id").primary_key())
                    .col(string("name").unique_key())
                    .col(string("project"))
                    .col(string("owner_id"))
                    .col(string("state"))
                    // The revision the predictors answer with, and the newest one (being rolled
                    // out while it is ahead of `revision`).
                    .col(big_integer("revision"))
                    .col(big_integer("latest_revision"))
                    // Workers per member (`kiln serve scale`), for every revision.
                    .col(integer("replicas"))
                    .col(text("reason"))
                    .col(big_integer("created_at_ms"))
                    .col(big_integer("updated_at_ms"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("service_revisions")
                    .if_not_exists()
                    .col(string("service_id"))
                    .col(big_integer("revision"))
                    .col(text("spec_json"))
                    .col(big_integer("created_at_ms"))
                    .primary_key(Index::create().col("service_id").col("revision"))
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table("jobs")
                    .add_column(string("service_id").default("").to_owned())
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("jobs_by_service")
                    .table("jobs")
                    .col("service_id")
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(Index::drop().name("jobs_by_service").table("jobs").to_owned())
            .await?;
        manager
            .alter_table(Table::alter().table("jobs").drop_column("service_id").to_owned())
            .await?;
        for table in ["service_revisions", "services"] {
            manager.drop_table(Table::drop().table(table).to_owned()).await?;
        }
        Ok(())
    }
}
