//! Inference services scale and try revisions (issue 16): a service's scaling bounds and
//! targets (`scaling_json`, [`kiln_core::serving::Scaling`]; empty: `replicas` fixed), and how
//! its latest revision is tried while it is ahead of the serving one: the percent of requests
//! it answers (`traffic`, 100: a roll) or copies of all of them (`shadow`).

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // One column a statement: SQLite adds one at a time.
        for column in [
            text("scaling_json").default("").to_owned(),
            integer("traffic").default(100).to_owned(),
            boolean("shadow").default(false).to_owned(),
        ] {
            manager
                .alter_table(Table::alter().table("services").add_column(column).to_owned())
                .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for column in ["scaling_json", "traffic", "shadow"] {
            manager
                .alter_table(Table::alter().table("services").drop_column(column).to_owned())
                .await?;
        }
        Ok(())
    }
}
