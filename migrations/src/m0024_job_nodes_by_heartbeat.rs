//! The scheduler reads, every pass, the gang nodes of ended attempts still stopping (not ended,
//! heard from lately): an index on state and heartbeat keeps that read off a scan of every node
//! row ever written.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

const INDEX: &str = "job_nodes_by_state_heartbeat";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_index(
                Index::create()
                    .name(INDEX)
                    .table("job_nodes")
                    .col("state")
                    .col("heartbeat_ms")
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(Index::drop().name(INDEX).table("job_nodes").to_owned())
            .await
    }
}
