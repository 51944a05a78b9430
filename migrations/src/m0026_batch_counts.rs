//! A batch's items counted by state in rows of their own (issue 29). Every status poll and every
//! scaler pass counted a batch's items with `GROUP BY state`; on Postgres that is a scan of the
//! batch's every row (232 ms at 200,000 items, measured on the topology harness), so replicas of
//! item-batch spent the database on counting. The counts change in the transactions that move
//! the items, so a read of them is as exact as the count was. Existing batches are counted once
//! here.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

const TABLE: &str = "batch_counts";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(TABLE)
                    .if_not_exists()
                    .col(string("batch_id"))
                    .col(string("state"))
                    .col(big_integer("n"))
                    .primary_key(Index::create().col("batch_id").col("state"))
                    .to_owned(),
            )
            .await?;
        manager
            .get_connection()
            .execute_unprepared(
                "INSERT INTO batch_counts (batch_id, state, n) \
                 SELECT batch_id, state, COUNT(*) FROM batch_items GROUP BY batch_id, state",
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.drop_table(Table::drop().table(TABLE).to_owned()).await
    }
}
