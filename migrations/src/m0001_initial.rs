//! Users, API tokens, jobs and artifacts.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table("users")
                    .if_not_exists()
                    .col(string("id").primary_key())
                    .col(string_uniq("name"))
                    .col(boolean("is_admin"))
                    .col(big_integer("created_at_ms"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("api_tokens")
                    .if_not_exists()
                    .col(string("id").primary_key())
                    .col(string("user_id"))
                    .col(string("secret_sha256"))
                    .col(string("name"))
                    .col(string("scope"))
                    .col(boolean("revoked"))
                    .col(big_integer("created_at_ms"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("jobs")
                    .if_not_exists()
                    .col(string("id").primary_key())
                    .col(string("owner_id"))
                    .col(string("project"))
                    .col(string("name"))
                    .col(text("command_json"))
                    .col(text("env_json"))
                    .col(big_integer("cpu_millis"))
                    .col(big_integer("memory_bytes"))
                    .col(string("code_digest"))
                    .col(string("state"))
                    .col(big_integer("version"))
                    .col(big_integer("published_version"))
                    .col(integer("attempt"))
                    .col(string("pool"))
                    .col(string("runner_id"))
                    .col(string("instance_id"))
                    .col(integer_null("exit_code"))
                    .col(text("reason"))
                    .col(boolean("stop_requested"))
                    .col(big_integer("created_at_ms"))
                    .col(big_integer("updated_at_ms"))
                    .col(big_integer_null("started_at_ms"))
                    .col(big_integer_null("finished_at_ms"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("jobs_state_idx")
                    .table("jobs")
                    .col("state")
                    .col("created_at_ms")
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("jobs_owner_idx")
                    .table("jobs")
                    .col("owner_id")
                    .col("created_at_ms")
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("artifacts")
                    .if_not_exists()
                    .col(string("digest").primary_key())
                    .col(big_integer("size"))
                    .col(string("created_by"))
                    .col(big_integer("created_at_ms"))
                    .to_owned(),
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in ["artifacts", "jobs", "api_tokens", "users"] {
            manager
                .drop_table(Table::drop().table(table).if_exists().to_owned())
                .await?;
        }
        Ok(())
    }
}
