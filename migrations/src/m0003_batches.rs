//! Batch jobs: batches, their items, the attempts worth keeping (failed or with output), and the
//! batch a worker job serves.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table("batches")
                    .if_not_exists()
                    .col(string("id").primary_key())
                    .col(string("owner_id"))
                    .col(string("project"))
                    .col(string("name"))
                    .col(text("spec_json"))
                    .col(string("state"))
                    .col(big_integer("created_at_ms"))
                    .col(big_integer_null("sealed_at_ms"))
                    .col(big_integer_null("finished_at_ms"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("batch_items")
                    .if_not_exists()
                    .col(string("batch_id"))
                    .col(string("item_key"))
                    .col(text("uri"))
                    .col(text("params_json"))
                    .col(string("content_sha256"))
                    .col(string("state"))
                    .col(boolean("published"))
                    .col(integer("round"))
                    .col(integer("attempts"))
                    .col(integer("last_attempt"))
                    .col(integer_null("exit_code"))
                    .col(text("reason"))
                    .col(double("cpu_seconds"))
                    .col(big_integer("peak_memory_bytes"))
                    .col(big_integer("updated_at_ms"))
                    .primary_key(Index::create().col("batch_id").col("item_key"))
                    .to_owned(),
            )
            .await?;
        for (name, columns) in [
            ("batch_items_state_idx", ["batch_id", "state", "item_key"]),
            ("batch_items_published_idx", ["batch_id", "published", "item_key"]),
        ] {
            let mut index = Index::create();
            index.name(name).table("batch_items");
            for column in columns {
                index.col(column);
            }
            manager.create_index(index.to_owned()).await?;
        }
        manager
            .create_table(
                Table::create()
                    .table("item_attempts")
                    .if_not_exists()
                    .col(string("batch_id"))
                    .col(string("item_key"))
                    .col(integer("attempt"))
                    .col(integer("round"))
                    .col(integer_null("exit_code"))
                    .col(text("reason"))
                    .col(text("lines_json"))
                    .col(big_integer("finished_at_ms"))
                    .primary_key(Index::create().col("batch_id").col("item_key").col("attempt"))
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table("jobs")
                    .add_column(string("batch_id").default(""))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(Table::alter().table("jobs").drop_column("batch_id").to_owned())
            .await?;
        for table in ["item_attempts", "batch_items", "batches"] {
            manager
                .drop_table(Table::drop().table(table).if_exists().to_owned())
                .await?;
        }
        Ok(())
    }
}
