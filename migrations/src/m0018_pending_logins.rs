//! The web UI's login is asked for by the browser (issue 26): a pending login holds the hashes
//! of the browser's nonce cookie and of the short code its page shows, until a user approves
//! the code from the CLI and the same browser redeems it. Wrong approvals are counted per user,
//! so a code cannot be guessed. The single-use login URLs of before (api tokens of scope
//! `login`) are retired: any left unredeemed are revoked. See docs/design-notes.md (Sign-in).

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table("pending_logins")
                    .if_not_exists()
                    .col(string("id").primary_key())
                    // The SHA-256 of the secret of the browser's nonce cookie.
                    .col(string("nonce_sha256"))
                    // The SHA-256 of the code its page shows (normalised: `BCDFGHJK`).
                    .col(string("code_sha256"))
                    // pending -> approved -> redeemed, or disputed (approved by two users).
                    .col(string("state"))
                    .col(text("user_agent").default(""))
                    .col(big_integer("created_at_ms"))
                    .col(big_integer("expires_at_ms"))
                    // Set by the approval: the user, and the project and role its token was
                    // narrowed to (empty for none).
                    .col(string("user_id").default(""))
                    .col(string("project").default(""))
                    .col(string("role").default(""))
                    // The session token the redemption issued (revoked if the login is disputed).
                    .col(string("session_token_id").default(""))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("pending_logins_by_code")
                    .table("pending_logins")
                    .col("code_sha256")
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("pending_logins_by_expiry")
                    .table("pending_logins")
                    .col("expires_at_ms")
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("login_approval_failures")
                    .if_not_exists()
                    .col(string("user_id").primary_key())
                    .col(big_integer("window_started_at_ms"))
                    .col(integer("failures"))
                    .to_owned(),
            )
            .await?;
        manager
            .get_connection()
            .execute_unprepared("UPDATE api_tokens SET revoked = true WHERE scope = 'login'")
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table("login_approval_failures").to_owned())
            .await?;
        manager
            .drop_table(Table::drop().table("pending_logins").to_owned())
            .await?;
        Ok(())
    }
}
