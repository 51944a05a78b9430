//! Sweeps: the sweep records and the advisor's append-only record of each sweep (every
//! suggestion, submission, observation, stop and end), from which a new leader resumes.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table("sweeps")
                    .if_not_exists()
                    .col(string("id").primary_key())
                    .col(string("owner_id"))
                    .col(string("project"))
                    .col(string("name"))
                    .col(text("spec_yaml"))
                    .col(text("spec_json"))
                    .col(string("code_digest"))
                    .col(string("state"))
                    .col(text("reason"))
                    .col(string("submit_key"))
                    .col(string("registered"))
                    .col(big_integer("created_at_ms"))
                    .col(big_integer_null("finished_at_ms"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("sweeps_state_idx")
                    .table("sweeps")
                    .col("state")
                    .col("created_at_ms")
                    .to_owned(),
            )
            .await?;
        // `seq` orders a sweep's events (one leader appends them); `dedupe` names what an
        // event records ("suggest:3", "observe:3:27"...), so recording it twice is refused.
        manager
            .create_table(
                Table::create()
                    .table("sweep_events")
                    .if_not_exists()
                    .col(string("sweep_id"))
                    .col(big_integer("seq"))
                    .col(string("dedupe"))
                    .col(string("kind"))
                    .col(integer("trial"))
                    .col(text("body_json"))
                    .col(big_integer("at_ms"))
                    .primary_key(Index::create().col("sweep_id").col("seq"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("sweep_events_dedupe_idx")
                    .table("sweep_events")
                    .col("sweep_id")
                    .col("dedupe")
                    .unique()
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in ["sweep_events", "sweeps"] {
            manager
                .drop_table(Table::drop().table(table).if_exists().to_owned())
                .await?;
        }
        Ok(())
    }
}
