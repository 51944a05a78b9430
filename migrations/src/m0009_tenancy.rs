//! Teams (issue 14): projects are records with members in roles, users can be disabled, tokens
//! have expiry, last use and an optional project and role they are narrowed to, datasets carry
//! their project, and projects keep secrets, encrypted. Existing data keeps working: every
//! project named by a job or batch becomes a record, with the owners of its jobs and batches as
//! members, beside the `default` project every instance has.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // One column per statement: SQLite adds one at a time.
        let added = [
            ("users", boolean("disabled").default(false).to_owned()),
            ("api_tokens", big_integer_null("expires_at_ms").to_owned()),
            ("api_tokens", big_integer_null("last_used_at_ms").to_owned()),
            ("api_tokens", string("project").default("").to_owned()),
            ("api_tokens", string("role").default("").to_owned()),
            ("datasets", string("project").default("default").to_owned()),
            ("jobs", text("secrets_json").default("[]").to_owned()),
        ];
        for (table, mut column) in added {
            manager
                .alter_table(Table::alter().table(table).add_column(&mut column).to_owned())
                .await?;
        }
        manager
            .create_table(
                Table::create()
                    .table("projects")
                    .if_not_exists()
                    .col(string("name").primary_key())
                    .col(big_integer("created_at_ms"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("project_members")
                    .if_not_exists()
                    .col(string("project"))
                    .col(string("user_id"))
                    .col(string("role"))
                    .col(big_integer("created_at_ms"))
                    .primary_key(Index::create().col("project").col("user_id"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("project_members_by_user")
                    .table("project_members")
                    .col("user_id")
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("secrets")
                    .if_not_exists()
                    .col(string("project"))
                    .col(string("name"))
                    // The value sealed with the instance's secrets key (nonce and ciphertext).
                    .col(binary("sealed"))
                    .col(big_integer("created_at_ms"))
                    .col(big_integer("updated_at_ms"))
                    .primary_key(Index::create().col("project").col("name"))
                    .to_owned(),
            )
            .await?;
        let db = manager.get_connection();
        db.execute_unprepared(
            "INSERT INTO projects (name, created_at_ms) \
             SELECT 'default', 0 UNION SELECT project, 0 FROM jobs WHERE project <> '' \
             UNION SELECT project, 0 FROM batches WHERE project <> ''",
        )
        .await?;
        db.execute_unprepared(
            "INSERT INTO project_members (project, user_id, role, created_at_ms) \
             SELECT project, owner_id, 'member', 0 FROM jobs WHERE project <> '' \
             UNION SELECT project, owner_id, 'member', 0 FROM batches WHERE project <> ''",
        )
        .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in ["secrets", "project_members", "projects"] {
            manager.drop_table(Table::drop().table(table).to_owned()).await?;
        }
        let added = [
            ("jobs", "secrets_json"),
            ("datasets", "project"),
            ("api_tokens", "role"),
            ("api_tokens", "project"),
            ("api_tokens", "last_used_at_ms"),
            ("api_tokens", "expires_at_ms"),
            ("users", "disabled"),
        ];
        for (table, column) in added {
            manager
                .alter_table(Table::alter().table(table).drop_column(column).to_owned())
                .await?;
        }
        Ok(())
    }
}
