//! Gang jobs (issue 28): a job of `nodes` nodes, placed together, records the rendezvous address
//! of each attempt (`gang_master`, `host:port`) and one row per node of each attempt in
//! `job_nodes`: the runner the scheduler placed it on, and what that runner last reported
//! (its state, exit and heartbeat), which the job's rank-0 runner watches.

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
                    .add_column(integer("nodes").default(1).to_owned())
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table("jobs")
                    .add_column(string("gang_master").default("").to_owned())
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("job_nodes")
                    .if_not_exists()
                    .col(string("job_id"))
                    .col(integer("attempt"))
                    .col(integer("rank"))
                    .col(string("runner_id"))
                    // placed -> provisioning -> ready -> running -> exited | lost
                    .col(string("state"))
                    .col(integer_null("exit_code"))
                    .col(text("reason").default(""))
                    .col(big_integer("heartbeat_ms").default(0))
                    .primary_key(Index::create().col("job_id").col("attempt").col("rank"))
                    .to_owned(),
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.drop_table(Table::drop().table("job_nodes").to_owned()).await?;
        for column in ["nodes", "gang_master"] {
            manager
                .alter_table(Table::alter().table("jobs").drop_column(column).to_owned())
                .await?;
        }
        Ok(())
    }
}
